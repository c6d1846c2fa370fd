//! `plot`: draws an overload, readflood or soak JSON report (told apart by
//! `run.command`) as an SVG chart of panels sharing the time axis, with the
//! phase boundaries marked.
//!
//! overload: offered load and goodput, success ratio per class, p99 latency
//! per class (log scale), and the relay's controller series (each scaled to
//! its own maximum). readflood: polite time to EOSE (log scale), polite
//! success, abusive REQs answered and refused per second, the relay's
//! anonymous memory, and its query window (in flight, queued). soak: the
//! store's used and file bytes against the target, events accepted and
//! deleted by retention per second, polite OK latency (log scale),
//! acceptance per sample, and the writer's share of time in retention;
//! marks where the ingested bytes pass each multiple of the target.
//!
//! The SVG is written by hand: a few elements do not justify a plotting library.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use crate::overload::OverloadReport;
use crate::readflood::{ReadSecond, ReadfloodReport};
use crate::soak::SoakReport;
use crate::soak::summary::SoakSample;
use crate::timeline::{ScrapePoint, SecondPoint};

#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// A report written with `overload --json`, `readflood --json` or `soak --out`.
    pub input: PathBuf,
    /// The SVG file to write.
    #[arg(long, short)]
    pub out: PathBuf,
    /// Most controller series drawn (those that vary most).
    #[arg(long, default_value_t = 8)]
    pub max_series: usize,
}

const WIDTH: f64 = 1000.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 300.0;
const TOP: f64 = 40.0;
const GAP: f64 = 40.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// A named line of (t seconds, value) points.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

/// One panel: a title, a y-axis and its lines.
struct Panel {
    title: String,
    unit: String,
    log: bool,
    /// A fixed top of the y-axis (for percentages); otherwise from the data.
    y_max: Option<f64>,
    series: Vec<Series>,
}

pub fn run(args: &PlotArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).context("not a JSON report")?;
    let svg = match value["run"]["command"].as_str() {
        Some("readflood") => {
            let report: ReadfloodReport =
                serde_json::from_value(value).context("not a readflood report")?;
            render_readflood(&report)
        }
        Some("soak") => {
            let report: SoakReport = serde_json::from_value(value).context("not a soak report")?;
            render_soak(&report)
        }
        Some("sybil") => {
            let report: crate::sybil::SybilReport =
                serde_json::from_value(value).context("not a sybil report")?;
            render_sybil(&report)
        }
        _ => {
            let report: OverloadReport =
                serde_json::from_value(value).context("not an overload report")?;
            render(&report, args.max_series)
        }
    };
    std::fs::write(&args.out, svg).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

/// The sybil chart: what was accepted per second of each class, the
/// polite clients' latency, the difficulty asked and the store's size.
pub fn render_sybil(r: &crate::sybil::SybilReport) -> String {
    let stored =
        |p: &crate::timeline::SecondPoint| Some(p.accepted.saturating_sub(p.duplicates) as f64);
    let panels = [
        Panel {
            title: "accepted per second".into(),
            unit: "events/s".into(),
            log: false,
            y_max: None,
            series: vec![
                line(
                    "spam (fresh keys)",
                    per_second(&r.spam_seconds, stored),
                    false,
                ),
                line("polite", per_second(&r.polite_seconds, stored), false),
                line(
                    "spam offered",
                    per_second(&r.spam_seconds, |p| Some(p.offered as f64)),
                    true,
                ),
            ],
        },
        Panel {
            title: "polite OK latency per second".into(),
            unit: "ms".into(),
            log: true,
            y_max: None,
            series: vec![line(
                "polite p99",
                per_second(&r.polite_seconds, |p| {
                    (p.accepted > 0).then_some(p.p99_ms.max(0.01))
                }),
                false,
            )],
        },
        Panel {
            title: "NIP-13 difficulty asked of outsiders".into(),
            unit: "bits".into(),
            log: false,
            y_max: None,
            series: vec![line(
                "sluice_pow_difficulty",
                r.samples
                    .iter()
                    .filter_map(|p| p.pow_difficulty.map(|d| (p.t, d)))
                    .collect(),
                false,
            )],
        },
        Panel {
            title: "store used".into(),
            unit: "MB".into(),
            log: false,
            y_max: None,
            series: vec![line(
                "sluice_store_used_bytes",
                r.samples
                    .iter()
                    .filter_map(|p| p.store_used_bytes.map(|b| (p.t, b / 1e6)))
                    .collect(),
                false,
            )],
        },
    ];
    let title = format!(
        "sybil: {} ({} sources x {}/s fresh keys{}, polite {})",
        r.run.relay.as_deref().unwrap_or("?"),
        r.sources,
        r.rate_per_source,
        if r.mine_bits > 0 {
            format!(", mined {} bits", r.mine_bits)
        } else {
            String::new()
        },
        if r.polite_trusted {
            "trusted"
        } else {
            "outsiders"
        }
    );
    chart(&title, &panels, r.secs.max(1.0), &[])
}

/// A phase boundary: where it starts and its label.
struct Mark {
    t: f64,
    label: String,
}

/// The whole overload chart as SVG text.
pub fn render(r: &OverloadReport, max_series: usize) -> String {
    let t_end = r
        .phases
        .iter()
        .map(|p| p.start_secs + p.secs)
        .fold(1.0, f64::max);
    let panels = [
        throughput_panel(r),
        success_panel(r),
        latency_panel(r),
        controller_panel(r, max_series),
    ];
    let title = format!(
        "overload: {} (capacity {:.0} events/s, {} polite, {} abusive clients)",
        r.run.relay.as_deref().unwrap_or("?"),
        r.capacity,
        r.polite_clients,
        r.abusive_clients
    );
    let marks: Vec<Mark> = r
        .phases
        .iter()
        .map(|p| Mark {
            t: p.start_secs,
            label: format!("{}x", p.multiplier),
        })
        .collect();
    chart(&title, &panels, t_end, &marks)
}

/// The whole readflood chart as SVG text.
pub fn render_readflood(r: &ReadfloodReport) -> String {
    let t_end = r
        .phases
        .iter()
        .map(|p| p.start_secs + p.secs)
        .fold(1.0, f64::max);
    let panels = [
        eose_panel(r),
        polite_success_panel(r),
        abusive_panel(r),
        memory_panel(r),
        query_window_panel(r),
    ];
    let s = &r.settings;
    let title = format!(
        "readflood: {} ({} polite clients, {} abusive addresses x {} REQs open)",
        r.run.relay.as_deref().unwrap_or("?"),
        s.polite_clients,
        s.abusive_addrs * s.abusive_conns_per_addr,
        s.abusive_subs
    );
    let marks: Vec<Mark> = r
        .phases
        .iter()
        .map(|p| Mark {
            t: p.start_secs,
            label: p.name.clone(),
        })
        .collect();
    chart(&title, &panels, t_end, &marks)
}

/// The whole soak chart as SVG text.
pub fn render_soak(r: &SoakReport) -> String {
    let s = &r.samples;
    let t_end = s.last().map_or(1.0, |p| p.t).max(1.0);
    let panels = [
        store_panel(r),
        soak_rates_panel(s),
        soak_latency_panel(s),
        soak_acceptance_panel(s),
        retention_share_panel(s),
    ];
    let set = &r.settings;
    let title = format!(
        "soak: {} ({} writers x {}, {} polite every {} ms, {} authors, {} days of created_at)",
        r.run.relay.as_deref().unwrap_or("?"),
        set.writers,
        set.window,
        set.polite,
        set.polite_interval_ms,
        set.authors,
        set.span_days
    );
    chart(
        &title,
        &panels,
        t_end,
        &target_marks(s, r.summary.target_bytes),
    )
}

/// Where the bytes accepted so far pass each multiple of the target.
fn target_marks(samples: &[SoakSample], target: Option<f64>) -> Vec<Mark> {
    let Some(target) = target.filter(|t| *t > 0.0) else {
        return Vec::new();
    };
    let (mut total, mut next) = (0.0, 1.0);
    let mut marks = Vec::new();
    for s in samples {
        total += s.accepted_bytes as f64;
        while total >= next * target && marks.len() < 20 {
            marks.push(Mark {
                t: s.t,
                label: format!("{next}x target"),
            });
            next += 1.0;
        }
    }
    marks
}

/// One point per sample, at its time.
fn per_sample(samples: &[SoakSample], f: impl Fn(&SoakSample) -> Option<f64>) -> Vec<(f64, f64)> {
    samples
        .iter()
        .filter_map(|s| f(s).map(|v| (s.t, v)))
        .collect()
}

fn store_panel(r: &SoakReport) -> Panel {
    let mib = 1.0 / (1024.0 * 1024.0);
    let s = &r.samples;
    let mut series = vec![
        line(
            "used (sluice_store_used_bytes)",
            per_sample(s, |p| p.relay.store_used_bytes.map(|v| v * mib)),
            false,
        ),
        line(
            "file (sluice_store_file_bytes)",
            per_sample(s, |p| p.relay.store_file_bytes.map(|v| v * mib)),
            false,
        ),
    ];
    series.retain(|l| !l.points.is_empty());
    if let Some(t) = r.summary.target_bytes {
        let end = s.last().map_or(1.0, |p| p.t);
        series.push(line("target", vec![(0.0, t * mib), (end, t * mib)], true));
    }
    Panel {
        title: "relay store size".into(),
        unit: "MiB".into(),
        log: false,
        y_max: None,
        series,
    }
}

fn soak_rates_panel(s: &[SoakSample]) -> Panel {
    let accepted: Vec<(f64, f64)> = s
        .windows(2)
        .filter(|w| w[1].t > w[0].t)
        .map(|w| (w[1].t, w[1].accepted as f64 / (w[1].t - w[0].t)))
        .collect();
    let mut series = vec![line("accepted", accepted, false)];
    let deleted = per_sample(s, |p| p.deletions_per_sec);
    if !deleted.is_empty() {
        series.push(line("deleted by retention", deleted, false));
    }
    Panel {
        title: "events accepted and deleted by retention per second".into(),
        unit: "events/s".into(),
        log: false,
        y_max: None,
        series,
    }
}

fn soak_latency_panel(s: &[SoakSample]) -> Panel {
    Panel {
        title: "polite OK latency per sample".into(),
        unit: "ms".into(),
        log: true,
        y_max: None,
        series: vec![
            line(
                "polite p99",
                per_sample(s, |p| p.polite_p99_ms.map(|v| v.max(0.01))),
                false,
            ),
            line(
                "polite p50",
                per_sample(s, |p| p.polite_p50_ms.map(|v| v.max(0.01))),
                true,
            ),
        ],
    }
}

fn soak_acceptance_panel(s: &[SoakSample]) -> Panel {
    Panel {
        title: "acceptance per sample (accepted / answered)".into(),
        unit: "%".into(),
        log: false,
        y_max: Some(100.0),
        series: vec![
            line(
                "all",
                per_sample(s, |p| p.acceptance().map(|v| v * 100.0)),
                false,
            ),
            line(
                "polite",
                per_sample(s, |p| p.polite_success().map(|v| v * 100.0)),
                false,
            ),
        ],
    }
}

fn retention_share_panel(s: &[SoakSample]) -> Panel {
    let share = per_sample(s, |p| p.retention_share.map(|v| v * 100.0));
    Panel {
        title: "writer's share of time in retention (sluice_retention_step_seconds_sum)".into(),
        unit: "%".into(),
        log: false,
        y_max: Some(100.0),
        series: if share.is_empty() {
            Vec::new()
        } else {
            vec![line("in retention", share, false)]
        },
    }
}

fn chart(title: &str, panels: &[Panel], t_end: f64, marks: &[Mark]) -> String {
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP) + 20.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    text(&mut svg, LEFT, 20.0, title, "start", 14.0);
    for (i, panel) in panels.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL_HEIGHT + GAP);
        draw_panel(&mut svg, panel, top, t_end, marks);
    }
    svg.push_str("</svg>\n");
    svg
}

/// One point per second of a timeline, at the middle of its second.
fn per_second<T>(points: &[T], f: impl Fn(&T) -> Option<f64>) -> Vec<(f64, f64)> {
    points
        .iter()
        .enumerate()
        .filter_map(|(i, p)| f(p).map(|v| (i as f64 + 0.5, v)))
        .collect()
}

fn line(name: &str, points: Vec<(f64, f64)>, dashed: bool) -> Series {
    Series {
        name: name.to_owned(),
        points,
        dashed,
    }
}

fn throughput_panel(r: &OverloadReport) -> Panel {
    let (p, a) = (&r.timeline.polite, &r.timeline.abusive);
    let sum = |f: fn(&SecondPoint) -> u64| -> Vec<(f64, f64)> {
        p.iter()
            .zip(a)
            .enumerate()
            .map(|(i, (x, y))| (i as f64 + 0.5, (f(x) + f(y)) as f64))
            .collect()
    };
    let t_end = p.len().max(a.len()) as f64;
    Panel {
        title: "offered load and goodput".into(),
        unit: "events/s".into(),
        log: false,
        y_max: None,
        series: vec![
            line("offered (all)", sum(|s| s.offered), false),
            line("goodput (all)", sum(|s| s.accepted - s.duplicates), false),
            line(
                "goodput (polite)",
                per_second(p, |s| Some((s.accepted - s.duplicates) as f64)),
                false,
            ),
            line(
                "capacity",
                vec![(0.0, r.capacity), (t_end, r.capacity)],
                true,
            ),
        ],
    }
}

fn success_panel(r: &OverloadReport) -> Panel {
    let ratio =
        |s: &SecondPoint| (s.offered > 0).then(|| 100.0 * s.accepted as f64 / s.offered as f64);
    Panel {
        title: "success ratio (accepted / offered)".into(),
        unit: "%".into(),
        log: false,
        y_max: Some(100.0),
        series: vec![
            line("polite", per_second(&r.timeline.polite, ratio), false),
            line("abusive", per_second(&r.timeline.abusive, ratio), false),
        ],
    }
}

fn latency_panel(r: &OverloadReport) -> Panel {
    let p99 = |s: &SecondPoint| (s.accepted > 0).then_some(s.p99_ms.max(0.01));
    let p50 = |s: &SecondPoint| (s.accepted > 0).then_some(s.p50_ms.max(0.01));
    Panel {
        title: "OK latency of accepted events, by due time".into(),
        unit: "ms".into(),
        log: true,
        y_max: None,
        series: vec![
            line("polite p99", per_second(&r.timeline.polite, p99), false),
            line("abusive p99", per_second(&r.timeline.abusive, p99), false),
            line("polite p50", per_second(&r.timeline.polite, p50), true),
            line("abusive p50", per_second(&r.timeline.abusive, p50), true),
        ],
    }
}

fn eose_panel(r: &ReadfloodReport) -> Panel {
    let t = &r.timeline;
    let p99 = |s: &ReadSecond| (s.eose > 0).then_some(s.p99_ms.max(0.01));
    let p50 = |s: &ReadSecond| (s.eose > 0).then_some(s.p50_ms.max(0.01));
    let ok_p99 = |s: &SecondPoint| (s.accepted > 0).then_some(s.p99_ms.max(0.01));
    Panel {
        title: "polite time to EOSE (and OK), by due time".into(),
        unit: "ms".into(),
        log: true,
        y_max: None,
        series: vec![
            line("polite EOSE p99", per_second(&t.polite_reads, p99), false),
            line("polite EOSE p50", per_second(&t.polite_reads, p50), true),
            line("polite OK p99", per_second(&t.polite_writes, ok_p99), false),
            line("abusive EOSE p99", per_second(&t.abusive_reads, p99), true),
        ],
    }
}

fn polite_success_panel(r: &ReadfloodReport) -> Panel {
    let reads = |s: &ReadSecond| (s.sent > 0).then(|| 100.0 * s.eose as f64 / s.sent as f64);
    let writes =
        |s: &SecondPoint| (s.offered > 0).then(|| 100.0 * s.accepted as f64 / s.offered as f64);
    Panel {
        title: "polite success: REQs with EOSE / sent, EVENTs with OK true / due".into(),
        unit: "%".into(),
        log: false,
        y_max: Some(100.0),
        series: vec![
            line("reads", per_second(&r.timeline.polite_reads, reads), false),
            line(
                "writes",
                per_second(&r.timeline.polite_writes, writes),
                false,
            ),
        ],
    }
}

fn abusive_panel(r: &ReadfloodReport) -> Panel {
    let a = &r.timeline.abusive_reads;
    let n = |f: fn(&ReadSecond) -> u64| per_second(a, move |s| Some(f(s) as f64));
    Panel {
        title: "abusive REQs per second, by send time".into(),
        unit: "REQs/s".into(),
        log: false,
        y_max: None,
        series: vec![
            line("sent", n(|s| s.sent), true),
            line("answered (EOSE)", n(|s| s.eose), false),
            line("refused (CLOSED)", n(|s| s.closed), false),
            line("timed out", n(|s| s.timeouts), false),
        ],
    }
}

/// The values of one scraped series over time.
fn scraped(r: &ReadfloodReport, name: &str, scale: f64) -> Vec<(f64, f64)> {
    let points: &[ScrapePoint] = r.metrics.as_ref().map_or(&[], |m| &m.points);
    points
        .iter()
        .filter_map(|p| p.values.get(name).map(|v| (p.t, v * scale)))
        .collect()
}

fn memory_panel(r: &ReadfloodReport) -> Panel {
    let mib = 1.0 / (1024.0 * 1024.0);
    let series = [
        ("anonymous (/proc)", "proc_rss_anon_bytes"),
        (
            "anonymous (/metrics)",
            "sluice_process_anonymous_memory_bytes",
        ),
    ]
    .iter()
    .map(|(label, name)| line(label, scraped(r, name, mib), false))
    .filter(|s| !s.points.is_empty())
    .collect();
    Panel {
        title: "relay anonymous memory".into(),
        unit: "MiB".into(),
        log: false,
        y_max: None,
        series,
    }
}

/// The query series drawn, by base name.
const QUERY_SERIES: &[&str] = &[
    "sluice_query_window_in_flight",
    "sluice_query_window_queued",
    "sluice_query_open",
];

fn query_window_panel(r: &ReadfloodReport) -> Panel {
    let points: &[ScrapePoint] = r.metrics.as_ref().map_or(&[], |m| &m.points);
    let mut names: Vec<&String> = points
        .iter()
        .flat_map(|p| p.values.keys())
        .filter(|n| QUERY_SERIES.contains(&n.split('{').next().unwrap_or_default()))
        .collect();
    names.sort_by_key(|n| {
        let base = n.split('{').next().unwrap_or_default();
        (QUERY_SERIES.iter().position(|q| *q == base), (*n).clone())
    });
    names.dedup();
    Panel {
        title: "relay queries: in flight, queued".into(),
        unit: "queries".into(),
        log: false,
        y_max: None,
        series: names
            .into_iter()
            .map(|n| line(n.trim_start_matches("sluice_"), scraped(r, n, 1.0), false))
            .collect(),
    }
}

/// Series drawn first when present, by name prefix: the controller's state.
const PREFERRED: &[&str] = &[
    "sluice_throttle_output_ratio",
    "sluice_throttle_process_variable_ratio",
    "sluice_throttle_memory_pressure_ratio",
    "sluice_throttle_load_level_ratio",
    "sluice_throttle_delay_seconds",
    "sluice_throttle_refusals_total",
    "sluice_throttle_emergency",
    "sluice_process_anonymous_memory_bytes",
    "proc_rss_anon_bytes",
];

fn controller_panel(r: &OverloadReport, max_series: usize) -> Panel {
    let points: &[ScrapePoint] = r.metrics.as_ref().map_or(&[], |m| &m.points);
    let mut names: Vec<&String> = points.iter().flat_map(|p| p.values.keys()).collect();
    names.sort();
    names.dedup();
    // Series scraped from /proc/PID are named proc_*; the rest came from /metrics.
    let names_from_metrics = names.iter().any(|n| !n.starts_with("proc_"));
    let mut series: Vec<(usize, f64, Series)> = names
        .into_iter()
        .filter_map(|name| scaled_series(points, name))
        .collect();
    // Preferred series first (in list order), then the ones that vary most.
    series.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
    Panel {
        title: format!(
            "relay series from {source}: ratios in %, others in % of their maximum",
            source = if names_from_metrics {
                "/metrics"
            } else {
                "/proc"
            }
        ),
        unit: "%".into(),
        log: false,
        y_max: Some(100.0),
        series: series
            .into_iter()
            .take(max_series)
            .map(|(_, _, s)| s)
            .collect(),
    }
}

/// A series as percentages, its rank in `PREFERRED` and how much it varies;
/// `None` when it never changes. Counters become rates; ratios are shown as
/// percent; anything else as percent of its own maximum.
fn scaled_series(points: &[ScrapePoint], name: &str) -> Option<(usize, f64, Series)> {
    let raw: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| p.values.get(name).map(|v| (p.t, *v)))
        .collect();
    let base = name.split('{').next().unwrap_or_default();
    let counter = base.ends_with("_total");
    let pts = if counter { rates(&raw) } else { raw };
    let (lo, hi) = pts.iter().fold((f64::MAX, f64::MIN), |(lo, hi), (_, v)| {
        (lo.min(*v), hi.max(*v))
    });
    if hi - lo <= 0.0 || hi <= 0.0 {
        return None;
    }
    let ratio = base.ends_with("_ratio");
    let scale = if ratio { 100.0 } else { 100.0 / hi };
    let scaled = pts.iter().map(|(t, v)| (*t, v * scale)).collect();
    let rank = PREFERRED
        .iter()
        .position(|p| base.starts_with(p))
        .unwrap_or(PREFERRED.len());
    let label = series_label(name, counter, ratio, hi);
    Some((rank, (hi - lo) / hi, line(&label, scaled, false)))
}

/// Per-second rates of a counter between consecutive scrapes (restarts read as 0).
fn rates(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points
        .windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| (w[1].0, ((w[1].1 - w[0].1) / (w[1].0 - w[0].0)).max(0.0)))
        .collect()
}

/// A short legend label: the name without `sluice_throttle_`/`sluice_`,
/// label values without their keys (`{direction="write"}` becomes `{write}`),
/// and the maximum.
fn series_label(name: &str, counter: bool, ratio: bool, max: f64) -> String {
    let (base, labels) = name.split_once('{').unwrap_or((name, ""));
    let base = base
        .trim_start_matches("sluice_throttle_")
        .trim_start_matches("sluice_");
    let values: Vec<&str> = labels
        .trim_end_matches('}')
        .split(',')
        .filter_map(|kv| kv.split_once('=').map(|(_, v)| v.trim_matches('"')))
        .collect();
    let short = if values.is_empty() {
        base.to_owned()
    } else {
        format!("{base}{{{}}}", values.join(","))
    };
    let short: String = short.chars().take(36).collect();
    match (counter, ratio) {
        (true, _) => format!("{short} (max {}/s)", short_number(max)),
        (false, true) => short,
        (false, false) => format!("{short} (max {})", short_number(max)),
    }
}

/// A round tick step (1, 2 or 5 times a power of ten) near `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    let f = raw / pow;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * pow
}

/// Maps data to pixels inside one panel.
struct Frame {
    top: f64,
    t_end: f64,
    y_lo: f64,
    y_hi: f64,
    log: bool,
}

impl Frame {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t / self.t_end).clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let (lo, hi, v) = if self.log {
            (
                self.y_lo.log10(),
                self.y_hi.log10(),
                v.max(self.y_lo).log10(),
            )
        } else {
            (self.y_lo, self.y_hi, v)
        };
        let f = if hi > lo {
            ((v - lo) / (hi - lo)).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.top + PANEL_HEIGHT * (1.0 - f)
    }
}

fn y_range(panel: &Panel) -> (f64, f64) {
    let values = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1));
    let hi = values.clone().fold(0.0f64, f64::max);
    if panel.log {
        let lo = values.filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
        let lo = if lo == f64::MAX {
            0.1
        } else {
            10f64.powf(lo.log10().floor())
        };
        (lo, 10f64.powf(hi.max(lo * 10.0).log10().ceil()))
    } else if let Some(max) = panel.y_max {
        (0.0, max)
    } else {
        let step = nice_step(hi / 4.0);
        (0.0, ((hi * 1.05 / step).ceil() * step).max(step))
    }
}

fn draw_panel(svg: &mut String, panel: &Panel, top: f64, t_end: f64, marks: &[Mark]) {
    let (y_lo, y_hi) = y_range(panel);
    let frame = Frame {
        top,
        t_end,
        y_lo,
        y_hi,
        log: panel.log,
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/>"##
    );
    text(
        svg,
        LEFT,
        top - 6.0,
        &format!("{} [{}]", panel.title, panel.unit),
        "start",
        12.0,
    );
    draw_y_ticks(svg, &frame);
    draw_phases(svg, &frame, marks);
    for (i, s) in panel.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        draw_series(svg, &frame, s, color);
        let ly = top + 12.0 + i as f64 * 15.0;
        let lx = WIDTH - RIGHT + 10.0;
        let dash = if s.dashed {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = write!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>"#,
            lx + 18.0
        );
        text(svg, lx + 22.0, ly + 4.0, &s.name, "start", 10.0);
    }
    if panel.series.is_empty() {
        text(
            svg,
            LEFT + plot_w / 2.0,
            top + PANEL_HEIGHT / 2.0,
            "no data recorded",
            "middle",
            12.0,
        );
    }
}

fn draw_y_ticks(svg: &mut String, f: &Frame) {
    let ticks: Vec<f64> = if f.log {
        let (a, b) = (f.y_lo.log10().round() as i32, f.y_hi.log10().round() as i32);
        (a..=b).map(|e| 10f64.powi(e)).collect()
    } else {
        let step = nice_step((f.y_hi - f.y_lo) / 4.0);
        let n = ((f.y_hi - f.y_lo) / step).round() as i32;
        (0..=n).map(|i| f.y_lo + step * f64::from(i)).collect()
    };
    for v in ticks {
        let y = f.y(v);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/>"##,
            WIDTH - RIGHT
        );
        text(svg, LEFT - 5.0, y + 4.0, &short_number(v), "end", 10.0);
    }
}

fn draw_phases(svg: &mut String, f: &Frame, marks: &[Mark]) {
    for m in marks {
        let x = f.x(m.t);
        let bottom = f.top + PANEL_HEIGHT;
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{bottom}" stroke="#aaa" stroke-dasharray="2 3"/>"##,
            f.top
        );
        text(svg, x + 3.0, bottom - 4.0, &m.label, "start", 10.0);
    }
    let bottom = f.top + PANEL_HEIGHT;
    let step = nice_step(f.t_end / 10.0);
    let mut t = 0.0;
    while t <= f.t_end + 1e-9 {
        text(svg, f.x(t), bottom + 13.0, &format!("{t}s"), "middle", 9.0);
        t += step;
    }
}

fn draw_series(svg: &mut String, f: &Frame, s: &Series, color: &str) {
    if s.points.is_empty() {
        return;
    }
    let pts: Vec<String> = s
        .points
        .iter()
        .map(|(t, v)| format!("{:.1},{:.1}", f.x(*t), f.y(*v)))
        .collect();
    let dash = if s.dashed {
        r#" stroke-dasharray="4 3""#
    } else {
        ""
    };
    let _ = write!(
        svg,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{}"/>"#,
        pts.join(" ")
    );
}

fn text(svg: &mut String, x: f64, y: f64, s: &str, anchor: &str, size: f64) {
    let escaped = s
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let _ = write!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-size="{size}">{escaped}</text>"#
    );
}

fn short_number(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(12_500.0), "12.5k");
        assert_eq!(short_number(2.5e6), "2.5M");
        assert_eq!(short_number(0.25), "0.25");
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.9), 1.0);
        assert_eq!(nice_step(1.2), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(700.0), 1000.0);
    }

    #[test]
    fn labels_are_compact() {
        let l = series_label(
            "sluice_throttle_delay_seconds{direction=\"write\"}",
            false,
            false,
            0.2,
        );
        assert_eq!(l, "delay_seconds{write} (max 0.20)");
        assert_eq!(
            series_label("sluice_throttle_output_ratio", false, true, 1.0),
            "output_ratio"
        );
    }

    #[test]
    fn counters_become_rates() {
        assert_eq!(
            rates(&[(0.0, 10.0), (2.0, 30.0), (3.0, 5.0)]),
            vec![(2.0, 10.0), (3.0, 0.0)]
        );
    }

    #[test]
    fn log_frame_maps_decades_evenly() {
        let f = Frame {
            top: 0.0,
            t_end: 10.0,
            y_lo: 1.0,
            y_hi: 100.0,
            log: true,
        };
        assert_eq!(f.y(1.0), PANEL_HEIGHT);
        assert_eq!(f.y(10.0), PANEL_HEIGHT / 2.0);
        assert_eq!(f.y(100.0), 0.0);
    }
}
