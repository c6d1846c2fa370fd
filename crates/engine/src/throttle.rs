//! Admission policy: the engine's side of throttling. It owns the clock,
//! the atomics the controller's verdicts are published through, the
//! per-client token buckets (requests and read cost) and the per-IP
//! connection counts. The decisions themselves come from `sluice-throttle`;
//! the query scheduler lives in `reads.rs`.
//!
//! Hot path (per EVENT/REQ): one atomic load for the mode, one for the
//! direction's verdict, and one short mutex hold per token bucket checked.
//! The monitor task (see `monitor.rs`) ticks the governor every `tick_ms`
//! and publishes new verdicts and bucket rates.
//!
//! Invariants: every map here is bounded (`clients.max_tracked_keys`);
//! in `shadow` mode every decision is computed and counted but none is
//! applied; in `off` mode only the query pool's concurrency bound applies.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_throttle::{
    BucketConfig, CostConfig, Direction, EmergencyConfig, FairConfig, GovernorConfig,
    GovernorState, KeyedBuckets, KeyedStats, Mode, PidConfig, RateMeter, SignalTargets,
    TokenBucket, Verdict,
};

use crate::metrics_names as m;

/// `throttle.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeConfig {
    Enforce,
    Shadow,
    Off,
}

impl ModeConfig {
    pub fn mode(self) -> Mode {
        match self {
            ModeConfig::Enforce => Mode::Enforce,
            ModeConfig::Shadow => Mode::Shadow,
            ModeConfig::Off => Mode::Off,
        }
    }
}

/// Per-client limits (seeds 001, 003, 004).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientsConfig {
    /// EVENTs per source IP (IPv6: per /64).
    pub events_per_ip: BucketConfig,
    /// EVENTs per author pubkey (checked after the signature).
    pub events_per_pubkey: BucketConfig,
    /// REQs and COUNTs per source IP.
    pub reqs_per_ip: BucketConfig,
    /// Read budget per source IP, in cost units per second (see
    /// `throttle.queries.cost`): what the IP's queries may read and send.
    pub read_cost_per_ip: BucketConfig,
    /// Read budget per connection, in cost units per second.
    pub read_cost_per_connection: BucketConfig,
    /// Open WebSocket connections per source IP.
    pub max_connections_per_ip: u32,
    /// Clients tracked per bucket map; the least recently seen is evicted.
    pub max_tracked_keys: usize,
    /// Bucket rates never fall below this fraction of their base rate.
    pub min_rate_fraction: f64,
    /// A connection sending fewer operations per second than this (per
    /// direction, a moving average) is never delayed or refused by the
    /// global controller; only emergency mode refuses it.
    pub polite_ops_per_s: f64,
    /// Peers whose X-Forwarded-For / X-Real-IP headers are believed
    /// (addresses or CIDR blocks, e.g. "127.0.0.1/32", "10.0.0.0/8").
    pub trusted_proxies: Vec<String>,
}

impl Default for ClientsConfig {
    fn default() -> Self {
        ClientsConfig {
            events_per_ip: BucketConfig {
                rate_per_s: 20.0,
                burst_ratio: 2.0,
                window_ms: 2000,
                catch_up_ms: 5000,
            },
            events_per_pubkey: BucketConfig {
                rate_per_s: 10.0,
                burst_ratio: 2.0,
                window_ms: 2000,
                catch_up_ms: 5000,
            },
            reqs_per_ip: BucketConfig {
                rate_per_s: 20.0,
                burst_ratio: 2.0,
                window_ms: 2000,
                catch_up_ms: 5000,
            },
            read_cost_per_ip: BucketConfig {
                rate_per_s: 20_000.0,
                burst_ratio: 2.0,
                window_ms: 5000,
                catch_up_ms: 10_000,
            },
            read_cost_per_connection: BucketConfig {
                rate_per_s: 10_000.0,
                burst_ratio: 2.0,
                window_ms: 5000,
                catch_up_ms: 10_000,
            },
            max_connections_per_ip: 64,
            max_tracked_keys: 100_000,
            min_rate_fraction: 0.1,
            polite_ops_per_s: 5.0,
            trusted_proxies: Vec::new(),
        }
    }
}

/// The query scheduler and workers (seeds 002, 003, 004; see
/// `sluice_throttle::fair` and `cost`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueriesConfig {
    /// Query worker threads: steps that run at once.
    pub slots: u32,
    /// Queries that may wait for a step, all clients together (new
    /// clients have as many again in reserve).
    pub max_queued: u32,
    /// Queries one client (IP, IPv6 /64) may have waiting.
    pub max_queued_per_client: u32,
    /// Steps one client may run at once while others wait.
    pub max_running_per_client: u32,
    /// Cost units a client may spend per turn of the rotation.
    pub quantum_units: u64,
    /// A query that would wait longer than this for its first step is
    /// refused at once (`rate-limited:`); one that waited this long is
    /// dropped with the same answer.
    pub deadline_ms: u64,
    /// Index rows one step reads at most.
    pub step_rows: u64,
    /// Bytes of events one step returns at most (one chunk to the client).
    pub step_bytes: u64,
    /// Answer chunks a connection may have unsent; a query whose client
    /// has not read them waits (parked) without a worker.
    pub chunks_per_connection: u32,
    /// The cost model.
    pub cost: CostConfig,
}

impl Default for QueriesConfig {
    fn default() -> Self {
        let f = FairConfig::default();
        QueriesConfig {
            slots: f.slots,
            max_queued: f.max_queued,
            max_queued_per_client: f.max_queued_per_client,
            max_running_per_client: f.max_running_per_client,
            quantum_units: f.quantum_units,
            deadline_ms: f.deadline_ms,
            step_rows: 500,
            step_bytes: 256 * 1024,
            chunks_per_connection: 2,
            cost: CostConfig::default(),
        }
    }
}

impl QueriesConfig {
    pub fn fair(&self) -> FairConfig {
        FairConfig {
            slots: self.slots,
            max_queued: self.max_queued,
            max_queued_per_client: self.max_queued_per_client,
            max_running_per_client: self.max_running_per_client,
            quantum_units: self.quantum_units,
            deadline_ms: self.deadline_ms,
        }
    }
}

/// Relief actions taken when the write delay is large (seed 000).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReliefConfig {
    /// Act when the write delay reaches this fraction of its maximum, or
    /// in emergency mode.
    pub at_delay_fraction: f64,
    /// At most one relief round per this interval.
    pub min_interval_ms: u64,
}

impl Default for ReliefConfig {
    fn default() -> Self {
        ReliefConfig {
            at_delay_fraction: 0.5,
            min_interval_ms: 1000,
        }
    }
}

/// The `[throttle]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottleConfig {
    pub mode: ModeConfig,
    /// How often the monitor samples and the controllers update.
    pub tick_ms: u64,
    /// A controller delay is applied once every this many operations of a
    /// connection (seed 000 batching); refusals apply to every operation.
    pub check_every_ops: u32,
    /// Anonymous memory the relay aims to stay under.
    pub target_memory_mb: u64,
    /// Process variable = memory_weight × memory pressure + load_weight × load level.
    pub memory_weight: f64,
    pub load_weight: f64,
    pub signals: SignalTargets,
    pub emergency: EmergencyConfig,
    pub write: PidConfig,
    pub read: PidConfig,
    pub clients: ClientsConfig,
    pub queries: QueriesConfig,
    pub relief: ReliefConfig,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        let g = GovernorConfig::default();
        ThrottleConfig {
            mode: ModeConfig::Enforce,
            tick_ms: 100,
            check_every_ops: 4,
            target_memory_mb: g.target_memory_mb,
            memory_weight: g.memory_weight,
            load_weight: g.load_weight,
            signals: g.signals,
            emergency: g.emergency,
            write: g.write,
            read: g.read,
            clients: ClientsConfig::default(),
            queries: QueriesConfig::default(),
            relief: ReliefConfig::default(),
        }
    }
}

impl ThrottleConfig {
    pub fn governor(&self) -> GovernorConfig {
        GovernorConfig {
            target_memory_mb: self.target_memory_mb,
            memory_weight: self.memory_weight,
            load_weight: self.load_weight,
            signals: self.signals,
            emergency: self.emergency,
            write: self.write,
            read: self.read,
        }
    }

    /// Checks every value, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let named = |section: &str, r: Result<(), sluice_throttle::ConfigError>| {
            r.map_err(|e| format!("throttle.{section}: {e}"))
        };
        named("governor", self.governor().validate())?;
        named(
            "clients.events_per_ip",
            self.clients.events_per_ip.validate(),
        )?;
        named(
            "clients.events_per_pubkey",
            self.clients.events_per_pubkey.validate(),
        )?;
        named("clients.reqs_per_ip", self.clients.reqs_per_ip.validate())?;
        named(
            "clients.read_cost_per_ip",
            self.clients.read_cost_per_ip.validate(),
        )?;
        named(
            "clients.read_cost_per_connection",
            self.clients.read_cost_per_connection.validate(),
        )?;
        named("queries", self.queries.fair().validate())?;
        named("queries.cost", self.queries.cost.validate())?;
        if self.queries.step_rows == 0 || self.queries.step_bytes == 0 {
            return Err("throttle.queries.step_rows and step_bytes must be at least 1".into());
        }
        if !(1..=64).contains(&self.queries.chunks_per_connection) {
            return Err("throttle.queries.chunks_per_connection must be 1-64".into());
        }
        if !(10..=10_000).contains(&self.tick_ms) {
            return Err("throttle.tick_ms must be 10-10000".into());
        }
        if self.check_every_ops == 0 {
            return Err("throttle.check_every_ops must be at least 1".into());
        }
        if self.clients.max_connections_per_ip == 0 || self.clients.max_tracked_keys == 0 {
            return Err(
                "throttle.clients.max_connections_per_ip and max_tracked_keys must be at least 1"
                    .into(),
            );
        }
        if !(self.clients.polite_ops_per_s >= 0.0 && self.clients.polite_ops_per_s.is_finite()) {
            return Err("throttle.clients.polite_ops_per_s must be a non-negative number".into());
        }
        if !(0.0..=1.0).contains(&self.clients.min_rate_fraction) {
            return Err("throttle.clients.min_rate_fraction must be in 0..=1".into());
        }
        for p in &self.clients.trusted_proxies {
            Cidr::parse(p).ok_or_else(|| {
                format!("throttle.clients.trusted_proxies: {p:?} is not an address or CIDR block")
            })?;
        }
        Ok(())
    }
}

/// An address block for `trusted_proxies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a.parse::<IpAddr>().ok()?, Some(b.parse::<u8>().ok()?)),
            None => (s.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        (bits <= max).then_some(Cidr { net: addr, bits })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.bits as u32).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.bits as u32).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The key a client is limited under: its IPv4 address, or its IPv6 /64
/// (one host can rotate through the addresses of its /64 at will).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & (u128::MAX << 64)).into()),
        },
    }
}

/// Which limit refused an operation (a closed set: metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    ConnectionsPerIp,
    IpBucket,
    PubkeyBucket,
    Controller,
    /// The query scheduler: queue bounds and deadlines.
    QueryScheduler,
    /// The IP's read budget (cost units).
    ReadBudgetIp,
    /// The connection's read budget (cost units).
    ReadBudgetConnection,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::ConnectionsPerIp => "connections_per_ip",
            Layer::IpBucket => "ip_bucket",
            Layer::PubkeyBucket => "pubkey_bucket",
            Layer::Controller => "controller",
            Layer::QueryScheduler => "query_scheduler",
            Layer::ReadBudgetIp => "read_budget_ip",
            Layer::ReadBudgetConnection => "read_budget_connection",
        }
    }
}

/// A refusal to send as `rate-limited:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub layer: Layer,
    pub retry_after: Duration,
    /// Human text, without the prefix.
    pub message: &'static str,
}

impl Refusal {
    /// `"<message>; retry in N s"`.
    pub fn detail(&self) -> String {
        let secs = self.retry_after.as_secs_f64().max(0.1);
        format!("{}; retry in {:.1} s", self.message, secs)
    }
}

/// What a connection should do with one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Go,
    /// Wait this long on this connection, then go.
    Delay(Duration),
    Refuse(Refusal),
}

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
    trusted: RwLock<Vec<Cidr>>,
}

fn mode_to_u8(m: Mode) -> u8 {
    match m {
        Mode::Enforce => 0,
        Mode::Shadow => 1,
        Mode::Off => 2,
    }
}

impl Throttle {
    /// Builds from a validated config.
    pub fn new(cfg: ThrottleConfig) -> Arc<Throttle> {
        let c = &cfg.clients;
        let keyed = |b: BucketConfig| {
            KeyedBuckets::new(b, c.max_tracked_keys).expect("validated bucket config")
        };
        let t = Throttle {
            epoch: Instant::now(),
            mode: AtomicU8::new(mode_to_u8(cfg.mode.mode())),
            check_every_ops: AtomicU64::new(cfg.check_every_ops as u64),
            verdicts: [AtomicU64::new(0), AtomicU64::new(0)],
            state: Mutex::new(None),
            events_ip: Mutex::new(keyed(c.events_per_ip)),
            events_pubkey: Mutex::new(
                KeyedBuckets::new(c.events_per_pubkey, c.max_tracked_keys).expect("validated"),
            ),
            reqs_ip: Mutex::new(keyed(c.reqs_per_ip)),
            read_cost_ip: Mutex::new(keyed(c.read_cost_per_ip)),
            read_cost_conn_rate: AtomicU64::new(c.read_cost_per_connection.rate_per_s.to_bits()),
            connections: Mutex::new(HashMap::new()),
            trusted: RwLock::new(
                c.trusted_proxies
                    .iter()
                    .filter_map(|p| Cidr::parse(p))
                    .collect(),
            ),
            config: RwLock::new(cfg),
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

    pub fn config(&self) -> ThrottleConfig {
        self.config.read().expect("throttle config lock").clone()
    }

    /// A new per-connection, per-direction admission state.
    pub fn admission(&self) -> ConnAdmission {
        ConnAdmission {
            batching: sluice_throttle::Admission::new(
                self.check_every_ops.load(Ordering::Relaxed) as u32
            ),
            meter: RateMeter::default(),
        }
    }

    /// Applies a reloaded config (SIGHUP). Buckets keep their clients;
    /// controllers keep their state.
    pub fn reload(&self, cfg: ThrottleConfig) -> Result<(), String> {
        cfg.validate()?;
        let c = &cfg.clients;
        let fail = |e: sluice_throttle::ConfigError| e.to_string();
        self.events_ip
            .lock()
            .expect("lock")
            .set_config(c.events_per_ip, c.max_tracked_keys)
            .map_err(fail)?;
        self.events_pubkey
            .lock()
            .expect("lock")
            .set_config(c.events_per_pubkey, c.max_tracked_keys)
            .map_err(fail)?;
        self.reqs_ip
            .lock()
            .expect("lock")
            .set_config(c.reqs_per_ip, c.max_tracked_keys)
            .map_err(fail)?;
        self.read_cost_ip
            .lock()
            .expect("lock")
            .set_config(c.read_cost_per_ip, c.max_tracked_keys)
            .map_err(fail)?;
        self.read_cost_conn_rate.store(
            c.read_cost_per_connection.rate_per_s.to_bits(),
            Ordering::Relaxed,
        );
        *self.trusted.write().expect("lock") = c
            .trusted_proxies
            .iter()
            .filter_map(|p| Cidr::parse(p))
            .collect();
        self.mode
            .store(mode_to_u8(cfg.mode.mode()), Ordering::Relaxed);
        self.check_every_ops
            .store(cfg.check_every_ops as u64, Ordering::Relaxed);
        *self.config.write().expect("lock") = cfg;
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

    /// The client's address: the peer's, or when the peer is a trusted
    /// proxy, the last untrusted hop of X-Forwarded-For, else X-Real-IP.
    pub fn client_ip(
        &self,
        peer: IpAddr,
        forwarded_for: Option<&str>,
        real_ip: Option<&str>,
    ) -> IpAddr {
        let trusted = self.trusted.read().expect("lock");
        let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
        if !is_trusted(peer) {
            return peer;
        }
        if let Some(xff) = forwarded_for {
            let hops: Vec<IpAddr> = xff
                .split(',')
                .filter_map(|h| h.trim().parse().ok())
                .collect();
            if let Some(ip) = hops.iter().rev().find(|ip| !is_trusted(**ip)) {
                return *ip;
            }
        }
        real_ip.and_then(|r| r.trim().parse().ok()).unwrap_or(peer)
    }

    /// Counts a new connection from `ip`; `None` when the IP is at its cap
    /// (in enforce mode). The guard uncounts it when dropped.
    pub fn open_connection(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionGuard> {
        let key = client_key(ip);
        let max = self
            .config
            .read()
            .expect("lock")
            .clients
            .max_connections_per_ip;
        let mode = self.mode();
        let mut conns = self.connections.lock().expect("lock");
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

    /// Admission of one EVENT before its signature is checked: the IP's
    /// bucket and the write controller.
    pub fn admit_event(&self, ip: IpAddr, adm: &mut ConnAdmission) -> Admit {
        let mode = self.mode();
        if mode == Mode::Off {
            return Admit::Go;
        }
        let now = self.now_ns();
        let bucket = self
            .events_ip
            .lock()
            .expect("lock")
            .check(&client_key(ip), now, 1);
        if let Some(a) = self.bucket_result(
            bucket,
            mode,
            Direction::Write,
            Layer::IpBucket,
            "too many events from your address",
        ) {
            return a;
        }
        self.controller(Direction::Write, mode, adm)
    }

    /// Admission of one EVENT after its signature: the author's bucket.
    pub fn admit_author(&self, pubkey: &[u8; 32]) -> Admit {
        let mode = self.mode();
        if mode == Mode::Off {
            return Admit::Go;
        }
        let bucket = self
            .events_pubkey
            .lock()
            .expect("lock")
            .check(pubkey, self.now_ns(), 1);
        self.bucket_result(
            bucket,
            mode,
            Direction::Write,
            Layer::PubkeyBucket,
            "too many events from this author",
        )
        .unwrap_or(Admit::Go)
    }

    /// Admission of one REQ or COUNT: the IP's bucket and the read controller.
    pub fn admit_req(&self, ip: IpAddr, adm: &mut ConnAdmission) -> Admit {
        let mode = self.mode();
        if mode == Mode::Off {
            return Admit::Go;
        }
        let bucket = self
            .reqs_ip
            .lock()
            .expect("lock")
            .check(&client_key(ip), self.now_ns(), 1);
        if let Some(a) = self.bucket_result(
            bucket,
            mode,
            Direction::Read,
            Layer::IpBucket,
            "too many requests from your address",
        ) {
            return a;
        }
        self.controller(Direction::Read, mode, adm)
    }

    fn bucket_result(
        &self,
        r: Result<(), Duration>,
        mode: Mode,
        dir: Direction,
        layer: Layer,
        message: &'static str,
    ) -> Option<Admit> {
        let retry_after = r.err()?;
        let enforced = mode == Mode::Enforce;
        self.count_decision(dir, layer, "refuse", enforced);
        if !enforced {
            return None;
        }
        Some(self.refuse(dir, layer, "rate", retry_after, message))
    }

    fn refuse(
        &self,
        dir: Direction,
        layer: Layer,
        reason: &'static str,
        retry_after: Duration,
        message: &'static str,
    ) -> Admit {
        metrics::counter!(m::THROTTLE_REFUSALS_TOTAL, "direction" => dir.as_str(), "layer" => layer.as_str(), "reason" => reason)
            .increment(1);
        Admit::Refuse(Refusal {
            layer,
            retry_after,
            message,
        })
    }

    fn controller(&self, dir: Direction, mode: Mode, adm: &mut ConnAdmission) -> Admit {
        let published = Verdict::from_bits(self.verdicts[dir_index(dir)].load(Ordering::Relaxed));
        let rate = adm.meter.record(self.now_ns());
        // Aim the controller at the connections causing the load: a polite
        // connection passes unless the relay is in emergency mode.
        let polite = rate < self.config.read().expect("lock").clients.polite_ops_per_s;
        let published = match published {
            Verdict::Refuse {
                reason: sluice_throttle::RefuseReason::Emergency,
                ..
            } => published,
            _ if polite => Verdict::Allow,
            other => other,
        };
        let d = adm.batching.check(mode, published);
        match d.verdict {
            Verdict::Allow => Admit::Go,
            // Reads are not delayed: the read controller acts through the
            // read budgets' rates (see `publish`) and its refusals, and the
            // query scheduler orders what runs.
            Verdict::Delay(_) if dir == Direction::Read => Admit::Go,
            Verdict::Delay(delay) => {
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
                    self.refuse(
                        dir,
                        Layer::Controller,
                        reason.as_str(),
                        retry_after,
                        reason.message(),
                    )
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
    /// seed 004), and the state for /metrics and /api/throttle.
    pub(crate) fn publish(&self, state: &GovernorState) {
        self.verdicts[0].store(state.write.verdict.to_bits(), Ordering::Relaxed);
        self.verdicts[1].store(state.read.verdict.to_bits(), Ordering::Relaxed);
        let cfg = self.config.read().expect("lock");
        let floor = cfg.clients.min_rate_fraction;
        let write_p = state.write.pid.output;
        let read_p = state.read.pid.output;
        let c = &cfg.clients;
        self.events_ip
            .lock()
            .expect("lock")
            .set_rate(sluice_throttle::scaled_rate(
                c.events_per_ip.rate_per_s,
                write_p,
                floor,
            ));
        self.events_pubkey
            .lock()
            .expect("lock")
            .set_rate(sluice_throttle::scaled_rate(
                c.events_per_pubkey.rate_per_s,
                write_p,
                floor,
            ));
        self.reqs_ip
            .lock()
            .expect("lock")
            .set_rate(sluice_throttle::scaled_rate(
                c.reqs_per_ip.rate_per_s,
                read_p,
                floor,
            ));
        self.read_cost_ip
            .lock()
            .expect("lock")
            .set_rate(sluice_throttle::scaled_rate(
                c.read_cost_per_ip.rate_per_s,
                read_p,
                floor,
            ));
        self.read_cost_conn_rate.store(
            sluice_throttle::scaled_rate(c.read_cost_per_connection.rate_per_s, read_p, floor)
                .to_bits(),
            Ordering::Relaxed,
        );
        drop(cfg);
        *self.state.lock().expect("lock") = Some(*state);
    }

    /// The last governor state, if a tick has run.
    pub fn state(&self) -> Option<GovernorState> {
        *self.state.lock().expect("lock")
    }

    pub fn bucket_stats(&self) -> [(&'static str, KeyedStats); 4] {
        [
            (
                "events_per_ip",
                self.events_ip.lock().expect("lock").stats(),
            ),
            (
                "events_per_pubkey",
                self.events_pubkey.lock().expect("lock").stats(),
            ),
            ("reqs_per_ip", self.reqs_ip.lock().expect("lock").stats()),
            (
                "read_cost_per_ip",
                self.read_cost_ip.lock().expect("lock").stats(),
            ),
        ]
    }

    /// Current rate of the per-IP read budget, cost units per second.
    pub fn read_cost_rate_per_ip(&self) -> f64 {
        self.read_cost_ip.lock().expect("lock").rate_per_s()
    }

    /// Charges a query's estimated cost to its IP's read budget, or
    /// refuses it (`rate-limited:`). A full budget pays any estimate (the
    /// rest becomes debt when the query settles), so a large query is
    /// slowed, never refused forever.
    pub fn admit_read_cost(&self, ip: IpAddr, estimate_units: u64) -> Result<(), Refusal> {
        let mode = self.mode();
        if mode == Mode::Off {
            return Ok(());
        }
        let cost = u32::try_from(estimate_units).unwrap_or(u32::MAX);
        let r = self
            .read_cost_ip
            .lock()
            .expect("lock")
            .check(&client_key(ip), self.now_ns(), cost);
        match self.bucket_result(
            r,
            mode,
            Direction::Read,
            Layer::ReadBudgetIp,
            "your address has read too much; slow down",
        ) {
            Some(Admit::Refuse(r)) => Err(r),
            _ => Ok(()),
        }
    }

    /// Settles a query's cost with its IP's budget: a positive `delta` is
    /// charged (debt beyond what the budget holds), a negative one refunded.
    pub fn settle_read_cost(&self, ip: IpAddr, delta_units: i64) {
        if self.mode() == Mode::Off || delta_units == 0 {
            return;
        }
        let now = self.now_ns();
        let key = client_key(ip);
        let mut b = self.read_cost_ip.lock().expect("lock");
        if delta_units > 0 {
            b.charge(&key, now, delta_units as u64);
        } else {
            b.refund(&key, now, delta_units.unsigned_abs());
        }
    }

    /// A new connection's own read budget (owned by its session).
    pub fn connection_read_budget(&self) -> ConnReadBudget {
        let cfg = self
            .config
            .read()
            .expect("lock")
            .clients
            .read_cost_per_connection;
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
        match self.bucket_result(
            r,
            mode,
            Direction::Read,
            Layer::ReadBudgetConnection,
            "this connection has read too much; slow down",
        ) {
            Some(Admit::Refuse(r)) => Err(r),
            _ => Ok(()),
        }
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
        match self.refuse(
            Direction::Read,
            Layer::QueryScheduler,
            reason.as_str(),
            retry_after,
            reason.message(),
        ) {
            Admit::Refuse(r) => r,
            _ => unreachable!("refuse always refuses"),
        }
    }
}

fn dir_index(d: Direction) -> usize {
    match d {
        Direction::Write => 0,
        Direction::Read => 1,
    }
}

/// One connection's admission state for one direction: seed 000 batching
/// of delays, and the connection's own rate.
#[derive(Debug, Clone, Copy)]
pub struct ConnAdmission {
    batching: sluice_throttle::Admission,
    meter: RateMeter,
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
        let mut conns = self.throttle.connections.lock().expect("lock");
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
    fn cidr_and_client_keys() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(
            Cidr::parse("127.0.0.1")
                .unwrap()
                .contains("127.0.0.1".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let mut cfg = ThrottleConfig::default();
        cfg.clients.trusted_proxies = vec!["127.0.0.1/32".into()];
        let t = Throttle::new(cfg);
        let proxy: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "192.0.2.9".parse().unwrap();
        assert_eq!(
            t.client_ip(proxy, Some("198.51.100.7, 127.0.0.1"), None),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            t.client_ip(proxy, None, Some("198.51.100.8")),
            "198.51.100.8".parse::<IpAddr>().unwrap()
        );
        assert_eq!(t.client_ip(other, Some("198.51.100.7"), None), other);
    }

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
}
