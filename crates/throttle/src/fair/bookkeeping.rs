//! The one place a query changes ([`FairQueue::update`]) and the one place
//! it leaves ([`FairQueue::remove`]), keeping the sums, its client's queue
//! and the parked index together; and the moves built on them.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::room;

use super::FairQueue;
use super::job::{Job, JobId, State};
use super::load::Load;
use super::rotation::{Client, List};

/// Most emptied client queues kept for reuse.
pub(super) const SPARE_QUEUES: usize = 64;

/// Takes `id` out of a client's queue (usually its front).
fn unqueue(queue: &mut VecDeque<JobId>, id: JobId) {
    if queue.front() == Some(&id) {
        queue.pop_front();
    } else if let Some(i) = queue.iter().position(|j| *j == id) {
        queue.remove(i);
    }
}

/// Takes `id` out of the parked index.
fn unindex(parked_by_sink: &mut HashMap<u64, Vec<JobId>>, sink: u64, id: JobId) {
    if let Some(ids) = parked_by_sink.get_mut(&sink) {
        ids.retain(|j| *j != id);
        if ids.is_empty() {
            parked_by_sink.remove(&sink);
        }
    }
}

impl<K: Hash + Eq + Clone> FairQueue<K> {
    /// Changes query `id` with `change` (its state, what is left of it,
    /// its client's deficit) and keeps everything that follows from it
    /// true at once: the sums (its client's and the relay's), its client's
    /// queue (a query queued again joins its end, and its client a list)
    /// and the parked index. The one place a query changes. Returns its
    /// new state; `None` (nothing changed) for an unknown id.
    pub(super) fn update(
        &mut self,
        id: JobId,
        change: impl FnOnce(&mut Job<K>, &mut Client),
    ) -> Option<State> {
        let job = self.jobs.get_mut(&id)?;
        let c = self.clients.get_mut(&job.client)?;
        let (before, was) = (Load::of(job), job.state);
        change(job, c);
        let after = Load::of(job);
        c.load.shift(before, after);
        self.load.shift(before, after);
        match (was, job.state) {
            (State::Queued, State::Queued) => {}
            (State::Queued, _) => unqueue(&mut c.queue, id),
            (_, State::Queued) => {
                c.queue.push_back(id);
                if c.list == List::None {
                    c.list = List::Old;
                    self.old_flows.push_back((job.client.clone(), c.gen_id));
                }
            }
            _ => {}
        }
        match (was, job.state) {
            (State::Parked, State::Parked) => {}
            (State::Parked, _) => unindex(&mut self.parked_by_sink, job.sink, id),
            (_, State::Parked) => self.parked_by_sink.entry(job.sink).or_default().push(id),
            _ => {}
        }
        Some(job.state)
    }

    /// Takes query `id` out of everything [`FairQueue::update`] keeps; its
    /// client leaves with its last query. The one place a query leaves.
    pub(super) fn remove(&mut self, id: JobId) -> Option<Job<K>> {
        let job = self.jobs.get(&id)?;
        let c = self.clients.get_mut(&job.client)?;
        let load = Load::of(job);
        c.load.shift(load, Load::default());
        self.load.shift(load, Load::default());
        match job.state {
            State::Queued => unqueue(&mut c.queue, id),
            State::Parked => unindex(&mut self.parked_by_sink, job.sink, id),
            State::Running => {}
        }
        let last = c.load.open == 0;
        if last && c.list == List::New {
            // Its list entry is skipped when reached.
            self.new_flow_units = self.new_flow_units.wrapping_sub(c.first_step);
        }
        let job = self.jobs.remove(&id)?;
        if last
            && let Some(gone) = self.clients.remove(&job.client)
            && self.spare_queues.len() < SPARE_QUEUES
        {
            let mut q = gone.queue;
            q.clear();
            self.spare_queues.push(q);
        }
        self.give_back_room();
        Some(job)
    }

    /// After a crowd of queries: the tables and queues it grew give their
    /// room back (`crate::room`). With no query left, every entry still in
    /// the lazily skipped queues is stale, and they are emptied first.
    fn give_back_room(&mut self) {
        if self.jobs.is_empty() {
            self.unstarted.clear();
        }
        if self.clients.is_empty() {
            self.new_flows.clear();
            self.old_flows.clear();
        }
        room::give_back(&mut self.jobs);
        room::give_back(&mut self.clients);
        room::give_back(&mut self.unstarted);
        room::give_back(&mut self.new_flows);
        room::give_back(&mut self.old_flows);
    }

    /// Marks a queued query running (off its client's queue).
    pub(super) fn start(&mut self, id: JobId) -> Option<JobId> {
        self.update(id, |job, _| {
            job.state = State::Running;
            job.started = true;
        })?;
        self.counters.steps_total += 1;
        Some(id)
    }

    /// Puts a running or parked query back in its client's queue,
    /// expecting its next step to cost what is left of it, at most a full
    /// step.
    pub(super) fn requeue(&mut self, id: JobId) {
        let cap = self.step_cap();
        self.update(id, |job, _| {
            job.state = State::Queued;
            job.next_step = job.remaining.min(cap);
        });
    }
}
