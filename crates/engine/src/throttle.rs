//! The engine's shared throttle state: the clock, the mode and the two
//! published verdicts (atomics), the per-client token-bucket maps (each
//! behind its own mutex), the per-IP connection counts and their guard,
//! the publication of a governor tick, and the metrics of every decision.
//! The policy itself (config, verdicts, buckets, what a verdict means for
//! a connection, refusals) is pure and lives in `sluice-throttle`; the
//! query scheduler runs in `reads.rs`; client addresses are resolved by
//! the server.
//!
//! Hot path (per EVENT/REQ): one atomic load for the mode, one for the
//! direction's verdict, and one short mutex hold per token bucket checked.
//! The monitor task (see `monitor.rs`) ticks the governor every `tick_ms`
//! and calls [`Throttle::publish`].
//!
//! Invariants: every map here is bounded (`clients.max_tracked_keys`);
//! in `shadow` mode every decision is computed and counted but none is
//! applied; in `off` mode only the query pool's concurrency bound applies.
//! The locks never poison the relay: the data behind them stays consistent
//! (bucket operations do not panic), so a poisoned lock is used as is.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use sluice_throttle::{
    BucketConfig, ClientKey, Direction, GovernorState, KeyedBuckets, KeyedStats, Mode, Tiers,
    TokenBucket, Verdict,
};

// The policy types, where the engine's callers have always found them.
pub use sluice_throttle::{
    Admit, ClientsConfig, ConnAdmission, Layer, Mode as ModeConfig, Principal, QueriesConfig,
    Refusal, ReliefConfig, ThrottleConfig, client_key,
};

use crate::metrics_names as m;

/// Shared throttling state. One per engine.
pub struct Throttle {
    epoch: Instant,
    mode: AtomicU8,
    check_every_ops: AtomicU64,
    verdicts: [AtomicU64; 2],
    config: RwLock<ThrottleConfig>,
    state: Mutex<Option<GovernorState>>,
    events_ip: Mutex<KeyedBuckets<IpAddr>>,
    events_pubkey: Mutex<KeyedBuckets<[u8; 32]>>,
    reqs_ip: Mutex<KeyedBuckets<IpAddr>>,
    read_cost_ip: Mutex<KeyedBuckets<IpAddr>>,
    /// Current rate of the per-connection read budget (f64 bits), scaled
    /// by the read controller like the keyed buckets.
    read_cost_conn_rate: AtomicU64,
    connections: Mutex<HashMap<IpAddr, u32>>,
    /// The identity tiers of the current config.
    tiers: RwLock<Arc<Tiers>>,
    /// Per-pubkey buckets of each tier above anonymous (`tier.index - 1`):
    /// the base per-IP rates × the tier's rate multiplier.
    pubkey_buckets: RwLock<Arc<Vec<PubkeyBuckets>>>,
    /// Whether the maps a cluster shares count their keys' use
    /// ([`Throttle::track_usage`]).
    usage_tracking: std::sync::atomic::AtomicBool,
}

/// A per-client bucket map whose use a cluster shares among its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageMap {
    /// EVENTs per address.
    EventsIp,
    /// REQs and COUNTs per address.
    ReqsIp,
    /// EVENTs per author.
    Author,
    /// EVENTs per pubkey of the tier with this index (1 = authenticated).
    TierEvents(u8),
    /// REQs per pubkey of the tier with this index.
    TierReqs(u8),
}

impl UsageMap {
    /// A short name for keys shared with other nodes.
    pub fn label(&self) -> String {
        match self {
            UsageMap::EventsIp => "eip".into(),
            UsageMap::ReqsIp => "rip".into(),
            UsageMap::Author => "author".into(),
            UsageMap::TierEvents(t) => format!("t{t}e"),
            UsageMap::TierReqs(t) => format!("t{t}r"),
        }
    }
}

/// The client a use is counted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageKey {
    Ip(IpAddr),
    Pubkey([u8; 32]),
}

impl std::fmt::Display for UsageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UsageKey::Ip(ip) => write!(f, "{ip}"),
            UsageKey::Pubkey(p) => {
                for b in p {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// Operations one client took from one map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub map: UsageMap,
    pub key: UsageKey,
    pub used: u64,
}

/// One tier's per-pubkey buckets.
struct PubkeyBuckets {
    multiplier: f64,
    events: Mutex<KeyedBuckets<[u8; 32]>>,
    reqs: Mutex<KeyedBuckets<[u8; 32]>>,
    read_cost: Mutex<KeyedBuckets<[u8; 32]>>,
}

impl PubkeyBuckets {
    /// Every tier above anonymous, from a validated config.
    fn all(cfg: &ThrottleConfig, tiers: &Tiers) -> Vec<PubkeyBuckets> {
        let c = &cfg.clients;
        tiers.all()[1..]
            .iter()
            .map(|t| {
                let m = t.rate_multiplier;
                let keyed = |b: BucketConfig| {
                    let b = BucketConfig {
                        rate_per_s: (b.rate_per_s * m).min(1e9),
                        ..b
                    };
                    Mutex::new(
                        KeyedBuckets::new(b, c.max_tracked_keys).expect("validated bucket config"),
                    )
                };
                PubkeyBuckets {
                    multiplier: m,
                    events: keyed(c.events_per_ip),
                    reqs: keyed(c.reqs_per_ip),
                    read_cost: keyed(c.read_cost_per_ip),
                }
            })
            .collect()
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Throttle {
    /// Builds from a validated config.
    ///
    /// # Panics
    /// If `cfg` does not pass [`ThrottleConfig::validate`].
    pub fn new(cfg: ThrottleConfig) -> Arc<Throttle> {
        let c = &cfg.clients;
        let keyed = |b: BucketConfig| {
            KeyedBuckets::new(b, c.max_tracked_keys).expect("validated bucket config")
        };
        let tiers = Tiers::new(&cfg.tiers);
        let pubkey_buckets = PubkeyBuckets::all(&cfg, &tiers);
        let t = Throttle {
            tiers: RwLock::new(Arc::new(tiers)),
            pubkey_buckets: RwLock::new(Arc::new(pubkey_buckets)),
            epoch: Instant::now(),
            mode: AtomicU8::new(cfg.mode as u8),
            check_every_ops: AtomicU64::new(cfg.check_every_ops as u64),
            verdicts: [AtomicU64::new(0), AtomicU64::new(0)],
            state: Mutex::new(None),
            events_ip: Mutex::new(keyed(c.events_per_ip)),
            events_pubkey: Mutex::new(
                KeyedBuckets::new(c.events_per_pubkey, c.max_tracked_keys)
                    .expect("validated bucket config"),
            ),
            reqs_ip: Mutex::new(keyed(c.reqs_per_ip)),
            read_cost_ip: Mutex::new(keyed(c.read_cost_per_ip)),
            read_cost_conn_rate: AtomicU64::new(c.read_cost_per_connection.rate_per_s.to_bits()),
            connections: Mutex::new(HashMap::new()),
            config: RwLock::new(cfg),
            usage_tracking: std::sync::atomic::AtomicBool::new(false),
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
        Mode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    /// The current `[throttle]` section (the last one reloaded).
    pub fn config(&self) -> ThrottleConfig {
        self.with_config(ThrottleConfig::clone)
    }

    /// Reads the current `[throttle]` section without copying it (e.g. the
    /// server's trusted proxies at each connection).
    pub fn with_config<R>(&self, f: impl FnOnce(&ThrottleConfig) -> R) -> R {
        f(&self.config.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// A new per-connection, per-direction admission state.
    pub fn admission(&self) -> ConnAdmission {
        ConnAdmission::new(self.check_every_ops.load(Ordering::Relaxed) as u32)
    }

    /// Applies a reloaded config (SIGHUP). Buckets keep their clients;
    /// controllers keep their state (the monitor hands the governor the
    /// new section at its next tick). On error nothing changes.
    pub fn reload(&self, cfg: ThrottleConfig) -> Result<(), String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let c = &cfg.clients;
        let fail = |e: sluice_throttle::ConfigError| e.to_string();
        lock(&self.events_ip)
            .set_config(c.events_per_ip, c.max_tracked_keys)
            .map_err(fail)?;
        lock(&self.events_pubkey)
            .set_config(c.events_per_pubkey, c.max_tracked_keys)
            .map_err(fail)?;
        lock(&self.reqs_ip)
            .set_config(c.reqs_per_ip, c.max_tracked_keys)
            .map_err(fail)?;
        lock(&self.read_cost_ip)
            .set_config(c.read_cost_per_ip, c.max_tracked_keys)
            .map_err(fail)?;
        self.read_cost_conn_rate.store(
            c.read_cost_per_connection.rate_per_s.to_bits(),
            Ordering::Relaxed,
        );
        let old = self.with_config(|c| (c.tiers.clone(), c.clients.clone()));
        if old != (cfg.tiers.clone(), cfg.clients.clone()) {
            // Tier membership or base rates changed: the per-pubkey buckets
            // start full again.
            let tiers = Tiers::new(&cfg.tiers);
            let buckets = PubkeyBuckets::all(&cfg, &tiers);
            if self.usage_tracking.load(Ordering::Relaxed) {
                for b in &buckets {
                    lock(&b.events).set_usage_tracking(true);
                    lock(&b.reqs).set_usage_tracking(true);
                }
            }
            *self.tiers.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(tiers);
            *self
                .pubkey_buckets
                .write()
                .unwrap_or_else(PoisonError::into_inner) = Arc::new(buckets);
        }
        self.mode.store(cfg.mode as u8, Ordering::Relaxed);
        self.check_every_ops
            .store(cfg.check_every_ops as u64, Ordering::Relaxed);
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = cfg;
        self.export_mode();
        Ok(())
    }

    fn export_mode(&self) {
        let current = self.mode();
        for m in [Mode::Enforce, Mode::Shadow, Mode::Off] {
            metrics::gauge!(m::THROTTLE_MODE, "mode" => m.as_str()).set(if m == current {
                1.0
            } else {
                0.0
            });
        }
    }

    /// Starts counting each client's use of the maps a cluster shares
    /// (events and requests per address and per tier pubkey, events per
    /// author), for [`Throttle::drain_usage`]. The hot path then adds one
    /// counter update under the bucket's lock it already holds.
    pub fn track_usage(&self) {
        self.usage_tracking.store(true, Ordering::Relaxed);
        lock(&self.events_ip).set_usage_tracking(true);
        lock(&self.reqs_ip).set_usage_tracking(true);
        lock(&self.events_pubkey).set_usage_tracking(true);
        for b in self.tier_buckets().iter() {
            lock(&b.events).set_usage_tracking(true);
            lock(&b.reqs).set_usage_tracking(true);
        }
    }

    /// Each client's use of the shared maps since the last call.
    pub fn drain_usage(&self) -> Vec<Usage> {
        let mut out = Vec::new();
        let mut ips = Vec::new();
        let mut keys = Vec::new();
        let push_ips = |map, ips: &mut Vec<(IpAddr, u32)>, out: &mut Vec<Usage>| {
            out.extend(ips.drain(..).map(|(ip, n)| Usage {
                map,
                key: UsageKey::Ip(ip),
                used: u64::from(n),
            }))
        };
        lock(&self.events_ip).drain_usage(&mut ips);
        push_ips(UsageMap::EventsIp, &mut ips, &mut out);
        lock(&self.reqs_ip).drain_usage(&mut ips);
        push_ips(UsageMap::ReqsIp, &mut ips, &mut out);
        let push_keys = |map, keys: &mut Vec<([u8; 32], u32)>, out: &mut Vec<Usage>| {
            out.extend(keys.drain(..).map(|(p, n)| Usage {
                map,
                key: UsageKey::Pubkey(p),
                used: u64::from(n),
            }))
        };
        lock(&self.events_pubkey).drain_usage(&mut keys);
        push_keys(UsageMap::Author, &mut keys, &mut out);
        for (i, b) in self.tier_buckets().iter().enumerate() {
            let tier = u8::try_from(i + 1).unwrap_or(u8::MAX);
            lock(&b.events).drain_usage(&mut keys);
            push_keys(UsageMap::TierEvents(tier), &mut keys, &mut out);
            lock(&b.reqs).drain_usage(&mut keys);
            push_keys(UsageMap::TierReqs(tier), &mut keys, &mut out);
        }
        out
    }

    /// Charges what other nodes' clients took (debt beyond the bucket) to
    /// the same keys here, where they are known. Returns how many were.
    pub fn charge_remote(&self, usage: &[Usage]) -> usize {
        let now = self.now_ns();
        let tiers = self.tier_buckets();
        let mut known = 0;
        for u in usage {
            let hit = match (u.map, u.key) {
                (UsageMap::EventsIp, UsageKey::Ip(ip)) => {
                    lock(&self.events_ip).charge_remote(&ip, now, u.used)
                }
                (UsageMap::ReqsIp, UsageKey::Ip(ip)) => {
                    lock(&self.reqs_ip).charge_remote(&ip, now, u.used)
                }
                (UsageMap::Author, UsageKey::Pubkey(p)) => {
                    lock(&self.events_pubkey).charge_remote(&p, now, u.used)
                }
                (UsageMap::TierEvents(t), UsageKey::Pubkey(p)) => tiers
                    .get(usize::from(t).wrapping_sub(1))
                    .is_some_and(|b| lock(&b.events).charge_remote(&p, now, u.used)),
                (UsageMap::TierReqs(t), UsageKey::Pubkey(p)) => tiers
                    .get(usize::from(t).wrapping_sub(1))
                    .is_some_and(|b| lock(&b.reqs).charge_remote(&p, now, u.used)),
                _ => false,
            };
            known += usize::from(hit);
        }
        known
    }

    /// Counts a new connection from `ip`; `None` when the IP is at its cap
    /// (in enforce mode). The guard uncounts it when dropped.
    pub fn open_connection(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionGuard> {
        let key = client_key(ip);
        let max = self.with_config(|c| c.clients.max_connections_per_ip);
        let mode = self.mode();
        let mut conns = lock(&self.connections);
        let n = conns.entry(key).or_insert(0);
        if mode != Mode::Off && *n >= max {
            self.count_decision(
                Direction::Read,
                Layer::ConnectionsPerIp,
                "refuse",
                mode == Mode::Enforce,
            );
            if mode == Mode::Enforce {
                metrics::counter!(m::THROTTLE_REFUSALS_TOTAL, "direction" => "connect", "layer" => Layer::ConnectionsPerIp.as_str(), "reason" => "cap").increment(1);
                return None;
            }
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
        self.tiers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .principal(ip, pubkeys)
    }

    fn tier_buckets(&self) -> Arc<Vec<PubkeyBuckets>> {
        self.pubkey_buckets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The per-client bucket checks of one operation (cost 1): the address's bucket
    /// (unless the tier is listed), then the pubkey's bucket of its tier
    /// (when authenticated).
    fn client_buckets(
        &self,
        who: &Principal,
        mode: Mode,
        dir: Direction,
        ip_map: &Mutex<KeyedBuckets<IpAddr>>,
        pick: fn(&PubkeyBuckets) -> &Mutex<KeyedBuckets<[u8; 32]>>,
        messages: [&'static str; 2],
    ) -> Result<(), Refusal> {
        let now = self.now_ns();
        if who.tier.charges_address {
            let r = lock(ip_map).check(&who.ip, now, 1);
            self.bucket_result(r, mode, dir, Layer::IpBucket, messages[0])?;
        }
        if let ClientKey::Pubkey(p) = who.key {
            let buckets = self.tier_buckets();
            if let Some(b) = buckets.get(usize::from(who.tier.index).wrapping_sub(1)) {
                let r = lock(pick(b)).check(&p, now, 1);
                self.bucket_result(r, mode, dir, Layer::PubkeyBucket, messages[1])?;
            }
        }
        Ok(())
    }

    /// Admission of one EVENT before its signature is checked: the
    /// client's buckets and the write controller.
    pub fn admit_event(&self, who: &Principal, adm: &mut ConnAdmission) -> Admit {
        let mode = self.mode();
        if mode == Mode::Off {
            return Admit::Go;
        }
        let messages = [
            "too many events from your address",
            "too many events from your pubkey",
        ];
        match self.client_buckets(
            who,
            mode,
            Direction::Write,
            &self.events_ip,
            |b| &b.events,
            messages,
        ) {
            Ok(()) => self.controller(Direction::Write, mode, adm, who.tier.weight),
            Err(r) => Admit::Refuse(r),
        }
    }

    /// Admission of one EVENT after its signature: the author's bucket.
    pub fn admit_author(&self, pubkey: &[u8; 32]) -> Admit {
        let mode = self.mode();
        if mode == Mode::Off {
            return Admit::Go;
        }
        let bucket = lock(&self.events_pubkey).check(pubkey, self.now_ns(), 1);
        let message = "too many events from this author";
        match self.bucket_result(bucket, mode, Direction::Write, Layer::PubkeyBucket, message) {
            Ok(()) => Admit::Go,
            Err(r) => Admit::Refuse(r),
        }
    }

    /// Admission of one REQ or COUNT: the client's buckets and the read
    /// controller.
    pub fn admit_req(&self, who: &Principal, adm: &mut ConnAdmission) -> Admit {
        let mode = self.mode();
        if mode == Mode::Off {
            return Admit::Go;
        }
        let messages = [
            "too many requests from your address",
            "too many requests from your pubkey",
        ];
        match self.client_buckets(
            who,
            mode,
            Direction::Read,
            &self.reqs_ip,
            |b| &b.reqs,
            messages,
        ) {
            Ok(()) => self.controller(Direction::Read, mode, adm, who.tier.weight),
            Err(r) => Admit::Refuse(r),
        }
    }

    /// A bucket's answer, counted: a refusal when the bucket is empty and
    /// the mode enforces, else go on with the next check.
    fn bucket_result(
        &self,
        r: Result<(), Duration>,
        mode: Mode,
        dir: Direction,
        layer: Layer,
        message: &'static str,
    ) -> Result<(), Refusal> {
        let Err(retry_after) = r else {
            return Ok(());
        };
        let enforced = mode == Mode::Enforce;
        self.count_decision(dir, layer, "refuse", enforced);
        if !enforced {
            return Ok(());
        }
        Err(self.refuse(dir, layer, "rate", retry_after, message))
    }

    /// A refusal, counted on `sluice_throttle_refusals_total`.
    fn refuse(
        &self,
        dir: Direction,
        layer: Layer,
        reason: &'static str,
        retry_after: Duration,
        message: &'static str,
    ) -> Refusal {
        metrics::counter!(m::THROTTLE_REFUSALS_TOTAL, "direction" => dir.as_str(), "layer" => layer.as_str(), "reason" => reason)
            .increment(1);
        Refusal {
            layer,
            retry_after,
            message,
        }
    }

    /// The global controller's say on one operation of a connection (see
    /// [`ConnAdmission::check`]), counted and, when enforced, applied.
    /// A tier of weight `w` counts as polite up to `w` times the polite rate
    /// and waits `1/w` of the delay.
    fn controller(
        &self,
        dir: Direction,
        mode: Mode,
        adm: &mut ConnAdmission,
        weight: u32,
    ) -> Admit {
        let published = Verdict::from_bits(self.verdicts[dir_index(dir)].load(Ordering::Relaxed));
        let w = weight.max(1);
        let polite = self.with_config(|c| c.clients.polite_ops_per_s) * f64::from(w);
        let d = adm.check(dir, mode, published, polite, self.now_ns());
        match d.verdict {
            Verdict::Allow => Admit::Go,
            Verdict::Delay(delay) => {
                let delay = delay / w;
                self.count_decision(dir, Layer::Controller, "delay", d.enforced);
                if d.enforced {
                    metrics::histogram!(m::THROTTLE_DELAY_APPLIED_SECONDS, "direction" => dir.as_str())
                        .record(delay.as_secs_f64());
                    Admit::Delay(delay)
                } else {
                    Admit::Go
                }
            }
            Verdict::Refuse {
                retry_after,
                reason,
            } => {
                self.count_decision(dir, Layer::Controller, "refuse", d.enforced);
                if d.enforced {
                    Admit::Refuse(self.refuse(
                        dir,
                        Layer::Controller,
                        reason.as_str(),
                        retry_after,
                        reason.message(),
                    ))
                } else {
                    Admit::Go
                }
            }
        }
    }

    fn count_decision(&self, dir: Direction, layer: Layer, action: &'static str, enforced: bool) {
        metrics::counter!(
            m::THROTTLE_DECISIONS_TOTAL,
            "direction" => dir.as_str(),
            "layer" => layer.as_str(),
            "action" => action,
            "enforced" => if enforced { "true" } else { "false" }
        )
        .increment(1);
    }

    /// Publishes a governor tick: verdicts for the hot path, bucket rates
    /// scaled down by the controllers' output (`rate = base × (1 − output)`,
    /// docs/design.md#backpressure), and the state for /metrics and /api/throttle.
    pub(crate) fn publish(&self, state: &GovernorState) {
        self.verdicts[0].store(state.write.verdict.to_bits(), Ordering::Relaxed);
        self.verdicts[1].store(state.read.verdict.to_bits(), Ordering::Relaxed);
        let write_p = state.write.pid.output;
        let read_p = state.read.pid.output;
        self.with_config(|cfg| {
            let c = &cfg.clients;
            let scaled = |b: &BucketConfig, output: f64| {
                sluice_throttle::scaled_rate(b.rate_per_s, output, c.min_rate_fraction)
            };
            lock(&self.events_ip).set_rate(scaled(&c.events_per_ip, write_p));
            lock(&self.events_pubkey).set_rate(scaled(&c.events_per_pubkey, write_p));
            lock(&self.reqs_ip).set_rate(scaled(&c.reqs_per_ip, read_p));
            lock(&self.read_cost_ip).set_rate(scaled(&c.read_cost_per_ip, read_p));
            for b in self.tier_buckets().iter() {
                let m = b.multiplier;
                lock(&b.events).set_rate(scaled(&c.events_per_ip, write_p) * m);
                lock(&b.reqs).set_rate(scaled(&c.reqs_per_ip, read_p) * m);
                lock(&b.read_cost).set_rate(scaled(&c.read_cost_per_ip, read_p) * m);
            }
            self.read_cost_conn_rate.store(
                scaled(&c.read_cost_per_connection, read_p).to_bits(),
                Ordering::Relaxed,
            );
        });
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

    /// Charges a query's estimated cost to its IP's read budget, or
    /// refuses it (`rate-limited:`). A full budget pays any estimate (the
    /// rest becomes debt when the query settles), so a large query is
    /// slowed, never refused forever.
    pub fn admit_read_cost(&self, who: &Principal, estimate_units: u64) -> Result<(), Refusal> {
        let mode = self.mode();
        if mode == Mode::Off {
            return Ok(());
        }
        let cost = u32::try_from(estimate_units).unwrap_or(u32::MAX);
        let now = self.now_ns();
        if who.tier.charges_address {
            let r = lock(&self.read_cost_ip).check(&who.ip, now, cost);
            let message = "your address has read too much; slow down";
            self.bucket_result(r, mode, Direction::Read, Layer::ReadBudgetIp, message)?;
        }
        if let ClientKey::Pubkey(p) = who.key
            && let Some(b) = self
                .tier_buckets()
                .get(usize::from(who.tier.index).wrapping_sub(1))
        {
            let r = lock(&b.read_cost).check(&p, now, cost);
            if let Err(e) = self.bucket_result(
                r,
                mode,
                Direction::Read,
                Layer::ReadBudgetIp,
                "your pubkey has read too much; slow down",
            ) {
                if who.tier.charges_address {
                    self.settle_ip_read_cost(&who.ip, now, -(estimate_units as i64));
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Settles a query's cost with its IP's budget: a positive `delta` is
    /// charged (debt beyond what the budget holds), a negative one refunded.
    pub fn settle_read_cost(&self, who: &Principal, delta_units: i64) {
        if self.mode() == Mode::Off || delta_units == 0 {
            return;
        }
        let now = self.now_ns();
        if who.tier.charges_address {
            self.settle_ip_read_cost(&who.ip, now, delta_units);
        }
        if let ClientKey::Pubkey(p) = who.key
            && let Some(b) = self
                .tier_buckets()
                .get(usize::from(who.tier.index).wrapping_sub(1))
        {
            settle(&mut lock(&b.read_cost), &p, now, delta_units);
        }
    }

    fn settle_ip_read_cost(&self, ip: &IpAddr, now: u64, delta_units: i64) {
        settle(&mut lock(&self.read_cost_ip), ip, now, delta_units);
    }

    /// A new connection's own read budget (owned by its session).
    pub fn connection_read_budget(&self) -> ConnReadBudget {
        let cfg = self.with_config(|c| c.clients.read_cost_per_connection);
        ConnReadBudget {
            bucket: TokenBucket::new(cfg, self.now_ns()).expect("validated bucket config"),
        }
    }

    /// Checks and charges a connection's read budget (see
    /// [`Throttle::admit_read_cost`]).
    pub fn admit_connection_read_cost(
        &self,
        budget: &mut ConnReadBudget,
        estimate_units: u64,
    ) -> Result<(), Refusal> {
        let mode = self.mode();
        if mode == Mode::Off {
            return Ok(());
        }
        budget.bucket.set_rate(f64::from_bits(
            self.read_cost_conn_rate.load(Ordering::Relaxed),
        ));
        let cost = u32::try_from(estimate_units).unwrap_or(u32::MAX);
        let r = budget.bucket.try_take(self.now_ns(), cost);
        let message = "this connection has read too much; slow down";
        self.bucket_result(
            r,
            mode,
            Direction::Read,
            Layer::ReadBudgetConnection,
            message,
        )
    }

    /// Settles a connection's budget like [`Throttle::settle_read_cost`].
    pub fn settle_connection_read_cost(&self, budget: &mut ConnReadBudget, delta_units: i64) {
        if self.mode() == Mode::Off || delta_units == 0 {
            return;
        }
        let now = self.now_ns();
        if delta_units > 0 {
            budget.bucket.charge(now, delta_units as u64);
        } else {
            budget.bucket.refund(now, delta_units.unsigned_abs());
        }
    }

    /// Counts a refusal that shadow mode computed and did not apply.
    pub(crate) fn count_shadow_refusal(&self, layer: Layer) {
        self.count_decision(Direction::Read, layer, "refuse", false);
    }

    /// A refusal of the query scheduler, counted.
    pub(crate) fn scheduler_refusal(
        &self,
        reason: sluice_throttle::FairRefusal,
        retry_after: Duration,
    ) -> Refusal {
        self.refuse(
            Direction::Read,
            Layer::QueryScheduler,
            reason.as_str(),
            retry_after,
            reason.message(),
        )
    }
}

/// Charges a positive `delta`, refunds a negative one.
fn settle<K: std::hash::Hash + Eq + Clone>(
    b: &mut KeyedBuckets<K>,
    key: &K,
    now: u64,
    delta_units: i64,
) {
    if delta_units > 0 {
        b.charge(key, now, delta_units as u64);
    } else {
        b.refund(key, now, delta_units.unsigned_abs());
    }
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Write => 0,
        Direction::Read => 1,
    }
}

/// A connection's read budget, in cost units; owned by its session.
#[derive(Debug, Clone)]
pub struct ConnReadBudget {
    bucket: TokenBucket,
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
}
