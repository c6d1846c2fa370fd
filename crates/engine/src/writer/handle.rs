//! The writer's handle: its bounded queue and thread, as the engine holds them.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Instant;

use sluice_proto::Event;
use sluice_store::{Store, WriteOutcome};
use tokio::sync::oneshot;

use super::cap::BatchCap;
use super::msg::{
    AdminDone, AdminOp, Bulk, BulkError, BulkTicket, Msg, Request, SubmitError, WriteResult,
};
use super::signals::{Backlog, CommitCost, WriterSignals};
use super::thread::Writer;
use crate::config::EngineConfig;
use crate::health::{DiskGate, ThreadExit};
use crate::live::LiveHub;
use crate::metrics_names as m;
use crate::mirror_tap::{MirrorTaps, Origin};
use crate::retention::{Retainer, SharedPlan};

pub(crate) struct WriterHandle {
    pub(crate) signals: Arc<WriterSignals>,
    pub(crate) backlog: Backlog,
    pub(super) tx: SyncSender<Msg>,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) alive: Arc<AtomicBool>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) fn spawn(
    store: Store,
    cfg: EngineConfig,
    live: Arc<LiveHub>,
    (tap, mirrors, trust, search): (
        Arc<crate::replica::Tap>,
        Arc<MirrorTaps>,
        Arc<crate::trust::Trust>,
        Arc<crate::search::SearchSlot>,
    ),
    plan: Arc<SharedPlan>,
    disk: Arc<DiskGate>,
) -> Result<WriterHandle, crate::StartError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(cfg.writer_queue_events);
    let queued = Arc::new(AtomicUsize::new(0));
    let alive = Arc::new(AtomicBool::new(true));
    let signals = Arc::new(WriterSignals::default());
    let cap = BatchCap::new(std::time::Duration::from_millis(cfg.commit_target_ms));
    let w = Writer {
        signals: signals.clone(),
        store,
        cfg,
        live,
        tap,
        mirrors,
        trust,
        search,
        rx,
        queued: queued.clone(),
        bulk_cost: CommitCost::default(),
        retainer: Retainer::new(plan),
        disk,
        outsiders: Vec::new(),
        outsiders_since: None,
        carry: Vec::new(),
        cap,
        metrics: Default::default(),
    };
    let exit = ThreadExit::new("writer", alive.clone());
    let thread = std::thread::Builder::new()
        .name("sluice-writer".into())
        .spawn(move || {
            // Clears `alive` however `run` ends, a panic included.
            let _exit = exit;
            w.run();
        })
        .map_err(|source| crate::StartError::Thread {
            thread: "sluice-writer".into(),
            source,
        })?;
    Ok(WriterHandle {
        signals,
        backlog: Backlog::default(),
        tx,
        queued,
        alive,
        thread: Mutex::new(Some(thread)),
    })
}

impl WriterHandle {
    pub(crate) fn submit(
        &self,
        event: Arc<Event>,
        received: Instant,
        origin: Origin,
        (lone, outsider): (bool, bool),
    ) -> Result<oneshot::Receiver<WriteResult>, SubmitError> {
        let (reply, rx) = oneshot::channel();
        let msg = Msg::Write(Request {
            event,
            enqueued: received,
            reply,
            origin,
            lone,
            outsider,
        });
        // Count before sending so the writer's decrement never underflows.
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.try_send(msg).map_err(|e| match e {
            TrySendError::Full(_) => SubmitError::QueueFull,
            TrySendError::Disconnected(_) => SubmitError::Closed,
        });
        if let Err(e) = sent {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            if e == SubmitError::QueueFull {
                metrics::counter!(m::WRITER_QUEUE_FULL_TOTAL).increment(1);
            }
            return Err(e);
        }
        Ok(rx)
    }

    /// Queues `events` as one batch, waiting while the queue is full, and
    /// waits for its commit. For non-async threads.
    pub(crate) fn write_bulk(&self, events: Vec<Event>) -> Result<Vec<WriteOutcome>, BulkError> {
        self.submit_bulk(events)?.wait()
    }

    /// Queues `events` as one batch, waiting while the queue is full, and
    /// returns without waiting for the commit: the caller prepares its
    /// next batch while this one is written. For non-async threads.
    pub(crate) fn submit_bulk(&self, events: Vec<Event>) -> Result<BulkTicket, BulkError> {
        if events.is_empty() {
            return Ok(BulkTicket(None));
        }
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let msg = Msg::Bulk(Bulk {
            events,
            enqueued: Instant::now(),
            reply,
        });
        self.tx.send(msg).map_err(|_| BulkError::Closed)?;
        Ok(BulkTicket(Some(answer)))
    }

    /// Queues an operator's change (waiting while the queue is full: it is
    /// rare and must not be lost) and waits for the writer's answer.
    pub(crate) async fn admin(&self, op: AdminOp) -> Result<AdminDone, BulkError> {
        let (reply, answer) = oneshot::channel();
        let tx = self.tx.clone();
        // `send` blocks while the queue is full: off the async workers.
        tokio::task::spawn_blocking(move || tx.send(Msg::Admin(op, reply)))
            .await
            .map_err(|_| BulkError::Closed)?
            .map_err(|_| BulkError::Closed)?;
        Ok(answer.await.map_err(|_| BulkError::Closed)??)
    }

    /// Wakes an idle writer so it picks up a new retention plan now (a
    /// busy one picks it up before its next batch anyway).
    pub(crate) fn wake(&self) {
        let _ = self.tx.try_send(Msg::Wake);
    }

    /// Makes the writer thread panic (engine tests only).
    #[cfg(test)]
    pub(crate) fn panic_for_test(&self) {
        let _ = self.tx.send(Msg::Panic);
    }

    pub(crate) fn queue_len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Asks the writer to commit what is queued and stop, and waits for it.
    pub(crate) fn shutdown(&self) {
        let taken = self.thread.lock().take();
        let Some(thread) = taken else {
            return;
        };
        // Blocks only while the queue is full, which the writer is draining.
        let _ = self.tx.send(Msg::Shutdown);
        // A panic was logged and counted by the thread itself.
        let _ = thread.join();
    }
}
