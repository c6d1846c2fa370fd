//! The `soak` command line.

use std::path::PathBuf;

use super::mix::{parse_count, parse_size};

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| format!("{e:#}"))
}

fn count_arg(s: &str) -> Result<u64, String> {
    parse_count(s).map_err(|e| format!("{e:#}"))
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Example (a relay with a 256 MiB store target, 4x that ingested):
  sluice-bench soak --print-exempt --exempt-authors 3
  sluice-bench soak --url ws://127.0.0.1:7777 --bytes 1G --target-mb 256 \\
      --exempt-authors 3 --out soak.json
  sluice-bench plot soak.json -o soak.svg

Raise the relay's per-client limits (events per IP and per pubkey) for the
run, or most of the load is refused rate-limited: and the acceptance says so.
Exits with status 1 when an error: answer came or a check failed.")]
pub struct SoakArgs {
    /// Relay URL (ws://host:port).
    #[arg(long = "url", required_unless_present = "print_exempt")]
    pub relay: Option<String>,
    /// JSON bytes of events to offer, in all: 500M, 1G (binary K/M/G/T suffixes).
    #[arg(long, value_parser = size_arg, required_unless_present_any = ["events", "print_exempt"])]
    pub bytes: Option<u64>,
    /// Events to offer, in all: 2M (decimal K/M/G suffixes). With --bytes,
    /// whichever is reached first.
    #[arg(long, value_parser = count_arg)]
    pub events: Option<u64>,
    /// Connections publishing as fast as the relay answers.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// EVENTs each writer keeps awaiting OK.
    #[arg(long, default_value_t = 16)]
    pub window: usize,
    /// Polite clients, each publishing one event every --polite-interval-ms.
    #[arg(long, default_value_t = 4)]
    pub polite: usize,
    #[arg(long, default_value_t = 500)]
    pub polite_interval_ms: u64,
    /// Distinct authors of the writers' events (fresh keys from --seed).
    #[arg(long, default_value_t = 1000)]
    pub authors: usize,
    /// The first N author keys are exempt from retention: their pubkeys are
    /// printed at the start, and at the end every accepted event of theirs
    /// must still be stored.
    #[arg(long, default_value_t = 0)]
    pub exempt_authors: usize,
    /// created_at runs over this many days, ending at the run's start.
    #[arg(long, default_value_t = 180.0)]
    pub span_days: f64,
    /// Most seconds an event is older than its point on the span.
    #[arg(long, default_value_t = 6 * 3600)]
    pub jitter_secs: u64,
    /// Share of events dated anywhere between the span's start and their point.
    #[arg(long, default_value_t = 0.1)]
    pub backfill: f64,
    /// Milliseconds between samples.
    #[arg(long, default_value_t = 1000)]
    pub sample_ms: u64,
    /// The relay's store size target in MiB, recorded in the report (the
    /// summary compares the store with it and `plot` draws it).
    #[arg(long)]
    pub target_mb: Option<f64>,
    /// How many of the newest accepted events the end check looks for.
    #[arg(long, default_value_t = 1000)]
    pub check_newest: usize,
    /// Threads signing events [default: the machine's cores].
    #[arg(long)]
    pub sign_threads: Option<usize>,
    /// An EVENT without an OK after this long counts as a timeout.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
    /// Stop offering events after this many seconds, whatever is left.
    #[arg(long)]
    pub max_secs: Option<f64>,
    /// Connect every client from 127.0.0.1 even when the relay is on loopback.
    #[arg(long)]
    pub same_source_ip: bool,
    /// Metrics page [default: http://<relay host:port>/metrics].
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Do not scrape /metrics.
    #[arg(long)]
    pub no_metrics: bool,
    /// Print a progress line every this many seconds (0: none).
    #[arg(long, default_value_t = 10)]
    pub progress_secs: u64,
    /// Print the exempt authors' pubkeys as a TOML line and exit.
    #[arg(long)]
    pub print_exempt: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the report as JSON to this file (`plot` draws it).
    #[arg(long, alias = "json")]
    pub out: Option<PathBuf>,
}
