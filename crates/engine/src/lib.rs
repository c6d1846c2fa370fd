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

pub mod access;
pub mod clock;
pub mod config;
pub mod gauge;
pub mod handles;
pub mod health;
pub mod limiter;
pub mod live;
pub mod mailbox;
pub mod metrics_names;
pub mod mirror_tap;
mod monitor;
pub mod process;
pub mod reads;
mod replica;
pub mod retention;
mod search;
pub mod trust;
pub mod writer;

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use sluice_proto::Event;
use sluice_store::{Store, WriteOutcome};
use sluice_throttle::ThrottleConfig;
use tokio::sync::oneshot;

use crate::access::{Access, PolicyConfig};
use crate::config::EngineConfig;
use crate::health::{DiskGate, HealthInputs, ThreadExit, Unready, judge};
use crate::limiter::Limiter;
use crate::live::{LiveConn, LiveEvent, LiveHub};
use crate::mirror_tap::{MirrorTap, Origin};
use crate::reads::Reads;
use crate::retention::RetentionPlan;
use crate::writer::{AdminDone, AdminOp, Backlog, BulkError, BulkTicket, SubmitError, WriteResult};

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

/// The running core. Shared by reference (`Arc<Engine>`) among sessions.
pub struct Engine {
    store: Store,
    cfg: EngineConfig,
    writer: writer::WriterHandle,
    live: Arc<LiveHub>,
    throttle: Arc<Limiter>,
    reads: Reads,
    monitor: monitor::MonitorHandle,
    shutting_down: AtomicBool,
    policy: Access,
    /// The write-policy plugin, once `load_policy` started it.
    plugin: std::sync::OnceLock<Arc<access::Plugin>>,
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
        let throttle = Limiter::new(throttle);
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
            policy: Access::default(),
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

    pub fn limiter(&self) -> &Arc<Limiter> {
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

    /// Applies `[trust]` and `[pow]` (at start, and in a standalone
    /// mirror): [`Engine::prepare_trust`] with the tiers in force, then
    /// [`Engine::commit_trust`]. On error nothing changes.
    pub fn set_trust(
        &self,
        trust: sluice_throttle::TrustConfig,
        pow: sluice_throttle::PowConfig,
    ) -> Result<(), StartError> {
        let tiers = self.throttle.config().tiers;
        let prepared = self.prepare_trust(trust, pow, &tiers)?;
        self.commit_trust(prepared);
        Ok(())
    }

    /// Prepares `[trust]` and `[pow]` (validated) with `tiers` (the
    /// `[throttle.tiers]` that will be in force), changing nothing: when
    /// the web must be read again, its thread is started here, waiting to
    /// be told to read; the one error (the system will not start it) is
    /// here, not in [`Engine::commit_trust`]. Dropped unapplied, that
    /// thread ends.
    pub fn prepare_trust(
        &self,
        trust: sluice_throttle::TrustConfig,
        pow: sluice_throttle::PowConfig,
        tiers: &sluice_throttle::TiersConfig,
    ) -> Result<trust::PreparedTrust, StartError> {
        let settings = trust::TrustSettings::new(trust, pow, tiers);
        self.trust.prepare(settings, &self.store)
    }

    /// Applies what [`Engine::prepare_trust`] prepared (cannot fail): the
    /// outsiders' budget, the settings, and the new web's thread, which
    /// reads the store from here on (the old web serving until it has).
    pub fn commit_trust(&self, prepared: trust::PreparedTrust) {
        self.throttle
            .set_outsider_rate(prepared.settings().trust.outsider_events_per_s);
        self.trust.commit(prepared);
    }

    /// The web of trust and the proof-of-work difficulty.
    pub fn trust(&self) -> &Arc<trust::Trust> {
        &self.trust
    }

    /// Opens the NIP-50 index in `store.path/search/` and starts its
    /// indexer thread, which catches up with the store from the serial of
    /// its last commit. Once per engine; `[search] enabled = false` starts
    /// nothing. `workers`: tantivy's indexing threads.
    pub fn start_search(
        &self,
        cfg: sluice_search::SearchConfig,
        workers: sluice_search::Workers,
    ) -> Result<(), StartError> {
        if !cfg.enabled {
            return Ok(());
        }
        let dir = self.store.path().join(sluice_search::INDEX_DIR);
        let index = sluice_search::SearchIndex::open(&dir, cfg)?;
        let indexer = sluice_search::Indexer::start(index.clone(), self.store.clone(), workers)?;
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

    /// Applies a reloaded `[throttle]` section: [`Engine::prepare_throttle`],
    /// then [`Engine::commit_throttle`]. On error nothing changes.
    pub fn reload_throttle(&self, cfg: ThrottleConfig) -> Result<(), String> {
        let prepared = self.prepare_throttle(cfg)?;
        self.commit_throttle(prepared);
        Ok(())
    }

    /// Checks a reloaded `[throttle]` section (SIGHUP) against everything
    /// [`Engine::commit_throttle`] will do with it, changing nothing: the
    /// buckets' part as they check it ([`Limiter::prepare_reload`]) and
    /// the query scheduler's as the scheduler checks it (on one of its
    /// own, empty).
    pub fn prepare_throttle(&self, cfg: ThrottleConfig) -> Result<limiter::PreparedReload, String> {
        sluice_throttle::FairQueue::<u64>::new(cfg.queries.clone())
            .map_err(|e| format!("[throttle.queries]: {e}"))?;
        self.throttle.prepare_reload(cfg)
    }

    /// Applies a section [`Engine::prepare_throttle`] checked (cannot fail):
    /// the query scheduler's bounds, then buckets and modes.
    pub fn commit_throttle(&self, prepared: limiter::PreparedReload) {
        let queries = prepared.config().queries.clone();
        if let Err(e) = self.reads.reload(queries) {
            // Checked by `prepare_throttle` as the scheduler checks it.
            tracing::error!(error = %e, "query scheduler refused a checked config: keeping its old one");
        }
        self.throttle.commit_reload(prepared);
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
        self.live.publish(&[Arc::new(LiveEvent::new(None, event))]);
        metrics::counter!(metrics_names::LIVE_PUBLISHED_TOTAL).increment(1);
    }

    /// Sets (`Some`) or clears (`None`) a note /readyz shows beside
    /// "ready" (a degraded but serving condition).
    pub fn set_note(&self, source: &'static str, note: Option<String>) {
        let mut notes = self.notes.lock();
        match note {
            Some(n) => notes.insert(source, n),
            None => notes.remove(source),
        };
    }

    /// The notes set by [`Engine::set_note`], one `source: note` each.
    pub fn notes(&self) -> Vec<String> {
        let notes = self.notes.lock();
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
    pub fn policy(&self) -> &Access {
        &self.policy
    }

    /// Loads `cfg` and the store's runtime policy entries (read by the
    /// writer thread), and starts the write-policy plugin if one is
    /// configured (once, on the calling tokio runtime).
    pub async fn load_policy(&self, cfg: PolicyConfig) -> Result<(), BulkError> {
        if let Some(p) = access::Plugin::start(&cfg.plugin) {
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
    pub fn plugin(&self) -> Option<Arc<access::Plugin>> {
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
        self.live.publish(&[Arc::new(LiveEvent::new(None, event))]);
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
mod tests;
