//! The store monitor: a std thread owned by the engine (started by
//! [`Engine::start`], stopped and joined by [`Engine::shutdown`]) that
//! samples the store and the process every `throttle.tick_ms`, turns what
//! it sees into load signals, ticks the governor (PID controllers,
//! emergency mode), publishes the verdicts for the hot path, exports
//! everything as gauges, and takes relief actions when the write delay is
//! large. `serve` and `import` run this same tick; its LMDB calls (store
//! stats, relief sync) never run on an async worker.
//!
//! Signals (each normalised by `sluice-throttle`, see docs/throttling.md):
//! - writer wait: the longest time an event waited in the writer queue
//!   before its batch committed, since the last tick; when no batch
//!   committed but events are queued, the tick length (the writer is stuck);
//! - commit latency: the slowest group commit since the last tick, against
//!   a slow moving average of past commits (the baseline); or, when it
//!   weighs more, the recent cost of bulk commits per 1000 stored events
//!   against their baseline (the writer keeps both, see `writer/signals.rs`);
//! - writer queue fill: queued events / `engine.writer_queue_events`, or a
//!   bulk client's backlog over its bound when that is fuller;
//! - capacity: the larger of the map's fill (`data.mdb`'s last page over
//!   the map size) and the disk's (`store.min_free_disk_mb` over the free
//!   space of the store's filesystem, from statvfs: 0.8 at 1.25 times the
//!   floor, 1 at the floor); the same reading opens or closes the
//!   writer's disk gate;
//! - reader slots: LMDB readers in use / `store.max_readers`;
//! - read latency: the longest wait of a query for its first step since
//!   the last tick (queueing in the query scheduler).
//!
//! Memory pressure is the process's anonymous memory (`RssAnon` from
//! /proc/self/status: heap and stacks, not the file-backed LMDB map) over
//! `throttle.target_memory_mb`.
//!
//! Health ([`MonitorHealth`]): the thread records when it last ticked and
//! whether its last store stats read succeeded; `Engine::health` reads them.
//! The thread holds only a weak reference to the engine, so the engine owns
//! it and not the other way round.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_throttle::{Governor, GovernorState, LoadSignals};

use crate::metrics_names as m;
use crate::{Engine, ThreadExit, process};

/// Weight of a new commit sample in the baseline average: slow, so a
/// sustained slowdown shows as load for tens of seconds before it becomes
/// the new normal.
const BASELINE_ALPHA: f64 = 0.01;

/// What the monitor thread tells `Engine::health`.
#[derive(Debug)]
pub(crate) struct MonitorHealth {
    /// False once the thread has ended (stopped, or panicked).
    pub running: Arc<AtomicBool>,
    /// The throttle clock (`Limiter::now_ns`) at the end of the last tick.
    pub last_tick_ns: AtomicU64,
    /// The tick interval in force, ns.
    pub tick_ns: AtomicU64,
    /// Whether the last store stats read succeeded.
    pub stats_ok: AtomicBool,
}

/// The engine's handle on its monitor thread.
pub(crate) struct MonitorHandle {
    pub health: MonitorHealth,
    /// Dropped to stop the thread.
    stop: Mutex<Option<SyncSender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl MonitorHandle {
    pub fn new() -> MonitorHandle {
        MonitorHandle {
            health: MonitorHealth {
                running: Arc::new(AtomicBool::new(false)),
                last_tick_ns: AtomicU64::new(0),
                tick_ns: AtomicU64::new(0),
                stats_ok: AtomicBool::new(true),
            },
            stop: Mutex::new(None),
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread and returns after its first tick, so the first
    /// verdict anyone reads is a real one.
    pub fn start(engine: &Arc<Engine>) -> Result<(), crate::StartError> {
        let cfg = engine.throttle.config();
        let governor =
            Governor::new(cfg.clone()).map_err(|e| crate::StartError::Config(e.to_string()))?;
        let mut mon = Monitor {
            governor,
            commit_baseline_secs: 0.0,
            last_relief: None,
            last_tick: Instant::now(),
            last_fd_count: None,
            last_heap_check: None,
            heap_free_floor: 0,
            fds: 0,
            fds_at_heap_check: 0,
        };
        metrics::gauge!(m::THROTTLE_TARGET_MEMORY_BYTES).set(cfg.target_memory_bytes() as f64);
        let handle = &engine.monitor;
        let (stop_tx, stop_rx) = std::sync::mpsc::sync_channel::<()>(1);
        let (first_tx, first_rx) = std::sync::mpsc::sync_channel::<()>(1);
        handle.health.running.store(true, Ordering::Release);
        let exit = ThreadExit::new("monitor", handle.health.running.clone());
        let weak: Weak<Engine> = Arc::downgrade(engine);
        let thread = std::thread::Builder::new()
            .name("sluice-monitor".into())
            .spawn(move || {
                let _exit = exit;
                let mut first = Some(first_tx);
                loop {
                    // Gone when the engine is dropped without a shutdown.
                    let Some(engine) = weak.upgrade() else { return };
                    mon.tick(&engine);
                    let tick = Duration::from_millis(engine.throttle.config().tick_ms);
                    drop(engine);
                    if let Some(tx) = first.take() {
                        let _ = tx.send(());
                    }
                    match stop_rx.recv_timeout(tick) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .map_err(|source| crate::StartError::Thread {
                thread: "sluice-monitor".into(),
                source,
            })?;
        *handle.stop.lock() = Some(stop_tx);
        *handle.thread.lock() = Some(thread);
        // Err: the first tick panicked; health reports the monitor stopped.
        let _ = first_rx.recv();
        Ok(())
    }

    /// Stops the thread after its current tick and waits for it. Idempotent.
    pub fn stop(&self) {
        drop(self.stop.lock().take());
        let thread = self.thread.lock().take();
        if let Some(thread) = thread {
            // A panic was logged and counted by the thread itself.
            let _ = thread.join();
        }
    }
}

/// Open descriptors are counted once a second: enough for a gauge, and
/// where the kernel cannot count them (before Linux 6.2) the count walks
/// /proc/self/fd, one entry per socket (at 10k connections every 100 ms
/// tick, a tenth of a core).
const FD_COUNT_EVERY: Duration = Duration::from_secs(1);

/// How much of the heap is free is looked at (glibc's `mallinfo2`, which
/// walks every free chunk: about 13 ms with 8,000 connections open, 0.5% of
/// a core every 2 s) when connections have gone since the last look (a
/// crowd that left is what leaves freed pages behind), at most every
/// [`HEAP_CHECK_MIN`], and otherwise every [`HEAP_CHECK_EVERY`].
const HEAP_CHECK_MIN: Duration = Duration::from_secs(2);
const HEAP_CHECK_EVERY: Duration = Duration::from_secs(30);
/// Heap freed (since the last trim) past which it is handed back to the
/// OS: the allocator keeps freed pages in its arenas, so RSS would stay at
/// its peak after a crowd of connections left.
const HEAP_FREE_RETURN_BYTES: usize = 4 << 20;

struct Monitor {
    governor: Governor,
    commit_baseline_secs: f64,
    last_relief: Option<Instant>,
    last_tick: Instant,
    /// When open descriptors were last counted (see [`FD_COUNT_EVERY`]).
    last_fd_count: Option<Instant>,
    /// When free heap was last looked at (see [`HEAP_CHECK_EVERY`]), and
    /// how much was free after it was last handed back (or the least seen
    /// since): only what was freed since is worth another trim.
    last_heap_check: Option<Instant>,
    heap_free_floor: usize,
    /// Open descriptors at the last count, and at the last heap check.
    fds: u64,
    fds_at_heap_check: u64,
}

/// Whether enough descriptors (connections) closed since the heap was last
/// looked at for a look to be worth it: a tenth of them, at least 64.
fn crowd_left(at_check: u64, now: u64) -> bool {
    at_check.saturating_sub(now) >= (at_check / 10).max(64)
}

impl Monitor {
    fn tick(&mut self, engine: &Engine) {
        let throttle = engine.throttle.clone();
        let cfg = throttle.config();
        if *self.governor.config() != cfg {
            if let Err(e) = self.governor.set_config(cfg.clone()) {
                tracing::error!(error = %e, "throttle reload rejected by the governor");
            }
            metrics::gauge!(m::THROTTLE_TARGET_MEMORY_BYTES).set(cfg.target_memory_bytes() as f64);
        }
        let since_last = self.last_tick.elapsed();
        self.last_tick = Instant::now();
        let mem = process::memory();
        let signals = self.sample_signals(engine, since_last);
        let state = *self
            .governor
            .tick(mem.anonymous_bytes, &signals, throttle.now_ns());
        throttle.publish(&state);
        export(&state);
        engine.trust().tick(
            state.write.pid.output,
            throttle.take_outsider_asks(),
            since_last,
            state.now_ns,
        );
        metrics::gauge!(m::PROCESS_RESIDENT_MEMORY_BYTES).set(mem.resident_bytes as f64);
        metrics::gauge!(m::PROCESS_ANONYMOUS_MEMORY_BYTES).set(mem.anonymous_bytes as f64);
        if self
            .last_fd_count
            .is_none_or(|t| t.elapsed() >= FD_COUNT_EVERY)
        {
            self.last_fd_count = Some(Instant::now());
            self.fds = process::open_fds();
            metrics::gauge!(m::PROCESS_OPEN_FDS).set(self.fds as f64);
        }
        if self.last_heap_check.is_none_or(|t| {
            let since = t.elapsed();
            since >= HEAP_CHECK_EVERY
                || (since >= HEAP_CHECK_MIN && crowd_left(self.fds_at_heap_check, self.fds))
        }) {
            self.last_heap_check = Some(Instant::now());
            self.fds_at_heap_check = self.fds;
            if let Some(free) = free_heap_bytes() {
                self.heap_free_floor = self.heap_free_floor.min(free);
                if free >= self.heap_free_floor + HEAP_FREE_RETURN_BYTES && release_free_heap() {
                    metrics::counter!(m::PROCESS_HEAP_RETURNED_TOTAL).increment(1);
                    self.heap_free_floor = free_heap_bytes().unwrap_or(free);
                }
            }
        }
        for (name, s) in throttle.bucket_stats() {
            metrics::gauge!(m::THROTTLE_BUCKET_KEYS, "bucket" => name).set(s.keys as f64);
            metrics::counter!(m::THROTTLE_BUCKET_EVICTIONS_TOTAL, "bucket" => name)
                .absolute(s.evicted_idle_total + s.evicted_active_total);
        }
        metrics::gauge!(m::QUERY_READ_BUDGET_RATE).set(throttle.read_cost_rate_per_ip());
        self.relieve(engine, &state, &cfg.relief);
        let health = &engine.monitor.health;
        health
            .tick_ns
            .store(cfg.tick_ms.saturating_mul(1_000_000), Ordering::Relaxed);
        health
            .last_tick_ns
            .store(throttle.now_ns(), Ordering::Release);
    }

    fn sample_signals(&mut self, engine: &Engine, since_last: Duration) -> LoadSignals {
        let ws = &engine.writer.signals;
        let batches = ws.batches.swap(0, Ordering::Relaxed);
        let mut wait_ns = ws.max_wait_ns.swap(0, Ordering::Relaxed);
        let queued = engine.writer.queue_len();
        if batches == 0 && queued > 0 {
            wait_ns = wait_ns.max(since_last.as_nanos() as u64);
        }
        // An EVENT waits for the write-policy plugin before it reaches the
        // queue: a slow plugin is write load like a slow queue.
        if let Some(plugin) = engine.plugin() {
            wait_ns = wait_ns.max(plugin.take_max_latency().as_nanos() as u64);
        }
        let commit_secs = ws.max_commit_ns.swap(0, Ordering::Relaxed) as f64 / 1e9;
        if batches > 0 {
            self.commit_baseline_secs = if self.commit_baseline_secs == 0.0 {
                commit_secs
            } else {
                self.commit_baseline_secs * (1.0 - BASELINE_ALPHA) + commit_secs * BASELINE_ALPHA
            };
        }
        let group = (
            if batches > 0 { commit_secs } else { 0.0 },
            self.commit_baseline_secs,
        );
        let f64_of = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        let bulk = (f64_of(&ws.bulk_cost_secs), f64_of(&ws.bulk_baseline_secs));
        let floor = self.governor.config().signals.commit_baseline_floor_us as f64 / 1e6;
        let (commit_latency_secs, commit_baseline_secs) = heavier_commit(group, bulk, floor);
        export_reads(&engine.reads.stats());
        let read_secs = engine.reads.take_max_wait_secs();
        metrics::gauge!(m::WRITER_QUEUE_EVENTS).set(queued as f64);
        let queue_fill = queued as f64 / engine.cfg.writer_queue_events.max(1) as f64;
        let stats = engine.store.stats();
        engine
            .monitor
            .health
            .stats_ok
            .store(stats.is_ok(), Ordering::Relaxed);
        let disk_fill = match engine.store.disk_space() {
            Ok(d) => {
                engine.disk.update(&d);
                metrics::gauge!(m::STORE_DISK_FREE_BYTES).set(d.free_bytes as f64);
                metrics::gauge!(m::STORE_DISK_TOTAL_BYTES).set(d.total_bytes as f64);
                metrics::gauge!(m::STORE_DISK_MIN_FREE_BYTES).set(d.min_free_bytes as f64);
                disk_fill(&d)
            }
            Err(e) => {
                tracing::warn!(error = %e, "statvfs of the store's directory failed");
                0.0
            }
        };
        metrics::gauge!(m::RETENTION_TARGET_BYTES).set(engine.retention().target_bytes as f64);
        let (map_fill, readers_fill) = match stats {
            Ok(s) => {
                metrics::gauge!(m::STORE_MAP_SIZE_BYTES).set(s.map_size_bytes as f64);
                metrics::gauge!(m::STORE_USED_BYTES).set(s.used_bytes as f64);
                metrics::gauge!(m::STORE_FILE_BYTES).set(s.file_bytes as f64);
                metrics::gauge!(m::STORE_EVENTS).set(s.events as f64);
                metrics::gauge!(m::STORE_READERS_IN_USE).set(s.readers_in_use as f64);
                metrics::gauge!(m::STORE_READERS_MAX).set(s.max_readers as f64);
                (
                    s.map_fill_ratio(),
                    s.readers_in_use as f64 / s.max_readers.max(1) as f64,
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "store stats failed");
                (0.0, 0.0)
            }
        };
        LoadSignals {
            writer_wait_secs: wait_ns as f64 / 1e9,
            commit_latency_secs,
            commit_baseline_secs,
            writer_queue_fill: queue_fill.max(engine.writer.backlog.fill()),
            map_fill: map_fill.max(disk_fill),
            reader_slots_fill: readers_fill,
            read_latency_secs: read_secs,
        }
    }

    /// Relief (docs/design.md#pid-control): when the write delay is large or memory is in
    /// emergency, flush LMDB (ForceFlush) and hand freed heap back to the OS.
    fn relieve(
        &mut self,
        engine: &Engine,
        state: &GovernorState,
        cfg: &sluice_throttle::ReliefConfig,
    ) {
        let max_delay_ns = self.governor.config().write.max_delay_ns().max(1);
        let fraction = state.write.delay_ns as f64 / max_delay_ns as f64;
        if !(state.emergency || fraction >= cfg.at_delay_fraction) {
            return;
        }
        let min_gap = Duration::from_millis(cfg.min_interval_ms);
        if self.last_relief.is_some_and(|t| t.elapsed() < min_gap) {
            return;
        }
        self.last_relief = Some(Instant::now());
        if let Err(e) = engine.store.force_sync() {
            tracing::warn!(error = %e, "relief sync failed");
        }
        metrics::counter!(m::THROTTLE_RELIEF_TOTAL, "action" => "sync").increment(1);
        if release_free_heap() {
            metrics::counter!(m::THROTTLE_RELIEF_TOTAL, "action" => "heap_trim").increment(1);
        }
    }
}

/// The disk's fill as a capacity signal, `0..=1`: the floor
/// (`store.min_free_disk_mb`) over the free space, so it passes the
/// signal's low mark (0.8) when free space is 1.25 times the floor and is
/// 1 at the floor, whatever the disk's size. No floor: 0.
fn disk_fill(d: &sluice_store::DiskSpace) -> f64 {
    if d.min_free_bytes == 0 {
        return 0.0;
    }
    if d.free_bytes == 0 {
        return 1.0;
    }
    (d.min_free_bytes as f64 / d.free_bytes as f64).min(1.0)
}

/// Of two (latency, baseline) pairs, the one whose latency is the larger
/// multiple of its baseline (at least `floor`); the first on a tie. With no
/// bulk commits the bulk pair is (0, 0) and the group-commit pair is used
/// as is, so a relay's signal does not change.
fn heavier_commit(group: (f64, f64), bulk: (f64, f64), floor: f64) -> (f64, f64) {
    let slowdown = |(latency, base): (f64, f64)| latency / base.max(floor).max(f64::MIN_POSITIVE);
    if slowdown(bulk) > slowdown(group) {
        bulk
    } else {
        group
    }
}

/// Bytes free in the allocator's arenas (glibc's mallinfo2); `None` where
/// the allocator does not say.
fn free_heap_bytes() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's own statistics.
        let info = unsafe { libc::mallinfo2() };
        Some(info.fordblks)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Returns freed heap pages to the OS (glibc's malloc_trim). False where
/// the allocator offers no such call.
fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists.
        unsafe { libc::malloc_trim(0) };
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// The query scheduler's counts and totals.
pub(crate) fn export_reads(s: &sluice_throttle::FairStats) {
    metrics::gauge!(m::QUERY_WINDOW_IN_FLIGHT).set(s.running as f64);
    metrics::gauge!(m::QUERY_WINDOW_QUEUED).set(s.queued as f64);
    metrics::gauge!(m::QUERY_OPEN).set(s.open as f64);
    metrics::gauge!(m::QUERY_OPEN_UNITS).set(s.open_units as f64);
    metrics::gauge!(m::QUERY_PARKED).set(s.parked as f64);
    metrics::gauge!(m::QUERY_CLIENTS).set(s.clients as f64);
    metrics::gauge!(m::QUERY_CLIENTS_WAITING).set(s.clients_waiting as f64);
    metrics::counter!(m::QUERY_STEPS_TOTAL).absolute(s.steps_total);
    metrics::counter!(m::QUERY_NEW_FLOW_STEPS_TOTAL).absolute(s.new_flow_steps_total);
    metrics::counter!(m::QUERY_ADMITTED_TOTAL).absolute(s.admitted_total);
    metrics::counter!(m::QUERY_CANCELLED_TOTAL).absolute(s.cancelled_total);
}

fn export(s: &GovernorState) {
    metrics::gauge!(m::THROTTLE_MEMORY_PRESSURE_RATIO).set(s.memory_pressure);
    metrics::gauge!(m::THROTTLE_LOAD_LEVEL_RATIO).set(s.load_level);
    metrics::gauge!(m::THROTTLE_PROCESS_VARIABLE_RATIO).set(s.process_variable);
    metrics::gauge!(m::THROTTLE_EMERGENCY).set(if s.emergency { 1.0 } else { 0.0 });
    metrics::counter!(m::THROTTLE_EMERGENCY_ENTERED_TOTAL).absolute(s.emergency_entered_total);
    for (name, v) in s.signals.named() {
        metrics::gauge!(m::THROTTLE_SIGNAL_RATIO, "signal" => name).set(v);
    }
    for (dir, d) in [("write", &s.write), ("read", &s.read)] {
        metrics::gauge!(m::THROTTLE_SETPOINT_RATIO, "direction" => dir).set(d.setpoint);
        metrics::gauge!(m::THROTTLE_PID_TERM, "direction" => dir, "term" => "p").set(d.pid.p);
        metrics::gauge!(m::THROTTLE_PID_TERM, "direction" => dir, "term" => "i").set(d.pid.i);
        metrics::gauge!(m::THROTTLE_PID_TERM, "direction" => dir, "term" => "d").set(d.pid.d);
        metrics::gauge!(m::THROTTLE_OUTPUT_RATIO, "direction" => dir).set(d.pid.output);
        metrics::gauge!(m::THROTTLE_DELAY_SECONDS, "direction" => dir).set(d.delay_ns as f64 / 1e9);
    }
}

#[cfg(test)]
mod tests {
    use super::{crowd_left, heavier_commit};

    #[test]
    fn the_heap_is_looked_at_when_a_tenth_of_the_connections_left() {
        assert!(!crowd_left(0, 0));
        assert!(!crowd_left(100, 200), "more connections: nothing freed");
        assert!(!crowd_left(100, 40), "fewer than 64 gone");
        assert!(crowd_left(100, 36));
        assert!(!crowd_left(8_000, 7_300));
        assert!(crowd_left(8_000, 7_200));
    }

    #[test]
    fn the_heavier_commit_signal_is_used() {
        // A relay: no bulk commits, the group-commit pair as is.
        assert_eq!(
            heavier_commit((0.004, 0.002), (0.0, 0.0), 0.001),
            (0.004, 0.002)
        );
        assert_eq!(
            heavier_commit((0.0, 0.002), (0.0, 0.0), 0.001),
            (0.0, 0.002)
        );
        // An import: only bulk commits.
        assert_eq!(
            heavier_commit((0.0, 0.0), (0.09, 0.03), 0.001),
            (0.09, 0.03)
        );
        // Both: the one further above its baseline; the floor counts.
        assert_eq!(
            heavier_commit((0.004, 0.002), (0.05, 0.04), 0.001),
            (0.004, 0.002)
        );
        assert_eq!(
            heavier_commit((0.0005, 0.0001), (0.05, 0.04), 0.001),
            (0.05, 0.04)
        );
    }
}
