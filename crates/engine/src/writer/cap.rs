//! How many client events one group commit takes: as many as commit in
//! about `engine.commit_target_ms`, from what the recent commits cost per
//! event. A person's EVENT that arrives during a commit waits for the rest
//! of it, so the commits' length bounds that wait; a flood's events beyond
//! the cap wait for the next commit, behind any lone event that arrived
//! meanwhile.
//!
//! Commits that carry size eviction (each of their events brings up to two
//! removals) cost more per event than those that do not, and eviction
//! starts and stops as the store crosses its marks: the two costs are
//! learnt apart, so neither start nor stop finds the cap wrong.

use std::time::Duration;

/// Fewest events a commit's time is learnt from: below it, the sync's
/// fixed cost says more than the events do.
const MIN_SAMPLE: usize = 8;
/// The cap never goes below this many events (nor above
/// `engine.max_batch_events`).
const MIN_CAP: usize = 16;
/// Weight of the newest commit in the cost per event.
const ALPHA: f64 = 0.2;

/// The cost per event of recent commits, with and without eviction riding.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct BatchCap {
    /// Seconds; 0 turns the cap off.
    target: f64,
    /// Seconds per event, `[plain, evicting]`; 0 until the first sample.
    per_event: [f64; 2],
}

impl BatchCap {
    pub(super) fn new(target: Duration) -> BatchCap {
        BatchCap {
            target: target.as_secs_f64(),
            per_event: [0.0; 2],
        }
    }

    /// Most events the next commit takes (`evicting`: size eviction rides
    /// on it), at most `max`.
    pub(super) fn get(&self, evicting: bool, max: usize) -> usize {
        let cost = self.per_event[usize::from(evicting)];
        if self.target == 0.0 || cost == 0.0 {
            return max;
        }
        let fits = (self.target / cost).min(max as f64) as usize;
        fits.clamp(MIN_CAP.min(max), max)
    }

    /// Learns from a commit of `events` client events that took `took`.
    pub(super) fn record(&mut self, evicting: bool, events: usize, took: Duration) {
        if events < MIN_SAMPLE {
            return;
        }
        let cost = took.as_secs_f64() / events as f64;
        let slot = &mut self.per_event[usize::from(evicting)];
        *slot = if *slot == 0.0 {
            cost
        } else {
            (1.0 - ALPHA) * *slot + ALPHA * cost
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_cap_is_what_fits_the_target_at_the_recent_cost() {
        let mut cap = BatchCap::new(20 * MS);
        assert_eq!(cap.get(false, 1024), 1024, "nothing learnt yet");
        // 40 events in 20 ms: 0.5 ms each, 40 fit.
        cap.record(false, 40, 20 * MS);
        assert_eq!(cap.get(false, 1024), 40);
        assert_eq!(cap.get(false, 30), 30, "never above max_batch_events");
        // A slower commit moves the cost a fifth of the way: 0.5 -> 0.7 ms.
        cap.record(false, 10, 15 * MS);
        assert_eq!(cap.get(false, 1024), 28);
    }

    #[test]
    fn evicting_commits_are_learnt_apart() {
        let mut cap = BatchCap::new(20 * MS);
        cap.record(false, 40, 10 * MS);
        cap.record(true, 40, 40 * MS);
        assert_eq!(cap.get(false, 1024), 80);
        assert_eq!(cap.get(true, 1024), 20);
    }

    #[test]
    fn small_commits_teach_nothing_and_the_cap_has_a_floor() {
        let mut cap = BatchCap::new(20 * MS);
        cap.record(false, MIN_SAMPLE - 1, 100 * MS);
        assert_eq!(cap.get(false, 1024), 1024);
        cap.record(false, MIN_SAMPLE, 1000 * MS);
        assert_eq!(cap.get(false, 1024), MIN_CAP);
        assert_eq!(
            cap.get(false, 3),
            3,
            "a floor above max_batch_events is max"
        );
    }

    #[test]
    fn a_zero_target_turns_it_off() {
        let mut cap = BatchCap::new(Duration::ZERO);
        cap.record(false, 40, 1000 * MS);
        assert_eq!(cap.get(false, 1024), 1024);
    }
}
