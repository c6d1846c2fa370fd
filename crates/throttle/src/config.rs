//! The `[throttle]` section of the configuration, owned here once: every
//! table under it is one type, and every consumer takes that type.
//!
//! | TOML table | type |
//! |---|---|
//! | `[throttle]` | [`ThrottleConfig`] (the global loop's keys: `mode`, `tick_ms`, `check_every_ops`, `target_memory_mb`, `memory_weight`, `load_weight`) |
//! | `[throttle.signals]` | [`SignalTargets`] |
//! | `[throttle.emergency]` | [`EmergencyConfig`] |
//! | `[throttle.write]`, `[throttle.read]` | [`PidConfig`] |
//! | `[throttle.clients]` | [`ClientsConfig`] |
//! | `[throttle.clients.<bucket>]` | [`BucketConfig`] |
//! | `[throttle.queries]` | [`QueriesConfig`] (also the [`crate::FairQueue`]'s config) |
//! | `[throttle.queries.cost]` | [`CostConfig`] |
//! | `[throttle.relief]` | [`ReliefConfig`] |
//! | `[[throttle.budgets]]` | [`BudgetConfig`] (the tree: [`crate::budgets`]) |
//!
//! The [`crate::Governor`] takes the whole section (it reads the global
//! loop's keys and the sub-tables above); the scheduler takes
//! [`QueriesConfig`].
//!
//! Invariant: [`ThrottleConfig::validate`] checks every key it owns and
//! names a bad one as the operator writes it (`throttle.read.kp`). The one
//! key it does not parse is `clients.trusted_proxies`: addresses are the
//! server's concern, and the server validates that list.

use serde::{Deserialize, Serialize};

use crate::bucket::BucketConfig;
use crate::budgets::BudgetConfig;
use crate::cost::CostConfig;
use crate::emergency::EmergencyConfig;
use crate::error::{ConfigError, check_range};
use crate::keyed::MAX_KEYS_LIMIT;
use crate::pid::PidConfig;
use crate::signals::SignalTargets;
use crate::tiers::TiersConfig;
use crate::verdict::Mode;

/// The `[throttle]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottleConfig {
    /// Whether decisions are applied (`enforce`), only counted (`shadow`)
    /// or not made (`off`).
    pub mode: Mode,
    /// How often the monitor samples and the controllers update, ms,
    /// `10..=10000`.
    pub tick_ms: u64,
    /// A controller delay is applied once every this many operations of a
    /// connection (batching, docs/design.md#pid-control); refusals apply to
    /// every operation.
    pub check_every_ops: u32,
    /// Anonymous memory the relay aims to stay under, MiB,
    /// `1..=16_777_216`.
    pub target_memory_mb: u64,
    /// Weight of memory pressure in the process variable, `0..=10`:
    /// process variable = memory_weight × memory pressure + load_weight ×
    /// load level.
    pub memory_weight: f64,
    /// Weight of the store load level in the process variable, `0..=10`;
    /// the two weights must not both be 0.
    pub load_weight: f64,
    /// Where each load signal reaches 1.0.
    pub signals: SignalTargets,
    /// Emergency mode thresholds.
    pub emergency: EmergencyConfig,
    /// Write controller (EVENT; [`PidConfig::import_default`] for import).
    pub write: PidConfig,
    /// Read controller (REQ, COUNT).
    pub read: PidConfig,
    pub clients: ClientsConfig,
    /// Identity tiers: weights and rate multipliers by who is asking.
    pub tiers: TiersConfig,
    pub queries: QueriesConfig,
    pub relief: ReliefConfig,
    /// Budgets in a hierarchy (docs/design.md#hierarchical-budgets); none
    /// by default.
    pub budgets: Vec<BudgetConfig>,
}

impl Default for ThrottleConfig {
    /// The relay defaults: 1024 MiB target, weights 0.7 / 0.3, default
    /// signal targets and emergency thresholds, the ORLY plan's write and
    /// read tunings (docs/design.md#pid-control).
    fn default() -> Self {
        ThrottleConfig {
            mode: Mode::Enforce,
            tick_ms: 100,
            check_every_ops: 4,
            target_memory_mb: 1024,
            memory_weight: 0.7,
            load_weight: 0.3,
            signals: SignalTargets::default(),
            emergency: EmergencyConfig::default(),
            write: PidConfig::write_default(),
            read: PidConfig::read_default(),
            clients: ClientsConfig::default(),
            tiers: TiersConfig::default(),
            queries: QueriesConfig::default(),
            relief: ReliefConfig::default(),
            budgets: Vec::new(),
        }
    }
}

impl ThrottleConfig {
    /// The defaults for `sluice import`: the write controller uses
    /// [`PidConfig::import_default`] (setpoint 0.70, Ki 0.15).
    pub fn import_default() -> Self {
        Self {
            write: PidConfig::import_default(),
            ..Self::default()
        }
    }

    /// [`ThrottleConfig::target_memory_mb`] in bytes.
    pub fn target_memory_bytes(&self) -> u64 {
        self.target_memory_mb.saturating_mul(1 << 20)
    }

    /// Checks every key of the section but `clients.trusted_proxies`
    /// (see the module docs), naming the first bad one in full:
    /// `throttle.read.kp`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_keys().map_err(|e| e.within("throttle"))
    }

    fn validate_keys(&self) -> Result<(), ConfigError> {
        check_range(
            "tick_ms",
            self.tick_ms as f64,
            10.0,
            10_000.0,
            "in 10..=10000",
        )?;
        check_range(
            "check_every_ops",
            f64::from(self.check_every_ops),
            1.0,
            f64::from(u32::MAX),
            "at least 1",
        )?;
        check_range(
            "target_memory_mb",
            self.target_memory_mb as f64,
            1.0,
            16_777_216.0,
            "in 1..=16777216",
        )?;
        check_range("memory_weight", self.memory_weight, 0.0, 10.0, "in 0..=10")?;
        check_range("load_weight", self.load_weight, 0.0, 10.0, "in 0..=10")?;
        if self.memory_weight + self.load_weight <= 0.0 {
            return Err(ConfigError::new(
                "load_weight",
                self.load_weight,
                "above 0 when memory_weight is 0",
            ));
        }
        self.signals.validate().map_err(|e| e.within("signals"))?;
        self.emergency
            .validate()
            .map_err(|e| e.within("emergency"))?;
        self.write.validate().map_err(|e| e.within("write"))?;
        self.read.validate().map_err(|e| e.within("read"))?;
        self.clients.validate().map_err(|e| e.within("clients"))?;
        self.tiers.validate().map_err(|e| e.within("tiers"))?;
        self.queries.validate().map_err(|e| e.within("queries"))?;
        crate::budgets::validate(&self.budgets, &self.tiers)
    }
}

/// Per-client limits (docs/design.md#token-buckets): `[throttle.clients]`.
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
    /// Open WebSocket connections per source IP, at least 1.
    pub max_connections_per_ip: u32,
    /// Clients tracked per bucket map, `1..=10_000_000`; the least
    /// recently seen is evicted.
    pub max_tracked_keys: usize,
    /// Bucket rates never fall below this fraction of their base rate,
    /// `0..=1`.
    pub min_rate_fraction: f64,
    /// A connection sending fewer operations per second than this (per
    /// direction, a moving average) is never delayed or refused by the
    /// global controller; only emergency mode refuses it.
    pub polite_ops_per_s: f64,
    /// Peers whose X-Forwarded-For / X-Real-IP headers are believed
    /// (addresses or CIDR blocks, e.g. "127.0.0.1/32", "10.0.0.0/8").
    /// Parsed and validated by the server, which resolves client addresses.
    pub trusted_proxies: Vec<String>,
    /// Per-author EVENT rates of kind classes (`[[throttle.clients.kinds]]`):
    /// an event of a listed kind is charged to its class's bucket of its
    /// author instead of the author's general one, so a flood of reactions
    /// does not spend the author's notes.
    pub kinds: Vec<KindLimit>,
}

/// One kind class's per-author EVENT bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindLimit {
    /// A name for metrics and logs (`[a-z0-9_]`, 1-32 characters).
    pub name: String,
    /// The kinds of the class; a kind in several classes counts in the
    /// first.
    pub kinds: Vec<u16>,
    /// EVENTs per second per author.
    pub rate_per_s: f64,
    #[serde(default = "two")]
    pub burst_ratio: f64,
    #[serde(default = "two_seconds")]
    pub window_ms: u64,
    #[serde(default = "five_seconds")]
    pub catch_up_ms: u64,
}

fn two() -> f64 {
    2.0
}

fn two_seconds() -> u64 {
    2000
}

fn five_seconds() -> u64 {
    5000
}

/// Most kind classes.
pub const MAX_KIND_CLASSES: usize = 16;

impl KindLimit {
    pub fn bucket(&self) -> BucketConfig {
        BucketConfig {
            rate_per_s: self.rate_per_s,
            burst_ratio: self.burst_ratio,
            window_ms: self.window_ms,
            catch_up_ms: self.catch_up_ms,
        }
    }
}

impl Default for ClientsConfig {
    fn default() -> Self {
        let bucket = |rate_per_s, window_ms, catch_up_ms| BucketConfig {
            rate_per_s,
            burst_ratio: 2.0,
            window_ms,
            catch_up_ms,
        };
        ClientsConfig {
            events_per_ip: bucket(20.0, 2000, 5000),
            events_per_pubkey: bucket(10.0, 2000, 5000),
            reqs_per_ip: bucket(20.0, 2000, 5000),
            read_cost_per_ip: bucket(20_000.0, 5000, 10_000),
            read_cost_per_connection: bucket(10_000.0, 5000, 10_000),
            max_connections_per_ip: 64,
            max_tracked_keys: 100_000,
            min_rate_fraction: 0.1,
            polite_ops_per_s: 5.0,
            trusted_proxies: Vec::new(),
            kinds: Vec::new(),
        }
    }
}

impl ClientsConfig {
    /// Checks every key but `trusted_proxies`, relative to the table.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, bucket) in [
            ("events_per_ip", &self.events_per_ip),
            ("events_per_pubkey", &self.events_per_pubkey),
            ("reqs_per_ip", &self.reqs_per_ip),
            ("read_cost_per_ip", &self.read_cost_per_ip),
            ("read_cost_per_connection", &self.read_cost_per_connection),
        ] {
            bucket.validate().map_err(|e| e.within(key))?;
        }
        check_range(
            "max_connections_per_ip",
            f64::from(self.max_connections_per_ip),
            1.0,
            f64::from(u32::MAX),
            "at least 1",
        )?;
        check_range(
            "max_tracked_keys",
            self.max_tracked_keys as f64,
            1.0,
            MAX_KEYS_LIMIT as f64,
            "in 1..=10000000",
        )?;
        check_range(
            "min_rate_fraction",
            self.min_rate_fraction,
            0.0,
            1.0,
            "in 0..=1",
        )?;
        check_range(
            "polite_ops_per_s",
            self.polite_ops_per_s,
            0.0,
            f64::MAX,
            "a finite number >= 0",
        )?;
        if self.kinds.len() > MAX_KIND_CLASSES {
            return Err(ConfigError::new(
                "kinds",
                self.kinds.len() as f64,
                "at most 16 classes",
            ));
        }
        for (i, k) in self.kinds.iter().enumerate() {
            let at = format!("kinds[{i}]");
            let name_ok = (1..=32).contains(&k.name.len())
                && k.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !name_ok {
                return Err(ConfigError::new(
                    "name",
                    k.name.len() as f64,
                    "1-32 characters of a-z, 0-9, _",
                )
                .within(&at));
            }
            if k.kinds.is_empty() {
                return Err(ConfigError::new("kinds", 0.0, "at least one kind").within(&at));
            }
            k.bucket().validate().map_err(|e| e.within(&at))?;
        }
        Ok(())
    }

    /// The index of the kind class `kind` is in, if any.
    pub fn kind_class(&self, kind: u16) -> Option<u8> {
        self.kinds
            .iter()
            .position(|k| k.kinds.contains(&kind))
            .map(|i| i as u8)
    }
}

/// `throttle.queries.slots`: how many query steps run at once, each on a
/// worker thread of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuerySlots {
    /// One per core the process may run on, at least 2 (`"auto"`). A step
    /// reads from memory, so more threads than cores only take turns on
    /// them: on 2 cores, 4 workers answered a query mix 10% slower than 2.
    #[default]
    Auto,
    /// This many, `1..=1024`: more than the cores where steps wait on the
    /// disk (a store much larger than memory).
    Count(u32),
}

impl QuerySlots {
    /// The number of slots on a process that may run on `cores` cores.
    pub fn count(self, cores: usize) -> u32 {
        match self {
            QuerySlots::Auto => u32::try_from(cores).unwrap_or(1024).clamp(2, 1024),
            QuerySlots::Count(n) => n,
        }
    }
}

impl Serialize for QuerySlots {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            QuerySlots::Auto => s.serialize_str("auto"),
            QuerySlots::Count(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for QuerySlots {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<QuerySlots, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = QuerySlots;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of slots or \"auto\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<QuerySlots, E> {
                match v {
                    "auto" => Ok(QuerySlots::Auto),
                    // An environment variable arrives as a string.
                    _ => v
                        .parse()
                        .map(QuerySlots::Count)
                        .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<QuerySlots, E> {
                Ok(QuerySlots::Count(u32::try_from(v).unwrap_or(u32::MAX)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<QuerySlots, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// The query scheduler and workers (docs/design.md#cost-based-fair-queuing):
/// `[throttle.queries]`. The [`crate::FairQueue`] reads its bounds from
/// here; the engine's read path reads the step and chunk sizes.
///
/// The window weighs queries by their estimated cost (see `cost`): what a
/// client may have open is bounded in cost units, so a burst of cheap
/// lookups fits where a pile of scans does not. The counts of queries
/// waiting are memory bounds only, generous since a waiting query is
/// small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueriesConfig {
    /// Query worker threads: steps that run at once.
    pub slots: QuerySlots,
    /// Estimated cost units of the queries open (queued, running or
    /// parked), all clients together, `1..=1e12`. Once it is reached a
    /// client that already has a query open is refused; new flows have as
    /// many again in reserve.
    pub max_open_units: u64,
    /// Estimated cost units of the queries one client (IP, IPv6 /64) may
    /// have open, `1..=1e12`; once reached, its next query is refused. A
    /// client with nothing open is never refused by it, whatever its
    /// query's estimate.
    pub max_open_units_per_client: u64,
    /// Queries that may wait for a step, all clients together,
    /// `1..=1_000_000`: a memory bound. Beyond it a client that already
    /// has work queued is refused; new flows have as many again in reserve.
    pub max_queued: u32,
    /// Queries one client may have waiting, `1..=100_000`: a memory bound.
    pub max_queued_per_client: u32,
    /// Steps one client may run at once while others wait, `1..=1024`.
    pub max_running_per_client: u32,
    /// Cost units a client may spend per turn of the rotation, `1..=1e9`.
    pub quantum_units: u64,
    /// A query that would wait longer than this for its first step is
    /// refused at once (`rate-limited:`); one that waited this long is
    /// dropped with the same answer. `1..=3_600_000` ms.
    pub deadline_ms: u64,
    /// Index rows one step reads at most, at least 1.
    pub step_rows: u64,
    /// Bytes of events one step returns at most (one chunk to the
    /// client), at least 1.
    pub step_bytes: u64,
    /// Answer chunks a connection may have unsent, `1..=64`; a query whose
    /// client has not read them waits (parked) without a worker.
    pub chunks_per_connection: u32,
    /// The cost model.
    pub cost: CostConfig,
}

impl Default for QueriesConfig {
    fn default() -> Self {
        QueriesConfig {
            slots: QuerySlots::Auto,
            max_open_units: 8_000_000,
            max_open_units_per_client: 500_000,
            max_queued: 16_384,
            max_queued_per_client: 8_192,
            max_running_per_client: 1,
            quantum_units: 1000,
            deadline_ms: 1000,
            step_rows: 500,
            step_bytes: 256 * 1024,
            chunks_per_connection: 2,
            cost: CostConfig::default(),
        }
    }
}

impl QueriesConfig {
    /// Checks every key against the range documented on it, relative to
    /// the table.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let QuerySlots::Count(n) = self.slots {
            check_range(
                "slots",
                f64::from(n),
                1.0,
                1024.0,
                "in 1..=1024 or \"auto\"",
            )?;
        }
        check_range(
            "max_open_units",
            self.max_open_units as f64,
            1.0,
            1e12,
            "in 1..=1000000000000",
        )?;
        check_range(
            "max_open_units_per_client",
            self.max_open_units_per_client as f64,
            1.0,
            1e12,
            "in 1..=1000000000000",
        )?;
        check_range(
            "max_queued",
            f64::from(self.max_queued),
            1.0,
            1e6,
            "in 1..=1000000",
        )?;
        check_range(
            "max_queued_per_client",
            f64::from(self.max_queued_per_client),
            1.0,
            1e5,
            "in 1..=100000",
        )?;
        check_range(
            "max_running_per_client",
            f64::from(self.max_running_per_client),
            1.0,
            1024.0,
            "in 1..=1024",
        )?;
        check_range(
            "quantum_units",
            self.quantum_units as f64,
            1.0,
            1e9,
            "in 1..=1000000000",
        )?;
        check_range(
            "deadline_ms",
            self.deadline_ms as f64,
            1.0,
            3_600_000.0,
            "in 1..=3600000",
        )?;
        check_range(
            "step_rows",
            self.step_rows as f64,
            1.0,
            u64::MAX as f64,
            "at least 1",
        )?;
        check_range(
            "step_bytes",
            self.step_bytes as f64,
            1.0,
            u64::MAX as f64,
            "at least 1",
        )?;
        check_range(
            "chunks_per_connection",
            f64::from(self.chunks_per_connection),
            1.0,
            64.0,
            "in 1..=64",
        )?;
        self.cost.validate().map_err(|e| e.within("cost"))
    }
}

/// Relief actions taken when the write delay is large
/// (docs/design.md#pid-control):
/// `[throttle.relief]`.
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

#[cfg(test)]
mod tests;
