//! `publish`: N connections publishing pre-signed events from a JSONL file,
//! closed loop (each connection keeps `window` events in flight) or open loop
//! (a fixed total rate; latency from each event's due time).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::{PublisherConfig, Shared, TallyReport, Totals, run_publisher};
use crate::report::RunInfo;
use crate::source::{Phase, Schedule, Source};
use crate::wire::RelayUrl;

#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Relay URL (ws://host:port).
    pub relay: String,
    /// JSONL file of signed events (for example from `gen`).
    #[arg(long)]
    pub events: PathBuf,
    /// Concurrent connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Open loop: total events per second. Without it, closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Closed loop: events in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub window: usize,
    /// Publish at most this many events from the file.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Stop sending after this many seconds.
    #[arg(long)]
    pub duration_secs: Option<f64>,
    /// An event without an OK after this long counts as a timeout.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Open loop: most events in flight per connection; due events beyond it are skipped and counted.
    #[arg(long, default_value_t = 10_000)]
    pub max_inflight: usize,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct PublishReport {
    pub run: RunInfo,
    pub mode: String,
    pub connections: usize,
    pub target_rate: Option<f64>,
    pub window: usize,
    /// First send to last reply.
    pub elapsed_secs: f64,
    pub results: TallyReport,
}

pub async fn run(args: &PublishArgs) -> anyhow::Result<PublishReport> {
    let relay = RelayUrl::parse(&args.relay)?;
    let mut run = RunInfo::new("publish", Some(&args.relay));
    let source = Arc::new(Source::file(&args.events, args.limit)?);
    let schedule = match args.rate {
        Some(rate) => Schedule::Open(vec![Phase {
            rate,
            secs: f64::INFINITY,
        }]),
        None => Schedule::ClosedLoop,
    };
    let totals = Arc::new(Totals::default());
    let t0 = Instant::now();
    let stop_at = t0 + Duration::from_secs_f64(args.duration_secs.unwrap_or(365.0 * 86400.0));
    let shared = Shared {
        source,
        schedule: Arc::new(schedule),
        recorder: totals.clone(),
        t0,
    };
    let cfg = PublisherConfig {
        relay,
        bind: None,
        window: args.window,
        max_inflight: args.max_inflight,
        timeout: Duration::from_millis(args.timeout_ms),
        stop_at,
    };
    let tasks: Vec<_> = (0..args.connections.max(1))
        .map(|_| tokio::spawn(run_publisher(cfg.clone(), shared.clone())))
        .collect();
    for t in tasks {
        t.await?;
    }
    let (tally, first, last) = totals.snapshot();
    let elapsed = match (first, last) {
        (Some(f), Some(l)) if l > f => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    run.finish();
    Ok(PublishReport {
        run,
        mode: if args.rate.is_some() {
            "open-loop"
        } else {
            "closed-loop"
        }
        .into(),
        connections: args.connections,
        target_rate: args.rate,
        window: args.window,
        elapsed_secs: elapsed,
        results: tally.report(elapsed),
    })
}

impl PublishReport {
    pub fn print(&self) {
        let rate = self
            .target_rate
            .map(|r| format!(" at {r:.0}/s"))
            .unwrap_or_default();
        println!(
            "publish: {} {}{rate}, {} connections, {:.2} s",
            self.run.relay.as_deref().unwrap_or("?"),
            self.mode,
            self.connections,
            self.elapsed_secs
        );
        self.results.print("  ");
        println!("  {}", self.run.cpu_line());
    }
}
