//! Verdicts: what the throttle says about an operation, [`Verdict`]: go,
//! wait first, or refuse with a [`RateLimited`]. One type serves twice: the
//! governor publishes one per direction every tick (its refusals are the
//! controller's: emergency, over the cap), and admission answers one per
//! operation ([`crate::admission`]: any layer's refusal). Also the mode, the
//! direction, a [`Decision`] (a verdict and whether the mode applies it),
//! and the per-connection [`DelayBatcher`] (batching of delays,
//! docs/design.md#pid-control).
//!
//! Invariants:
//! - A delay never exceeds the cap `output_max * max_delay`: when the
//!   controller asks for more, or emergency mode is on, the verdict is a
//!   refusal with a Retry-After hint, never a longer wait.
//! - The hot path ([`Verdict::from_bits`] + [`DelayBatcher::check`]) reads one
//!   word and does a few integer operations: no allocation, no lock, no
//!   floating point, far under a microsecond. The store monitor computes the
//!   verdict once per tick ([`Verdict::from_controller`]) and publishes it as
//!   a `u64` ([`Verdict::to_bits`]) in an atomic.
//! - Delays are batched (applied once every `every_ops` operations of a
//!   connection); refusals are not: every operation of a refused direction
//!   is refused, because letting `every_ops - 1` through would feed the store
//!   that is already past its cap.
//! - `Shadow` computes and reports the same verdict as `Enforce` but its
//!   action is always allow; `Off` reports allow.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::pid::{PidConfig, PidState};
use crate::refusal::{Cause, RateLimited};

/// Longest Retry-After hint given for an over-cap refusal: past a minute a
/// number stops meaning anything to a client.
pub const MAX_RETRY_AFTER_NS: u64 = 60_000_000_000;

/// How throttling acts (`throttle.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Mode {
    /// Apply every decision (default).
    #[default]
    Enforce = 0,
    /// Compute and report every decision, apply none: observe before
    /// switching (docs/design.md#backpressure).
    Shadow = 1,
    /// No throttling decisions at all.
    Off = 2,
}

impl Mode {
    /// The mode stored by `mode as u8` (for an `AtomicU8`); unknown values
    /// mean `Enforce`, the safe default.
    pub fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Shadow,
            2 => Self::Off,
            _ => Self::Enforce,
        }
    }

    /// Lower-case name, as in the config and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
            Self::Off => "off",
        }
    }
}

/// Which limiter: writes (EVENT, import) or reads (REQ, COUNT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// EVENT and import.
    Write,
    /// REQ and COUNT.
    Read,
}

impl Direction {
    /// `"write"` or `"read"`: a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
        }
    }
}

/// What the throttle says about an operation: published per direction by
/// the governor, and answered per operation by admission (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Go ahead.
    Allow,
    /// Wait this long first (at most the cap), then go ahead.
    #[serde(rename = "delay_ns", with = "duration_ns")]
    Delay(Duration),
    /// Do not serve it: answer `rate-limited:` with this refusal.
    Refuse(RateLimited),
}

/// Bit layout of a published verdict: two tag bits on top, a duration in
/// nanoseconds below (up to 2^62 ns, about 146 years).
const TAG_SHIFT: u32 = 62;
const NS_MASK: u64 = (1 << TAG_SHIFT) - 1;
const TAG_DELAY: u64 = 1;
const TAG_EMERGENCY: u64 = 2;
const TAG_OVER_CAP: u64 = 3;

impl Verdict {
    /// The verdict for one direction after a controller update:
    /// - emergency (`emergency_retry_after` is `Some`) refuses;
    /// - a raw output above `output_max` (the controller asks for more than
    ///   the cap) refuses, hinting the delay it asked for (at most a minute);
    /// - otherwise `output * max_delay` is the delay, and zero allows.
    pub fn from_controller(
        state: &PidState,
        config: &PidConfig,
        emergency_retry_after: Option<Duration>,
    ) -> Self {
        if let Some(retry_after) = emergency_retry_after {
            return Self::refuse(Cause::Emergency, retry_after);
        }
        if state.raw_output > config.output_max {
            let demand_ns = state.raw_output * config.max_delay_ns() as f64;
            let retry_after =
                Duration::from_nanos((demand_ns as u64).clamp(1_000_000, MAX_RETRY_AFTER_NS));
            return Self::refuse(Cause::OverCap, retry_after);
        }
        let delay = config.delay_for(state.output);
        if delay.is_zero() {
            Self::Allow
        } else {
            Self::Delay(delay)
        }
    }

    /// A refusal of the controller or the scheduler for `cause` (see
    /// [`RateLimited::of`]).
    pub fn refuse(cause: Cause, retry_after: Duration) -> Self {
        Self::Refuse(RateLimited::of(cause, retry_after))
    }

    /// Packs the verdict into one word for an atomic. Durations longer
    /// than 2^62 ns are clamped. Only the controller's verdicts are
    /// published: a refusal is packed as an emergency, or else as over the
    /// cap.
    pub fn to_bits(self) -> u64 {
        let (tag, d) = match self {
            Self::Allow => return 0,
            Self::Delay(d) => (TAG_DELAY, d),
            Self::Refuse(r) if r.cause == Cause::Emergency => (TAG_EMERGENCY, r.retry_after),
            Self::Refuse(r) => (TAG_OVER_CAP, r.retry_after),
        };
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).min(NS_MASK);
        (tag << TAG_SHIFT) | ns
    }

    /// Unpacks [`Verdict::to_bits`]. Every word decodes to some verdict.
    pub fn from_bits(bits: u64) -> Self {
        let d = Duration::from_nanos(bits & NS_MASK);
        match bits >> TAG_SHIFT {
            0 => Self::Allow,
            TAG_DELAY => Self::Delay(d),
            TAG_EMERGENCY => Self::refuse(Cause::Emergency, d),
            _ => Self::refuse(Cause::OverCap, d),
        }
    }

    /// True for `Refuse`.
    pub fn is_refuse(&self) -> bool {
        matches!(self, Self::Refuse(_))
    }

    /// True for an emergency refusal: the one that reaches polite
    /// connections too.
    pub fn is_emergency(&self) -> bool {
        matches!(self, Self::Refuse(r) if r.cause == Cause::Emergency)
    }
}

/// A decision for one operation: what the throttle decided, and whether the
/// mode applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// What the throttle decided (count this, in every mode, by kind and
    /// reason: in `Shadow` these are the would-be actions).
    pub verdict: Verdict,
    /// True in `Enforce` mode only.
    pub enforced: bool,
}

impl Decision {
    /// What to do: the verdict when enforced, else `Allow`.
    pub fn action(&self) -> Verdict {
        if self.enforced {
            self.verdict
        } else {
            Verdict::Allow
        }
    }
}

/// Batching of delays (docs/design.md#pid-control) for one connection and
/// direction: a delay is applied once every `every_ops` operations (so the
/// per-operation cost of a delay `d` is `d / every_ops`); refusals apply to
/// every operation. 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayBatcher {
    every_ops: u32,
    since_last: u32,
}

impl DelayBatcher {
    /// Applies delays every `every_ops` operations (0 counts as 1). The
    /// first delay falls on the `every_ops`-th operation.
    pub fn new(every_ops: u32) -> Self {
        Self {
            every_ops: every_ops.max(1),
            since_last: 0,
        }
    }

    /// Decides for one operation, given the published verdict of its
    /// direction and the mode. Call once per operation.
    pub fn check(&mut self, mode: Mode, published: Verdict) -> Decision {
        if mode == Mode::Off {
            return Decision {
                verdict: Verdict::Allow,
                enforced: false,
            };
        }
        self.since_last += 1;
        let due = self.since_last >= self.every_ops;
        if due {
            self.since_last = 0;
        }
        let verdict = match published {
            Verdict::Delay(_) if !due => Verdict::Allow,
            other => other,
        };
        Decision {
            verdict,
            enforced: mode == Mode::Enforce,
        }
    }
}

/// Serde for durations as integer nanoseconds (JSON stays flat and the
/// unit is in the field name).
mod duration_ns {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_nanos)
    }
}

#[cfg(test)]
mod tests;
