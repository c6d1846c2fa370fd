//! Sluice's runtime core, shared by `serve` and `import`.
//!
//! - [`writer`]: the single writer thread. Events wait in a bounded queue;
//!   the writer takes a batch, writes it in one LMDB transaction, commits,
//!   then answers each sender and fans the stored events out.
//!   A bulk client (the import) hands it whole ordered batches instead
//!   ([`Engine::write_batch_blocking`]).
//! - [`reads`]: REQs and COUNTs run in bounded steps on
//!   `throttle.queries.slots` worker threads, scheduled fairly between
//!   clients by cost, their answers streamed to each session's sink; no
//!   LMDB call ever runs on an async worker thread.
//! - [`live`]: live fan-out. An index of open subscriptions (by id,
//!   author, tag value, kind); each stored or ephemeral event goes only to
//!   the connections with a matching subscription, through each one's
//!   bounded queue (a connection that lets it fill is dropped by the
//!   server as a slow consumer).
//! - The store monitor (`monitor.rs`): a thread ticking the governor every
//!   `throttle.tick_ms`; [`Engine::health`] says whether the writer, the
//!   monitor and the store are working.
//!
//! [`Engine::start`] starts the threads; [`Engine::shutdown`] stops and
//! joins them. An engine thread that panics is logged and counted
//! (`sluice_engine_thread_panics_total`) and turns [`Engine::health`] red.
//!
//! Invariants: only the writer thread writes to the store (besides another
//! process, which LMDB serialises); an OK true is sent only after the commit
//! that made the event durable.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod config;
mod gauge;
pub mod live;
pub mod mailbox;
pub mod metrics_names;
mod mirror_tap;
mod monitor;
pub mod plugin;
pub mod policy;
pub mod process;
pub mod reads;
mod replica;
pub mod retention;
mod search;
pub mod throttle;
pub mod trust;
mod writer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_proto::Event;
use tokio::sync::oneshot;

pub use config::EngineConfig;
pub use gauge::GaugeGuard;
pub use live::{LiveConn, LiveDelivery, LiveEnd, LiveHub, LiveSub, SubHandle};
pub use mirror_tap::{MirrorTap, Origin};
pub use policy::{Denial, PolicyConfig};
pub use reads::{ReadEnd, ReadGuard, ReadMsg, ReadSink, Reads};
pub use retention::{DryRun, RetentionConfig, RetentionPlan, RuleConfig};
pub use sluice_store::{
    DiskSpace, QueryOptions, QueryOutput, Scope, Store, StoreError, StoreOptions, StoreStats,
    WriteOutcome, WriteRules,
};
pub use sluice_throttle::policy::Op;
pub use sluice_throttle::{RateLimited, Verdict};
pub use throttle::{Throttle, ThrottleConfig, Usage, UsageKey, UsageMap};
pub use writer::{
    AdminDone, AdminOp, Backlog, BulkError, BulkTicket, SubmitError, WriteError, WriteResult,
    outcome_label,
};

/// The monitor counts as stalled when it has not ticked for this many tick
/// intervals...
const MONITOR_STALE_TICKS: u64 = 10;
/// ...and for at least this long (a relief sync of a large store, or a
/// busy machine, may hold one tick up for a while).
const MONITOR_STALE_MIN: Duration = Duration::from_secs(2);

/// An event as live subscriptions receive it.
#[derive(Debug)]
pub struct LiveEvent {
    /// Store serial; `None` for ephemeral events, which are never stored.
    pub serial: Option<u64>,
    pub event: Arc<Event>,
}

/// Errors of a query.
/// Why [`Engine::start`] failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The operating system would not start a thread (memory, or the
    /// process's thread limit).
    #[error("cannot start the engine's {thread} thread: {source}")]
    Thread {
        thread: String,
        #[source]
        source: std::io::Error,
    },
    /// A component refused its configuration (validated at load, so this
    /// is a bug if it happens).
    #[error("engine configuration refused: {0}")]
    Config(String),
    /// The NIP-50 index would not open (or its writer is held by another
    /// process).
    #[error("{0}")]
    Search(#[from] sluice_search::SearchError),
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("store error: {0}")]
    Store(#[from] StoreError),
    #[error("engine is shutting down")]
    Closed,
    #[error("query refused: {}", .0.detail())]
    Refused(RateLimited),
}

impl From<RateLimited> for QueryError {
    fn from(r: RateLimited) -> QueryError {
        QueryError::Refused(r)
    }
}

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
struct HealthInputs {
    shutting_down: bool,
    writer_alive: bool,
    monitor_running: bool,
    /// Throttle clock now and at the monitor's last tick, and its tick, ns.
    now_ns: u64,
    last_tick_ns: u64,
    tick_ns: u64,
    stats_ok: bool,
}

fn judge(h: HealthInputs) -> Result<(), Unready> {
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

/// The running core. Shared by reference (`Arc<Engine>`) among sessions.
pub struct Engine {
    store: Store,
    cfg: EngineConfig,
    writer: writer::WriterHandle,
    live: Arc<LiveHub>,
    throttle: Arc<Throttle>,
    reads: Reads,
    monitor: monitor::MonitorHandle,
    shutting_down: AtomicBool,
    policy: policy::Policy,
    /// The write-policy plugin, once `load_policy` started it.
    plugin: std::sync::OnceLock<Arc<plugin::Plugin>>,
    /// Where stored and ephemeral client events go to other nodes.
    tap: Arc<replica::Tap>,
    /// Where stored and ephemeral events go to the mirrors that send up.
    mirrors: Arc<mirror_tap::MirrorTaps>,
    /// Conditions /readyz reports without failing (e.g. a cluster running
    /// on local limits while Redis is away), by source.
    notes: Mutex<std::collections::BTreeMap<&'static str, String>>,
    /// The retention plan the writer runs.
    retention: Arc<retention::SharedPlan>,
    /// Free disk space, as the monitor last saw it.
    disk: Arc<DiskGate>,
    /// The web of trust and the proof-of-work difficulty.
    trust: Arc<trust::Trust>,
    /// The NIP-50 index, once [`Engine::start_search`] started it.
    search: Arc<search::SearchSlot>,
}

/// Current unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Engine {
    /// Starts the writer thread, the query workers and the monitor over
    /// `store`, and returns once the monitor has ticked once (so the first
    /// verdict anyone reads is a real one). The governor runs with
    /// `throttle` as given: `import` passes its own write tuning and
    /// memory target.
    /// Starts the writer, the query workers and the monitor. An error names
    /// the thread the system would not start (or the config a component
    /// refused); whatever had started is stopped again.
    pub fn start(
        store: Store,
        cfg: EngineConfig,
        throttle: ThrottleConfig,
    ) -> Result<Arc<Engine>, StartError> {
        let live = LiveHub::new(cfg.live_buffer_events, cfg.live_buffer_bytes);
        let tap = Arc::new(replica::Tap::default());
        let mirrors = Arc::new(mirror_tap::MirrorTaps::default());
        let retention = Arc::new(retention::SharedPlan::default());
        let disk = Arc::new(DiskGate::default());
        let trust = Arc::new(trust::Trust::default());
        let search = Arc::new(search::SearchSlot::default());
        let writer = writer::spawn(
            store.clone(),
            cfg.clone(),
            live.clone(),
            (tap.clone(), mirrors.clone(), trust.clone(), search.clone()),
            retention.clone(),
            disk.clone(),
        )?;
        let throttle = Throttle::new(throttle);
        // On error the writer's handle drops here: its queue closes and the
        // thread ends.
        let reads = Reads::start(store.clone(), throttle.clone(), &cfg, search.clone())?;
        let engine = Arc::new(Engine {
            throttle,
            reads,
            store,
            cfg,
            writer,
            live,
            monitor: monitor::MonitorHandle::new(),
            shutting_down: AtomicBool::new(false),
            policy: policy::Policy::default(),
            plugin: std::sync::OnceLock::new(),
            tap,
            mirrors,
            notes: Mutex::new(std::collections::BTreeMap::new()),
            retention,
            disk,
            trust,
            search,
        });
        if let Err(e) = monitor::MonitorHandle::start(&engine) {
            engine.shutdown();
            return Err(e);
        }
        Ok(engine)
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

    /// Sets the retention plan (at start, and again on SIGHUP): the writer
    /// picks it up before its next batch and runs every rule again from
    /// the start. Without a plan nothing is removed by retention.
    pub fn set_retention(&self, plan: RetentionPlan) {
        self.retention.set(plan);
        self.writer.wake();
    }

    /// Applies `[trust]` and `[pow]` (at start and on SIGHUP): the web of
    /// trust is built again from the store when `[trust]` changed.
    pub fn set_trust(
        &self,
        trust: sluice_throttle::TrustConfig,
        pow: sluice_throttle::PowConfig,
    ) -> Result<(), StartError> {
        let tiers = self.throttle.config().tiers;
        self.throttle.set_outsider_rate(trust.outsider_events_per_s);
        let settings = trust::TrustSettings::new(trust, pow, &tiers);
        self.trust.set(settings, &self.store)
    }

    /// The web of trust and the proof-of-work difficulty.
    pub fn trust(&self) -> &Arc<trust::Trust> {
        &self.trust
    }

    /// Opens the NIP-50 index in `store.path/search/` and starts its
    /// indexer thread, which catches up with the store from the serial of
    /// its last commit. Once per engine; `[search] enabled = false` starts
    /// nothing.
    pub fn start_search(&self, cfg: sluice_search::SearchConfig) -> Result<(), StartError> {
        if !cfg.enabled {
            return Ok(());
        }
        let dir = self.store.path().join(sluice_search::INDEX_DIR);
        let index = sluice_search::SearchIndex::open(&dir, cfg)?;
        let indexer = sluice_search::Indexer::start(index.clone(), self.store.clone())?;
        if !self.search.set(index, indexer) {
            return Err(StartError::Config("search started twice".into()));
        }
        Ok(())
    }

    /// The NIP-50 index, when search is on.
    pub fn search_index(&self) -> Option<&Arc<sluice_search::SearchIndex>> {
        self.search.index()
    }

    /// Blocks until the index has committed every event stored so far
    /// (the import's last step); true at once without search, false if
    /// the indexer stopped.
    pub fn wait_search_caught_up(&self) -> bool {
        let Some(indexer) = self.search.indexer() else {
            return true;
        };
        match self.store.next_serial() {
            Ok(next) => indexer.wait_caught_up(next),
            Err(_) => false,
        }
    }

    /// The retention plan in force.
    pub fn retention(&self) -> Arc<RetentionPlan> {
        self.retention.get()
    }

    /// Applies a reloaded `[throttle]` section (SIGHUP): buckets, modes,
    /// and the query scheduler's bounds.
    /// All or nothing: the whole section is validated first, the
    /// scheduler (the one part that can still refuse) takes its part next,
    /// and if the buckets then refuse theirs the scheduler gets its old
    /// settings back.
    pub fn reload_throttle(&self, cfg: ThrottleConfig) -> Result<(), String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let old_queries = self.throttle.config().queries;
        self.reads.reload(cfg.queries.clone())?;
        if let Err(e) = self.throttle.reload(cfg) {
            let _ = self.reads.reload(old_queries);
            return Err(e);
        }
        Ok(())
    }

    /// Queues an event for the writer without waiting. The receiver yields
    /// the outcome once the batch holding the event has committed.
    /// `received` is when the event was admitted: the writer wait the
    /// monitor sees runs from there, so time spent waiting for a CPU
    /// (signature checks of a flood) counts as load, not only the queue.
    /// `origin`: a client, or the mirror that brought it (never offered
    /// back to that mirror). `lone`: the connection has no other EVENT
    /// awaiting its OK; such events are committed ahead of a large batch of
    /// pipelined ones. `outsider`: its author is outside the web of trust;
    /// it waits (at most 100 ms) to ride on the writer's next commit, so
    /// strangers' floods cost few commits.
    pub fn submit(
        &self,
        event: Arc<Event>,
        received: Instant,
        origin: Origin,
        (lone, outsider): (bool, bool),
    ) -> Result<oneshot::Receiver<WriteResult>, SubmitError> {
        self.writer
            .submit(event, received, origin, (lone, outsider))
    }

    /// Queues an event another node stored (the cluster's consumer): the
    /// same write rules, live delivery here, and never sent back to the
    /// replication tap.
    pub fn submit_replica(
        &self,
        event: Arc<Event>,
    ) -> Result<oneshot::Receiver<WriteResult>, SubmitError> {
        self.writer
            .submit(event, Instant::now(), Origin::Replica, (false, false))
    }

    /// Attaches the replication tap: from now on every event a client (or
    /// a mirror) stored here, and every such ephemeral event, is
    /// offered to `tx` (never waiting: a full channel drops it, counted
    /// in `sluice_cluster_outbound_dropped_total`). Once per engine.
    pub fn attach_replication(&self, tx: tokio::sync::mpsc::Sender<Arc<Event>>) {
        self.tap.attach(tx);
    }

    /// Registers a mirror that sends up: from now on every event stored
    /// here for a client or another mirror (and every such ephemeral
    /// event) that matches `filter` is offered to the returned tap's queue
    /// of `capacity` events, never waiting: a full queue drops it and
    /// counts `dropped`. Events from the tap's own origin are never
    /// offered to it. Dropping the tap unregisters it.
    pub fn mirror_tap(
        &self,
        filter: sluice_proto::Filter,
        capacity: usize,
        dropped: metrics::Counter,
    ) -> MirrorTap {
        self.mirrors.register(filter, capacity, dropped)
    }

    /// The origin of a mirror that does not send up (its events are
    /// offered to every other mirror).
    pub fn mirror_origin(&self) -> Origin {
        Origin::Mirror(self.mirrors.new_id())
    }

    /// Delivers an ephemeral event another node received to live
    /// subscriptions here (not sent back to the tap).
    pub fn deliver_replica_ephemeral(&self, event: Arc<Event>) {
        self.live.publish(&[Arc::new(LiveEvent {
            serial: None,
            event,
        })]);
        metrics::counter!(metrics_names::LIVE_PUBLISHED_TOTAL).increment(1);
    }

    /// Sets (`Some`) or clears (`None`) a note /readyz shows beside
    /// "ready" (a degraded but serving condition).
    pub fn set_note(&self, source: &'static str, note: Option<String>) {
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        match note {
            Some(n) => notes.insert(source, n),
            None => notes.remove(source),
        };
    }

    /// The notes set by [`Engine::set_note`], one `source: note` each.
    pub fn notes(&self) -> Vec<String> {
        let notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        notes.iter().map(|(k, v)| format!("{k}: {v}")).collect()
    }

    /// Bulk mode: the writer writes `events` in order as one transaction
    /// (the same write rules as single events), and this returns their
    /// outcomes, in order, after the commit. Blocks the calling (non-async)
    /// thread while the queue is full and during the write. For the import.
    pub fn write_batch_blocking(&self, events: Vec<Event>) -> Result<Vec<WriteOutcome>, BulkError> {
        self.writer.write_bulk(events)
    }

    /// Bulk mode without waiting: queues `events` as one transaction (blocking
    /// while the writer's queue is full) and returns a ticket whose `wait`
    /// gives the outcomes after the commit, so the caller can prepare its
    /// next batch while this one is written.
    pub fn submit_batch_blocking(&self, events: Vec<Event>) -> Result<BulkTicket, BulkError> {
        self.writer.submit_bulk(events)
    }

    /// Where a bulk client counts the input it holds for the writer; the
    /// monitor reads its fill as the writer queue's.
    pub fn bulk_backlog(&self) -> &Backlog {
        &self.writer.backlog
    }

    /// The operator's policy (`[policy]` and the store's runtime entries).
    pub fn policy(&self) -> &policy::Policy {
        &self.policy
    }

    /// Loads `cfg` and the store's runtime policy entries (read by the
    /// writer thread), and starts the write-policy plugin if one is
    /// configured (once, on the calling tokio runtime).
    pub async fn load_policy(&self, cfg: policy::PolicyConfig) -> Result<(), BulkError> {
        if let Some(p) = plugin::Plugin::start(&cfg.plugin) {
            let _ = self.plugin.set(Arc::new(p));
        }
        match self.writer.admin(AdminOp::ReadPolicy).await? {
            AdminDone::Policy(entries) => {
                self.policy.load(cfg, entries);
                Ok(())
            }
            _ => Err(BulkError::Closed),
        }
    }

    /// The write-policy plugin, if one runs.
    pub fn plugin(&self) -> Option<Arc<plugin::Plugin>> {
        self.plugin.get().cloned()
    }

    /// Sets (`Some`) or removes (`None`) one runtime policy entry: durable
    /// when this returns, and in force for the next request.
    pub async fn change_policy(&self, key: String, value: Option<String>) -> Result<(), BulkError> {
        self.writer
            .admin(AdminOp::SetPolicy(key.clone(), value.clone()))
            .await?;
        self.policy.set(key, value);
        Ok(())
    }

    /// Removes every stored event of `pubkey` (through the writer, in
    /// chunks); returns how many.
    pub async fn remove_author_events(&self, pubkey: [u8; 32]) -> Result<usize, BulkError> {
        match self.writer.admin(AdminOp::PurgeAuthor(pubkey)).await? {
            AdminDone::Purged(n) => Ok(n),
            _ => Err(BulkError::Closed),
        }
    }

    /// Removes one stored event; whether it was there.
    pub async fn remove_event(&self, id: [u8; 32]) -> Result<bool, BulkError> {
        match self.writer.admin(AdminOp::PurgeEvent(id)).await? {
            AdminDone::Purged(n) => Ok(n > 0),
            _ => Err(BulkError::Closed),
        }
    }

    /// Removes every stored event matching `filter` (newest first, at most
    /// its `limit`) through the writer, in chunks; with `dry_run`, counts
    /// them instead. Returns how many.
    pub async fn remove_matching(
        &self,
        filter: sluice_proto::Filter,
        dry_run: bool,
    ) -> Result<usize, BulkError> {
        let op = AdminOp::PurgeMatching {
            filter: Box::new(filter),
            dry_run,
        };
        match self.writer.admin(op).await? {
            AdminDone::Purged(n) => Ok(n),
            _ => Err(BulkError::Closed),
        }
    }

    /// Delivers a client's ephemeral event to live subscriptions; never
    /// stored.
    pub fn publish_ephemeral(&self, event: Arc<Event>) {
        self.publish_ephemeral_from(event, Origin::Client);
    }

    /// Delivers an ephemeral event from `origin` (a client, or a mirrored
    /// peer) to live subscriptions, the cluster's tap and the mirrors'
    /// taps (but its own mirror's).
    pub fn publish_ephemeral_from(&self, event: Arc<Event>, origin: Origin) {
        if self.tap.attached() {
            self.tap.offer(&event);
        }
        if self.mirrors.any() {
            self.mirrors.offer(&event, origin);
        }
        self.live.publish(&[Arc::new(LiveEvent {
            serial: None,
            event,
        })]);
        metrics::counter!(metrics_names::LIVE_PUBLISHED_TOTAL).increment(1);
    }

    /// A connection's place in the live index: it registers subscriptions
    /// and receives the events that match them.
    pub fn live_connect(&self) -> LiveConn {
        self.live.connect()
    }

    /// The relay is stopping: every session's live queue says so
    /// ([`LiveEnd::Stopped`]), now and for a session opened later.
    pub fn stop_sessions(&self) {
        self.live.stop();
    }

    /// Whether the engine can serve: not shutting down, the writer thread
    /// running, the monitor running and ticking (within
    /// [`MONITOR_STALE_TICKS`] ticks, at least [`MONITOR_STALE_MIN`]), and
    /// its last store stats read successful. Reads atomics only.
    pub fn health(&self) -> Result<(), Unready> {
        let m = &self.monitor.health;
        if self.search.indexer().is_some_and(|i| !i.alive())
            && !self.shutting_down.load(Ordering::Acquire)
        {
            return Err(Unready::SearchStopped);
        }
        judge(HealthInputs {
            shutting_down: self.shutting_down.load(Ordering::Acquire),
            writer_alive: self.writer.alive(),
            monitor_running: m.running.load(Ordering::Acquire),
            now_ns: self.throttle.now_ns(),
            last_tick_ns: m.last_tick_ns.load(Ordering::Acquire),
            tick_ns: m.tick_ns.load(Ordering::Relaxed),
            stats_ok: m.stats_ok.load(Ordering::Relaxed),
        })
    }

    /// Stops the monitor, the query workers and the writer (which first
    /// commits everything queued), waits for each, and syncs the store.
    /// Idempotent.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.monitor.stop();
        self.trust.stop();
        self.reads.shutdown();
        self.writer.shutdown();
        self.search.stop();
        if let Err(e) = self.store.force_sync() {
            tracing::error!(error = %e, "final store sync failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::Filter;

    fn start() -> (tempfile::TempDir, Arc<Engine>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            &StoreOptions {
                map_size_bytes: 64 << 20,
                max_readers: 126,
                write_map: false,
                write_map_when_alone: false,
                min_free_disk_bytes: 0,
            },
        )
        .unwrap();
        let engine =
            Engine::start(store, EngineConfig::default(), ThrottleConfig::default()).unwrap();
        (dir, engine)
    }

    /// Waits (bounded) until `done` holds.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn readiness_falls_when_the_writer_thread_dies() {
        let (_dir, engine) = start();
        assert_eq!(engine.health(), Ok(()));
        engine.writer.panic_for_test();
        wait_until("the writer is seen stopped", || !engine.writer.alive());
        assert_eq!(engine.health(), Err(Unready::WriterStopped));
        // Nothing can be written any more, and saying so does not hang.
        let e = engine.write_batch_blocking(vec![note()]);
        assert!(matches!(e, Err(BulkError::Closed)), "{e:?}");
        engine.shutdown();
        assert_eq!(engine.health(), Err(Unready::ShuttingDown));
    }

    #[test]
    fn the_monitor_runs_from_start_to_shutdown() {
        let (_dir, engine) = start();
        // Started after its first tick: a verdict is published.
        assert!(engine.throttle.state().is_some());
        assert!(engine.monitor.health.running.load(Ordering::Acquire));
        let first = engine.throttle.state().map(|s| s.ticks);
        wait_until("the monitor ticks again", || {
            engine.throttle.state().map(|s| s.ticks) > first
        });
        engine.shutdown();
        // Joined: not running, and no tick after the shutdown.
        assert!(!engine.monitor.health.running.load(Ordering::Acquire));
        let last = engine.throttle.state().map(|s| s.ticks);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(engine.throttle.state().map(|s| s.ticks), last);
    }

    #[test]
    fn bulk_batches_and_single_events_go_through_the_one_writer_in_order() {
        let (_dir, engine) = start();
        let mut live = engine.live_connect();
        let note = note();
        let everything = Filter::from_value(&serde_json::json!({})).unwrap();
        let _sub = live.subscribe(vec![everything]);
        let outcomes = engine
            .write_batch_blocking(vec![note.clone(), note.clone()])
            .unwrap();
        assert!(matches!(outcomes[0], WriteOutcome::Stored { .. }));
        assert_eq!(outcomes[1], WriteOutcome::Duplicate);
        // Stored bulk events reach live subscribers, after the commit.
        let got = live.try_recv().unwrap();
        assert_eq!(got.event.event.raw(), note.raw());
        assert!(live.try_recv().is_none());
        // A single event after it sees it stored.
        let rx = engine
            .submit(
                Arc::new(note),
                Instant::now(),
                Origin::Client,
                (true, false),
            )
            .unwrap();
        assert_eq!(rx.blocking_recv().unwrap(), Ok(WriteOutcome::Duplicate));
        assert_eq!(engine.write_batch_blocking(Vec::new()).unwrap(), vec![]);
        engine.shutdown();
    }

    #[test]
    fn outsiders_ride_on_the_next_commit_or_their_own_after_a_wait_and_shutdown_commits_them() {
        let (_dir, engine) = start();
        let ev = |i: u8| Arc::new(Event::sign(&[i; 32], 1_700_000_000, 1, vec![], "x"));
        let batches = || engine.writer.signals.batches.load(Ordering::Relaxed);
        // Alone, an outsider's event is committed once it has waited.
        let rx = engine
            .submit(ev(1), Instant::now(), Origin::Client, (false, true))
            .unwrap();
        assert!(matches!(
            rx.blocking_recv().unwrap(),
            Ok(WriteOutcome::Stored { .. })
        ));
        // Several outsiders and then someone else's event: one commit for
        // all (the outsiders ride on it), unless their wait ran out first.
        let before = batches();
        let started = Instant::now();
        let waiting: Vec<_> = (2..6)
            .map(|i| {
                engine
                    .submit(ev(i), Instant::now(), Origin::Client, (false, true))
                    .unwrap()
            })
            .collect();
        let trusted = engine
            .submit(ev(9), Instant::now(), Origin::Client, (true, false))
            .unwrap();
        assert!(matches!(
            trusted.blocking_recv().unwrap(),
            Ok(WriteOutcome::Stored { .. })
        ));
        for rx in waiting {
            assert!(matches!(
                rx.blocking_recv().unwrap(),
                Ok(WriteOutcome::Stored { .. })
            ));
        }
        if started.elapsed() < writer::OUTSIDERS_WAIT {
            assert_eq!(
                batches() - before,
                1,
                "the outsiders rode on the one commit"
            );
        }
        // Waiting at shutdown: committed before the writer stops.
        let last = engine
            .submit(ev(7), Instant::now(), Origin::Client, (false, true))
            .unwrap();
        engine.shutdown();
        assert!(matches!(
            last.blocking_recv().unwrap(),
            Ok(WriteOutcome::Stored { .. })
        ));
    }

    #[test]
    fn health_judges_each_part() {
        let ok = HealthInputs {
            shutting_down: false,
            writer_alive: true,
            monitor_running: true,
            now_ns: 10_000_000_000,
            last_tick_ns: 9_900_000_000,
            tick_ns: 100_000_000,
            stats_ok: true,
        };
        assert_eq!(judge(ok), Ok(()));
        let down = HealthInputs {
            shutting_down: true,
            ..ok
        };
        assert_eq!(judge(down), Err(Unready::ShuttingDown));
        let writer = HealthInputs {
            writer_alive: false,
            ..ok
        };
        assert_eq!(judge(writer), Err(Unready::WriterStopped));
        let monitor = HealthInputs {
            monitor_running: false,
            ..ok
        };
        assert_eq!(judge(monitor), Err(Unready::MonitorStopped));
        // Ten ticks of 100 ms is under the 2 s floor: still fine at 1.9 s.
        let late = HealthInputs {
            last_tick_ns: ok.now_ns - 1_900_000_000,
            ..ok
        };
        assert_eq!(judge(late), Ok(()));
        let stalled = HealthInputs {
            last_tick_ns: ok.now_ns - 2_500_000_000,
            ..ok
        };
        assert_eq!(judge(stalled), Err(Unready::MonitorStalled(2500)));
        // A slow tick setting: ten of its ticks.
        let slow = HealthInputs {
            tick_ns: 1_000_000_000,
            ..stalled
        };
        assert_eq!(judge(slow), Ok(()));
        let stats = HealthInputs {
            stats_ok: false,
            ..ok
        };
        assert_eq!(judge(stats), Err(Unready::StoreStats));
        assert_eq!(
            Unready::WriterStopped.to_string(),
            "writer stopped",
            "the /readyz body names it"
        );
    }

    /// A real event: the first line of the shared fixture.
    fn note() -> Event {
        let fixture = include_str!("../../../tests/fixtures/real-events.jsonl");
        Event::parse(fixture.lines().next().unwrap()).unwrap()
    }
}
