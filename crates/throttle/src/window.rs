//! The adaptive query window of seed 002 (OpenZiti): the decisions of a
//! query pool with a queue whose allowed length adapts to how queued work
//! fares. Pure bookkeeping; the waiting itself lives in the engine.
//!
//! Protocol (the engine holds this behind one mutex; each call is a few
//! integer operations):
//! 1. [`AdaptiveWindow::try_acquire`]: `Admit` (run now), `Queue { position }`
//!    (wait; remember the position) or `Refuse` (position would be beyond the
//!    window: answer `CLOSED rate-limited:` at once instead of doing work
//!    that would time out).
//! 2. When a slot frees, the engine wakes its oldest waiter, which calls
//!    [`AdaptiveWindow::start_queued`]: `true` means run, `false` means its
//!    position is now beyond `window + margin` (the window shrank while it
//!    waited), so it would likely time out: refuse it.
//!    A waiter that gives up calls [`AdaptiveWindow::abandon`].
//! 3. A query that ran calls [`AdaptiveWindow::release`] with its outcome.
//!
//! Invariants: `in_flight <= slots`; `queued <= max_window` (a REQ only
//! queues at a position within the window); `min_window <= window <=
//! max_window`. A new REQ never overtakes queued ones: it is admitted
//! directly only when nothing is queued. The window shrinks to just below
//! the position of a query that timed out (a queue that long is too long
//! now) and grows by one after every `grow_every` successes in a row.

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// Size limits and adaptation speed of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowConfig {
    /// Queries that may run at once (the query pool size), `1..=4096`.
    pub slots: u32,
    /// Smallest queue window, `0..=max_window`. 0 allows the queue to close
    /// entirely after timeouts; successes of running queries reopen it.
    pub min_window: u32,
    /// Largest queue window, `1..=1_000_000`: the bound on queued REQs.
    pub max_window: u32,
    /// Window at start, `min_window..=max_window`.
    pub initial_window: u32,
    /// Successes in a row that grow the window by one, `1..=1_000_000`.
    pub grow_every: u32,
    /// Slack below a timed-out position the window shrinks to, and above the
    /// window a queued REQ may still start at, `0..=1_000_000` (seed: 10).
    pub margin: u32,
}

impl Default for WindowConfig {
    /// 4 slots (one per core of a small machine and then some), queue of
    /// 8..=256 starting at 64, grow every 10 successes, margin 4.
    fn default() -> Self {
        Self {
            slots: 4,
            min_window: 8,
            max_window: 256,
            initial_window: 64,
            grow_every: 10,
            margin: 4,
        }
    }
}

impl WindowConfig {
    /// Checks every field against the ranges documented on it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("slots", f64::from(self.slots), 1.0, 4096.0, "in 1..=4096")?;
        check_range(
            "max_window",
            f64::from(self.max_window),
            1.0,
            1e6,
            "in 1..=1000000",
        )?;
        check_range(
            "min_window",
            f64::from(self.min_window),
            0.0,
            f64::from(self.max_window),
            "in 0..=max_window",
        )?;
        check_range(
            "initial_window",
            f64::from(self.initial_window),
            f64::from(self.min_window),
            f64::from(self.max_window),
            "in min_window..=max_window",
        )?;
        check_range(
            "grow_every",
            f64::from(self.grow_every),
            1.0,
            1e6,
            "in 1..=1000000",
        )?;
        check_range("margin", f64::from(self.margin), 0.0, 1e6, "in 0..=1000000")?;
        Ok(())
    }
}

/// Answer to a new REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A slot is free and nobody is waiting: run now (0 is its position).
    Admit,
    /// Wait for a slot; `position` (1-based, at enqueue time) must be passed
    /// to [`AdaptiveWindow::start_queued`] and [`AdaptiveWindow::release`] or
    /// [`AdaptiveWindow::abandon`].
    Queue {
        /// Place in the queue when it joined: 1 is next.
        position: u32,
    },
    /// The queue position would be beyond the window: refuse now.
    Refuse,
}

/// How a query (running or queued) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered in time. Grows the window (for a running query).
    Success,
    /// Took too long, counting its wait. Shrinks the window.
    Timeout,
    /// The client went away; says nothing about load.
    Cancelled,
}

/// Counters and current sizes, for /metrics and the status endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowStats {
    /// Current queue window.
    pub window: u32,
    /// Queries running.
    pub in_flight: u32,
    /// REQs waiting for a slot.
    pub queued: u32,
    /// Admitted directly.
    pub admitted_total: u64,
    /// Put in the queue.
    pub queued_total: u64,
    /// Refused at once: position beyond the window.
    pub refused_total: u64,
    /// Refused when their turn came: position beyond `window + margin`.
    pub dropped_stale_total: u64,
    /// Timeouts reported, running or queued.
    pub timeouts_total: u64,
}

/// The adaptive window state machine. See the module docs for the protocol.
#[derive(Debug, Clone)]
pub struct AdaptiveWindow {
    config: WindowConfig,
    window: u32,
    in_flight: u32,
    queued: u32,
    successes_in_row: u32,
    stats: WindowStats,
}

impl AdaptiveWindow {
    /// An idle window at `initial_window`. Fails on an invalid config.
    pub fn new(config: WindowConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            window: config.initial_window,
            in_flight: 0,
            queued: 0,
            successes_in_row: 0,
            stats: WindowStats::default(),
        })
    }

    /// Decides for a new REQ. See [`Acquire`].
    pub fn try_acquire(&mut self) -> Acquire {
        if self.in_flight < self.config.slots && self.queued == 0 {
            self.in_flight += 1;
            self.stats.admitted_total += 1;
            return Acquire::Admit;
        }
        let position = self.queued + 1;
        if position > self.window {
            self.stats.refused_total += 1;
            return Acquire::Refuse;
        }
        self.queued = position;
        self.stats.queued_total += 1;
        Acquire::Queue { position }
    }

    /// A queued REQ reached a free slot. `true`: it now runs (counted in
    /// flight). `false`: it is stale (position beyond `window + margin`),
    /// has left the queue, and must be refused.
    ///
    /// Call only when a slot is free (after a [`AdaptiveWindow::release`] or
    /// a refused start freed it).
    pub fn start_queued(&mut self, position: u32) -> bool {
        debug_assert!(self.queued > 0, "start_queued with an empty queue");
        debug_assert!(self.in_flight < self.config.slots, "no free slot");
        self.queued = self.queued.saturating_sub(1);
        if position > self.window.saturating_add(self.config.margin) {
            self.stats.dropped_stale_total += 1;
            return false;
        }
        self.in_flight = (self.in_flight + 1).min(self.config.slots);
        true
    }

    /// A queued REQ left without running: its wait timed out
    /// ([`Outcome::Timeout`]: shrinks the window) or it was cancelled
    /// (`Success` is treated as `Cancelled`: it did no work).
    pub fn abandon(&mut self, position: u32, outcome: Outcome) {
        debug_assert!(self.queued > 0, "abandon with an empty queue");
        self.queued = self.queued.saturating_sub(1);
        if outcome == Outcome::Timeout {
            self.on_timeout(position);
        }
    }

    /// A running query ended. `position` is 0 for one admitted directly,
    /// else its queue position.
    pub fn release(&mut self, position: u32, outcome: Outcome) {
        debug_assert!(self.in_flight > 0, "release with nothing in flight");
        self.in_flight = self.in_flight.saturating_sub(1);
        match outcome {
            Outcome::Success => {
                self.successes_in_row += 1;
                if self.successes_in_row >= self.config.grow_every {
                    self.successes_in_row = 0;
                    self.window = (self.window + 1).min(self.config.max_window);
                }
            }
            Outcome::Timeout => self.on_timeout(position),
            Outcome::Cancelled => {}
        }
    }

    /// Replaces the config (reload), clamping the current window into the
    /// new bounds. Queued and running work is kept, even if it now exceeds
    /// the new sizes: it drains. On error nothing changes.
    pub fn set_config(&mut self, config: WindowConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.config = config;
        self.window = self.window.clamp(config.min_window, config.max_window);
        Ok(())
    }

    /// Current queue window.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Queries running.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// REQs waiting.
    pub fn queued(&self) -> u32 {
        self.queued
    }

    /// Counters and current sizes.
    pub fn stats(&self) -> WindowStats {
        WindowStats {
            window: self.window,
            in_flight: self.in_flight,
            queued: self.queued,
            ..self.stats
        }
    }

    /// Seed 002: a query that timed out after joining at `position` shows a
    /// queue of that length is too long now, so the window drops to just
    /// below it. A query that timed out without queueing (position 0) shows
    /// even the running set is too slow: the window drops to its minimum.
    fn on_timeout(&mut self, position: u32) {
        self.stats.timeouts_total += 1;
        self.successes_in_row = 0;
        let target = position.saturating_sub(self.config.margin);
        self.window = self.window.min(target).max(self.config.min_window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(slots: u32, min: u32, max: u32, initial: u32) -> AdaptiveWindow {
        AdaptiveWindow::new(WindowConfig {
            slots,
            min_window: min,
            max_window: max,
            initial_window: initial,
            grow_every: 3,
            margin: 2,
        })
        .unwrap()
    }

    #[test]
    fn slots_then_queue_then_refuse() {
        let mut w = window(2, 1, 10, 3);
        assert_eq!(w.try_acquire(), Acquire::Admit);
        assert_eq!(w.try_acquire(), Acquire::Admit);
        assert_eq!(w.try_acquire(), Acquire::Queue { position: 1 });
        assert_eq!(w.try_acquire(), Acquire::Queue { position: 2 });
        assert_eq!(w.try_acquire(), Acquire::Queue { position: 3 });
        assert_eq!(w.try_acquire(), Acquire::Refuse);
        assert_eq!((w.in_flight(), w.queued()), (2, 3));
        let s = w.stats();
        assert_eq!(
            (s.admitted_total, s.queued_total, s.refused_total),
            (2, 3, 1)
        );
    }

    #[test]
    fn new_requests_do_not_overtake_the_queue() {
        let mut w = window(1, 1, 10, 5);
        assert_eq!(w.try_acquire(), Acquire::Admit);
        assert_eq!(w.try_acquire(), Acquire::Queue { position: 1 });
        w.release(0, Outcome::Success);
        // A slot is free but someone waits: the newcomer queues.
        assert_eq!(w.try_acquire(), Acquire::Queue { position: 2 });
        assert!(w.start_queued(1));
        assert_eq!((w.in_flight(), w.queued()), (1, 1));
    }

    #[test]
    fn timeout_of_a_queued_request_shrinks_below_its_position() {
        let mut w = window(1, 1, 100, 50);
        w.try_acquire();
        for p in 1..=20 {
            assert_eq!(w.try_acquire(), Acquire::Queue { position: p });
        }
        w.abandon(20, Outcome::Timeout);
        assert_eq!(w.window(), 18);
        // A later, smaller timeout shrinks further; a larger one does not grow.
        w.abandon(10, Outcome::Timeout);
        assert_eq!(w.window(), 8);
        w.abandon(15, Outcome::Timeout);
        assert_eq!(w.window(), 8);
        assert_eq!(w.stats().timeouts_total, 3);
    }

    #[test]
    fn shrink_stops_at_min_and_direct_timeouts_go_to_min() {
        let mut w = window(1, 4, 100, 50);
        w.try_acquire();
        w.release(0, Outcome::Timeout);
        assert_eq!(w.window(), 4);
        let mut w = window(1, 4, 100, 50);
        w.try_acquire();
        w.try_acquire();
        w.abandon(1, Outcome::Timeout);
        assert_eq!(w.window(), 4);
    }

    #[test]
    fn stale_queued_requests_are_dropped_when_the_window_shrank() {
        let mut w = window(1, 1, 100, 50);
        w.try_acquire();
        for _ in 0..30 {
            w.try_acquire();
        }
        w.abandon(12, Outcome::Timeout); // window 10
        assert_eq!(w.window(), 10);
        w.release(0, Outcome::Success);
        assert!(w.start_queued(1));
        w.release(1, Outcome::Success);
        // Position 12 is within window + margin (10 + 2).
        assert!(w.start_queued(12));
        w.release(12, Outcome::Success);
        // Three successes in a row grew the window to 11: 14 > 11 + 2.
        assert_eq!(w.window(), 11);
        assert!(!w.start_queued(14), "beyond window + margin");
        assert_eq!(w.stats().dropped_stale_total, 1);
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn successes_grow_the_window_up_to_max() {
        let mut w = window(1, 1, 5, 2);
        for _ in 0..100 {
            assert_eq!(w.try_acquire(), Acquire::Admit);
            w.release(0, Outcome::Success);
        }
        assert_eq!(w.window(), 5);
        // A timeout resets the run of successes.
        let mut w = window(1, 1, 5, 2);
        for _ in 0..2 {
            w.try_acquire();
            w.release(0, Outcome::Success);
        }
        w.try_acquire();
        w.release(5, Outcome::Timeout);
        assert_eq!(w.window(), 2);
        for _ in 0..2 {
            w.try_acquire();
            w.release(0, Outcome::Success);
        }
        assert_eq!(w.window(), 2, "run restarted");
        w.try_acquire();
        w.release(0, Outcome::Success);
        assert_eq!(w.window(), 3);
    }

    #[test]
    fn cancellations_change_nothing_but_counts() {
        let mut w = window(1, 1, 10, 5);
        w.try_acquire();
        w.try_acquire();
        w.abandon(1, Outcome::Cancelled);
        w.release(0, Outcome::Cancelled);
        assert_eq!((w.window(), w.in_flight(), w.queued()), (5, 0, 0));
    }

    #[test]
    fn queue_never_exceeds_max_window_under_a_flood() {
        let mut w = window(3, 1, 16, 16);
        for round in 0..1000u32 {
            for _ in 0..50 {
                w.try_acquire();
            }
            assert!(w.queued() <= 16 && w.in_flight() <= 3);
            // One slot frees and the head of the queue starts.
            w.release(
                0,
                if round % 7 == 0 {
                    Outcome::Timeout
                } else {
                    Outcome::Success
                },
            );
            if w.queued() > 0 {
                w.start_queued(1);
            }
        }
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let c = WindowConfig {
            initial_window: WindowConfig::default().max_window + 1,
            ..WindowConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "initial_window");
        let c = WindowConfig {
            slots: 0,
            ..WindowConfig::default()
        };
        assert_eq!(AdaptiveWindow::new(c).unwrap_err().field, "slots");
    }
}
