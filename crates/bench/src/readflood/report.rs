//! What a readflood report holds: the settings, the figures per phase and
//! class, the abusive side, the state after the flood, the per-second
//! timeline and the scraped series, as written to JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use super::tally::{ReadReport, ReadSecond};
use crate::driver::TallyReport;
use crate::report::RunInfo;
use crate::stats::PrefixCounts;
use crate::timeline::{Scrapes, SecondPoint};

/// The run's settings, as written to JSON.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Settings {
    pub polite_clients: usize,
    pub polite_addr: String,
    pub polite_req_rate: f64,
    pub polite_event_rate: f64,
    pub polite_limit: u64,
    pub abusive_addrs: usize,
    pub abusive_conns_per_addr: usize,
    pub abusive_subs: usize,
    pub abusive_limit: u64,
    /// The words the abusers search for (none: they do not search).
    #[serde(default)]
    pub abusive_search: Vec<String>,
    pub timeout_ms: u64,
    pub before_secs: f64,
    pub flood_secs: f64,
    pub after_secs: f64,
    pub settle_secs: f64,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PhaseReport {
    pub name: String,
    pub start_secs: f64,
    pub secs: f64,
    pub polite_reads: ReadReport,
    pub polite_writes: TallyReport,
    pub abusive_reads: ReadReport,
}

/// The abusive side, beside its per-phase figures.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AbusiveSide {
    pub connections: usize,
    /// The local address of each connection (empty when not bound).
    pub source_ips: Vec<String>,
    pub separate_process: bool,
    pub pid: u32,
    /// CPU time of the abusers' process (only when separate).
    pub cpu_secs: Option<f64>,
    pub reconnects: u64,
    pub connection_errors: PrefixCounts,
    pub notices: PrefixCounts,
}

/// The fresh REQ sent after the flood.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Probe {
    /// `eose`, `closed`, `timeout` or `error`.
    pub outcome: String,
    /// From sending the REQ to its EOSE or CLOSED (or the timeout).
    pub time_ms: f64,
    pub connect_ms: f64,
    pub events: u64,
    /// The CLOSED message or the error.
    pub message: Option<String>,
}

/// The relay's state once the abusers have gone.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct AfterFlood {
    /// Seconds from the run's start.
    pub at_secs: f64,
    /// Every `sluice_query_*` gauge, by series.
    pub gauges: BTreeMap<String, f64>,
    pub scrape_error: Option<String>,
    pub probe: Probe,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Timeline {
    /// Index i covers seconds [i, i+1) of due (polite) or send (abusive) time.
    pub polite_reads: Vec<ReadSecond>,
    pub polite_writes: Vec<SecondPoint>,
    pub abusive_reads: Vec<ReadSecond>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ReadfloodReport {
    pub run: RunInfo,
    pub settings: Settings,
    /// Whether clients connected from their own loopback addresses.
    pub distinct_source_ips: bool,
    pub phases: Vec<PhaseReport>,
    pub abusive: AbusiveSide,
    pub polite_connection_errors: PrefixCounts,
    pub polite_notices: PrefixCounts,
    pub after_flood: AfterFlood,
    pub timeline: Timeline,
    pub metrics: Option<Scrapes>,
}
