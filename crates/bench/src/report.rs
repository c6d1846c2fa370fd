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
    /// Wall time of the whole command.
    #[serde(default)]
    pub elapsed_secs: f64,
    /// CPU time this tool used (user + system): when it nears cores x
    /// elapsed, the client, not the relay, was the bottleneck.
    #[serde(default)]
    pub client_cpu_secs: Option<f64>,
    #[serde(skip)]
    start: Option<(std::time::Instant, Option<f64>)>,
}

impl RunInfo {
    pub fn new(command: &str, relay: Option<&str>) -> RunInfo {
        RunInfo {
            tool: "sluice-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            command: command.into(),
            relay: relay.map(str::to_owned),
            started_unix: unix_now(),
            elapsed_secs: 0.0,
            client_cpu_secs: None,
            start: Some((std::time::Instant::now(), process_cpu_secs())),
        }
    }

    /// Records elapsed wall and CPU time; call when the command is done.
    pub fn finish(&mut self) {
        if let Some((t, cpu)) = self.start {
            self.elapsed_secs = t.elapsed().as_secs_f64();
            self.client_cpu_secs = process_cpu_secs().zip(cpu).map(|(end, start)| end - start);
        }
    }

    /// `"cpu 3.1 s over 10.0 s"`, for summaries.
    pub fn cpu_line(&self) -> String {
        match self.client_cpu_secs {
            Some(cpu) => format!("client CPU {cpu:.1} s over {:.1} s", self.elapsed_secs),
            None => String::new(),
        }
    }
}

/// User plus system CPU seconds of this process (see `metrics::proc_cpu_secs`).
pub fn process_cpu_secs() -> Option<f64> {
    crate::metrics::proc_cpu_secs(std::process::id()).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_and_grows() {
        let a = process_cpu_secs().unwrap();
        let mut x = 0u64;
        for i in 0..30_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(process_cpu_secs().unwrap() >= a);
    }
}
