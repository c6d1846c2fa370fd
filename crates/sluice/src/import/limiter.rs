//! The import limiter (seed 000, "Integration with Import Loop"): a
//! [`Governor`] built from the `[throttle]` section with the import tuning
//! of the write controller (setpoint 0.70, Ki 0.15), ticked every
//! `throttle.tick_ms` by the monitor thread from the process's anonymous
//! memory against `throttle.target_memory_mb` (or `--target-memory-mb`)
//! and the load signals the import has: the
//! cost of its own commits against a slow baseline, the fill of its
//! pipeline and the fill of the LMDB map. The writer asks
//! [`Limiter::pause`] before each batch.
//!
//! For an import a refusal never drops data: it means "wait longer". The
//! wait before one batch is capped at [`MAX_PAUSE`], so an import whose
//! target is below what it needs still progresses, one batch at a time.
//! With `throttle.mode` `shadow` or `off` the governor runs but the writer
//! never pauses.
//!
//! Not used as signals: the writer wait (an import keeps its pipeline full
//! on purpose, so the age of a chunk says nothing about overload), reader
//! slots and read latency (an import does not read).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_engine::Store;
use sluice_throttle::{Direction, Governor, GovernorConfig, LoadSignals, PidConfig, Verdict};

/// Memory pressure (heap / target) under which the reader may use the
/// whole in-flight bound.
pub const HEADROOM: f64 = 0.25;
/// Longest wait before one batch, whatever the verdict.
pub const MAX_PAUSE: Duration = Duration::from_secs(2);
/// Commit cost is compared per this many events, so batches of any size
/// give comparable figures.
const COST_UNIT_EVENTS: f64 = 1000.0;
/// Fewest stored events for a commit's cost to count.
const MIN_COST_SAMPLE: usize = 64;

/// State shared by the writer (which records commits and pauses), the
/// monitor (which ticks) and the pipeline (which reports its fill).
pub struct Limiter {
    /// The published write verdict ([`Verdict::to_bits`]).
    verdict: AtomicU64,
    /// Recent commit cost per [`COST_UNIT_EVENTS`] stored, seconds (f64 bits).
    commit_secs: AtomicU64,
    /// Slow baseline of the same (f64 bits): follows drops at once and
    /// rises slowly.
    baseline_secs: AtomicU64,
    /// Chunks between the reader and the writer; the reader adds, the writer
    /// subtracts.
    pub in_flight_chunks: AtomicU64,
    /// Heap over target at the last tick (f64 bits).
    memory_pressure: AtomicU64,
    /// Bound of `in_flight_chunks`.
    max_in_flight_chunks: u64,
    /// Nanoseconds the writer spent paused.
    throttled_ns: AtomicU64,
    /// Times the writer paused.
    pauses: AtomicU64,
    /// How often the governor ticks (and a refused writer looks again).
    pub tick: Duration,
    /// False in shadow and off modes: verdicts are computed, never applied.
    enforce: bool,
}

impl Limiter {
    pub fn new(max_in_flight_chunks: u64, tick: Duration, enforce: bool) -> Arc<Limiter> {
        Arc::new(Limiter {
            verdict: AtomicU64::new(Verdict::Allow.to_bits()),
            commit_secs: AtomicU64::new(0f64.to_bits()),
            baseline_secs: AtomicU64::new(0f64.to_bits()),
            in_flight_chunks: AtomicU64::new(0),
            // Unknown until the first tick: assume no headroom.
            memory_pressure: AtomicU64::new(1f64.to_bits()),
            max_in_flight_chunks,
            throttled_ns: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            tick,
            enforce,
        })
    }

    /// Called by the writer (one thread) after each commit with the number
    /// of events it stored. The cost is per stored event: a batch of
    /// duplicates (a re-run) writes almost nothing, and would set a baseline
    /// that real writes then seem to exceed many times. Batches that store
    /// fewer than [`MIN_COST_SAMPLE`] events say too little and are skipped.
    pub fn record_commit(&self, took: Duration, stored: usize) {
        if stored < MIN_COST_SAMPLE {
            return;
        }
        let cost = took.as_secs_f64() * COST_UNIT_EVENTS / stored as f64;
        let load = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        let (recent, base) = (load(&self.commit_secs), load(&self.baseline_secs));
        let recent = if recent == 0.0 {
            cost
        } else {
            0.7 * recent + 0.3 * cost
        };
        let base = if base == 0.0 || cost < base {
            cost
        } else {
            base + 0.01 * (cost - base)
        };
        self.commit_secs.store(recent.to_bits(), Ordering::Relaxed);
        self.baseline_secs.store(base.to_bits(), Ordering::Relaxed);
    }

    /// Waits as the current verdict says before a batch holding `fraction`
    /// (0..=1) of a full batch; returns how long. A delay or the
    /// [`MAX_PAUSE`] cap is per full batch, scaled by `fraction`, so the
    /// slow-down is a rate (events per second), whatever size the batches
    /// shrank to: pausing the full amount before each small batch would
    /// compound the two levers. Under a refusal the writer looks again
    /// every tick until it clears or the scaled cap is reached.
    pub fn pause(&self, fraction: f64) -> Duration {
        if !self.enforce {
            return Duration::ZERO;
        }
        let fraction = if fraction.is_nan() {
            1.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        let cap = MAX_PAUSE.mul_f64(fraction);
        let started = Instant::now();
        let mut slept = false;
        loop {
            let left = cap.saturating_sub(started.elapsed());
            let wait = match Verdict::from_bits(self.verdict.load(Ordering::Relaxed)) {
                Verdict::Allow => Duration::ZERO,
                // A delay is served once per batch.
                Verdict::Delay(d) if !slept => d.mul_f64(fraction).min(left),
                Verdict::Delay(_) => Duration::ZERO,
                Verdict::Refuse { retry_after, .. } => retry_after.min(self.tick).min(left),
            };
            if wait.is_zero() {
                break;
            }
            std::thread::sleep(wait);
            slept = true;
        }
        if !slept {
            return Duration::ZERO;
        }
        let waited = started.elapsed();
        self.pauses.fetch_add(1, Ordering::Relaxed);
        self.throttled_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        waited
    }

    /// How many chunks the reader may have in flight now: all of `max`
    /// while the verdict allows and the heap is under [`HEADROOM`] of its
    /// target, else only `base`. The extra share keeps the cores busy
    /// through commits; near a tight target it would only make the heap
    /// swing between the controller's verdicts, so it is not used there.
    pub fn chunk_limit(&self, max: usize, base: usize) -> usize {
        if !self.enforce {
            return max;
        }
        let roomy = f64::from_bits(self.memory_pressure.load(Ordering::Relaxed)) < HEADROOM;
        match Verdict::from_bits(self.verdict.load(Ordering::Relaxed)) {
            Verdict::Allow if roomy => max,
            _ => base.min(max),
        }
    }

    /// The batch bound to use now: the full `batch_events` when allowed,
    /// half when delayed, a sixteenth when refused. The heap an import
    /// controls is mostly the dirty pages of its write transaction, so a
    /// smaller batch is what lowers the pressure; the pause spreads it.
    pub fn batch_limit(&self, batch_events: usize) -> usize {
        if !self.enforce {
            return batch_events;
        }
        let divisor = match Verdict::from_bits(self.verdict.load(Ordering::Relaxed)) {
            Verdict::Allow => 1,
            Verdict::Delay(_) => 2,
            Verdict::Refuse { .. } => 16,
        };
        (batch_events / divisor).max(1)
    }

    /// Total time the writer spent paused.
    pub fn throttled(&self) -> Duration {
        Duration::from_nanos(self.throttled_ns.load(Ordering::Relaxed))
    }

    pub fn pauses(&self) -> u64 {
        self.pauses.load(Ordering::Relaxed)
    }
}

/// The governor and what it samples; owned by the monitor thread.
pub struct Control {
    governor: Governor,
    limiter: Arc<Limiter>,
    store: Store,
    started: Instant,
    map_fill: f64,
    last_map_sample: Option<Instant>,
}

impl Control {
    /// `config` is the relay's governor config; its write controller is
    /// replaced by the import tuning.
    pub fn new(
        limiter: Arc<Limiter>,
        store: Store,
        config: GovernorConfig,
    ) -> anyhow::Result<Self> {
        let config = GovernorConfig {
            write: PidConfig::import_default(),
            ..config
        };
        let governor = Governor::new(config)
            .map_err(|e| anyhow::anyhow!("import limiter configuration: {e}"))?;
        Ok(Control {
            governor,
            limiter,
            store,
            started: Instant::now(),
            map_fill: 0.0,
            last_map_sample: None,
        })
    }

    /// One tick: sample, update the governor, publish the verdict.
    /// Returns the process variable (for progress lines).
    pub fn tick(&mut self) -> f64 {
        let now = Instant::now();
        // Map fill changes slowly and needs a read transaction: once a second.
        if self
            .last_map_sample
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            if let Ok(s) = self.store.stats() {
                self.map_fill = s.map_fill_ratio();
            }
            self.last_map_sample = Some(now);
        }
        let l = &self.limiter;
        let f = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        let signals = LoadSignals {
            commit_latency_secs: f(&l.commit_secs),
            commit_baseline_secs: f(&l.baseline_secs),
            writer_queue_fill: l.in_flight_chunks.load(Ordering::Relaxed) as f64
                / l.max_in_flight_chunks.max(1) as f64,
            map_fill: self.map_fill,
            ..LoadSignals::default()
        };
        let anon = sluice_engine::process::memory().anonymous_bytes;
        let now_ns = now.duration_since(self.started).as_nanos() as u64;
        let state = self.governor.tick(anon, &signals, now_ns);
        l.memory_pressure
            .store(state.memory_pressure.to_bits(), Ordering::Relaxed);
        let pv = state.process_variable;
        l.verdict.store(
            self.governor.verdict(Direction::Write).to_bits(),
            Ordering::Relaxed,
        );
        pv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_follows_drops_and_rises_slowly() {
        let l = Limiter::new(4, Duration::from_millis(100), true);
        l.record_commit(Duration::from_millis(10), 1000);
        l.record_commit(Duration::from_millis(40), 1000);
        let base = f64::from_bits(l.baseline_secs.load(Ordering::Relaxed));
        let recent = f64::from_bits(l.commit_secs.load(Ordering::Relaxed));
        assert!((base - 0.0103).abs() < 1e-9, "{base}");
        assert!(recent > 0.018 && recent < 0.02, "{recent}");
        l.record_commit(Duration::from_millis(2), 1000);
        // Too few stored to say anything: ignored.
        l.record_commit(Duration::from_nanos(1), 10);
        let base = f64::from_bits(l.baseline_secs.load(Ordering::Relaxed));
        assert!((base - 0.002).abs() < 1e-12);
    }

    #[test]
    fn allow_does_not_pause_and_refusal_is_capped() {
        let l = Limiter::new(4, Duration::from_millis(100), true);
        assert_eq!(l.pause(1.0), Duration::ZERO);
        assert_eq!(l.pauses(), 0);
        l.verdict.store(
            Verdict::Delay(Duration::from_millis(20)).to_bits(),
            Ordering::Relaxed,
        );
        let d = l.pause(1.0);
        assert!(d >= Duration::from_millis(20) && d < MAX_PAUSE, "{d:?}");
        assert_eq!(l.pauses(), 1);
        // A quarter batch waits a quarter of the delay.
        let d = l.pause(0.25);
        assert!(
            d >= Duration::from_millis(5) && d < Duration::from_millis(20),
            "{d:?}"
        );
        assert_eq!(l.batch_limit(4096), 2048);
        assert_eq!(l.chunk_limit(40, 12), 12);
        l.verdict.store(
            Verdict::Refuse {
                retry_after: Duration::from_millis(1),
                reason: sluice_throttle::RefuseReason::Emergency,
            }
            .to_bits(),
            Ordering::Relaxed,
        );
        assert_eq!(l.batch_limit(4096), 256);
        assert_eq!(l.batch_limit(3), 1);
        assert_eq!(l.chunk_limit(40, 12), 12);
        l.verdict.store(Verdict::Allow.to_bits(), Ordering::Relaxed);
        // Before the first tick the heap is unknown: the base share.
        assert_eq!(l.chunk_limit(40, 12), 12);
        l.memory_pressure.store(0.1f64.to_bits(), Ordering::Relaxed);
        assert_eq!(l.chunk_limit(40, 12), 40);
        // Allowed, but the heap is past a quarter of its target: the base share.
        l.memory_pressure.store(0.3f64.to_bits(), Ordering::Relaxed);
        assert_eq!(l.chunk_limit(40, 12), 12);
    }
}

#[cfg(test)]
mod shadow_tests {
    use super::*;

    #[test]
    fn shadow_never_pauses() {
        let l = Limiter::new(4, Duration::from_millis(100), false);
        l.verdict.store(
            Verdict::Delay(Duration::from_millis(50)).to_bits(),
            Ordering::Relaxed,
        );
        assert_eq!(l.pause(1.0), Duration::ZERO);
        assert_eq!(l.pauses(), 0);
        assert_eq!(l.batch_limit(4096), 4096);
        assert_eq!(l.chunk_limit(40, 12), 40);
    }
}
