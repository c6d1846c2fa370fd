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
mod tests {
    use super::*;

    /// Takes until refused, failing (not spinning) if it never is.
    fn drain(mut take: impl FnMut() -> bool) {
        for _ in 0..1_000_000 {
            if !take() {
                return;
            }
        }
        panic!("never refused");
    }

    const MS: u64 = 1_000_000;

    /// The pools in ms, for exact comparisons.
    fn pools(b: &TokenBucket) -> (u64, u64, u64, u64) {
        let s = &b.state;
        (s.pool_ns, s.burst_ns, s.wait_ns, s.debt_ns)
    }

    #[test]
    fn charge_debt_refund_refill_and_the_retry_hint_are_exact() {
        // 1 ms per operation, a 10 ms pool, a burst pool as large (burst
        // ratio 2) and 20 ms of banked catch-up.
        let cfg = BucketConfig {
            rate_per_s: 1000.0,
            burst_ratio: 2.0,
            window_ms: 10,
            catch_up_ms: 20,
        };
        let mut b = TokenBucket::new(cfg, 0).unwrap();
        assert_eq!(b.rate_per_s(), 1000.0);
        assert_eq!(b.config(), &cfg);
        assert_eq!(pools(&b), (10 * MS, 10 * MS, 20 * MS, 0));
        // 25 operations charged: the pool, then the burst pool, then 5 of debt.
        b.settle(0, 25);
        assert_eq!(pools(&b), (0, 0, 20 * MS, 5 * MS));
        // Refused while in debt: the debt, then half a ms (the burst pool
        // refills at twice the rate while banked time lasts), plus 1 ns.
        assert_eq!(
            b.try_take(0, 1),
            Err(Duration::from_nanos(5 * MS + MS / 2 + 1))
        );
        // 3 ms later the debt is 2; a refund of 4 pays it and puts 2 in the pool.
        b.settle(3 * MS, -4);
        assert_eq!(pools(&b), (2 * MS, 0, 20 * MS, 0));
        // 3 ms more: 3 into the pool, 3 of banked time into the burst pool.
        b.refund(6 * MS, 0);
        assert_eq!(pools(&b), (5 * MS, 3 * MS, 17 * MS, 0));
        // 7 operations: 5 from the pool, 2 from the burst pool.
        assert_eq!(b.try_take(6 * MS, 7), Ok(()));
        assert_eq!(pools(&b), (0, MS, 17 * MS, 0));
        // 2 more are 1 short: half a ms at the doubled rate, plus 1 ns.
        assert_eq!(b.try_take(6 * MS, 2), Err(Duration::from_nanos(MS / 2 + 1)));
        assert_eq!(pools(&b), (0, MS, 17 * MS, 0), "a refusal takes nothing");
        // A long idle fills every pool; the bank is capped.
        b.refund(1000 * MS, 0);
        assert_eq!(pools(&b), (10 * MS, 10 * MS, 20 * MS, 0));
        assert!(b.is_full(1000 * MS));
    }

    #[test]
    fn the_retry_hint_counts_the_burst_refill_only_while_banked_time_and_room_last() {
        // 1 ms per operation, a 60 ms pool, a 30 ms burst pool (ratio 1.5:
        // it refills at half the rate on top) and 12 ms banked.
        let cfg = BucketConfig {
            rate_per_s: 1000.0,
            burst_ratio: 1.5,
            window_ms: 60,
            catch_up_ms: 12,
        };
        let ns = Duration::from_nanos;
        let mut b = TokenBucket::new(cfg, 0).unwrap();
        assert_eq!(b.try_take(0, 60), Ok(()));
        assert_eq!(b.try_take(0, 20), Ok(()));
        assert_eq!(pools(&b), (0, 10 * MS, 12 * MS, 0));
        // 30 ms short: at 1.5 per ms, 20 ms, the bank (12 ms, room 20 ms)
        // covering the extra 10 ms.
        assert_eq!(b.try_take(0, 40), Err(ns(20 * MS + 1)));
        // 25 ms in the burst pool, 5 ms of room: 35 ms short is 23.3 ms at
        // 1.5 per ms, but the burst refill stops after 5 ms of extra, so
        // 35 - 5 = 30 ms.
        let mut b = TokenBucket::new(cfg, 0).unwrap();
        assert_eq!(b.try_take(0, 60), Ok(()));
        assert_eq!(b.try_take(0, 5), Ok(()));
        assert_eq!(pools(&b), (0, 25 * MS, 12 * MS, 0));
        assert_eq!(b.try_take(0, 60), Err(ns(30 * MS + 1)));
        // A half-full pool refills to its cap, not past it (a take of
        // nothing refills without clamping anything after).
        let mut b = TokenBucket::new(cfg, 0).unwrap();
        assert_eq!(b.try_take(0, 30), Ok(()));
        assert_eq!(b.try_take(1000 * MS, 0), Ok(()));
        assert_eq!(pools(&b), (60 * MS, 30 * MS, 12 * MS, 0));
        // Emptied, then 4 ms: 4 into the pool, 2 (half the time) of banked
        // time into the burst pool.
        assert_eq!(b.try_take(1000 * MS, 60), Ok(()));
        assert_eq!(b.try_take(1000 * MS, 30), Ok(()));
        assert_eq!(b.try_take(1004 * MS, 0), Ok(()));
        assert_eq!(pools(&b), (4 * MS, 2 * MS, 10 * MS, 0));
        // 60 wanted, 6 held: 54 short; 36 ms at 1.5 per ms would need 18 of
        // extra, the bank has 10: 54 - 10 = 44 ms.
        assert_eq!(b.try_take(1004 * MS, 60), Err(ns(44 * MS + 1)));
        assert_eq!(Params::new(&cfg, 1000.0).rate_per_s(), 1000.0);
    }

    #[test]
    fn debt_is_capped_at_the_pool_and_the_bank() {
        let cfg = BucketConfig {
            rate_per_s: 1000.0,
            burst_ratio: 1.0,
            window_ms: 10,
            catch_up_ms: 20,
        };
        let mut b = TokenBucket::new(cfg, 0).unwrap();
        b.charge(0, 1000);
        assert_eq!(pools(&b), (0, 0, 20 * MS, 30 * MS));
        // Without a burst ratio nothing moves into the burst pool: the
        // refill after the debt goes to the pool and the bank only.
        b.refund(35 * MS, 0);
        assert_eq!(pools(&b), (5 * MS, 0, 20 * MS, 0));
    }

    const SEC: u64 = 1_000_000_000;

    fn bucket(rate: f64, burst: f64, window_ms: u64, catch_up_ms: u64) -> TokenBucket {
        TokenBucket::new(
            BucketConfig {
                rate_per_s: rate,
                burst_ratio: burst,
                window_ms,
                catch_up_ms,
            },
            0,
        )
        .expect("valid")
    }

    /// Offers one operation every `gap_ns` from `start` to `end` and counts
    /// the admitted ones.
    fn offer(b: &mut TokenBucket, start: u64, end: u64, gap_ns: u64) -> u64 {
        let mut ok = 0;
        let mut t = start;
        while t < end {
            if b.try_take(t, 1).is_ok() {
                ok += 1;
            }
            t += gap_ns;
        }
        ok
    }

    #[test]
    fn new_bucket_allows_window_plus_burst_at_once_then_refuses() {
        // 100/s, 1 s window: 100 ops in the pool, 50 in the burst pool.
        let mut b = bucket(100.0, 1.5, 1000, 2000);
        let mut ok = 0;
        while b.try_take(0, 1).is_ok() {
            ok += 1;
            assert!(ok <= 1000, "never refuses");
        }
        assert_eq!(ok, 150);
    }

    #[test]
    fn sustained_rate_is_the_configured_rate() {
        // No burst: after the initial pool, exactly 100/s get through.
        let mut b = bucket(100.0, 1.0, 1000, 0);
        offer(&mut b, 0, 2 * SEC, 1_000_000); // drain the pool
        let ok = offer(&mut b, 2 * SEC, 12 * SEC, 1_000_000); // 1000/s offered
        assert!((999..=1001).contains(&ok), "{ok}");
    }

    #[test]
    fn idle_client_catches_up_at_rate_times_burst_then_slows_to_rate() {
        // 100/s, catch-up 2x, 2 s banked: after idling, 200/s for about
        // 2 s (the banked time), then 100/s.
        let mut b = bucket(100.0, 2.0, 1000, 2000);
        offer(&mut b, 0, 3 * SEC, 1_000_000); // drain everything
        assert_eq!(b.state.wait_ns, 0, "bank spent");
        assert!(b.state.burst_ns < b.params.interval_ns);
        // Idle for 10 s: pool full, burst full, 2 s banked.
        let start = 13 * SEC;
        let first = offer(&mut b, start, start + SEC, 100_000); // 10k/s offered
        // Pool (100) + burst (100) + refill at 2x for 1 s (200).
        assert!((395..=405).contains(&first), "{first}");
        let second = offer(&mut b, start + SEC, start + 2 * SEC, 100_000);
        assert!((195..=205).contains(&second), "still catching up: {second}");
        offer(&mut b, start + 2 * SEC, start + 3 * SEC, 100_000);
        let later = offer(&mut b, start + 3 * SEC, start + 4 * SEC, 100_000);
        assert!((95..=105).contains(&later), "back to rate: {later}");
    }

    #[test]
    fn long_run_average_never_exceeds_rate_plus_capacity() {
        let mut b = bucket(50.0, 3.0, 500, 5000);
        // Bursty offered load: 1000/s for 1 s, then idle 2 s, repeated.
        let mut ok = 0;
        for cycle in 0..20 {
            let t0 = cycle * 3 * SEC;
            ok += offer(&mut b, t0, t0 + SEC, 1_000_000);
        }
        let horizon_s = 60.0;
        let bound = 50.0 * horizon_s + 50.0 * (0.5 * 3.0 + 5.0);
        assert!((ok as f64) <= bound, "{ok} > {bound}");
        assert!(ok as f64 >= 50.0 * horizon_s * 0.9, "{ok}");
    }

    #[test]
    fn retry_after_is_exact_enough() {
        let mut b = bucket(10.0, 1.0, 1000, 0);
        for _ in 0..10 {
            b.try_take(0, 1).unwrap();
        }
        let retry = b.try_take(0, 1).unwrap_err();
        assert!(
            retry >= Duration::from_millis(100) && retry <= Duration::from_micros(100_001),
            "{retry:?}"
        );
        let at = retry.as_nanos() as u64;
        assert!(b.try_take(at - 2, 1).is_err(), "too early");
        assert!(b.try_take(at, 1).is_ok(), "on time");
    }

    #[test]
    fn retry_after_counts_the_catch_up_boost() {
        let mut b = bucket(10.0, 2.0, 1000, 1000);
        // Drain pool and burst while keeping the bank: take everything at t=0.
        drain(|| b.try_take(0, 1).is_ok());
        let retry = b.try_take(0, 1).unwrap_err();
        // Banked time refills the burst pool at 1x extra: twice as fast.
        assert!(retry <= Duration::from_millis(51), "{retry:?}");
        assert!(b.try_take(retry.as_nanos() as u64, 1).is_ok());
    }

    #[test]
    fn a_refused_call_takes_nothing_and_cost_is_capped() {
        let mut b = bucket(10.0, 1.0, 1000, 0);
        assert!(b.try_take(0, 5).is_ok());
        assert!(b.try_take(0, 6).is_err());
        assert!(b.try_take(0, 5).is_ok());
        // An expensive op a full bucket cannot hold is charged as a full pool.
        assert!(b.try_take(SEC, 1000).is_ok());
        assert!(b.try_take(SEC, 1).is_err());
    }

    #[test]
    fn set_rate_changes_the_cost_not_the_banked_time() {
        let mut b = bucket(100.0, 1.0, 1000, 0);
        offer(&mut b, 0, 2 * SEC, 1_000_000);
        b.set_rate(10.0);
        assert_eq!(b.rate_per_s(), 10.0);
        let ok = offer(&mut b, 2 * SEC, 12 * SEC, 1_000_000);
        assert!((99..=101).contains(&ok), "{ok}");
        b.set_rate(0.0);
        assert_eq!(b.rate_per_s(), MIN_RATE_PER_S);
        b.set_rate(f64::NAN);
        assert_eq!(b.rate_per_s(), MIN_RATE_PER_S);
    }

    #[test]
    fn clock_going_backwards_refills_nothing() {
        let mut b = bucket(10.0, 1.0, 1000, 0);
        drain(|| b.try_take(5 * SEC, 1).is_ok());
        assert!(b.try_take(SEC, 1).is_err());
        assert!(b.try_take(5 * SEC, 1).is_err());
        assert!(b.try_take(5 * SEC + 100_000_001, 1).is_ok());
    }

    #[test]
    fn full_again_after_idle() {
        let mut b = bucket(10.0, 1.5, 1000, 2000);
        assert!(b.is_full(0));
        b.try_take(0, 1).unwrap();
        assert!(!b.is_full(0));
        // One op from a full bucket: full again one interval later.
        assert!(b.is_full(100_000_000));
        drain(|| b.try_take(SEC, 1).is_ok());
        assert!(!b.is_full(SEC + SEC / 2));
        // Pool refills in 1 s, the burst pool from the bank, the bank is
        // topped up from the time after that.
        assert!(b.is_full(4 * SEC));
    }

    #[test]
    fn scaled_rate_scales_and_floors() {
        assert_eq!(scaled_rate(100.0, 0.0, 0.1), 100.0);
        assert_eq!(scaled_rate(100.0, 0.25, 0.1), 75.0);
        assert_eq!(scaled_rate(100.0, 1.0, 0.1), 10.0);
        assert_eq!(scaled_rate(100.0, 7.0, 0.1), 10.0);
        assert_eq!(scaled_rate(100.0, f64::NAN, 0.1), 100.0);
        assert_eq!(scaled_rate(100.0, 1.0, 0.0), MIN_RATE_PER_S);
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let c = BucketConfig {
            rate_per_s: 0.0,
            ..BucketConfig::default()
        };
        assert_eq!(TokenBucket::new(c, 0).unwrap_err().key, "rate_per_s");
        let c = BucketConfig {
            burst_ratio: 0.5,
            ..BucketConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().key, "burst_ratio");
    }

    #[test]
    fn charged_debt_refuses_until_time_pays_it() {
        // 1000 units/s, 1 s window, no catch-up.
        let mut b = bucket(1000.0, 1.0, 1000, 0);
        assert!(b.try_take(0, 10).is_ok());
        // Settle a query that really cost 3000 units: 990 from the pool,
        // the rest (2010 units = 2.01 s) as debt, capped at one pool (1 s).
        b.charge(0, 3000);
        let wait = b.try_take(0, 1).unwrap_err();
        assert!(wait >= Duration::from_millis(1000), "{wait:?}");
        // Half a second later still in debt; after the debt, admitted.
        assert!(b.try_take(SEC / 2, 1).is_err());
        assert!(b.try_take(SEC + SEC / 100, 1).is_ok());
        // A refund pays debt first, then refills the pool up to its cap.
        b.charge(2 * SEC, 1500);
        b.refund(2 * SEC, 1500);
        assert!(b.try_take(2 * SEC, 1).is_ok());
        // A refund never fills the pool past its cap (1000 units).
        b.refund(2 * SEC, 1_000_000);
        assert!(b.try_take(2 * SEC, 1000).is_ok());
        assert!(b.try_take(2 * SEC, 1).is_err());
    }

    #[test]
    fn a_bucket_resumed_from_its_pools_goes_on_where_it_was() {
        let cfg = BucketConfig {
            rate_per_s: 1000.0,
            burst_ratio: 1.0,
            window_ms: 10,
            catch_up_ms: 0,
        };
        let mut b = TokenBucket::new(cfg, 0).unwrap();
        b.try_take(0, 7).unwrap();
        let mut again = TokenBucket::resume(cfg, 1000.0, b.pools());
        assert_eq!(pools(&again), pools(&b));
        assert!(again.try_take(0, 3).is_ok());
        assert!(again.try_take(0, 1).is_err(), "10 taken of a 10 ms pool");
        // At another rate the same pools last longer.
        let slow = TokenBucket::resume(cfg, 100.0, b.pools());
        assert_eq!(slow.rate_per_s(), 100.0);
    }
}
