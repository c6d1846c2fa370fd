//! The single writer thread and its bounded queue.
//!
//! Group commit: the writer blocks for the first queued event, then takes
//! whatever else is queued (up to `max_batch_events` / `max_batch_bytes`),
//! writes the batch in one transaction and commits. Only then does it hand
//! the stored events to the live index and answer each sender. Under load
//! batches grow and the commit cost is shared; when idle a lone event is
//! committed at once.
//!
//! Bulk mode (the import): [`WriterHandle::write_bulk`] hands the writer a
//! whole ordered batch, which it writes alone as one transaction with the
//! same write rules, in queue order with the single events, and answers
//! after the commit. The caller blocks until then, so each bulk client has
//! at most one batch in the queue; its size is the client's choice
//! (`sluice import --batch-events`), not `max_batch_events`.
//!
//! The queue is a `sync_channel` of `writer_queue_events` messages (an
//! event, or one bulk batch). When it is full the submitter loses: `submit`
//! fails with `QueueFull` (the session answers `rate-limited:`); a bulk
//! client waits.
//!
//! Load signals for the monitor ([`WriterSignals`]): the longest queue wait
//! and slowest group commit since the last tick, and for bulk batches the
//! commit cost per 1000 stored events against a slow baseline, so batches
//! of any size compare. A bulk client also reports the input it holds for
//! the writer ([`Backlog`]), which the monitor counts as queue fill.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_proto::Event;
use sluice_store::{Store, StoreError, WriteOutcome};
use tokio::sync::oneshot;

use crate::DiskGate;
use crate::live::LiveHub;
use crate::metrics_names as m;
use crate::mirror_tap::{MirrorTaps, Origin};
use crate::retention::{Retainer, RetentionPlan, SharedPlan};
use crate::{EngineConfig, LiveEvent, ThreadExit, unix_now};

/// What the writer answers for one event.
pub type WriteResult = Result<WriteOutcome, WriteError>;

/// A write that did not happen; the event is not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("store is full")]
    StoreFull,
    /// The disk holding the store is full, or has less free space than
    /// `store.min_free_disk_mb`; writes resume when space returns.
    #[error("disk is full: {0}")]
    DiskFull(String),
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

/// Why a bulk batch was not written; none of its events is stored.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writer has stopped")]
    Closed,
}

/// Commit cost is compared per this many stored events.
const COST_UNIT_EVENTS: f64 = 1000.0;
/// Fewest stored events for a bulk commit's cost to count.
const MIN_COST_SAMPLE: usize = 64;

enum Msg {
    Write(Request),
    Bulk(Bulk),
    /// An operator's change (policy entries, purges), in order with writes.
    Admin(AdminOp, oneshot::Sender<Result<AdminDone, StoreError>>),
    Shutdown,
    /// Look again at the retention plan (it changed).
    Wake,
    /// Makes the writer thread panic: how the engine's tests kill it.
    #[cfg(test)]
    Panic,
}

struct Request {
    event: Arc<Event>,
    enqueued: Instant,
    reply: oneshot::Sender<WriteResult>,
    /// Where it came from: a stored event goes to the replication tap
    /// unless another node sent it, and to every mirror's tap but the
    /// mirror it came through (`mirror_tap.rs`).
    origin: Origin,
    /// Its connection had no other EVENT awaiting an OK (a person, not a
    /// pipelining bulk writer): it is committed ahead of a large batch.
    lone: bool,
    /// Its author is outside the web of trust: it waits (at most
    /// [`OUTSIDERS_WAIT`]) to ride on the next commit, so a flood of
    /// strangers' events costs the writer few commits and the web's
    /// authors none of their latency.
    outsider: bool,
}

/// Longest an outsider's event waits for a commit to ride on.
pub(crate) const OUTSIDERS_WAIT: Duration = Duration::from_millis(100);

/// What an operator asks the writer to do.
#[derive(Debug, Clone)]
pub enum AdminOp {
    /// Every runtime policy entry (read on the writer thread, in order
    /// with its changes).
    ReadPolicy,
    /// Sets (`Some`) or removes (`None`) a runtime policy entry.
    SetPolicy(String, Option<String>),
    /// Removes every stored event of an author.
    PurgeAuthor([u8; 32]),
    /// Removes one stored event.
    PurgeEvent([u8; 32]),
    /// Removes (or with `dry_run`, counts) the stored events matching a
    /// filter, newest first, at most its `limit`.
    PurgeMatching {
        filter: Box<sluice_proto::Filter>,
        dry_run: bool,
    },
}

/// The writer's answer to an [`AdminOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminDone {
    Policy(Vec<(String, String)>),
    Set,
    Purged(usize),
}

/// A batch larger than this commits its lone events first, apart.
const LONE_AHEAD_OF: usize = 8;

/// Events removed per transaction by a purge (other writes interleave).
const PURGE_CHUNK: usize = 1000;

/// A bulk batch queued to the writer: [`BulkTicket::wait`] returns its
/// outcomes, in order, after its commit. Dropping it does not cancel the
/// write (the batch is the writer's once queued); the outcomes are then
/// dropped.
#[must_use = "a queued batch's outcomes are known only by waiting"]
pub struct BulkTicket(Option<std::sync::mpsc::Receiver<Result<Vec<WriteOutcome>, StoreError>>>);

impl BulkTicket {
    /// Blocks the calling (non-async) thread until the batch is committed.
    pub fn wait(self) -> Result<Vec<WriteOutcome>, BulkError> {
        match self.0 {
            None => Ok(Vec::new()),
            // A writer that stops without answering drops the reply.
            Some(answer) => Ok(answer.recv().map_err(|_| BulkError::Closed)??),
        }
    }
}

struct Bulk {
    events: Vec<Event>,
    enqueued: Instant,
    reply: SyncSender<Result<Vec<WriteOutcome>, StoreError>>,
}

/// What the writer saw since the monitor last looked: the longest queue
/// wait and the slowest group commit (ns), and how many group-commit
/// batches committed; the monitor swaps these to zero each tick. Bulk
/// batches are measured apart: `bulk_cost_secs` and `bulk_baseline_secs`
/// (f64 bits, kept between ticks) are the recent commit cost per 1000
/// stored events and its slow baseline.
#[derive(Default)]
pub(crate) struct WriterSignals {
    pub max_wait_ns: AtomicU64,
    pub max_commit_ns: AtomicU64,
    pub batches: AtomicU64,
    pub bulk_cost_secs: AtomicU64,
    pub bulk_baseline_secs: AtomicU64,
}

/// Input a bulk client holds for the writer beyond the queue (the import:
/// its chunks between the reader and the batcher). The client counts it
/// here; the monitor's writer-queue fill is the larger of the queue's fill
/// and `held / bound`, so the governor sees a bulk client's pipeline the
/// way it sees the queue of a relay.
#[derive(Debug, Default)]
pub struct Backlog {
    held: AtomicU64,
    bound: AtomicU64,
}

impl Backlog {
    /// The most the client will hold (its fill's denominator).
    pub fn set_bound(&self, bound: u64) {
        self.bound.store(bound, Ordering::Relaxed);
    }

    /// One more unit held.
    pub fn add(&self) {
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// One unit handed on.
    pub fn remove(&self) {
        let _ = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// `held / bound`; 0 while no bulk client has set a bound.
    pub(crate) fn fill(&self) -> f64 {
        match self.bound.load(Ordering::Relaxed) {
            0 => 0.0,
            bound => self.held() as f64 / bound as f64,
        }
    }
}

pub(crate) struct WriterHandle {
    pub(crate) signals: Arc<WriterSignals>,
    pub(crate) backlog: Backlog,
    tx: SyncSender<Msg>,
    queued: Arc<AtomicUsize>,
    alive: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
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
        let taken = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(thread) = taken else {
            return;
        };
        // Blocks only while the queue is full, which the writer is draining.
        let _ = self.tx.send(Msg::Shutdown);
        // A panic was logged and counted by the thread itself.
        let _ = thread.join();
    }
}

/// Recent commit cost per [`COST_UNIT_EVENTS`] stored and its slow
/// baseline, both in seconds; 0 until the first sample.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct CommitCost {
    recent: f64,
    baseline: f64,
}

impl CommitCost {
    /// Adds a commit that took `took` and stored `stored` events. The cost
    /// is per stored event: a batch of duplicates (a re-run) writes almost
    /// nothing, and would set a baseline that real writes then seem to
    /// exceed many times. Batches that store fewer than [`MIN_COST_SAMPLE`]
    /// events say too little and are skipped (returns false). The recent
    /// cost is a fast average; the baseline follows drops at once and
    /// rises slowly.
    fn record(&mut self, took: Duration, stored: usize) -> bool {
        if stored < MIN_COST_SAMPLE {
            return false;
        }
        let cost = took.as_secs_f64() * COST_UNIT_EVENTS / stored as f64;
        self.recent = if self.recent == 0.0 {
            cost
        } else {
            0.7 * self.recent + 0.3 * cost
        };
        self.baseline = if self.baseline == 0.0 || cost < self.baseline {
            cost
        } else {
            self.baseline + 0.01 * (cost - self.baseline)
        };
        true
    }
}

struct Writer {
    signals: Arc<WriterSignals>,
    store: Store,
    cfg: EngineConfig,
    live: Arc<LiveHub>,
    tap: Arc<crate::replica::Tap>,
    mirrors: Arc<MirrorTaps>,
    trust: Arc<crate::trust::Trust>,
    /// The NIP-50 indexer, rung after each commit that stored events.
    search: Arc<crate::search::SearchSlot>,
    rx: Receiver<Msg>,
    queued: Arc<AtomicUsize>,
    bulk_cost: CommitCost,
    retainer: Retainer,
    disk: Arc<DiskGate>,
    /// Outsiders' events waiting for a commit to ride on, and since when.
    outsiders: Vec<Request>,
    outsiders_since: Option<Instant>,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the writer thread is the store's one writer (clippy.toml)"
)]
impl Writer {
    fn run(mut self) {
        let purge_every = Duration::from_millis(self.cfg.expiry_purge_interval_ms);
        let mut next_purge = Instant::now() + purge_every;
        // A message taken while filling a batch, handled next.
        let mut held = None;
        loop {
            let msg = match held.take() {
                Some(msg) => msg,
                None => {
                    // Retention work pending: look at the queue without
                    // waiting, and take one step when it is empty.
                    // While the disk gate is closed retention waits too
                    // (it cannot commit either): look again in a second.
                    let due = match self.disk.refusal() {
                        Some(_) => Some(Instant::now() + Duration::from_secs(1)),
                        None => self.retainer.next_due(),
                    };
                    let wait = match due {
                        None => Duration::ZERO,
                        Some(due) => due
                            .min(next_purge)
                            .min(self.outsiders_due())
                            .saturating_duration_since(Instant::now()),
                    };
                    match self.rx.recv_timeout(wait) {
                        Ok(msg) => msg,
                        Err(RecvTimeoutError::Disconnected) => break,
                        Err(RecvTimeoutError::Timeout) => {
                            if Instant::now() >= self.outsiders_due() {
                                self.flush_outsiders();
                            }
                            if Instant::now() >= next_purge {
                                self.purge_expired();
                                next_purge = Instant::now() + purge_every;
                            }
                            self.retention_step();
                            continue;
                        }
                    }
                }
            };
            if !self.handle(msg, &mut held) {
                break;
            }
            if Instant::now() >= next_purge {
                self.purge_expired();
                next_purge = Instant::now() + purge_every;
            }
            // At most one bounded step between client batches, paced.
            if self.retainer.paced() {
                self.retention_step();
            }
        }
        // Commit whatever is still queued so every accepted event lands.
        loop {
            let msg = match held.take() {
                Some(msg) => msg,
                None => match self.rx.try_recv() {
                    Ok(msg) => msg,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                },
            };
            self.handle(msg, &mut held);
        }
        self.flush_outsiders();
        tracing::info!("writer stopped");
    }

    /// Writes what `msg` asks for. Returns false for a shutdown request.
    fn handle(&mut self, msg: Msg, held: &mut Option<Msg>) -> bool {
        match msg {
            Msg::Write(first) => {
                let mut batch = vec![first];
                *held = self.fill(&mut batch);
                // Outsiders wait for a commit to ride on: the next one of
                // anyone else's events, or their own once the oldest has
                // waited OUTSIDERS_WAIT (or a batch's worth is waiting).
                if batch.iter().any(|r| r.outsider) {
                    let (outsiders, rest): (Vec<Request>, Vec<Request>) =
                        batch.into_iter().partition(|r| r.outsider);
                    if self.outsiders.is_empty() {
                        self.outsiders_since = Some(Instant::now());
                    }
                    self.outsiders.extend(outsiders);
                    batch = rest;
                    let full = self.outsiders.len() >= self.cfg.max_batch_events;
                    if batch.is_empty() {
                        if full || Instant::now() >= self.outsiders_due() {
                            self.flush_outsiders();
                        }
                        return true;
                    }
                    batch.append(&mut self.outsiders);
                    self.outsiders_since = None;
                }
                // Lone events (a connection with nothing else awaiting an
                // OK) in a large batch of pipelined ones are committed
                // first, in a small transaction of their own: a person
                // posting beside a bulk writer waits for one small commit,
                // not for the bulk writer's batch.
                if batch.len() > LONE_AHEAD_OF && batch.iter().any(|r| r.lone) {
                    let (lone, rest): (Vec<Request>, Vec<Request>) =
                        batch.into_iter().partition(|r| r.lone);
                    if !rest.is_empty() {
                        self.write(lone);
                        batch = rest;
                    } else {
                        batch = lone;
                    }
                }
                self.write(batch);
            }
            Msg::Bulk(bulk) => self.write_bulk(bulk),
            Msg::Admin(op, reply) => {
                let _ = reply.send(self.admin(op));
            }
            Msg::Shutdown => return false,
            Msg::Wake => {}
            #[cfg(test)]
            Msg::Panic => panic!("writer panic requested by a test"),
        }
        true
    }

    /// When the oldest waiting outsider's event is due for a commit of its
    /// own (far off when none waits).
    fn outsiders_due(&self) -> Instant {
        match self.outsiders_since {
            Some(t) => t + OUTSIDERS_WAIT,
            None => Instant::now() + Duration::from_secs(3600),
        }
    }

    /// Commits the outsiders' events waiting, if any.
    fn flush_outsiders(&mut self) {
        self.outsiders_since = None;
        if !self.outsiders.is_empty() {
            let batch = std::mem::take(&mut self.outsiders);
            self.write(batch);
        }
    }

    /// One bounded retention step, if any is due (not while the disk is
    /// too full to commit anything).
    fn retention_step(&mut self) {
        if self.disk.refusal().is_some() {
            return;
        }
        self.retainer.step(&self.store, unix_now());
    }

    /// Removes what the NIP-62 requests among `events` cover, in chunks
    /// (before their OKs, so the author sees them gone).
    fn apply_vanish<'a>(&self, plan: &RetentionPlan, events: impl IntoIterator<Item = &'a Event>) {
        for ev in events {
            if !plan.rules.vanish_applies(ev) {
                continue;
            }
            let mut total = 0;
            loop {
                match self.store.purge_vanished(&ev.pubkey, PURGE_CHUNK) {
                    Ok(n) => {
                        total += n;
                        if n < PURGE_CHUNK {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "NIP-62 purge failed; it runs again at the next request");
                        break;
                    }
                }
            }
            metrics::counter!(m::EVENTS_VANISHED_TOTAL).increment(total as u64);
            tracing::info!(pubkey = %sluice_proto::hex32::encode(&ev.pubkey), removed = total, "NIP-62 request to vanish applied");
        }
    }

    /// LMDB reports a write the disk could not take as `EIO` when the
    /// write was short (the disk took part of it): an I/O error while the
    /// store's filesystem has less free space than a few times the batch
    /// (at least 8 MiB) is taken for a full disk.
    fn disk_full_or(&self, e: StoreError, batch_bytes: u64) -> StoreError {
        if !e.is_io() || e.is_disk_full() {
            return e;
        }
        match self.store.disk_space() {
            Ok(d) if d.free_bytes < (4 * batch_bytes).max(8 << 20) => {
                StoreError::Io(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!("{} KB free on the store's disk ({e})", d.free_bytes >> 10),
                ))
            }
            _ => e,
        }
    }

    fn admin(&self, op: AdminOp) -> Result<AdminDone, StoreError> {
        match op {
            AdminOp::ReadPolicy => self.store.policy_entries().map(AdminDone::Policy),
            AdminOp::SetPolicy(key, value) => self
                .store
                .set_policy(&key, value.as_deref())
                .map(|()| AdminDone::Set),
            AdminOp::PurgeAuthor(pubkey) => {
                let mut total = 0;
                loop {
                    let n = self.store.purge_author(&pubkey, PURGE_CHUNK)?;
                    total += n;
                    if n < PURGE_CHUNK {
                        return Ok(AdminDone::Purged(total));
                    }
                }
            }
            AdminOp::PurgeEvent(id) => self
                .store
                .purge_event(&id)
                .map(|gone| AdminDone::Purged(usize::from(gone))),
            AdminOp::PurgeMatching { filter, dry_run } => {
                self.purge_matching(*filter, dry_run).map(AdminDone::Purged)
            }
        }
    }

    /// Deletion by filter: chunks of the newest matches, each removed in
    /// one transaction, until none is left or the filter's `limit` is
    /// reached. A dry run counts (limit ignored, as NIP-45 does).
    fn purge_matching(
        &self,
        filter: sluice_proto::Filter,
        dry_run: bool,
    ) -> Result<usize, StoreError> {
        let opts = sluice_store::QueryOptions {
            now: unix_now(),
            max_scan_rows: u64::MAX,
        };
        if dry_run {
            let (n, _, _) = self.store.count(std::slice::from_ref(&filter), &opts)?;
            return Ok(n as usize);
        }
        let mut left = filter.limit.unwrap_or(u64::MAX);
        let mut total = 0;
        while left > 0 {
            let mut chunk = filter.clone();
            chunk.limit = Some(left.min(PURGE_CHUNK as u64));
            let out = self.store.query(&[chunk], &opts)?;
            let ids: Vec<[u8; 32]> = out
                .events
                .iter()
                .filter_map(|raw| Event::parse(raw).ok().map(|e| e.id))
                .collect();
            let n = self.store.purge_events(&ids)?;
            total += n;
            left = left.saturating_sub(ids.len() as u64);
            if ids.len() < PURGE_CHUNK || n == 0 {
                break;
            }
        }
        Ok(total)
    }

    /// Adds queued events to `batch` up to the batch bounds. Returns the
    /// message that ended the batch early (a bulk batch or a shutdown), to
    /// be handled next.
    fn fill(&self, batch: &mut Vec<Request>) -> Option<Msg> {
        let mut bytes: usize = batch.iter().map(|r| r.event.raw().len()).sum();
        while batch.len() < self.cfg.max_batch_events && bytes < self.cfg.max_batch_bytes {
            match self.rx.try_recv() {
                Ok(Msg::Write(r)) => {
                    bytes += r.event.raw().len();
                    batch.push(r);
                }
                Ok(other) => return Some(other),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        None
    }

    fn write(&mut self, batch: Vec<Request>) {
        self.queued.fetch_sub(batch.len(), Ordering::Relaxed);
        if let Some(why) = self.disk.refusal() {
            metrics::counter!(m::WRITER_ERRORS_TOTAL, "reason" => "disk_full")
                .increment(batch.len() as u64);
            for r in batch {
                let _ = r.reply.send(Err(WriteError::DiskFull(why.clone())));
            }
            return;
        }
        let plan = self.retainer.rules();
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
        // While size eviction runs, it rides on the batch's transaction.
        let result = if self.retainer.rides() {
            let n = batch.len();
            self.retainer.write_evicting(
                &self.store,
                batch.iter().map(|r| &*r.event),
                n,
                unix_now(),
            )
        } else {
            self.store
                .write_batch_ruled(batch.iter().map(|r| &*r.event), unix_now(), &plan.rules)
        };
        let commit = started.elapsed();
        metrics::histogram!(m::WRITER_COMMIT_SECONDS).record(commit.as_secs_f64());
        self.signals
            .max_commit_ns
            .fetch_max(commit.as_nanos() as u64, Ordering::Relaxed);
        self.signals.batches.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(m::WRITER_QUEUE_EVENTS).set(self.queued.load(Ordering::Relaxed) as f64);
        match result {
            Ok(outcomes) => {
                // Committed: live subscribers first (so an OK means the
                // event is queued to every matching connection), then the
                // OKs.
                let stored: Vec<Arc<LiveEvent>> = batch
                    .iter()
                    .zip(&outcomes)
                    .filter_map(|(r, outcome)| match outcome {
                        WriteOutcome::Stored { serial, .. } => Some(Arc::new(LiveEvent {
                            serial: Some(*serial),
                            event: r.event.clone(),
                        })),
                        _ => None,
                    })
                    .collect();
                self.live.publish(&stored);
                self.retainer.note_stored(stored.iter().map(|l| &*l.event));
                self.apply_vanish(&plan, stored.iter().map(|l| &*l.event));
                self.trust.note_stored(stored.iter().map(|l| &*l.event));
                if !stored.is_empty() {
                    self.search.ring();
                }
                if self.tap.attached() {
                    for (r, outcome) in batch.iter().zip(&outcomes) {
                        if r.origin != Origin::Replica
                            && matches!(outcome, WriteOutcome::Stored { .. })
                        {
                            self.tap.offer(&r.event);
                        }
                    }
                }
                if self.mirrors.any() {
                    for (r, outcome) in batch.iter().zip(&outcomes) {
                        if matches!(outcome, WriteOutcome::Stored { .. }) {
                            self.mirrors.offer(&r.event, r.origin);
                        }
                    }
                }
                for (r, outcome) in batch.into_iter().zip(outcomes) {
                    count_outcome(&outcome);
                    // A sender that went away (connection closed) is fine:
                    // the event is stored either way.
                    let _ = r.reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                let bytes = batch.iter().map(|r| r.event.raw().len() as u64).sum();
                let e = self.disk_full_or(e, bytes);
                let err = match &e {
                    StoreError::MapFull { .. } => WriteError::StoreFull,
                    e if e.is_disk_full() => WriteError::DiskFull(e.to_string()),
                    other => WriteError::Store(other.to_string()),
                };
                report_failure(&e, batch.len());
                for r in batch {
                    let _ = r.reply.send(Err(err.clone()));
                }
            }
        }
    }

    /// Writes a bulk batch alone in one transaction, fans the stored
    /// events out (when anyone listens), then answers.
    fn write_bulk(&mut self, bulk: Bulk) {
        if let Some(why) = self.disk.refusal() {
            let _ = bulk.reply.send(Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!("disk is full: {why}"),
            ))));
            return;
        }
        let plan = self.retainer.rules();
        let started = Instant::now();
        let n = bulk.events.len();
        let waited = started.duration_since(bulk.enqueued);
        let wait = metrics::histogram!(m::WRITER_QUEUE_WAIT_SECONDS);
        for _ in 0..n {
            wait.record(waited.as_secs_f64());
        }
        self.signals
            .max_wait_ns
            .fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
        metrics::histogram!(m::WRITER_BATCH_EVENTS).record(n as f64);
        let result = self
            .store
            .write_batch_ruled(bulk.events.iter(), unix_now(), &plan.rules);
        let commit = started.elapsed();
        metrics::histogram!(m::WRITER_COMMIT_SECONDS).record(commit.as_secs_f64());
        let outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(e) => {
                let bytes = bulk.events.iter().map(|e| e.raw().len() as u64).sum();
                let e = self.disk_full_or(e, bytes);
                report_failure(&e, n);
                let _ = bulk.reply.send(Err(e));
                return;
            }
        };
        let stored = outcomes
            .iter()
            .filter(|o| matches!(o, WriteOutcome::Stored { .. }))
            .count();
        if self.bulk_cost.record(commit, stored) {
            let s = &self.signals;
            let c = self.bulk_cost;
            s.bulk_cost_secs
                .store(c.recent.to_bits(), Ordering::Relaxed);
            s.bulk_baseline_secs
                .store(c.baseline.to_bits(), Ordering::Relaxed);
        }
        outcomes.iter().for_each(count_outcome);
        let stored_events = || {
            bulk.events
                .iter()
                .zip(&outcomes)
                .filter(|(_, o)| matches!(o, WriteOutcome::Stored { .. }))
                .map(|(e, _)| e)
        };
        self.retainer.note_stored(stored_events());
        self.apply_vanish(&plan, stored_events());
        self.trust.note_stored(stored_events());
        self.search.ring();
        let live: Vec<Arc<LiveEvent>> = if self.live.subscriptions() > 0 {
            bulk.events
                .into_iter()
                .zip(&outcomes)
                .filter_map(|(event, o)| match o {
                    WriteOutcome::Stored { serial, .. } => Some(Arc::new(LiveEvent {
                        serial: Some(*serial),
                        event: Arc::new(event),
                    })),
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        // Committed: live subscribers first, then the importer hears (a
        // client that went away is fine: the batch is stored either way).
        self.live.publish(&live);
        let _ = bulk.reply.send(Ok(outcomes));
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

fn count_outcome(o: &WriteOutcome) {
    metrics::counter!(m::EVENTS_WRITTEN_TOTAL, "outcome" => outcome_label(o)).increment(1);
}

/// Logs and counts a batch that did not commit.
fn report_failure(e: &StoreError, events: usize) {
    if let StoreError::MapFull { .. } = e {
        tracing::error!(error = %e, events, "STORE IS FULL: writes are refused until store.map_size_mb is raised");
        metrics::counter!(m::WRITER_ERRORS_TOTAL, "reason" => "map_full").increment(1);
    } else if e.is_disk_full() {
        tracing::error!(error = %e, events, "DISK IS FULL: writes are refused until space returns");
        metrics::counter!(m::WRITER_ERRORS_TOTAL, "reason" => "disk_full").increment(1);
    } else {
        tracing::error!(error = %e, events, "write batch failed");
        metrics::counter!(m::WRITER_ERRORS_TOTAL, "reason" => "store").increment(1);
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
        WriteOutcome::OutsideRetention => "outside_retention",
        WriteOutcome::Vanished => "vanished",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_cost_baseline_follows_drops_and_rises_slowly() {
        let mut c = CommitCost::default();
        assert!(c.record(Duration::from_millis(10), 1000));
        assert!(c.record(Duration::from_millis(40), 1000));
        assert!((c.baseline - 0.0103).abs() < 1e-9, "{c:?}");
        assert!(c.recent > 0.018 && c.recent < 0.02, "{c:?}");
        // Per stored event: twice the time for twice the events is the same cost.
        let mut d = CommitCost::default();
        d.record(Duration::from_millis(20), 2000);
        assert!((d.recent - 0.01).abs() < 1e-12, "{d:?}");
        c.record(Duration::from_millis(2), 1000);
        // Too few stored to say anything: ignored.
        assert!(!c.record(Duration::from_nanos(1), 10));
        assert!((c.baseline - 0.002).abs() < 1e-12, "{c:?}");
    }

    #[test]
    fn backlog_fill_is_held_over_bound() {
        let b = Backlog::default();
        b.add();
        assert_eq!(b.fill(), 0.0, "no bound set: no bulk client");
        b.set_bound(4);
        b.add();
        assert_eq!(b.fill(), 0.5);
        b.remove();
        b.remove();
        b.remove();
        assert_eq!(b.held(), 0);
    }
}
