//! `connections`: opens N idle WebSocket connections (optionally each with
//! one open subscription) and reports the relay's memory per connection,
//! read from its /metrics (`process_resident_memory_bytes`) or, given
//! `--pid`, from /proc/<pid>/status (RSS and anonymous RSS).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::metrics::{self, ProcMemory};
use crate::report::RunInfo;
use crate::wire::{self, RelayUrl, Ws};

/// Connections being opened at once.
const CONNECT_PARALLELISM: usize = 64;

#[derive(Debug, Clone, clap::Args)]
pub struct ConnectionsArgs {
    pub relay: String,
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Read memory from /proc/<pid>/status instead of /metrics.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Metrics page [default: http://<relay host:port>/metrics].
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Each connection also opens one subscription (a REQ that stays open).
    #[arg(long)]
    pub subscribe: bool,
    /// Spread connections over this many loopback source addresses
    /// (127.1.x.y), for relays that limit connections per IP. 0: do not bind.
    #[arg(long, default_value_t = 0)]
    pub source_ips: usize,
    /// Wait this long after opening before reading memory.
    #[arg(long, default_value_t = 2.0)]
    pub settle_secs: f64,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Memory at one moment, from whichever source is available.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct MemoryReading {
    pub rss_bytes: Option<f64>,
    pub rss_anon_bytes: Option<f64>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ConnectionsReport {
    pub run: RunInfo,
    pub requested: usize,
    pub opened: usize,
    pub failed: usize,
    pub subscribe: bool,
    pub open_secs: f64,
    pub memory_source: String,
    pub before: MemoryReading,
    pub with_connections: MemoryReading,
    pub after_close: MemoryReading,
    pub rss_bytes_per_connection: Option<f64>,
    pub rss_anon_bytes_per_connection: Option<f64>,
}

struct MemorySource {
    pid: Option<u32>,
    metrics_url: String,
}

impl MemorySource {
    fn label(&self) -> String {
        match self.pid {
            Some(pid) => format!("/proc/{pid}/status"),
            None => self.metrics_url.clone(),
        }
    }

    async fn read(&self) -> MemoryReading {
        if let Some(pid) = self.pid {
            return match metrics::proc_memory(pid) {
                Ok(ProcMemory {
                    rss_bytes,
                    rss_anon_bytes,
                }) => MemoryReading {
                    rss_bytes: Some(rss_bytes as f64),
                    rss_anon_bytes: rss_anon_bytes.map(|v| v as f64),
                },
                Err(_) => MemoryReading::default(),
            };
        }
        let Ok(text) = metrics::http_get(&self.metrics_url).await else {
            return MemoryReading::default();
        };
        let samples = metrics::parse_prometheus(&text);
        MemoryReading {
            rss_bytes: metrics::resident_memory(&samples).map(|(_, v)| v),
            rss_anon_bytes: metrics::first_value(&samples, "sluice_process_anonymous_memory_bytes"),
        }
    }
}

/// A loopback source address for client `index` of a class, so one machine
/// can present many client IPs to a relay on 127.0.0.1.
pub fn loopback_source(class: u8, index: usize) -> IpAddr {
    IpAddr::from([
        127,
        class,
        ((index / 250) % 250) as u8,
        (index % 250) as u8 + 1,
    ])
}

pub async fn run(args: &ConnectionsArgs) -> anyhow::Result<ConnectionsReport> {
    let relay = RelayUrl::parse(&args.relay)?;
    let mut run = RunInfo::new("connections", Some(&args.relay));
    let mem = MemorySource {
        pid: args.pid,
        metrics_url: args
            .metrics_url
            .clone()
            .unwrap_or_else(|| format!("{}/metrics", relay.http_base())),
    };
    let settle = Duration::from_secs_f64(args.settle_secs);
    let before = mem.read().await;
    let started = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (handles, opened) = open_all(&relay, args, stop_rx).await;
    let open_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(settle).await;
    let with_connections = mem.read().await;
    stop_tx.send(true).ok();
    for h in handles {
        let _ = h.await;
    }
    tokio::time::sleep(settle).await;
    let after_close = mem.read().await;
    let per = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / opened.max(1) as f64);
    run.finish();
    Ok(ConnectionsReport {
        run,
        requested: args.count,
        opened,
        failed: args.count - opened,
        subscribe: args.subscribe,
        open_secs,
        memory_source: mem.label(),
        rss_bytes_per_connection: per(before.rss_bytes, with_connections.rss_bytes),
        rss_anon_bytes_per_connection: per(before.rss_anon_bytes, with_connections.rss_anon_bytes),
        before,
        with_connections,
        after_close,
    })
}

async fn open_all(
    relay: &RelayUrl,
    args: &ConnectionsArgs,
    stop: watch::Receiver<bool>,
) -> (Vec<tokio::task::JoinHandle<()>>, usize) {
    let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
    // Each connection reports once, so the channel never holds more than `count`.
    let (ready_tx, mut ready_rx) = mpsc::channel(args.count.max(1));
    let handles = (0..args.count)
        .map(|i| {
            let bind = (args.source_ips > 0).then(|| loopback_source(1, i % args.source_ips));
            let (relay, gate, ready, stop) =
                (relay.clone(), gate.clone(), ready_tx.clone(), stop.clone());
            let subscribe = args.subscribe;
            tokio::spawn(async move {
                let ws = {
                    let _permit = gate.acquire().await.expect("gate is never closed");
                    open_one(&relay, bind, subscribe).await
                };
                let _ = ready.send(ws.is_some()).await;
                if let Some(ws) = ws {
                    hold(ws, stop).await;
                }
            })
        })
        .collect();
    let mut opened = 0;
    for _ in 0..args.count {
        opened += usize::from(ready_rx.recv().await == Some(true));
    }
    (handles, opened)
}

async fn open_one(relay: &RelayUrl, bind: Option<IpAddr>, subscribe: bool) -> Option<Ws> {
    let mut ws = wire::connect(relay, bind).await.ok()?;
    if subscribe {
        // A filter that matches nothing stored: the subscription just stays open.
        let filter = json!({"kinds": [1], "#t": ["sluice-bench-idle"], "limit": 0});
        ws.send(wire::req("idle", &filter)).await.ok()?;
    }
    Some(ws)
}

/// Keeps a connection open (answering pings) until told to stop.
async fn hold(mut ws: Ws, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            m = ws.next() => if !matches!(m, Some(Ok(_))) { return },
            _ = stop.changed() => break,
        }
    }
    let _ = ws.close(None).await;
}

impl ConnectionsReport {
    pub fn print(&self) {
        println!(
            "connections: {} opened {} of {} ({} failed) in {:.2} s{}",
            self.run.relay.as_deref().unwrap_or("?"),
            self.opened,
            self.requested,
            self.failed,
            self.open_secs,
            if self.subscribe {
                ", one subscription each"
            } else {
                ""
            }
        );
        println!("  {}", self.run.cpu_line());
        let mb = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{:.1} MB", v / 1e6));
        println!("  memory from {}", self.memory_source);
        println!(
            "  RSS: before {}, with connections {}, after close {}",
            mb(self.before.rss_bytes),
            mb(self.with_connections.rss_bytes),
            mb(self.after_close.rss_bytes)
        );
        let kb = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{:.1} KB", v / 1e3));
        println!(
            "  per connection: RSS {}, anonymous RSS {}",
            kb(self.rss_bytes_per_connection),
            kb(self.rss_anon_bytes_per_connection)
        );
    }
}
