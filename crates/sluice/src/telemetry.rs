//! Logging and the metrics recorder.

use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Logs to standard error; RUST_LOG overrides the configured level.
pub fn init_logging(cfg: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests calling run twice) is harmless: keep the first.
    let _ = if cfg.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Seconds buckets from 50 µs to 10 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the global Prometheus recorder and returns its handle.
pub fn init_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_events".into()), BATCH_BUCKETS)?
        .install_recorder()
        .context("installing the metrics recorder")?;
    // Histogram samples wait in the recorder until a render or an upkeep
    // folds them into their buckets: with nobody scraping /metrics they
    // would pile up without bound (some 48 bytes per connection opened).
    // Folded every 5 s here, whoever scrapes.
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("sluice-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        })
        .context("starting the metrics upkeep thread")?;
    metrics::gauge!("sluice_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    for d in described_metrics(METRICS_DOC) {
        match d.kind {
            "counter" => metrics::describe_counter!(d.name, d.help),
            "gauge" => metrics::describe_gauge!(d.name, d.help),
            "histogram" => metrics::describe_histogram!(d.name, d.help),
            _ => {}
        }
    }
    Ok(handle)
}

/// The operator's reference, whose tables `tests/metrics_doc.rs` keeps equal
/// to the names in the code: the one source of each metric's `# HELP` text.
const METRICS_DOC: &str = include_str!("../../../docs/metrics.md");

/// One row of a docs/metrics.md table.
#[derive(Debug, PartialEq)]
struct Described {
    name: String,
    kind: &'static str,
    help: String,
}

/// The rows `| `sluice_x` | type | labels | meaning |` of the doc, with the
/// meaning's Markdown backticks removed.
fn described_metrics(doc: &str) -> Vec<Described> {
    doc.lines()
        .filter_map(|line| {
            let row = line.trim().strip_prefix('|')?.strip_suffix('|')?;
            let mut cells = row.splitn(4, '|').map(str::trim);
            let name = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            if !name.starts_with("sluice_") {
                return None;
            }
            let kind = match cells.next()? {
                "counter" => "counter",
                "gauge" => "gauge",
                "histogram" => "histogram",
                _ => return None,
            };
            let _labels = cells.next()?;
            let help = cells.next()?.replace('`', "");
            Some(Described {
                name: name.to_owned(),
                kind,
                help,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_metric_gets_its_meaning_as_help() {
        let rows = described_metrics(METRICS_DOC);
        assert!(rows.len() >= 50, "only {} rows parsed", rows.len());
        let open = rows
            .iter()
            .find(|d| d.name == "sluice_connections_open")
            .expect("documented");
        assert_eq!(open.kind, "gauge");
        assert_eq!(open.help, "WebSocket connections open now.");
        assert!(
            rows.iter()
                .all(|d| !d.help.is_empty() && !d.help.contains('`'))
        );
        let refused = rows
            .iter()
            .find(|d| d.name == "sluice_connections_refused_total")
            .expect("documented");
        assert!(
            refused.help.contains("server.max_connections"),
            "{}",
            refused.help
        );
    }
}
