//! The figures of a soak: one `SoakSample` per `--sample-ms` (the bench's own
//! counts for that interval and the relay's series read from /metrics), the
//! rates derived from consecutive samples, and the run's summary statistics.
//! Everything here is pure: samples in, numbers out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::metrics::{self, Sample};
use crate::stats::PrefixCounts;

pub const STORE_USED_BYTES: &str = "sluice_store_used_bytes";
pub const STORE_FILE_BYTES: &str = "sluice_store_file_bytes";
pub const STORE_EVENTS: &str = "sluice_store_events";
/// Events deleted by retention, by `rule` (summed).
pub const RETENTION_DELETED_TOTAL: &str = "sluice_retention_deleted_total";
/// The writer's cumulative time in retention, seconds.
pub const RETENTION_SECONDS_TOTAL: &str = "sluice_retention_step_seconds_sum";

/// The relay's series in one scrape; a series the page does not have is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RelayFigures {
    pub store_used_bytes: Option<f64>,
    pub store_file_bytes: Option<f64>,
    pub store_events: Option<f64>,
    pub retention_deleted_total: Option<f64>,
    pub retention_seconds_total: Option<f64>,
}

/// The sum of every series named `name` (over its labels), `None` when there is none.
fn sum_named(samples: &[Sample], name: &str) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .reduce(|a, b| a + b)
}

/// Reads the soak's series from a /metrics page.
pub fn relay_figures(page: &str) -> RelayFigures {
    let s = metrics::parse_prometheus(page);
    RelayFigures {
        store_used_bytes: sum_named(&s, STORE_USED_BYTES),
        store_file_bytes: sum_named(&s, STORE_FILE_BYTES),
        store_events: sum_named(&s, STORE_EVENTS),
        retention_deleted_total: sum_named(&s, RETENTION_DELETED_TOTAL),
        retention_seconds_total: sum_named(&s, RETENTION_SECONDS_TOTAL),
    }
}

/// One sample: counts for the interval that ended at `t`, and the relay's
/// series read then. Counts are by answer time; writers and polite together
/// except the `polite_*` fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct SoakSample {
    /// Seconds since the start of the run.
    pub t: f64,
    pub sent: u64,
    pub accepted: u64,
    pub accepted_bytes: u64,
    pub refused: u64,
    pub rate_limited: u64,
    pub error: u64,
    pub blocked: u64,
    pub other_refused: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub polite_sent: u64,
    pub polite_accepted: u64,
    /// Polite events answered, refused, timed out or lost in the interval.
    pub polite_answered: u64,
    pub polite_p50_ms: Option<f64>,
    pub polite_p99_ms: Option<f64>,
    #[serde(flatten)]
    pub relay: RelayFigures,
    /// Retention deletions per second since the previous sample.
    pub deletions_per_sec: Option<f64>,
    /// The writer's share of the interval spent in retention (0 to 1).
    pub retention_share: Option<f64>,
}

impl SoakSample {
    /// Accepted / answered (refusals, timeouts and losses count against).
    pub fn acceptance(&self) -> Option<f64> {
        let answered = self.accepted + self.refused + self.timeouts + self.lost;
        (answered > 0).then(|| self.accepted as f64 / answered as f64)
    }

    pub fn polite_success(&self) -> Option<f64> {
        (self.polite_answered > 0)
            .then(|| self.polite_accepted as f64 / self.polite_answered as f64)
    }
}

/// Splits refusal prefixes into rate-limited, error, blocked and the rest.
pub fn refusal_split(p: &PrefixCounts) -> (u64, u64, u64, u64) {
    let get = |k: &str| p.0.get(k).copied().unwrap_or(0);
    let (r, e, b) = (get("rate-limited"), get("error"), get("blocked"));
    (r, e, b, p.total() - r - e - b)
}

/// Per-second rate of a counter between two samples; `None` when either
/// side is missing, time did not move, or the counter went back (a restart).
pub fn counter_rate(prev: (f64, Option<f64>), cur: (f64, Option<f64>)) -> Option<f64> {
    let (a, b) = (prev.1?, cur.1?);
    let dt = cur.0 - prev.0;
    (dt > 0.0 && b >= a).then(|| (b - a) / dt)
}

/// Fills each sample's deletions per second and retention share from the
/// one before it.
pub fn derive_rates(samples: &mut [SoakSample]) {
    for i in 1..samples.len() {
        let (p, c) = (&samples[i - 1], &samples[i]);
        let deleted = counter_rate(
            (p.t, p.relay.retention_deleted_total),
            (c.t, c.relay.retention_deleted_total),
        );
        let share = counter_rate(
            (p.t, p.relay.retention_seconds_total),
            (c.t, c.relay.retention_seconds_total),
        );
        samples[i].deletions_per_sec = deleted;
        samples[i].retention_share = share;
    }
}

/// Smallest, median (nearest rank) and largest of some values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct MinMedMax {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub count: usize,
}

/// The nearest-rank median; `None` when empty. NaNs are ignored.
pub fn median(values: &[f64]) -> Option<f64> {
    min_med_max(values).map(|m| m.median)
}

pub fn min_med_max(values: &[f64]) -> Option<MinMedMax> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    // Nearest rank: the lower middle of an even count.
    let mid = (v.len() - 1) / 2;
    Some(MinMedMax {
        min: v[0],
        median: v[mid],
        max: v[v.len() - 1],
        count: v.len(),
    })
}

/// The samples of the run's second half (from half the last sample's time on).
pub fn second_half(samples: &[SoakSample]) -> &[SoakSample] {
    let Some(last) = samples.last() else {
        return samples;
    };
    let from = samples
        .iter()
        .position(|s| s.t >= last.t / 2.0)
        .unwrap_or(samples.len());
    &samples[from..]
}

fn values(samples: &[SoakSample], f: impl Fn(&SoakSample) -> Option<f64>) -> Vec<f64> {
    samples.iter().filter_map(f).collect()
}

/// Sample-based statistics of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct SampleStats {
    pub samples: usize,
    /// Store used bytes over the second half.
    pub store_used_second_half: Option<MinMedMax>,
    pub store_file_second_half: Option<MinMedMax>,
    /// Median over every sample with a rate.
    pub deletions_per_sec_median: Option<f64>,
    pub deletions_per_sec_median_second_half: Option<f64>,
    /// Events retention deleted during the run (last minus first reading).
    pub deleted_during_run: Option<f64>,
    /// `deleted_during_run` over the time between those readings
    /// (retention works in bursts between the target and the low mark, so
    /// the per-sample median is often 0).
    pub deletions_per_sec_mean: Option<f64>,
    /// The writer's time in retention over the run's time between the first
    /// and last readings.
    pub retention_share: Option<f64>,
    pub retention_share_max_sample: Option<f64>,
    /// The worst per-sample polite OK p99 and when.
    pub polite_worst_p99_ms: Option<f64>,
    pub polite_worst_p99_at_secs: Option<f64>,
    /// Per-sample acceptance: the lowest.
    pub acceptance_min_sample: Option<f64>,
}

/// The first and last samples holding a series, as (t, value).
fn first_last(
    samples: &[SoakSample],
    f: impl Fn(&SoakSample) -> Option<f64>,
) -> Option<((f64, f64), (f64, f64))> {
    let first = samples.iter().find_map(|s| f(s).map(|v| (s.t, v)))?;
    let last = samples.iter().rev().find_map(|s| f(s).map(|v| (s.t, v)))?;
    Some((first, last))
}

pub fn sample_stats(samples: &[SoakSample]) -> SampleStats {
    let half = second_half(samples);
    let worst = samples
        .iter()
        .filter_map(|s| s.polite_p99_ms.map(|v| (v, s.t)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let deleted = first_last(samples, |s| s.relay.retention_deleted_total);
    let in_retention = first_last(samples, |s| s.relay.retention_seconds_total);
    SampleStats {
        samples: samples.len(),
        store_used_second_half: min_med_max(&values(half, |s| s.relay.store_used_bytes)),
        store_file_second_half: min_med_max(&values(half, |s| s.relay.store_file_bytes)),
        deletions_per_sec_median: median(&values(samples, |s| s.deletions_per_sec)),
        deletions_per_sec_median_second_half: median(&values(half, |s| s.deletions_per_sec)),
        deleted_during_run: deleted.map(|(a, b)| b.1 - a.1),
        deletions_per_sec_mean: deleted
            .and_then(|(a, b)| counter_rate((a.0, Some(a.1)), (b.0, Some(b.1)))),
        retention_share: in_retention
            .and_then(|(a, b)| counter_rate((a.0, Some(a.1)), (b.0, Some(b.1)))),
        retention_share_max_sample: values(samples, |s| s.retention_share)
            .into_iter()
            .reduce(f64::max),
        polite_worst_p99_ms: worst.map(|w| w.0),
        polite_worst_p99_at_secs: worst.map(|w| w.1),
        acceptance_min_sample: values(samples, SoakSample::acceptance)
            .into_iter()
            .reduce(f64::min),
    }
}

/// Accepted events by kind, with string keys for JSON.
pub fn kinds_json(kinds: &BTreeMap<u16, u64>) -> BTreeMap<String, u64> {
    kinds.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// `12.3 MiB`.
pub fn mib(bytes: f64) -> String {
    let m = bytes / (1024.0 * 1024.0);
    if m >= 100.0 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}

#[cfg(test)]
mod tests;
