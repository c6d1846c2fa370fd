//! Settings of the front end: listening, connection and message limits, and
//! the NIP-11 identity. Every limit here is published in NIP-11.

use serde::{Deserialize, Serialize};
pub use sluice_ws::extension::Compression;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port (logged at start).
    pub listen: String,
    /// Open WebSocket connections at most; more get HTTP 503.
    pub max_connections: usize,
    /// Threads of the async runtime that serves the sockets; 0: half the
    /// cores the process may run on, at least 1 ([`ServerConfig::runtime_threads`]).
    pub runtime_threads: usize,
    /// Outbound messages not yet written to a slow client's socket are
    /// dropped with the client after this long.
    pub send_timeout_ms: u64,
    /// EVENTs of one connection waiting for their OK; further EVENTs are
    /// refused with `rate-limited:` until one is answered.
    pub max_pending_writes: usize,
    /// Live events buffered per subscription while its stored query runs.
    pub max_buffered_live_events: usize,
    /// Bytes read from a socket at once, into a buffer each worker thread
    /// shares among its connections (a connection keeps only the part of
    /// a frame not yet whole).
    pub read_buffer_bytes: usize,
    /// Bytes of a query chunk's frames a connection holds before it writes
    /// them (one write instead of one per event); 0 writes every frame at
    /// once. What is held is freed once written.
    pub write_buffer_bytes: usize,
    /// Most unsent bytes a connection holds: a frame that would take it
    /// past this waits until what is held is written.
    pub max_write_buffer_bytes: usize,
    /// How long shutdown waits for sessions to answer pending EVENTs.
    pub shutdown_grace_ms: u64,
    /// A connection must send its whole HTTP request head within this
    /// long (and again for each request on a kept-alive connection), or it
    /// is closed.
    pub handshake_timeout_ms: u64,
    /// TCP connections that are not (yet) WebSocket sessions: plain HTTP
    /// and handshakes in progress. Past it the oldest held over 1 s is
    /// closed to make room, else the new one is answered 503.
    pub max_http_connections: usize,
    /// The same, per client address (IPv6: per /64); past it a connection
    /// waits in the handshake queue. A trusted proxy's address is not
    /// limited.
    pub max_http_connections_per_ip: usize,
    /// Connections from an address at `max_http_connections_per_ip` that
    /// may wait for one of its slots (a burst from one NAT or proxy); 0:
    /// none wait, more are answered 429.
    pub handshake_queue_per_ip: usize,
    /// The same, from all addresses together.
    pub handshake_queue_total: usize,
    /// A waiting connection that gets no slot within this long is answered
    /// 429.
    pub handshake_queue_wait_ms: u64,
    /// A WebSocket connection with no subscription, no running query and
    /// no EVENT awaiting its OK, that sends nothing for this long, is
    /// closed; 0 never closes one.
    pub idle_timeout_ms: u64,
    /// What `/` answers a browser (`Accept: text/html`): `"builtin"` (the
    /// relay's own page), `"off"` (the one line of plain text), or the
    /// path of an HTML file, read once at start (`crate::pages`).
    pub landing_page: String,
    /// `/status` and `/status.json` answer everyone; otherwise only what
    /// may read `/metrics` (`metrics.allow_from`, direct connections).
    pub public_status: bool,
    /// permessage-deflate (RFC 7692), agreed when a client offers it:
    /// `"off"`, `"stateless"` (each message compressed on its own, nothing
    /// kept per connection) or `"sliding"` (each connection keeps a window
    /// of what it was sent, `compression_window_bytes`).
    pub compression: Compression,
    /// zlib compression level, 1 (fastest) to 9 (smallest).
    pub compression_level: u8,
    /// Messages shorter than this are sent uncompressed.
    pub compression_min_bytes: usize,
    /// `sliding`: the bytes of past messages a connection keeps for later
    /// ones to refer to (512 to 32768), made at its first compressed
    /// message.
    pub compression_window_bytes: usize,
    /// `sliding`: all connections' windows together; past it a connection
    /// gets no window and its messages are compressed on their own.
    pub compression_windows_mb: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7777".into(),
            max_connections: 10_000,
            runtime_threads: 0,
            send_timeout_ms: 10_000,
            max_pending_writes: 64,
            max_buffered_live_events: 1024,
            read_buffer_bytes: 65_536,
            write_buffer_bytes: 65_536,
            max_write_buffer_bytes: 4 << 20,
            shutdown_grace_ms: 5_000,
            handshake_timeout_ms: 10_000,
            max_http_connections: 1024,
            max_http_connections_per_ip: 16,
            handshake_queue_per_ip: 64,
            handshake_queue_total: 256,
            handshake_queue_wait_ms: 5_000,
            idle_timeout_ms: 300_000,
            landing_page: crate::pages::BUILTIN.into(),
            public_status: false,
            compression: Compression::Sliding,
            compression_level: 6,
            compression_min_bytes: 128,
            compression_window_bytes: 4096,
            compression_windows_mb: 64,
        }
    }
}

/// Protocol limits, each advertised in NIP-11 `limitation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest WebSocket message accepted (NIP-11 max_message_length).
    pub max_message_bytes: usize,
    /// Open subscriptions per connection (NIP-11 max_subscriptions).
    pub max_subscriptions: usize,
    /// Filters in one REQ or COUNT (NIP-11 max_filters).
    pub max_filters: usize,
    /// Largest `limit` honoured (NIP-11 max_limit).
    pub max_limit: u64,
    /// `limit` used when a filter gives none (NIP-11 default_limit).
    pub default_limit: u64,
    /// Longest subscription id (NIP-11 max_subid_length).
    pub max_subid_length: usize,
    /// Tags per event (NIP-11 max_event_tags).
    pub max_event_tags: usize,
    /// Bytes of event content (NIP-11 max_content_length).
    pub max_content_bytes: usize,
    /// Events older than this many seconds are refused; 0 means no limit
    /// (NIP-11 created_at_lower_limit).
    pub created_at_max_age_secs: u64,
    /// Events more than this many seconds in the future are refused
    /// (NIP-11 created_at_upper_limit).
    pub created_at_max_ahead_secs: u64,
    /// Most stored events one NIP-77 negentropy session reconciles over
    /// (its query is also bounded by `engine.max_scan_rows`).
    pub max_negentropy_items: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_message_bytes: 128 * 1024,
            max_subscriptions: 20,
            max_filters: 10,
            max_limit: 5000,
            default_limit: 500,
            max_subid_length: 64,
            max_event_tags: 2000,
            max_content_bytes: 64 * 1024,
            created_at_max_age_secs: 0,
            created_at_max_ahead_secs: 900,
            max_negentropy_items: 200_000,
        }
    }
}

/// NIP-11 identity of the relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayInfoConfig {
    pub name: String,
    pub description: String,
    /// Operator's hex pubkey; empty to omit.
    pub pubkey: String,
    /// Operator contact (URI or e-mail); empty to omit.
    pub contact: String,
    /// URL of an icon; empty to omit.
    pub icon: String,
}

impl Default for RelayInfoConfig {
    fn default() -> Self {
        RelayInfoConfig {
            name: "sluice".into(),
            description: "A Nostr relay with adaptive throttling.".into(),
            pubkey: String::new(),
            contact: String::new(),
            icon: String::new(),
        }
    }
}

impl ServerConfig {
    /// The async runtime's threads on a process that may run on `cores`
    /// cores: `runtime_threads`, or when 0 half the cores (rounded up).
    /// The store's work runs on threads of its own (the writer, one query
    /// worker per core), so a runtime thread per core only takes turns
    /// with them.
    pub fn runtime_threads(&self, cores: usize) -> usize {
        match self.runtime_threads {
            0 => cores.div_ceil(2).max(1),
            n => n,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "server.listen: {:?} is not an address like 127.0.0.1:7777",
                self.listen
            ));
        }
        for (key, v) in [
            ("server.max_connections", self.max_connections),
            ("server.max_pending_writes", self.max_pending_writes),
            (
                "server.max_buffered_live_events",
                self.max_buffered_live_events,
            ),
            ("server.max_write_buffer_bytes", self.max_write_buffer_bytes),
            ("server.max_http_connections", self.max_http_connections),
            (
                "server.max_http_connections_per_ip",
                self.max_http_connections_per_ip,
            ),
        ] {
            if v == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if self.runtime_threads > 1024 {
            return Err("server.runtime_threads must be in 0..=1024".into());
        }
        if !(1..=9).contains(&self.compression_level) {
            return Err("server.compression_level must be in 1..=9".into());
        }
        if !(512..=32_768).contains(&self.compression_window_bytes) {
            return Err("server.compression_window_bytes must be in 512..=32768".into());
        }
        if !(512..=16 << 20).contains(&self.read_buffer_bytes) {
            return Err("server.read_buffer_bytes must be in 512..=16777216".into());
        }
        if self.send_timeout_ms == 0 {
            return Err("server.send_timeout_ms must be at least 1".into());
        }
        if self.handshake_timeout_ms == 0 {
            return Err("server.handshake_timeout_ms must be at least 1".into());
        }
        if self.handshake_queue_per_ip > self.handshake_queue_total {
            return Err(format!(
                "server.handshake_queue_per_ip = {} must not exceed server.handshake_queue_total = {}",
                self.handshake_queue_per_ip, self.handshake_queue_total
            ));
        }
        if !(1..=600_000).contains(&self.handshake_queue_wait_ms) {
            return Err("server.handshake_queue_wait_ms must be 1..=600000".into());
        }
        crate::pages::Landing::load(&self.landing_page).map(drop)
    }
}

impl LimitsConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (key, v) in [
            ("limits.max_subscriptions", self.max_subscriptions),
            ("limits.max_filters", self.max_filters),
            ("limits.max_subid_length", self.max_subid_length),
            ("limits.max_negentropy_items", self.max_negentropy_items),
        ] {
            if v == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if self.max_message_bytes < 1024 {
            return Err("limits.max_message_bytes must be at least 1024".into());
        }
        if self.max_limit == 0 {
            return Err("limits.max_limit must be at least 1".into());
        }
        if self.default_limit > self.max_limit {
            return Err(format!(
                "limits.default_limit = {} must not exceed limits.max_limit = {}",
                self.default_limit, self.max_limit
            ));
        }
        Ok(())
    }

    pub fn event_limits(&self) -> sluice_proto::EventLimits {
        sluice_proto::EventLimits {
            max_event_tags: self.max_event_tags,
            max_content_length: self.max_content_bytes,
            created_at_max_ahead_secs: self.created_at_max_ahead_secs,
            created_at_max_age_secs: self.created_at_max_age_secs,
        }
    }
}

impl RelayInfoConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !self.pubkey.is_empty() && sluice_proto::hex32::decode::<32>(&self.pubkey).is_none() {
            return Err("relay.pubkey must be 64 lowercase hex characters or empty".into());
        }
        if !self.icon.is_empty() && crate::pages::origin_of(&self.icon).is_none() {
            return Err(format!(
                "relay.icon: {:?} is not an http:// or https:// URL",
                self.icon
            ));
        }
        Ok(())
    }
}

/// NIP-42 authentication and the rules that depend on it: NIP-70
/// protected events and private messages (`[auth]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Offer NIP-42 authentication (AUTH challenges, NIP-11 lists 42).
    pub enabled: bool,
    /// Send the challenge as soon as a client connects; otherwise it is
    /// sent with the first answer that asks for authentication.
    pub challenge_on_connect: bool,
    /// This relay's public URLs, as clients write them
    /// (`wss://relay.example.com`). An AUTH event's `relay` tag must name
    /// one of them; empty: it must name the host the client connected to.
    pub relay_urls: Vec<String>,
    /// How far an AUTH event's `created_at` may be from now, in seconds.
    pub max_skew_secs: u64,
    /// Pubkeys one connection may authenticate as.
    pub max_pubkeys_per_connection: usize,
    /// Kinds served only to an authenticated pubkey that wrote the event or
    /// is named in one of its `p` tags (direct messages, gift wraps);
    /// empty: every stored event is public.
    pub private_kinds: Vec<u16>,
    /// Pubkeys (hex) that, once authenticated, read every private event:
    /// the other nodes of a cluster repairing from this one (a node adds
    /// its `cluster.repair_secret_key`'s pubkey itself), a backup.
    pub full_readers: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            enabled: true,
            challenge_on_connect: true,
            relay_urls: Vec::new(),
            max_skew_secs: 600,
            max_pubkeys_per_connection: 8,
            private_kinds: vec![4, 1059, 1060],
            full_readers: Vec::new(),
        }
    }
}

impl AuthConfig {
    /// Whether one of `pubkeys` reads every private event.
    pub fn any_full_reader(&self, pubkeys: &[[u8; 32]]) -> bool {
        pubkeys.iter().any(|p| {
            self.full_readers
                .iter()
                .any(|f| sluice_proto::hex32::decode::<32>(f).as_ref() == Some(p))
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_pubkeys_per_connection == 0 {
            return Err("auth.max_pubkeys_per_connection must be at least 1".into());
        }
        if !self.enabled && !self.private_kinds.is_empty() {
            return Err(
                "auth.private_kinds needs auth.enabled = true (nobody could read them); \
                 set auth.private_kinds = [] to serve them to everyone"
                    .into(),
            );
        }
        for pk in &self.full_readers {
            if sluice_proto::hex32::decode::<32>(pk).is_none() {
                return Err(format!(
                    "auth.full_readers: {pk:?} is not a pubkey (64 hex digits)"
                ));
            }
        }
        for url in &self.relay_urls {
            if !sluice_proto::auth::relay_matches(url, std::slice::from_ref(url), None) {
                return Err(format!(
                    "auth.relay_urls: {url:?} is not a ws://, wss://, http:// or https:// URL"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ServerConfig;

    #[test]
    fn the_runtime_takes_half_the_cores_unless_told() {
        let auto = ServerConfig::default();
        let threads: Vec<usize> = [1, 2, 3, 4, 8].map(|c| auto.runtime_threads(c)).into();
        assert_eq!(threads, [1, 1, 2, 2, 4]);
        let three = ServerConfig {
            runtime_threads: 3,
            ..ServerConfig::default()
        };
        assert_eq!(three.runtime_threads(2), 3);
        assert!(three.validate().is_ok());
        let too_many = ServerConfig {
            runtime_threads: 1025,
            ..ServerConfig::default()
        };
        assert!(too_many.validate().unwrap_err().contains("runtime_threads"));
    }
}
