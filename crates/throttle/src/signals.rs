//! Load signals: the raw figures the store monitor samples, how each is
//! normalised to "0 is idle, 1 is at its limit", and how they combine into
//! the load level, the memory pressure and the process variable the PID
//! controllers act on (docs/design.md#pid-control).
//!
//! Invariants: every normalised value is finite and within
//! `0..=MAX_SIGNAL`, whatever the input (NaN and negatives count as 0, so a
//! broken sensor fails open rather than shutting the relay); the formulas
//! are monotone, so more load never lowers a signal.

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// Ceiling of every normalised signal and of the memory pressure: 100 times
/// its limit is "completely overloaded"; more would only add noise.
pub const MAX_SIGNAL: f64 = 100.0;

/// The raw store signals, sampled by the engine every tick. Latencies are
/// recent averages (or high percentiles) over the tick, in seconds; fills
/// are fractions `0..=1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSignals {
    /// How long events waited in the writer queue before the batch holding
    /// them committed, seconds.
    pub writer_wait_secs: f64,
    /// Duration of recent LMDB write transaction commits, seconds.
    pub commit_latency_secs: f64,
    /// The commit latency of an unloaded store (e.g. a slow moving minimum
    /// or average of `commit_latency_secs`), seconds.
    pub commit_baseline_secs: f64,
    /// Writer queue length over its bound, `0..=1`.
    pub writer_queue_fill: f64,
    /// LMDB map pages used over the map size, `0..=1`.
    pub map_fill: f64,
    /// LMDB reader slots in use over `max_readers`, `0..=1`.
    pub reader_slots_fill: f64,
    /// Longest wait of a query (REQ, COUNT) for its first step since the
    /// last tick, seconds: queueing in the query scheduler.
    pub read_latency_secs: f64,
}

/// Where each signal reaches 1.0 ("at its limit").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalTargets {
    /// Writer wait that counts as full load, ms, `1..=60000`.
    pub writer_wait_target_ms: u64,
    /// Commit latency, as a multiple of its baseline, that counts as full
    /// load, `1.01..=1000`.
    pub commit_slowdown_at_full: f64,
    /// Smallest baseline used, µs, `1..=1_000_000`: with no-sync commits the
    /// baseline can be microseconds and any jitter would look like overload.
    pub commit_baseline_floor_us: u64,
    /// Map fill below which the map adds no load, `0..map_fill_full`.
    pub map_fill_low: f64,
    /// Map fill that counts as full load, `map_fill_low..=1`.
    pub map_fill_full: f64,
    /// Query latency that counts as full load, ms, `1..=60000`.
    pub read_latency_target_ms: u64,
}

impl Default for SignalTargets {
    /// Writer wait 100 ms, commits 4x their baseline (floor 1 ms), map fill
    /// from 80% to 95%, query latency 100 ms (the ORLY plan's read threshold,
    /// docs/design.md#pid-control).
    fn default() -> Self {
        Self {
            writer_wait_target_ms: 100,
            commit_slowdown_at_full: 4.0,
            commit_baseline_floor_us: 1000,
            map_fill_low: 0.80,
            map_fill_full: 0.95,
            read_latency_target_ms: 100,
        }
    }
}

impl SignalTargets {
    /// Checks every field against the ranges documented on it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "writer_wait_target_ms",
            self.writer_wait_target_ms as f64,
            1.0,
            60_000.0,
            "in 1..=60000",
        )?;
        check_range(
            "commit_slowdown_at_full",
            self.commit_slowdown_at_full,
            1.01,
            1000.0,
            "in 1.01..=1000",
        )?;
        check_range(
            "commit_baseline_floor_us",
            self.commit_baseline_floor_us as f64,
            1.0,
            1e6,
            "in 1..=1000000",
        )?;
        check_range("map_fill_full", self.map_fill_full, 0.01, 1.0, "in (0, 1]")?;
        check_range(
            "map_fill_low",
            self.map_fill_low,
            0.0,
            self.map_fill_full - 0.01,
            "in [0, map_fill_full)",
        )?;
        check_range(
            "read_latency_target_ms",
            self.read_latency_target_ms as f64,
            1.0,
            60_000.0,
            "in 1..=60000",
        )?;
        Ok(())
    }
}

/// Each signal normalised: 0 idle, 1 at its limit, above 1 overloaded
/// (capped at [`MAX_SIGNAL`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NormalizedSignals {
    /// `writer_wait / writer_wait_target`.
    pub writer_wait: f64,
    /// `(commit_latency / max(baseline, floor) - 1) / (slowdown_at_full - 1)`:
    /// 0 at or below the baseline, 1 at `slowdown_at_full` times it.
    pub commit: f64,
    /// `writer_queue_fill` as is: a full queue is at its limit by definition.
    pub writer_queue: f64,
    /// `(map_fill - map_fill_low) / (map_fill_full - map_fill_low)`: a
    /// half-full map is no load, a nearly full one is (writes will fail).
    pub map: f64,
    /// `reader_slots_fill` as is.
    pub readers: f64,
    /// `read_latency / read_latency_target`.
    pub read_latency: f64,
}

impl NormalizedSignals {
    /// Normalises raw signals with the formulas documented on each field.
    pub fn from_raw(raw: &LoadSignals, targets: &SignalTargets) -> Self {
        let baseline_s = raw
            .commit_baseline_secs
            .max(targets.commit_baseline_floor_us as f64 / 1e6);
        let slowdown = raw.commit_latency_secs / baseline_s;
        Self {
            writer_wait: clamp_signal(
                raw.writer_wait_secs * 1e3 / targets.writer_wait_target_ms as f64,
            ),
            commit: clamp_signal((slowdown - 1.0) / (targets.commit_slowdown_at_full - 1.0)),
            writer_queue: clamp_signal(raw.writer_queue_fill),
            map: clamp_signal(
                (raw.map_fill - targets.map_fill_low)
                    / (targets.map_fill_full - targets.map_fill_low),
            ),
            readers: clamp_signal(raw.reader_slots_fill),
            read_latency: clamp_signal(
                raw.read_latency_secs * 1e3 / targets.read_latency_target_ms as f64,
            ),
        }
    }

    /// The store load level: the largest normalised signal.
    ///
    /// Why the maximum and not a weighted mean: the store is as loaded as its
    /// most loaded resource. A writer queue at its limit stalls writes
    /// however idle the readers are; a mean over six signals would report
    /// that as 1/6 and the controller would not act. (The ORLY plan combines
    /// its Badger signals the same way.) The price is that the noisiest signal
    /// sets the level; the derivative filter and the integral absorb that.
    pub fn load_level(&self) -> f64 {
        (self.named().into_iter())
            .map(|(_, v)| v)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// Every signal with its name (the `signal` label of
    /// `sluice_throttle_signal_ratio`): the one list of them.
    pub fn named(&self) -> [(&'static str, f64); 6] {
        [
            ("writer_wait", self.writer_wait),
            ("commit", self.commit),
            ("writer_queue", self.writer_queue),
            ("map", self.map),
            ("readers", self.readers),
            ("read_latency", self.read_latency),
        ]
    }
}

/// Memory pressure: the process's anonymous memory (heap, not the LMDB page
/// cache, which the kernel reclaims on its own) over the target, clamped to
/// `0..=MAX_SIGNAL`. 1.0 means at the target. A target of 0 counts as
/// [`MAX_SIGNAL`] pressure.
pub fn memory_pressure(anon_memory_bytes: u64, target_memory_bytes: u64) -> f64 {
    if target_memory_bytes == 0 {
        return MAX_SIGNAL;
    }
    clamp_signal(anon_memory_bytes as f64 / target_memory_bytes as f64)
}

/// The process variable (docs/design.md#pid-control):
/// `memory_weight * memory_pressure + load_weight * load_level`.
/// Memory weighs more by default (0.7 / 0.3) because it is the hard
/// constraint: store load only costs latency, memory exhaustion kills the
/// process. With weights summing to 1 the result is on the same scale as
/// its inputs, so a setpoint of 0.85 means "85% of the limits".
pub fn process_variable(
    memory_pressure: f64,
    load_level: f64,
    memory_weight: f64,
    load_weight: f64,
) -> f64 {
    memory_weight * clamp_signal(memory_pressure) + load_weight * clamp_signal(load_level)
}

/// NaN and negatives to 0, large values and `+inf` to [`MAX_SIGNAL`].
fn clamp_signal(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, MAX_SIGNAL)
    }
}

#[cfg(test)]
mod tests;
