//! The one typed configuration tree: built-in defaults, then the TOML file
//! if given, then `SLUICE_<SECTION>__<KEY>` environment variables.
//! Unknown keys and invalid values stop start-up with the key's name, as
//! the operator writes it in TOML (`throttle.read.kp`).
//!
//! Each section is one type owned by one crate, composed here:
//! `[server]`, `[limits]`, `[relay]`, `[auth]` by `sluice-server`; `[engine]`, `[policy]` by
//! `sluice-engine`; `[retention]` by `sluice-engine`; `[throttle]` and its tables by `sluice-throttle`
//! (except that `throttle.clients.trusted_proxies` is parsed by the
//! server's `address` module); `[cluster]` by `sluice-cluster`; `[search]` by
//! `sluice-search`; `[store]`, `[metrics]`, `[log]` here,
//! `[[mirror]]` in `mirror.rs`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use sluice_cluster::ClusterConfig;
use sluice_engine::access::PolicyConfig;
use sluice_engine::config::EngineConfig;
use sluice_engine::retention::RetentionConfig;
use sluice_engine::retention::RetentionPlan;
use sluice_search::SearchConfig;
use sluice_server::address::TrustedProxies;
use sluice_server::{AuthConfig, LimitsConfig, RelayInfoConfig, ServerConfig};
use sluice_throttle::aimd::PaceConfig;
use sluice_throttle::{PowConfig, ThrottleConfig, TrustConfig};

use serde_json::{Map, Value};
use sluice_proto::Filter;

use crate::peer::{self, Direction, Tls};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub limits: LimitsConfig,
    pub engine: EngineConfig,
    pub throttle: ThrottleConfig,
    pub relay: RelayInfoConfig,
    pub auth: AuthConfig,
    pub policy: PolicyConfig,
    pub retention: RetentionConfig,
    pub trust: TrustConfig,
    pub pow: PowConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub cluster: ClusterConfig,
    pub search: SearchConfig,
    /// `[[mirror]]`: relays mirrored live (`mirror.rs`).
    pub mirror: Vec<MirrorConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Directory of the LMDB store; created if missing.
    pub path: PathBuf,
    /// LMDB map size: address space reserved for the store, not disk
    /// space (the file grows as data is written). The default, 8 TiB, is
    /// never the limit before the disk is.
    pub map_size_mb: u64,
    /// LMDB reader slots (concurrent read transactions across processes).
    pub max_readers: u32,
    /// LMDB's MDB_WRITEMAP (docs/configuration.md).
    pub write_map: bool,
    /// Writes are refused (`error:`) while the store's filesystem has less
    /// free space than this, and resume by themselves when it has more.
    pub min_free_disk_mb: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: PathBuf::from("./data"),
            map_size_mb: sluice_store::StoreOptions::default().map_size_bytes >> 20,
            max_readers: 126,
            write_map: false,
            min_free_disk_mb: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve /metrics on the relay's own port.
    pub on_relay_port: bool,
    /// On the relay's port, /metrics and /api/throttle answer only direct
    /// connections (no proxy headers) from these addresses or CIDRs.
    pub allow_from: Vec<String>,
    /// Also serve /metrics on this separate address (empty: no).
    pub listen: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            on_relay_port: true,
            allow_from: vec!["127.0.0.0/8".into(), "::1/128".into()],
            listen: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// tracing filter directive, e.g. "info" or "sluice_server=debug,info";
    /// the RUST_LOG environment variable overrides it.
    pub level: String,
    /// "text" or "json".
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

impl Config {
    /// Defaults, then `file`, then the environment; validated.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Config> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                bail!("config file {} does not exist", path.display());
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        fig = fig.merge(Env::prefixed("SLUICE_").split("__"));
        let cfg: Config = fig.extract().map_err(describe)?;
        cfg.validate().context("invalid configuration")?;
        Ok(cfg)
    }

    /// Checks every section; the error names the first bad key as the
    /// operator writes it (`throttle.read.kp`).
    pub fn validate(&self) -> anyhow::Result<()> {
        let checks = [
            self.server.validate(),
            self.limits.validate(),
            self.auth.validate(),
            self.policy.validate(),
            self.retention.validate(),
            self.engine.validate(),
            self.throttle.validate().map_err(|e| e.to_string()),
            self.trust
                .validate(&self.throttle.tiers)
                .map_err(|e| e.to_string()),
            // The outsiders' budget `[trust]` makes is a node of
            // `[[throttle.budgets]]`: under a `relay` budget it must fit.
            match self.trust.outsider_writes {
                sluice_throttle::trust::OutsiderWrites::Limited => {
                    sluice_throttle::budgets::check_outsiders(
                        &self.throttle.budgets,
                        self.trust.outsider_events_per_s,
                    )
                    .map_err(|e| e.within("trust").to_string())
                }
                _ => Ok(()),
            },
            self.pow.validate().map_err(|e| e.to_string()),
            // The one `[throttle]` key the server parses: addresses are its
            // concern.
            TrustedProxies::parse(&self.throttle.clients.trusted_proxies).map(drop),
            self.relay.validate(),
            self.store.validate(),
            self.metrics.validate(),
            self.log.validate(),
            self.cluster.validate(),
            self.search.validate(),
        ];
        for c in checks {
            if let Err(msg) = c {
                bail!(msg);
            }
        }
        for (i, m) in self.mirror.iter().enumerate() {
            m.validate(i).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }
}

impl Config {
    /// The retention plan: `[retention]`, whose exempt authors are also
    /// the admins (`policy.admin_pubkeys`) and every listed tier's pubkeys,
    /// and this relay's URLs (`auth.relay_urls`) for NIP-62.
    pub fn retention_plan(&self) -> RetentionPlan {
        let listed = self
            .throttle
            .tiers
            .listed
            .iter()
            .flat_map(|t| t.pubkeys.iter());
        let extra = self
            .policy
            .admin_pubkeys
            .iter()
            .chain(listed)
            .filter_map(|p| sluice_proto::hex32::decode::<32>(p));
        self.retention.plan(extra, self.auth.relay_urls.clone())
    }
}

impl StoreConfig {
    /// Opens (creating if missing) the LMDB store this section describes.
    pub fn open(&self) -> anyhow::Result<sluice_store::Store> {
        self.open_with(false)
    }

    /// Opens the store for a bulk import: written in the map when no other
    /// process has it open (the store crate's `alone.rs`), else as `open`.
    pub fn open_for_import(&self) -> anyhow::Result<sluice_store::Store> {
        self.open_with(true)
    }

    fn open_with(&self, write_map_when_alone: bool) -> anyhow::Result<sluice_store::Store> {
        let opts = sluice_store::StoreOptions {
            map_size_bytes: self.map_size_mb * 1024 * 1024,
            max_readers: self.max_readers,
            write_map: self.write_map,
            write_map_when_alone,
            min_free_disk_bytes: self.min_free_disk_mb.saturating_mul(1 << 20),
        };
        sluice_store::Store::open(&self.path, &opts)
            .with_context(|| format!("opening the store at {}", self.path.display()))
    }

    fn validate(&self) -> Result<(), String> {
        if self.path.as_os_str().is_empty() {
            return Err("store.path must not be empty".into());
        }
        if self.map_size_mb < 1 {
            return Err("store.map_size_mb must be at least 1".into());
        }
        // LMDB maps the whole size: it must fit in the address space.
        if self.map_size_mb > 64 << 20 {
            return Err("store.map_size_mb must be at most 67108864 (64 TiB)".into());
        }
        if !(1..=32_768).contains(&self.max_readers) {
            return Err("store.max_readers must be 1-32768".into());
        }
        Ok(())
    }
}

impl MetricsConfig {
    fn validate(&self) -> Result<(), String> {
        if !self.listen.is_empty() && self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "metrics.listen: {:?} is not an address like 127.0.0.1:9100",
                self.listen
            ));
        }
        sluice_server::address::TrustedProxies::parse(&self.allow_from)
            .map_err(|e| format!("metrics.allow_from: {e}"))?;
        Ok(())
    }
}

impl LogConfig {
    fn validate(&self) -> Result<(), String> {
        if self.format != "text" && self.format != "json" {
            return Err(format!(
                "log.format must be \"text\" or \"json\", not {:?}",
                self.format
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&self.level)
            .map(|_| ())
            .map_err(|e| format!("log.level {:?}: {e}", self.level))
    }
}

/// Figment's errors, one line each, naming the key.
fn describe(err: figment::Error) -> anyhow::Error {
    let lines: Vec<String> = err
        .into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let source = e
                .metadata
                .as_ref()
                .and_then(|m| m.source.as_ref())
                .map(|s| format!(" (from {s})"))
                .unwrap_or_default();
            if key.is_empty() {
                format!("{}{source}", e.kind)
            } else {
                format!("key {key}: {}{source}", e.kind)
            }
        })
        .collect();
    anyhow::anyhow!("invalid configuration: {}", lines.join("; "))
}

/// One `[[mirror]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MirrorConfig {
    /// The peer, ws:// or wss://.
    pub url: String,
    /// `down` (the peer's events here), `up` (this relay's to the peer) or
    /// `both`.
    pub direction: Direction,
    /// A NIP-01 filter object: only the events matching it move (`limit`
    /// ignored). Empty: every event.
    pub filter: Map<String, Value>,
    /// PEM file of CA certificates the peer's certificate may chain to,
    /// besides the public roots. Empty: the public roots only.
    pub ca_file: String,
    /// Events held per direction: down, in admission at once (reading
    /// pauses while full); up, waiting to be sent (beyond: dropped until
    /// the next catch-up).
    pub queue_events: usize,
    /// The live REQ asks for events this many seconds older than the
    /// connection's start (clock skew, events in flight).
    pub live_overlap_secs: u64,
    /// First wait before connecting again; doubles per failure.
    pub reconnect_min_ms: u64,
    /// Longest wait before connecting again.
    pub reconnect_max_ms: u64,
    /// Up: the first pace, EVENTs per second (the uploader's AIMD raises
    /// it from there, doubling per half second until the peer's first
    /// `rate-limited` answer).
    pub up_start_rate_per_s: f64,
    /// Up: the highest pace, EVENTs per second.
    pub up_max_rate_per_s: f64,
    /// Up: a `rate-limited` answer or a rate NOTICE cuts the pace to at
    /// least this fraction of it (to just under the rate the peer was
    /// admitting, when that is higher).
    pub up_decrease: f64,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            url: String::new(),
            direction: Direction::Down,
            filter: Map::new(),
            ca_file: String::new(),
            queue_events: 1_000,
            live_overlap_secs: 60,
            reconnect_min_ms: 1_000,
            reconnect_max_ms: 60_000,
            up_start_rate_per_s: PaceConfig::default().start_rate_per_s,
            up_max_rate_per_s: PaceConfig::default().max_rate_per_s,
            up_decrease: PaceConfig::default().decrease,
        }
    }
}

impl MirrorConfig {
    /// Checks the entry `mirror[i]`; the error names the key.
    pub fn validate(&self, i: usize) -> Result<(), String> {
        let at = format!("mirror[{i}]");
        if !(self.url.starts_with("ws://") || self.url.starts_with("wss://")) {
            return Err(format!(
                "{at}.url = {:?}: must be a ws:// or wss:// URL",
                peer::redact(&self.url)
            ));
        }
        self.parsed_filter()
            .map_err(|e| format!("{at}.filter: {e}"))?;
        if !(1..=1_000_000).contains(&self.queue_events) {
            return Err(format!("{at}.queue_events must be in 1..=1000000"));
        }
        if self.reconnect_min_ms == 0 {
            return Err(format!("{at}.reconnect_min_ms must be at least 1"));
        }
        if self.reconnect_max_ms < self.reconnect_min_ms {
            return Err(format!(
                "{at}.reconnect_max_ms must be at least reconnect_min_ms"
            ));
        }
        self.pace().validate().map_err(|e| format!("{at}.up_{e}"))?;
        self.tls().map_err(|e| format!("{at}.ca_file: {e:#}"))?;
        Ok(())
    }

    /// The uploader's pace settings (`up_*`).
    pub(crate) fn pace(&self) -> PaceConfig {
        PaceConfig {
            start_rate_per_s: self.up_start_rate_per_s,
            max_rate_per_s: self.up_max_rate_per_s,
            decrease: self.up_decrease,
        }
    }

    /// The filter without its `limit`.
    pub(crate) fn filter_value(&self) -> Value {
        let mut f = self.filter.clone();
        f.remove("limit");
        Value::Object(f)
    }

    pub(crate) fn parsed_filter(&self) -> Result<Filter, String> {
        Filter::from_value(&self.filter_value()).map_err(|e| e.to_string())
    }

    pub(crate) fn tls(&self) -> anyhow::Result<Tls> {
        Tls::new((!self.ca_file.is_empty()).then(|| Path::new(&self.ca_file)))
    }
}
