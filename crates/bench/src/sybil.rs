//! `sybil`: a flood of fresh keys from many addresses, each address under
//! its per-IP rate and every event signed by a key never seen before (so no
//! per-IP or per-pubkey bucket binds), beside polite clients the relay's
//! web of trust knows. Reports what of the spam was accepted per second,
//! the polite clients' success and latency, the NIP-13 difficulty the relay
//! asked over time, its store's growth and its memory, from /metrics.
//!
//! The trust setup is reproducible from `--seed`: `--print-seed` prints the
//! seed pubkey to put in `trust.seed_pubkeys`; the run first publishes that
//! seed's kind-3 list naming the polite clients' keys. Spam may be mined
//! (`--mine-bits`, NIP-13 with a committed target) before the clock
//! starts: the report says what that cost per event. With `--polite-auth`
//! the polite clients authenticate (NIP-42) first (`authed.rs`): the
//! budgets' measurement, `crates/bench/scripts/budgets.sh`.

mod authed;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use sluice_proto::Event;
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
pub struct SybilArgs {
    /// The relay (ws://...); not needed with --print-seed.
    pub relay: Option<String>,
    /// Print the seed pubkey (for `trust.seed_pubkeys`) and the polite
    /// clients' pubkeys, then exit.
    #[arg(long)]
    pub print_seed: bool,
    /// Spamming source addresses (127.6.x.y on a loopback relay).
    #[arg(long, default_value_t = 300)]
    pub sources: usize,
    /// EVENTs per second from each source, each by a fresh key.
    #[arg(long, default_value_t = 8.0)]
    pub rate_per_source: f64,
    #[arg(long, default_value_t = 20.0)]
    pub secs: f64,
    /// Polite clients (keys the seed follows), one address each.
    #[arg(long, default_value_t = 3)]
    pub polite: usize,
    /// EVENTs per second per polite client.
    #[arg(long, default_value_t = 2.0)]
    pub polite_rate: f64,
    /// Mine every spam event to this NIP-13 difficulty first (0: none).
    #[arg(long, default_value_t = 0)]
    pub mine_bits: u32,
    /// Mine the polite clients' events to this difficulty (a polite
    /// outsider that pays).
    #[arg(long, default_value_t = 0)]
    pub polite_mine_bits: u32,
    /// Do not publish the seed's follow list (the polite clients are then
    /// outsiders like the spam).
    #[arg(long)]
    pub polite_untrusted: bool,
    /// The polite clients authenticate (NIP-42) as their keys first.
    #[arg(long)]
    pub polite_auth: bool,
    #[arg(long, default_value_t = 200)]
    pub content_bytes: usize,
    #[arg(long, default_value_t = 5_000)]
    pub timeout_ms: u64,
    #[arg(long, default_value_t = 500)]
    pub scrape_ms: u64,
    /// Metrics page [default: http://<relay host:port>/metrics].
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Also sample the relay process's memory from /proc/<pid>/status.
    #[arg(long)]
    pub pid: Option<u32>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run the spam in this process instead of a child process (the
    /// load generator's own scheduling then shows in the polite latency).
    #[arg(long)]
    pub in_process: bool,
    /// Internal: this process is the spam half, writing its report here.
    #[arg(long, hide = true)]
    pub spam_report: Option<PathBuf>,
}

/// What the spam half measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SpamPart {
    pub tally: TallyReport,
    pub seconds: Vec<SecondPoint>,
    pub mine_secs_per_event: f64,
}

/// One sample of what the relay showed.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SybilPoint {
    pub t: f64,
    pub pow_difficulty: Option<f64>,
    pub store_used_bytes: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub trust_pubkeys: Option<f64>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SybilReport {
    pub run: RunInfo,
    pub sources: usize,
    pub rate_per_source: f64,
    pub secs: f64,
    pub mine_bits: u32,
    /// Bench-side seconds of mining per spam event (before the clock).
    pub mine_secs_per_event: f64,
    pub polite_mine_bits: u32,
    /// Bench-side seconds of mining per polite event.
    #[serde(default)]
    pub polite_mine_secs_per_event: f64,
    #[serde(default)]
    pub polite_clients: usize,
    pub polite_trusted: bool,
    #[serde(default)]
    pub polite_auth: bool,
    pub spam: TallyReport,
    pub polite: TallyReport,
    /// Spam stored per second (accepted, not duplicates).
    pub spam_accepted_per_sec: f64,
    pub store_growth_bytes: Option<f64>,
    pub resident_start_bytes: Option<f64>,
    pub resident_end_bytes: Option<f64>,
    pub difficulty_max: Option<f64>,
    pub difficulty_end: Option<f64>,
    pub samples: Vec<SybilPoint>,
    /// Per second of the run: what each class offered and got.
    pub spam_seconds: Vec<SecondPoint>,
    pub polite_seconds: Vec<SecondPoint>,
    pub metrics: Option<Scrapes>,
}

struct Keys {
    seed: [u8; 32],
    polite: Vec<[u8; 32]>,
}

fn keys(args: &SybilArgs) -> Keys {
    let mut rng = Rng::new(args.seed);
    let seed = rng.secret_key();
    let polite = (0..args.polite).map(|_| rng.secret_key()).collect();
    Keys { seed, polite }
}

pub fn print_seed(args: &SybilArgs) {
    let k = keys(args);
    let hex = |sk: &[u8; 32]| sluice_proto::hex32::encode(&sluice_proto::event::public_key_of(sk));
    println!("seed pubkey: {}", hex(&k.seed));
    for (i, p) in k.polite.iter().enumerate() {
        println!("polite {i}: {}", hex(p));
    }
    println!(
        "relay config:\n[trust]\nseed_pubkeys = [\"{}\"]\noutsider_writes = \"limited\"",
        hex(&k.seed)
    );
}

/// Signs one event per spec, mined to `bits` (a nonce tag committing to
/// `bits`) when above 0, on every core.
fn sign_mined(specs: Vec<Spec>, bits: u32) -> Vec<Event> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    if bits == 0 {
        return sign_parallel(specs, threads);
    }
    let chunk = specs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|spec| {
                            // Hash only while searching (the id is the
                            // SHA-256 of the canonical form); sign the
                            // winner once.
                            let mut tags = spec.tags.clone();
                            tags.push(vec!["nonce".into(), "0".into(), bits.to_string()]);
                            let mut probe = Event::sign(
                                &spec.secret_key,
                                spec.created_at,
                                spec.kind,
                                tags,
                                &spec.content,
                            );
                            let at = probe.tags.len() - 1;
                            let mut nonce = 0u64;
                            while sluice_proto::pow::leading_zero_bits(&probe.compute_id()) < bits {
                                nonce += 1;
                                probe.tags[at][1] = nonce.to_string();
                            }
                            Event::sign(
                                &spec.secret_key,
                                spec.created_at,
                                spec.kind,
                                probe.tags,
                                &spec.content,
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

fn prepared(events: Vec<Event>) -> Vec<Prepared> {
    events
        .iter()
        .filter_map(|e| Prepared::from_raw(e.raw()).ok())
        .collect()
}

/// Signs the spam: one fresh key per event, mined when asked. Returns one
/// pool per source and the mining time per event.
fn sign_spam(args: &SybilArgs, tag: &str, now: u64) -> (Vec<Vec<Prepared>>, f64) {
    let mut rng = Rng::new(args.seed ^ unix_now() ^ 0x5eed);
    let per_source = (args.rate_per_source * args.secs).ceil() as usize;
    let specs: Vec<Spec> = (0..per_source * args.sources)
        .map(|_| Spec {
            secret_key: rng.secret_key(),
            created_at: now,
            kind: 1,
            tags: vec![vec!["t".into(), tag.to_owned()]],
            content: text_of_len(&mut rng, args.content_bytes),
        })
        .collect();
    let mined_from = Instant::now();
    let events = sign_mined(specs, args.mine_bits);
    let mine_secs_per_event = if args.mine_bits > 0 {
        mined_from.elapsed().as_secs_f64() / events.len().max(1) as f64
    } else {
        0.0
    };
    let mut all = prepared(events);
    let mut pools = Vec::new();
    for _ in 0..args.sources {
        let rest = all.split_off(per_source.min(all.len()));
        pools.push(all);
        all = rest;
    }
    (pools, mine_secs_per_event)
}

fn publisher_cfg(
    args: &SybilArgs,
    relay: &RelayUrl,
    bind: Option<std::net::IpAddr>,
    t0: Instant,
) -> PublisherConfig {
    PublisherConfig {
        relay: relay.clone(),
        bind,
        window: 1,
        max_inflight: 1_000,
        timeout: Duration::from_millis(args.timeout_ms),
        stop_at: t0 + Duration::from_secs_f64(args.secs),
    }
}

/// An open-loop publisher's schedule at `rate`, its first event `i/n` of
/// a period after `t0`: independent clients are not phase-locked, so the
/// flood arrives smoothly rather than as bursts of every source at once.
fn open_loop(
    args: &SybilArgs,
    (rate, i, n): (f64, usize, usize),
    pool: Vec<Prepared>,
    rec: Arc<PhasedRecorder>,
    t0: Instant,
) -> Shared {
    let limit = pool.len() as u64;
    let offset = (i as f64 / n.max(1) as f64) / rate;
    Shared {
        source: Arc::new(Source::pool(pool, limit)),
        schedule: Arc::new(Schedule::Open(vec![
            Phase {
                rate: 0.0,
                secs: offset,
            },
            Phase {
                rate,
                secs: (args.secs - offset).max(0.0),
            },
        ])),
        recorder: rec as Arc<dyn Recorder>,
        t0,
    }
}

/// Runs the spam from `t0`: one publisher per source address.
async fn run_spam(
    args: &SybilArgs,
    relay: &RelayUrl,
    pools: Vec<Vec<Prepared>>,
    t0: Instant,
) -> anyhow::Result<(TallyReport, Vec<SecondPoint>)> {
    let distinct = relay.host.starts_with("127.");
    let phases = [args.secs];
    let rec = Arc::new(PhasedRecorder::new(t0, &phases));
    let mut tasks = Vec::new();
    for (i, pool) in pools.into_iter().enumerate() {
        let shared = open_loop(
            args,
            (args.rate_per_source, i, args.sources),
            pool,
            rec.clone(),
            t0,
        );
        let bind = distinct.then(|| loopback_source(6, i));
        tasks.push(tokio::spawn(run_publisher(
            publisher_cfg(args, relay, bind, t0),
            shared,
        )));
    }
    for t in tasks {
        t.await?;
    }
    Ok((rec.phase_reports(&phases).remove(0), rec.seconds()))
}

/// The spam half in its own process: signs, says when it starts
/// (`ready <t0 unix ms>` on stdout), runs, writes its report.
pub async fn run_spam_role(args: &SybilArgs) -> anyhow::Result<()> {
    let Some(path) = args.spam_report.as_deref() else {
        bail!("--spam-report is internal");
    };
    let relay = RelayUrl::parse(args.relay.as_deref().unwrap_or_default())?;
    let now = unix_now();
    let (pools, mine_secs_per_event) = sign_spam(args, &format!("sluice-bench-sybil-{now}"), now);
    let t0_ms = crate::readflood::unix_ms_now() + 500;
    println!("ready {t0_ms}");
    use std::io::Write as _;
    std::io::stdout().flush()?;
    let t0 = crate::readflood::instant_at_unix_ms(t0_ms);
    let (tally, seconds) = run_spam(args, &relay, pools, t0).await?;
    let part = SpamPart {
        tally,
        seconds,
        mine_secs_per_event,
    };
    std::fs::write(path, serde_json::to_string(&part)?)?;
    Ok(())
}

/// The spam half: a child process (or, with `--in-process`, tasks of this
/// one); resolves to its start and then its report.
async fn start_spam(
    args: &SybilArgs,
    relay: &RelayUrl,
) -> anyhow::Result<(Instant, tokio::task::JoinHandle<anyhow::Result<SpamPart>>)> {
    if args.in_process || args.sources == 0 {
        let now = unix_now();
        let (pools, mine_secs_per_event) =
            sign_spam(args, &format!("sluice-bench-sybil-{now}"), now);
        let t0 = Instant::now() + Duration::from_millis(300);
        let (a, r) = (args.clone(), relay.clone());
        let task = tokio::spawn(async move {
            let (tally, seconds) = run_spam(&a, &r, pools, t0).await?;
            Ok(SpamPart {
                tally,
                seconds,
                mine_secs_per_event,
            })
        });
        return Ok((t0, task));
    }
    let report = std::env::temp_dir().join(format!(
        "sluice-bench-sybil-{}-{}.json",
        std::process::id(),
        unix_now()
    ));
    let exe = std::env::current_exe()?;
    let mut child_args: Vec<String> = vec![
        "sybil".into(),
        args.relay.clone().unwrap_or_default(),
        "--spam-report".into(),
        report.display().to_string(),
    ];
    for (flag, value) in [
        ("--sources", args.sources.to_string()),
        ("--rate-per-source", args.rate_per_source.to_string()),
        ("--secs", args.secs.to_string()),
        ("--mine-bits", args.mine_bits.to_string()),
        ("--content-bytes", args.content_bytes.to_string()),
        ("--timeout-ms", args.timeout_ms.to_string()),
        ("--seed", args.seed.to_string()),
    ] {
        child_args.push(flag.into());
        child_args.push(value);
    }
    let mut child = std::process::Command::new(exe)
        .args(child_args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take();
    let ready = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        use std::io::BufRead as _;
        let Some(out) = stdout else {
            bail!("no stdout from the spam process")
        };
        for line in std::io::BufReader::new(out).lines() {
            if let Some(ms) = line?.strip_prefix("ready ") {
                return Ok(ms.trim().parse()?);
            }
        }
        bail!("the spam process ended before it started")
    })
    .await??;
    let t0 = crate::readflood::instant_at_unix_ms(ready);
    let task = tokio::task::spawn_blocking(move || -> anyhow::Result<SpamPart> {
        let status = child.wait()?;
        let text = std::fs::read_to_string(&report);
        let _ = std::fs::remove_file(&report);
        if !status.success() {
            bail!("the spam process failed ({status})");
        }
        Ok(serde_json::from_str(&text?)?)
    });
    Ok((t0, task))
}

pub async fn run(args: &SybilArgs) -> anyhow::Result<SybilReport> {
    let Some(url) = args.relay.as_deref() else {
        bail!("give the relay's URL (or --print-seed)");
    };
    let relay = RelayUrl::parse(url)?;
    let mut info = RunInfo::new("sybil", Some(url));
    let distinct = relay.host.starts_with("127.");
    let k = keys(args);
    let mut rng = Rng::new(args.seed ^ unix_now());
    let now = unix_now();
    let tag = format!("sluice-bench-sybil-{now}");
    let timeout = Duration::from_millis(args.timeout_ms);

    // The seed follows the polite clients.
    if !args.polite_untrusted {
        let follows: Vec<Vec<String>> = k
            .polite
            .iter()
            .map(|sk| {
                vec![
                    "p".into(),
                    sluice_proto::hex32::encode(&sluice_proto::event::public_key_of(sk)),
                ]
            })
            .collect();
        let list = Event::sign(&k.seed, now, 3, follows, "");
        let totals = Arc::new(Totals::default());
        let t0 = Instant::now();
        let shared = Shared {
            source: Arc::new(Source::pool(prepared(vec![list]), 1)),
            schedule: Arc::new(Schedule::ClosedLoop),
            recorder: totals.clone(),
            t0,
        };
        let cfg = PublisherConfig {
            relay: relay.clone(),
            bind: distinct.then(|| loopback_source(5, 0)),
            window: 1,
            max_inflight: 1,
            timeout,
            stop_at: t0 + timeout,
        };
        run_publisher(cfg, shared).await;
        let (tally, _, _) = totals.snapshot();
        let r = tally.report(1.0);
        if r.accepted != 1 {
            bail!(
                "the relay did not take the seed's follow list ({}): is trust.seed_pubkeys set to the pubkey --print-seed shows?",
                r.refused_prefixes
            );
        }
    }
    let polite_per = (args.polite_rate * args.secs).ceil() as usize;
    let polite_mined_from = Instant::now();
    let polite_pools: Vec<Vec<Prepared>> = k
        .polite
        .iter()
        .map(|sk| {
            let specs = (0..polite_per)
                .map(|_| Spec {
                    secret_key: *sk,
                    created_at: now,
                    kind: 1,
                    tags: vec![vec!["t".into(), tag.clone()]],
                    content: text_of_len(&mut rng, args.content_bytes),
                })
                .collect();
            prepared(sign_mined(specs, args.polite_mine_bits))
        })
        .collect();
    let polite_mine_secs_per_event = if args.polite_mine_bits > 0 {
        polite_mined_from.elapsed().as_secs_f64() / (polite_per * args.polite).max(1) as f64
    } else {
        0.0
    };
    println!(
        "sybil: signing {} spam events (one fresh key each{}) ...",
        (args.rate_per_source * args.secs).ceil() as usize * args.sources,
        if args.mine_bits > 0 {
            format!(", mined to {} bits", args.mine_bits)
        } else {
            String::new()
        }
    );
    let (t0, spam_task) = start_spam(args, &relay).await?;
    let phases = [args.secs];
    let polite_rec = Arc::new(PhasedRecorder::new(t0, &phases));
    let (stop_tx, stop_rx) = watch::channel(false);
    let target = ScrapeTarget {
        url: Some(
            args.metrics_url
                .clone()
                .unwrap_or_else(|| format!("{}/metrics", relay.http_base())),
        ),
        prefixes: vec![
            "sluice_pow_".into(),
            "sluice_store_used_bytes".into(),
            "sluice_trust_".into(),
            "sluice_process_resident_memory_bytes".into(),
            "sluice_throttle_refusals_total".into(),
            "sluice_throttle_budget_".into(),
        ],
        pid: args.pid,
    };
    let scraper = tokio::spawn(scrape_loop(
        target,
        t0,
        Duration::from_millis(args.scrape_ms.max(50)),
        stop_rx,
    ));
    let mut tasks = Vec::new();
    for (i, pool) in polite_pools.into_iter().enumerate() {
        let bind = distinct.then(|| loopback_source(2, i));
        if args.polite_auth {
            let a = authed::Authed {
                relay: relay.clone(),
                url: url.to_owned(),
                bind,
                secret_key: k.polite[i],
                rate: args.polite_rate,
                offset_secs: (2 * i + 1) as f64 / (2 * args.polite) as f64 / args.polite_rate,
                timeout,
            };
            let stop = t0 + Duration::from_secs_f64(args.secs);
            tasks.push(tokio::spawn(authed::run(
                a,
                pool,
                polite_rec.clone(),
                (t0, stop),
            )));
            continue;
        }
        // Half a slot later than evenly spread: not on a spam source's beat.
        let shared = open_loop(
            args,
            (args.polite_rate, 2 * i + 1, 2 * args.polite),
            pool,
            polite_rec.clone(),
            t0,
        );
        tasks.push(tokio::spawn(run_publisher(
            publisher_cfg(args, &relay, bind, t0),
            shared,
        )));
    }
    for t in tasks {
        t.await?;
    }
    let spam_part = spam_task.await??;
    stop_tx.send(true).ok();
    let metrics = scraper.await?;
    let spam = spam_part.tally;
    let polite = polite_rec.phase_reports(&phases).remove(0);
    let samples: Vec<SybilPoint> = metrics
        .points
        .iter()
        .map(|p| {
            let v = |name: &str| p.values.get(name).copied();
            SybilPoint {
                t: p.t,
                pow_difficulty: v("sluice_pow_difficulty"),
                store_used_bytes: v("sluice_store_used_bytes"),
                resident_bytes: v("sluice_process_resident_memory_bytes"),
                trust_pubkeys: v("sluice_trust_pubkeys"),
            }
        })
        .collect();
    let first = |f: fn(&SybilPoint) -> Option<f64>| samples.iter().find_map(f);
    let last = |f: fn(&SybilPoint) -> Option<f64>| samples.iter().rev().find_map(f);
    let store_growth_bytes = match (first(|p| p.store_used_bytes), last(|p| p.store_used_bytes)) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let difficulty_max = samples
        .iter()
        .filter_map(|p| p.pow_difficulty)
        .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
    info.finish();
    Ok(SybilReport {
        run: info,
        sources: args.sources,
        rate_per_source: args.rate_per_source,
        secs: args.secs,
        mine_bits: args.mine_bits,
        mine_secs_per_event: spam_part.mine_secs_per_event,
        polite_mine_bits: args.polite_mine_bits,
        polite_mine_secs_per_event,
        polite_clients: args.polite,
        polite_trusted: !args.polite_untrusted,
        polite_auth: args.polite_auth,
        spam_accepted_per_sec: spam.stored_per_sec,
        spam,
        polite,
        store_growth_bytes,
        resident_start_bytes: first(|p| p.resident_bytes),
        resident_end_bytes: last(|p| p.resident_bytes),
        difficulty_max,
        difficulty_end: last(|p| p.pow_difficulty),
        samples,
        spam_seconds: spam_part.seconds,
        polite_seconds: polite_rec.seconds(),
        metrics: Some(metrics),
    })
}

impl SybilReport {
    pub fn print(&self) {
        let mb = |b: Option<f64>| b.map_or("?".into(), |b| format!("{:.1} MB", b / 1e6));
        println!(
            "sybil: {} sources x {}/s of fresh keys for {} s{}; {} polite clients ({})",
            self.sources,
            self.rate_per_source,
            self.secs,
            if self.mine_bits > 0 {
                format!(
                    ", mined to {} bits ({:.2} ms of mining per event here)",
                    self.mine_bits,
                    self.mine_secs_per_event * 1e3
                )
            } else {
                String::new()
            },
            self.polite_clients,
            match (self.polite_auth, self.polite_trusted) {
                (true, _) => "authenticated",
                (false, true) => "in the web of trust",
                (false, false) => "outsiders",
            }
        );
        println!("  {}", self.run.cpu_line());
        println!(
            "  spam accepted: {:.1}/s ({} of {} offered)",
            self.spam_accepted_per_sec, self.spam.accepted, self.spam.offered
        );
        self.spam.print("  spam:   ");
        self.polite.print("  polite: ");
        println!(
            "  polite success {:.1}%, OK p99 {:.1} ms",
            self.polite.success_ratio * 100.0,
            self.polite.accepted_latency.p99_ms
        );
        if self.polite_mine_bits > 0 {
            println!(
                "  polite events mined to {} bits: {:.1} ms of mining per event here",
                self.polite_mine_bits,
                self.polite_mine_secs_per_event * 1e3
            );
        }
        println!(
            "  store grew {}, resident memory {} -> {}, difficulty max {:?} end {:?}",
            mb(self.store_growth_bytes),
            mb(self.resident_start_bytes),
            mb(self.resident_end_bytes),
            self.difficulty_max,
            self.difficulty_end
        );
    }
}
