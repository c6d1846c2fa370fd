//! The engine's shared throttle state: the clock, the config snapshot, the
//! two published verdicts (atomics), the per-client token-bucket maps (each
//! behind its own mutex), the per-IP connection counts and their guard,
//! the publication of a governor tick, and the metrics of every decision.
//! No decision is made here: what an operation is checked against, who is
//! charged, shadow mode, delays, refunds and refusals are
//! `sluice_throttle::policy`, run here over the maps ([`Maps`], its
//! `Buckets`) and the metrics ([`Metrics`], its `Tally`). The scheduler
//! runs in `reads.rs`; a cluster's sharing of bucket use is `usage.rs`.
//!
//! Hot path (per EVENT/REQ): one load of the config snapshot (`ArcSwap`,
//! no lock), one atomic load for the direction's verdict, and one short
//! mutex hold per token bucket checked. The monitor thread (see
//! `monitor.rs`) ticks the governor every `tick_ms` and calls
//! [`Throttle::publish`]; SIGHUP swaps the snapshot ([`Throttle::reload`]).
//!
//! Invariants: every map here is bounded (`clients.max_tracked_keys`). The
//! locks never poison the relay: the data behind them stays consistent
//! (bucket operations do not panic), so a poisoned lock is used as is.

mod usage;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sluice_throttle::policy::{
    Action, AuthorRefusal, Bucket, Buckets, Checks, Op, Quota, Rates, Tally,
};
use sluice_throttle::trust::WriteStanding;
use sluice_throttle::{
    BucketConfig, BucketPools, Direction, GovernorState, KeyedBuckets, KeyedStats, Mode,
    RateLimited, Tiers, TokenBucket, Verdict,
};

// The policy types, where the engine's callers have always found them.
pub use sluice_throttle::{
    ClientsConfig, ConnPacer, Layer, Mode as ModeConfig, Principal, QueriesConfig, ReliefConfig,
    ThrottleConfig, client_key,
};
pub use usage::{Usage, UsageKey, UsageMap};

use crate::metrics_names as m;

/// Shared throttling state. One per engine.
pub struct Throttle {
    epoch: Instant,
    /// The `[throttle]` section in force: one snapshot per operation.
    config: ArcSwap<ThrottleConfig>,
    verdicts: [AtomicU64; 2],
    state: Mutex<Option<GovernorState>>,
    events_ip: Mutex<KeyedBuckets<IpAddr>>,
    events_pubkey: Mutex<KeyedBuckets<[u8; 32]>>,
    /// Per-author EVENT buckets of each kind class
    /// (`throttle.clients.kinds`), swapped whole when the classes change.
    author_kinds: ArcSwap<Vec<Mutex<KeyedBuckets<[u8; 32]>>>>,
    reqs_ip: Mutex<KeyedBuckets<IpAddr>>,
    read_cost_ip: Mutex<KeyedBuckets<IpAddr>>,
    /// Current rate of the per-connection read budget (f64 bits), scaled
    /// by the read controller like the keyed buckets.
    read_cost_conn_rate: AtomicU64,
    connections: Mutex<HashMap<IpAddr, u32>>,
    /// The identity tiers of the current config and their per-pubkey
    /// buckets, swapped together on reload.
    tiers: ArcSwap<TierBuckets>,
    /// Whether the maps a cluster shares count their keys' use
    /// ([`Throttle::track_usage`]).
    usage_tracking: AtomicBool,
    /// The budget every author outside the web of trust shares
    /// (`trust.outsider_events_per_s`), and the EVENTs that asked for it
    /// since the monitor last looked.
    outsiders: Mutex<TokenBucket>,
    outsider_asks: AtomicU64,
}

/// The tiers and, for each tier above anonymous (`tier.index - 1`), its
/// per-pubkey buckets.
struct TierBuckets {
    tiers: Tiers,
    buckets: Vec<PubkeyBuckets>,
}

/// One tier's per-pubkey buckets, one map per quota.
struct PubkeyBuckets {
    multiplier: f64,
    maps: [Mutex<KeyedBuckets<[u8; 32]>>; 3],
}

const QUOTAS: [Quota; 3] = [Quota::Events, Quota::Requests, Quota::ReadCost];

impl PubkeyBuckets {
    fn map(&self, quota: Quota) -> &Mutex<KeyedBuckets<[u8; 32]>> {
        let i = QUOTAS.iter().position(|q| *q == quota).unwrap_or(0);
        &self.maps[i]
    }
}

impl TierBuckets {
    /// From a validated config.
    fn new(cfg: &ThrottleConfig, tracking: bool) -> TierBuckets {
        let c = &cfg.clients;
        let tiers = Tiers::new(&cfg.tiers);
        let buckets = (tiers.all().iter().skip(1))
            .map(|t| PubkeyBuckets {
                multiplier: t.rate_multiplier,
                maps: QUOTAS.map(|quota| {
                    let b = sluice_throttle::policy::tier_bucket(c, quota, t.rate_multiplier);
                    let mut map = keyed(b, c.max_tracked_keys);
                    map.set_usage_tracking(tracking && quota != Quota::ReadCost);
                    Mutex::new(map)
                }),
            })
            .collect();
        TierBuckets { tiers, buckets }
    }

    fn tier(&self, index: u8) -> Option<&PubkeyBuckets> {
        self.buckets.get(usize::from(index).wrapping_sub(1))
    }
}

/// A keyed map of a validated bucket config (`ThrottleConfig::validate`
/// checked it, so this never fails; if it did, the map would take the
/// defaults rather than stop the relay).
fn keyed<K: std::hash::Hash + Eq + Clone>(b: BucketConfig, max_keys: usize) -> KeyedBuckets<K> {
    KeyedBuckets::new(b, max_keys).unwrap_or_else(|e| {
        tracing::error!(error = %e, "invalid bucket config: using the defaults");
        KeyedBuckets::new(BucketConfig::default(), max_keys.max(1))
            .unwrap_or_else(|_| unreachable!("the default bucket config is valid"))
    })
}

/// One per-author map per kind class (validated).
fn kind_maps(c: &ClientsConfig) -> Vec<Mutex<KeyedBuckets<[u8; 32]>>> {
    c.kinds
        .iter()
        .map(|k| Mutex::new(keyed(k.bucket(), c.max_tracked_keys)))
        .collect()
}

/// The outsiders' budget at `per_s` (validated): a second's worth at once.
fn outsider_bucket(per_s: f64) -> TokenBucket {
    let b = BucketConfig {
        rate_per_s: per_s,
        burst_ratio: 1.0,
        window_ms: 1000,
        catch_up_ms: 0,
    };
    TokenBucket::new(b, 0).unwrap_or_else(|e| {
        tracing::error!(error = %e, "invalid outsider budget: using the defaults");
        TokenBucket::new(BucketConfig::default(), 0)
            .unwrap_or_else(|_| unreachable!("the default bucket config is valid"))
    })
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The policy's bucket maps: the engine's, each behind its mutex.
pub(crate) struct Maps<'t>(&'t Throttle);

impl Maps<'_> {
    fn address(&self, quota: Quota) -> &Mutex<KeyedBuckets<IpAddr>> {
        match quota {
            Quota::Events => &self.0.events_ip,
            Quota::Requests => &self.0.reqs_ip,
            Quota::ReadCost => &self.0.read_cost_ip,
        }
    }
}

impl Buckets for Maps<'_> {
    fn take(&mut self, bucket: Bucket<'_>, cost: u32, now_ns: u64) -> Result<(), Duration> {
        match bucket {
            Bucket::Address(q, ip) => lock(self.address(q)).check(&ip, now_ns, cost),
            Bucket::Pubkey(q, tier, p) => match self.0.tiers.load().tier(tier) {
                Some(b) => lock(b.map(q)).check(p, now_ns, cost),
                None => Ok(()),
            },
            Bucket::Author(p) => lock(&self.0.events_pubkey).check(p, now_ns, cost),
            Bucket::AuthorKind(class, p) => {
                match self.0.author_kinds.load().get(usize::from(class)) {
                    Some(map) => lock(map).check(p, now_ns, cost),
                    None => Ok(()),
                }
            }
            Bucket::Outsiders => {
                self.0.outsider_asks.fetch_add(1, Ordering::Relaxed);
                lock(&self.0.outsiders).try_take(now_ns, cost)
            }
        }
    }

    fn settle(&mut self, bucket: Bucket<'_>, delta_units: i64, now_ns: u64) {
        match bucket {
            Bucket::Address(q, ip) => lock(self.address(q)).settle(&ip, now_ns, delta_units),
            Bucket::Pubkey(q, tier, p) => {
                if let Some(b) = self.0.tiers.load().tier(tier) {
                    lock(b.map(q)).settle(p, now_ns, delta_units);
                }
            }
            Bucket::Author(p) => lock(&self.0.events_pubkey).settle(p, now_ns, delta_units),
            Bucket::AuthorKind(class, p) => {
                if let Some(map) = self.0.author_kinds.load().get(usize::from(class)) {
                    lock(map).settle(p, now_ns, delta_units);
                }
            }
            Bucket::Outsiders => lock(&self.0.outsiders).settle(now_ns, delta_units),
        }
    }
}

/// The policy's tally: the throttle metrics.
pub(crate) struct Metrics;

impl Tally for Metrics {
    fn decision(&mut self, dir: Direction, layer: Layer, action: Action, enforced: bool) {
        metrics::counter!(
            m::THROTTLE_DECISIONS_TOTAL,
            "direction" => dir.as_str(),
            "layer" => layer.as_str(),
            "action" => action.as_str(),
            "enforced" => if enforced { "true" } else { "false" }
        )
        .increment(1);
    }

    fn refused(&mut self, dir: Direction, r: &RateLimited) {
        metrics::counter!(m::THROTTLE_REFUSALS_TOTAL, "direction" => dir.as_str(), "layer" => r.layer.as_str(), "reason" => r.cause.as_str())
            .increment(1);
    }

    fn delayed(&mut self, dir: Direction, delay: Duration) {
        metrics::histogram!(m::THROTTLE_DELAY_APPLIED_SECONDS, "direction" => dir.as_str())
            .record(delay.as_secs_f64());
    }

    fn connection_refused(&mut self) {
        metrics::counter!(m::THROTTLE_REFUSALS_TOTAL, "direction" => "connect", "layer" => Layer::ConnectionsPerIp.as_str(), "reason" => "cap").increment(1);
    }
}

/// The policy as the engine runs it.
pub(crate) type EngineChecks<'a> = Checks<'a, Maps<'a>, Metrics>;

impl Throttle {
    /// Builds from a config that passed [`ThrottleConfig::validate`].
    pub fn new(cfg: ThrottleConfig) -> Arc<Throttle> {
        let c = &cfg.clients;
        let max = c.max_tracked_keys;
        let t = Throttle {
            tiers: ArcSwap::from_pointee(TierBuckets::new(&cfg, false)),
            epoch: Instant::now(),
            verdicts: [AtomicU64::new(0), AtomicU64::new(0)],
            state: Mutex::new(None),
            events_ip: Mutex::new(keyed(c.events_per_ip, max)),
            events_pubkey: Mutex::new(keyed(c.events_per_pubkey, max)),
            author_kinds: ArcSwap::from_pointee(kind_maps(c)),
            reqs_ip: Mutex::new(keyed(c.reqs_per_ip, max)),
            read_cost_ip: Mutex::new(keyed(c.read_cost_per_ip, max)),
            read_cost_conn_rate: AtomicU64::new(c.read_cost_per_connection.rate_per_s.to_bits()),
            connections: Mutex::new(HashMap::new()),
            config: ArcSwap::from_pointee(cfg),
            usage_tracking: AtomicBool::new(false),
            outsiders: Mutex::new(outsider_bucket(50.0)),
            outsider_asks: AtomicU64::new(0),
        };
        t.export_mode();
        Arc::new(t)
    }

    /// Nanoseconds since the throttle was built: the clock of every bucket
    /// and controller.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn mode(&self) -> Mode {
        self.config.load().mode
    }

    /// The current `[throttle]` section (the last one reloaded).
    pub fn config(&self) -> ThrottleConfig {
        ThrottleConfig::clone(&self.config.load())
    }

    /// Reads the current `[throttle]` section without copying it (e.g. the
    /// server's trusted proxies at each connection).
    pub fn with_config<R>(&self, f: impl FnOnce(&ThrottleConfig) -> R) -> R {
        f(&self.config.load())
    }

    /// Runs the policy on one operation: the config snapshot, the maps,
    /// the metrics and the time now.
    pub(crate) fn checks<R>(&self, f: impl FnOnce(&mut EngineChecks<'_>) -> R) -> R {
        let config = self.config.load();
        f(&mut Checks {
            config: &config,
            buckets: Maps(self),
            tally: Metrics,
            now_ns: self.now_ns(),
        })
    }

    /// A new per-connection, per-direction pacer.
    pub fn pacer(&self) -> ConnPacer {
        ConnPacer::new(self.config.load().check_every_ops)
    }

    /// Applies a reloaded config (SIGHUP). Buckets keep their clients;
    /// controllers keep their state (the monitor hands the governor the
    /// new section at its next tick). On error nothing changes.
    pub fn reload(&self, cfg: ThrottleConfig) -> Result<(), String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let c = &cfg.clients;
        let fail = |e: sluice_throttle::ConfigError| e.to_string();
        let max = c.max_tracked_keys;
        for (map, b) in [
            (&self.events_ip, c.events_per_ip),
            (&self.reqs_ip, c.reqs_per_ip),
            (&self.read_cost_ip, c.read_cost_per_ip),
        ] {
            lock(map).set_config(b, max).map_err(fail)?;
        }
        (lock(&self.events_pubkey).set_config(c.events_per_pubkey, max)).map_err(fail)?;
        self.read_cost_conn_rate.store(
            c.read_cost_per_connection.rate_per_s.to_bits(),
            Ordering::Relaxed,
        );
        let old = self.config.load();
        if old.clients.kinds != c.kinds || old.clients.max_tracked_keys != max {
            self.author_kinds.store(Arc::new(kind_maps(c)));
        }
        if (&old.tiers, &old.clients) != (&cfg.tiers, &cfg.clients) {
            // Tier membership or base rates changed: the per-pubkey buckets
            // start full again.
            let tracking = self.usage_tracking.load(Ordering::Relaxed);
            self.tiers.store(Arc::new(TierBuckets::new(&cfg, tracking)));
        }
        self.config.store(Arc::new(cfg));
        self.export_mode();
        Ok(())
    }

    fn export_mode(&self) {
        let current = self.mode();
        for m in [Mode::Enforce, Mode::Shadow, Mode::Off] {
            let on = f64::from(u8::from(m == current));
            metrics::gauge!(m::THROTTLE_MODE, "mode" => m.as_str()).set(on);
        }
    }

    /// Counts a new connection from `ip`; `None` when the IP is at its cap
    /// (in enforce mode). The guard uncounts it when dropped.
    pub fn open_connection(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionGuard> {
        let key = client_key(ip);
        let mut conns = lock(&self.connections);
        let n = conns.entry(key).or_insert(0);
        if !self.checks(|c| c.connection(*n)) {
            return None;
        }
        *n += 1;
        Some(ConnectionGuard {
            throttle: self.clone(),
            key,
        })
    }

    /// Who a connection from `ip`, authenticated as `pubkeys`, is charged
    /// to: its tier and key (see `sluice_throttle::tiers`).
    pub fn principal(&self, ip: IpAddr, pubkeys: &[[u8; 32]]) -> Principal {
        self.tiers.load().tiers.principal(ip, pubkeys)
    }

    /// [`Throttle::principal`], an unlisted pubkey taking the tier its
    /// distance in the web of trust gives it (`trust_tier`).
    pub fn principal_with(
        &self,
        ip: IpAddr,
        pubkeys: &[[u8; 32]],
        trust_tier: impl Fn(&[u8; 32]) -> Option<u8>,
    ) -> Principal {
        self.tiers
            .load()
            .tiers
            .principal_with(ip, pubkeys, trust_tier)
    }

    /// Admission of one EVENT before its signature, or of one REQ, COUNT
    /// or NEG-OPEN (see `sluice_throttle::policy::Checks::operation`).
    pub fn admit(&self, op: Op, who: &Principal, pacer: &mut ConnPacer) -> Verdict {
        let dir = op.direction();
        let published = Verdict::from_bits(self.verdicts[dir_index(dir)].load(Ordering::Relaxed));
        self.checks(|c| c.operation(op, who, pacer, published))
    }

    /// Admission of one EVENT after its signature: its author's bucket
    /// (see `sluice_throttle::policy::Checks::author`).
    pub fn admit_author(
        &self,
        pubkey: &[u8; 32],
        kind: u16,
        standing: &WriteStanding,
    ) -> Result<(), AuthorRefusal> {
        self.checks(|c| c.author(pubkey, kind, standing))
    }

    /// An outsider's EVENT before its signature: the outsiders' budget
    /// (see `sluice_throttle::policy::Checks::outsiders`).
    pub fn admit_outsider(
        &self,
        standing: &WriteStanding,
        difficulty: u32,
    ) -> Result<(), AuthorRefusal> {
        self.checks(|c| c.outsiders(standing, difficulty))
    }

    /// Sets the outsiders' budget (`trust.outsider_events_per_s`): one
    /// second's worth back to back; it starts full.
    pub fn set_outsider_rate(&self, per_s: f64) {
        *lock(&self.outsiders) = outsider_bucket(per_s);
    }

    /// The outsiders' EVENTs that asked for their budget since the last
    /// call.
    pub(crate) fn take_outsider_asks(&self) -> u64 {
        self.outsider_asks.swap(0, Ordering::Relaxed)
    }

    /// Admission of a query estimated at `estimate` units: its read cost,
    /// then `schedule` (see `sluice_throttle::policy::Checks::query`).
    pub(crate) fn admit_query<J, E: From<RateLimited>>(
        &self,
        who: &Principal,
        budget: &mut ConnReadBudget,
        estimate: u64,
        schedule: impl FnOnce(&mut EngineChecks<'_>) -> Result<J, E>,
    ) -> Result<J, E> {
        let mut bucket = self.connection_bucket(budget);
        let admitted = self.checks(|c| c.query(who, &mut bucket, estimate, schedule));
        budget.pools = bucket.pools();
        admitted
    }

    /// A connection's read budget made whole: the current config and rate
    /// around its pools.
    fn connection_bucket(&self, budget: &ConnReadBudget) -> TokenBucket {
        let cfg = self.config.load().clients.read_cost_per_connection;
        let rate = f64::from_bits(self.read_cost_conn_rate.load(Ordering::Relaxed));
        TokenBucket::resume(cfg, rate, budget.pools)
    }

    /// Settles a query's cost with its client's read budgets: a positive
    /// `delta` is charged (debt beyond what the budget holds), a negative
    /// one refunded.
    pub fn settle_read_cost(&self, who: &Principal, delta_units: i64) {
        self.checks(|c| c.settle_read_cost(who, delta_units));
    }

    /// Settles a connection's read budget likewise.
    pub fn settle_connection_read_cost(&self, budget: &mut ConnReadBudget, delta_units: i64) {
        let mut bucket = self.connection_bucket(budget);
        self.checks(|c| c.settle_connection(&mut bucket, delta_units));
        budget.pools = bucket.pools();
    }

    /// A new connection's own read budget (owned by its session).
    pub fn connection_read_budget(&self) -> ConnReadBudget {
        let cfg = self.config.load().clients.read_cost_per_connection;
        let bucket = TokenBucket::new(cfg, self.now_ns()).unwrap_or_else(|e| {
            tracing::error!(error = %e, "invalid read budget config: using the defaults");
            TokenBucket::new(BucketConfig::default(), self.now_ns())
                .unwrap_or_else(|_| unreachable!("the default bucket config is valid"))
        });
        ConnReadBudget {
            pools: bucket.pools(),
        }
    }

    /// Publishes a governor tick: verdicts for the hot path, bucket rates
    /// (`sluice_throttle::policy::Rates`, docs/design.md#backpressure), and
    /// the state for /metrics and /api/throttle.
    pub(crate) fn publish(&self, state: &GovernorState) {
        self.verdicts[0].store(state.write.verdict.to_bits(), Ordering::Relaxed);
        self.verdicts[1].store(state.read.verdict.to_bits(), Ordering::Relaxed);
        let cfg = self.config.load();
        let rates = Rates::after(&cfg.clients, state.write.pid.output, state.read.pid.output);
        lock(&self.events_ip).set_rate(rates.events_per_ip);
        lock(&self.events_pubkey).set_rate(rates.events_per_pubkey);
        lock(&self.reqs_ip).set_rate(rates.reqs_per_ip);
        lock(&self.read_cost_ip).set_rate(rates.read_cost_per_ip);
        for b in self.tiers.load().buckets.iter() {
            for quota in QUOTAS {
                lock(b.map(quota)).set_rate(rates.tier(quota, b.multiplier));
            }
        }
        self.read_cost_conn_rate
            .store(rates.read_cost_per_connection.to_bits(), Ordering::Relaxed);
        *lock(&self.state) = Some(*state);
    }

    /// The last governor state, if a tick has run.
    pub fn state(&self) -> Option<GovernorState> {
        *lock(&self.state)
    }

    pub fn bucket_stats(&self) -> [(&'static str, KeyedStats); 4] {
        [
            ("events_per_ip", lock(&self.events_ip).stats()),
            ("events_per_pubkey", lock(&self.events_pubkey).stats()),
            ("reqs_per_ip", lock(&self.reqs_ip).stats()),
            ("read_cost_per_ip", lock(&self.read_cost_ip).stats()),
        ]
    }

    /// Current rate of the per-IP read budget, cost units per second.
    pub fn read_cost_rate_per_ip(&self) -> f64 {
        lock(&self.read_cost_ip).rate_per_s()
    }
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Write => 0,
        Direction::Read => 1,
    }
}

/// A connection's read budget, in cost units; owned by its session. Only
/// its pools: the config and the rate are every connection's, read at each
/// use (40 bytes a connection, not 120).
#[derive(Debug, Clone)]
pub struct ConnReadBudget {
    pools: BucketPools,
}

/// Counts one open connection of an IP; uncounts it on drop.
pub struct ConnectionGuard {
    throttle: Arc<Throttle>,
    key: IpAddr,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut conns = lock(&self.throttle.connections);
        if let Some(n) = conns.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                conns.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_cap_per_ip() {
        let mut cfg = ThrottleConfig::default();
        cfg.clients.max_connections_per_ip = 2;
        let t = Throttle::new(cfg);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let a = t.open_connection(ip).unwrap();
        let _b = t.open_connection(ip).unwrap();
        assert!(t.open_connection(ip).is_none());
        drop(a);
        assert!(t.open_connection(ip).is_some());
    }

    #[test]
    fn reload_applies_the_mode_and_refuses_a_bad_section_naming_the_key() {
        let t = Throttle::new(ThrottleConfig::default());
        let mut cfg = ThrottleConfig {
            mode: ModeConfig::Shadow,
            ..ThrottleConfig::default()
        };
        t.reload(cfg.clone()).unwrap();
        assert_eq!(t.mode(), Mode::Shadow);
        cfg.mode = ModeConfig::Off;
        cfg.read.kp = -1.0;
        let err = t.reload(cfg).unwrap_err();
        assert!(err.starts_with("throttle.read.kp = -1"), "{err}");
        assert_eq!(t.mode(), Mode::Shadow);
    }

    /// A pubkey's read budget refusal is labelled as such (it was
    /// `read_budget_ip`), and the address gets its charge back.
    #[test]
    fn the_pubkey_read_budget_names_its_own_layer() {
        let t = Throttle::new(ThrottleConfig::default());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let who = t.principal(ip, &[[3; 32]]);
        // Spend the pubkey's budget from another address (its address's
        // budget, charged the same, refuses first).
        let elsewhere = t.principal("192.0.2.2".parse().unwrap(), &[[3; 32]]);
        let query = |who: &Principal| {
            let mut budget = t.connection_read_budget();
            t.admit_query(who, &mut budget, 1 << 31, |_| Ok::<_, RateLimited>(()))
        };
        let spent = (0..1000).find_map(|_| query(&elsewhere).err());
        assert_eq!(spent.map(|r| r.layer), Some(Layer::ReadBudgetIp));
        let r = query(&who);
        assert_eq!(r.unwrap_err().layer, Layer::ReadBudgetPubkey);
    }

    use std::time::Duration;

    use sluice_throttle::Governor;
    use sluice_throttle::refusal::Cause;
    use sluice_throttle::tiers::ListedTier;
    use sluice_throttle::trust::{OutsiderRule, OutsiderWrites};

    use super::test_metrics::record;

    const IP: &str = "192.0.2.7";

    fn ip() -> IpAddr {
        IP.parse().unwrap()
    }

    /// Two operations back to back, then (for ~1000 s) none: a bucket a
    /// test spends exactly.
    fn two_only() -> BucketConfig {
        BucketConfig {
            rate_per_s: 0.001,
            burst_ratio: 1.0,
            window_ms: 1,
            catch_up_ms: 0,
        }
    }

    /// Kind 7 (reactions) in a class of its own, two per author.
    fn reactions() -> sluice_throttle::config::KindLimit {
        sluice_throttle::config::KindLimit {
            name: "reactions".into(),
            kinds: vec![7],
            rate_per_s: 0.001,
            burst_ratio: 1.0,
            window_ms: 1,
            catch_up_ms: 0,
        }
    }

    const TRUSTED: WriteStanding = WriteStanding::Trusted {
        distance: 0,
        tier: None,
    };

    fn limited(current: u32, adaptive: bool) -> WriteStanding {
        WriteStanding::Outsider(OutsiderRule {
            writes: OutsiderWrites::Limited,
            floor: 0,
            current,
            adaptive,
        })
    }

    /// `pubkey`'s events of `kind` admitted (true) or refused by its
    /// author's bucket (false), `n` in a row.
    fn authors(t: &Throttle, pubkey: &[u8; 32], kind: u16, n: usize) -> Vec<bool> {
        (0..n)
            .map(|_| match t.admit_author(pubkey, kind, &TRUSTED) {
                Ok(()) => true,
                Err(AuthorRefusal::Limited(r)) => {
                    assert_eq!(r.layer, Layer::PubkeyBucket, "{r:?}");
                    false
                }
                Err(e) => panic!("{e:?}"),
            })
            .collect()
    }

    fn listed(name: &str, pubkey: &[u8; 32]) -> ListedTier {
        ListedTier {
            name: name.into(),
            weight: 3,
            rate_multiplier: 1.0,
            pubkeys: vec![sluice_proto::hex32::encode(pubkey)],
        }
    }

    fn refused_by(v: &Verdict) -> Option<Layer> {
        match v {
            Verdict::Refuse(r) => Some(r.layer),
            _ => None,
        }
    }

    #[test]
    fn an_authors_events_are_charged_to_its_bucket_and_a_kind_class_to_its_own() {
        let mut cfg = ThrottleConfig::default();
        cfg.clients.events_per_pubkey = two_only();
        cfg.clients.kinds = vec![reactions()];
        let t = Throttle::new(cfg);
        let (a, b) = ([1; 32], [2; 32]);
        assert_eq!(authors(&t, &a, 1, 3), [true, true, false]);
        // Reactions have their own bucket: the notes spent none of it.
        assert_eq!(authors(&t, &a, 7, 3), [true, true, false]);
        // Another author has buckets of its own.
        assert_eq!(authors(&t, &b, 7, 1), [true]);
        assert_eq!(authors(&t, &b, 1, 1), [true]);
    }

    #[test]
    fn a_reload_rebuilds_the_kind_buckets_when_the_classes_or_the_key_bound_change() {
        let t = Throttle::new(ThrottleConfig::default());
        let a = [1; 32];
        // No class: reactions share the author's bucket (20 back to back).
        assert_eq!(authors(&t, &a, 7, 3), [true; 3]);
        let mut classes = ThrottleConfig::default();
        classes.clients.kinds = vec![reactions()];
        t.reload(classes.clone()).unwrap();
        assert_eq!(authors(&t, &a, 7, 3), [true, true, false]);
        // The same classes and bound, another change in and out of
        // `clients`: the spent bucket stays spent.
        let mut same = classes.clone();
        same.tick_ms = 250;
        same.clients.polite_ops_per_s = 3.0;
        t.reload(same.clone()).unwrap();
        assert_eq!(authors(&t, &a, 7, 1), [false]);
        // A new bound on tracked keys: the classes' maps start again.
        let mut bound = same;
        bound.clients.max_tracked_keys = 1000;
        t.reload(bound).unwrap();
        assert_eq!(authors(&t, &a, 7, 3), [true, true, false]);
    }

    #[test]
    fn a_reload_rebuilds_the_tiers_only_when_tiers_or_clients_change() {
        let (friend, ip) = ([9; 32], ip());
        let mut cfg = ThrottleConfig::default();
        cfg.clients.events_per_ip = two_only();
        let t = Throttle::new(cfg.clone());
        assert_eq!(t.principal(ip, &[friend]).tier.index, 1);
        let mut tiers = cfg;
        tiers.tiers.listed = vec![listed("friends", &friend)];
        t.reload(tiers.clone()).unwrap();
        let who = t.principal(ip, &[friend]);
        assert_eq!((who.tier.index, who.tier.name), (2, "friends"));
        let mut pacer = t.pacer();
        let mut events = |n| -> Vec<Option<Layer>> {
            (0..n)
                .map(|_| refused_by(&t.admit(Op::Event, &who, &mut pacer)))
                .collect()
        };
        assert_eq!(events(3), [None, None, Some(Layer::PubkeyBucket)]);
        // Nothing of the tiers or the clients changed: the friend's bucket
        // is still spent.
        let mut other = tiers;
        other.tick_ms = 250;
        t.reload(other).unwrap();
        assert_eq!(events(1), [Some(Layer::PubkeyBucket)]);
    }

    #[test]
    fn a_tiers_pubkey_buckets_are_one_per_quota() {
        let friend = [9; 32];
        let mut cfg = ThrottleConfig::default();
        // A listed tier's per-pubkey rates are the per-address ones: two
        // EVENTs, forty requests back to back.
        cfg.clients.events_per_ip = two_only();
        cfg.tiers.listed = vec![listed("friends", &friend)];
        let t = Throttle::new(cfg);
        let who = t.principal(ip(), &[friend]);
        let mut pacer = t.pacer();
        let mut admit = |op, n| -> Vec<_> {
            (0..n)
                .map(|_| refused_by(&t.admit(op, &who, &mut pacer)))
                .collect()
        };
        assert_eq!(admit(Op::Event, 3), [None, None, Some(Layer::PubkeyBucket)]);
        assert_eq!(admit(Op::Request, 3), [None, None, None]);
        // Its read budget is a third map: a query is admitted.
        let mut budget = t.connection_read_budget();
        assert!(
            t.admit_query(&who, &mut budget, 10, |_| Ok::<_, RateLimited>(()))
                .is_ok()
        );
    }

    #[test]
    fn the_outsiders_share_one_budget_and_their_asks_are_counted() {
        let t = Throttle::new(ThrottleConfig::default());
        let outsider = limited(0, false);
        let admit = |standing: &WriteStanding, difficulty, n| -> Vec<Result<(), AuthorRefusal>> {
            (0..n)
                .map(|_| t.admit_outsider(standing, difficulty))
                .collect()
        };
        // The default budget, 50 a second.
        assert!(admit(&outsider, 0, 10).iter().all(Result::is_ok));
        assert_eq!(t.take_outsider_asks(), 10);
        t.set_outsider_rate(0.001);
        let got = admit(&outsider, 0, 3);
        assert!(got[0].is_ok() && got[1].is_ok(), "{got:?}");
        match &got[2] {
            Err(AuthorRefusal::Limited(r)) => assert_eq!(r.layer, Layer::OutsiderBudget),
            other => panic!("{other:?}"),
        }
        // The web's authors never ask.
        assert!(admit(&TRUSTED, 0, 2).iter().all(Result::is_ok));
        assert_eq!(t.take_outsider_asks(), 3);
        assert_eq!(t.take_outsider_asks(), 0);
        // With adaptive work asked: the refusal asks for it, and an event
        // carrying it passes without asking for the budget.
        let adaptive = limited(12, true);
        assert_eq!(
            admit(&adaptive, 0, 1),
            [Err(AuthorRefusal::Pow { required: 12 })]
        );
        assert_eq!(admit(&adaptive, 12, 1), [Ok(())]);
        assert_eq!(t.take_outsider_asks(), 1);
        // A new rate starts full.
        t.set_outsider_rate(0.001);
        assert!(admit(&outsider, 0, 2).iter().all(Result::is_ok));
    }

    #[test]
    fn settled_read_costs_are_charged_and_refunded() {
        let t = Throttle::new(ThrottleConfig::default());
        for who in [t.principal(ip(), &[]), t.principal(ip(), &[[4; 32]])] {
            let query = |budget: &mut ConnReadBudget| {
                t.admit_query(&who, budget, 1, |_| Ok::<_, RateLimited>(()))
            };
            assert!(query(&mut t.connection_read_budget()).is_ok());
            // A query read far more than its estimate: its client owes it.
            t.settle_read_cost(&who, 1 << 40);
            let r = query(&mut t.connection_read_budget()).unwrap_err();
            assert_eq!(r.layer, Layer::ReadBudgetIp);
            t.settle_read_cost(&who, -(1 << 40));
            assert!(query(&mut t.connection_read_budget()).is_ok());
            // Its connection's budget likewise.
            let mut budget = t.connection_read_budget();
            t.settle_connection_read_cost(&mut budget, 1 << 40);
            let r = query(&mut budget).unwrap_err();
            assert_eq!(r.layer, Layer::ReadBudgetConnection);
            t.settle_connection_read_cost(&mut budget, -(1 << 40));
            assert!(query(&mut budget).is_ok());
        }
        // A listed pubkey is not charged to its address: its own budget
        // owes.
        let friend = [9; 32];
        let mut cfg = ThrottleConfig::default();
        cfg.tiers.listed = vec![listed("friends", &friend)];
        t.reload(cfg).unwrap();
        let who = t.principal(ip(), &[friend]);
        t.settle_read_cost(&who, 1 << 40);
        let mut budget = t.connection_read_budget();
        let r = t.admit_query(&who, &mut budget, 1, |_| Ok::<_, RateLimited>(()));
        assert_eq!(r.unwrap_err().layer, Layer::ReadBudgetPubkey);
    }

    #[test]
    fn published_verdicts_apply_to_their_own_direction() {
        let cfg = ThrottleConfig::default();
        let t = Throttle::new(cfg.clone());
        let who = t.principal(ip(), &[]);
        let emergency = Verdict::refuse(Cause::Emergency, Duration::from_secs(3));
        let mut state = *Governor::new(cfg).unwrap().state();
        let admit = |op| refused_by(&t.admit(op, &who, &mut t.pacer()));
        state.write.verdict = emergency;
        t.publish(&state);
        assert_eq!(admit(Op::Event), Some(Layer::Controller));
        assert_eq!(admit(Op::Request), None);
        state.write.verdict = Verdict::Allow;
        state.read.verdict = emergency;
        t.publish(&state);
        assert_eq!(admit(Op::Event), None);
        assert_eq!(admit(Op::Request), Some(Layer::Controller));
        assert_eq!(t.state(), Some(state));
    }

    #[test]
    fn decisions_refusals_delays_and_refused_connections_are_counted() {
        let mut cfg = ThrottleConfig {
            check_every_ops: 1,
            ..ThrottleConfig::default()
        };
        cfg.clients.polite_ops_per_s = 0.0;
        cfg.clients.events_per_pubkey = two_only();
        cfg.clients.max_connections_per_ip = 1;
        let t = Throttle::new(cfg.clone());
        let mut state = *Governor::new(cfg).unwrap().state();
        state.write.verdict = Verdict::Delay(Duration::from_millis(250));
        t.publish(&state);
        let ((), got) = record(|| {
            assert_eq!(authors(&t, &[1; 32], 1, 3), [true, true, false]);
            let who = t.principal(ip(), &[]);
            let v = t.admit(Op::Event, &who, &mut t.pacer());
            assert_eq!(v, Verdict::Delay(Duration::from_millis(250)));
            let _open = t.open_connection(ip()).unwrap();
            assert!(t.open_connection(ip()).is_none());
        });
        let decisions = m::THROTTLE_DECISIONS_TOTAL;
        let decision = |dir, layer, action| {
            let labels = [
                ("direction", dir),
                ("layer", layer),
                ("action", action),
                ("enforced", "true"),
            ];
            got.counter(decisions, &labels)
        };
        assert_eq!(decision("write", "pubkey_bucket", "refuse"), 1);
        assert_eq!(decision("write", "controller", "delay"), 1);
        assert_eq!(decision("read", "connections_per_ip", "refuse"), 1);
        assert_eq!(
            got.counters(decisions).len(),
            3,
            "{:?}",
            got.counters(decisions)
        );
        let refusals = m::THROTTLE_REFUSALS_TOTAL;
        let refusal = |dir, layer, reason| {
            got.counter(
                refusals,
                &[("direction", dir), ("layer", layer), ("reason", reason)],
            )
        };
        assert_eq!(refusal("write", "pubkey_bucket", "rate"), 1);
        assert_eq!(refusal("connect", "connections_per_ip", "cap"), 1);
        assert_eq!(
            got.counters(refusals).len(),
            2,
            "{:?}",
            got.counters(refusals)
        );
        let delays = got.histogram(m::THROTTLE_DELAY_APPLIED_SECONDS, &[("direction", "write")]);
        assert_eq!(delays, [0.25]);
    }

    #[test]
    fn a_shadow_decision_is_counted_not_applied() {
        let mut cfg = ThrottleConfig {
            mode: ModeConfig::Shadow,
            ..ThrottleConfig::default()
        };
        cfg.clients.events_per_pubkey = two_only();
        let t = Throttle::new(cfg);
        let ((), got) = record(|| assert_eq!(authors(&t, &[1; 32], 1, 3), [true; 3]));
        let labels = [
            ("direction", "write"),
            ("layer", "pubkey_bucket"),
            ("action", "refuse"),
            ("enforced", "false"),
        ];
        assert_eq!(got.counter(m::THROTTLE_DECISIONS_TOTAL, &labels), 1);
        assert!(got.counters(m::THROTTLE_REFUSALS_TOTAL).is_empty());
    }

    #[test]
    fn the_mode_gauge_says_which_mode_is_in_force() {
        let modes = |got: &test_metrics::Recorded| {
            ["enforce", "shadow", "off"].map(|mode| got.gauge(m::THROTTLE_MODE, &[("mode", mode)]))
        };
        let (t, got) = record(|| Throttle::new(ThrottleConfig::default()));
        assert_eq!(modes(&got), [Some(1.0), Some(0.0), Some(0.0)]);
        let cfg = ThrottleConfig {
            mode: ModeConfig::Off,
            ..ThrottleConfig::default()
        };
        let (reloaded, got) = record(|| t.reload(cfg));
        reloaded.unwrap();
        assert_eq!(modes(&got), [Some(0.0), Some(0.0), Some(1.0)]);
    }

    #[test]
    fn the_clock_counts_from_the_throttles_start() {
        let before = Instant::now();
        let t = Throttle::new(ThrottleConfig::default());
        let built = Instant::now();
        // The monotonic clock moves on (no assertion races it).
        while built.elapsed() < Duration::from_millis(3) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = t.now_ns();
        assert!(now >= 3_000_000, "{now}");
        assert!(now <= before.elapsed().as_nanos() as u64, "{now}");
    }

    #[test]
    fn the_config_is_the_section_last_applied() {
        let mut cfg = ThrottleConfig {
            tick_ms: 250,
            ..ThrottleConfig::default()
        };
        cfg.clients.max_connections_per_ip = 7;
        let t = Throttle::new(cfg.clone());
        assert_eq!(t.config(), cfg);
        cfg.clients.kinds = vec![reactions()];
        cfg.mode = ModeConfig::Shadow;
        t.reload(cfg.clone()).unwrap();
        assert_eq!(t.config(), cfg);
        assert_eq!(t.with_config(|c| c.tick_ms), 250);
    }

    #[test]
    fn bucket_stats_name_each_map_and_count_its_checks() {
        let mut cfg = ThrottleConfig::default();
        cfg.clients.max_tracked_keys = 1000;
        cfg.clients.events_per_ip = two_only();
        let t = Throttle::new(cfg);
        let who = t.principal(ip(), &[]);
        let mut pacer = t.pacer();
        for _ in 0..3 {
            t.admit(Op::Event, &who, &mut pacer);
        }
        for _ in 0..4 {
            t.admit(Op::Request, &who, &mut pacer);
        }
        assert_eq!(authors(&t, &[1; 32], 1, 1), [true]);
        let mut budget = t.connection_read_budget();
        assert!(
            t.admit_query(&who, &mut budget, 5, |_| Ok::<_, RateLimited>(()))
                .is_ok()
        );
        let stats = t.bucket_stats();
        let names = stats.map(|(name, _)| name);
        assert_eq!(
            names,
            [
                "events_per_ip",
                "events_per_pubkey",
                "reqs_per_ip",
                "read_cost_per_ip"
            ]
        );
        let counts = stats.map(|(_, s)| (s.keys, s.max_keys, s.allowed_total, s.refused_total));
        assert_eq!(
            counts,
            [
                (1, 1000, 2, 1),
                (1, 1000, 1, 0),
                (1, 1000, 4, 0),
                (1, 1000, 1, 0)
            ]
        );
    }

    #[test]
    fn the_read_budget_rate_per_ip_follows_the_config_and_the_controller() {
        let mut cfg = ThrottleConfig::default();
        cfg.clients.read_cost_per_ip.rate_per_s = 1234.5;
        cfg.clients.min_rate_fraction = 0.1;
        let t = Throttle::new(cfg.clone());
        assert_eq!(t.read_cost_rate_per_ip(), 1234.5);
        let mut state = *Governor::new(cfg.clone()).unwrap().state();
        state.read.pid.output = 0.5;
        t.publish(&state);
        let want = sluice_throttle::scaled_rate(1234.5, 0.5, 0.1);
        assert!(want < 1234.5, "{want}");
        assert_eq!(t.read_cost_rate_per_ip(), want);
    }
}

/// A metrics recorder for the engine's tests (declared last, so the lines
/// above keep their numbers).
#[cfg(test)]
pub(crate) mod test_metrics;
