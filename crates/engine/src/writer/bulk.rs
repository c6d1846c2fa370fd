//! Bulk mode: a whole ordered batch from the import, written alone in one
//! transaction.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sluice_store::{StoreError, WriteOutcome};

use super::commit::{count_outcome, report_failure};
use super::msg::Bulk;
use super::thread::Writer;
use crate::clock::unix_now;
use crate::live::LiveEvent;

#[expect(
    clippy::disallowed_methods,
    reason = "the writer thread is the store's one writer (clippy.toml)"
)]
impl Writer {
    /// Writes a bulk batch alone in one transaction, fans the stored
    /// events out (when anyone listens), then answers.
    pub(super) fn write_bulk(&mut self, bulk: Bulk) {
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
        // Every event of the batch waited as long: one call for all.
        self.metrics
            .queue_wait
            .get()
            .record_many(waited.as_secs_f64(), n);
        self.signals
            .max_wait_ns
            .fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
        self.metrics.batch_events.get().record(n as f64);
        let result = self
            .store
            .write_batch_ruled(bulk.events.iter(), unix_now(), &plan.rules);
        let commit = started.elapsed();
        self.metrics.commit.get().record(commit.as_secs_f64());
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
        for o in &outcomes {
            count_outcome(&self.metrics.outcomes, o);
        }
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
                    WriteOutcome::Stored { serial, .. } => {
                        Some(Arc::new(LiveEvent::new(Some(*serial), Arc::new(event))))
                    }
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
}
