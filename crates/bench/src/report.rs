//! Writing reports: every command prints a human summary and, with
//! `--json FILE`, writes the same figures as JSON with a common header.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;

/// Identifies a run in every JSON report.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RunInfo {
    pub tool: String,
    pub version: String,
    pub command: String,
    pub relay: Option<String>,
    pub started_unix: u64,
}

impl RunInfo {
    pub fn new(command: &str, relay: Option<&str>) -> RunInfo {
        RunInfo {
            tool: "sluice-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            command: command.into(),
            relay: relay.map(str::to_owned),
            started_unix: unix_now(),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Writes `value` as pretty JSON when a path is given.
pub fn write_json<T: Serialize>(path: Option<&Path>, value: &T) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
