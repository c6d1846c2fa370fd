//! The overload chart: offered load and goodput, success ratio per
//! class, p99 latency per class (log scale), and the relay's controller
//! series (each scaled to its own maximum).

use super::panel::{Mark, Panel, Series, line, per_second};
use super::svg::{chart, short_number};
use crate::overload::OverloadReport;
use crate::timeline::{ScrapePoint, SecondPoint};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
