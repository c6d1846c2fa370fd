//! The writer thread: its loop, and the lanes a batch is split into
//! (outsiders wait for a commit to ride on, lone events go first).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use sluice_store::Store;

use super::cap::BatchCap;
use super::msg::{Msg, OUTSIDERS_WAIT, Request};
use super::signals::{CommitCost, WriterSignals};
use crate::config::EngineConfig;
use metrics::{Gauge, Histogram};

use crate::handles::{Handle, LabelledCounter};
use crate::health::DiskGate;
use crate::live::LiveHub;
use crate::metrics_names as m;
use crate::mirror_tap::MirrorTaps;
use crate::retention::Retainer;

/// A batch larger than this commits its lone events first, apart.
const LONE_AHEAD_OF: usize = 8;

pub(super) struct Writer {
    pub(super) signals: Arc<WriterSignals>,
    pub(super) store: Store,
    pub(super) cfg: EngineConfig,
    pub(super) live: Arc<LiveHub>,
    pub(super) tap: Arc<crate::replica::Tap>,
    pub(super) mirrors: Arc<MirrorTaps>,
    pub(super) trust: Arc<crate::trust::Trust>,
    /// The NIP-50 indexer, rung after each commit that stored events.
    pub(super) search: Arc<crate::search::SearchSlot>,
    pub(super) rx: Receiver<Msg>,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) bulk_cost: CommitCost,
    pub(super) retainer: Retainer,
    pub(super) disk: Arc<DiskGate>,
    /// Outsiders' events waiting for a commit to ride on, and since when.
    pub(super) outsiders: Vec<Request>,
    pub(super) outsiders_since: Option<Instant>,
    /// Events taken from the queue beyond the last commit's cap, oldest
    /// first (at most `max_batch_events`; still counted as queued).
    pub(super) carry: Vec<Request>,
    pub(super) cap: BatchCap,
    pub(super) metrics: WriterMetrics,
}

/// The series the writer records per batch and per event, their handles
/// looked up once ([`crate::handles`]).
pub(super) struct WriterMetrics {
    pub(super) queue_wait: Handle<Histogram>,
    pub(super) batch_events: Handle<Histogram>,
    pub(super) commit: Handle<Histogram>,
    pub(super) queue_events: Handle<Gauge>,
    pub(super) batch_cap: Handle<Gauge>,
    pub(super) outcomes: LabelledCounter,
}

impl Default for WriterMetrics {
    fn default() -> WriterMetrics {
        WriterMetrics {
            queue_wait: Handle::histogram(m::WRITER_QUEUE_WAIT_SECONDS),
            batch_events: Handle::histogram(m::WRITER_BATCH_EVENTS),
            commit: Handle::histogram(m::WRITER_COMMIT_SECONDS),
            queue_events: Handle::gauge(m::WRITER_QUEUE_EVENTS),
            batch_cap: Handle::gauge(m::WRITER_BATCH_CAP_EVENTS),
            outcomes: LabelledCounter::new(m::EVENTS_WRITTEN_TOTAL, "outcome"),
        }
    }
}

/// What the writer's loop keeps between turns.
pub(super) struct Turns {
    /// A message taken while filling a batch, handled next.
    pub(super) held: Option<Msg>,
    next_purge: Instant,
    purge_every: Duration,
}

impl Turns {
    pub(super) fn new(cfg: &EngineConfig) -> Turns {
        let purge_every = Duration::from_millis(cfg.expiry_purge_interval_ms);
        Turns {
            held: None,
            next_purge: Instant::now() + purge_every,
            purge_every,
        }
    }
}

impl Writer {
    pub(super) fn run(mut self) {
        let mut turns = Turns::new(&self.cfg);
        while self.turn(&mut turns) {}
        let mut held = turns.held;
        // Commit whatever is still queued so every accepted event lands.
        loop {
            let msg = match held.take() {
                Some(msg) => msg,
                None => match self.rx.try_recv() {
                    Ok(msg) => msg,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                },
            };
            if !matches!(msg, Msg::Write(_)) {
                self.commit_all_carried();
            }
            self.handle(msg, &mut held);
        }
        self.commit_all_carried();
        while !self.outsiders.is_empty() {
            self.flush_outsiders();
        }
        tracing::info!("writer stopped");
    }

    /// One turn of the loop: the next message, the events carried past the
    /// last commit's cap, or upkeep when idle; then upkeep that is due.
    /// Returns false when the writer is to stop.
    pub(super) fn turn(&mut self, t: &mut Turns) -> bool {
        let msg = match t.held.take() {
            // Events taken before a bulk batch or an operator's operation
            // are committed before it.
            Some(msg) if !self.carry.is_empty() && !matches!(msg, Msg::Write(_)) => {
                t.held = Some(msg);
                None
            }
            Some(msg) => Some(msg),
            // Events carried past the last commit's cap: whatever was
            // queued since joins them (a lone event goes first).
            None if !self.carry.is_empty() => self.rx.try_recv().ok(),
            None => {
                // Retention work pending: look at the queue without
                // waiting, and take one step when it is empty. While the
                // disk gate is closed retention waits too (it cannot
                // commit either): look again in a second.
                let due = match self.disk.refusal() {
                    Some(_) => Some(Instant::now() + Duration::from_secs(1)),
                    None => self.retainer.next_due(),
                };
                let wait = match due {
                    None => Duration::ZERO,
                    Some(due) => due
                        .min(t.next_purge)
                        .min(self.outsiders_due())
                        .saturating_duration_since(Instant::now()),
                };
                match self.rx.recv_timeout(wait) {
                    Ok(msg) => Some(msg),
                    Err(RecvTimeoutError::Disconnected) => return false,
                    Err(RecvTimeoutError::Timeout) => {
                        if Instant::now() >= self.outsiders_due() {
                            self.flush_outsiders();
                        }
                        self.purge_expired_if_due(t);
                        self.retention_step();
                        return true;
                    }
                }
            }
        };
        match msg {
            Some(msg) => {
                if !self.handle(msg, &mut t.held) {
                    return false;
                }
            }
            None => {
                let batch = std::mem::take(&mut self.carry);
                self.commit_batch(batch);
            }
        }
        self.purge_expired_if_due(t);
        // At most one bounded step between client batches, paced, and none
        // while size eviction rides on them (an empty queue steps at once).
        if self.retainer.step_between_batches() {
            self.retention_step();
        }
        true
    }

    /// Purges expired events if their time has come, and sets the next
    /// purge `engine.expiry_purge_interval_ms` later (when idle, and after
    /// each message).
    fn purge_expired_if_due(&self, t: &mut Turns) {
        if Instant::now() >= t.next_purge {
            self.purge_expired();
            t.next_purge = Instant::now() + t.purge_every;
        }
    }

    /// Writes what `msg` asks for. Returns false for a shutdown request.
    pub(super) fn handle(&mut self, msg: Msg, held: &mut Option<Msg>) -> bool {
        match msg {
            Msg::Write(first) => {
                let mut batch = std::mem::take(&mut self.carry);
                batch.push(first);
                *held = self.fill(&mut batch);
                self.commit_batch(batch);
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

    /// Commits what `batch` holds that is due: lone events first, apart;
    /// then at most the cap's worth of the rest, with the outsiders
    /// waiting in the room left. What is beyond the cap is carried to the
    /// next commit.
    pub(super) fn commit_batch(&mut self, mut batch: Vec<Request>) {
        // Outsiders wait for a commit to ride on: the next one of anyone
        // else's events, or their own once the oldest has waited
        // OUTSIDERS_WAIT (or a batch's worth is waiting).
        if batch.iter().any(|r| r.outsider) {
            let (outsiders, rest): (Vec<Request>, Vec<Request>) =
                batch.into_iter().partition(|r| r.outsider);
            if self.outsiders.is_empty() {
                self.outsiders_since = Some(Instant::now());
            }
            self.outsiders.extend(outsiders);
            batch = rest;
            if batch.is_empty() {
                let full = self.outsiders.len() >= self.cfg.max_batch_events;
                if full || Instant::now() >= self.outsiders_due() {
                    self.flush_outsiders();
                }
                return;
            }
        }
        // Lone events (a connection with nothing else awaiting an OK) in a
        // large batch of pipelined ones are committed first, in a small
        // transaction of their own: a person posting beside a bulk writer
        // waits for one small commit, not for the bulk writer's batch.
        if batch.len() > LONE_AHEAD_OF && batch.iter().any(|r| r.lone) {
            let (lone, rest): (Vec<Request>, Vec<Request>) =
                batch.into_iter().partition(|r| r.lone);
            if !rest.is_empty() {
                self.write(lone, true);
                batch = rest;
            } else {
                batch = lone;
            }
        }
        let cap = self.cap();
        if batch.len() > cap {
            self.carry = batch.split_off(cap);
        }
        let room = cap.saturating_sub(batch.len()).min(self.outsiders.len());
        if room > 0 {
            batch.extend(self.outsiders.drain(..room));
            if self.outsiders.is_empty() {
                self.outsiders_since = None;
            }
        }
        self.write(batch, false);
    }

    /// Commits every event carried past the caps, a cap's worth at a time
    /// (at shutdown, and before what was queued after them).
    fn commit_all_carried(&mut self) {
        while !self.carry.is_empty() {
            let batch = std::mem::take(&mut self.carry);
            self.commit_batch(batch);
        }
    }

    /// Most client events the next commit takes.
    pub(super) fn cap(&self) -> usize {
        self.cap
            .get(self.retainer.rides(), self.cfg.max_batch_events)
    }

    /// When the oldest waiting outsider's event is due for a commit of its
    /// own (far off when none waits).
    pub(super) fn outsiders_due(&self) -> Instant {
        match self.outsiders_since {
            Some(t) => t + OUTSIDERS_WAIT,
            None => Instant::now() + Duration::from_secs(3600),
        }
    }

    /// Commits the outsiders' events waiting, at most the cap's worth;
    /// the rest stay due.
    pub(super) fn flush_outsiders(&mut self) {
        let cap = self.cap();
        let rest = match self.outsiders.len() > cap {
            true => self.outsiders.split_off(cap),
            false => Vec::new(),
        };
        let batch = std::mem::replace(&mut self.outsiders, rest);
        if self.outsiders.is_empty() {
            self.outsiders_since = None;
        }
        if !batch.is_empty() {
            self.write(batch, false);
        }
    }
}
