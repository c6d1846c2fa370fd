//! Sluice's runtime core, shared by `serve` and `import`.
//!
//! - [`writer`]: the single writer thread. Events wait in a bounded queue;
//!   the writer takes a batch, writes it in one LMDB transaction, commits,
//!   then answers each sender and fans the stored events out.
//! - [`reads`]: REQs and COUNTs run in bounded steps on
//!   `throttle.queries.slots` worker threads, scheduled fairly between
//!   clients by cost, their answers streamed to each session's sink; no
//!   LMDB call ever runs on an async worker thread.
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
pub mod reads;
pub mod throttle;
mod writer;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sluice_proto::Event;
use tokio::sync::{broadcast, oneshot};

pub use config::EngineConfig;
pub use reads::{ReadEnd, ReadGuard, ReadMsg, ReadSink, Reads};
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
    reads: Reads,
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
        let throttle = Throttle::new(throttle);
        let reads = Reads::start(store.clone(), throttle.clone(), &cfg);
        Arc::new(Engine {
            throttle,
            reads,
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

    /// The query workers and their scheduler.
    pub fn reads(&self) -> &Reads {
        &self.reads
    }

    /// Applies a reloaded `[throttle]` section (SIGHUP): buckets, modes,
    /// and the query scheduler's bounds.
    pub fn reload_throttle(&self, cfg: ThrottleConfig) -> Result<(), String> {
        let queries = cfg.queries.clone();
        self.throttle.reload(cfg)?;
        self.reads.reload(queries);
        Ok(())
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

    /// Stops taking writes, lets the writer commit everything queued, and
    /// waits for it. Idempotent.
    pub fn shutdown(&self) {
        self.reads.shutdown();
        self.writer.shutdown();
        if let Err(e) = self.store.force_sync() {
            tracing::error!(error = %e, "final store sync failed");
        }
    }
}
