//! The soak chart: the store's used and file bytes against the target,
//! events accepted and deleted by retention per second, polite OK latency
//! (log scale), acceptance per sample, and the writer's share of time in
//! retention; marks where the ingested bytes pass each multiple of the
//! target.

use super::panel::{Mark, Panel, line};
use super::svg::chart;
use crate::soak::SoakReport;
use crate::soak::summary::SoakSample;

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
