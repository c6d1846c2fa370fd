//! The `readflood` command line, with the hidden flags the abusers' process
//! is started with.

use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Which part of the run this process plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// The whole run: polite clients here, abusers in a child process.
    Driver,
    /// Only the abusive clients (the child process).
    Abusers,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReadfloodArgs {
    pub relay: String,
    /// Abusive source addresses (one client each).
    #[arg(long, default_value_t = 6)]
    pub abusive_addrs: usize,
    /// The first abusive source address; client i connects from this plus i.
    #[arg(long, default_value = "127.0.0.10")]
    pub abusive_addr_base: Ipv4Addr,
    /// Connections per abusive address.
    #[arg(long, default_value_t = 1)]
    pub abusive_conns_per_addr: usize,
    /// REQs each abusive connection keeps open.
    #[arg(long, default_value_t = 8)]
    pub abusive_subs: usize,
    /// The `limit` of the abusive `{"limit":L}` filters.
    #[arg(long, default_value_t = 5000)]
    pub abusive_limit: u64,
    /// NIP-50 words (comma-separated): every abusive REQ is then
    /// `{"search":"<a word drawn from them>","limit":L}` instead.
    #[arg(long, value_delimiter = ',')]
    pub abusive_search: Vec<String>,
    #[arg(long, default_value_t = 3)]
    pub polite_clients: usize,
    /// The source address of every polite client.
    #[arg(long, default_value = "127.0.0.2")]
    pub polite_addr: Ipv4Addr,
    /// REQs per second per polite client.
    #[arg(long, default_value_t = 2.0)]
    pub polite_req_rate: f64,
    /// EVENTs per second per polite client.
    #[arg(long, default_value_t = 1.0)]
    pub polite_event_rate: f64,
    /// The `limit` of the polite `{"authors":[own],"limit":N}` filters.
    #[arg(long, default_value_t = 5)]
    pub polite_limit: u64,
    /// Content bytes of each polite event.
    #[arg(long, default_value_t = 200)]
    pub content_bytes: usize,
    /// The source address of the fresh REQ sent after the flood.
    #[arg(long, default_value = "127.0.0.3")]
    pub probe_addr: Ipv4Addr,
    /// A REQ without EOSE (or an EVENT without OK) after this long counts as a timeout.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Polite clients alone, before the flood.
    #[arg(long, default_value_t = 10.0)]
    pub before_secs: f64,
    #[arg(long, default_value_t = 30.0)]
    pub flood_secs: f64,
    /// Polite clients alone again, after the flood.
    #[arg(long, default_value_t = 10.0)]
    pub after_secs: f64,
    /// Wait this long after the abusers left before reading the query gauges
    /// and sending the fresh REQ.
    #[arg(long, default_value_t = 3.0)]
    pub settle_secs: f64,
    /// Run the abusers in this process instead of a child process.
    #[arg(long)]
    pub in_process: bool,
    /// Connect every client from the default address even when the relay is on loopback.
    #[arg(long)]
    pub same_source_ip: bool,
    /// Metrics page [default: http://<relay host:port>/metrics].
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Do not scrape /metrics (for relays without one).
    #[arg(long)]
    pub no_metrics: bool,
    /// Also sample the relay process's memory from /proc/<pid>/status.
    #[arg(long)]
    pub pid: Option<u32>,
    #[arg(long, default_value_t = 1000)]
    pub scrape_ms: u64,
    /// Series to record from /metrics, by name prefix (repeatable).
    #[arg(long, default_values_t = [
        "sluice_query_".to_owned(),
        "sluice_throttle_".to_owned(),
        "sluice_process_".to_owned(),
        "sluice_connections_".to_owned(),
        "sluice_subscriptions_".to_owned(),
    ])]
    pub series_prefix: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Internal: the part this process plays.
    #[arg(long, hide = true, value_enum, default_value_t = Role::Driver)]
    pub role: Role,
    /// Internal (abusers): where to write the abusers' report.
    #[arg(long, hide = true)]
    pub abusers_report: Option<PathBuf>,
    /// Internal (abusers): the run's time zero, unix milliseconds.
    #[arg(long, hide = true)]
    pub t0_unix_ms: Option<u64>,
}
