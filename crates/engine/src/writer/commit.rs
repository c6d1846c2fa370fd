//! Group commit: a batch of client events written in one transaction,
//! then handed to live subscribers, the taps and the senders.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TryRecvError;
use std::time::{Duration, Instant};

use sluice_store::{StoreError, WriteOutcome};

use super::msg::{Msg, Request, WriteError};
use super::thread::Writer;
use crate::clock::unix_now;
use crate::handles::LabelledCounter;
use crate::live::LiveEvent;
use crate::metrics_names as m;
use crate::mirror_tap::Origin;

#[expect(
    clippy::disallowed_methods,
    reason = "the writer thread is the store's one writer (clippy.toml)"
)]
impl Writer {
    /// Adds queued events to `batch` up to the batch bounds. Returns the
    /// message that ended the batch early (a bulk batch or a shutdown), to
    /// be handled next.
    pub(super) fn fill(&self, batch: &mut Vec<Request>) -> Option<Msg> {
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

    /// Writes a batch in one transaction; while size eviction runs it
    /// rides on it unless `lone_first` (the lone events a large batch
    /// commits first, apart: their commit stays small).
    pub(super) fn write(&mut self, batch: Vec<Request>, lone_first: bool) {
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
        let mut max_wait = Duration::ZERO;
        for r in &batch {
            let w = started.duration_since(r.enqueued);
            max_wait = max_wait.max(w);
            self.metrics.queue_wait.get().record(w.as_secs_f64());
        }
        self.signals
            .max_wait_ns
            .fetch_max(max_wait.as_nanos() as u64, Ordering::Relaxed);
        self.metrics.batch_events.get().record(batch.len() as f64);
        // While size eviction runs, it rides on the batch's transaction.
        let evicting = self.retainer.rides() && !lone_first;
        let result = if evicting {
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
        self.metrics.commit.get().record(commit.as_secs_f64());
        if !lone_first {
            self.cap.record(evicting, batch.len(), commit);
            self.metrics.batch_cap.get().set(self.cap() as f64);
        }
        self.signals
            .max_commit_ns
            .fetch_max(commit.as_nanos() as u64, Ordering::Relaxed);
        self.signals.batches.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .queue_events
            .get()
            .set(self.queued.load(Ordering::Relaxed) as f64);
        match result {
            Ok(outcomes) => {
                // Committed: live subscribers first (so an OK means the
                // event is queued to every matching connection), then the
                // OKs.
                let stored: Vec<Arc<LiveEvent>> = batch
                    .iter()
                    .zip(&outcomes)
                    .filter_map(|(r, outcome)| match outcome {
                        WriteOutcome::Stored { serial, .. } => {
                            Some(Arc::new(LiveEvent::new(Some(*serial), r.event.clone())))
                        }
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
                    count_outcome(&self.metrics.outcomes, &outcome);
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
}

pub(super) fn count_outcome(outcomes: &LabelledCounter, o: &WriteOutcome) {
    outcomes.increment(outcome_label(o), 1);
}

/// Logs and counts a batch that did not commit.
pub(super) fn report_failure(e: &StoreError, events: usize) {
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
