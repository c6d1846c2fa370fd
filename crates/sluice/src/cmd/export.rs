//! `sluice export`: every stored, unexpired event as JSONL on standard
//! output, oldest first (created_at, then arrival order), each line the
//! exact bytes the event was stored as. Importing the output into an
//! empty store reproduces the store, and exporting that gives the same
//! bytes again.
//!
//! Memory is constant: the store walks its time index in chunks of short
//! read transactions ([`Store::for_each_raw`]), so a long export pins no old
//! pages and can run beside `sluice serve` and `sluice import`. A `--filter`
//! is applied to each event of the walk (the walk's time range narrowed to
//! the filters' since/until), which keeps the order and the constant memory;
//! it reads the whole time range, however selective the filter.

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use sluice_proto::{Event, Filter};
use sluice_store::StoreError;

use crate::config::Config;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// TOML configuration file (the store path is that of `serve`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A NIP-01 filter object, or a JSON array of filters (an event is
    /// exported when any matches); `limit` is not supported.
    #[arg(long)]
    filter: Option<String>,
    /// Only events with created_at at or after this (unix seconds).
    #[arg(long)]
    since: Option<u64>,
    /// Only events with created_at at or before this (unix seconds).
    #[arg(long)]
    until: Option<u64>,
}

pub fn run(args: ExportArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    crate::telemetry::init_logging(&cfg.log);
    let filters = match &args.filter {
        Some(text) => parse_filters(text)?,
        None => Vec::new(),
    };
    let (since, until) = walk_range(&filters, args.since, args.until);
    if !cfg.store.path.join("data.mdb").exists() {
        bail!("no store at {}", cfg.store.path.display());
    }
    let store = cfg.store.open()?;
    let started = Instant::now();
    let mut out = io::BufWriter::with_capacity(1 << 20, io::stdout().lock());
    let mut written = 0u64;
    let now = unix_now();
    let walked = if since > until {
        Ok(0)
    } else {
        store.for_each_raw(since, until, now, |raw| {
            if !filters.is_empty() && !matches_any(&filters, raw) {
                return Ok(());
            }
            out.write_all(raw.as_bytes())?;
            out.write_all(b"\n")?;
            written += 1;
            Ok(())
        })
    };
    let flushed = out.flush();
    store.close();
    match walked {
        Ok(_) => {}
        Err(StoreError::Io(e)) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(e).context("reading the store"),
    }
    match flushed {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
        other => other.context("writing to standard output")?,
    }
    eprintln!(
        "export: {written} events in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One filter object or an array of them.
fn parse_filters(text: &str) -> anyhow::Result<Vec<Filter>> {
    let value: serde_json::Value =
        serde_json::from_str(text).context("--filter is not valid JSON")?;
    let values = match value {
        serde_json::Value::Array(a) => a,
        v => vec![v],
    };
    if values.is_empty() {
        bail!("--filter: an empty array matches nothing");
    }
    values
        .iter()
        .map(|v| {
            let f = Filter::from_value(v).map_err(|e| anyhow::anyhow!("--filter: {e}"))?;
            if f.limit.is_some() {
                bail!("--filter: limit is not supported by export (use --since/--until)");
            }
            Ok(f)
        })
        .collect()
}

/// The created_at range to walk: the union of the filters' ranges,
/// intersected with --since/--until.
fn walk_range(filters: &[Filter], since: Option<u64>, until: Option<u64>) -> (u64, u64) {
    let (mut lo, mut hi) = (0, u64::MAX);
    if !filters.is_empty() {
        lo = filters
            .iter()
            .map(|f| f.since.unwrap_or(0))
            .min()
            .unwrap_or(0);
        hi = filters
            .iter()
            .map(|f| f.until.unwrap_or(u64::MAX))
            .max()
            .unwrap_or(u64::MAX);
    }
    (
        lo.max(since.unwrap_or(0)),
        hi.min(until.unwrap_or(u64::MAX)),
    )
}

fn matches_any(filters: &[Filter], raw: &str) -> bool {
    match Event::parse(raw) {
        Ok(ev) => filters.iter().any(|f| f.matches(&ev)),
        Err(e) => {
            tracing::error!(error = %e, "stored event does not parse; skipped");
            false
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_the_union_of_filters_within_the_flags() {
        let f = parse_filters(r#"[{"since":10,"until":20},{"since":15,"until":40}]"#).unwrap();
        assert_eq!(walk_range(&f, None, None), (10, 40));
        assert_eq!(walk_range(&f, Some(12), Some(30)), (12, 30));
        let f = parse_filters(r#"{"kinds":[1]}"#).unwrap();
        assert_eq!(walk_range(&f, None, Some(5)), (0, 5));
        assert_eq!(walk_range(&[], None, None), (0, u64::MAX));
    }

    #[test]
    fn bad_filters_are_refused() {
        assert!(parse_filters("{").is_err());
        assert!(parse_filters(r#"{"limit":5}"#).is_err());
        assert!(parse_filters("[]").is_err());
        assert!(parse_filters(r#"{"kinds":"x"}"#).is_err());
    }
}
