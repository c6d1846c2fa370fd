//! What a soak report holds: the settings, how /metrics answered, the
//! samples, the summary, the checks and the verdict, as written to JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use super::check::StoredCheck;
use super::mix::{Budget, TimeSchedule};
use super::summary::{SampleStats, SoakSample};
use crate::driver::TallyReport;
use crate::report::RunInfo;
use crate::stats::{Examples, LatencySummary, PrefixCounts};

/// The run's settings, as written to JSON.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Settings {
    pub budget: Budget,
    pub writers: usize,
    pub window: usize,
    pub polite: usize,
    pub polite_interval_ms: u64,
    pub authors: usize,
    pub exempt_authors: usize,
    pub span_days: f64,
    pub schedule: TimeSchedule,
    pub sample_ms: u64,
    pub target_mb: Option<f64>,
    pub check_newest: usize,
    pub sign_threads: usize,
    pub timeout_ms: u64,
    pub max_secs: Option<f64>,
    pub distinct_source_ips: bool,
    pub seed: u64,
}

/// How the relay's /metrics answered.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ScrapeStatus {
    pub url: Option<String>,
    pub scrapes: u64,
    pub failures: u64,
    pub last_error: Option<String>,
    /// Which of the soak's series the relay had at least once.
    pub series_seen: Vec<String>,
}

/// The run in figures.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Summary {
    /// From the start to the last writer's last answer.
    pub ingest_secs: f64,
    pub offered_events: u64,
    pub offered_bytes: u64,
    pub accepted_events: u64,
    pub accepted_bytes: u64,
    /// Accepted with `duplicate:`.
    pub duplicates: u64,
    /// accepted / offered.
    pub acceptance: f64,
    pub accepted_per_sec: f64,
    pub accepted_mib_per_sec: f64,
    pub refused: u64,
    pub rate_limited: u64,
    /// `error:` answers: 0 in a healthy run.
    pub error_answers: u64,
    pub blocked: u64,
    pub other_refused: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub connection_errors: u64,
    pub refused_by_prefix: PrefixCounts,
    pub refusal_examples: Examples,
    pub polite_offered: u64,
    pub polite_accepted: u64,
    /// Polite EVENTs accepted / offered.
    pub polite_success: f64,
    pub polite_ok: LatencySummary,
    /// `--target-mb` in bytes.
    pub target_bytes: Option<f64>,
    #[serde(flatten)]
    pub samples: SampleStats,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Checks {
    /// The newest accepted events (highest created_at).
    pub newest: StoredCheck,
    /// Every accepted event of the exempt authors.
    pub exempt: StoredCheck,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Verdict {
    pub pass: bool,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SoakReport {
    pub run: RunInfo,
    pub settings: Settings,
    /// Hex pubkeys of the exempt authors.
    pub exempt_pubkeys: Vec<String>,
    /// Stopped early by Ctrl-C or --max-secs.
    pub stopped_early: bool,
    pub metrics: ScrapeStatus,
    pub samples: Vec<SoakSample>,
    pub samples_dropped: u64,
    pub summary: Summary,
    pub writers: TallyReport,
    pub polite: TallyReport,
    /// Accepted events by kind.
    pub accepted_kinds: BTreeMap<String, u64>,
    pub checks: Checks,
    pub verdict: Verdict,
}
