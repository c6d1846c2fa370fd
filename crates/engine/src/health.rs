//! Whether the engine is fit for traffic ([`crate::Engine::health`]), what
//! its threads leave behind when they end, and the disk gate the writer
//! reads before each batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_store::DiskSpace;

use crate::metrics_names;

/// The monitor counts as stalled when it has not ticked for this many tick
/// intervals...
const MONITOR_STALE_TICKS: u64 = 10;
/// ...and for at least this long (a relief sync of a large store, or a
/// busy machine, may hold one tick up for a while).
const MONITOR_STALE_MIN: Duration = Duration::from_secs(2);

/// Why the engine is not ready for traffic ([`Engine::health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unready {
    #[error("shutting down")]
    ShuttingDown,
    #[error("writer stopped")]
    WriterStopped,
    #[error("monitor stopped")]
    MonitorStopped,
    #[error("monitor has not ticked for {0} ms")]
    MonitorStalled(u64),
    #[error("store stats read failed")]
    StoreStats,
    #[error("search indexer stopped")]
    SearchStopped,
}

/// What [`Engine::health`] judges, read from the threads' records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HealthInputs {
    pub(crate) shutting_down: bool,
    pub(crate) writer_alive: bool,
    pub(crate) monitor_running: bool,
    /// Limiter clock now and at the monitor's last tick, and its tick, ns.
    pub(crate) now_ns: u64,
    pub(crate) last_tick_ns: u64,
    pub(crate) tick_ns: u64,
    pub(crate) stats_ok: bool,
}

pub(crate) fn judge(h: HealthInputs) -> Result<(), Unready> {
    if h.shutting_down {
        return Err(Unready::ShuttingDown);
    }
    if !h.writer_alive {
        return Err(Unready::WriterStopped);
    }
    if !h.monitor_running {
        return Err(Unready::MonitorStopped);
    }
    let since = h.now_ns.saturating_sub(h.last_tick_ns);
    let stale_after = h
        .tick_ns
        .saturating_mul(MONITOR_STALE_TICKS)
        .max(MONITOR_STALE_MIN.as_nanos() as u64);
    if since > stale_after {
        return Err(Unready::MonitorStalled(since / 1_000_000));
    }
    if !h.stats_ok {
        return Err(Unready::StoreStats);
    }
    Ok(())
}

/// Held by an engine thread for its whole life: when the thread ends,
/// however (a panic included), it clears `running`; a panic is logged and
/// counted.
pub(crate) struct ThreadExit {
    thread: &'static str,
    running: Arc<AtomicBool>,
}

impl ThreadExit {
    pub(crate) fn new(thread: &'static str, running: Arc<AtomicBool>) -> ThreadExit {
        ThreadExit { thread, running }
    }
}

impl Drop for ThreadExit {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Release);
        if std::thread::panicking() {
            tracing::error!(
                thread = self.thread,
                "engine thread panicked; the relay is not ready (see /readyz) until restarted"
            );
            metrics::counter!(metrics_names::ENGINE_THREAD_PANICS_TOTAL, "thread" => self.thread)
                .increment(1);
        }
    }
}

/// Whether the store's filesystem has room for writes: the monitor sets it
/// from statvfs every tick; the writer reads it before each batch and
/// refuses while free space is under `store.min_free_disk_mb`.
#[derive(Debug, Default)]
pub(crate) struct DiskGate {
    low: AtomicBool,
    free_bytes: std::sync::atomic::AtomicU64,
    min_free_bytes: std::sync::atomic::AtomicU64,
}

impl DiskGate {
    pub(crate) fn update(&self, space: &DiskSpace) {
        self.free_bytes.store(space.free_bytes, Ordering::Relaxed);
        self.min_free_bytes
            .store(space.min_free_bytes, Ordering::Relaxed);
        let low = space.free_bytes < space.min_free_bytes;
        if self.low.swap(low, Ordering::AcqRel) != low {
            if low {
                tracing::error!(
                    free_mb = space.free_bytes >> 20,
                    min_free_mb = space.min_free_bytes >> 20,
                    "DISK IS NEARLY FULL: writes are refused until free space is over store.min_free_disk_mb"
                );
            } else {
                tracing::info!(
                    free_mb = space.free_bytes >> 20,
                    "disk space is back: writes resume"
                );
            }
        }
    }

    /// Why writes are refused now, if they are.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.low.load(Ordering::Acquire).then(|| {
            format!(
                "{} MB free on the store's disk, under store.min_free_disk_mb ({} MB)",
                self.free_bytes.load(Ordering::Relaxed) >> 20,
                self.min_free_bytes.load(Ordering::Relaxed) >> 20
            )
        })
    }
}
