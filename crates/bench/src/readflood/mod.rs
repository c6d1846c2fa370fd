//! `readflood`: polite clients beside abusive readers, the read-side
//! counterpart of `overload`. Reproduces this measurement, against any relay:
//! a store already holding an import; abusive clients, each from its own
//! loopback address, keeping several costly REQs open (alternating
//! `{"limit":L}` and `{"kinds":[1],"#t":["<random>"]}`, CLOSE at EOSE, the
//! next REQ at once); beside them polite clients from one other address,
//! each sending cheap REQs `{"authors":[own],"limit":5}` and EVENTs on a
//! fixed schedule. Polite and abusive clients run in separate processes:
//! the command runs itself again with a hidden `--role abusers`, which
//! writes its report to a file the parent reads at the end.
//!
//! Three phases: `before` (polite only), `flood` (polite and abusive),
//! `after` (the abusers gone, polite continues). When the abusers have left
//! and `--settle-secs` passed, the relay's `sluice_query_*` gauges are read
//! once and one fresh REQ `{"limit":5}` is sent on a new connection: a
//! relay that recovered shows nothing in flight and answers it at once.
//! Reports per phase and class (polite reads, polite writes, abusive reads),
//! a per-second timeline, and the relay's series scraped over the run.

mod abuse;
mod polite;
mod tally;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;
use sluice_proto::event::public_key_of;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

pub use abuse::{AbuseConfig, AbuseReport};
use polite::{PoliteClient, PoliteConfig, PoliteSinks, due_count};
pub use tally::{ReadReport, ReadSecond};

use crate::driver::TallyReport;
use crate::generate::{Spec, sign_parallel, text_of_len};
use crate::metrics;
use crate::report::{RunInfo, process_cpu_secs, unix_now};
use crate::rng::Rng;
use crate::stats::PrefixCounts;
use crate::timeline::{PhasedRecorder, ScrapeTarget, Scrapes, SecondPoint, scrape_loop};
use crate::wire::{self, Incoming, Prepared, RelayUrl};

/// Time between starting the clients and the run's time zero, so the
/// abusers' process is up before anything is due.
const STARTUP_LEAD: Duration = Duration::from_millis(1000);
/// Names of the phases, in order.
pub const PHASES: [&str; 3] = ["before", "flood", "after"];
/// Gauges read once after the flood, by name prefix (this covers
/// `sluice_query_window_*` too).
const AFTER_GAUGE_PREFIXES: &[&str] = &["sluice_query_"];

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

/// The run's settings, as written to JSON.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Settings {
    pub polite_clients: usize,
    pub polite_addr: String,
    pub polite_req_rate: f64,
    pub polite_event_rate: f64,
    pub polite_limit: u64,
    pub abusive_addrs: usize,
    pub abusive_conns_per_addr: usize,
    pub abusive_subs: usize,
    pub abusive_limit: u64,
    /// The words the abusers search for (none: they do not search).
    #[serde(default)]
    pub abusive_search: Vec<String>,
    pub timeout_ms: u64,
    pub before_secs: f64,
    pub flood_secs: f64,
    pub after_secs: f64,
    pub settle_secs: f64,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PhaseReport {
    pub name: String,
    pub start_secs: f64,
    pub secs: f64,
    pub polite_reads: ReadReport,
    pub polite_writes: TallyReport,
    pub abusive_reads: ReadReport,
}

/// The abusive side, beside its per-phase figures.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AbusiveSide {
    pub connections: usize,
    /// The local address of each connection (empty when not bound).
    pub source_ips: Vec<String>,
    pub separate_process: bool,
    pub pid: u32,
    /// CPU time of the abusers' process (only when separate).
    pub cpu_secs: Option<f64>,
    pub reconnects: u64,
    pub connection_errors: PrefixCounts,
    pub notices: PrefixCounts,
}

/// The fresh REQ sent after the flood.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Probe {
    /// `eose`, `closed`, `timeout` or `error`.
    pub outcome: String,
    /// From sending the REQ to its EOSE or CLOSED (or the timeout).
    pub time_ms: f64,
    pub connect_ms: f64,
    pub events: u64,
    /// The CLOSED message or the error.
    pub message: Option<String>,
}

/// The relay's state once the abusers have gone.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct AfterFlood {
    /// Seconds from the run's start.
    pub at_secs: f64,
    /// Every `sluice_query_*` gauge, by series.
    pub gauges: BTreeMap<String, f64>,
    pub scrape_error: Option<String>,
    pub probe: Probe,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Timeline {
    /// Index i covers seconds [i, i+1) of due (polite) or send (abusive) time.
    pub polite_reads: Vec<ReadSecond>,
    pub polite_writes: Vec<SecondPoint>,
    pub abusive_reads: Vec<ReadSecond>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ReadfloodReport {
    pub run: RunInfo,
    pub settings: Settings,
    /// Whether clients connected from their own loopback addresses.
    pub distinct_source_ips: bool,
    pub phases: Vec<PhaseReport>,
    pub abusive: AbusiveSide,
    pub polite_connection_errors: PrefixCounts,
    pub polite_notices: PrefixCounts,
    pub after_flood: AfterFlood,
    pub timeline: Timeline,
    pub metrics: Option<Scrapes>,
}

/// What both processes derive from the arguments.
struct Plan {
    relay: RelayUrl,
    distinct_ips: bool,
    phase_secs: Vec<f64>,
    total: Duration,
}

impl Plan {
    fn new(args: &ReadfloodArgs) -> anyhow::Result<Plan> {
        let relay = RelayUrl::parse(&args.relay)?;
        let phase_secs = vec![args.before_secs, args.flood_secs, args.after_secs];
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if !phase_secs.iter().all(|s| finite(*s)) || !finite(args.settle_secs) {
            bail!("phase and settle seconds must be non-negative numbers");
        }
        if !finite(args.polite_req_rate) || !finite(args.polite_event_rate) {
            bail!("polite rates must be non-negative numbers");
        }
        Ok(Plan {
            distinct_ips: !args.same_source_ip && relay.host.starts_with("127."),
            relay,
            total: Duration::from_secs_f64(phase_secs.iter().sum()),
            phase_secs,
        })
    }

    fn bind(&self, addr: Ipv4Addr) -> Option<IpAddr> {
        self.distinct_ips.then_some(IpAddr::V4(addr))
    }

    fn flood_window(&self, t0: Instant) -> (Instant, Instant) {
        let start = t0 + Duration::from_secs_f64(self.phase_secs[0]);
        (start, start + Duration::from_secs_f64(self.phase_secs[1]))
    }

    fn abuse_config(&self, args: &ReadfloodArgs, t0: Instant) -> AbuseConfig {
        let base = u32::from(args.abusive_addr_base);
        let binds = (0..args.abusive_addrs)
            .flat_map(|i| {
                let addr = Ipv4Addr::from(base.wrapping_add(i as u32));
                std::iter::repeat_n(self.bind(addr), args.abusive_conns_per_addr)
            })
            .collect();
        let (start, stop) = self.flood_window(t0);
        AbuseConfig {
            relay: self.relay.clone(),
            binds,
            subs: args.abusive_subs,
            limit: args.abusive_limit,
            search: args.abusive_search.clone(),
            timeout: Duration::from_millis(args.timeout_ms),
            t0,
            phase_secs: self.phase_secs.clone(),
            start,
            stop,
            seed: args.seed ^ 0xab05e,
        }
    }
}

pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `Instant` of a wall-clock time, for a time zero shared between processes.
pub(crate) fn instant_at_unix_ms(ms: u64) -> Instant {
    let (now_ms, now) = (unix_ms_now(), Instant::now());
    if ms >= now_ms {
        now + Duration::from_millis(ms - now_ms)
    } else {
        now.checked_sub(Duration::from_millis(now_ms - ms))
            .unwrap_or(now)
    }
}

/// The child process's part: run the abusers and write their report.
pub async fn run_abusers_role(args: &ReadfloodArgs) -> anyhow::Result<()> {
    let path = args
        .abusers_report
        .as_deref()
        .context("--role abusers needs --abusers-report")?;
    let t0_ms = args
        .t0_unix_ms
        .context("--role abusers needs --t0-unix-ms")?;
    let plan = Plan::new(args)?;
    let cfg = plan.abuse_config(args, instant_at_unix_ms(t0_ms));
    let mut report = abuse::run(cfg).await;
    report.cpu_secs = process_cpu_secs();
    std::fs::write(path, serde_json::to_string(&report)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The abusers, running in a child process or in a task of this one.
enum Abusers {
    Child {
        child: std::process::Child,
        report: PathBuf,
    },
    Task(tokio::task::JoinHandle<AbuseReport>),
}

impl Abusers {
    fn start(args: &ReadfloodArgs, plan: &Plan, t0: Instant) -> anyhow::Result<Abusers> {
        if args.in_process {
            let cfg = plan.abuse_config(args, t0);
            return Ok(Abusers::Task(tokio::spawn(abuse::run(cfg))));
        }
        let report = std::env::temp_dir().join(format!(
            "sluice-bench-readflood-{}-{}.json",
            std::process::id(),
            unix_ms_now()
        ));
        let t0_ms = unix_ms_now() + t0.saturating_duration_since(Instant::now()).as_millis() as u64;
        let exe = std::env::current_exe().context("finding this program to run the abusers")?;
        let child = std::process::Command::new(exe)
            .args(child_args(args, &report, t0_ms))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting the abusers' process")?;
        Ok(Abusers::Child { child, report })
    }

    /// Waits for the abusers to finish (at the end of the flood) and takes their report.
    async fn finish(self) -> anyhow::Result<AbuseReport> {
        match self {
            Abusers::Task(handle) => Ok(handle.await?),
            Abusers::Child { mut child, report } => {
                let status = tokio::task::spawn_blocking(move || child.wait()).await??;
                let text = std::fs::read_to_string(&report);
                let _ = std::fs::remove_file(&report);
                if !status.success() {
                    bail!("the abusers' process failed ({status}); its errors are above");
                }
                let text = text.with_context(|| format!("reading {}", report.display()))?;
                serde_json::from_str(&text).context("the abusers' report is not valid")
            }
        }
    }
}

/// The arguments of the abusers' process: everything that shapes the flood.
fn child_args(args: &ReadfloodArgs, report: &Path, t0_unix_ms: u64) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "readflood".into(),
        args.relay.clone(),
        "--role".into(),
        "abusers".into(),
        "--abusers-report".into(),
        report.display().to_string(),
        "--t0-unix-ms".into(),
        t0_unix_ms.to_string(),
    ];
    let flags: [(&str, String); 10] = [
        ("--abusive-addrs", args.abusive_addrs.to_string()),
        ("--abusive-addr-base", args.abusive_addr_base.to_string()),
        (
            "--abusive-conns-per-addr",
            args.abusive_conns_per_addr.to_string(),
        ),
        ("--abusive-subs", args.abusive_subs.to_string()),
        ("--abusive-limit", args.abusive_limit.to_string()),
        ("--timeout-ms", args.timeout_ms.to_string()),
        ("--before-secs", args.before_secs.to_string()),
        ("--flood-secs", args.flood_secs.to_string()),
        ("--after-secs", args.after_secs.to_string()),
        ("--seed", args.seed.to_string()),
    ];
    for (flag, value) in flags {
        v.push(flag.into());
        v.push(value);
    }
    if args.same_source_ip {
        v.push("--same-source-ip".into());
    }
    if !args.abusive_search.is_empty() {
        v.push("--abusive-search".into());
        v.push(args.abusive_search.join(","));
    }
    v
}

/// One polite client's key and its events, signed before the clock starts.
struct Identity {
    pubkey_hex: String,
    events: Vec<Prepared>,
}

fn sign_polite(args: &ReadfloodArgs, plan: &Plan, rng: &mut Rng) -> Vec<Identity> {
    let tag = format!("sluice-bench-readflood-{}-{}", unix_now(), args.seed);
    let now = unix_now();
    let keys: Vec<[u8; 32]> = (0..args.polite_clients).map(|_| rng.secret_key()).collect();
    let mut specs = Vec::new();
    let mut counts = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let (offset, period) = event_schedule(args, i);
        let n = due_count(plan.total, offset, period);
        counts.push(n);
        specs.extend((0..n).map(|_| Spec {
            secret_key: *key,
            created_at: now,
            kind: 1,
            tags: vec![vec!["t".into(), tag.clone()]],
            content: text_of_len(rng, args.content_bytes),
        }));
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut signed = sign_parallel(specs, threads)
        .into_iter()
        .map(|e| Prepared::from_raw(e.raw()).expect("signed events have ids"));
    keys.iter()
        .zip(counts)
        .map(|(key, n)| Identity {
            pubkey_hex: hex::encode(public_key_of(key)),
            events: signed.by_ref().take(n).collect(),
        })
        .collect()
}

fn period(rate: f64) -> Option<Duration> {
    (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate))
}

/// Polite client i's first REQ and period: the clients are spread evenly over one period.
fn req_schedule(args: &ReadfloodArgs, i: usize) -> (Duration, Option<Duration>) {
    let p = period(args.polite_req_rate);
    let offset = p.map_or(Duration::ZERO, |p| {
        p.mul_f64(i as f64 / args.polite_clients.max(1) as f64)
    });
    (offset, p)
}

/// Polite client i's first EVENT and period: half a slot after its REQs.
fn event_schedule(args: &ReadfloodArgs, i: usize) -> (Duration, Option<Duration>) {
    let p = period(args.polite_event_rate);
    let offset = p.map_or(Duration::ZERO, |p| {
        p.mul_f64((i as f64 + 0.5) / args.polite_clients.max(1) as f64)
    });
    (offset, p)
}

pub async fn run(args: &ReadfloodArgs) -> anyhow::Result<ReadfloodReport> {
    let plan = Plan::new(args)?;
    let mut run = RunInfo::new("readflood", Some(&args.relay));
    let mut rng = Rng::new(args.seed ^ unix_now());
    let identities = sign_polite(args, &plan, &mut rng);
    let t0 = Instant::now() + STARTUP_LEAD;
    let abusers = Abusers::start(args, &plan, t0)?;
    let separate = !args.in_process;
    println!(
        "readflood: {:.0} s before, {:.0} s flood, {:.0} s after; running...",
        args.before_secs, args.flood_secs, args.after_secs
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let target = ScrapeTarget {
        url: metrics_url(args, &plan),
        prefixes: args.series_prefix.clone(),
        pid: args.pid,
    };
    let scraper = (target.url.is_some() || target.pid.is_some()).then(|| {
        let every = Duration::from_millis(args.scrape_ms.max(50));
        tokio::spawn(scrape_loop(target, t0, every, stop_rx))
    });

    let sinks = PoliteSinks {
        reads: Arc::new(tally::ReadRecorder::new(t0, &plan.phase_secs)),
        writes: Arc::new(PhasedRecorder::new(t0, &plan.phase_secs)),
        connection_errors: Arc::new(Mutex::default()),
        notices: Arc::new(Mutex::default()),
    };
    let polite_tasks: Vec<_> = identities
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let cfg = polite_config(args, &plan, t0, i, id);
            tokio::spawn(PoliteClient::new(cfg, sinks.clone()).run())
        })
        .collect();

    let abuse = abusers.finish().await?;
    let gone = Instant::now().max(plan.flood_window(t0).1);
    tokio::time::sleep_until((gone + Duration::from_secs_f64(args.settle_secs)).into()).await;
    let after_flood = after_flood(args, &plan, t0).await;
    for t in polite_tasks {
        t.await?;
    }
    stop_tx.send(true).ok();
    let metrics = match scraper {
        Some(h) => Some(h.await?),
        None => None,
    };
    run.finish();
    let abusive = AbusiveSide {
        connections: abuse.connections,
        source_ips: plan
            .abuse_config(args, t0)
            .binds
            .iter()
            .map(|b| b.map(|ip| ip.to_string()).unwrap_or_default())
            .collect(),
        separate_process: separate,
        pid: abuse.pid,
        cpu_secs: if separate { abuse.cpu_secs } else { None },
        reconnects: abuse.reconnects,
        connection_errors: abuse.connection_errors.clone(),
        notices: abuse.notices.clone(),
    };
    Ok(ReadfloodReport {
        run,
        settings: settings(args),
        distinct_source_ips: plan.distinct_ips,
        phases: phase_reports(&plan, &sinks, &abuse),
        abusive,
        polite_connection_errors: sinks.connection_errors.lock().expect("lock").clone(),
        polite_notices: sinks.notices.lock().expect("lock").clone(),
        after_flood,
        timeline: Timeline {
            polite_reads: sinks.reads.seconds(),
            polite_writes: sinks.writes.seconds(),
            abusive_reads: abuse.seconds,
        },
        metrics,
    })
}

fn metrics_url(args: &ReadfloodArgs, plan: &Plan) -> Option<String> {
    (!args.no_metrics).then(|| {
        args.metrics_url
            .clone()
            .unwrap_or_else(|| format!("{}/metrics", plan.relay.http_base()))
    })
}

fn polite_config(
    args: &ReadfloodArgs,
    plan: &Plan,
    t0: Instant,
    i: usize,
    id: Identity,
) -> PoliteConfig {
    let (req_offset, req_period) = req_schedule(args, i);
    let (event_offset, event_period) = event_schedule(args, i);
    PoliteConfig {
        index: i,
        relay: plan.relay.clone(),
        bind: plan.bind(args.polite_addr),
        pubkey_hex: id.pubkey_hex,
        events: id.events,
        req_period,
        req_offset,
        event_period,
        event_offset,
        limit: args.polite_limit,
        timeout: Duration::from_millis(args.timeout_ms),
        t0,
        end: t0 + plan.total,
    }
}

fn settings(args: &ReadfloodArgs) -> Settings {
    Settings {
        polite_clients: args.polite_clients,
        polite_addr: args.polite_addr.to_string(),
        polite_req_rate: args.polite_req_rate,
        polite_event_rate: args.polite_event_rate,
        polite_limit: args.polite_limit,
        abusive_addrs: args.abusive_addrs,
        abusive_conns_per_addr: args.abusive_conns_per_addr,
        abusive_subs: args.abusive_subs,
        abusive_limit: args.abusive_limit,
        abusive_search: args.abusive_search.clone(),
        timeout_ms: args.timeout_ms,
        before_secs: args.before_secs,
        flood_secs: args.flood_secs,
        after_secs: args.after_secs,
        settle_secs: args.settle_secs,
    }
}

fn phase_reports(plan: &Plan, sinks: &PoliteSinks, abuse: &AbuseReport) -> Vec<PhaseReport> {
    let reads = sinks.reads.phase_reports();
    let writes = sinks.writes.phase_reports(&plan.phase_secs);
    let mut start = 0.0;
    (0..PHASES.len())
        .map(|i| {
            let secs = plan.phase_secs[i];
            let p = PhaseReport {
                name: PHASES[i].to_owned(),
                start_secs: start,
                secs,
                polite_reads: reads[i].clone(),
                polite_writes: writes[i].clone(),
                abusive_reads: abuse.phases.get(i).cloned().unwrap_or_default(),
            };
            start += secs;
            p
        })
        .collect()
}

/// Reads the query gauges once, then sends one fresh REQ on a new connection.
async fn after_flood(args: &ReadfloodArgs, plan: &Plan, t0: Instant) -> AfterFlood {
    let mut out = AfterFlood {
        at_secs: t0.elapsed().as_secs_f64(),
        ..AfterFlood::default()
    };
    if let Some(url) = metrics_url(args, plan) {
        match query_gauges(&url).await {
            Ok(g) => out.gauges = g,
            Err(e) => out.scrape_error = Some(format!("{e:#}")),
        }
    }
    let timeout = Duration::from_millis(args.timeout_ms);
    out.probe = probe(&plan.relay, plan.bind(args.probe_addr), timeout).await;
    out
}

async fn query_gauges(url: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = metrics::http_get(url).await?;
    let types = metrics::metric_types(&text);
    Ok(metrics::parse_prometheus(&text)
        .into_iter()
        .filter(|s| {
            AFTER_GAUGE_PREFIXES.iter().any(|p| s.name.starts_with(p))
                && metrics::is_gauge(&types, &s.name)
        })
        .map(|s| (s.series, s.value))
        .collect())
}

/// One REQ `{"limit":5}` on a new connection: its outcome and time to EOSE.
async fn probe(relay: &RelayUrl, bind: Option<IpAddr>, timeout: Duration) -> Probe {
    let started = Instant::now();
    let mut ws = match wire::connect(relay, bind).await {
        Ok(ws) => ws,
        Err(e) => {
            return Probe {
                outcome: "error".into(),
                message: Some(format!("connect: {}", e.root_cause())),
                ..Probe::default()
            };
        }
    };
    let mut p = Probe {
        connect_ms: started.elapsed().as_secs_f64() * 1000.0,
        ..Probe::default()
    };
    let sent = Instant::now();
    if let Err(e) = ws.send(wire::req("probe", &json!({"limit": 5}))).await {
        p.outcome = "error".into();
        p.message = Some(format!("send: {e}"));
        return p;
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    p.outcome = loop {
        let m = tokio::select! {
            m = ws.next() => m,
            _ = &mut deadline => break "timeout".into(),
        };
        let text = match m {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Close(_))) | None => {
                p.message = Some("closed by relay".into());
                break "error".into();
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                p.message = Some(format!("receive: {e}"));
                break "error".into();
            }
        };
        match Incoming::parse(text.as_str()) {
            Incoming::Event { sub, .. } if sub == "probe" => p.events += 1,
            Incoming::Eose { sub } if sub == "probe" => break "eose".into(),
            Incoming::Closed { sub, message } if sub == "probe" => {
                p.message = Some(message);
                break "closed".into();
            }
            _ => {}
        }
    };
    p.time_ms = sent.elapsed().as_secs_f64() * 1000.0;
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    p
}

impl ReadfloodReport {
    pub fn print(&self) {
        let s = &self.settings;
        println!(
            "readflood: {} {} polite clients from {} ({} REQ/s, {} EVENT/s each); {} abusive addresses x {} connection(s) x {} REQs open ({}){}",
            self.run.relay.as_deref().unwrap_or("?"),
            s.polite_clients,
            if self.distinct_source_ips {
                s.polite_addr.as_str()
            } else {
                "the default address"
            },
            s.polite_req_rate,
            s.polite_event_rate,
            s.abusive_addrs,
            s.abusive_conns_per_addr,
            s.abusive_subs,
            if s.abusive_search.is_empty() {
                format!("limit {} / #t", s.abusive_limit)
            } else {
                format!(
                    "search {}, limit {}",
                    s.abusive_search.join("|"),
                    s.abusive_limit
                )
            },
            if self.abusive.separate_process {
                ", abusers in a separate process"
            } else {
                ", abusers in this process"
            }
        );
        let abusers_cpu = self.abusive.cpu_secs.map_or(String::new(), |c| {
            format!("; abusers' process CPU {c:.1} s")
        });
        println!("  {}{abusers_cpu}", self.run.cpu_line());
        for p in &self.phases {
            println!(
                "  phase {} ({:.0}-{:.0} s):",
                p.name,
                p.start_secs,
                p.start_secs + p.secs
            );
            p.polite_reads.print("    ", "polite reads:  ");
            print_writes(&p.polite_writes);
            if p.abusive_reads.sent > 0 {
                p.abusive_reads.print("    ", "abusive reads: ");
            }
        }
        let a = &self.abusive;
        println!(
            "  abusive: {} connections, {} reconnects, connection errors: {}, notices: {}",
            a.connections, a.reconnects, a.connection_errors, a.notices
        );
        if self.polite_connection_errors.total() > 0 {
            println!(
                "  polite connection errors: {}",
                self.polite_connection_errors
            );
        }
        self.after_flood.print();
        if let Some(m) = &self.metrics {
            let series: std::collections::BTreeSet<&String> =
                m.points.iter().flat_map(|p| p.values.keys()).collect();
            println!(
                "  metrics: {} scrapes of {} ({} failed), {} series recorded",
                m.points.len(),
                if m.url.is_empty() { "/proc" } else { &m.url },
                m.failures,
                series.len()
            );
        }
    }
}

fn print_writes(w: &TallyReport) {
    println!(
        "    polite writes: sent {}, OK true {} ({:.1}%), refused {}, timeouts {}, lost {}, skipped {}",
        w.sent,
        w.accepted,
        w.success_ratio * 100.0,
        w.refused,
        w.timeouts,
        w.lost,
        w.skipped
    );
    println!(
        "                   OK latency (true): p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        w.accepted_latency.p50_ms, w.accepted_latency.p99_ms, w.accepted_latency.max_ms
    );
    if w.refused > 0 {
        println!(
            "                   refused by prefix: {}",
            w.refused_prefixes
        );
        for m in w.refusal_examples.0.values() {
            println!("                     e.g. {m:?}");
        }
    }
}

impl AfterFlood {
    fn print(&self) {
        println!(
            "  after the flood (at {:.1} s): fresh REQ {{\"limit\":5}}: {} in {:.1} ms ({} events, connect {:.1} ms){}",
            self.at_secs,
            self.probe.outcome,
            self.probe.time_ms,
            self.probe.events,
            self.probe.connect_ms,
            self.probe
                .message
                .as_ref()
                .map_or(String::new(), |m| format!(": {m:?}"))
        );
        if let Some(e) = &self.scrape_error {
            println!("    query gauges: not read ({e})");
        } else if !self.gauges.is_empty() {
            let g: Vec<String> = self
                .gauges
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("    query gauges: {}", g.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReadfloodArgs,
    }

    fn args(extra: &[&str]) -> ReadfloodArgs {
        let mut v = vec!["x", "ws://127.0.0.1:7777"];
        v.extend_from_slice(extra);
        Cli::parse_from(v).args
    }

    #[test]
    fn the_child_gets_the_flood_flags_back() {
        let a = args(&[
            "--abusive-addrs",
            "3",
            "--flood-secs",
            "2.5",
            "--same-source-ip",
        ]);
        let child = child_args(&a, Path::new("/tmp/r.json"), 42);
        let mut v = vec!["x"];
        v.extend(child.iter().skip(1).map(String::as_str));
        let back = Cli::parse_from(v).args;
        assert_eq!(back.role, Role::Abusers);
        assert_eq!(back.t0_unix_ms, Some(42));
        assert_eq!((back.abusive_addrs, back.flood_secs), (3, 2.5));
        assert!(back.same_source_ip);
        assert_eq!(back.abusers_report.unwrap(), Path::new("/tmp/r.json"));
    }

    #[test]
    fn abusers_get_one_address_each() {
        let a = args(&["--abusive-addrs", "3", "--abusive-conns-per-addr", "2"]);
        let plan = Plan::new(&a).unwrap();
        let cfg = plan.abuse_config(&a, Instant::now());
        let ips: Vec<String> = cfg.binds.iter().map(|b| b.unwrap().to_string()).collect();
        assert_eq!(
            ips,
            [
                "127.0.0.10",
                "127.0.0.10",
                "127.0.0.11",
                "127.0.0.11",
                "127.0.0.12",
                "127.0.0.12"
            ]
        );
        assert_eq!(cfg.stop - cfg.start, Duration::from_secs(30));
        let remote = args(&[]);
        let remote = ReadfloodArgs {
            relay: "ws://relay.example:7777".into(),
            ..remote
        };
        assert!(!Plan::new(&remote).unwrap().distinct_ips);
    }

    #[test]
    fn polite_schedules_are_spread() {
        let a = args(&["--polite-clients", "2", "--polite-req-rate", "5"]);
        assert_eq!(req_schedule(&a, 1).0, Duration::from_millis(100));
        assert_eq!(event_schedule(&a, 0).0, Duration::from_millis(250));
        assert_eq!(req_schedule(&a, 0).1, Some(Duration::from_millis(200)));
    }
}
