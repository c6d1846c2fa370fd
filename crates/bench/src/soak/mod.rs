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
//!
//! The files: `args` (the command line), `report` (what the JSON report
//! holds), `generator` (the events signed for writers and polite clients),
//! `sampler` (one sample per `--sample-ms`), `outcome` (the summary and the
//! verdict) and `print` (what the terminal shows); `run` here ties them
//! together.

mod args;
mod check;
mod generator;
mod ledger;
pub mod mix;
mod outcome;
mod print;
mod report;
mod sampler;
pub mod summary;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::{mpsc, watch};

pub use args::SoakArgs;
pub use check::StoredCheck;
use generator::{Generator, Produced, polite_producer};
use ledger::{SoakRecorder, Tracker};
use mix::{Budget, Mix, TimeSchedule, exempt_pubkeys};
use outcome::summarize;
pub use outcome::verdict;
use print::print_start;
pub use print::{exempt_toml, print_exempt};
pub use report::{Checks, ScrapeStatus, Settings, SoakReport, Summary, Verdict};
use sampler::Sampler;
use summary::{derive_rates, kinds_json};

use crate::connections::loopback_source;
use crate::driver::{PublisherConfig, Recorder, Shared, run_publisher};
use crate::report::{RunInfo, unix_now};
use crate::source::{Phase, Schedule, Source};
use crate::wire::RelayUrl;

/// Signed events waiting for a writer, at most.
const GEN_AHEAD_EVENTS: usize = 4096;
/// How long the run may last without `--max-secs`.
const FOREVER_SECS: f64 = 365.0 * 86_400.0;
/// Each check's REQ waits this long for its EOSE.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// Loopback address classes (127.C.x.y) of writers, polite clients and checks.
const WRITER_IPS: u8 = 5;
const POLITE_IPS: u8 = 6;
const CHECK_IPS: u8 = 7;

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
