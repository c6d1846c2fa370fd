//! What queries weigh, summed per client and in all: [`Load`].

use super::job::{Job, State};

/// What queries weigh, summed: per client and in all. A query's share is
/// [`Load::of`] it, so the sums follow the queries' states exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Load {
    /// Queries open (any state).
    pub(super) open: u32,
    /// Their estimated units.
    pub(super) open_units: u64,
    pub(super) running: u32,
    pub(super) parked: u32,
    pub(super) queued: u32,
    /// Units still to run of the queued queries.
    pub(super) queued_units: u64,
    /// Next steps of the queued queries.
    pub(super) queued_steps: u64,
}

impl Load {
    /// What one query weighs in its current state.
    pub(super) fn of<K>(job: &Job<K>) -> Load {
        let mut load = Load {
            open: 1,
            open_units: job.units,
            ..Load::default()
        };
        match job.state {
            State::Queued => {
                load.queued = 1;
                load.queued_units = job.remaining;
                load.queued_steps = job.next_step;
            }
            State::Running => load.running = 1,
            State::Parked => load.parked = 1,
        }
        load
    }

    /// Replaces `before` by `after` in the sum. Wrapping arithmetic: a sum
    /// always holds what is taken out of it, and nothing here panics.
    pub(super) fn shift(&mut self, before: Load, after: Load) {
        self.open = self.open.wrapping_sub(before.open).wrapping_add(after.open);
        self.open_units = (self.open_units)
            .wrapping_sub(before.open_units)
            .wrapping_add(after.open_units);
        self.running = (self.running)
            .wrapping_sub(before.running)
            .wrapping_add(after.running);
        self.parked = (self.parked)
            .wrapping_sub(before.parked)
            .wrapping_add(after.parked);
        self.queued = (self.queued)
            .wrapping_sub(before.queued)
            .wrapping_add(after.queued);
        self.queued_units = (self.queued_units)
            .wrapping_sub(before.queued_units)
            .wrapping_add(after.queued_units);
        self.queued_steps = (self.queued_steps)
            .wrapping_sub(before.queued_steps)
            .wrapping_add(after.queued_steps);
    }
}
