//! Sizes and counters for /metrics: [`FairStats`], [`FairQueue::stats`].

use std::hash::Hash;

use serde::{Deserialize, Serialize};

use super::FairQueue;

/// Sizes and counters for /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FairStats {
    /// Queries admitted and not yet finished or cancelled.
    pub open: u32,
    /// Queries with a step running now.
    pub running: u32,
    /// Queries waiting for a step (first or next).
    pub queued: u32,
    /// Queries waiting for their client to read.
    pub parked: u32,
    /// Clients with at least one query open.
    pub clients: u32,
    /// Clients with runnable work.
    pub clients_waiting: u32,
    /// Estimated cost units of the open queries (what the bounds weigh).
    pub open_units: u64,
    /// Estimated cost units still to run of the queued queries.
    pub queued_units: u64,
    /// Measured duration of one step (moving average), nanoseconds.
    pub step_ns: u64,
    /// Measured time per cost unit of a step (moving average; a step
    /// costs its rows and bytes plus `cost.base_units`), nanoseconds.
    pub unit_ns: u64,
    pub admitted_total: u64,
    pub refused_total: u64,
    pub expired_total: u64,
    pub cancelled_total: u64,
    pub finished_total: u64,
    pub steps_total: u64,
    /// First steps given to new flows ahead of the rotation.
    pub new_flow_steps_total: u64,
}

impl<K: Hash + Eq + Clone> FairQueue<K> {
    pub fn stats(&self) -> FairStats {
        let l = &self.load;
        FairStats {
            open: l.open,
            running: l.running,
            queued: l.queued,
            parked: l.parked,
            open_units: l.open_units,
            queued_units: l.queued_units,
            clients: self.clients.len() as u32,
            clients_waiting: self
                .clients
                .values()
                .filter(|c| !c.queue.is_empty())
                .count() as u32,
            step_ns: self.step_ns as u64,
            unit_ns: self.unit_ns as u64,
            ..self.counters
        }
    }
}
