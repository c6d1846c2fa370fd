//! Logging and the metrics recorder.

use std::sync::Arc;

use anyhow::Context;
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use sluice_server::pages::status::{Series, Tap};
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
    install(|prometheus| prometheus)
}

/// Installs the global Prometheus recorder under the live status's tap
/// (`sluice_server::pages::status::Tap`), and returns the recorder's
/// handle and the series the tap keeps for the status sampler.
pub fn init_metrics_with_status() -> anyhow::Result<(PrometheusHandle, Arc<Series>)> {
    let series = Arc::new(Series::default());
    let handle = install(|prometheus| Tap::new(prometheus, series.clone()))?;
    Ok((handle, series))
}

/// The Prometheus recorder, with the relay's histogram buckets.
fn prometheus() -> anyhow::Result<PrometheusRecorder> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_events".into()), BATCH_BUCKETS)?
        .build_recorder())
}

/// Installs `wrap(the Prometheus recorder)` as the global recorder, starts
/// the upkeep of its histograms and describes every documented metric.
fn install<R: metrics::Recorder + Sync + 'static>(
    wrap: impl FnOnce(PrometheusRecorder) -> R,
) -> anyhow::Result<PrometheusHandle> {
    let recorder = prometheus()?;
    let handle = recorder.handle();
    metrics::set_global_recorder(wrap(recorder))
        .map_err(|e| anyhow::anyhow!("installing the metrics recorder: {e}"))?;
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

    /// The sum of `name`'s samples in a Prometheus text, over their labels.
    fn rendered(text: &str, name: &str) -> f64 {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(head, _)| head.split('{').next() == Some(name))
            .map(|(_, v)| v.parse::<f64>().expect("a number"))
            .sum()
    }

    #[test]
    fn the_status_tap_keeps_what_metrics_renders() {
        use sluice_engine::metrics_names as em;
        let series = Arc::new(Series::default());
        let recorder = prometheus().unwrap();
        let handle = recorder.handle();
        let tap = Tap::new(recorder, series.clone());
        metrics::with_local_recorder(&tap, || {
            // Increments summed over label sets; `absolute` and `set` on
            // the series the relay records that way, with one label set.
            let one_key = [em::QUERY_ADMITTED_TOTAL, em::STORE_USED_BYTES];
            for (i, name) in Series::names().enumerate() {
                let n = i as u64 + 1;
                if one_key.contains(&name) {
                    continue;
                }
                if name.ends_with("_total") {
                    metrics::counter!(name, "direction" => "read", "layer" => "ip_bucket")
                        .increment(n);
                    metrics::counter!(name, "direction" => "write", "layer" => "controller")
                        .increment(2 * n);
                } else {
                    metrics::gauge!(name, "side" => "a").increment(n as f64 + 0.25);
                    metrics::gauge!(name, "side" => "b").increment(3.0);
                    metrics::gauge!(name, "side" => "b").decrement(1.5);
                }
            }
            metrics::counter!(em::QUERY_ADMITTED_TOTAL).absolute(1000);
            metrics::counter!(em::QUERY_ADMITTED_TOTAL).absolute(900);
            metrics::gauge!(em::STORE_USED_BYTES).set(12345.5);
            metrics::gauge!(em::STORE_USED_BYTES).set(2345.5);
            // Not the status's: passed through to /metrics unchanged.
            metrics::counter!(sluice_server::metrics_names::CONNECTIONS_OPENED_TOTAL).increment(4);
        });
        let text = handle.render();
        for name in Series::names() {
            let kept = series.value(name).expect("listed");
            assert!(kept > 0.0, "{name} not kept");
            assert_eq!(kept, rendered(&text, name), "{name}");
        }
        assert_eq!(series.value(em::QUERY_ADMITTED_TOTAL), Some(1000.0));
        assert_eq!(
            rendered(
                &text,
                sluice_server::metrics_names::CONNECTIONS_OPENED_TOTAL
            ),
            4.0
        );
    }

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
