//! What the writer tells the monitor: queue waits, commit times, the bulk
//! commit cost against its baseline, and a bulk client's backlog.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Commit cost is compared per this many stored events.
const COST_UNIT_EVENTS: f64 = 1000.0;
/// Fewest stored events for a bulk commit's cost to count.
const MIN_COST_SAMPLE: usize = 64;

/// What the writer saw since the monitor last looked: the longest queue
/// wait and the slowest group commit (ns), and how many group-commit
/// batches committed; the monitor swaps these to zero each tick. Bulk
/// batches are measured apart: `bulk_cost_secs` and `bulk_baseline_secs`
/// (f64 bits, kept between ticks) are the recent commit cost per 1000
/// stored events and its slow baseline.
#[derive(Default)]
pub(crate) struct WriterSignals {
    pub max_wait_ns: AtomicU64,
    pub max_commit_ns: AtomicU64,
    pub batches: AtomicU64,
    pub bulk_cost_secs: AtomicU64,
    pub bulk_baseline_secs: AtomicU64,
}

/// Input a bulk client holds for the writer beyond the queue (the import:
/// its chunks between the reader and the batcher). The client counts it
/// here; the monitor's writer-queue fill is the larger of the queue's fill
/// and `held / bound`, so the governor sees a bulk client's pipeline the
/// way it sees the queue of a relay.
#[derive(Debug, Default)]
pub struct Backlog {
    held: AtomicU64,
    bound: AtomicU64,
}

impl Backlog {
    /// The most the client will hold (its fill's denominator).
    pub fn set_bound(&self, bound: u64) {
        self.bound.store(bound, Ordering::Relaxed);
    }

    /// One more unit held.
    pub fn add(&self) {
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// One unit handed on.
    pub fn remove(&self) {
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// `held / bound`; 0 while no bulk client has set a bound.
    pub(crate) fn fill(&self) -> f64 {
        match self.bound.load(Ordering::Relaxed) {
            0 => 0.0,
            bound => self.held() as f64 / bound as f64,
        }
    }
}

/// Recent commit cost per [`COST_UNIT_EVENTS`] stored and its slow
/// baseline, both in seconds; 0 until the first sample.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct CommitCost {
    pub(super) recent: f64,
    pub(super) baseline: f64,
}

impl CommitCost {
    /// Adds a commit that took `took` and stored `stored` events. The cost
    /// is per stored event: a batch of duplicates (a re-run) writes almost
    /// nothing, and would set a baseline that real writes then seem to
    /// exceed many times. Batches that store fewer than [`MIN_COST_SAMPLE`]
    /// events say too little and are skipped (returns false). The recent
    /// cost is a fast average; the baseline follows drops at once and
    /// rises slowly.
    pub(super) fn record(&mut self, took: Duration, stored: usize) -> bool {
        if stored < MIN_COST_SAMPLE {
            return false;
        }
        let cost = took.as_secs_f64() * COST_UNIT_EVENTS / stored as f64;
        self.recent = if self.recent == 0.0 {
            cost
        } else {
            0.7 * self.recent + 0.3 * cost
        };
        self.baseline = next_baseline(self.baseline, cost);
        true
    }
}

/// The baseline after a commit that cost `cost`: the first sample or a
/// drop at once, a rise by 1% of the difference. At a cost equal to the
/// baseline both give the baseline, so `<` could be `<=`
/// (docs/testing.md#mutation-testing).
fn next_baseline(baseline: f64, cost: f64) -> f64 {
    if baseline == 0.0 || cost < baseline {
        cost
    } else {
        baseline + 0.01 * (cost - baseline)
    }
}
