//! `connections`: opens N idle WebSocket connections (optionally each with
//! one open subscription) and reports the relay's memory per connection,
//! read from its /metrics (`process_resident_memory_bytes`) or, given
//! `--pid`, from /proc/<pid>/status (RSS and anonymous RSS). With
//! `--deflate` the connections are opened by the raw client (`wsraw`),
//! which offers permessage-deflate, so the figure includes whatever the
//! relay keeps per connection for compression.

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
use crate::wsraw::codec::Msg;
use crate::wsraw::{self, WsRaw};

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
    /// Offer permessage-deflate on every connection (raw client).
    #[arg(long)]
    pub deflate: bool,
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
    /// Whether the connections offered permessage-deflate.
    #[serde(default)]
    pub deflate: bool,
    /// Connections on which the relay agreed to an extension.
    #[serde(default)]
    pub extension_agreed: usize,
    /// The first agreed `Sec-WebSocket-Extensions` answer.
    #[serde(default)]
    pub extension: Option<String>,
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
    let (opened, extension_agreed, extension) =
        (opened.count, opened.extension_agreed, opened.extension);
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
        deflate: args.deflate,
        extension_agreed,
        extension,
        open_secs,
        memory_source: mem.label(),
        rss_bytes_per_connection: per(before.rss_bytes, with_connections.rss_bytes),
        rss_anon_bytes_per_connection: per(before.rss_anon_bytes, with_connections.rss_anon_bytes),
        before,
        with_connections,
        after_close,
    })
}

/// What opening the connections gave.
struct Opened {
    count: usize,
    extension_agreed: usize,
    extension: Option<String>,
}

async fn open_all(
    relay: &RelayUrl,
    args: &ConnectionsArgs,
    stop: watch::Receiver<bool>,
) -> (Vec<tokio::task::JoinHandle<()>>, Opened) {
    let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
    // Each connection reports once, so the channel never holds more than `count`.
    let (ready_tx, mut ready_rx) = mpsc::channel(args.count.max(1));
    let handles = (0..args.count)
        .map(|i| {
            let bind = (args.source_ips > 0).then(|| loopback_source(1, i % args.source_ips));
            let (relay, gate, ready, stop) =
                (relay.clone(), gate.clone(), ready_tx.clone(), stop.clone());
            let (subscribe, deflate) = (args.subscribe, args.deflate);
            tokio::spawn(async move {
                let conn = {
                    let _permit = gate.acquire().await.expect("gate is never closed");
                    open_one(&relay, bind, subscribe, deflate).await
                };
                let _ = ready.send(conn.as_ref().map(Conn::extension)).await;
                if let Some(conn) = conn {
                    conn.hold(stop).await;
                }
            })
        })
        .collect();
    let mut opened = Opened {
        count: 0,
        extension_agreed: 0,
        extension: None,
    };
    for _ in 0..args.count {
        if let Some(Some(ext)) = ready_rx.recv().await {
            opened.count += 1;
            if let Some(ext) = ext {
                opened.extension_agreed += 1;
                opened.extension.get_or_insert(ext);
            }
        }
    }
    (handles, opened)
}

/// One idle connection: tungstenite's, or the raw client's when it offers
/// permessage-deflate.
enum Conn {
    Plain(Box<Ws>),
    Raw(Box<WsRaw>),
}

/// A filter that matches nothing stored: the subscription just stays open.
fn idle_filter() -> serde_json::Value {
    json!({"kinds": [1], "#t": ["sluice-bench-idle"], "limit": 0})
}

async fn open_one(
    relay: &RelayUrl,
    bind: Option<IpAddr>,
    subscribe: bool,
    deflate: bool,
) -> Option<Conn> {
    if deflate {
        let opts = wsraw::Options {
            offer_deflate: true,
            keep_data: false,
            bind,
            ..wsraw::Options::default()
        };
        let mut ws = WsRaw::connect(relay, &opts).await.ok()?;
        if subscribe {
            let req = json!(["REQ", "idle", idle_filter()]).to_string();
            ws.send_text(&req).await.ok()?;
        }
        return Some(Conn::Raw(Box::new(ws)));
    }
    let mut ws = wire::connect(relay, bind).await.ok()?;
    if subscribe {
        ws.send(wire::req("idle", &idle_filter())).await.ok()?;
    }
    Some(Conn::Plain(Box::new(ws)))
}

impl Conn {
    /// The extension the relay agreed to, if any (`None` for a plain connection).
    fn extension(&self) -> Option<String> {
        match self {
            Conn::Plain(_) => None,
            Conn::Raw(ws) => ws.handshake().extensions.clone(),
        }
    }

    /// Keeps the connection open (answering pings) until told to stop.
    async fn hold(self, mut stop: watch::Receiver<bool>) {
        match self {
            Conn::Plain(mut ws) => {
                loop {
                    tokio::select! {
                        m = ws.next() => if !matches!(m, Some(Ok(_))) { return },
                        _ = stop.changed() => break,
                    }
                }
                let _ = futures_util::SinkExt::close(&mut *ws).await;
            }
            Conn::Raw(mut ws) => {
                loop {
                    tokio::select! {
                        m = ws.recv() => match m {
                            Ok(Some((Msg::Close(_), _)) | None) | Err(_) => return,
                            Ok(Some(_)) => {}
                        },
                        _ = stop.changed() => break,
                    }
                }
                ws.close(Duration::from_millis(500)).await;
            }
        }
    }
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
        if self.deflate {
            println!(
                "  permessage-deflate offered; agreed on {} of {}: {}",
                self.extension_agreed,
                self.opened,
                self.extension.as_deref().unwrap_or("none")
            );
        }
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
