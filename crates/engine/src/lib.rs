//! Sluice's runtime core, shared by `serve` and `import`.
//!
//! - [`writer`]: the single writer thread. Events wait in a bounded queue;
//!   the writer takes a batch, writes it in one LMDB transaction, commits,
//!   then answers each sender and fans the stored events out.
//! - [`Engine::query`]: queries run on tokio's blocking pool behind the
//!   adaptive query window ([`throttle`]), so no LMDB call ever runs on an
//!   async worker thread and no more than `throttle.queries.slots` run at once.
//! - Live fan-out: a bounded broadcast channel of stored (and ephemeral)
//!   events; a receiver that falls behind by more than its capacity is told
//!   so and its connection is dropped by the server.
//!
//! Invariants: only the writer thread writes to the store (besides another
//! process, which LMDB serialises); an OK true is sent only after the commit
//! that made the event durable.

mod config;
pub mod metrics_names;
mod monitor;
pub mod process;
pub mod throttle;
mod writer;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sluice_proto::{Event, Filter};
use sluice_store::QueryOptions;
use tokio::sync::{broadcast, oneshot};

pub use config::EngineConfig;
pub use sluice_store::{QueryOutput, Store, StoreError, StoreOptions, StoreStats, WriteOutcome};
pub use throttle::{Admit, Refusal, Throttle, ThrottleConfig};
pub use writer::{SubmitError, WriteError, WriteResult, outcome_label};

/// An event as live subscriptions receive it.
#[derive(Debug)]
pub struct LiveEvent {
    /// Store serial; `None` for ephemeral events, which are never stored.
    pub serial: Option<u64>,
    pub event: Arc<Event>,
}

/// Errors of a query.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("store error: {0}")]
    Store(#[from] StoreError),
    #[error("engine is shutting down")]
    Closed,
    #[error("query refused: {}", .0.detail())]
    Refused(Refusal),
}

/// The running core. Shared by reference (`Arc<Engine>`) among sessions.
pub struct Engine {
    store: Store,
    cfg: EngineConfig,
    writer: writer::WriterHandle,
    live: broadcast::Sender<Arc<LiveEvent>>,
    throttle: Arc<Throttle>,
    /// Slowest query since the monitor last looked (ns); swapped to 0 each tick.
    max_query_ns: std::sync::atomic::AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

/// Current unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Engine {
    /// Starts the writer thread over `store`.
    pub fn start(store: Store, cfg: EngineConfig, throttle: ThrottleConfig) -> Arc<Engine> {
        let (live, _) = broadcast::channel(cfg.live_buffer_events);
        let writer = writer::spawn(store.clone(), cfg.clone(), live.clone());
        Arc::new(Engine {
            throttle: Throttle::new(throttle),
            max_query_ns: Default::default(),
            closed: Default::default(),
            store,
            cfg,
            writer,
            live,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn throttle(&self) -> &Arc<Throttle> {
        &self.throttle
    }

    /// Queues an event for the writer without waiting. The receiver yields
    /// the outcome once the batch holding the event has committed.
    /// `received` is when the event was admitted: the writer wait the
    /// monitor sees runs from there, so time spent waiting for a CPU
    /// (signature checks of a flood) counts as load, not only the queue.
    pub fn submit(
        &self,
        event: Arc<Event>,
        received: Instant,
    ) -> Result<oneshot::Receiver<WriteResult>, SubmitError> {
        self.writer.submit(event, false, received)
    }

    /// Queues an event, blocking the calling (non-async) thread while the
    /// queue is full. For the import pipeline.
    pub fn submit_blocking(
        &self,
        event: Arc<Event>,
    ) -> Result<oneshot::Receiver<WriteResult>, SubmitError> {
        self.writer.submit(event, true, Instant::now())
    }

    /// Delivers an ephemeral event to live subscriptions; never stored.
    pub fn publish_ephemeral(&self, event: Arc<Event>) {
        // No receivers is not an error: nobody is listening.
        let _ = self.live.send(Arc::new(LiveEvent {
            serial: None,
            event,
        }));
        metrics::counter!(metrics_names::LIVE_PUBLISHED_TOTAL).increment(1);
    }

    /// A receiver of every event stored or published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<LiveEvent>> {
        self.live.subscribe()
    }

    /// Events waiting for the writer.
    pub fn writer_queue_len(&self) -> usize {
        self.writer.queue_len()
    }

    /// False once the writer thread has stopped (shutdown or a fatal error).
    pub fn writer_alive(&self) -> bool {
        self.writer.alive()
    }

    /// Runs a query on the blocking pool. Each filter's limit must already
    /// be set (the caller applies default and max limits).
    pub async fn query(&self, filters: Vec<Filter>) -> Result<QueryOutput, QueryError> {
        let mut slot = self.query_slot().await?;
        let store = self.store.clone();
        let opts = QueryOptions {
            now: unix_now(),
            max_scan_rows: self.cfg.max_scan_rows,
        };
        let started = Instant::now();
        let out = tokio::task::spawn_blocking(move || store.query(&filters, &opts))
            .await
            .map_err(|_| QueryError::Closed)??;
        slot.finish();
        self.record_query_time(started);
        metrics::counter!(metrics_names::QUERY_ROWS_SCANNED_TOTAL).increment(out.rows_scanned);
        if out.truncated {
            metrics::counter!(metrics_names::QUERY_TRUNCATED_TOTAL).increment(1);
        }
        Ok(out)
    }

    /// NIP-45 count on the blocking pool.
    pub async fn count(&self, filters: Vec<Filter>) -> Result<u64, QueryError> {
        let mut slot = self.query_slot().await?;
        let store = self.store.clone();
        let opts = QueryOptions {
            now: unix_now(),
            max_scan_rows: self.cfg.max_count_rows,
        };
        let started = Instant::now();
        let (n, rows, truncated) =
            tokio::task::spawn_blocking(move || store.count(&filters, &opts))
                .await
                .map_err(|_| QueryError::Closed)??;
        slot.finish();
        self.record_query_time(started);
        metrics::counter!(metrics_names::QUERY_ROWS_SCANNED_TOTAL).increment(rows);
        if truncated {
            metrics::counter!(metrics_names::QUERY_TRUNCATED_TOTAL).increment(1);
        }
        Ok(n)
    }

    async fn query_slot(&self) -> Result<throttle::QuerySlot, QueryError> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(QueryError::Closed);
        }
        self.throttle
            .acquire_query_slot()
            .await
            .map_err(QueryError::Refused)
    }

    fn record_query_time(&self, started: Instant) {
        let took = started.elapsed();
        metrics::histogram!(metrics_names::QUERY_SECONDS).record(took.as_secs_f64());
        self.max_query_ns
            .fetch_max(took.as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stops taking writes, lets the writer commit everything queued, and
    /// waits for it. Idempotent.
    pub fn shutdown(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.writer.shutdown();
        if let Err(e) = self.store.force_sync() {
            tracing::error!(error = %e, "final store sync failed");
        }
    }
}
