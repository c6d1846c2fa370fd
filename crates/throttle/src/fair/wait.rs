//! What a step is expected to cost and how long a new query would wait
//! for its first step (the deadline check at admission).

use std::hash::Hash;

use super::FairQueue;
use super::rotation::List;

impl<K: Hash + Eq + Clone> FairQueue<K> {
    /// Most units one step is expected to cost: `step_rows` rows,
    /// `step_bytes` sent, and the base (its read transaction).
    pub(super) fn step_cap(&self) -> u64 {
        let c = &self.config;
        c.step_rows
            .saturating_add(c.step_bytes / c.cost.bytes_per_unit.max(1))
            .saturating_add(c.cost.base_units)
    }

    /// Estimated wait before a new query of `client` gets its first step:
    /// the units of the steps that go first, times the time per unit, over
    /// the slots (plus half a step when every slot is busy).
    pub(super) fn estimate_wait_ns(&self, client: &K, is_new_flow: bool) -> u64 {
        let slots = f64::from(self.slots());
        let busy = self.load.running >= self.slots();
        let residual = if busy { self.step_ns / 2.0 } else { 0.0 };
        let ahead = match self.clients.get(client).filter(|_| !is_new_flow) {
            // The first steps of the new flows listed before it.
            None => self.new_flow_units,
            Some(c) => {
                // New flows go first (this client's own first step is
                // counted below, with its queue); then, round robin within
                // the client, one step of each of its waiting queries; the
                // other waiting clients meanwhile take their turns, at most
                // as much as it gets (or a quantum) each, and at most what
                // they have queued.
                let own_first = if c.list == List::New { c.first_step } else { 0 };
                let listed = usize::from(c.list != List::None);
                let others = self.waiting_clients().saturating_sub(listed) as u64;
                let queued_steps = c.load.queued_steps;
                let turns = others.saturating_mul(queued_steps.max(self.config.quantum_units));
                let others_queued = self.load.queued_units.saturating_sub(c.load.queued_units);
                (self.new_flow_units.saturating_sub(own_first))
                    .saturating_add(queued_steps)
                    .saturating_add(turns.min(others_queued))
            }
        };
        (residual + ahead as f64 * self.unit_ns / slots) as u64
    }
}
