//! The rotation between clients: a client's entry ([`Client`]: its queue,
//! load and deficit), new flows first, then deficit round robin by cost.

use std::collections::VecDeque;
use std::hash::Hash;

use super::FairQueue;
use super::job::JobId;
use super::load::Load;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum List {
    None,
    New,
    Old,
}

#[derive(Debug, Clone)]
pub(super) struct Client {
    /// Runnable queries, in turn order: exactly its queued ones.
    pub(super) queue: VecDeque<JobId>,
    /// What its queries weigh.
    pub(super) load: Load,
    /// While it is a new flow: the next step of the query that made it one.
    pub(super) first_step: u64,
    pub(super) deficit: i64,
    pub(super) weight: u32,
    pub(super) list: List,
    /// Tells this entry from an earlier one of the same client.
    pub(super) gen_id: u64,
}

impl<K: Hash + Eq + Clone> FairQueue<K> {
    pub(super) fn waiting_clients(&self) -> usize {
        self.new_flows.len() + self.old_flows.len()
    }

    /// The query at the front of the next new flow's queue; that client
    /// then takes turns like the rest.
    pub(super) fn next_new_flow(&mut self) -> Option<JobId> {
        while let Some((key, gen_id)) = self.new_flows.pop_front() {
            let Some(c) = self.clients.get_mut(&key) else {
                continue;
            };
            if c.gen_id != gen_id || c.list != List::New {
                continue;
            }
            self.new_flow_units = self.new_flow_units.wrapping_sub(c.first_step);
            c.first_step = 0;
            let Some(&id) = c.queue.front() else {
                c.list = List::None;
                continue;
            };
            // Its first step is served ([`FairQueue::start`] takes it off
            // the queue); then it takes turns like the rest.
            if c.queue.len() == 1 {
                c.list = List::None;
            } else {
                c.list = List::Old;
                self.old_flows.push_back((key, gen_id));
            }
            return Some(id);
        }
        None
    }

    /// Deficit round robin over the clients taking turns: on its turn a
    /// client gains a quantum (credit never exceeds one quantum) and runs
    /// one step if its deficit is positive; the step's real cost is taken
    /// off afterwards ([`FairQueue::step_done`]). If every client is still
    /// in debt after a full turn, all are topped up by the rounds the
    /// nearest one needs, so a free worker never idles beside runnable work.
    /// Returns the query at the front of the chosen client's queue.
    pub(super) fn next_old_flow(&mut self, cap: u32) -> Option<JobId> {
        for _pass in 0..2 {
            let mut min_rounds: Option<i64> = None;
            for _ in 0..self.old_flows.len() {
                let (key, gen_id) = self.old_flows.pop_front()?;
                let Some(c) = self.clients.get_mut(&key) else {
                    continue;
                };
                if c.gen_id != gen_id || c.list != List::Old {
                    continue;
                }
                let Some(&id) = c.queue.front() else {
                    c.list = List::None;
                    continue;
                };
                if c.load.running >= cap {
                    self.old_flows.push_back((key, gen_id));
                    continue;
                }
                let quantum = self.config.quantum_units as i64 * i64::from(c.weight);
                c.deficit = (c.deficit + quantum).min(quantum);
                if c.deficit <= 0 {
                    let rounds = (-c.deficit) / quantum + 1;
                    min_rounds = Some(min_rounds.map_or(rounds, |r: i64| r.min(rounds)));
                    self.old_flows.push_back((key, gen_id));
                    continue;
                }
                if c.queue.len() == 1 {
                    c.list = List::None;
                } else {
                    self.old_flows.push_back((key, gen_id));
                }
                return Some(id);
            }
            let rounds = min_rounds?;
            for (key, gen_id) in &self.old_flows {
                if let Some(c) = self.clients.get_mut(key)
                    && c.gen_id == *gen_id
                    && c.load.running < cap
                {
                    let quantum = self.config.quantum_units as i64 * i64::from(c.weight);
                    c.deficit = c.deficit.saturating_add(rounds * quantum).min(quantum);
                }
            }
        }
        None
    }
}
