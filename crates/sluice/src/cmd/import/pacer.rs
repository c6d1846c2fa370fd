//! How the import obeys the engine's write verdict (docs/design.md#pid-control:
//! the ORLY plan's "Integration with Import Loop"). The import runs the engine's one
//! governor, ticked by the engine's monitor, with the import profile: the
//! write controller's import tuning (setpoint 0.70, Ki 0.15) and the memory
//! target of `throttle.target_memory_mb` or `--target-memory-mb` (see
//! `import::run`). This module only reads the verdict the engine publishes
//! and turns it into a bulk client's three levers: a pause before each
//! batch ([`BulkPacer::pause`]), smaller batches ([`BulkPacer::batch_limit`])
//! and fewer chunks in flight ([`BulkPacer::chunk_limit`]).
//!
//! For an import a refusal never drops data: it means "wait longer". The
//! wait before one batch is capped at [`MAX_PAUSE`], so an import whose
//! target is below what it needs still progresses, one batch at a time.
//! With `throttle.mode` `shadow` or `off` the governor runs but the import
//! never waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_engine::limiter::Limiter;
use sluice_throttle::{Mode, Verdict};

/// Memory pressure (heap / target) under which the reader may use the
/// whole in-flight bound.
pub const HEADROOM: f64 = 0.25;
/// Longest wait before one batch, whatever the verdict.
pub const MAX_PAUSE: Duration = Duration::from_secs(2);

/// What the engine published at its last tick.
#[derive(Debug, Clone, Copy)]
pub struct Published {
    pub verdict: Verdict,
    /// Heap over target.
    pub memory_pressure: f64,
}

type Source = Box<dyn Fn() -> Published + Send + Sync>;

/// The import's side of throttling, shared by the reader (chunk limit) and
/// the batcher (pauses, batch limit).
pub struct BulkPacer {
    /// The engine's last published verdict.
    published: Source,
    /// Nanoseconds the batcher spent paused.
    throttled_ns: AtomicU64,
    /// Times the batcher paused.
    pauses: AtomicU64,
    /// How often the governor ticks (and a refused batcher looks again).
    pub tick: Duration,
    /// False in shadow and off modes: verdicts are computed, never applied.
    enforce: bool,
}

impl BulkPacer {
    /// Follows the verdicts `throttle` publishes.
    pub fn new(throttle: Arc<Limiter>) -> BulkPacer {
        let tick = Duration::from_millis(throttle.config().tick_ms);
        let enforce = throttle.mode() == Mode::Enforce;
        let published = move || match throttle.state() {
            Some(s) => Published {
                verdict: s.write.verdict,
                memory_pressure: s.memory_pressure,
            },
            // Before any tick the heap is unknown: assume no headroom.
            None => Published {
                verdict: Verdict::Allow,
                memory_pressure: 1.0,
            },
        };
        BulkPacer::with_source(Box::new(published), tick, enforce)
    }

    fn with_source(published: Source, tick: Duration, enforce: bool) -> BulkPacer {
        BulkPacer {
            published,
            throttled_ns: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            tick,
            enforce,
        }
    }

    fn verdict(&self) -> Verdict {
        (self.published)().verdict
    }

    /// Waits as the current verdict says before a batch holding `fraction`
    /// (0..=1) of a full batch; returns how long. A delay or the
    /// [`MAX_PAUSE`] cap is per full batch, scaled by `fraction`, so the
    /// slow-down is a rate (events per second), whatever size the batches
    /// shrank to: pausing the full amount before each small batch would
    /// compound the two levers. Under a refusal the batcher looks again
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
        let started = Instant::now();
        let mut slept = false;
        loop {
            let wait = self.next_wait(fraction, started.elapsed(), slept);
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

    /// The next wait of a pause before a batch holding `fraction` of a full
    /// batch, `elapsed` into it, having `slept` already or not: zero ends
    /// the pause. Pure but for the published verdict.
    fn next_wait(&self, fraction: f64, elapsed: Duration, slept: bool) -> Duration {
        let left = MAX_PAUSE.mul_f64(fraction).saturating_sub(elapsed);
        match self.verdict() {
            Verdict::Allow => Duration::ZERO,
            // A delay is served once per batch.
            Verdict::Delay(d) if !slept => d.mul_f64(fraction).min(left),
            Verdict::Delay(_) => Duration::ZERO,
            Verdict::Refuse(r) => r.retry_after.min(self.tick).min(left),
        }
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
        let p = (self.published)();
        match p.verdict {
            Verdict::Allow if p.memory_pressure < HEADROOM => max,
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
        let divisor = match self.verdict() {
            Verdict::Allow => 1,
            Verdict::Delay(_) => 2,
            Verdict::Refuse(_) => 16,
        };
        (batch_events / divisor).max(1)
    }

    /// Total time the batcher spent paused.
    pub fn throttled(&self) -> Duration {
        Duration::from_nanos(self.throttled_ns.load(Ordering::Relaxed))
    }

    pub fn pauses(&self) -> u64 {
        self.pauses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A limiter over a published value the test sets.
    fn limiter(enforce: bool) -> (Arc<Mutex<Published>>, BulkPacer) {
        let cell = Arc::new(Mutex::new(Published {
            verdict: Verdict::Allow,
            memory_pressure: 1.0,
        }));
        let read = cell.clone();
        let source = Box::new(move || *read.lock().unwrap());
        let l = BulkPacer::with_source(source, Duration::from_millis(100), enforce);
        (cell, l)
    }

    fn set(cell: &Mutex<Published>, verdict: Verdict, memory_pressure: f64) {
        *cell.lock().unwrap() = Published {
            verdict,
            memory_pressure,
        };
    }

    #[test]
    fn allow_does_not_pause_and_refusal_is_capped() {
        let (cell, l) = limiter(true);
        assert_eq!(l.pause(1.0), Duration::ZERO);
        assert_eq!(l.pauses(), 0);
        let ms = Duration::from_millis;
        set(&cell, Verdict::Delay(ms(20)), 1.0);
        let d = l.pause(1.0);
        assert!(d >= ms(20), "{d:?}");
        assert_eq!(l.pauses(), 1);
        // A quarter batch waits a quarter of the delay, once.
        assert_eq!(l.next_wait(0.25, Duration::ZERO, false), ms(5));
        assert_eq!(l.next_wait(0.25, ms(5), true), Duration::ZERO);
        // Never past the batch's share of the cap.
        set(&cell, Verdict::Delay(MAX_PAUSE * 10), 1.0);
        assert_eq!(l.next_wait(0.5, Duration::ZERO, false), MAX_PAUSE / 2);
        assert_eq!(l.next_wait(0.5, ms(300), false), MAX_PAUSE / 2 - ms(300));
        set(&cell, Verdict::Delay(ms(20)), 1.0);
        assert_eq!(l.batch_limit(4096), 2048);
        assert_eq!(l.chunk_limit(40, 12), 12);
        let refuse = Verdict::refuse(sluice_throttle::Cause::Emergency, Duration::from_millis(1));
        set(&cell, refuse, 1.0);
        // Refused: looked at again after its retry-after (at most a tick),
        // until the cap, whether slept or not.
        assert_eq!(l.next_wait(1.0, Duration::ZERO, true), ms(1));
        assert_eq!(l.next_wait(1.0, MAX_PAUSE, true), Duration::ZERO);
        let long = Verdict::refuse(sluice_throttle::Cause::Emergency, MAX_PAUSE);
        set(&cell, long, 1.0);
        assert_eq!(l.next_wait(1.0, Duration::ZERO, true), ms(100), "one tick");
        set(&cell, refuse, 1.0);
        assert_eq!(l.batch_limit(4096), 256);
        assert_eq!(l.batch_limit(3), 1);
        assert_eq!(l.chunk_limit(40, 12), 12);
        // Before the first tick the heap is unknown (pressure 1): the base share.
        set(&cell, Verdict::Allow, 1.0);
        assert_eq!(l.chunk_limit(40, 12), 12);
        set(&cell, Verdict::Allow, 0.1);
        assert_eq!(l.chunk_limit(40, 12), 40);
        // Allowed, but the heap is past a quarter of its target: the base share.
        set(&cell, Verdict::Allow, 0.3);
        assert_eq!(l.chunk_limit(40, 12), 12);
    }

    #[test]
    fn shadow_never_pauses() {
        let (cell, l) = limiter(false);
        set(&cell, Verdict::Delay(Duration::from_millis(50)), 1.0);
        assert_eq!(l.pause(1.0), Duration::ZERO);
        assert_eq!(l.pauses(), 0);
        assert_eq!(l.batch_limit(4096), 4096);
        assert_eq!(l.chunk_limit(40, 12), 40);
    }
}
