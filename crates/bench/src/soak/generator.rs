//! Producing the events: the generator thread signs the writers' events a
//! batch at a time, a bounded channel ahead of them; each polite client's
//! producer signs one note at a time. Both tell the tracker what each event
//! is before it is handed on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_proto::Event;
use tokio::sync::mpsc;

use super::ledger::Tracker;
use super::mix::{Budget, Meta, Mix, prepared};
use crate::generate::{Spec, sign_parallel};
use crate::wire::Prepared;

/// Events signed per batch by the generator thread.
const BATCH_EVENTS: usize = 256;

/// What the generator has produced so far.
#[derive(Default)]
pub(super) struct Produced {
    events: AtomicU64,
    bytes: AtomicU64,
}

impl Produced {
    pub(super) fn progress(&self, budget: &Budget) -> f64 {
        budget.progress(
            self.events.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed) as f64,
        )
    }
}

pub(super) struct Generator {
    pub(super) mix: Mix,
    pub(super) budget: Budget,
    pub(super) threads: usize,
    pub(super) tx: mpsc::Sender<Prepared>,
    pub(super) tracker: Arc<Tracker>,
    pub(super) produced: Arc<Produced>,
    pub(super) stop: Arc<AtomicBool>,
}

impl Generator {
    /// Signs batches and hands them to the writers until the budget is
    /// reached, `stop` is set, or the writers are gone.
    pub(super) fn run(mut self) {
        let (mut events, mut bytes) = (0u64, 0u64);
        while !self.stop.load(Ordering::Relaxed) && !self.budget.reached(events, bytes) {
            let n = self.budget.events.map_or(BATCH_EVENTS, |max| {
                (max - events).min(BATCH_EVENTS as u64) as usize
            });
            let mut estimate = bytes as f64;
            let (specs, metas): (Vec<Spec>, Vec<Meta>) = (0..n)
                .map(|i| {
                    let p = self.budget.progress(events + i as u64, estimate);
                    let (spec, meta) = self.mix.spec(p);
                    estimate += f64::from(meta.bytes);
                    (spec, meta)
                })
                .unzip();
            let signed = sign_parallel(specs, self.threads);
            let mut batch = Vec::with_capacity(n);
            for (ev, mut meta) in signed.iter().zip(metas) {
                if self.budget.reached(events, bytes) {
                    break;
                }
                meta.bytes = ev.raw().len() as u32;
                self.mix.remember(ev);
                events += 1;
                bytes += u64::from(meta.bytes);
                batch.push((prepared(ev), meta));
            }
            self.tracker.expect(batch.iter().map(|(p, m)| (p.id, *m)));
            self.produced.events.store(events, Ordering::Relaxed);
            self.produced.bytes.store(bytes, Ordering::Relaxed);
            for (p, _) in batch {
                if self.tx.blocking_send(p).is_err() {
                    return; // the writers are gone
                }
            }
        }
    }
}

/// Feeds one polite client: a kind 1 note dated now (a person posting, not
/// a backfill), one at a time, until `done`.
pub(super) async fn polite_producer(
    mut mix: Mix,
    tx: mpsc::Sender<Prepared>,
    tracker: Arc<Tracker>,
    produced: Arc<Produced>,
    budget: Budget,
    done: Arc<AtomicBool>,
) {
    while !done.load(Ordering::Relaxed) {
        let (spec, mut meta) = mix.spec(produced.progress(&budget));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        meta.created_at = now;
        let ev = Event::sign(&spec.secret_key, now, spec.kind, spec.tags, &spec.content);
        meta.bytes = ev.raw().len() as u32;
        mix.remember(&ev);
        let p = prepared(&ev);
        tracker.expect([(p.id, meta)]);
        if tx.send(p).await.is_err() {
            return;
        }
    }
}
