//! Token bucket with burst, after nosqlbench's hybrid limiter
//! (docs/design.md#token-buckets):
//! tokens are nanoseconds of schedule time, refilled lazily from the
//! caller's clock on every call, so no filler task exists.
//!
//! Three pools, all in nanoseconds:
//! - the *active pool* holds up to `window_ms` of time (at least two
//!   operations and 1 ms): a caught-up client may spend it back to back, so
//!   it sets how bursty the sustained rate may be;
//! - time that arrives while the active pool is full is unused time; it
//!   goes to the *waiting pool*, capped at `catch_up_ms`;
//! - the *burst pool* holds `(burst_ratio - 1) * window` and is refilled from
//!   the waiting pool at `burst_ratio - 1` nanoseconds per elapsed
//!   nanosecond. A client that was idle therefore runs at
//!   `rate * burst_ratio` until its banked time is spent, then at `rate`.
//!
//! Invariants: time is neither created nor destroyed except by the caps, so
//! over any interval `[t1, t2]` the bucket admits at most
//! `rate * (t2 - t1) + rate * (window * burst_ratio + catch_up)` operations;
//! an operation is taken from the active pool first, so time spent by a busy
//! client never spills into the waiting pool; a new bucket is full (as if
//! idle forever), so a bucket that is full again is equivalent to a new one.
//! A clock going backwards refills nothing. Changing the rate keeps the
//! banked time: an operation simply costs more or fewer nanoseconds.
//!
//! Settling after the fact (read budgets in cost units): [`TokenBucket::charge`]
//! takes a cost whatever the bucket holds, and what the pools cannot pay
//! becomes *debt* (capped at `catch_up_ms` plus one active pool of time);
//! elapsed time pays the debt before it refills anything, and a bucket in
//! debt refuses. [`TokenBucket::refund`] gives back an overestimate.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// Lowest rate a bucket runs at, in operations per second: one operation per
/// 1000 s. [`TokenBucket::set_rate`] clamps to it, so a rate never reaches 0.
pub const MIN_RATE_PER_S: f64 = 0.001;
/// Highest rate, in operations per second: one operation per nanosecond.
pub const MAX_RATE_PER_S: f64 = 1e9;

/// Smallest active pool: nosqlbench's 1 ms floor, so refills at a high rate
/// are never lost to rounding.
const MIN_POOL_NS: u64 = 1_000_000;

/// Rate, burst and pool sizes of a bucket (or of every bucket in a
/// [`crate::KeyedBuckets`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Sustained rate, operations per second, in `0.001..=1e9`.
    pub rate_per_s: f64,
    /// Catch-up factor, in `1..=100`: a client behind schedule may run at
    /// `rate * burst_ratio` while it has banked time. 1 disables catch-up.
    pub burst_ratio: f64,
    /// Active pool size as time, in `1..=3_600_000` ms: `rate * window`
    /// operations may go back to back (never fewer than two).
    pub window_ms: u64,
    /// Most unused time an idle client banks for catch-up, in
    /// `0..=86_400_000` ms. Catch-up lasts up to
    /// `catch_up / (burst_ratio - 1)`.
    pub catch_up_ms: u64,
}

impl Default for BucketConfig {
    /// 10 operations per second, 1 s window, catch-up at 1.5x for up to 4 s
    /// (2 s banked).
    fn default() -> Self {
        Self {
            rate_per_s: 10.0,
            burst_ratio: 1.5,
            window_ms: 1000,
            catch_up_ms: 2000,
        }
    }
}

impl BucketConfig {
    /// Checks every field against the ranges documented on it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "rate_per_s",
            self.rate_per_s,
            MIN_RATE_PER_S,
            MAX_RATE_PER_S,
            "in 0.001..=1e9",
        )?;
        check_range("burst_ratio", self.burst_ratio, 1.0, 100.0, "in 1..=100")?;
        check_range(
            "window_ms",
            self.window_ms as f64,
            1.0,
            3_600_000.0,
            "in 1..=3600000",
        )?;
        check_range(
            "catch_up_ms",
            self.catch_up_ms as f64,
            0.0,
            86_400_000.0,
            "in 0..=86400000",
        )?;
        Ok(())
    }
}

/// `rate = base * (1 - pressure)`, the backpressure mapping
/// (docs/design.md#backpressure), with a
/// floor: the result is never below `base * floor_fraction` (nor below
/// [`MIN_RATE_PER_S`]), so a client is slowed, never locked out for good.
///
/// `pressure` is clamped to `0..=1` (NaN counts as 0), `floor_fraction` to
/// `0..=1`. A good pressure input is the write controller's output: it is 0
/// while the relay is below its setpoint, so polite clients keep their full
/// rate until the global controller acts.
pub fn scaled_rate(base_per_s: f64, pressure: f64, floor_fraction: f64) -> f64 {
    let p = if pressure.is_nan() {
        0.0
    } else {
        pressure.clamp(0.0, 1.0)
    };
    let floor = if floor_fraction.is_nan() {
        0.0
    } else {
        floor_fraction.clamp(0.0, 1.0)
    };
    (base_per_s * (1.0 - p).max(floor)).max(MIN_RATE_PER_S)
}

/// Nanosecond figures derived from a [`BucketConfig`] and the current rate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    rate_per_s: f64,
    /// Cost of one operation.
    interval_ns: u64,
    pool_cap_ns: u64,
    burst_cap_ns: u64,
    wait_cap_ns: u64,
    /// `burst_ratio - 1`: burst refill per elapsed nanosecond.
    burst_extra: f64,
}

impl Params {
    pub(crate) fn new(config: &BucketConfig, rate_per_s: f64) -> Self {
        let rate = if rate_per_s.is_nan() {
            MIN_RATE_PER_S
        } else {
            rate_per_s.clamp(MIN_RATE_PER_S, MAX_RATE_PER_S)
        };
        let interval_ns = ((1e9 / rate) as u64).max(1);
        let window_ns = config.window_ms.saturating_mul(1_000_000);
        let pool_cap_ns = window_ns
            .max(interval_ns.saturating_mul(2))
            .max(MIN_POOL_NS);
        let burst_extra = config.burst_ratio - 1.0;
        Self {
            rate_per_s: rate,
            interval_ns,
            pool_cap_ns,
            burst_cap_ns: (pool_cap_ns as f64 * burst_extra) as u64,
            wait_cap_ns: config.catch_up_ms.saturating_mul(1_000_000),
            burst_extra,
        }
    }

    /// The current rate, clamped.
    pub(crate) fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }

    /// Cost of `cost` operations, capped at the active pool so that any
    /// cost can be paid by a full bucket (an expensive operation drains it
    /// instead of being refused forever).
    fn cost_ns(&self, cost: u32) -> u64 {
        self.interval_ns
            .saturating_mul(u64::from(cost))
            .min(self.pool_cap_ns)
    }
}

/// The pools of one bucket, without its config: [`crate::KeyedBuckets`]
/// keeps one per key and shares the [`Params`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketState {
    pool_ns: u64,
    burst_ns: u64,
    wait_ns: u64,
    /// Cost charged beyond what the pools held, paid back first by time.
    debt_ns: u64,
    last_ns: u64,
}

impl BucketState {
    /// A full bucket: as if the client had been idle forever.
    pub(crate) fn full(params: &Params, now_ns: u64) -> Self {
        Self {
            pool_ns: params.pool_cap_ns,
            burst_ns: params.burst_cap_ns,
            wait_ns: params.wait_cap_ns,
            debt_ns: 0,
            last_ns: now_ns,
        }
    }

    /// Moves the time elapsed since the last call into the pools.
    fn refill(&mut self, p: &Params, now_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        // A rate change may have shrunk the caps.
        self.pool_ns = self.pool_ns.min(p.pool_cap_ns);
        self.burst_ns = self.burst_ns.min(p.burst_cap_ns);
        self.wait_ns = self.wait_ns.min(p.wait_cap_ns);
        let pay = elapsed.min(self.debt_ns);
        self.debt_ns -= pay;
        let elapsed = elapsed - pay;
        if elapsed == 0 {
            return;
        }
        let to_pool = elapsed.min(p.pool_cap_ns - self.pool_ns);
        self.pool_ns += to_pool;
        // Banked time moves into the burst pool before the bank is capped:
        // over one long step the burst pool fills first, as it would have
        // over many short ones.
        let banked_ns = self.wait_ns.saturating_add(elapsed - to_pool);
        let movable = ((elapsed as f64 * p.burst_extra) as u64)
            .min(banked_ns)
            .min(p.burst_cap_ns - self.burst_ns);
        self.burst_ns += movable;
        self.wait_ns = (banked_ns - movable).min(p.wait_cap_ns);
    }

    /// Refills, then takes `cost` operations or says how long until it could.
    pub(crate) fn try_take(&mut self, p: &Params, now_ns: u64, cost: u32) -> Result<(), Duration> {
        self.refill(p, now_ns);
        if self.debt_ns > 0 {
            let need_ns = p.cost_ns(cost);
            return Err(Duration::from_nanos(self.debt_ns.saturating_add(
                self.wait_for(p, need_ns.saturating_sub(self.pool_ns)),
            )));
        }
        let need_ns = p.cost_ns(cost);
        let from_pool = need_ns.min(self.pool_ns);
        let from_burst = need_ns - from_pool;
        if from_burst <= self.burst_ns {
            self.pool_ns -= from_pool;
            self.burst_ns -= from_burst;
            return Ok(());
        }
        Err(Duration::from_nanos(
            self.wait_for(p, need_ns - self.pool_ns - self.burst_ns),
        ))
    }

    /// Takes `cost` operations whatever the bucket holds: from the active
    /// pool, then the burst pool, and the rest as debt (capped).
    pub(crate) fn charge(&mut self, p: &Params, now_ns: u64, cost: u64) {
        self.refill(p, now_ns);
        let mut need_ns = p.interval_ns.saturating_mul(cost);
        let from_pool = need_ns.min(self.pool_ns);
        self.pool_ns -= from_pool;
        need_ns -= from_pool;
        let from_burst = need_ns.min(self.burst_ns);
        self.burst_ns -= from_burst;
        need_ns -= from_burst;
        let debt_cap = p.wait_cap_ns.saturating_add(p.pool_cap_ns);
        self.debt_ns = self.debt_ns.saturating_add(need_ns).min(debt_cap);
    }

    /// Gives back `cost` operations charged too much: debt first, then the
    /// active pool, up to its cap.
    pub(crate) fn refund(&mut self, p: &Params, now_ns: u64, cost: u64) {
        self.refill(p, now_ns);
        let mut back_ns = p.interval_ns.saturating_mul(cost);
        let pay = back_ns.min(self.debt_ns);
        self.debt_ns -= pay;
        back_ns -= pay;
        self.pool_ns = self.pool_ns.saturating_add(back_ns).min(p.pool_cap_ns);
    }

    /// Nanoseconds until `missing_ns` more tokens have arrived: the active
    /// pool gains one per nanosecond (it has room: cost <= cap), the burst
    /// pool `burst_extra` more while banked time and room last.
    fn wait_for(&self, p: &Params, missing_ns: u64) -> u64 {
        let boost_ns = self.wait_ns.min(p.burst_cap_ns - self.burst_ns);
        let t = (missing_ns as f64 / (1.0 + p.burst_extra)).ceil();
        let ns = if t * p.burst_extra <= boost_ns as f64 {
            t as u64
        } else {
            missing_ns.saturating_sub(boost_ns)
        };
        // One nanosecond of slack against float rounding in the refill, so
        // a client that retries exactly then is admitted.
        ns.saturating_add(1)
    }

    /// True when every pool is full at `now_ns`: the bucket is then
    /// equivalent to a new one and may be forgotten without loss.
    pub(crate) fn is_full(&self, p: &Params, now_ns: u64) -> bool {
        let mut probe = *self;
        probe.refill(p, now_ns);
        probe.debt_ns == 0
            && probe.pool_ns >= p.pool_cap_ns
            && probe.burst_ns >= p.burst_cap_ns
            && probe.wait_ns >= p.wait_cap_ns
    }
}

/// One token bucket: a [`BucketConfig`], a current rate and its pools.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    config: BucketConfig,
    params: Params,
    state: BucketState,
}

impl TokenBucket {
    /// A full bucket at `now_ns`. Fails if `config` does not validate.
    pub fn new(config: BucketConfig, now_ns: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let params = Params::new(&config, config.rate_per_s);
        Ok(Self {
            config,
            params,
            state: BucketState::full(&params, now_ns),
        })
    }

    /// Takes `cost` operations (usually 1) if the bucket holds them, else
    /// returns how long until it will (assuming no other taker): the
    /// Retry-After hint. A refused call takes nothing. A cost larger than
    /// the active pool is charged as a full pool.
    pub fn try_take(&mut self, now_ns: u64, cost: u32) -> Result<(), Duration> {
        self.state.try_take(&self.params, now_ns, cost)
    }

    /// Takes `cost` operations whatever the bucket holds; what it cannot
    /// pay becomes debt that later checks wait out. For settling a cost
    /// known only after the work.
    pub fn charge(&mut self, now_ns: u64, cost: u64) {
        self.state.charge(&self.params, now_ns, cost);
    }

    /// Gives back `cost` operations charged too much.
    pub fn refund(&mut self, now_ns: u64, cost: u64) {
        self.state.refund(&self.params, now_ns, cost);
    }

    /// Charges a positive `delta_units`, refunds a negative one.
    pub fn settle(&mut self, now_ns: u64, delta_units: i64) {
        if delta_units > 0 {
            self.charge(now_ns, delta_units.unsigned_abs());
        } else {
            self.refund(now_ns, delta_units.unsigned_abs());
        }
    }

    /// Sets the current rate (e.g. from [`scaled_rate`]), clamped to
    /// `MIN_RATE_PER_S..=MAX_RATE_PER_S`. Banked time is kept.
    pub fn set_rate(&mut self, rate_per_s: f64) {
        self.params = Params::new(&self.config, rate_per_s);
    }

    /// The current rate, operations per second.
    pub fn rate_per_s(&self) -> f64 {
        self.params.rate_per_s
    }

    /// The config the bucket was built with (its `rate_per_s` is the base
    /// rate, not the current one).
    pub fn config(&self) -> &BucketConfig {
        &self.config
    }

    /// True when the bucket is full at `now_ns` (equivalent to a new one).
    pub fn is_full(&self, now_ns: u64) -> bool {
        self.state.is_full(&self.params, now_ns)
    }

    /// Its pools alone (40 bytes), for an owner that keeps many buckets of
    /// one config and rate: [`TokenBucket::resume`] makes it whole again.
    pub fn pools(&self) -> BucketPools {
        BucketPools(self.state)
    }

    /// A bucket of `config` at `rate_per_s` with the pools of an earlier
    /// one ([`TokenBucket::pools`]); `config` was validated when those
    /// pools were made.
    pub fn resume(config: BucketConfig, rate_per_s: f64, pools: BucketPools) -> TokenBucket {
        TokenBucket {
            config,
            params: Params::new(&config, rate_per_s),
            state: pools.0,
        }
    }
}

/// A [`TokenBucket`]'s pools without its config and rate.
#[derive(Debug, Clone, Copy)]
pub struct BucketPools(BucketState);

#[cfg(test)]
mod tests;
