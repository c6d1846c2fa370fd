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
mod tests;
