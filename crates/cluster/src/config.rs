//! `[cluster]`: off by default; a single node needs nothing from here.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Join a cluster of Sluice nodes through `redis_url`.
    pub enabled: bool,
    /// The Redis server the nodes share (`redis://host:port[/db]`).
    pub redis_url: String,
    /// This node's name, unique in the cluster (letters, digits, `-`,
    /// `_`, `.`). Empty: the host name.
    pub node_id: String,
    /// Prefix of every Redis key the cluster uses (several clusters can
    /// share one Redis).
    pub key_prefix: String,
    /// The stream is trimmed to about this many events (`MAXLEN ~`); a
    /// node down for longer than the stream holds repairs by negentropy.
    pub stream_maxlen: u64,
    /// Client events waiting for the publisher, at most (also what rides
    /// out a Redis outage); beyond, dropped from replication and counted.
    pub outbound_buffer: usize,
    /// Stream entries read and stored per round by the consumer.
    pub consume_batch: usize,
    /// How often each node reconciles its clients' bucket use with the
    /// others' (the global limits' lag).
    pub limits_tick_ms: u64,
    /// Share per-IP and per-pubkey limits across the nodes.
    pub global_limits: bool,
    /// WebSocket URL the other nodes reach this node at, for negentropy
    /// repair. Empty: `ws://<address of server.listen, or the host name
    /// when it is 0.0.0.0>:<port>`.
    pub advertise_url: String,
    /// Repair from these URLs instead of the nodes registered in Redis.
    pub repair_peers: Vec<String>,
    /// PEM file of CA certificates a wss:// peer's certificate may chain
    /// to, besides the public roots (the peers' private CA). Empty: the
    /// public roots only.
    pub repair_ca_file: String,
    /// A repair reconciles the events created in this many seconds before
    /// now (0: every event; mind `limits.max_negentropy_items` on peers).
    pub repair_window_secs: u64,
    /// Secret key (64 hex digits) a repair authenticates with (NIP-42) to
    /// read the peers' private kinds; every node adds its pubkey to
    /// `auth.full_readers`. Give all nodes the same key. Empty: repairs
    /// read without authenticating (private kinds missed from the stream
    /// are not repaired).
    pub repair_secret_key: String,
    /// Also repair this often (seconds; 0: only on a gap): heals what did
    /// not travel by the stream (imports, dropped publications).
    pub repair_every_secs: u64,
    /// Longest wait for one Redis command (the blocking stream read waits
    /// this long for news).
    pub redis_timeout_ms: u64,
    /// Find the Redis primary through these Sentinels (`host:port` each)
    /// and follow its failovers. Empty: `redis_url` is the Redis server.
    /// With Sentinels, `redis_url` gives only the primary's user, password
    /// and database; its host and port are the ones Sentinel names.
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary by (`sentinel monitor
    /// NAME …`); required with `sentinels`.
    pub sentinel_master: String,
    /// Password of the Sentinels themselves (`requirepass` in their
    /// config), if any; the primary's own is in `redis_url`.
    pub sentinel_password: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            redis_url: "redis://127.0.0.1:6379".into(),
            node_id: String::new(),
            key_prefix: "sluice".into(),
            stream_maxlen: 250_000,
            outbound_buffer: 10_000,
            consume_batch: 500,
            limits_tick_ms: 100,
            global_limits: true,
            advertise_url: String::new(),
            repair_peers: Vec::new(),
            repair_ca_file: String::new(),
            repair_window_secs: 86_400,
            repair_every_secs: 3_600,
            repair_secret_key: String::new(),
            redis_timeout_ms: 1_000,
            sentinels: Vec::new(),
            sentinel_master: String::new(),
            sentinel_password: String::new(),
        }
    }
}

impl ClusterConfig {
    /// `repair_secret_key` and its pubkey, when set and valid.
    pub fn repair_key(&self) -> Option<([u8; 32], [u8; 32])> {
        let sk = sluice_proto::hex32::decode::<32>(&self.repair_secret_key)?;
        let pk = sluice_proto::event::try_public_key_of(&sk)?;
        Some((sk, pk))
    }

    /// Checks the section; the error names the key as written in TOML.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        if !(self.redis_url.starts_with("redis://") || self.redis_url.starts_with("unix://")) {
            return Err(format!(
                "cluster.redis_url = {:?}: must start with redis:// or unix://",
                self.redis_url
            ));
        }
        self.validate_sentinels()?;
        let ok_id = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !ok_id(&self.node_id) || self.node_id.len() > 64 {
            return Err(format!(
                "cluster.node_id = {:?}: at most 64 letters, digits, '-', '_' or '.'",
                self.node_id
            ));
        }
        if self.key_prefix.is_empty() || !ok_id(&self.key_prefix) {
            return Err(format!(
                "cluster.key_prefix = {:?}: letters, digits, '-', '_' or '.', not empty",
                self.key_prefix
            ));
        }
        let ranges: [(&str, u64, u64, u64); 5] = [
            ("stream_maxlen", self.stream_maxlen, 1_000, 1_000_000_000),
            (
                "outbound_buffer",
                self.outbound_buffer as u64,
                16,
                10_000_000,
            ),
            ("consume_batch", self.consume_batch as u64, 1, 10_000),
            ("limits_tick_ms", self.limits_tick_ms, 10, 60_000),
            ("redis_timeout_ms", self.redis_timeout_ms, 50, 60_000),
        ];
        for (key, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(format!("cluster.{key} = {v}: must be in {lo}..={hi}"));
            }
        }
        if !self.repair_secret_key.is_empty() && self.repair_key().is_none() {
            return Err(
                "cluster.repair_secret_key: not a secp256k1 secret key (64 hex digits)".into(),
            );
        }
        for url in std::iter::once(&self.advertise_url)
            .filter(|u| !u.is_empty())
            .chain(&self.repair_peers)
        {
            if !(url.starts_with("ws://") || url.starts_with("wss://")) {
                return Err(format!(
                    "cluster: {url:?} is not a ws:// or wss:// URL (advertise_url, repair_peers)"
                ));
            }
        }
        Ok(())
    }

    fn validate_sentinels(&self) -> Result<(), String> {
        if self.sentinels.is_empty() {
            if !self.sentinel_master.is_empty() {
                return Err(format!(
                    "cluster.sentinel_master = {:?} without cluster.sentinels: list the \
                     Sentinels (\"host:port\") or remove sentinel_master",
                    self.sentinel_master
                ));
            }
            if !self.sentinel_password.is_empty() {
                return Err("cluster.sentinel_password without cluster.sentinels".into());
            }
            return Ok(());
        }
        if self.sentinel_master.is_empty() {
            return Err(
                "cluster.sentinels without cluster.sentinel_master: name the primary the \
                 Sentinels monitor (sentinel monitor NAME ...)"
                    .into(),
            );
        }
        if self.sentinel_master.chars().any(|c| c.is_whitespace()) {
            return Err(format!(
                "cluster.sentinel_master = {:?}: no spaces",
                self.sentinel_master
            ));
        }
        if self.redis_url.starts_with("unix://") {
            return Err(format!(
                "cluster.redis_url = {:?} conflicts with cluster.sentinels: a unix socket \
                 cannot follow a failover; with Sentinels, redis_url gives only the \
                 password and database (redis://[:PASSWORD@]any[/DB])",
                self.redis_url
            ));
        }
        for s in &self.sentinels {
            if split_host_port(s).is_none() {
                return Err(format!(
                    "cluster.sentinels: {s:?} is not host:port (e.g. \"10.0.0.5:26379\")"
                ));
            }
        }
        Ok(())
    }
}

/// `host:port` (an IPv6 host in brackets) split, or `None`.
pub(crate) fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let ok = !host.is_empty() && !host.contains('/') && !host.contains('@');
    ok.then_some((host, port))
}
