//! The query workers: one step of a query at a time on the store, its
//! answer delivered, its cost settled.

use parking_lot::MutexGuard;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use sluice_store::{EventChunk, StepLimits};
use sluice_throttle::room;
use sluice_throttle::{AfterStep, StepFate};

use super::sink::{Credit, CreditPermit, ReadEnd, ReadMsg};
use super::{Body, EXPIRY_CHECK, Inner, State, Work};
use crate::mailbox::{Mailbox, SendError};
use crate::metrics_names as m;

/// What one step produced.
pub(super) struct StepResult {
    events: EventChunk,
    rows: u64,
    bytes: u64,
    end: Option<ReadEnd>,
}

impl Inner {
    /// The scheduler's lock (`parking_lot`'s: a panic while it was held
    /// does not stop every reader after it).
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    pub(super) fn run_worker(self: Arc<Self>) {
        let mut st = self.lock();
        loop {
            if st.stopping {
                return;
            }
            let expired = self.throttle.checks(|c| c.expire(&mut st.sched));
            for id in expired {
                if let Some(body) = st.bodies.remove(&id) {
                    room::give_back(&mut st.bodies);
                    let refusal = self.throttle.checks(|c| c.timed_out(&st.sched));
                    let _ = body.sink_home.sink().queue.try_send(Box::new(ReadMsg {
                        job: id,
                        events: EventChunk::new(),
                        end: Some(ReadEnd::Refused(refusal)),
                        settle_units: 0,
                        _credit: None,
                    }));
                    drop(st);
                    self.finish(body, false);
                    st = self.lock();
                }
            }
            let Some(id) = st.sched.dispatch_next() else {
                // Nothing runnable: sleep until a submit or a returned
                // credit wakes us (or, with queries waiting, until the next
                // deadline check).
                if st.sched.stats().queued == 0 {
                    self.work.wait(&mut st);
                } else {
                    self.work.wait_for(&mut st, EXPIRY_CHECK);
                }
                continue;
            };
            let body = st.bodies.remove(&id);
            // A crowd's bodies gone, their table gives its room back.
            room::give_back(&mut st.bodies);
            let Some(mut body) = body else {
                // Cannot happen: a queued query always has its body.
                tracing::error!(job = id, "query without its work");
                st.sched.step_done(id, 0, 0, AfterStep::Finished);
                continue;
            };
            let Some(permit) = CreditPermit::try_take(&body.sink_home) else {
                // The client has not read what it was sent: wait for it
                // without a worker.
                match st.sched.step_done(id, 0, 0, AfterStep::Park) {
                    StepFate::Removed => {
                        drop(st);
                        self.finish(body, false);
                        st = self.lock();
                    }
                    _ => {
                        st.bodies.insert(id, body);
                    }
                }
                continue;
            };
            let limits = StepLimits {
                rows: st.cfg.step_rows,
                bytes: st.cfg.step_bytes,
            };
            let cost = st.cfg.cost;
            if !body.started {
                body.started = true;
                let waited = body.admitted.elapsed();
                st.max_wait_ns = st.max_wait_ns.max(waited.as_nanos() as u64);
                self.series.wait_seconds.get().record(waited.as_secs_f64());
            }
            drop(st);

            let started = Instant::now();
            let result = catch_unwind(AssertUnwindSafe(|| self.step(&mut body.work, limits)))
                .unwrap_or_else(|_| {
                    tracing::error!(job = id, "query step panicked");
                    Err(())
                });
            let took = started.elapsed();
            body.work_ns += took.as_nanos() as u64;
            self.series.step_seconds.get().record(took.as_secs_f64());
            let step = result.unwrap_or_else(|()| StepResult {
                events: EventChunk::new(),
                rows: 0,
                bytes: 0,
                end: Some(ReadEnd::Failed),
            });
            let done = step.end.is_some();
            let units = cost.step(step.rows, step.bytes);
            body.spent += units;
            self.series.rows_scanned.get().increment(step.rows);
            self.series.sent_bytes.get().increment(step.bytes);
            self.series.events.get().increment(step.events.len() as u64);
            self.series.cost_units.increment("spent", units);
            let settle = settle(&mut body, done);
            self.throttle.settle_read_cost(&body.who, settle);
            body.unsent_settle += settle;
            let quiet = step.events.is_empty() && step.end.is_none();
            if quiet {
                // Nothing for the client yet (a sparse scan, a COUNT under
                // way): no message; the credit goes straight back, and the
                // sink's parked queries may use it (below, under the lock).
                drop(permit);
            } else {
                let msg = ReadMsg {
                    job: id,
                    events: step.events,
                    end: step.end,
                    settle_units: std::mem::take(&mut body.unsent_settle),
                    _credit: Some(Credit {
                        permit: Some(permit),
                        inner: self.clone(),
                        sink: body.sink,
                    }),
                };
                deliver(&body.sink_home.sink().queue, msg);
            }

            st = self.lock();
            if quiet {
                st.sched.unpark(body.sink);
                if st.sched.stats().queued > 1 {
                    self.work.notify_one();
                }
            }
            let after = if done {
                AfterStep::Finished
            } else if body.sink_home.sink().credits_left() > 0 {
                AfterStep::Continue
            } else {
                AfterStep::Park
            };
            match st.sched.step_done(id, units, took.as_nanos() as u64, after) {
                StepFate::Removed => {
                    drop(st);
                    self.finish(body, done);
                    st = self.lock();
                }
                StepFate::Queued | StepFate::Parked => {
                    st.bodies.insert(id, body);
                }
            }
        }
    }

    /// Runs one step of a query on the store.
    pub(super) fn step(&self, work: &mut Work, limits: StepLimits) -> Result<StepResult, ()> {
        let fail = |e: sluice_store::StoreError| {
            tracing::warn!(error = %e, "query failed");
        };
        match work {
            Work::Query(cur) => {
                let mut events = self.chunk();
                let did = self
                    .store
                    .query_step(cur, limits, &mut events)
                    .map_err(fail)?;
                let end = did.done.then(|| {
                    if cur.truncated() {
                        metrics::counter!(m::QUERY_TRUNCATED_TOTAL).increment(1);
                    }
                    ReadEnd::Eose {
                        snapshot_serial: cur.snapshot_serial().unwrap_or(1),
                        truncated: cur.truncated(),
                    }
                });
                Ok(StepResult {
                    events,
                    rows: did.rows,
                    bytes: did.bytes,
                    end,
                })
            }
            Work::Search(cur) => {
                let mut events = self.chunk();
                let did = cur
                    .step(&self.store, limits, &mut events)
                    .map_err(|e| tracing::warn!(error = %e, "search failed"))?;
                let end = did.done.then(|| {
                    if cur.truncated() {
                        metrics::counter!(m::QUERY_TRUNCATED_TOTAL).increment(1);
                    }
                    if cur.counting() {
                        ReadEnd::Count {
                            count: cur.count(),
                            truncated: cur.truncated(),
                        }
                    } else {
                        ReadEnd::Eose {
                            snapshot_serial: cur.snapshot_serial().unwrap_or(1),
                            truncated: cur.truncated(),
                        }
                    }
                });
                Ok(StepResult {
                    events,
                    rows: did.rows,
                    bytes: did.bytes,
                    end,
                })
            }
            Work::Count(cur) => {
                let did = self.store.count_step(cur, limits).map_err(fail)?;
                let end = did.done.then(|| {
                    if cur.truncated() {
                        metrics::counter!(m::QUERY_TRUNCATED_TOTAL).increment(1);
                    }
                    ReadEnd::Count {
                        count: cur.count(),
                        truncated: cur.truncated(),
                    }
                });
                Ok(StepResult {
                    events: EventChunk::new(),
                    rows: did.rows,
                    bytes: 0,
                    end,
                })
            }
        }
    }

    /// A query left the scheduler: settle what it was charged against what
    /// it cost (an unfinished query is refunded its unspent estimate).
    pub(super) fn finish(&self, mut body: Body, completed: bool) {
        let refund = settle(&mut body, true);
        self.throttle.settle_read_cost(&body.who, refund);
        if completed || body.work_ns > 0 {
            self.series
                .query_seconds
                .get()
                .record(body.work_ns as f64 / 1e9);
        }
    }
}

/// Hands a message to its session's sink. It never waits: the sink has
/// room for every credited chunk and one end per open query.
fn deliver(tx: &Mailbox<Box<ReadMsg>, 0>, msg: ReadMsg) {
    let job = msg.job;
    if let Err(e) = tx.try_send(Box::new(msg)) {
        if matches!(e, SendError::Full(_)) {
            metrics::counter!(m::QUERY_ANSWERS_DROPPED_TOTAL).increment(1);
            tracing::warn!(job, "query answer dropped: the session's sink is full");
        }
        // Dropping the message returns its credit (outside the lock).
        drop(e);
    }
}

/// Brings `charged` to `spent`: returns the units to charge (positive) or,
/// at the end, to refund (negative).
fn settle(body: &mut Body, at_end: bool) -> i64 {
    if body.spent > body.charged {
        let extra = body.spent - body.charged;
        body.charged = body.spent;
        i64::try_from(extra).unwrap_or(i64::MAX)
    } else if at_end && body.charged > body.spent {
        let back = body.charged - body.spent;
        body.charged = body.spent;
        -i64::try_from(back).unwrap_or(i64::MAX)
    } else {
        0
    }
}
