//! `soak`: "years" of traffic compressed into minutes, to show that a relay
//! with a retention size target keeps running. Writers publish fresh signed
//! events as fast as the relay answers (closed loop, `--window` EVENTs
//! awaiting OK each) until `--bytes` of JSON or `--events` are offered,
//! several times the store's size target; `created_at` runs over
//! `--span-days`, mostly increasing with jitter and backfill, so events
//! arrive out of order as after a sync (see `mix`). Beside them, polite
//! clients publish one event every `--polite-interval-ms` each and measure
//! the OK latency (open loop, from the due time).
//!
//! Every `--sample-ms` a sample records the interval's answers (accepted,
//! refused by prefix, polite p50/p99) and the relay's store and retention
//! series from /metrics, each `None` where the relay has no such series
//! (any relay works; see `summary`). At the end two checks over REQ (see
//! `check`): the newest `--check-newest` accepted events are still stored,
//! and so is every accepted event of the exempt authors (the first
//! `--exempt-authors` keys, printed at the start and by `--print-exempt`
//! for the relay's `retention.exempt_pubkeys`). `plot` draws the report.
//!
//! Events are signed during the run by a generator thread (`--sign-threads`
//! signing threads) a bounded channel ahead of the writers, so the client's
//! signing shares the machine with the relay: the report gives the client's
//! CPU time. Ctrl-C stops generating; what is in flight is answered and the
//! checks run; a second Ctrl-C quits at once.

mod check;
mod ledger;
pub mod mix;
pub mod summary;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use sluice_proto::Event;
use tokio::sync::{mpsc, watch};

pub use check::StoredCheck;
use ledger::{ClassTally, SoakRecorder, Tracker};
use mix::{Budget, Meta, Mix, TimeSchedule, exempt_pubkeys, parse_count, parse_size, prepared};
use summary::{
    RelayFigures, SampleStats, SoakSample, derive_rates, kinds_json, mib, refusal_split,
    relay_figures, sample_stats,
};

use crate::connections::loopback_source;
use crate::driver::{PublisherConfig, Recorder, Shared, Tally, TallyReport, run_publisher};
use crate::generate::{Spec, sign_parallel};
use crate::metrics;
use crate::report::{RunInfo, unix_now};
use crate::source::{Phase, Schedule, Source};
use crate::stats::{Examples, LatencySummary, PrefixCounts};
use crate::wire::{Prepared, RelayUrl};

/// Events signed per batch by the generator thread.
const BATCH_EVENTS: usize = 256;
/// Signed events waiting for a writer, at most.
const GEN_AHEAD_EVENTS: usize = 4096;
/// Samples kept at most; later ones are dropped and counted.
const MAX_SAMPLES: usize = 500_000;
/// How long the run may last without `--max-secs`.
const FOREVER_SECS: f64 = 365.0 * 86_400.0;
/// Each check's REQ waits this long for its EOSE.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// Loopback address classes (127.C.x.y) of writers, polite clients and checks.
const WRITER_IPS: u8 = 5;
const POLITE_IPS: u8 = 6;
const CHECK_IPS: u8 = 7;

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

/// The run's settings, as written to JSON.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Settings {
    pub budget: Budget,
    pub writers: usize,
    pub window: usize,
    pub polite: usize,
    pub polite_interval_ms: u64,
    pub authors: usize,
    pub exempt_authors: usize,
    pub span_days: f64,
    pub schedule: TimeSchedule,
    pub sample_ms: u64,
    pub target_mb: Option<f64>,
    pub check_newest: usize,
    pub sign_threads: usize,
    pub timeout_ms: u64,
    pub max_secs: Option<f64>,
    pub distinct_source_ips: bool,
    pub seed: u64,
}

/// How the relay's /metrics answered.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ScrapeStatus {
    pub url: Option<String>,
    pub scrapes: u64,
    pub failures: u64,
    pub last_error: Option<String>,
    /// Which of the soak's series the relay had at least once.
    pub series_seen: Vec<String>,
}

/// The run in figures.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Summary {
    /// From the start to the last writer's last answer.
    pub ingest_secs: f64,
    pub offered_events: u64,
    pub offered_bytes: u64,
    pub accepted_events: u64,
    pub accepted_bytes: u64,
    /// Accepted with `duplicate:`.
    pub duplicates: u64,
    /// accepted / offered.
    pub acceptance: f64,
    pub accepted_per_sec: f64,
    pub accepted_mib_per_sec: f64,
    pub refused: u64,
    pub rate_limited: u64,
    /// `error:` answers: 0 in a healthy run.
    pub error_answers: u64,
    pub blocked: u64,
    pub other_refused: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub connection_errors: u64,
    pub refused_by_prefix: PrefixCounts,
    pub refusal_examples: Examples,
    pub polite_offered: u64,
    pub polite_accepted: u64,
    /// Polite EVENTs accepted / offered.
    pub polite_success: f64,
    pub polite_ok: LatencySummary,
    /// `--target-mb` in bytes.
    pub target_bytes: Option<f64>,
    #[serde(flatten)]
    pub samples: SampleStats,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Checks {
    /// The newest accepted events (highest created_at).
    pub newest: StoredCheck,
    /// Every accepted event of the exempt authors.
    pub exempt: StoredCheck,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Verdict {
    pub pass: bool,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SoakReport {
    pub run: RunInfo,
    pub settings: Settings,
    /// Hex pubkeys of the exempt authors.
    pub exempt_pubkeys: Vec<String>,
    /// Stopped early by Ctrl-C or --max-secs.
    pub stopped_early: bool,
    pub metrics: ScrapeStatus,
    pub samples: Vec<SoakSample>,
    pub samples_dropped: u64,
    pub summary: Summary,
    pub writers: TallyReport,
    pub polite: TallyReport,
    /// Accepted events by kind.
    pub accepted_kinds: BTreeMap<String, u64>,
    pub checks: Checks,
    pub verdict: Verdict,
}

/// The exempt pubkeys as a line for the relay's configuration.
pub fn exempt_toml(pubkeys: &[String]) -> String {
    let quoted: Vec<String> = pubkeys.iter().map(|p| format!("\"{p}\"")).collect();
    format!("exempt_pubkeys = [{}]", quoted.join(", "))
}

/// `--print-exempt`.
pub fn print_exempt(args: &SoakArgs) {
    println!(
        "{}",
        exempt_toml(&exempt_pubkeys(args.seed, args.exempt_authors))
    );
}

/// What the generator has produced so far.
#[derive(Default)]
struct Produced {
    events: AtomicU64,
    bytes: AtomicU64,
}

impl Produced {
    fn progress(&self, budget: &Budget) -> f64 {
        budget.progress(
            self.events.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed) as f64,
        )
    }
}

struct Generator {
    mix: Mix,
    budget: Budget,
    threads: usize,
    tx: mpsc::Sender<Prepared>,
    tracker: Arc<Tracker>,
    produced: Arc<Produced>,
    stop: Arc<AtomicBool>,
}

impl Generator {
    /// Signs batches and hands them to the writers until the budget is
    /// reached, `stop` is set, or the writers are gone.
    fn run(mut self) {
        let (mut events, mut bytes) = (0u64, 0u64);
        while !self.stop.load(Ordering::Relaxed) && !self.budget.reached(events, bytes) {
            let n = self.budget.events.map_or(BATCH_EVENTS, |max| {
                (max - events).min(BATCH_EVENTS as u64) as usize
            });
            let mut estimate = bytes as f64;
            let (specs, metas): (Vec<Spec>, Vec<Meta>) = (0..n)
                .map(|i| {
                    let p = self.budget.progress(events + i as u64, estimate);
                    let (spec, meta) = self.mix.spec(p);
                    estimate += f64::from(meta.bytes);
                    (spec, meta)
                })
                .unzip();
            let signed = sign_parallel(specs, self.threads);
            let mut batch = Vec::with_capacity(n);
            for (ev, mut meta) in signed.iter().zip(metas) {
                if self.budget.reached(events, bytes) {
                    break;
                }
                meta.bytes = ev.raw().len() as u32;
                self.mix.remember(ev);
                events += 1;
                bytes += u64::from(meta.bytes);
                batch.push((prepared(ev), meta));
            }
            self.tracker.expect(batch.iter().map(|(p, m)| (p.id, *m)));
            self.produced.events.store(events, Ordering::Relaxed);
            self.produced.bytes.store(bytes, Ordering::Relaxed);
            for (p, _) in batch {
                if self.tx.blocking_send(p).is_err() {
                    return; // the writers are gone
                }
            }
        }
    }
}

/// Feeds one polite client: a kind 1 note dated now (a person posting, not
/// a backfill), one at a time, until `done`.
async fn polite_producer(
    mut mix: Mix,
    tx: mpsc::Sender<Prepared>,
    tracker: Arc<Tracker>,
    produced: Arc<Produced>,
    budget: Budget,
    done: Arc<AtomicBool>,
) {
    while !done.load(Ordering::Relaxed) {
        let (spec, mut meta) = mix.spec(produced.progress(&budget));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        meta.created_at = now;
        let ev = Event::sign(&spec.secret_key, now, spec.kind, spec.tags, &spec.content);
        meta.bytes = ev.raw().len() as u32;
        mix.remember(&ev);
        let p = prepared(&ev);
        tracker.expect([(p.id, meta)]);
        if tx.send(p).await.is_err() {
            return;
        }
    }
}

/// First Ctrl-C: stop generating. Second: quit.
async fn watch_interrupt(stop: Arc<AtomicBool>) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    eprintln!(
        "soak: interrupted: no more events are generated; the events in flight are answered, \
         then the checks run (Ctrl-C again to quit now)"
    );
    stop.store(true, Ordering::Relaxed);
    if tokio::signal::ctrl_c().await.is_ok() {
        std::process::exit(130);
    }
}

struct Sampler {
    t0: Instant,
    every: Duration,
    writers: Arc<SoakRecorder>,
    polite: Arc<SoakRecorder>,
    metrics_url: Option<String>,
    progress_secs: u64,
    budget: Budget,
    produced: Arc<Produced>,
}

/// A sample from the interval's counts of both classes.
fn sample_of(t: f64, w: &ClassTally, p: &ClassTally, relay: RelayFigures) -> SoakSample {
    let mut prefixes = w.tally.refused_prefixes.clone();
    prefixes.merge(&p.tally.refused_prefixes);
    let (rate_limited, error, blocked, other_refused) = refusal_split(&prefixes);
    let (wt, pt) = (&w.tally, &p.tally);
    let lat = |q: f64| {
        (pt.accepted_latency.count() > 0).then(|| pt.accepted_latency.percentile(q) as f64 / 1e3)
    };
    SoakSample {
        t,
        sent: wt.sent + pt.sent,
        accepted: wt.accepted + pt.accepted,
        accepted_bytes: w.accepted_bytes + p.accepted_bytes,
        refused: wt.refused + pt.refused,
        rate_limited,
        error,
        blocked,
        other_refused,
        timeouts: wt.timeouts + pt.timeouts,
        lost: wt.lost + pt.lost,
        polite_sent: pt.sent,
        polite_accepted: pt.accepted,
        polite_answered: pt.accepted + pt.refused + pt.timeouts + pt.lost,
        polite_p50_ms: lat(0.5),
        polite_p99_ms: lat(0.99),
        relay,
        deletions_per_sec: None,
        retention_share: None,
    }
}

impl Sampler {
    async fn run(self, mut stop: watch::Receiver<bool>) -> (Vec<SoakSample>, u64, ScrapeStatus) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut status = ScrapeStatus {
            url: self.metrics_url.clone(),
            ..ScrapeStatus::default()
        };
        let (mut samples, mut dropped) = (Vec::new(), 0u64);
        let mut last_progress = 0u64;
        loop {
            let last = tokio::select! {
                _ = tick.tick() => false,
                _ = stop.changed() => true,
            };
            let t = self.t0.elapsed().as_secs_f64();
            let (w, p) = (self.writers.take_sample(), self.polite.take_sample());
            let relay = self.scrape(&mut status).await;
            let s = sample_of(t, &w, &p, relay);
            if samples.len() < MAX_SAMPLES {
                samples.push(s);
            } else {
                dropped += 1;
            }
            let secs = t as u64;
            if self.progress_secs > 0 && secs >= last_progress + self.progress_secs && !last {
                last_progress = secs;
                self.print_progress(t, &mut samples);
            }
            if last {
                return (samples, dropped, status);
            }
        }
    }

    async fn scrape(&self, status: &mut ScrapeStatus) -> RelayFigures {
        let Some(url) = &self.metrics_url else {
            return RelayFigures::default();
        };
        status.scrapes += 1;
        match metrics::http_get(url).await {
            Ok(page) => {
                let f = relay_figures(&page);
                for (name, v) in [
                    (summary::STORE_USED_BYTES, f.store_used_bytes),
                    (summary::STORE_FILE_BYTES, f.store_file_bytes),
                    (summary::STORE_EVENTS, f.store_events),
                    (summary::RETENTION_DELETED_TOTAL, f.retention_deleted_total),
                    (summary::RETENTION_SECONDS_TOTAL, f.retention_seconds_total),
                ] {
                    if v.is_some() && !status.series_seen.iter().any(|s| s == name) {
                        status.series_seen.push(name.to_owned());
                    }
                }
                f
            }
            Err(e) => {
                status.failures += 1;
                status.last_error = Some(format!("{e:#}"));
                RelayFigures::default()
            }
        }
    }

    fn print_progress(&self, t: f64, samples: &mut [SoakSample]) {
        let (w, p) = (self.writers.total(), self.polite.total());
        let accepted = w.tally.accepted + p.tally.accepted;
        let answered = accepted
            + w.tally.refused
            + p.tally.refused
            + w.tally.timeouts
            + p.tally.timeouts
            + w.tally.lost
            + p.tally.lost;
        let mut line = format!(
            "[{t:6.0} s] {:4.1}% generated; accepted {accepted} ({:.1}%), {}",
            100.0 * self.produced.progress(&self.budget),
            100.0 * accepted as f64 / answered.max(1) as f64,
            mib((w.accepted_bytes + p.accepted_bytes) as f64),
        );
        derive_rates(samples);
        let recent = &samples[samples.len().saturating_sub(10)..];
        if let Some(used) = recent.iter().rev().find_map(|s| s.relay.store_used_bytes) {
            line += &format!("; store used {}", mib(used));
        }
        if let Some(d) = summary::median(
            &recent
                .iter()
                .filter_map(|s| s.deletions_per_sec)
                .collect::<Vec<_>>(),
        ) {
            line += &format!(", deleting {d:.0}/s");
        }
        let worst = recent
            .iter()
            .filter_map(|s| s.polite_p99_ms)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        if let Some(p99) = worst {
            line += &format!("; polite p99 {p99:.1} ms");
        }
        eprintln!("{line}");
    }
}

pub async fn run(args: &SoakArgs) -> anyhow::Result<SoakReport> {
    let url = args.relay.as_deref().context("--url is required")?;
    let relay = RelayUrl::parse(url)?;
    let budget = Budget {
        events: args.events,
        bytes: args.bytes,
    };
    if budget.events.is_none() && budget.bytes.is_none() {
        bail!("give --bytes or --events: how much to ingest");
    }
    if args.authors == 0 || args.exempt_authors >= args.authors {
        bail!("--exempt-authors must be below --authors (the rest carry most of the load)");
    }
    if !(0.0..=1.0).contains(&args.backfill) || args.span_days.is_nan() || args.span_days <= 0.0 {
        bail!("--backfill must be in [0, 1] and --span-days positive");
    }
    let mut run = RunInfo::new("soak", Some(url));
    let schedule = TimeSchedule {
        end: unix_now(),
        span_secs: (args.span_days * 86_400.0) as u64,
        jitter_secs: args.jitter_secs,
        backfill: args.backfill,
    };
    let sign_threads = args
        .sign_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let settings = Settings {
        budget,
        writers: args.writers.max(1),
        window: args.window.max(1),
        polite: args.polite,
        polite_interval_ms: args.polite_interval_ms.max(1),
        authors: args.authors,
        exempt_authors: args.exempt_authors,
        span_days: args.span_days,
        schedule,
        sample_ms: args.sample_ms.max(10),
        target_mb: args.target_mb,
        check_newest: args.check_newest,
        sign_threads,
        timeout_ms: args.timeout_ms,
        max_secs: args.max_secs,
        distinct_source_ips: !args.same_source_ip && relay.host.starts_with("127."),
        seed: args.seed,
    };
    let exempt = exempt_pubkeys(args.seed, args.exempt_authors);
    let metrics_url = (!args.no_metrics).then(|| {
        args.metrics_url
            .clone()
            .unwrap_or_else(|| format!("{}/metrics", relay.http_base()))
    });
    print_start(url, &settings, &exempt);

    let tracker = Arc::new(Tracker::new(settings.check_newest));
    let writers_rec = Arc::new(SoakRecorder::new(tracker.clone()));
    let polite_rec = Arc::new(SoakRecorder::new(tracker.clone()));
    let produced = Arc::new(Produced::default());
    let stop = Arc::new(AtomicBool::new(false));
    let interrupt = tokio::spawn(watch_interrupt(stop.clone()));
    let (tx, rx) = mpsc::channel(GEN_AHEAD_EVENTS);
    let generator = Generator {
        mix: Mix::writers(args.seed, args.authors, args.exempt_authors, schedule),
        budget,
        threads: sign_threads,
        tx,
        tracker: tracker.clone(),
        produced: produced.clone(),
        stop: stop.clone(),
    };
    let generator = std::thread::spawn(move || generator.run());

    let t0 = Instant::now();
    let stop_at = t0 + Duration::from_secs_f64(args.max_secs.unwrap_or(FOREVER_SECS));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = Sampler {
        t0,
        every: Duration::from_millis(settings.sample_ms),
        writers: writers_rec.clone(),
        polite: polite_rec.clone(),
        metrics_url,
        progress_secs: args.progress_secs,
        budget,
        produced: produced.clone(),
    };
    let sampler = tokio::spawn(sampler.run(stop_rx));
    let cfg = |bind, window, max_inflight| PublisherConfig {
        relay: relay.clone(),
        bind,
        window,
        max_inflight,
        timeout: Duration::from_millis(args.timeout_ms),
        stop_at,
    };

    let shared = Shared {
        source: Arc::new(Source::channel(rx)),
        schedule: Arc::new(Schedule::ClosedLoop),
        recorder: writers_rec.clone() as Arc<dyn Recorder>,
        t0,
    };
    let writers: Vec<_> = (0..settings.writers)
        .map(|i| {
            let bind = settings
                .distinct_source_ips
                .then(|| loopback_source(WRITER_IPS, i));
            let c = cfg(bind, settings.window, settings.window);
            tokio::spawn(run_publisher(c, shared.clone()))
        })
        .collect();
    drop(shared); // the writers hold the only receivers: when they end, the generator does too

    let polite_done = Arc::new(AtomicBool::new(false));
    let polite: Vec<_> = (0..settings.polite)
        .map(|i| {
            let (ptx, prx) = mpsc::channel(1);
            let author = (args.authors + i) as u32;
            tokio::spawn(polite_producer(
                Mix::polite(args.seed, i, author, schedule),
                ptx,
                tracker.clone(),
                produced.clone(),
                budget,
                polite_done.clone(),
            ));
            let shared = Shared {
                source: Arc::new(Source::channel(prx)),
                schedule: Arc::new(Schedule::Open(vec![Phase {
                    rate: 1000.0 / settings.polite_interval_ms as f64,
                    secs: f64::INFINITY,
                }])),
                recorder: polite_rec.clone() as Arc<dyn Recorder>,
                t0,
            };
            let bind = settings
                .distinct_source_ips
                .then(|| loopback_source(POLITE_IPS, i));
            tokio::spawn(run_publisher(cfg(bind, 1, 1000), shared))
        })
        .collect();

    for w in writers {
        w.await?;
    }
    let ingest_secs = t0.elapsed().as_secs_f64();
    let stopped_early = stop.load(Ordering::Relaxed) || Instant::now() >= stop_at;
    stop.store(true, Ordering::Relaxed);
    polite_done.store(true, Ordering::Relaxed);
    for p in polite {
        p.await?;
    }
    stop_tx.send(true).ok();
    let (mut samples, samples_dropped, scrape_status) = sampler.await?;
    derive_rates(&mut samples);
    tokio::task::spawn_blocking(move || generator.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the generator thread panicked"))?;

    eprintln!("soak: ingest done in {ingest_secs:.1} s; checking what is stored...");
    let check_bind = settings
        .distinct_source_ips
        .then(|| loopback_source(CHECK_IPS, 0));
    let (newest, exempt_expected) = tracker.with_ledger(|l| (l.newest(), l.exempt()));
    let checks = Checks {
        newest: check::check_stored(
            &relay,
            check_bind,
            &newest.ids,
            newest.superseded,
            CHECK_TIMEOUT,
        )
        .await,
        exempt: check::check_stored(
            &relay,
            check_bind,
            &exempt_expected.ids,
            exempt_expected.superseded,
            CHECK_TIMEOUT,
        )
        .await,
    };
    let (w, p) = (writers_rec.total(), polite_rec.total());
    let summary = summarize(&w, &p, ingest_secs, &samples, args.target_mb);
    let verdict = verdict(&summary, &checks);
    run.finish();
    interrupt.abort();
    Ok(SoakReport {
        run,
        settings,
        exempt_pubkeys: exempt,
        stopped_early,
        metrics: scrape_status,
        samples,
        samples_dropped,
        summary,
        writers: w.tally.report(ingest_secs),
        polite: p.tally.report(ingest_secs),
        accepted_kinds: kinds_json(&tracker.with_ledger(|l| l.kinds())),
        checks,
        verdict,
    })
}

fn summarize(
    w: &ClassTally,
    p: &ClassTally,
    ingest_secs: f64,
    samples: &[SoakSample],
    target_mb: Option<f64>,
) -> Summary {
    let mut all = Tally::default();
    all.merge(&w.tally);
    all.merge(&p.tally);
    let (rate_limited, error_answers, blocked, other_refused) =
        refusal_split(&all.refused_prefixes);
    // Offered: sent. Only events due after `--max-secs` are skipped (the
    // driver counts them), and those were never offered.
    let offered = all.sent;
    let accepted_bytes = w.accepted_bytes + p.accepted_bytes;
    let per_sec = |x: f64| {
        if ingest_secs > 0.0 {
            x / ingest_secs
        } else {
            0.0
        }
    };
    let polite_offered = p.tally.sent;
    Summary {
        ingest_secs,
        offered_events: offered,
        offered_bytes: w.offered_bytes + p.offered_bytes,
        accepted_events: all.accepted,
        accepted_bytes,
        duplicates: all.duplicates,
        acceptance: ratio(all.accepted, offered),
        accepted_per_sec: per_sec(all.accepted as f64),
        accepted_mib_per_sec: per_sec(accepted_bytes as f64 / (1024.0 * 1024.0)),
        refused: all.refused,
        rate_limited,
        error_answers,
        blocked,
        other_refused,
        timeouts: all.timeouts,
        lost: all.lost,
        connection_errors: all.connection_errors,
        refused_by_prefix: all.refused_prefixes.clone(),
        refusal_examples: all.examples.clone(),
        polite_offered,
        polite_accepted: p.tally.accepted,
        polite_success: ratio(p.tally.accepted, polite_offered),
        polite_ok: p.tally.accepted_latency.summary(),
        target_bytes: target_mb.map(|m| m * 1024.0 * 1024.0),
        samples: sample_stats(samples),
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Pass: no `error:` answer, something accepted, and both checks found everything.
pub fn verdict(s: &Summary, checks: &Checks) -> Verdict {
    let mut reasons = Vec::new();
    if s.error_answers > 0 {
        reasons.push(format!("{} error: answers", s.error_answers));
    }
    if s.accepted_events == 0 {
        reasons.push("no event accepted".to_owned());
    }
    for (name, c) in [("newest", &checks.newest), ("exempt", &checks.exempt)] {
        if c.missing > 0 {
            reasons.push(format!("{name}: {} accepted events missing", c.missing));
        }
        if c.unchecked > 0 {
            reasons.push(format!(
                "{name}: {} events could not be checked",
                c.unchecked
            ));
        }
    }
    Verdict {
        pass: reasons.is_empty(),
        reasons,
    }
}

fn print_start(url: &str, s: &Settings, exempt: &[String]) {
    let budget = match (s.budget.bytes, s.budget.events) {
        (Some(b), Some(e)) => format!("{} or {e} events", mib(b as f64)),
        (Some(b), None) => mib(b as f64),
        (None, Some(e)) => format!("{e} events"),
        (None, None) => "?".into(),
    };
    println!(
        "soak: {url}: {budget} from {} authors over {} days, {} writers x {} in flight, {} polite every {} ms",
        s.authors, s.span_days, s.writers, s.window, s.polite, s.polite_interval_ms
    );
    if !exempt.is_empty() {
        println!(
            "  exempt authors (list them in the relay's retention.exempt_pubkeys):\n  {}",
            exempt_toml(exempt)
        );
    }
}

impl SoakReport {
    /// The one-screen summary.
    pub fn print(&self) {
        let (s, st) = (&self.summary, &self.summary.samples);
        let set = &self.settings;
        println!(
            "soak: {} {} writers x {}, {} polite every {} ms, {} authors ({} exempt), span {} days{}",
            self.run.relay.as_deref().unwrap_or("?"),
            set.writers,
            set.window,
            set.polite,
            set.polite_interval_ms,
            set.authors,
            set.exempt_authors,
            set.span_days,
            if self.stopped_early {
                " (stopped early)"
            } else {
                ""
            }
        );
        println!(
            "  ingested {} of {} events offered ({:.1}%), {} of {}, in {:.1} s ({:.0} events/s, {:.2} MiB/s)",
            s.accepted_events,
            s.offered_events,
            s.acceptance * 100.0,
            mib(s.accepted_bytes as f64),
            mib(s.offered_bytes as f64),
            s.ingest_secs,
            s.accepted_per_sec,
            s.accepted_mib_per_sec
        );
        let others: Vec<String> = s
            .refused_by_prefix
            .0
            .iter()
            .filter(|(k, _)| !["rate-limited", "error", "blocked"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let others = if others.is_empty() {
            String::new()
        } else {
            format!(" ({})", others.join(", "))
        };
        println!(
            "  refused: rate-limited {}, error {}, blocked {}, other {}{others}; timeouts {}, lost {}, connection errors {}",
            s.rate_limited,
            s.error_answers,
            s.blocked,
            s.other_refused,
            s.timeouts,
            s.lost,
            s.connection_errors
        );
        for m in self.summary.refusal_examples.0.values() {
            println!("    e.g. {m:?}");
        }
        let worst = match (st.polite_worst_p99_ms, st.polite_worst_p99_at_secs) {
            (Some(v), Some(t)) => format!(", worst sample p99 {v:.1} ms at {t:.0} s"),
            _ => String::new(),
        };
        println!(
            "  polite: {} of {} accepted ({:.1}%), OK p50 {:.1} ms, p99 {:.1} ms{worst}",
            s.polite_accepted,
            s.polite_offered,
            s.polite_success * 100.0,
            s.polite_ok.p50_ms,
            s.polite_ok.p99_ms
        );
        let target = s.target_bytes;
        let of_target = |v: f64| {
            target
                .map(|t| format!(" ({:.0}% of target)", 100.0 * v / t))
                .unwrap_or_default()
        };
        for (name, m) in [
            ("store used", &st.store_used_second_half),
            ("store file", &st.store_file_second_half),
        ] {
            match m {
                Some(m) => println!(
                    "  {name} (second half): min {}, median {}, max {}{}",
                    mib(m.min),
                    mib(m.median),
                    mib(m.max),
                    of_target(m.max)
                ),
                None => println!("  {name}: not reported by the relay"),
            }
        }
        if let Some(t) = target {
            println!("  store target: {}", mib(t));
        }
        if st.deletions_per_sec_median.is_none() && st.retention_share.is_none() {
            println!("  retention: no retention metrics from the relay");
        } else {
            let count = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.0}"));
            let pct = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{:.1}%", x * 100.0));
            println!(
                "  retention: deleted {} events; deletions/s mean {}, median {} (second half {}); \
                 writer time in retention {} (worst sample {})",
                count(st.deleted_during_run),
                count(st.deletions_per_sec_mean),
                count(st.deletions_per_sec_median),
                count(st.deletions_per_sec_median_second_half),
                pct(st.retention_share),
                pct(st.retention_share_max_sample),
            );
        }
        println!("  check newest: {}", self.checks.newest.line());
        println!("  check exempt: {}", self.checks.exempt.line());
        for (name, c) in [
            ("newest", &self.checks.newest),
            ("exempt", &self.checks.exempt),
        ] {
            for id in &c.missing_examples {
                println!("    {name} missing: {id}");
            }
            for n in &c.notes {
                println!("    {name}: {n}");
            }
        }
        if self.metrics.failures > 0 {
            println!(
                "  metrics: {} of {} scrapes failed: {}",
                self.metrics.failures,
                self.metrics.scrapes,
                self.metrics.last_error.as_deref().unwrap_or("?")
            );
        }
        println!("  {}", self.run.cpu_line());
        if self.verdict.pass {
            println!("  verdict: PASS");
        } else {
            println!("  verdict: FAIL: {}", self.verdict.reasons.join("; "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exempt_keys_print_as_a_toml_line() {
        let keys = exempt_pubkeys(1, 2);
        assert_eq!(keys.len(), 2);
        assert!(keys.iter().all(|k| k.len() == 64));
        let line = exempt_toml(&keys);
        assert_eq!(
            line,
            format!("exempt_pubkeys = [\"{}\", \"{}\"]", keys[0], keys[1])
        );
        assert_eq!(exempt_toml(&[]), "exempt_pubkeys = []");
    }

    #[test]
    fn verdict_fails_on_errors_and_missing_events() {
        let w = ClassTally::default();
        let mut s = summarize(&w, &w, 1.0, &[], None);
        let ok = StoredCheck {
            expected: 3,
            found: 3,
            ..StoredCheck::default()
        };
        let checks = Checks {
            newest: ok.clone(),
            exempt: ok.clone(),
        };
        assert_eq!(verdict(&s, &checks).reasons, vec!["no event accepted"]);
        s.accepted_events = 10;
        assert!(verdict(&s, &checks).pass);
        s.error_answers = 2;
        let bad = Checks {
            newest: StoredCheck {
                missing: 1,
                ..ok.clone()
            },
            exempt: StoredCheck { unchecked: 4, ..ok },
        };
        let v = verdict(&s, &bad);
        assert!(!v.pass);
        assert_eq!(v.reasons.len(), 3, "{:?}", v.reasons);
    }
}
