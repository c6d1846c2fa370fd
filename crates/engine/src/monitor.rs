//! The store monitor: a task that samples the store and the process every
//! tick and publishes what it sees as gauges.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics_names as m;
use crate::{Engine, process};

impl Engine {
    /// Samples once: store sizes, reader slots, writer queue, process
    /// memory and descriptors.
    pub fn sample(&self) {
        match self.store().stats() {
            Ok(s) => {
                metrics::gauge!(m::STORE_MAP_SIZE_BYTES).set(s.map_size_bytes as f64);
                metrics::gauge!(m::STORE_USED_BYTES).set(s.used_bytes as f64);
                metrics::gauge!(m::STORE_EVENTS).set(s.events as f64);
                metrics::gauge!(m::STORE_READERS_IN_USE).set(s.readers_in_use as f64);
                metrics::gauge!(m::STORE_READERS_MAX).set(s.max_readers as f64);
            }
            Err(e) => tracing::warn!(error = %e, "store stats failed"),
        }
        metrics::gauge!(m::WRITER_QUEUE_EVENTS).set(self.writer_queue_len() as f64);
        let mem = process::memory();
        metrics::gauge!(m::PROCESS_RESIDENT_MEMORY_BYTES).set(mem.resident_bytes as f64);
        metrics::gauge!(m::PROCESS_ANONYMOUS_MEMORY_BYTES).set(mem.anonymous_bytes as f64);
        metrics::gauge!(m::PROCESS_OPEN_FDS).set(process::open_fds() as f64);
    }

    /// Runs [`Engine::sample`] every `tick` until the engine's last other
    /// reference is gone or `stop` resolves.
    pub fn spawn_monitor(
        self: &Arc<Self>,
        tick: Duration,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    _ = every.tick() => {}
                }
                // Stats open a read transaction: keep LMDB off the runtime.
                let e = engine.clone();
                if tokio::task::spawn_blocking(move || e.sample())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    }
}
