//! The read path at run time: query workers that run the fair scheduler's
//! steps on the store, the sinks that carry answers to sessions, and the
//! guards that give back everything a query holds.
//!
//! Flow: a session opens one [`ReadSink`] and submits REQs and COUNTs
//! through [`Reads::submit_query`] / [`Reads::submit_count`]: the query's
//! cost is estimated from its plan and charged to the IP's and the
//! connection's read budgets, then the fair scheduler (`sluice_throttle::
//! fair`) admits it or refuses it at once, weighing it by the same
//! estimate. `throttle.queries.slots` worker
//! threads take steps from the scheduler; each step opens its own read
//! transaction, reads at most `step_rows` rows, returns at most
//! `step_bytes` of events, and sends them as one [`ReadMsg`] to the sink.
//!
//! Bounds, and who loses when they fill:
//! - the scheduler's bounds (estimated cost open per client and in all,
//!   `max_open_units_per_client` and `max_open_units`; queries waiting,
//!   `max_queued_per_client` and `max_queued`) and deadline: the new query
//!   is answered `CLOSED rate-limited:`;
//! - a sink holds at most `chunks_per_connection` answer chunks: a query
//!   whose client has not read them is parked without a worker (the slow
//!   reader waits, nobody else); a sink's channel also has room for one
//!   final message per open query, so finishing never blocks a worker.
//!
//! Ownership (the guard invariant): a query is counted by the scheduler
//! from admission until it finishes or its [`ReadGuard`] is dropped. The
//! guard's drop cancels it under the scheduler's lock: a queued or parked
//! query leaves at once, a running one when its step reports. No `.await`
//! sits between a count and its guard, every step reports (a panicking
//! step is caught and reported as a failure), and a chunk's credit is
//! returned by dropping the message, wherever that happens.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_proto::{Filter, Readers};
use sluice_search::{SearchCursor, SearchIndex};
use sluice_store::{
    CountCursor, PlanShape, QueryCursor, QueryOptions, StepLimits, Store, plan_shape,
};
use sluice_throttle::room;
use sluice_throttle::{
    AfterStep, ClientKey, FairQueue, FairStats, FilterShape, JobId, Principal, RateLimited,
    StepFate,
};
use tokio::sync::Semaphore;

use crate::mailbox::{Mailbox, SendError};
use crate::metrics_names as m;
use crate::throttle::{ConnReadBudget, QueriesConfig, Throttle};
use crate::{QueryError, unix_now};

/// How often an idle worker wakes to drop queries past their deadline.
const EXPIRY_CHECK: Duration = Duration::from_millis(20);

/// The query workers and their scheduler. One per engine.
pub struct Reads {
    inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    state: Mutex<State>,
    work: Condvar,
    store: Store,
    throttle: Arc<Throttle>,
    max_scan_rows: u64,
    max_count_rows: u64,
    /// The NIP-50 index, once started: REQs and COUNTs with a `search`
    /// run on it.
    search: Arc<crate::search::SearchSlot>,
}

struct State {
    sched: FairQueue<ClientKey>,
    cfg: QueriesConfig,
    /// Queries' work, keyed by id; absent while a worker runs its step.
    bodies: HashMap<JobId, Body>,
    stopping: bool,
    next_sink: u64,
    /// Longest wait for a first step since the monitor last looked (ns).
    max_wait_ns: u64,
}

enum Work {
    Query(QueryCursor),
    Count(CountCursor),
    /// A REQ (or, counting, a COUNT) with search filters.
    Search(Box<SearchCursor>),
}

struct Body {
    work: Work,
    sink_shared: Arc<SinkShared>,
    sink: u64,
    who: Principal,
    /// Units charged to the budgets so far: the estimate, then any excess.
    charged: u64,
    /// Units the query has cost so far: the base, then every step's.
    spent: u64,
    admitted: Instant,
    started: bool,
    work_ns: u64,
    /// Settlement not yet passed to the session (steps without a message).
    unsent_settle: i64,
}

/// How a query ended, as its last message says.
#[derive(Debug)]
pub enum ReadEnd {
    /// A REQ's stored events are all sent: EOSE, and live events from
    /// `snapshot_serial` on.
    Eose {
        snapshot_serial: u64,
        truncated: bool,
    },
    /// A COUNT's answer.
    Count { count: u64, truncated: bool },
    /// Dropped before its first step (deadline passed): `rate-limited:`.
    Refused(RateLimited),
    /// The store failed (or a step panicked); logged here.
    Failed,
}

/// One answer chunk (and/or the end) of a query, for the session.
pub struct ReadMsg {
    pub job: JobId,
    pub events: Vec<String>,
    pub end: Option<ReadEnd>,
    /// Units to charge (positive) or refund (negative) to the connection's
    /// read budget, settling the estimate charged at admission.
    pub settle_units: i64,
    _credit: Option<Credit>,
}

/// A chunk's place in its sink; returned when the message is dropped, and
/// the sink's parked queries may then run.
struct Credit {
    permit: Option<CreditPermit>,
    inner: Arc<Inner>,
    sink: u64,
}

impl Drop for Credit {
    fn drop(&mut self) {
        // Return the credit first: a worker that checks for one after this
        // point sees it; one that parked before is woken below.
        drop(self.permit.take());
        let mut st = self.inner.lock();
        st.sched.unpark(self.sink);
        let runnable = st.sched.stats().queued > 0;
        drop(st);
        if runnable {
            self.inner.work.notify_one();
        }
    }
}

/// A session's receiving end for all its queries' answers.
pub struct ReadSink {
    id: u64,
    shared: Arc<SinkShared>,
}

/// A sink's queue and read credits, in one allocation per connection.
///
/// A queued answer holds its credit, and the credit this (a cycle): it is
/// broken when the sink goes, since closing the queue drops what it holds.
struct SinkShared {
    /// Allocated only while answers wait in it; boxed so that what an
    /// emptied queue keeps is small (8-byte slots, not 113).
    queue: Mailbox<Box<ReadMsg>>,
    /// Chunks a query may have unread in the queue.
    credits: Semaphore,
}

/// One of a sink's credits, taken; given back when dropped.
struct CreditPermit(Arc<SinkShared>);

impl CreditPermit {
    fn try_take(sink: &Arc<SinkShared>) -> Option<CreditPermit> {
        let permit = sink.credits.try_acquire().ok()?;
        permit.forget();
        Some(CreditPermit(sink.clone()))
    }
}

impl Drop for CreditPermit {
    fn drop(&mut self) {
        self.0.credits.add_permits(1);
    }
}

impl Drop for ReadSink {
    fn drop(&mut self) {
        // Answers still queued return their credits now.
        self.shared.queue.close();
    }
}

impl ReadSink {
    /// The next message of any of this session's queries. Cancel-safe;
    /// the future is one pointer.
    pub fn recv(&mut self) -> impl std::future::Future<Output = Box<ReadMsg>> + '_ {
        self.shared.queue.recv()
    }
}

/// Owns one admitted query: dropping it cancels the query and gives back
/// its queue position or worker.
pub struct ReadGuard {
    job: JobId,
    inner: Arc<Inner>,
}

impl ReadGuard {
    /// The id its messages carry.
    pub fn job(&self) -> JobId {
        self.job
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        if st.sched.cancel(self.job)
            && let Some(body) = st.bodies.remove(&self.job)
        {
            room::give_back(&mut st.bodies);
            drop(st);
            self.inner.finish(body, false);
        }
    }
}

impl Reads {
    pub(crate) fn start(
        store: Store,
        throttle: Arc<Throttle>,
        engine: &crate::EngineConfig,
        search: Arc<crate::search::SearchSlot>,
    ) -> Result<Reads, crate::StartError> {
        let cfg = throttle.config().queries;
        let slots = cfg.slots;
        let sched =
            FairQueue::new(cfg.clone()).map_err(|e| crate::StartError::Config(e.to_string()))?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                sched,
                cfg,
                bodies: HashMap::new(),
                stopping: false,
                next_sink: 0,
                max_wait_ns: 0,
            }),
            work: Condvar::new(),
            store,
            throttle,
            max_scan_rows: engine.max_scan_rows,
            max_count_rows: engine.max_count_rows,
            search,
        });
        let reads = Reads {
            inner,
            workers: Mutex::new(Vec::with_capacity(slots as usize)),
        };
        for i in 0..slots {
            let inner = reads.inner.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sluice-query-{i}"))
                .spawn(move || inner.run_worker());
            match spawned {
                Ok(w) => reads
                    .workers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(w),
                Err(source) => {
                    // The workers started so far stop, joined.
                    reads.shutdown();
                    return Err(crate::StartError::Thread {
                        thread: format!("sluice-query-{i}"),
                        source,
                    });
                }
            }
        }
        Ok(reads)
    }

    /// A sink for one session whose open queries never exceed `max_open`.
    pub fn sink(&self, max_open: usize) -> ReadSink {
        let mut st = self.inner.lock();
        st.next_sink += 1;
        let chunks = st.cfg.chunks_per_connection as usize;
        let id = st.next_sink;
        drop(st);
        // Room for every chunk in flight and one final message per open
        // query (plus queries just replaced whose end was already sent).
        ReadSink {
            id,
            shared: Arc::new(SinkShared {
                queue: Mailbox::new(chunks + 2 * max_open + 2),
                credits: Semaphore::new(chunks),
            }),
        }
    }

    /// Admits a REQ (each filter's limit already set), or refuses it.
    pub fn submit_query(
        &self,
        sink: &ReadSink,
        who: Principal,
        filters: Vec<Filter>,
        readers: Arc<Readers>,
        budget: &mut ConnReadBudget,
    ) -> Result<ReadGuard, QueryError> {
        self.submit_filters(sink, who, filters, readers, budget, false)
    }

    /// Admits a NIP-45 COUNT, or refuses it.
    pub fn submit_count(
        &self,
        sink: &ReadSink,
        who: Principal,
        filters: Vec<Filter>,
        readers: Arc<Readers>,
        budget: &mut ConnReadBudget,
    ) -> Result<ReadGuard, QueryError> {
        self.submit_filters(sink, who, filters, readers, budget, true)
    }

    /// NIP-50: a search filter matches only the kinds the index holds
    /// (`[search] kinds`), stored and live alike. Nothing changes while
    /// search is off (the store then checks the words by scanning).
    pub fn scope_search(&self, filters: &mut [Filter]) {
        let Some(index) = self.inner.search.index() else {
            return;
        };
        let indexed = &index.config().kinds;
        for f in filters.iter_mut().filter(|f| f.search.is_some()) {
            let mut kinds: Vec<u16> = match &f.kinds {
                Some(k) => k.iter().copied().filter(|k| indexed.contains(k)).collect(),
                None => indexed.clone(),
            };
            kinds.sort_unstable();
            kinds.dedup();
            f.kinds = Some(kinds);
        }
    }

    /// Estimates the cost from the plan (a search's from the postings its
    /// words touch), builds the cursor (which serves private kinds only to
    /// `readers`), and submits.
    fn submit_filters(
        &self,
        sink: &ReadSink,
        who: Principal,
        mut filters: Vec<Filter>,
        readers: Arc<Readers>,
        budget: &mut ConnReadBudget,
        count: bool,
    ) -> Result<ReadGuard, QueryError> {
        self.scope_search(&mut filters);
        let search = self
            .inner
            .search
            .index()
            .filter(|_| filters.iter().any(|f| f.search.is_some()));
        let shapes = shapes(&filters, search);
        let cost = self.inner.lock().cfg.cost;
        let max_rows = if count {
            self.inner.max_count_rows
        } else {
            self.inner.max_scan_rows
        };
        let opts = QueryOptions {
            now: unix_now(),
            max_scan_rows: max_rows,
        };
        let estimate = if count {
            cost.estimate_count(&shapes, max_rows)
        } else {
            cost.estimate_req(&shapes, max_rows)
        };
        let work = match (search, count) {
            (Some(index), _) => Work::Search(Box::new(SearchCursor::new(
                index.clone(),
                filters,
                opts,
                readers,
                count,
            ))),
            (None, true) => Work::Count(CountCursor::new(filters, opts).for_readers(readers)),
            (None, false) => Work::Query(QueryCursor::new(filters, opts).for_readers(readers)),
        };
        self.submit(sink, who, work, estimate, budget)
    }

    fn submit(
        &self,
        sink: &ReadSink,
        who: Principal,
        work: Work,
        estimate: u64,
        budget: &mut ConnReadBudget,
    ) -> Result<ReadGuard, QueryError> {
        // The read cost, then the scheduler under its lock; a refusal or a
        // shutdown gives the cost back (`sluice_throttle::policy`).
        let throttle = &self.inner.throttle;
        let (id, base) = throttle.admit_query(&who, budget, estimate, |checks| {
            let mut st = self.inner.lock();
            if st.stopping {
                return Err(QueryError::Closed);
            }
            let id = checks.schedule(&mut st.sched, &who, sink.id, estimate)?;
            Ok((id, register(&mut st, id, sink, who, work, estimate)))
        })?;
        metrics::counter!(m::QUERY_COST_UNITS_TOTAL, "stage" => "estimated").increment(estimate);
        metrics::counter!(m::QUERY_COST_UNITS_TOTAL, "stage" => "spent").increment(base);
        self.inner.work.notify_one();
        Ok(ReadGuard {
            job: id,
            inner: self.inner.clone(),
        })
    }

    /// The scheduler's current counts and totals.
    pub fn stats(&self) -> FairStats {
        self.inner.lock().sched.stats()
    }

    /// Longest wait of a query for its first step since the last call
    /// (the monitor's read-latency signal), in seconds.
    pub fn take_max_wait_secs(&self) -> f64 {
        std::mem::take(&mut self.inner.lock().max_wait_ns) as f64 / 1e9
    }

    /// Applies a reloaded `[throttle.queries]` (SIGHUP). The number of
    /// workers is fixed at start.
    /// Refused as a whole (nothing applied) when the scheduler rejects it.
    pub(crate) fn reload(&self, cfg: QueriesConfig) -> Result<(), String> {
        let mut st = self.inner.lock();
        st.sched
            .set_config(cfg.clone())
            .map_err(|e| format!("[throttle.queries]: {e}"))?;
        st.cfg = cfg;
        Ok(())
    }

    /// Stops the workers after their current step; queries still open are
    /// dropped (their sessions are closing too).
    pub(crate) fn shutdown(&self) {
        self.inner.lock().stopping = true;
        self.inner.work.notify_all();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in workers {
            let _ = w.join();
        }
    }
}

/// Keeps an admitted query's work until its steps run; returns the units
/// it has spent so far (the base of its first step).
fn register(
    st: &mut State,
    id: JobId,
    sink: &ReadSink,
    who: Principal,
    work: Work,
    estimate: u64,
) -> u64 {
    let base = st.cfg.cost.base_units;
    st.bodies.insert(
        id,
        Body {
            work,
            sink_shared: sink.shared.clone(),
            sink: sink.id,
            who,
            charged: estimate,
            spent: base,
            admitted: Instant::now(),
            started: false,
            work_ns: 0,
            unsent_settle: 0,
        },
    );
    base
}

fn shapes(filters: &[Filter], search: Option<&Arc<SearchIndex>>) -> Vec<FilterShape> {
    let searcher = search.map(|i| (i, i.searcher()));
    filters
        .iter()
        .map(|f| match (&searcher, plan_shape(f)) {
            (_, PlanShape::Empty) => FilterShape::Empty,
            (Some((index, searcher)), _) if f.search.is_some() => FilterShape::Search {
                postings: index.cost_rows(searcher, f),
                limit: f.limit,
            },
            (_, PlanShape::Ids(n)) => FilterShape::Ids { ids: n as u64 },
            (
                _,
                PlanShape::Scan {
                    prefixes,
                    keyed,
                    post_filter,
                },
            ) => FilterShape::Scan {
                prefixes: prefixes as u64,
                limit: f.limit,
                keyed,
                post_filter,
            },
        })
        .collect()
}

/// What one step produced.
struct StepResult {
    events: Vec<String>,
    rows: u64,
    bytes: u64,
    end: Option<ReadEnd>,
}

impl Inner {
    /// The scheduler's lock. A panic while it was held (none is expected:
    /// the scheduler is plain bookkeeping) must not stop every reader
    /// after it, so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run_worker(self: Arc<Self>) {
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
                    let _ = body.sink_shared.queue.try_send(Box::new(ReadMsg {
                        job: id,
                        events: Vec::new(),
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
                st = if st.sched.stats().queued == 0 {
                    self.work.wait(st).unwrap_or_else(|e| e.into_inner())
                } else {
                    self.work
                        .wait_timeout(st, EXPIRY_CHECK)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                };
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
            let Some(permit) = CreditPermit::try_take(&body.sink_shared) else {
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
                metrics::histogram!(m::QUERY_WAIT_SECONDS).record(waited.as_secs_f64());
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
            metrics::histogram!(m::QUERY_STEP_SECONDS).record(took.as_secs_f64());
            let step = result.unwrap_or_else(|()| StepResult {
                events: Vec::new(),
                rows: 0,
                bytes: 0,
                end: Some(ReadEnd::Failed),
            });
            let done = step.end.is_some();
            let units = cost.step(step.rows, step.bytes);
            body.spent += units;
            metrics::counter!(m::QUERY_ROWS_SCANNED_TOTAL).increment(step.rows);
            metrics::counter!(m::QUERY_SENT_BYTES_TOTAL).increment(step.bytes);
            metrics::counter!(m::QUERY_EVENTS_TOTAL).increment(step.events.len() as u64);
            metrics::counter!(m::QUERY_COST_UNITS_TOTAL, "stage" => "spent").increment(units);
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
                deliver(&body.sink_shared.queue, msg);
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
            } else if body.sink_shared.credits.available_permits() > 0 {
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
    fn step(&self, work: &mut Work, limits: StepLimits) -> Result<StepResult, ()> {
        let fail = |e: sluice_store::StoreError| {
            tracing::warn!(error = %e, "query failed");
        };
        match work {
            Work::Query(cur) => {
                let mut events = Vec::new();
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
                let mut events = Vec::new();
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
                    events: Vec::new(),
                    rows: did.rows,
                    bytes: 0,
                    end,
                })
            }
        }
    }

    /// A query left the scheduler: settle what it was charged against what
    /// it cost (an unfinished query is refunded its unspent estimate).
    fn finish(&self, mut body: Body, completed: bool) {
        let refund = settle(&mut body, true);
        self.throttle.settle_read_cost(&body.who, refund);
        if completed || body.work_ns > 0 {
            metrics::histogram!(m::QUERY_SECONDS).record(body.work_ns as f64 / 1e9);
        }
    }
}

/// Hands a message to its session's sink. It never waits: the sink has
/// room for every credited chunk and one end per open query.
fn deliver(tx: &Mailbox<Box<ReadMsg>>, msg: ReadMsg) {
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
