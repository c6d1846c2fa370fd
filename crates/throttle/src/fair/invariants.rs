//! [`FairQueue::check_invariants`]: every count and sum recomputed from
//! the queries' states, for tests.

use std::hash::Hash;

use super::FairQueue;
use super::job::{JobId, State};
use super::load::Load;
use super::rotation::List;

impl<K: Hash + Eq + Clone> FairQueue<K> {
    /// Recomputes every count and unit sum from the job states and
    /// compares; panics on a mismatch. For tests.
    pub fn check_invariants(&self) {
        let mut total = Load::default();
        for j in self.jobs.values() {
            total.shift(Load::default(), Load::of(j));
            assert!(self.clients.contains_key(&j.client), "job without client");
        }
        assert_eq!(self.load, total, "relay-wide sums");
        assert!(self.load.running <= self.slots(), "running <= slots");
        let mut parked: Vec<JobId> = self.parked_by_sink.values().flatten().copied().collect();
        parked.sort_unstable();
        let mut expect: Vec<JobId> = (self.jobs.iter())
            .filter(|(_, j)| j.state == State::Parked)
            .map(|(id, _)| *id)
            .collect();
        expect.sort_unstable();
        assert_eq!(parked, expect, "parked index");
        for (id, j) in &self.jobs {
            if j.state == State::Parked {
                assert!(
                    self.parked_by_sink[&j.sink].contains(id),
                    "parked under its sink"
                );
            }
        }
        let mut new_flow_units = 0;
        for (key, c) in &self.clients {
            let mut load = Load::default();
            let mut queued: Vec<JobId> = Vec::new();
            for (id, j) in self.jobs.iter().filter(|(_, j)| &j.client == key) {
                load.shift(Load::default(), Load::of(j));
                if j.state == State::Queued {
                    queued.push(*id);
                }
            }
            assert_eq!(c.load, load, "client sums");
            let mut in_queue: Vec<JobId> = c.queue.iter().copied().collect();
            in_queue.sort_unstable();
            queued.sort_unstable();
            assert_eq!(in_queue, queued, "client queue holds its queued queries");
            assert!(load.open > 0, "client without jobs");
            if c.list == List::New {
                new_flow_units += c.first_step;
            } else {
                assert_eq!(c.first_step, 0, "first step of a client not new");
            }
            if !queued.is_empty() {
                let entry = (key.clone(), c.gen_id);
                let listed = match c.list {
                    List::New => self.new_flows.contains(&entry),
                    List::Old => self.old_flows.contains(&entry),
                    List::None => false,
                };
                assert!(listed, "client with queued work is in a list");
            }
        }
        assert_eq!(self.new_flow_units, new_flow_units, "new flow units");
    }
}
