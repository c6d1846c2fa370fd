//! `overload`: polite clients at a modest fixed rate beside abusive clients
//! whose offered load steps through phases (multiples of the relay's
//! capacity, given or measured first). Reports, per phase and per class,
//! offered load, goodput, success ratio, latency and refusals by prefix, a
//! per-second timeline, and the relay's `sluice_throttle_*` series scraped
//! from /metrics over the run. `plot` draws the JSON it writes.
//!
//! Every event is signed before the clock starts, so signing does not
//! compete with the relay for CPU during the run. On a loopback relay each
//! client connects from its own 127.x.y.z address, so per-IP limits see
//! polite and abusive clients as the different clients they are.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::sync::watch;

use crate::connections::loopback_source;
use crate::driver::{PublisherConfig, Recorder, Shared, TallyReport, Totals, run_publisher};
use crate::generate::{Spec, sign_parallel, text_of_len};
use crate::report::{RunInfo, unix_now};
use crate::rng::Rng;
use crate::source::{Phase, Schedule, Source};
use crate::timeline::{PhasedRecorder, ScrapeTarget, Scrapes, SecondPoint, scrape_loop};
use crate::wire::{Prepared, RelayUrl};

#[derive(Debug, Clone, clap::Args)]
pub struct OverloadArgs {
    pub relay: String,
    /// The relay's write capacity in events/s; measured first when absent.
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Abusive offered load per phase, as multiples of capacity.
    #[arg(long, default_value = "0.5,1,2,5,1")]
    pub phases: String,
    #[arg(long, default_value_t = 10.0)]
    pub phase_secs: f64,
    #[arg(long, default_value_t = 8)]
    pub abusive_clients: usize,
    /// Distinct authors the abusive events are signed by [default: one per abusive client].
    #[arg(long)]
    pub abusive_keys: Option<usize>,
    #[arg(long, default_value_t = 10)]
    pub polite_clients: usize,
    /// Events per second per polite client, constant through every phase.
    #[arg(long, default_value_t = 2.0)]
    pub polite_rate: f64,
    /// Content bytes per generated event.
    #[arg(long, default_value_t = 300)]
    pub content_bytes: usize,
    /// Most abusive events signed up front; the schedule wraps over them
    /// (re-sent events are duplicates, and the report counts them).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_events: usize,
    /// Capacity measurement: seconds, connections and window of the closed-loop run.
    #[arg(long, default_value_t = 5.0)]
    pub measure_secs: f64,
    #[arg(long, default_value_t = 30_000)]
    pub measure_events: usize,
    #[arg(long, default_value_t = 16)]
    pub measure_connections: usize,
    /// Distinct authors of the measurement events, so per-author limits do not cap the measurement.
    #[arg(long, default_value_t = 1000)]
    pub measure_keys: usize,
    #[arg(long, default_value_t = 16)]
    pub measure_window: usize,
    #[arg(long, default_value_t = 5_000)]
    pub timeout_ms: u64,
    /// Most events in flight per connection before due events are skipped.
    #[arg(long, default_value_t = 5_000)]
    pub max_inflight: usize,
    /// Connect every client from 127.0.0.1 even when the relay is on loopback.
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
    #[arg(long, default_value_t = 500)]
    pub scrape_ms: u64,
    /// Series to record from /metrics, by name prefix (repeatable).
    #[arg(long, default_values_t = ["sluice_throttle_".to_owned(), "sluice_process_".to_owned()])]
    pub series_prefix: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PhaseReport {
    pub index: usize,
    pub multiplier: f64,
    pub start_secs: f64,
    pub secs: f64,
    pub abusive_target_rate: f64,
    pub polite_target_rate: f64,
    /// New events stored per second, both classes (accepted minus `duplicate:`).
    pub goodput_per_sec: f64,
    /// goodput / capacity.
    pub goodput_ratio: f64,
    pub polite: TallyReport,
    pub abusive: TallyReport,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Timeline {
    /// Index i covers seconds [i, i+1) of due time.
    pub polite: Vec<SecondPoint>,
    pub abusive: Vec<SecondPoint>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct OverloadReport {
    pub run: RunInfo,
    pub capacity: f64,
    pub capacity_measured: bool,
    pub measurement: Option<TallyReport>,
    pub polite_clients: usize,
    pub polite_rate: f64,
    pub abusive_clients: usize,
    pub distinct_source_ips: bool,
    pub abusive_events_signed: usize,
    /// Abusive events offered beyond the signed pool (sent again: duplicates).
    pub abusive_events_reused: u64,
    pub phases: Vec<PhaseReport>,
    pub timeline: Timeline,
    pub metrics: Option<Scrapes>,
}

/// Parses `0.5,1,2` into multipliers.
pub fn parse_phases(s: &str) -> anyhow::Result<Vec<f64>> {
    let v: Vec<f64> = s
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .with_context(|| format!("bad phase multiplier {p:?}"))
        })
        .collect::<anyhow::Result<_>>()?;
    if v.is_empty() || v.iter().any(|m| !m.is_finite() || *m < 0.0) {
        bail!("phases must be non-negative numbers: {s}");
    }
    Ok(v)
}

/// Signs `n` fresh kind-1 events, round robin over `keys`, tagged with `tag`.
fn sign_pool(
    rng: &mut Rng,
    keys: &[[u8; 32]],
    n: usize,
    content: usize,
    tag: &str,
) -> Vec<Prepared> {
    let now = unix_now();
    let specs: Vec<Spec> = (0..n)
        .map(|i| Spec {
            secret_key: keys[i % keys.len()],
            created_at: now,
            kind: 1,
            tags: vec![vec!["t".into(), tag.into()]],
            content: text_of_len(rng, content),
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    sign_parallel(specs, threads)
        .iter()
        .map(|e| Prepared::from_raw(e.raw()).expect("signed events have ids"))
        .collect()
}

struct Plan {
    relay: RelayUrl,
    multipliers: Vec<f64>,
    phase_secs: Vec<f64>,
    total_secs: f64,
    distinct_ips: bool,
    tag: String,
}

pub async fn run(args: &OverloadArgs) -> anyhow::Result<OverloadReport> {
    let relay = RelayUrl::parse(&args.relay)?;
    let mut run = RunInfo::new("overload", Some(&args.relay));
    let multipliers = parse_phases(&args.phases)?;
    let phase_secs = vec![args.phase_secs; multipliers.len()];
    let plan = Plan {
        distinct_ips: !args.same_source_ip && relay.host.starts_with("127."),
        relay,
        total_secs: phase_secs.iter().sum(),
        multipliers,
        phase_secs,
        tag: format!("sluice-bench-overload-{}-{}", unix_now(), args.seed),
    };
    let mut rng = Rng::new(args.seed ^ unix_now());
    let (capacity, measurement) = match args.capacity {
        Some(c) => (c, None),
        None => measure_capacity(args, &plan, &mut rng).await?,
    };
    if capacity <= 0.0 {
        bail!("capacity must be positive (measured {capacity:.1}/s)");
    }
    println!("overload: capacity {capacity:.0} events/s; signing events...");
    let mut report = run_phases(args, &plan, capacity, &mut rng).await?;
    run.finish();
    report.run = run;
    report.capacity_measured = measurement.is_some();
    report.measurement = measurement;
    Ok(report)
}

async fn measure_capacity(
    args: &OverloadArgs,
    plan: &Plan,
    rng: &mut Rng,
) -> anyhow::Result<(f64, Option<TallyReport>)> {
    let keys: Vec<[u8; 32]> = (0..args.measure_keys.max(1))
        .map(|_| rng.secret_key())
        .collect();
    let events = sign_pool(
        rng,
        &keys,
        args.measure_events,
        args.content_bytes,
        &plan.tag,
    );
    let limit = events.len() as u64;
    let totals = Arc::new(Totals::default());
    let t0 = Instant::now();
    let shared = Shared {
        source: Arc::new(Source::pool(events, limit)),
        schedule: Arc::new(Schedule::ClosedLoop),
        recorder: totals.clone(),
        t0,
    };
    let cfg = |bind| PublisherConfig {
        relay: plan.relay.clone(),
        bind,
        window: args.measure_window,
        max_inflight: args.max_inflight,
        timeout: Duration::from_millis(args.timeout_ms),
        stop_at: t0 + Duration::from_secs_f64(args.measure_secs),
    };
    let tasks: Vec<_> = (0..args.measure_connections.max(1))
        .map(|i| {
            let bind = plan.distinct_ips.then(|| loopback_source(4, i));
            tokio::spawn(run_publisher(cfg(bind), shared.clone()))
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let (tally, first, last) = totals.snapshot();
    let secs = match (first, last) {
        (Some(f), Some(l)) if l > f => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    let report = tally.report(secs);
    println!(
        "measured capacity (closed loop): {:.0} stored/s",
        report.stored_per_sec
    );
    if report.refused * 100 > report.offered {
        println!(
            "warning: the relay refused {} of {} measurement events ({}): the measured capacity is \
             its per-client limit, not its capacity. Raise those limits for the benchmark or pass --capacity.",
            report.refused, report.offered, report.refused_prefixes
        );
    }
    Ok((report.stored_per_sec, Some(report)))
}

async fn run_phases(
    args: &OverloadArgs,
    plan: &Plan,
    capacity: f64,
    rng: &mut Rng,
) -> anyhow::Result<OverloadReport> {
    let abusive_phases: Vec<Phase> = plan
        .multipliers
        .iter()
        .zip(&plan.phase_secs)
        .map(|(m, secs)| Phase {
            rate: m * capacity,
            secs: *secs,
        })
        .collect();
    let abusive_schedule = Schedule::Open(abusive_phases);
    let abusive_total = abusive_schedule.total_events().unwrap_or(0);
    let n_keys = args.abusive_keys.unwrap_or(args.abusive_clients).max(1);
    let abusive_keys: Vec<[u8; 32]> = (0..n_keys).map(|_| rng.secret_key()).collect();
    let pool_size = (abusive_total as usize).min(args.max_events);
    let abusive_pool = sign_pool(rng, &abusive_keys, pool_size, args.content_bytes, &plan.tag);
    let polite_per_client = (args.polite_rate * plan.total_secs).floor() as usize;
    let polite_pools: Vec<Vec<Prepared>> = (0..args.polite_clients)
        .map(|_| {
            let key = [rng.secret_key()];
            sign_pool(rng, &key, polite_per_client, args.content_bytes, &plan.tag)
        })
        .collect();

    let t0 = Instant::now() + Duration::from_millis(300);
    let polite_rec = Arc::new(PhasedRecorder::new(t0, &plan.phase_secs));
    let abusive_rec = Arc::new(PhasedRecorder::new(t0, &plan.phase_secs));
    let (stop_tx, stop_rx) = watch::channel(false);
    let target = ScrapeTarget {
        url: (!args.no_metrics).then(|| {
            args.metrics_url
                .clone()
                .unwrap_or_else(|| format!("{}/metrics", plan.relay.http_base()))
        }),
        prefixes: args.series_prefix.clone(),
        pid: args.pid,
    };
    let scraper = (target.url.is_some() || target.pid.is_some()).then(|| {
        let every = Duration::from_millis(args.scrape_ms.max(50));
        tokio::spawn(scrape_loop(target, t0, every, stop_rx))
    });
    let cfg = |bind| PublisherConfig {
        relay: plan.relay.clone(),
        bind,
        window: 1,
        max_inflight: args.max_inflight,
        timeout: Duration::from_millis(args.timeout_ms),
        stop_at: t0 + Duration::from_secs_f64(plan.total_secs),
    };
    let mut tasks = Vec::new();
    let abusive_shared = Shared {
        source: Arc::new(Source::pool(abusive_pool, abusive_total)),
        schedule: Arc::new(abusive_schedule),
        recorder: abusive_rec.clone() as Arc<dyn Recorder>,
        t0,
    };
    for i in 0..args.abusive_clients.max(1) {
        let bind = plan.distinct_ips.then(|| loopback_source(3, i));
        tasks.push(tokio::spawn(run_publisher(
            cfg(bind),
            abusive_shared.clone(),
        )));
    }
    for (i, pool) in polite_pools.into_iter().enumerate() {
        let limit = pool.len() as u64;
        let shared = Shared {
            source: Arc::new(Source::pool(pool, limit)),
            schedule: Arc::new(Schedule::Open(vec![Phase {
                rate: args.polite_rate,
                secs: plan.total_secs,
            }])),
            recorder: polite_rec.clone() as Arc<dyn Recorder>,
            t0,
        };
        let bind = plan.distinct_ips.then(|| loopback_source(2, i));
        tasks.push(tokio::spawn(run_publisher(cfg(bind), shared)));
    }
    for t in tasks {
        t.await?;
    }
    stop_tx.send(true).ok();
    let metrics = match scraper {
        Some(h) => Some(h.await?),
        None => None,
    };
    let phases = phase_reports(plan, args, capacity, &polite_rec, &abusive_rec);
    Ok(OverloadReport {
        run: RunInfo::new("overload", Some(&args.relay)),
        capacity,
        capacity_measured: false,
        measurement: None,
        polite_clients: args.polite_clients,
        polite_rate: args.polite_rate,
        abusive_clients: args.abusive_clients,
        distinct_source_ips: plan.distinct_ips,
        abusive_events_signed: pool_size,
        abusive_events_reused: abusive_total.saturating_sub(pool_size as u64),
        phases,
        timeline: Timeline {
            polite: polite_rec.seconds(),
            abusive: abusive_rec.seconds(),
        },
        metrics,
    })
}

fn phase_reports(
    plan: &Plan,
    args: &OverloadArgs,
    capacity: f64,
    polite: &PhasedRecorder,
    abusive: &PhasedRecorder,
) -> Vec<PhaseReport> {
    let polite = polite.phase_reports(&plan.phase_secs);
    let abusive = abusive.phase_reports(&plan.phase_secs);
    let mut start = 0.0;
    polite
        .into_iter()
        .zip(abusive)
        .enumerate()
        .map(|(i, (polite, abusive))| {
            let secs = plan.phase_secs[i];
            let goodput = polite.stored_per_sec + abusive.stored_per_sec;
            let r = PhaseReport {
                index: i,
                multiplier: plan.multipliers[i],
                start_secs: start,
                secs,
                abusive_target_rate: plan.multipliers[i] * capacity,
                polite_target_rate: args.polite_rate * args.polite_clients as f64,
                goodput_per_sec: goodput,
                goodput_ratio: goodput / capacity,
                polite,
                abusive,
            };
            start += secs;
            r
        })
        .collect()
}

impl OverloadReport {
    pub fn print(&self) {
        println!(
            "overload: {} capacity {:.0}/s ({}), {} polite clients at {}/s, {} abusive clients{}",
            self.run.relay.as_deref().unwrap_or("?"),
            self.capacity,
            if self.capacity_measured {
                "measured"
            } else {
                "given"
            },
            self.polite_clients,
            self.polite_rate,
            self.abusive_clients,
            if self.distinct_source_ips {
                ", one source IP per client"
            } else {
                ""
            }
        );
        if self.abusive_events_reused > 0 {
            println!(
                "  note: {} abusive events were re-sent duplicates (raise --max-events)",
                self.abusive_events_reused
            );
        }
        println!("  {}", self.run.cpu_line());
        for p in &self.phases {
            println!(
                "  phase {} ({}x, abusive target {:.0}/s): goodput {:.0}/s = {:.0}% of capacity",
                p.index,
                p.multiplier,
                p.abusive_target_rate,
                p.goodput_per_sec,
                p.goodput_ratio * 100.0
            );
            p.polite.print("    polite:  ");
            p.abusive.print("    abusive: ");
        }
        if let Some(m) = &self.metrics {
            let series: std::collections::BTreeSet<&String> =
                m.points.iter().flat_map(|p| p.values.keys()).collect();
            println!(
                "  metrics: {} scrapes of {} ({} failed), {} series recorded",
                m.points.len(),
                m.url,
                m.failures,
                series.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_parse() {
        assert_eq!(
            parse_phases("0.5, 1,2,5,1").unwrap(),
            vec![0.5, 1.0, 2.0, 5.0, 1.0]
        );
        assert!(parse_phases("1,x").is_err());
        assert!(parse_phases("-1").is_err());
    }
}
