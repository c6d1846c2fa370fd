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

    use std::sync::mpsc::sync_channel;

    use sluice_proto::Filter;
    use sluice_store::{DiskSpace, StoreOptions};

    use crate::replica::Tap;
    use crate::retention::{RetentionConfig, RuleConfig, VANISH};
    use crate::search::SearchSlot;
    use crate::throttle::test_metrics::{Recorded, record};
    use crate::trust::Trust;

    /// A store of its own in a temporary directory.
    fn open_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            map_size_bytes: 64 << 20,
            max_readers: 126,
            write_map: false,
            write_map_when_alone: false,
            min_free_disk_bytes: 0,
        };
        let store = Store::open(dir.path(), &opts).unwrap();
        (dir, store)
    }

    /// Writes `events` straight into the store as of `now` (what a store
    /// holds before the writer starts, or events written when they had
    /// not expired yet).
    #[expect(
        clippy::disallowed_methods,
        reason = "the test sets up what the store holds"
    )]
    fn seed(store: &Store, events: &[Event], now: u64) {
        let outcomes = store.write_batch(events, now).unwrap();
        assert!(
            (outcomes.iter()).all(|o| matches!(o, WriteOutcome::Stored { .. })),
            "{outcomes:?}"
        );
    }

    /// The writer's company, built as `spawn` builds it.
    struct Parts {
        live: Arc<LiveHub>,
        tap: Arc<Tap>,
        mirrors: Arc<MirrorTaps>,
        trust: Arc<Trust>,
        search: Arc<SearchSlot>,
        plan: Arc<SharedPlan>,
        disk: Arc<DiskGate>,
    }

    impl Parts {
        fn new() -> Parts {
            Parts {
                live: LiveHub::new(1024, 4 << 20),
                tap: Arc::default(),
                mirrors: Arc::default(),
                trust: Arc::default(),
                search: Arc::default(),
                plan: Arc::default(),
                disk: Arc::default(),
            }
        }
    }

    /// A writer the test drives by hand on its own thread: it queues
    /// messages on `tx`, then has the writer handle them one at a time.
    struct Rig {
        _dir: tempfile::TempDir,
        store: Store,
        w: Writer,
        tx: SyncSender<Msg>,
        parts: Parts,
    }

    fn rig(cfg: EngineConfig) -> Rig {
        let (dir, store) = open_store();
        let parts = Parts::new();
        let (tx, rx) = sync_channel(cfg.writer_queue_events);
        let w = Writer {
            signals: Arc::default(),
            store: store.clone(),
            cfg,
            live: parts.live.clone(),
            tap: parts.tap.clone(),
            mirrors: parts.mirrors.clone(),
            trust: parts.trust.clone(),
            search: parts.search.clone(),
            rx,
            queued: Arc::default(),
            bulk_cost: CommitCost::default(),
            retainer: Retainer::new(parts.plan.clone()),
            disk: parts.disk.clone(),
            outsiders: Vec::new(),
            outsiders_since: None,
        };
        Rig {
            _dir: dir,
            store,
            w,
            tx,
            parts,
        }
    }

    type Reply = oneshot::Receiver<WriteResult>;

    /// A client's event (`lone`, `outsider` as `submit` takes them).
    const PIPELINED: (bool, bool) = (false, false);
    const LONE: (bool, bool) = (true, false);
    const OUTSIDER: (bool, bool) = (false, true);

    fn request(ev: &Event, origin: Origin, (lone, outsider): (bool, bool)) -> (Request, Reply) {
        let (reply, rx) = oneshot::channel();
        let r = Request {
            event: Arc::new(ev.clone()),
            enqueued: Instant::now(),
            reply,
            origin,
            lone,
            outsider,
        };
        (r, rx)
    }

    impl Rig {
        /// Queues `ev` as `submit` does.
        fn queue(&self, ev: &Event, origin: Origin, flags: (bool, bool)) -> Reply {
            let (r, rx) = request(ev, origin, flags);
            self.w.queued.fetch_add(1, Ordering::Relaxed);
            self.tx.try_send(Msg::Write(r)).ok().unwrap();
            rx
        }

        fn queue_all(&self, events: &[Event], flags: (bool, bool)) -> Vec<Reply> {
            (events.iter())
                .map(|ev| self.queue(ev, Origin::Client, flags))
                .collect()
        }

        /// Has the writer handle the next queued message; returns the one
        /// it met while filling a batch, if any.
        fn handle_next(&mut self) -> Option<Msg> {
            let msg = self.w.rx.try_recv().ok().unwrap();
            let mut held = None;
            assert!(self.w.handle(msg, &mut held));
            held
        }

        /// Commits so far.
        fn batches(&self) -> u64 {
            self.w.signals.batches.load(Ordering::Relaxed)
        }

        fn stored(&self, ev: &Event) -> bool {
            self.store.get(&ev.id, unix_now()).unwrap().is_some()
        }

        /// Every event the store holds (expired ones too), by serial.
        fn held(&self) -> Vec<Event> {
            held(&self.store)
        }
    }

    fn held(store: &Store) -> Vec<Event> {
        (store.events_after(0, 100_000).unwrap().iter())
            .map(|(_, raw)| Event::parse(raw).unwrap())
            .collect()
    }

    /// The writer's answer, if it answered; panics if it dropped the
    /// request unanswered.
    fn answer(rx: &mut Reply) -> Option<WriteResult> {
        match rx.try_recv() {
            Ok(r) => Some(r),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => panic!("the request was dropped"),
        }
    }

    /// The serial an answered request was stored under.
    fn serial(rx: &mut Reply) -> u64 {
        match answer(rx) {
            Some(Ok(WriteOutcome::Stored { serial, .. })) => serial,
            other => panic!("not stored: {other:?}"),
        }
    }

    fn answered(replies: &mut [Reply]) -> Vec<bool> {
        replies.iter_mut().map(|rx| answer(rx).is_some()).collect()
    }

    /// A note of test key `key` written `ago` seconds ago; notes of the
    /// same age class (a 10-digit time) all have the same length.
    fn note(key: u8, ago: u64) -> Event {
        Event::sign(&[key; 32], unix_now() - ago, 1, vec![], "a note")
    }

    fn notes(keys: std::ops::RangeInclusive<u8>) -> Vec<Event> {
        keys.map(|k| note(k, 60)).collect()
    }

    /// `n` events of key `key` and `kind`, one second apart, the newest
    /// `ago` seconds old; `tags` on each.
    fn history(key: u8, kind: u16, n: u64, ago: u64, tags: &[&[&str]]) -> Vec<Event> {
        let tags: Vec<Vec<String>> = (tags.iter())
            .map(|t| t.iter().map(|s| s.to_string()).collect())
            .collect();
        let newest = unix_now() - ago;
        (0..n)
            .map(|i| {
                let at = newest - (n - 1 - i);
                Event::sign(&[key; 32], at, kind, tags.clone(), &format!("{i}"))
            })
            .collect()
    }

    fn pubkey(key: u8) -> [u8; 32] {
        Event::sign(&[key; 32], 0, 1, vec![], "").pubkey
    }

    /// Runs `f` on a thread of its own, with its own metrics recorder,
    /// and waits for it, boundedly: a loop that never ends fails the test
    /// instead of hanging it.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (T, Recorded) {
        let (tx, rx) = sync_channel(1);
        std::thread::spawn(move || {
            let _ = tx.send(record(f));
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(out) => out,
            Err(RecvTimeoutError::Timeout) => panic!("did not finish within 60 s"),
            Err(RecvTimeoutError::Disconnected) => panic!("panicked"),
        }
    }

    /// Waits (boundedly) until `done` holds.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_batch_takes_what_is_queued_up_to_max_batch_events() {
        let mut r = rig(EngineConfig {
            max_batch_events: 3,
            ..EngineConfig::default()
        });
        let events = notes(1..=5);
        let mut replies = r.queue_all(&events, PIPELINED);
        assert!(r.handle_next().is_none());
        assert_eq!(r.batches(), 1);
        assert_eq!(answered(&mut replies), [true, true, true, false, false]);
        assert!(r.handle_next().is_none());
        assert_eq!(r.batches(), 2);
        assert_eq!(answered(&mut replies[3..]), [true, true]);
        assert!(events.iter().all(|ev| r.stored(ev)));
        assert_eq!(r.w.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_batch_takes_what_is_queued_up_to_max_batch_bytes() {
        let events = notes(1..=9);
        let len = events[0].raw().len();
        assert!(events.iter().all(|ev| ev.raw().len() == len));
        // Exactly two events' bytes: the second fills the batch.
        let mut r = rig(EngineConfig {
            max_batch_bytes: 2 * len,
            ..EngineConfig::default()
        });
        let mut replies = r.queue_all(&events[..4], PIPELINED);
        r.handle_next();
        assert_eq!(answered(&mut replies), [true, true, false, false]);
        r.handle_next();
        assert_eq!(answered(&mut replies[2..]), [true, true]);
        // A byte more than three: the fourth is taken, not the fifth.
        r.w.cfg.max_batch_bytes = 3 * len + 1;
        let mut replies = r.queue_all(&events[4..], PIPELINED);
        r.handle_next();
        assert_eq!(answered(&mut replies), [true, true, true, true, false]);
        assert_eq!(r.batches(), 3);
    }

    #[test]
    fn a_message_met_while_filling_a_batch_is_handed_back_to_be_handled_next() {
        let mut r = rig(EngineConfig::default());
        let events = notes(1..=3);
        let mut first = r.queue_all(&events[..2], PIPELINED);
        let (reply, mut policy) = oneshot::channel();
        r.tx.try_send(Msg::Admin(AdminOp::ReadPolicy, reply))
            .ok()
            .unwrap();
        let mut last = r.queue_all(&events[2..], PIPELINED);
        let held = r.handle_next();
        assert_eq!(answered(&mut first), [true, true]);
        assert!(policy.try_recv().is_err(), "not handled yet");
        let Some(msg @ Msg::Admin(..)) = held else {
            panic!("the policy read was not handed back");
        };
        let mut none = None;
        assert!(r.w.handle(msg, &mut none));
        assert_eq!(
            policy.try_recv().unwrap().unwrap(),
            AdminDone::Policy(vec![])
        );
        assert!(answer(&mut last[0]).is_none());
        r.handle_next();
        assert_eq!(answered(&mut last), [true]);
        assert_eq!(r.batches(), 2);
    }

    #[test]
    fn lone_events_commit_ahead_of_a_large_batch_of_pipelined_ones() {
        let mut r = rig(EngineConfig::default());
        let events = notes(1..=30);
        // Eight in all: one commit, the lone event among them.
        let mut replies = r.queue_all(&events[..7], PIPELINED);
        replies.extend(r.queue_all(&events[7..8], LONE));
        r.handle_next();
        assert_eq!(r.batches(), 1);
        assert!(answered(&mut replies).iter().all(|a| *a));
        // Nine: the lone one (queued last) first, in a commit of its own.
        let mut pipelined = r.queue_all(&events[8..16], PIPELINED);
        let mut lone = r.queue_all(&events[16..17], LONE);
        r.handle_next();
        assert_eq!(r.batches(), 3);
        let first = serial(&mut lone[0]);
        for rx in &mut pipelined {
            assert!(serial(rx) > first);
        }
        // Nine lone ones: one commit.
        let mut all_lone = r.queue_all(&events[17..26], LONE);
        r.handle_next();
        assert_eq!(r.batches(), 4);
        assert!(answered(&mut all_lone).iter().all(|a| *a));
        assert!(events[..26].iter().all(|ev| r.stored(ev)));
    }

    #[test]
    fn outsiders_wait_for_a_commit_unless_a_batch_of_them_or_the_oldest_is_due() {
        let mut r = rig(EngineConfig {
            max_batch_events: 3,
            ..EngineConfig::default()
        });
        let events = notes(1..=8);
        // One outsider: it waits.
        let started = Instant::now();
        let mut waiting = r.queue_all(&events[..1], OUTSIDER);
        r.handle_next();
        if started.elapsed() < OUTSIDERS_WAIT {
            assert_eq!(r.batches(), 0);
            assert_eq!(answered(&mut waiting), [false]);
        }
        // A batch's worth waiting: committed at once.
        waiting.extend(r.queue_all(&events[1..3], OUTSIDER));
        r.handle_next();
        if started.elapsed() < OUTSIDERS_WAIT {
            assert_eq!(r.batches(), 1);
            assert_eq!(answered(&mut waiting), [true; 3]);
        }
        r.w.flush_outsiders();
        let before = r.batches();
        // Two, the oldest waiting for longer than OUTSIDERS_WAIT: committed.
        let mut due = r.queue_all(&events[3..4], OUTSIDER);
        r.handle_next();
        r.w.outsiders_since = Some(Instant::now() - 2 * OUTSIDERS_WAIT);
        due.extend(r.queue_all(&events[4..5], OUTSIDER));
        r.handle_next();
        assert_eq!(r.batches(), before + 1);
        assert_eq!(answered(&mut due), [true, true]);
        assert!(r.w.outsiders.is_empty() && r.w.outsiders_since.is_none());
        // An outsider rides on someone else's commit.
        let mut rides = r.queue_all(&events[5..6], OUTSIDER);
        rides.extend(r.queue_all(&events[6..7], LONE));
        r.handle_next();
        assert_eq!(r.batches(), before + 2);
        assert_eq!(answered(&mut rides), [true, true]);
        assert!(events[..7].iter().all(|ev| r.stored(ev)));
    }

    #[test]
    fn stored_events_go_live_and_to_the_tap_but_not_back_to_other_nodes() {
        let mut r = rig(EngineConfig::default());
        let mut live = r.parts.live.connect();
        let _sub = live.subscribe(vec![Filter::from_value(&serde_json::json!({})).unwrap()]);
        let (tap, mut offered) = tokio::sync::mpsc::channel(16);
        r.parts.tap.attach(tap);
        let (mine, replica) = (note(1, 60), note(2, 60));
        let mut replies = [
            r.queue(&mine, Origin::Client, PIPELINED),
            r.queue(&replica, Origin::Replica, PIPELINED),
            r.queue(&mine, Origin::Client, PIPELINED),
        ];
        r.handle_next();
        let outcomes: Vec<_> = replies.iter_mut().map(|rx| answer(rx).unwrap()).collect();
        assert!(matches!(outcomes[0], Ok(WriteOutcome::Stored { .. })));
        assert!(matches!(outcomes[1], Ok(WriteOutcome::Stored { .. })));
        assert_eq!(outcomes[2], Ok(WriteOutcome::Duplicate));
        // Both stored events reach the live subscription, in order.
        let got: Vec<_> = std::iter::from_fn(|| live.try_recv())
            .map(|d| d.event.event.id)
            .collect();
        assert_eq!(got, [mine.id, replica.id]);
        // Only this node's stored event goes to the other nodes.
        let tapped: Vec<_> = std::iter::from_fn(|| offered.try_recv().ok())
            .map(|ev| ev.id)
            .collect();
        assert_eq!(tapped, [mine.id]);
    }

    #[test]
    fn a_request_to_vanish_removes_its_authors_earlier_events_in_chunks() {
        let mut r = rig(EngineConfig::default());
        let (a, b) = (history(1, 1, 1500, 100, &[]), history(2, 1, 1, 100, &[]));
        seed(&r.store, &a, unix_now());
        seed(&r.store, &b, unix_now());
        let bye = history(1, VANISH, 1, 10, &[&["relay", "ALL_RELAYS"]]);
        let (req, mut rx) = request(&bye[0], Origin::Client, LONE);
        let (w, got) = bounded(move || {
            let mut w = r.w;
            w.write(vec![req]);
            w
        });
        r.w = w;
        assert!(matches!(
            answer(&mut rx),
            Some(Ok(WriteOutcome::Stored { .. }))
        ));
        let ids: Vec<_> = r.held().iter().map(|e| e.id).collect();
        assert_eq!(ids, [b[0].id, bye[0].id]);
        assert_eq!(got.counter(m::EVENTS_VANISHED_TOTAL, &[]), 1500);
        // An event that is not a request to vanish removes nothing.
        let later = note(3, 5);
        let (req, _rx) = request(&later, Origin::Client, LONE);
        r.w.write(vec![req]);
        assert_eq!(r.held().len(), 3);
    }

    #[test]
    fn admin_purges_an_author_in_chunks_and_one_event() {
        let mut r = rig(EngineConfig::default());
        let (a, b) = (history(1, 1, 1500, 100, &[]), history(2, 1, 2, 100, &[]));
        seed(&r.store, &a, unix_now());
        seed(&r.store, &b, unix_now());
        let (w, purged) = {
            let ((w, purged), _) = bounded(move || {
                let w = r.w;
                let purged = w.admin(AdminOp::PurgeAuthor(pubkey(1)));
                (w, purged)
            });
            (w, purged)
        };
        r.w = w;
        assert_eq!(purged.unwrap(), AdminDone::Purged(1500));
        assert_eq!(r.held().len(), 2);
        let one = |w: &Writer| w.admin(AdminOp::PurgeEvent(b[0].id)).unwrap();
        assert_eq!(one(&r.w), AdminDone::Purged(1));
        assert_eq!(one(&r.w), AdminDone::Purged(0));
        assert_eq!(r.held().iter().map(|e| e.id).collect::<Vec<_>>(), [b[1].id]);
        let set = AdminOp::SetPolicy("ban_pubkey:00".into(), Some("spam".into()));
        assert_eq!(r.w.admin(set).unwrap(), AdminDone::Set);
        let entries = vec![("ban_pubkey:00".to_string(), "spam".to_string())];
        assert_eq!(
            r.w.admin(AdminOp::ReadPolicy).unwrap(),
            AdminDone::Policy(entries)
        );
    }

    #[test]
    fn a_purge_by_filter_removes_the_newest_matches_in_chunks_up_to_its_limit() {
        let mut r = rig(EngineConfig::default());
        let notes = history(1, 1, 1500, 100, &[]);
        let reactions = history(1, 7, 5, 100, &[]);
        let other = history(2, 1, 1, 100, &[]);
        for events in [&notes, &reactions, &other] {
            seed(&r.store, events, unix_now());
        }
        let filter = |limit: Option<u64>| {
            let mut f = serde_json::json!({"authors": [sluice_proto::hex32::encode(&pubkey(1))], "kinds": [1]});
            if let Some(l) = limit {
                f["limit"] = l.into();
            }
            Box::new(Filter::from_value(&f).unwrap())
        };
        let purge = |w: Writer, limit, dry_run| {
            bounded(move || {
                let op = AdminOp::PurgeMatching {
                    filter: filter(limit),
                    dry_run,
                };
                let done = w.admin(op).unwrap();
                (w, done)
            })
            .0
        };
        // A dry run counts every match (its limit ignored) and removes none.
        let (w, done) = purge(r.w, Some(10), true);
        assert_eq!(done, AdminDone::Purged(1500));
        assert_eq!(held(&r.store).len(), 1506);
        // At most the limit, newest first: the oldest 300 notes are left.
        let (w, done) = purge(w, Some(1200), false);
        assert_eq!(done, AdminDone::Purged(1200));
        let left: Vec<_> = held(&r.store).iter().map(|e| e.id).collect();
        let want: Vec<_> = (notes[..300].iter().chain(&reactions).chain(&other))
            .map(|e| e.id)
            .collect();
        assert_eq!(left, want);
        // No limit: every match.
        let (w, done) = purge(w, None, false);
        assert_eq!(done, AdminDone::Purged(300));
        assert_eq!(held(&r.store).len(), 6);
        let (w, done) = purge(w, None, false);
        assert_eq!(done, AdminDone::Purged(0));
        r.w = w;
    }

    /// An event that expired `ago` seconds ago, written while it had not.
    fn expired(key: u8, ago: u64) -> Event {
        let at = unix_now() - ago;
        Event::sign(
            &[key; 32],
            at - 100,
            1,
            vec![vec!["expiration".into(), at.to_string()]],
            "gone soon",
        )
    }

    #[test]
    fn expired_events_are_purged_in_chunks_until_none_is_left() {
        let r = rig(EngineConfig::default());
        let now = unix_now();
        let old: Vec<Event> = (0..1500u64)
            .map(|i| {
                let expiration = (now - 10 - i).to_string();
                Event::sign(
                    &[1; 32],
                    now - 200 - i,
                    1,
                    vec![vec!["expiration".into(), expiration]],
                    "x",
                )
            })
            .collect();
        seed(&r.store, &old, now - 2000);
        let fresh = note(2, 60);
        seed(&r.store, std::slice::from_ref(&fresh), unix_now());
        assert_eq!(r.held().len(), 1501);
        let (w, got) = bounded(move || {
            r.w.purge_expired();
            r.w
        });
        assert_eq!(
            held(&w.store).iter().map(|e| e.id).collect::<Vec<_>>(),
            [fresh.id]
        );
        assert_eq!(got.counter(m::EVENTS_PURGED_TOTAL, &[]), 1500);
    }

    #[test]
    fn disk_errors_are_taken_for_a_full_disk_only_when_it_is_nearly_full() {
        let r = rig(EngineConfig::default());
        let free = || r.store.disk_space().unwrap().free_bytes;
        let short = || StoreError::Io(std::io::Error::other("short write"));
        let full = || StoreError::Io(std::io::ErrorKind::StorageFull.into());
        // An I/O error while the disk has less than four times the batch
        // free: a full disk, saying how much is free.
        let e = r.w.disk_full_or(short(), free() / 2);
        assert!(e.is_disk_full(), "{e}");
        let text = e.to_string();
        assert!(
            text.ends_with(" KB free on the store's disk (I/O error: short write)"),
            "{text}"
        );
        // Other errors, and a full disk already said, are left as they are.
        let e =
            r.w.disk_full_or(StoreError::MapFull { map_size_bytes: 1 }, free() / 2);
        assert!(matches!(e, StoreError::MapFull { .. }), "{e}");
        let e = r.w.disk_full_or(full(), free() / 2);
        assert_eq!(e.to_string(), full().to_string());
        // Plenty of room for the batch (and at least 8 MiB): an I/O error.
        if free() > 64 << 20 {
            let e = r.w.disk_full_or(short(), 1);
            assert!(e.is_io() && !e.is_disk_full(), "{e}");
            assert_eq!(e.to_string(), "I/O error: short write");
            // Exactly four times the batch free is room enough (free space
            // is whole blocks, a multiple of 4; retried while other writers
            // change it under the test).
            for _ in 0..100 {
                let before = free();
                let e = r.w.disk_full_or(short(), before / 4);
                if free() == before {
                    assert!(!e.is_disk_full(), "{e}");
                    break;
                }
            }
        }
    }

    #[test]
    fn an_outcome_is_labelled_and_counted() {
        let stored = |replaced, deleted| WriteOutcome::Stored {
            serial: 1,
            replaced,
            deleted,
        };
        let labels = [
            (stored(true, 0), "replaced"),
            (stored(true, 2), "replaced"),
            (stored(false, 1), "deletion"),
            (stored(false, 0), "stored"),
            (WriteOutcome::Duplicate, "duplicate"),
            (WriteOutcome::Superseded, "superseded"),
            (WriteOutcome::Deleted, "deleted"),
            (WriteOutcome::Expired, "expired"),
            (WriteOutcome::Ephemeral, "ephemeral"),
            (WriteOutcome::OutsideRetention, "outside_retention"),
            (WriteOutcome::Vanished, "vanished"),
        ];
        for (o, label) in labels {
            assert_eq!(outcome_label(&o), label, "{o:?}");
        }
        let ((), got) = record(|| {
            count_outcome(&stored(false, 0));
            count_outcome(&stored(false, 0));
            count_outcome(&WriteOutcome::Duplicate);
        });
        let written = |label| got.counter(m::EVENTS_WRITTEN_TOTAL, &[("outcome", label)]);
        assert_eq!((written("stored"), written("duplicate")), (2, 1));
        assert_eq!(got.counters(m::EVENTS_WRITTEN_TOTAL).len(), 2);
    }

    #[test]
    fn a_failed_batch_is_counted_by_its_reason() {
        let ((), got) = record(|| {
            report_failure(&StoreError::MapFull { map_size_bytes: 1 }, 3);
            let full = StoreError::Io(std::io::ErrorKind::StorageFull.into());
            report_failure(&full, 2);
            report_failure(&full, 1);
            report_failure(&StoreError::Io(std::io::Error::other("eio")), 1);
        });
        let errors = |reason| got.counter(m::WRITER_ERRORS_TOTAL, &[("reason", reason)]);
        assert_eq!(
            (errors("map_full"), errors("disk_full"), errors("store")),
            (1, 2, 1)
        );
    }

    #[test]
    fn a_store_too_small_for_a_batch_refuses_it_as_full() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            map_size_bytes: 1 << 20,
            max_readers: 16,
            write_map: false,
            write_map_when_alone: false,
            min_free_disk_bytes: 0,
        };
        let mut r = rig(EngineConfig::default());
        r.store = Store::open(dir.path(), &opts).unwrap();
        r.w.store = r.store.clone();
        let big: Vec<Event> = (0..8u8)
            .map(|k| {
                Event::sign(
                    &[k + 1; 32],
                    unix_now() - 60,
                    1,
                    vec![],
                    &"x".repeat(200_000),
                )
            })
            .collect();
        let mut replies = r.queue_all(&big, PIPELINED);
        let ((), got) = record(|| {
            r.handle_next();
        });
        for rx in &mut replies {
            assert_eq!(answer(rx), Some(Err(WriteError::StoreFull)));
        }
        assert_eq!(
            got.counter(m::WRITER_ERRORS_TOTAL, &[("reason", "map_full")]),
            1
        );
        assert!(r.held().is_empty());
    }

    #[test]
    fn the_cost_of_a_bulk_commit_counts_from_64_stored_events() {
        let mut c = CommitCost::default();
        assert!(!c.record(Duration::from_millis(1), 63));
        assert_eq!(c, CommitCost::default());
        assert!(c.record(Duration::from_millis(64), 64));
        assert!((c.recent - 1.0).abs() < 1e-12, "{c:?}");
    }

    /// A handle around a queue the test holds (no writer thread).
    fn handle_of(capacity: usize) -> (WriterHandle, Receiver<Msg>) {
        let (tx, rx) = sync_channel(capacity);
        let h = WriterHandle {
            signals: Arc::default(),
            backlog: Backlog::default(),
            tx,
            queued: Arc::default(),
            alive: Arc::new(AtomicBool::new(true)),
            thread: Mutex::new(None),
        };
        (h, rx)
    }

    #[test]
    fn a_full_queue_refuses_and_counts_and_the_queue_length_is_kept() {
        let (h, rx) = handle_of(2);
        let ev = Arc::new(note(1, 60));
        let submit = || h.submit(ev.clone(), Instant::now(), Origin::Client, PIPELINED);
        let (results, got) = record(|| [submit().is_ok(), submit().is_ok(), submit().is_ok()]);
        assert_eq!(results, [true, true, false]);
        assert_eq!(got.counter(m::WRITER_QUEUE_FULL_TOTAL, &[]), 1);
        assert_eq!(h.queue_len(), 2);
        assert_eq!(submit().err(), Some(SubmitError::QueueFull));
        // Stopped: refused as closed, not counted as full.
        drop(rx);
        let (e, got) = record(|| submit().err());
        assert_eq!(e, Some(SubmitError::Closed));
        assert_eq!(got.counter(m::WRITER_QUEUE_FULL_TOTAL, &[]), 0);
        assert_eq!(h.queue_len(), 2);
    }

    #[test]
    fn a_wake_is_queued_for_the_writer() {
        let (h, rx) = handle_of(2);
        h.wake();
        assert!(matches!(rx.try_recv(), Ok(Msg::Wake)));
        assert!(rx.try_recv().is_err());
    }

    /// A writer thread as the engine starts it, over `store`.
    fn start(store: &Store, cfg: EngineConfig) -> (WriterHandle, Parts) {
        let parts = Parts::new();
        let h = spawn(
            store.clone(),
            cfg,
            parts.live.clone(),
            (
                parts.tap.clone(),
                parts.mirrors.clone(),
                parts.trust.clone(),
                parts.search.clone(),
            ),
            parts.plan.clone(),
            parts.disk.clone(),
        )
        .unwrap();
        (h, parts)
    }

    /// Has the writer thread answer a message, so everything queued before
    /// it was handled.
    fn round_trip(h: &WriterHandle) {
        let (reply, answer) = oneshot::channel();
        h.tx.send(Msg::Admin(AdminOp::ReadPolicy, reply)).unwrap();
        answer.blocking_recv().unwrap().unwrap();
    }

    fn submit(h: &WriterHandle, ev: &Event, flags: (bool, bool)) -> WriteResult {
        let rx = h.submit(Arc::new(ev.clone()), Instant::now(), Origin::Client, flags);
        rx.unwrap().blocking_recv().unwrap()
    }

    #[test]
    fn an_expired_event_stays_on_disk_until_the_expiry_purge_is_due() {
        let (_dir, store) = open_store();
        let gone = expired(1, 10);
        seed(&store, std::slice::from_ref(&gone), unix_now() - 60);
        let cfg = EngineConfig {
            expiry_purge_interval_ms: 3_600_000,
            ..EngineConfig::default()
        };
        let (h, _parts) = start(&store, cfg);
        // An outsider's event, committed once it has waited (an idle
        // writer's timeout), then a lone one.
        let stored = |r: WriteResult| matches!(r, Ok(WriteOutcome::Stored { .. }));
        assert!(stored(submit(&h, &note(2, 60), OUTSIDER)));
        round_trip(&h);
        assert!(stored(submit(&h, &note(3, 60), LONE)));
        round_trip(&h);
        // Still on disk (never served: it has expired), until the purge.
        assert!(held(&store).iter().any(|e| e.id == gone.id), "purged early");
        assert_eq!(store.get(&gone.id, unix_now()).unwrap(), None);
        h.shutdown();
    }

    #[test]
    fn a_new_retention_plan_wakes_an_idle_writer_which_applies_it() {
        let (_dir, store) = open_store();
        let old = history(1, 1, 3, 10 * 86_400, &[]);
        let recent = note(2, 60);
        seed(&store, &old, unix_now());
        seed(&store, std::slice::from_ref(&recent), unix_now());
        let cfg = EngineConfig {
            expiry_purge_interval_ms: 3_600_000,
            ..EngineConfig::default()
        };
        let (h, parts) = start(&store, cfg);
        // Idle, with nothing due for an hour.
        round_trip(&h);
        let rules = RetentionConfig {
            rules: vec![RuleConfig {
                kinds: vec![1],
                max_age_secs: Some(86_400),
                keep_per_author: None,
            }],
            ..RetentionConfig::default()
        };
        parts.plan.set(rules.plan(std::iter::empty(), Vec::new()));
        h.wake();
        wait_until("the old notes are removed", || held(&store).len() == 1);
        assert_eq!(held(&store)[0].id, recent.id);
        h.shutdown();
    }

    #[test]
    fn shutdown_commits_what_is_queued_stops_the_thread_and_closes_the_queue() {
        let (_dir, store) = open_store();
        let (h, _parts) = start(&store, EngineConfig::default());
        let ev = note(1, 60);
        let rx = h.submit(
            Arc::new(ev.clone()),
            Instant::now(),
            Origin::Client,
            OUTSIDER,
        );
        h.shutdown();
        assert!(!h.alive());
        assert!(matches!(
            rx.unwrap().blocking_recv().unwrap(),
            Ok(WriteOutcome::Stored { .. })
        ));
        let again = h.submit(Arc::new(note(2, 60)), Instant::now(), Origin::Client, LONE);
        assert_eq!(again.err(), Some(SubmitError::Closed));
        h.shutdown();
    }

    /// CPU time the writer thread has used.
    #[cfg(target_os = "linux")]
    fn cpu_time(h: &WriterHandle) -> Duration {
        use std::os::unix::thread::JoinHandleExt;
        let thread = h.thread.lock().unwrap();
        let pthread = thread.as_ref().unwrap().as_pthread_t();
        let mut clock: libc::clockid_t = 0;
        // SAFETY: the thread is running (joined only by `shutdown`), and
        // `clock` is writable.
        assert_eq!(
            unsafe { libc::pthread_getcpuclockid(pthread, &mut clock) },
            0
        );
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is writable.
        assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Fails if the writer thread uses `budget` of CPU within about
    /// `watch` of the wall clock. What an idle writer uses does not depend
    /// on how long it is watched or how busy the machine is: it sleeps.
    #[cfg(target_os = "linux")]
    fn assert_sleeps(h: &WriterHandle, what: &str) {
        let (watch, budget) = (Duration::from_millis(1500), Duration::from_millis(100));
        let (started, cpu) = (Instant::now(), cpu_time(h));
        while started.elapsed() < watch {
            std::thread::sleep(Duration::from_millis(20));
            let used = cpu_time(h) - cpu;
            assert!(
                used < budget,
                "{what}: the writer used {used:?} of CPU in {:?}",
                started.elapsed()
            );
        }
    }

    /// An idle writer sleeps until the next thing due (an expiry purge,
    /// a waiting outsider's commit, a retention step, a look at a closed
    /// disk gate every second): it never spins.
    #[test]
    #[cfg(target_os = "linux")]
    fn an_idle_writer_sleeps_between_what_is_due() {
        let (_dir, store) = open_store();
        let cfg = EngineConfig {
            expiry_purge_interval_ms: 200,
            ..EngineConfig::default()
        };
        let (h, parts) = start(&store, cfg);
        round_trip(&h);
        assert_sleeps(&h, "idle, purging expired events every 200 ms");
        // The disk is nearly full: the writer looks again every second.
        parts.disk.update(&DiskSpace {
            free_bytes: 1 << 20,
            total_bytes: 1 << 30,
            min_free_bytes: 64 << 20,
        });
        round_trip(&h);
        assert_sleeps(&h, "idle, the disk gate closed");
        let refused = submit(&h, &note(1, 60), LONE);
        assert!(
            matches!(refused, Err(WriteError::DiskFull(_))),
            "{refused:?}"
        );
        h.shutdown();
    }
}
