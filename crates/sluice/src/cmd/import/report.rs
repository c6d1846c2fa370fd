//! What `sluice import` tells the operator: the first lines of each refusal
//! reason as they happen, progress (a bar on a terminal, log lines
//! otherwise), and the final summary (text on standard error, optionally
//! JSON in a file).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// Lines printed per refusal reason; the rest are only counted.
pub const SAMPLES_PER_REASON: u64 = 5;
/// Interval of progress log lines when standard error is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Counters the batcher publishes for the progress display.
#[derive(Default)]
pub struct Live {
    pub bytes_read: std::sync::Arc<AtomicU64>,
    pub lines: AtomicU64,
    pub stored: AtomicU64,
    pub refused: AtomicU64,
}

/// One refused line, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub source: String,
    pub line: u64,
    pub reason: &'static str,
    pub detail: String,
}

/// The final account of an import. Every non-blank line read ends in
/// exactly one of: a write outcome (stored, duplicate, superseded, deleted,
/// expired, ephemeral, outside retention, vanished) or refused.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub sources: Vec<String>,
    pub verified: bool,
    /// The store was written in the map: the import had it to itself.
    pub written_in_map: bool,
    /// Non-blank lines read.
    pub lines: u64,
    pub blank_lines: u64,
    /// Bytes read from the sources (compressed size for compressed input).
    pub bytes: u64,
    /// Valid events handed to the store.
    pub events: u64,
    pub stored: u64,
    /// Of `stored`: replaced an older version of a replaceable or
    /// addressable event.
    pub replaced: u64,
    /// Events removed from the store by deletions (kind 5) in the import.
    pub removed_by_deletions: u64,
    pub duplicate: u64,
    /// A newer version of the replaceable/addressable event was stored.
    pub superseded: u64,
    /// Its author had deleted it (NIP-09).
    pub deleted: u64,
    /// NIP-40 expiration passed.
    pub expired: u64,
    /// Ephemeral kinds are never stored.
    pub ephemeral: u64,
    /// Retention would remove it at once (`[retention]`).
    pub outside_retention: u64,
    /// Its author asked this relay to vanish (NIP-62).
    pub vanished: u64,
    pub refused: u64,
    pub refused_by_reason: BTreeMap<&'static str, u64>,
    /// The first [`SAMPLES_PER_REASON`] refused lines of each reason.
    pub samples: Vec<Sample>,
    /// LMDB write transactions committed.
    pub batches: u64,
    pub elapsed_secs: f64,
    pub lines_per_sec: f64,
    /// The governor's memory target, MiB.
    pub target_memory_mb: u64,
    pub throttled_secs: f64,
    pub throttle_pauses: u64,
    /// Highest anonymous memory (heap) of the process the engine's monitor
    /// measured (at its ticks).
    pub peak_anon_memory_bytes: u64,
    /// Events in the store at the end.
    pub store_events: u64,
    /// With --strict: where the import stopped.
    pub stopped_at: Option<String>,
}

impl Summary {
    /// Counts a refusal; returns true when it is among the first of its
    /// reason (so it should be printed).
    pub fn refuse(&mut self, sample: Sample) -> bool {
        self.refused += 1;
        let n = self.refused_by_reason.entry(sample.reason).or_insert(0);
        *n += 1;
        let first = *n <= SAMPLES_PER_REASON;
        if first {
            self.samples.push(sample);
        }
        first
    }

    /// The human summary, for standard error.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let mut row = |label: &str, v: u64, note: &str| {
            s.push_str(&format!("  {label:<22}{v:>12}{note}\n"));
        };
        row("lines read", self.lines, "");
        row("  blank (skipped)", self.blank_lines, "");
        row("stored", self.stored, "");
        row("  replacing older", self.replaced, "");
        row("removed by deletions", self.removed_by_deletions, "");
        row("duplicate", self.duplicate, "  (already stored)");
        row(
            "superseded",
            self.superseded,
            "  (a newer version is stored)",
        );
        row("deleted", self.deleted, "  (deleted by its author)");
        row("expired", self.expired, "  (NIP-40)");
        row("ephemeral", self.ephemeral, "  (never stored)");
        row(
            "outside retention",
            self.outside_retention,
            "  ([retention] would remove it)",
        );
        row("vanished", self.vanished, "  (NIP-62)");
        row("refused", self.refused, "");
        for (reason, n) in &self.refused_by_reason {
            row(&format!("  {reason}"), *n, "");
        }
        let mut out = format!(
            "import: {} ({}{})\n",
            if self.stopped_at.is_some() {
                "stopped"
            } else {
                "done"
            },
            if self.verified {
                "signatures verified"
            } else {
                "--no-verify"
            },
            if self.written_in_map {
                ", written in the map"
            } else {
                ""
            }
        );
        out.push_str(&s);
        out.push_str(&format!(
            "  elapsed {:.2} s, {:.0} lines/s, {:.1} MB/s, {} batches\n  throttled {:.2} s ({} pauses), peak heap {:.0} MiB (target {} MiB)\n  store now holds {} events\n",
            self.elapsed_secs,
            self.lines_per_sec,
            self.bytes as f64 / 1e6 / self.elapsed_secs.max(1e-9),
            self.batches,
            self.throttled_secs,
            self.throttle_pauses,
            self.peak_anon_memory_bytes as f64 / (1 << 20) as f64,
            self.target_memory_mb,
            self.store_events,
        ));
        out
    }
}

/// Where messages and progress go: a bar on a terminal, else log lines.
#[derive(Clone)]
pub struct Reporter {
    bar: Option<ProgressBar>,
}

impl Reporter {
    pub fn new(total_bytes: Option<u64>) -> Reporter {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Reporter { bar: None };
        }
        let bar = match total_bytes {
            Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr())
                .with_style(
                    ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:20}] {bytes}/{total_bytes} ETA {eta} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                ),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{spinner} {elapsed_precise} {bytes} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        Reporter { bar: Some(bar) }
    }

    /// A line for the operator (a refused line, a warning).
    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => tracing::warn!("{msg}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Progress, updated by the import's progress thread every tick.
pub struct Progress {
    reporter: Reporter,
    started: Instant,
    last_log: Instant,
    last_lines: u64,
    last_at: Instant,
    rate: f64,
}

impl Progress {
    pub fn new(reporter: Reporter) -> Progress {
        let now = Instant::now();
        Progress {
            reporter,
            started: now,
            last_log: now,
            last_lines: 0,
            last_at: now,
            rate: 0.0,
        }
    }

    /// `pv` is the governor's process variable (the pressure it compares
    /// with the 0.70 setpoint).
    pub fn update(&mut self, live: &Live, throttled: Duration, pv: f64) {
        let now = Instant::now();
        let lines = live.lines.load(Ordering::Relaxed);
        let dt = now.duration_since(self.last_at).as_secs_f64();
        if dt >= 1.0 {
            self.rate = (lines - self.last_lines) as f64 / dt;
            self.last_lines = lines;
            self.last_at = now;
        } else if self.rate == 0.0 && dt > 0.0 && lines > 0 {
            self.rate = lines as f64 / now.duration_since(self.started).as_secs_f64();
        }
        let stored = live.stored.load(Ordering::Relaxed);
        let refused = live.refused.load(Ordering::Relaxed);
        let bytes = live.bytes_read.load(Ordering::Relaxed);
        match &self.reporter.bar {
            Some(bar) => {
                bar.set_position(bytes);
                bar.set_message(format!(
                    "{lines} lines {stored} stored {refused} refused {:.0}/s{}",
                    self.rate,
                    if throttled.is_zero() {
                        String::new()
                    } else {
                        format!(" throttled {:.1}s", throttled.as_secs_f64())
                    }
                ));
            }
            None if now.duration_since(self.last_log) >= LOG_EVERY => {
                self.last_log = now;
                tracing::info!(
                    lines,
                    stored,
                    refused,
                    bytes,
                    lines_per_sec = self.rate.round(),
                    throttled_secs = throttled.as_secs_f64(),
                    pressure = (pv * 100.0).round() / 100.0,
                    "import progress"
                );
            }
            None => {}
        }
    }
}
