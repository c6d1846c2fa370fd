//! The readflood chart: polite time to EOSE (log scale), polite success,
//! abusive REQs answered and refused per second, the relay's anonymous
//! memory, and its query window (in flight, queued).

use super::panel::{Mark, Panel, line, per_second};
use super::svg::chart;
use crate::readflood::{ReadSecond, ReadfloodReport};
use crate::timeline::{ScrapePoint, SecondPoint};

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
