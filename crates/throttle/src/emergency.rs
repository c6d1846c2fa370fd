//! Emergency mode: while memory is past a hard limit, admission refuses
//! every write and read instead of delaying them.
//!
//! Invariants: the mode enters when memory pressure reaches
//! `enter_pressure` and leaves when it falls below `exit_pressure`, which is
//! strictly lower, so pressure hovering at the limit does not flap the mode
//! every tick. The caller feeds it every tick, and the decision depends on
//! the current pressure only, so the mode always clears once pressure falls
//! (it has no memory beyond the one flag). An unreadable pressure (NaN)
//! counts as 0: a broken sensor must not lock the relay in refusal.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// Thresholds of emergency mode, as memory pressure (1.0 = at the target).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmergencyConfig {
    /// Pressure at or above which the mode enters, `exit_pressure..=100`.
    pub enter_pressure: f64,
    /// Pressure below which the mode leaves, `0 < exit < enter`.
    pub exit_pressure: f64,
    /// Retry-After hint sent with emergency refusals, ms, `1..=3_600_000`.
    pub retry_after_ms: u64,
}

impl Default for EmergencyConfig {
    /// Enter at 100% of the memory target, leave below 90%, ask clients to
    /// retry in 5 s (long enough for the heap to shrink, short enough that a
    /// human does not notice).
    fn default() -> Self {
        Self {
            enter_pressure: 1.0,
            exit_pressure: 0.9,
            retry_after_ms: 5000,
        }
    }
}

impl EmergencyConfig {
    /// Checks every field against the ranges documented on it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "enter_pressure",
            self.enter_pressure,
            0.01,
            100.0,
            "in (0, 100]",
        )?;
        check_range(
            "exit_pressure",
            self.exit_pressure,
            1e-6,
            self.enter_pressure - 1e-6,
            "in (0, enter_pressure)",
        )?;
        check_range(
            "retry_after_ms",
            self.retry_after_ms as f64,
            1.0,
            3_600_000.0,
            "in 1..=3600000",
        )?;
        Ok(())
    }

    /// [`EmergencyConfig::retry_after_ms`] as a duration.
    pub fn retry_after(&self) -> Duration {
        Duration::from_millis(self.retry_after_ms)
    }
}

/// The emergency flag with hysteresis. See the module docs.
#[derive(Debug, Clone)]
pub struct Emergency {
    config: EmergencyConfig,
    active: bool,
    entered_total: u64,
}

impl Emergency {
    /// Inactive. Fails on an invalid config.
    pub fn new(config: EmergencyConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            active: false,
            entered_total: 0,
        })
    }

    /// Re-evaluates the mode for this tick's memory pressure; returns
    /// whether it is active.
    pub fn update(&mut self, memory_pressure: f64) -> bool {
        let p = if memory_pressure.is_nan() {
            0.0
        } else {
            memory_pressure
        };
        if self.active {
            if p < self.config.exit_pressure {
                self.active = false;
            }
        } else if p >= self.config.enter_pressure {
            self.active = true;
            self.entered_total += 1;
        }
        self.active
    }

    /// Whether the mode is active (as of the last update).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// How many times the mode was entered.
    pub fn entered_total(&self) -> u64 {
        self.entered_total
    }

    /// The current config.
    pub fn config(&self) -> &EmergencyConfig {
        &self.config
    }

    /// Replaces the thresholds (reload); the next update applies them. On
    /// error nothing changes.
    pub fn set_config(&mut self, config: EmergencyConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.config = config;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emergency() -> Emergency {
        Emergency::new(EmergencyConfig::default()).unwrap()
    }

    #[test]
    fn enters_at_the_limit_and_leaves_only_below_exit() {
        let mut e = emergency();
        assert!(!e.update(0.99));
        assert!(e.update(1.0));
        // Between exit and enter: stays on.
        assert!(e.update(0.95));
        assert!(e.update(0.90));
        assert!(!e.update(0.899));
        // Between exit and enter again: stays off.
        assert!(!e.update(0.95));
        assert_eq!(e.entered_total(), 1);
    }

    #[test]
    fn pressure_hovering_at_the_limit_does_not_flap() {
        let mut e = emergency();
        let mut changes = 0;
        let mut last = false;
        for k in 0..1000 {
            // +-3% noise around the limit.
            let p = 1.0 + 0.03 * ((k * 7919 % 200) as f64 / 100.0 - 1.0);
            let now = e.update(p);
            if now != last {
                changes += 1;
                last = now;
            }
        }
        assert_eq!(changes, 1, "entered once, never left");
    }

    #[test]
    fn always_clears_when_pressure_falls() {
        let mut e = emergency();
        for _ in 0..1000 {
            e.update(50.0);
        }
        assert!(e.is_active());
        assert!(!e.update(0.5));
        assert!(!e.update(f64::NAN));
    }

    #[test]
    fn exit_must_be_below_enter() {
        let c = EmergencyConfig {
            enter_pressure: 0.9,
            exit_pressure: 0.9,
            retry_after_ms: 1000,
        };
        assert_eq!(Emergency::new(c).unwrap_err().key, "exit_pressure");
    }

    #[test]
    fn a_new_mode_is_off_counts_each_entry_and_reads_back_its_config() {
        let mut e = emergency();
        assert!(!e.is_active());
        assert_eq!(e.entered_total(), 0);
        for _ in 0..2 {
            e.update(1.0);
            e.update(0.5);
        }
        assert_eq!(e.entered_total(), 2);
        let tighter = EmergencyConfig {
            enter_pressure: 0.8,
            exit_pressure: 0.7,
            retry_after_ms: 250,
        };
        e.set_config(tighter).unwrap();
        assert_eq!(e.config(), &tighter);
        assert!(e.update(0.85), "the next update applies it");
        let bad = EmergencyConfig {
            exit_pressure: 0.9,
            ..tighter
        };
        assert!(e.set_config(bad).is_err());
        assert_eq!(e.config(), &tighter, "a refused config changes nothing");
    }
}
