//! `fanout`: M subscribers hold one live subscription each while P
//! publishers send fresh events that match it at a fixed total rate; reports
//! deliveries per second and publish-to-delivery latency.
//!
//! Events are signed before the run and tagged with a tag unique to the run,
//! so only this run's events match. Latency runs from each event's due time
//! on the open-loop schedule (known to every subscriber from the event's
//! index), so a slow publisher cannot hide delivery delay.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::driver::{PublisherConfig, Shared, Tally, TallyReport, Totals, run_publisher};
use crate::generate::{Spec, sign_parallel, text_of_len};
use crate::report::{RunInfo, unix_now};
use crate::rng::Rng;
use crate::source::{Phase, Schedule, Source};
use crate::stats::{Histogram, LatencySummary, per_sec};
use crate::wire::{self, Incoming, Prepared, RelayUrl, Ws};

/// Connections opened at once while setting up subscribers.
const CONNECT_PARALLELISM: usize = 64;
/// Latencies a subscriber buffers before merging them into the shared histogram.
const LATENCY_BATCH: usize = 1024;

#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    pub relay: String,
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    #[arg(long, default_value_t = 2)]
    pub publishers: usize,
    /// Events per second, all publishers together.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// Content bytes per event.
    #[arg(long, default_value_t = 200)]
    pub content_bytes: usize,
    /// How long to wait for the last deliveries after publishing ends.
    #[arg(long, default_value_t = 5_000)]
    pub drain_ms: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Publish to this relay instead (another node of a Sluice cluster:
    /// the latency is then publish on one node to delivery on the other).
    #[arg(long)]
    pub publish_to: Option<String>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct FanoutReport {
    pub run: RunInfo,
    #[serde(flatten)]
    pub figures: FanoutFigures,
}

/// What a fan-out run measured (the report without its header), also part
/// of other scenarios' reports.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct FanoutFigures {
    pub subscribers: usize,
    pub subscribers_ready: usize,
    pub publishers: usize,
    pub target_rate: f64,
    pub duration_secs: f64,
    pub publish: TallyReport,
    pub expected_deliveries: u64,
    pub deliveries: u64,
    pub delivery_ratio: f64,
    /// Deliveries over the time from the first due event to the last delivery.
    pub deliveries_per_sec: f64,
    pub delivery_latency: LatencySummary,
}

/// State the subscribers share.
struct Deliveries {
    /// Event id to its index on the schedule.
    index: HashMap<[u8; 32], u64>,
    schedule: Schedule,
    /// Time zero of the schedule, set once every subscriber is ready.
    t0: OnceLock<Instant>,
    count: AtomicU64,
    latency: Mutex<Histogram>,
    last: Mutex<Option<Instant>>,
}

impl Deliveries {
    /// The latency of one delivery, if the event is one of ours.
    fn latency_of(&self, id: &[u8; 32], now: Instant) -> Option<u64> {
        let seq = *self.index.get(id)?;
        let due = *self.t0.get()? + self.schedule.due(seq)?;
        Some(now.saturating_duration_since(due).as_micros() as u64)
    }

    fn flush(&self, batch: &mut Vec<u64>) {
        let mut h = self.latency.lock().expect("latency lock");
        for v in batch.drain(..) {
            h.record(v);
        }
    }
}

pub async fn run(args: &FanoutArgs) -> anyhow::Result<FanoutReport> {
    let mut run = RunInfo::new("fanout", Some(&args.relay));
    let mut fanout = Fanout::subscribe(args).await?;
    let publish = fanout.publish().await;
    let figures = fanout.finish(publish).await;
    run.finish();
    Ok(FanoutReport { run, figures })
}

/// A fan-out run in its steps, so another scenario can act and measure
/// between them: `subscribe` (sign, open every subscriber), `publish`
/// (publish on the schedule, wait for the deliveries), `finish` (close the
/// subscribers, sum up).
pub struct Fanout {
    args: FanoutArgs,
    publish_relay: RelayUrl,
    events: Vec<Prepared>,
    schedule: Schedule,
    deliveries: Arc<Deliveries>,
    handles: Vec<tokio::task::JoinHandle<()>>,
    ready: usize,
    stop: watch::Sender<bool>,
}

impl Fanout {
    /// Signs the events (before any clock starts) and opens every
    /// subscriber; returns once each has its EOSE or failed.
    pub async fn subscribe(args: &FanoutArgs) -> anyhow::Result<Fanout> {
        let relay = RelayUrl::parse(&args.relay)?;
        let publish_relay = match &args.publish_to {
            Some(url) => RelayUrl::parse(url)?,
            None => relay.clone(),
        };
        let tag = format!("sluice-bench-fanout-{}-{}", unix_now(), args.seed);
        let events = sign_events(args, &tag);
        if events.is_empty() {
            bail!("rate x duration gives no events");
        }
        let schedule = Schedule::Open(vec![Phase {
            rate: args.rate,
            secs: args.duration_secs,
        }]);
        let deliveries = Arc::new(Deliveries {
            index: events
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id, i as u64))
                .collect(),
            schedule: schedule.clone(),
            t0: OnceLock::new(),
            count: 0.into(),
            latency: Mutex::default(),
            last: Mutex::default(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let (handles, ready) = subscribe_all(&relay, args, &tag, &deliveries, stop_rx).await;
        Ok(Fanout {
            args: args.clone(),
            publish_relay,
            events,
            schedule,
            deliveries,
            handles,
            ready,
            stop,
        })
    }

    /// Publishes every event on the open-loop schedule (time zero 100 ms
    /// from now), then waits until every ready subscriber has every accepted
    /// event or `drain_ms` passes without a delivery. The subscribers stay open.
    pub async fn publish(&mut self) -> Tally {
        let t0 = Instant::now() + Duration::from_millis(100);
        self.deliveries.t0.set(t0).expect("t0 is set once");
        let events = std::mem::take(&mut self.events);
        let publish = publish_all(
            &self.publish_relay,
            &self.args,
            events,
            self.schedule.clone(),
            t0,
        )
        .await;
        let expected = publish.accepted * self.ready as u64;
        wait_for(
            &self.deliveries,
            expected,
            Duration::from_millis(self.args.drain_ms),
        )
        .await;
        publish
    }

    /// Closes the subscribers and sums up the run.
    pub async fn finish(self, publish: Tally) -> FanoutFigures {
        self.stop.send(true).ok();
        for h in self.handles {
            let _ = h.await;
        }
        let d = &self.deliveries;
        let elapsed = match (d.t0.get(), *d.last.lock().expect("last lock")) {
            (Some(t0), Some(last)) => last.saturating_duration_since(*t0),
            _ => Duration::ZERO,
        };
        let expected = publish.accepted * self.ready as u64;
        let count = d.count.load(Ordering::Relaxed);
        let args = &self.args;
        FanoutFigures {
            subscribers: args.subscribers,
            subscribers_ready: self.ready,
            publishers: args.publishers,
            target_rate: args.rate,
            duration_secs: args.duration_secs,
            publish: publish.report(args.duration_secs),
            expected_deliveries: expected,
            deliveries: count,
            delivery_ratio: if expected == 0 {
                0.0
            } else {
                count as f64 / expected as f64
            },
            deliveries_per_sec: per_sec(count, elapsed.as_secs_f64()),
            delivery_latency: d.latency.lock().expect("latency lock").summary(),
        }
    }
}

fn sign_events(args: &FanoutArgs, tag: &str) -> Vec<Prepared> {
    let n = (args.rate * args.duration_secs).floor().max(0.0) as usize;
    let mut rng = Rng::new(args.seed);
    let keys: Vec<[u8; 32]> = (0..args.publishers.max(1))
        .map(|_| rng.secret_key())
        .collect();
    let now = unix_now();
    let specs: Vec<Spec> = (0..n)
        .map(|i| Spec {
            secret_key: keys[i % keys.len()],
            created_at: now,
            kind: 1,
            tags: vec![vec!["t".into(), tag.into()]],
            content: text_of_len(&mut rng, args.content_bytes),
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    sign_parallel(specs, threads)
        .iter()
        .map(|e| Prepared::from_raw(e.raw()).expect("signed events have ids"))
        .collect()
}

/// Opens every subscriber and waits until each has its EOSE (or failed).
/// Returns the tasks and how many are ready.
async fn subscribe_all(
    relay: &RelayUrl,
    args: &FanoutArgs,
    tag: &str,
    deliveries: &Arc<Deliveries>,
    stop: watch::Receiver<bool>,
) -> (Vec<tokio::task::JoinHandle<()>>, usize) {
    let gate = Arc::new(Semaphore::new(CONNECT_PARALLELISM));
    let m = args.subscribers.max(1);
    // Each subscriber reports once, so the channel never holds more than `m`.
    let (ready_tx, mut ready_rx) = mpsc::channel(m);
    // No `limit: 0`: nostr-rs-relay 0.8.12 never sends EOSE for it. The tag
    // is unique to this run, so the stored-events part is empty anyway.
    let filter = json!({"kinds": [1], "#t": [tag]});
    let handles = (0..m)
        .map(|_| {
            let sub = Subscriber {
                relay: relay.clone(),
                filter: filter.clone(),
                deliveries: deliveries.clone(),
                gate: gate.clone(),
                ready: ready_tx.clone(),
                stop: stop.clone(),
            };
            tokio::spawn(sub.run())
        })
        .collect();
    let mut ready = 0;
    for _ in 0..m {
        if ready_rx.recv().await == Some(true) {
            ready += 1;
        }
    }
    (handles, ready)
}

struct Subscriber {
    relay: RelayUrl,
    filter: serde_json::Value,
    deliveries: Arc<Deliveries>,
    gate: Arc<Semaphore>,
    ready: mpsc::Sender<bool>,
    stop: watch::Receiver<bool>,
}

impl Subscriber {
    async fn run(mut self) {
        let ws = {
            let _permit = self.gate.acquire().await.expect("gate is never closed");
            self.open().await
        };
        let Some(mut ws) = ws else {
            let _ = self.ready.send(false).await;
            return;
        };
        let _ = self.ready.send(true).await;
        self.listen(&mut ws).await;
        let _ = ws.close(None).await;
    }

    /// Connects and subscribes; `None` if either fails or EOSE never comes.
    async fn open(&self) -> Option<Ws> {
        let mut ws = wire::connect(&self.relay, None).await.ok()?;
        ws.send(wire::req("fanout", &self.filter)).await.ok()?;
        let eose = async {
            while let Some(Ok(m)) = ws.next().await {
                match Incoming::from_message(&m) {
                    Some(Incoming::Eose { .. }) => return true,
                    Some(Incoming::Closed { .. }) => return false,
                    _ => {}
                }
            }
            false
        };
        let ok = tokio::time::timeout(Duration::from_secs(30), eose)
            .await
            .unwrap_or(false);
        ok.then_some(ws)
    }

    async fn listen(&mut self, ws: &mut Ws) {
        let mut batch = Vec::with_capacity(LATENCY_BATCH);
        loop {
            tokio::select! {
                m = ws.next() => match m {
                    Some(Ok(m)) => self.on_message(&m, &mut batch),
                    _ => break,
                },
                _ = self.stop.changed() => break,
            }
            if batch.len() >= LATENCY_BATCH {
                self.deliveries.flush(&mut batch);
            }
        }
        self.deliveries.flush(&mut batch);
    }

    fn on_message(&self, m: &tokio_tungstenite::tungstenite::Message, batch: &mut Vec<u64>) {
        let Some(Incoming::Event { id, .. }) = Incoming::from_message(m) else {
            return;
        };
        let now = Instant::now();
        if let Some(us) = self.deliveries.latency_of(&id, now) {
            batch.push(us);
            self.deliveries.count.fetch_add(1, Ordering::Relaxed);
            *self.deliveries.last.lock().expect("last lock") = Some(now);
        }
    }
}

async fn publish_all(
    relay: &RelayUrl,
    args: &FanoutArgs,
    events: Vec<Prepared>,
    schedule: Schedule,
    t0: Instant,
) -> Tally {
    let limit = events.len() as u64;
    let totals = Arc::new(Totals::default());
    let shared = Shared {
        source: Arc::new(Source::pool(events, limit)),
        schedule: Arc::new(schedule),
        recorder: totals.clone(),
        t0,
    };
    let cfg = PublisherConfig {
        relay: relay.clone(),
        bind: None,
        window: 1,
        max_inflight: 10_000,
        timeout: Duration::from_secs(10),
        stop_at: t0 + Duration::from_secs_f64(args.duration_secs + 1.0),
    };
    let tasks: Vec<_> = (0..args.publishers.max(1))
        .map(|_| tokio::spawn(run_publisher(cfg.clone(), shared.clone())))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    totals.snapshot().0
}

/// Waits until `expected` deliveries arrived or `drain` passed without progress.
async fn wait_for(d: &Deliveries, expected: u64, drain: Duration) {
    let mut last_seen = (d.count.load(Ordering::Relaxed), Instant::now());
    loop {
        let n = d.count.load(Ordering::Relaxed);
        if n >= expected {
            return;
        }
        if n != last_seen.0 {
            last_seen = (n, Instant::now());
        } else if last_seen.1.elapsed() >= drain {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl FanoutReport {
    pub fn print(&self) {
        println!(
            "fanout: {} {} subscribers ({} ready), {} publishers at {:.0}/s for {:.1} s",
            self.run.relay.as_deref().unwrap_or("?"),
            self.figures.subscribers,
            self.figures.subscribers_ready,
            self.figures.publishers,
            self.figures.target_rate,
            self.figures.duration_secs
        );
        self.figures.print("  ");
        println!("  {}", self.run.cpu_line());
    }
}

impl FanoutFigures {
    /// The publish and delivery lines of a summary.
    pub fn print(&self, indent: &str) {
        self.publish.print(&format!("{indent}publish: "));
        println!(
            "{indent}deliveries {} of {} expected ({:.1}%), {:.0}/s",
            self.deliveries,
            self.expected_deliveries,
            self.delivery_ratio * 100.0,
            self.deliveries_per_sec
        );
        println!(
            "{indent}publish-to-delivery latency: {}",
            self.delivery_latency
        );
    }
}
