//! The engine's shared throttle state: the clock, the config snapshot, the
//! two published verdicts (atomics), the per-client token-bucket maps (each
//! behind its own mutex), the per-IP connection counts and their guard,
//! the publication of a governor tick, and the metrics of every decision.
//! No decision is made here: what an operation is checked against, who is
//! charged, shadow mode, delays, refunds and refusals are
//! `sluice_throttle::admission`, run here over the maps ([`Maps`], its
//! `Buckets`) and the metrics ([`Metrics`], its `Tally`). The scheduler
//! runs in `reads.rs`; a cluster's sharing of bucket use is `usage.rs`.
//!
//! Hot path (per EVENT/REQ): one load of the config snapshot (`ArcSwap`,
//! no lock), one atomic load for the direction's verdict, and one short
//! mutex hold per token bucket checked. The monitor thread (see
//! `monitor.rs`) ticks the governor every `tick_ms` and calls
//! [`Limiter::publish`]; SIGHUP swaps the snapshot ([`Limiter::reload`]).
//!
//! The budget tree (`[[throttle.budgets]]`, docs/design.md#hierarchical-budgets)
//! is `budgets.rs`: its routing read without a lock, its buckets behind
//! one short mutex, taken only by an operation whose class has a budget.
//!
//! Invariants: every map here is bounded (`clients.max_tracked_keys`). The
//! locks are `parking_lot`'s, which do not poison: a panic elsewhere never
//! stops the relay from taking them.

mod budgets;
mod usage;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sluice_throttle::admission::{
    Action, Admission, AuthorRefusal, Bucket, Buckets, Op, Quota, Rates, Tally,
};
use sluice_throttle::budgets::{BudgetRefusal, Charge};
use sluice_throttle::trust::WriteStanding;
use sluice_throttle::{
    BucketConfig, BucketPools, Direction, GovernorState, KeyedBuckets, KeyedStats, Mode,
    RateLimited, Tiers, TokenBucket, Verdict,
};
use sluice_throttle::{ClientsConfig, ConnPacer, Layer, Principal, ThrottleConfig, client_key};

pub use budgets::OUTSIDER_RATE;
pub use usage::{Usage, UsageKey, UsageMap};

use crate::metrics_names as m;

/// Shared throttling state. One per engine.
pub struct Limiter {
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
    /// ([`Limiter::track_usage`]).
    usage_tracking: AtomicBool,
    /// The budget tree, the outsiders' budget among its nodes
    /// (`trust.outsider_events_per_s` when no budget is written), swapped
    /// whole on reload; `budgets.rs`.
    budgets: ArcSwap<budgets::Budgets>,
    /// `trust.outsider_events_per_s` (f64 bits), for a tree rebuilt by a
    /// reload.
    outsider_rate: AtomicU64,
    /// The EVENTs that asked for the outsiders' budget since the monitor
    /// last looked.
    outsider_asks: AtomicU64,
    /// The fraction of each shared map's rate this node enforces alone
    /// (f64 bits; 1 but while a cluster leases: `usage.rs`).
    lease_share: AtomicU64,
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
                    let b = sluice_throttle::admission::tier_bucket(c, quota, t.rate_multiplier);
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

/// Sets a map's config [`Limiter::prepare_reload`] checked as the map
/// checks it, so this never fails; if it did, the map would keep its old
/// config rather than stop the reload half-way.
fn set_config<K: std::hash::Hash + Eq + Clone>(
    map: &mut KeyedBuckets<K>,
    b: BucketConfig,
    max_keys: usize,
) {
    if let Err(e) = map.set_config(b, max_keys) {
        tracing::error!(error = %e, "bucket config refused after its check: keeping the old one");
    }
}

/// A reloaded `[throttle]` section [`Limiter::prepare_reload`] checked,
/// for [`Limiter::commit_reload`].
#[derive(Debug, Clone)]
pub struct PreparedReload {
    cfg: ThrottleConfig,
}

impl PreparedReload {
    /// The section as it will apply.
    pub fn config(&self) -> &ThrottleConfig {
        &self.cfg
    }
}

/// One per-author map per kind class (validated).
fn kind_maps(c: &ClientsConfig) -> Vec<Mutex<KeyedBuckets<[u8; 32]>>> {
    c.kinds
        .iter()
        .map(|k| Mutex::new(keyed(k.bucket(), c.max_tracked_keys)))
        .collect()
}

/// The policy's bucket maps: the engine's, each behind its mutex.
pub(crate) struct Maps<'t>(&'t Limiter);

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
            Bucket::Address(q, ip) => self.address(q).lock().check(&ip, now_ns, cost),
            Bucket::Pubkey(q, tier, p) => match self.0.tiers.load().tier(tier) {
                Some(b) => b.map(q).lock().check(p, now_ns, cost),
                None => Ok(()),
            },
            Bucket::Author(p) => self.0.events_pubkey.lock().check(p, now_ns, cost),
            Bucket::AuthorKind(class, p) => {
                match self.0.author_kinds.load().get(usize::from(class)) {
                    Some(map) => map.lock().check(p, now_ns, cost),
                    None => Ok(()),
                }
            }
            Bucket::Outsiders => {
                (self.budget(Charge::Outsider, cost, now_ns)).map_err(|r| r.retry_after)
            }
        }
    }

    fn settle(&mut self, bucket: Bucket<'_>, delta_units: i64, now_ns: u64) {
        match bucket {
            Bucket::Address(q, ip) => self.address(q).lock().settle(&ip, now_ns, delta_units),
            Bucket::Pubkey(q, tier, p) => {
                if let Some(b) = self.0.tiers.load().tier(tier) {
                    b.map(q).lock().settle(p, now_ns, delta_units);
                }
            }
            Bucket::Author(p) => self.0.events_pubkey.lock().settle(p, now_ns, delta_units),
            Bucket::AuthorKind(class, p) => {
                if let Some(map) = self.0.author_kinds.load().get(usize::from(class)) {
                    map.lock().settle(p, now_ns, delta_units);
                }
            }
            // Admission never settles a budget: a refusal took nothing.
            Bucket::Outsiders => {}
        }
    }

    fn budget(&mut self, charge: Charge, cost: u32, now_ns: u64) -> Result<(), BudgetRefusal> {
        self.0.charge_budget(charge, cost, now_ns)
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
pub(crate) type EngineAdmission<'a> = Admission<'a, Maps<'a>, Metrics>;

impl Limiter {
    /// Builds from a config that passed [`ThrottleConfig::validate`].
    pub fn new(cfg: ThrottleConfig) -> Arc<Limiter> {
        let c = &cfg.clients;
        let max = c.max_tracked_keys;
        let tree = budgets::Budgets::new(&cfg, OUTSIDER_RATE, None, 0);
        let t = Limiter {
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
            budgets: ArcSwap::from_pointee(tree),
            outsider_rate: AtomicU64::new(OUTSIDER_RATE.to_bits()),
            outsider_asks: AtomicU64::new(0),
            lease_share: AtomicU64::new(1.0f64.to_bits()),
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
    pub(crate) fn checks<R>(&self, f: impl FnOnce(&mut EngineAdmission<'_>) -> R) -> R {
        let config = self.config.load();
        f(&mut Admission {
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

    /// Applies a reloaded config (SIGHUP): [`Limiter::prepare_reload`],
    /// then [`Limiter::commit_reload`]. On error nothing changes.
    pub fn reload(&self, cfg: ThrottleConfig) -> Result<(), String> {
        let prepared = self.prepare_reload(cfg)?;
        self.commit_reload(prepared);
        Ok(())
    }

    /// Checks a reloaded config against everything
    /// [`Limiter::commit_reload`] will do with it, changing nothing: the
    /// whole section, and each bucket map's config and bound as that map's
    /// `set_config` checks them (on a map of its own, empty). What it
    /// returns is applied without a refusal.
    pub fn prepare_reload(&self, cfg: ThrottleConfig) -> Result<PreparedReload, String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let c = &cfg.clients;
        let max = c.max_tracked_keys;
        for (key, b) in [
            ("events_per_ip", c.events_per_ip),
            ("reqs_per_ip", c.reqs_per_ip),
            ("read_cost_per_ip", c.read_cost_per_ip),
            ("events_per_pubkey", c.events_per_pubkey),
        ] {
            KeyedBuckets::<IpAddr>::new(b, max).map_err(|e| {
                e.within(key)
                    .within("clients")
                    .within("throttle")
                    .to_string()
            })?;
        }
        let rate = f64::from_bits(self.outsider_rate.load(Ordering::Relaxed));
        sluice_throttle::BudgetTree::new(&cfg.budgets, &cfg.tiers, rate, 0)
            .map_err(|e| e.to_string())?;
        Ok(PreparedReload { cfg })
    }

    /// Applies a config [`Limiter::prepare_reload`] checked. Buckets keep
    /// their clients; controllers keep their state (the monitor hands the
    /// governor the new section at its next tick).
    pub fn commit_reload(&self, prepared: PreparedReload) {
        let cfg = prepared.cfg;
        let c = &cfg.clients;
        let max = c.max_tracked_keys;
        for (map, b) in [
            (&self.events_ip, c.events_per_ip),
            (&self.reqs_ip, c.reqs_per_ip),
            (&self.read_cost_ip, c.read_cost_per_ip),
        ] {
            set_config(&mut map.lock(), b, max);
        }
        set_config(&mut self.events_pubkey.lock(), c.events_per_pubkey, max);
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
        if (&old.budgets, &old.tiers) != (&cfg.budgets, &cfg.tiers) {
            self.rebuild_budgets(&cfg);
        }
        self.config.store(Arc::new(cfg));
        self.export_mode();
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
        let mut conns = self.connections.lock();
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

    /// [`Limiter::principal`], an unlisted pubkey taking the tier its
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
    /// or NEG-OPEN (see `sluice_throttle::admission::Admission::operation`).
    pub fn admit(&self, op: Op, who: &Principal, pacer: &mut ConnPacer) -> Verdict {
        let dir = op.direction();
        let published = Verdict::from_bits(self.verdicts[dir_index(dir)].load(Ordering::Relaxed));
        self.checks(|c| c.operation(op, who, pacer, published))
    }

    /// Admission of one EVENT after its signature: its author's bucket
    /// (see `sluice_throttle::admission::Admission::author`).
    pub fn admit_author(
        &self,
        pubkey: &[u8; 32],
        kind: u16,
        standing: &WriteStanding,
    ) -> Result<(), AuthorRefusal> {
        self.checks(|c| c.author(pubkey, kind, standing))
    }

    /// An outsider's EVENT before its signature: the outsiders' budget
    /// (see `sluice_throttle::admission::Admission::outsiders`).
    pub fn admit_outsider(
        &self,
        standing: &WriteStanding,
        difficulty: u32,
    ) -> Result<(), AuthorRefusal> {
        self.checks(|c| c.outsiders(standing, difficulty))
    }

    /// The outsiders' EVENTs that asked for their budget since the last
    /// call.
    pub(crate) fn take_outsider_asks(&self) -> u64 {
        self.outsider_asks.swap(0, Ordering::Relaxed)
    }

    /// Admission of a query estimated at `estimate` units: its read cost,
    /// then `schedule` (see `sluice_throttle::admission::Admission::query`).
    pub(crate) fn admit_query<J, E: From<RateLimited>>(
        &self,
        who: &Principal,
        budget: &mut ConnReadBudget,
        estimate: u64,
        schedule: impl FnOnce(&mut EngineAdmission<'_>) -> Result<J, E>,
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
    /// (`sluice_throttle::admission::Rates`, docs/design.md#backpressure), and
    /// the state for /metrics and /api/throttle.
    pub(crate) fn publish(&self, state: &GovernorState) {
        self.verdicts[0].store(state.write.verdict.to_bits(), Ordering::Relaxed);
        self.verdicts[1].store(state.read.verdict.to_bits(), Ordering::Relaxed);
        // Held while the rates are set: a lease's share and a tick's rates
        // are applied one after the other, never interleaved.
        let mut last = self.state.lock();
        self.set_rates(state.write.pid.output, state.read.pid.output);
        *last = Some(*state);
        drop(last);
        self.export_budgets();
    }

    /// Sets every map's rate after the controllers' outputs; the maps a
    /// cluster shares at the leased share of it (`usage.rs`). Called with
    /// the state's lock held.
    fn set_rates(&self, write_output: f64, read_output: f64) {
        let cfg = self.config.load();
        let rates = Rates::after(&cfg.clients, write_output, read_output);
        let share = f64::from_bits(self.lease_share.load(Ordering::Relaxed));
        self.events_ip.lock().set_rate(rates.events_per_ip * share);
        self.events_pubkey
            .lock()
            .set_rate(rates.events_per_pubkey * share);
        self.reqs_ip.lock().set_rate(rates.reqs_per_ip * share);
        self.read_cost_ip.lock().set_rate(rates.read_cost_per_ip);
        for b in self.tiers.load().buckets.iter() {
            for quota in QUOTAS {
                let shared = if quota == Quota::ReadCost { 1.0 } else { share };
                b.map(quota)
                    .lock()
                    .set_rate(rates.tier(quota, b.multiplier) * shared);
            }
        }
        self.read_cost_conn_rate
            .store(rates.read_cost_per_connection.to_bits(), Ordering::Relaxed);
    }

    /// The last governor state, if a tick has run.
    pub fn state(&self) -> Option<GovernorState> {
        *self.state.lock()
    }

    pub fn bucket_stats(&self) -> [(&'static str, KeyedStats); 4] {
        [
            ("events_per_ip", self.events_ip.lock().stats()),
            ("events_per_pubkey", self.events_pubkey.lock().stats()),
            ("reqs_per_ip", self.reqs_ip.lock().stats()),
            ("read_cost_per_ip", self.read_cost_ip.lock().stats()),
        ]
    }

    /// Current rate of the per-IP read budget, cost units per second.
    pub fn read_cost_rate_per_ip(&self) -> f64 {
        self.read_cost_ip.lock().rate_per_s()
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
    throttle: Arc<Limiter>,
    key: IpAddr,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut conns = self.throttle.connections.lock();
        if let Some(n) = conns.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                conns.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests;

/// A metrics recorder for the engine's tests (declared last, so the lines
/// above keep their numbers).
#[cfg(test)]
pub(crate) mod test_metrics;
