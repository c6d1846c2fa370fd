//! `audience`: what fan-out costs a relay per published event as an audience
//! that matches nothing grows. N idle connections each hold `reqs_per_idle`
//! subscriptions on random authors that never publish; beside them runs a
//! `fanout` with one publisher at a fixed rate and one watcher subscribed to
//! the publisher's events. Reported: the relay's CPU per published event
//! (utime + stime from /proc/<pid>/stat over the publish phase only, which
//! starts after every idle REQ was answered), delivery latency to the watcher
//! from each event's due time, how the idle REQs were answered, the idle
//! connections the relay dropped, and its RSS at the end.
//!
//! The idle connections are spread over loopback source addresses (127.0.0.2
//! upward) and this process's open-file limit is raised first, so neither the
//! client's ports or descriptors nor a relay's per-IP caps decide the result.
//! Each idle connection sends all its REQs as soon as it is open, as a client
//! opening its subscriptions on connect does; only the connecting is limited
//! to `CONNECT_PARALLELISM` at once. Everything an idle connection receives
//! is counted until the run stops it: answers, CLOSEDs after the EOSE, events
//! (there should be none), notices, and a close or error, which counts the
//! connection as dropped.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::convert::Infallible;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

use crate::driver::close_reason;
use crate::fanout::{Fanout, FanoutArgs, FanoutFigures};
use crate::metrics;
use crate::report::RunInfo;
use crate::rng::Rng;
use crate::stats::{Examples, PrefixCounts};
use crate::wire::{self, FdLimit, Incoming, RelayUrl, Ws};

/// Idle connections being opened at once.
const CONNECT_PARALLELISM: usize = 64;
/// Descriptors this process needs besides one per idle connection.
const FD_HEADROOM: u64 = 64;
/// How long closing an idle connection at the end may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, clap::Args)]
pub struct AudienceArgs {
    pub relay: String,
    /// Idle connections, each with `--reqs-per-idle` subscriptions that never match.
    #[arg(long, default_value_t = 1000)]
    pub idle: usize,
    /// Subscriptions per idle connection, each `{"authors":[<random pubkey>]}`.
    #[arg(long, default_value_t = 10)]
    pub reqs_per_idle: usize,
    /// Events per second from the one publisher.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 20.0)]
    pub duration_secs: f64,
    /// Content bytes per event.
    #[arg(long, default_value_t = 200)]
    pub content_bytes: usize,
    /// The relay's process id: its CPU time and RSS are read from /proc.
    #[arg(long)]
    pub relay_pid: Option<u32>,
    /// Loopback source addresses the idle connections are spread over, from
    /// 127.0.0.2 upward (at most 253); 0 connects from the default address.
    #[arg(long, default_value_t = wire::MAX_LOOPBACK_SPREAD)]
    pub source_addrs: usize,
    /// How long an idle connection waits for the answers to its REQs.
    #[arg(long, default_value_t = 60_000)]
    pub answer_timeout_ms: u64,
    /// Pause between the last idle answer and publishing; the relay's CPU
    /// over it is reported as its idle load.
    #[arg(long, default_value_t = 2.0)]
    pub settle_secs: f64,
    /// How long to wait for the last deliveries after publishing ends.
    #[arg(long, default_value_t = 5_000)]
    pub drain_ms: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct AudienceReport {
    pub run: RunInfo,
    pub idle_connections: usize,
    pub reqs_per_idle: usize,
    /// Where the idle connections came from, in turn; empty: the default address.
    pub source_addrs: Vec<IpAddr>,
    /// This process's open-file limit, raised before connecting.
    pub fd_limit: FdLimit,
    pub relay_pid: Option<u32>,
    pub idle: IdleReport,
    /// The relay's CPU over the settle pause (everything open, nothing
    /// published), in cores.
    pub relay_idle_cpu_cores: Option<f64>,
    /// From just before the first event to the watcher's last delivery (or
    /// the end of the drain).
    pub publish_window_secs: f64,
    pub relay_cpu_secs: Option<f64>,
    /// Relay CPU over the publish window per event accepted.
    pub relay_cpu_ms_per_event: Option<f64>,
    /// VmRSS at the end of the publish window, idle connections still open.
    pub relay_rss_bytes_end: Option<u64>,
    /// The publisher and the watcher (one subscriber).
    pub watcher: FanoutFigures,
}

/// What the idle connections saw.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct IdleReport {
    pub opened: u64,
    pub connect_failed: u64,
    pub connect_errors: PrefixCounts,
    /// From the first connect to the last REQ answered (or given up).
    pub open_secs: f64,
    pub reqs_sent: u64,
    pub eose: u64,
    pub closed: u64,
    /// CLOSED answers by message prefix.
    pub closed_prefixes: PrefixCounts,
    /// The first CLOSED message of each prefix.
    pub closed_examples: Examples,
    /// REQs without an answer within the timeout, or whose connection dropped first.
    pub unanswered: u64,
    /// CLOSEDs for subscriptions that had their EOSE.
    pub closed_later: u64,
    /// Events received on idle subscriptions (they match nothing: should be 0).
    pub events: u64,
    pub notices: PrefixCounts,
    /// Idle connections closed by the relay or failed, from open to the end.
    pub dropped: u64,
    /// Of those, dropped in the publish window.
    pub dropped_during_publish: u64,
    pub dropped_reasons: PrefixCounts,
}

impl IdleReport {
    fn dropped(&mut self, reason: &str) {
        self.dropped += 1;
        self.dropped_reasons.add_key(reason);
    }
}

/// Subscription id of an idle connection's `i`th REQ.
fn sub_id(i: usize) -> String {
    format!("idle{i}")
}

/// One idle connection's subscriptions still waiting for EOSE or CLOSED.
struct Waiting(HashSet<String>);

impl Waiting {
    fn new(reqs: usize) -> Waiting {
        Waiting((0..reqs).map(sub_id).collect())
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Counts one relay message.
    fn on(&mut self, m: Incoming, t: &mut IdleReport) {
        match m {
            Incoming::Eose { sub } => {
                if self.0.remove(&sub) {
                    t.eose += 1;
                }
            }
            Incoming::Closed { sub, message } if self.0.remove(&sub) => {
                t.closed += 1;
                t.closed_prefixes.add(&message);
                t.closed_examples.add(&message);
            }
            Incoming::Closed { .. } => t.closed_later += 1,
            Incoming::Event { .. } => t.events += 1,
            Incoming::Notice { message } => t.notices.add(&message),
            Incoming::Ok { .. } | Incoming::Other => {}
        }
    }

    /// Counts every subscription still waiting as unanswered.
    fn give_up(&mut self, t: &mut IdleReport) {
        t.unanswered += self.0.len() as u64;
        self.0.clear();
    }
}

/// The source address of idle connection `i`: the addresses in turn.
fn source_for(addrs: &[IpAddr], i: usize) -> Option<IpAddr> {
    (!addrs.is_empty()).then(|| addrs[i % addrs.len()])
}

/// Random authors that never publish: one filter per idle REQ.
fn idle_filters(rng: &mut Rng, reqs: usize) -> Vec<serde_json::Value> {
    (0..reqs)
        .map(|_| json!({"authors": [hex::encode(rng.bytes32())]}))
        .collect()
}

pub async fn run(args: &AudienceArgs) -> anyhow::Result<AudienceReport> {
    let relay = RelayUrl::parse(&args.relay)?;
    let mut run = RunInfo::new("audience", Some(&args.relay));
    if let Some(pid) = args.relay_pid {
        metrics::proc_cpu_secs(pid).with_context(|| format!("--relay-pid {pid}"))?;
    }
    let fd_limit = wire::raise_fd_limit().context("raising the open-file limit")?;
    if args.idle as u64 + FD_HEADROOM > fd_limit.soft {
        eprintln!(
            "audience: {} idle connections need more descriptors than this process's limit ({}): \
             connections past it will fail",
            args.idle, fd_limit.soft
        );
    }
    let source_addrs = wire::loopback_spread(args.source_addrs)?;
    let relay_cpu = || args.relay_pid.and_then(|p| metrics::proc_cpu_secs(p).ok());

    // The watcher first, so the crowd's REQs cannot crowd it out.
    let mut fanout = Fanout::subscribe(&FanoutArgs {
        relay: args.relay.clone(),
        subscribers: 1,
        publishers: 1,
        rate: args.rate,
        duration_secs: args.duration_secs,
        content_bytes: args.content_bytes,
        drain_ms: args.drain_ms,
        seed: args.seed,
        json: None,
        publish_to: None,
    })
    .await?;
    let crowd = Crowd::open(&relay, args, &source_addrs).await;

    let settle = Duration::from_secs_f64(args.settle_secs);
    let idle_start = relay_cpu();
    tokio::time::sleep(settle).await;
    let idle_end = relay_cpu();
    let relay_idle_cpu_cores = idle_start
        .zip(idle_end)
        .filter(|_| !settle.is_zero())
        .map(|(a, b)| (b - a) / settle.as_secs_f64());

    let dropped_before = crowd.dropped();
    let (started, cpu_start) = (Instant::now(), relay_cpu());
    let publish = fanout.publish().await;
    let (publish_window, cpu_end) = (started.elapsed(), relay_cpu());
    let relay_rss_bytes_end = args
        .relay_pid
        .and_then(|p| metrics::proc_memory(p).ok())
        .map(|m| m.rss_bytes);
    let dropped_after = crowd.dropped();
    let mut idle = crowd.close().await;
    idle.dropped_during_publish = dropped_after - dropped_before;
    let relay_cpu_secs = cpu_start.zip(cpu_end).map(|(a, b)| b - a);
    let relay_cpu_ms_per_event = relay_cpu_secs
        .filter(|_| publish.accepted > 0)
        .map(|s| s * 1000.0 / publish.accepted as f64);
    let watcher = fanout.finish(publish).await;
    run.finish();
    Ok(AudienceReport {
        run,
        idle_connections: args.idle,
        reqs_per_idle: args.reqs_per_idle,
        source_addrs,
        fd_limit,
        relay_pid: args.relay_pid,
        idle,
        relay_idle_cpu_cores,
        publish_window_secs: publish_window.as_secs_f64(),
        relay_cpu_secs,
        relay_cpu_ms_per_event,
        relay_rss_bytes_end,
        watcher,
    })
}

/// The idle connections: their tasks, their shared tally, and the signal
/// that ends them.
struct Crowd {
    tally: Arc<Mutex<IdleReport>>,
    handles: Vec<tokio::task::JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl Crowd {
    /// Opens every idle connection and sends its REQs; returns once each
    /// connection has every answer, gave up waiting, or failed.
    async fn open(relay: &RelayUrl, args: &AudienceArgs, source_addrs: &[IpAddr]) -> Crowd {
        let started = Instant::now();
        let tally = Arc::new(Mutex::new(IdleReport::default()));
        let (stop, stop_rx) = watch::channel(false);
        let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
        // Nothing is ever sent: each connection drops its sender once it is
        // ready, and `recv` returns `None` when every sender is gone (also
        // if a task panicked).
        let (ready_tx, mut ready_rx) = mpsc::channel::<Infallible>(1);
        let mut rng = Rng::new(args.seed ^ 0x1d1e);
        let handles = (0..args.idle)
            .map(|i| {
                let conn = IdleConnection {
                    relay: relay.clone(),
                    bind: source_for(source_addrs, i),
                    filters: idle_filters(&mut rng, args.reqs_per_idle),
                    answer_timeout: Duration::from_millis(args.answer_timeout_ms),
                    tally: tally.clone(),
                    gate: gate.clone(),
                    ready: Some(ready_tx.clone()),
                    stop: stop_rx.clone(),
                };
                tokio::spawn(conn.run())
            })
            .collect();
        drop(ready_tx);
        let _ = ready_rx.recv().await;
        tally.lock().open_secs = started.elapsed().as_secs_f64();
        Crowd {
            tally,
            handles,
            stop,
        }
    }

    fn dropped(&self) -> u64 {
        self.tally.lock().dropped
    }

    /// Closes every idle connection and returns the tally (a connection is
    /// no longer counted as dropped once the stop is sent).
    async fn close(self) -> IdleReport {
        self.stop.send(true).ok();
        for h in self.handles {
            let _ = h.await;
        }
        self.tally.lock().clone()
    }
}

struct IdleConnection {
    relay: RelayUrl,
    bind: Option<IpAddr>,
    filters: Vec<serde_json::Value>,
    answer_timeout: Duration,
    tally: Arc<Mutex<IdleReport>>,
    gate: Arc<Semaphore>,
    /// Dropped once every REQ is answered, given up on, or the connection failed.
    ready: Option<mpsc::Sender<Infallible>>,
    stop: watch::Receiver<bool>,
}

impl IdleConnection {
    async fn run(mut self) {
        let ws = {
            let _permit = self.gate.acquire().await.expect("gate is never closed");
            wire::connect(&self.relay, self.bind).await
        };
        let mut ws = match ws {
            Ok(ws) => ws,
            Err(e) => {
                let mut t = self.tally.lock();
                t.connect_failed += 1;
                t.connect_errors.add_key(&format!("{}", e.root_cause()));
                return;
            }
        };
        self.tally.lock().opened += 1;
        let mut waiting = Waiting::new(self.filters.len());
        if let Err(e) = self.subscribe(&mut ws).await {
            let mut t = self.tally.lock();
            waiting.give_up(&mut t);
            t.dropped(&format!("send: {e}"));
            return;
        }
        if self.listen(&mut ws, &mut waiting).await {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, ws.close(None)).await;
        }
    }

    async fn subscribe(&self, ws: &mut Ws) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        for (i, f) in self.filters.iter().enumerate() {
            ws.feed(wire::req(&sub_id(i), f)).await?;
        }
        ws.flush().await?;
        self.tally.lock().reqs_sent += self.filters.len() as u64;
        Ok(())
    }

    /// Counts what arrives until the stop (returns true) or until the relay
    /// closes the connection or it fails (counted as dropped; returns false).
    async fn listen(&mut self, ws: &mut Ws, waiting: &mut Waiting) -> bool {
        let deadline = tokio::time::Instant::now() + self.answer_timeout;
        loop {
            if waiting.is_empty() {
                self.ready = None;
            }
            let m = tokio::select! {
                m = ws.next() => m,
                _ = tokio::time::sleep_until(deadline), if self.ready.is_some() => {
                    waiting.give_up(&mut self.tally.lock());
                    continue;
                }
                _ = self.stop.changed() => {
                    waiting.give_up(&mut self.tally.lock());
                    return true;
                }
            };
            let dropped = match m {
                Some(Ok(Message::Close(frame))) => close_reason(frame.as_ref()),
                Some(Ok(m)) => {
                    if let Some(incoming) = Incoming::from_message(&m) {
                        waiting.on(incoming, &mut self.tally.lock());
                    }
                    continue;
                }
                Some(Err(e)) => format!("receive: {e}"),
                None => "closed by relay".to_owned(),
            };
            let mut t = self.tally.lock();
            waiting.give_up(&mut t);
            t.dropped(&dropped);
            return false;
        }
    }
}

impl AudienceReport {
    pub fn print(&self) {
        let spread = if self.source_addrs.is_empty() {
            "the default address".to_owned()
        } else {
            format!("{} source addresses", self.source_addrs.len())
        };
        println!(
            "audience: {} {} idle connections x {} REQs (from {spread}), 1 publisher at {:.0}/s for {:.1} s, 1 watcher",
            self.run.relay.as_deref().unwrap_or("?"),
            self.idle_connections,
            self.reqs_per_idle,
            self.watcher.target_rate,
            self.watcher.duration_secs,
        );
        let i = &self.idle;
        println!(
            "  idle: opened {} ({} failed{}) in {:.1} s; REQs {}: EOSE {}, CLOSED {} ({}), unanswered {}",
            i.opened,
            i.connect_failed,
            if i.connect_failed > 0 {
                format!(": {}", i.connect_errors)
            } else {
                String::new()
            },
            i.open_secs,
            i.reqs_sent,
            i.eose,
            i.closed,
            i.closed_prefixes,
            i.unanswered
        );
        println!(
            "  idle: dropped {} ({} while publishing){}; later CLOSED {}, events {}, notices {}",
            i.dropped,
            i.dropped_during_publish,
            if i.dropped > 0 {
                format!(": {}", i.dropped_reasons)
            } else {
                String::new()
            },
            i.closed_later,
            i.events,
            i.notices
        );
        for m in i.closed_examples.0.values() {
            println!("    e.g. CLOSED {m:?}");
        }
        match (self.relay_pid, self.relay_cpu_secs) {
            (Some(pid), Some(cpu)) => println!(
                "  relay pid {pid}: CPU {cpu:.2} s over {:.1} s of publishing = {} ms/event; idle {} cores; RSS at the end {}",
                self.publish_window_secs,
                self.relay_cpu_ms_per_event
                    .map_or("n/a".to_owned(), |v| format!("{v:.3}")),
                self.relay_idle_cpu_cores
                    .map_or("n/a".to_owned(), |v| format!("{v:.3}")),
                self.relay_rss_bytes_end
                    .map_or("n/a".to_owned(), |v| format!("{:.1} MB", v as f64 / 1e6)),
            ),
            _ => println!("  relay CPU and memory not measured (give --relay-pid)"),
        }
        self.watcher.print("  ");
        println!("  {}", self.run.cpu_line());
    }
}

#[cfg(test)]
mod tests;
