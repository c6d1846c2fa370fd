//! The single writer thread and its bounded queue.
//!
//! Group commit: the writer blocks for the first queued event, then takes
//! whatever else is queued (up to `max_batch_events` / `max_batch_bytes`),
//! writes the batch in one transaction and commits. Only then does it answer
//! each sender and hand the stored events to live subscriptions. Under load
//! batches grow and the commit cost is shared; when idle a lone event is
//! committed at once.
//!
//! The queue is a `sync_channel` of `writer_queue_events` entries. When it
//! is full the submitter loses: `submit` fails with `QueueFull` (the session
//! answers `rate-limited:`), `submit_blocking` (import) waits.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_proto::Event;
use sluice_store::{Store, StoreError, WriteOutcome};
use tokio::sync::{broadcast, oneshot};

use crate::metrics_names as m;
use crate::{EngineConfig, LiveEvent, unix_now};

/// What the writer answers for one event.
pub type WriteResult = Result<WriteOutcome, WriteError>;

/// A write that did not happen; the event is not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("store is full")]
    StoreFull,
    #[error("store error: {0}")]
    Store(String),
}

/// Why an event could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("writer queue is full")]
    QueueFull,
    #[error("writer has stopped")]
    Closed,
}

enum Msg {
    Write(Request),
    Shutdown,
}

struct Request {
    event: Arc<Event>,
    enqueued: Instant,
    reply: oneshot::Sender<WriteResult>,
}

/// What the writer saw since the monitor last looked: the longest queue
/// wait and the slowest commit (ns), and how many batches committed. The
/// monitor swaps them to zero each tick.
#[derive(Default)]
pub(crate) struct WriterSignals {
    pub max_wait_ns: AtomicU64,
    pub max_commit_ns: AtomicU64,
    pub batches: AtomicU64,
}

pub(crate) struct WriterHandle {
    pub(crate) signals: Arc<WriterSignals>,
    tx: SyncSender<Msg>,
    queued: Arc<AtomicUsize>,
    alive: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) fn spawn(
    store: Store,
    cfg: EngineConfig,
    live: broadcast::Sender<Arc<LiveEvent>>,
) -> WriterHandle {
    let (tx, rx) = std::sync::mpsc::sync_channel(cfg.writer_queue_events);
    let queued = Arc::new(AtomicUsize::new(0));
    let alive = Arc::new(AtomicBool::new(true));
    let signals = Arc::new(WriterSignals::default());
    let w = Writer {
        signals: signals.clone(),
        store,
        cfg,
        live,
        rx,
        queued: queued.clone(),
    };
    let alive2 = alive.clone();
    let thread = std::thread::Builder::new()
        .name("sluice-writer".into())
        .spawn(move || {
            w.run();
            alive2.store(false, Ordering::Release);
        })
        .expect("spawning the writer thread");
    WriterHandle {
        signals,
        tx,
        queued,
        alive,
        thread: Mutex::new(Some(thread)),
    }
}

impl WriterHandle {
    pub(crate) fn submit(
        &self,
        event: Arc<Event>,
        block: bool,
        received: Instant,
    ) -> Result<oneshot::Receiver<WriteResult>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let msg = Msg::Write(Request {
            event,
            enqueued: received,
            reply,
        });
        // Count before sending so the writer's decrement never underflows.
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = if block {
            self.tx.send(msg).map_err(|_| SubmitError::Closed)
        } else {
            self.tx.try_send(msg).map_err(|e| match e {
                TrySendError::Full(_) => SubmitError::QueueFull,
                TrySendError::Disconnected(_) => SubmitError::Closed,
            })
        };
        if let Err(e) = sent {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            if e == SubmitError::QueueFull {
                metrics::counter!(m::WRITER_QUEUE_FULL_TOTAL).increment(1);
            }
            return Err(e);
        }
        Ok(rx)
    }

    pub(crate) fn queue_len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Asks the writer to commit what is queued and stop, and waits for it.
    pub(crate) fn shutdown(&self) {
        let Some(thread) = self.thread.lock().expect("writer handle lock").take() else {
            return;
        };
        // Blocks only while the queue is full, which the writer is draining.
        let _ = self.tx.send(Msg::Shutdown);
        if thread.join().is_err() {
            tracing::error!("writer thread panicked");
        }
    }
}

struct Writer {
    signals: Arc<WriterSignals>,
    store: Store,
    cfg: EngineConfig,
    live: broadcast::Sender<Arc<LiveEvent>>,
    rx: Receiver<Msg>,
    queued: Arc<AtomicUsize>,
}

impl Writer {
    fn run(self) {
        let purge_every = Duration::from_millis(self.cfg.expiry_purge_interval_ms);
        let mut next_purge = Instant::now() + purge_every;
        let mut stopping = false;
        while !stopping {
            let wait = next_purge.saturating_duration_since(Instant::now());
            let first = match self.rx.recv_timeout(wait) {
                Ok(Msg::Write(r)) => r,
                Ok(Msg::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    self.purge_expired();
                    next_purge = Instant::now() + purge_every;
                    continue;
                }
            };
            let mut batch = vec![first];
            stopping = self.fill(&mut batch);
            self.write(batch);
            if Instant::now() >= next_purge {
                self.purge_expired();
                next_purge = Instant::now() + purge_every;
            }
        }
        // Commit whatever is still queued so every accepted event lands.
        loop {
            let mut batch = Vec::new();
            self.fill(&mut batch);
            if batch.is_empty() {
                break;
            }
            self.write(batch);
        }
        tracing::info!("writer stopped");
    }

    /// Adds queued requests to `batch` up to the batch bounds. Returns true
    /// when a shutdown request was seen.
    fn fill(&self, batch: &mut Vec<Request>) -> bool {
        let mut bytes: usize = batch.iter().map(|r| r.event.raw().len()).sum();
        while batch.len() < self.cfg.max_batch_events && bytes < self.cfg.max_batch_bytes {
            match self.rx.try_recv() {
                Ok(Msg::Write(r)) => {
                    bytes += r.event.raw().len();
                    batch.push(r);
                }
                Ok(Msg::Shutdown) => return true,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        false
    }

    fn write(&self, batch: Vec<Request>) {
        self.queued.fetch_sub(batch.len(), Ordering::Relaxed);
        let started = Instant::now();
        let wait = metrics::histogram!(m::WRITER_QUEUE_WAIT_SECONDS);
        let mut max_wait = Duration::ZERO;
        for r in &batch {
            let w = started.duration_since(r.enqueued);
            max_wait = max_wait.max(w);
            wait.record(w.as_secs_f64());
        }
        self.signals
            .max_wait_ns
            .fetch_max(max_wait.as_nanos() as u64, Ordering::Relaxed);
        metrics::histogram!(m::WRITER_BATCH_EVENTS).record(batch.len() as f64);
        let result = self
            .store
            .write_batch(batch.iter().map(|r| &*r.event), unix_now());
        let commit = started.elapsed();
        metrics::histogram!(m::WRITER_COMMIT_SECONDS).record(commit.as_secs_f64());
        self.signals
            .max_commit_ns
            .fetch_max(commit.as_nanos() as u64, Ordering::Relaxed);
        self.signals.batches.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(m::WRITER_QUEUE_EVENTS).set(self.queued.load(Ordering::Relaxed) as f64);
        match result {
            Ok(outcomes) => {
                let mut stored = Vec::new();
                for (r, outcome) in batch.into_iter().zip(outcomes) {
                    metrics::counter!(m::EVENTS_WRITTEN_TOTAL, "outcome" => outcome_label(&outcome))
                        .increment(1);
                    if let WriteOutcome::Stored { serial, .. } = outcome {
                        stored.push(LiveEvent {
                            serial: Some(serial),
                            event: r.event.clone(),
                        });
                    }
                    // A sender that went away (connection closed) is fine:
                    // the event is stored either way.
                    let _ = r.reply.send(Ok(outcome));
                }
                for ev in stored {
                    let _ = self.live.send(Arc::new(ev));
                }
            }
            Err(e) => {
                let err = match &e {
                    StoreError::MapFull { .. } => {
                        tracing::error!(error = %e, events = batch.len(), "STORE IS FULL: writes are refused until store.map_size_mb is raised");
                        metrics::counter!(m::WRITER_ERRORS_TOTAL, "reason" => "map_full")
                            .increment(1);
                        WriteError::StoreFull
                    }
                    other => {
                        tracing::error!(error = %other, events = batch.len(), "write batch failed");
                        metrics::counter!(m::WRITER_ERRORS_TOTAL, "reason" => "store").increment(1);
                        WriteError::Store(other.to_string())
                    }
                };
                for r in batch {
                    let _ = r.reply.send(Err(err.clone()));
                }
            }
        }
    }

    fn purge_expired(&self) {
        const PURGE_CHUNK: usize = 1000;
        loop {
            match self.store.purge_expired(unix_now(), PURGE_CHUNK) {
                Ok(n) => {
                    metrics::counter!(m::EVENTS_PURGED_TOTAL).increment(n as u64);
                    if n < PURGE_CHUNK {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "expiry purge failed");
                    return;
                }
            }
        }
    }
}

/// Metric label of a write outcome (a closed set).
pub fn outcome_label(o: &WriteOutcome) -> &'static str {
    match o {
        WriteOutcome::Stored { replaced: true, .. } => "replaced",
        WriteOutcome::Stored { deleted, .. } if *deleted > 0 => "deletion",
        WriteOutcome::Stored { .. } => "stored",
        WriteOutcome::Duplicate => "duplicate",
        WriteOutcome::Superseded => "superseded",
        WriteOutcome::Deleted => "deleted",
        WriteOutcome::Expired => "expired",
        WriteOutcome::Ephemeral => "ephemeral",
    }
}
