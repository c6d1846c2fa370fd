//! Proof of work as a lever (`[pow]`, NIP-13): the difficulty asked of an
//! EVENT from outside the web of trust (every author when no web is
//! configured). A static floor, per-kind floors, and with `adaptive` a
//! difficulty that climbs one bit at a time while writes are under
//! pressure or outsiders ask for more than their budget, up to
//! `max_difficulty`, and steps back down, more slowly, once calm.
//!
//! Pure: [`PowController::tick`] takes the write controller's output, the
//! outsiders' demand and the time; the engine publishes what it returns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// The `[pow]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PowConfig {
    /// Difficulty (leading zero bits of the id, NIP-13) every outsider's
    /// EVENT must carry, `0..=64`; 0: none.
    pub min_difficulty: u32,
    /// Per-kind floors replacing `min_difficulty`, e.g. `{ "7" = 0, "1" = 16 }`.
    pub kinds: BTreeMap<String, u32>,
    /// The difficulty rises with write pressure and outsider demand.
    pub adaptive: bool,
    /// Highest adaptive difficulty, `1..=64`, at least `min_difficulty`.
    pub max_difficulty: u32,
    /// Pressure (0..1: the write controller's output, or outsider demand
    /// over their budget) at or above which the difficulty rises.
    pub raise_above: f64,
    /// Pressure under which it falls back.
    pub lower_below: f64,
    /// One bit up at most this often while pressed, ms.
    pub raise_every_ms: u64,
    /// One bit down at most this often while calm, ms.
    pub lower_every_ms: u64,
}

impl Default for PowConfig {
    fn default() -> Self {
        PowConfig {
            min_difficulty: 0,
            kinds: BTreeMap::new(),
            adaptive: false,
            max_difficulty: 24,
            raise_above: 0.8,
            lower_below: 0.3,
            raise_every_ms: 1000,
            lower_every_ms: 10_000,
        }
    }
}

impl PowConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_keys().map_err(|e| e.within("pow"))
    }

    fn validate_keys(&self) -> Result<(), ConfigError> {
        check_range(
            "min_difficulty",
            f64::from(self.min_difficulty),
            0.0,
            64.0,
            "in 0..=64",
        )?;
        for (k, d) in &self.kinds {
            if k.parse::<u16>().is_err() {
                return Err(ConfigError::new(
                    &format!("kinds.{k}"),
                    f64::from(*d),
                    "keyed by a kind number 0..=65535",
                ));
            }
            check_range(&format!("kinds.{k}"), f64::from(*d), 0.0, 64.0, "in 0..=64")?;
        }
        check_range(
            "max_difficulty",
            f64::from(self.max_difficulty),
            f64::from(self.min_difficulty.max(1)),
            64.0,
            "in 1..=64 and at least min_difficulty",
        )?;
        check_range("lower_below", self.lower_below, 0.0, 1.0, "in 0..=1")?;
        check_range(
            "raise_above",
            self.raise_above,
            self.lower_below,
            1.0,
            "in lower_below..=1",
        )?;
        for (key, ms) in [
            ("raise_every_ms", self.raise_every_ms),
            ("lower_every_ms", self.lower_every_ms),
        ] {
            check_range(key, ms as f64, 10.0, 3_600_000.0, "in 10..=3600000")?;
        }
        Ok(())
    }

    /// The static floor for `kind`.
    pub fn floor(&self, kind: u16) -> u32 {
        self.kinds
            .get(&kind.to_string())
            .copied()
            .unwrap_or(self.min_difficulty)
    }

    /// The most any kind's floor asks.
    pub fn highest_floor(&self) -> u32 {
        self.kinds
            .values()
            .copied()
            .fold(self.min_difficulty, u32::max)
    }
}

/// The adaptive difficulty: bits added on top of the static floors.
#[derive(Debug, Clone)]
pub struct PowController {
    /// Bits above each kind's floor, `0..=max_difficulty`.
    extra: u32,
    last_change_ns: u64,
}

impl Default for PowController {
    fn default() -> Self {
        Self::new()
    }
}

impl PowController {
    pub fn new() -> PowController {
        PowController {
            extra: 0,
            last_change_ns: 0,
        }
    }

    /// One step: `write_output` is the write controller's output (0..1),
    /// `outsider_demand` the outsiders' EVENTs asking for their budget
    /// over what it allows in the same time (1 = exactly the budget).
    /// Returns the bits now added to the floors.
    pub fn tick(
        &mut self,
        cfg: &PowConfig,
        write_output: f64,
        outsider_demand: f64,
        now_ns: u64,
    ) -> u32 {
        let ceiling = cfg.max_difficulty.saturating_sub(cfg.min_difficulty);
        if !cfg.adaptive {
            self.extra = 0;
            return 0;
        }
        let pressure = write_output.max(outsider_demand.min(1.0));
        let pressure = if pressure.is_nan() { 0.0 } else { pressure };
        let since = now_ns.saturating_sub(self.last_change_ns);
        if pressure >= cfg.raise_above
            && self.extra < ceiling
            && since >= cfg.raise_every_ms * 1_000_000
        {
            self.extra += 1;
            self.last_change_ns = now_ns;
        } else if pressure < cfg.lower_below
            && self.extra > 0
            && since >= cfg.lower_every_ms * 1_000_000
        {
            self.extra -= 1;
            self.last_change_ns = now_ns;
        }
        self.extra = self.extra.min(ceiling);
        self.extra
    }

    pub fn extra(&self) -> u32 {
        self.extra
    }
}

/// The difficulty an outsider's EVENT of `kind` must carry, with `extra`
/// adaptive bits, never past `max_difficulty` (nor below the floor).
pub fn required(cfg: &PowConfig, kind: u16, extra: u32) -> u32 {
    let floor = cfg.floor(kind);
    if extra == 0 {
        return floor;
    }
    (floor + extra).min(cfg.max_difficulty.max(floor))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn adaptive() -> PowConfig {
        PowConfig {
            min_difficulty: 4,
            adaptive: true,
            max_difficulty: 7,
            ..PowConfig::default()
        }
    }

    #[test]
    fn the_difficulty_climbs_a_bit_a_second_under_pressure_up_to_the_max_then_falls_back_slowly() {
        let cfg = adaptive();
        let mut c = PowController::new();
        let mut t = 10 * S;
        assert_eq!(c.tick(&cfg, 0.0, 0.0, t), 0);
        // Pressed by outsiders asking twice their budget: one bit per second.
        for want in [1, 1, 2, 2, 3, 3, 3, 3] {
            assert_eq!(c.tick(&cfg, 0.0, 2.0, t), want.min(3));
            t += S / 2;
        }
        assert_eq!(required(&cfg, 1, c.extra()), 7, "capped at max_difficulty");
        // In between: held.
        t += 60 * S;
        assert_eq!(c.tick(&cfg, 0.5, 0.0, t), 3);
        // Calm: one bit per 10 s.
        assert_eq!(c.tick(&cfg, 0.0, 0.1, t), 2);
        assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 9 * S), 2);
        assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 10 * S), 1);
        assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 20 * S), 0);
        assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 30 * S), 0);
        assert_eq!(required(&cfg, 1, c.extra()), 4, "back to the floor");
        // Write pressure alone raises it too.
        assert_eq!(c.tick(&cfg, 0.9, 0.0, t + 40 * S), 1);
    }

    #[test]
    fn static_floors_by_kind_and_no_adaptation_unless_asked() {
        let cfg = PowConfig {
            min_difficulty: 8,
            kinds: [("7".to_string(), 0), ("30023".to_string(), 12)].into(),
            ..PowConfig::default()
        };
        cfg.validate().unwrap();
        assert_eq!(cfg.floor(1), 8);
        assert_eq!(cfg.floor(7), 0);
        assert_eq!(cfg.floor(30023), 12);
        assert_eq!(cfg.highest_floor(), 12);
        let mut c = PowController::new();
        assert_eq!(c.tick(&cfg, 1.0, 10.0, 100 * S), 0);
        assert_eq!(required(&cfg, 1, 0), 8);
        // A kind with its own floor still gets the adaptive bits, within max.
        assert_eq!(required(&adaptive(), 7, 2), 6);
    }

    #[test]
    fn bad_values_are_refused_by_key() {
        let key = |c: PowConfig| c.validate().unwrap_err().key;
        assert_eq!(
            key(PowConfig {
                min_difficulty: 65,
                ..PowConfig::default()
            }),
            "pow.min_difficulty"
        );
        assert_eq!(
            key(PowConfig {
                min_difficulty: 30,
                max_difficulty: 20,
                ..PowConfig::default()
            }),
            "pow.max_difficulty"
        );
        assert_eq!(
            key(PowConfig {
                kinds: [("seven".to_string(), 1)].into(),
                ..PowConfig::default()
            }),
            "pow.kinds.seven"
        );
        assert_eq!(
            key(PowConfig {
                raise_above: 0.1,
                ..PowConfig::default()
            }),
            "pow.raise_above"
        );
    }

    #[test]
    fn at_the_ceiling_the_first_bit_down_waits_from_reaching_it_and_the_lower_bound_holds() {
        let cfg = adaptive();
        let mut c = PowController::new();
        let mut t = 10 * S;
        for _ in 0..3 {
            c.tick(&cfg, 1.0, 0.0, t);
            t += S;
        }
        assert_eq!(c.extra(), 3, "the ceiling (7 - 4)");
        // Pressed at the ceiling for a minute: nothing more to raise.
        for _ in 0..60 {
            assert_eq!(c.tick(&cfg, 1.0, 0.0, t), 3);
            t += S;
        }
        // Calm: the first bit comes off at once (10 s since the last change).
        assert_eq!(c.tick(&cfg, 0.0, 0.0, t), 2);
        // Pressure at `lower_below` exactly is not calm.
        let mut c = PowController::new();
        c.tick(&cfg, 1.0, 0.0, 10 * S);
        assert_eq!(c.tick(&cfg, cfg.lower_below, 0.0, 100 * S), 1);
        assert_eq!(c.tick(&cfg, cfg.lower_below - 0.01, 0.0, 100 * S), 0);
    }
}
