//! The sybil chart: what was accepted per second of each class, the polite
//! clients' latency, the difficulty asked and the store's size.

use super::panel::{Panel, line, per_second};
use super::svg::chart;

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
