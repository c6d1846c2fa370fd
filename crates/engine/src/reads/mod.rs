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

mod sink;
mod worker;

pub use sink::{ReadEnd, ReadGuard, ReadMsg, ReadSink};
pub(crate) use sink::{SinkHome, SinkShared};

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};

use sluice_proto::{Filter, Readers};
use sluice_search::{SearchCursor, SearchIndex};
use sluice_store::{
    CountCursor, EventChunk, PlanShape, QueryCursor, QueryOptions, Store, StoreError, plan_shape,
};
use sluice_throttle::{
    ClientKey, FairQueue, FairStats, FilterShape, JobId, Principal, QueriesConfig, RateLimited,
};

use crate::clock::unix_now;
use crate::handles::{Handle, LabelledCounter};
use crate::limiter::{ConnReadBudget, Limiter};
use crate::metrics_names as m;

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
    throttle: Arc<Limiter>,
    max_scan_rows: u64,
    max_count_rows: u64,
    /// The NIP-50 index, once started: REQs and COUNTs with a `search`
    /// run on it.
    search: Arc<crate::search::SearchSlot>,
    /// Answer buffers the sessions gave back, for the next steps: a step
    /// fills one without allocating (bounded by [`SPARE_CHUNKS`]).
    spare: Mutex<Vec<EventChunk>>,
    series: Series,
}

/// The series recorded per query and per step, looked up once.
struct Series {
    wait_seconds: Handle<Histogram>,
    step_seconds: Handle<Histogram>,
    query_seconds: Handle<Histogram>,
    rows_scanned: Handle<Counter>,
    sent_bytes: Handle<Counter>,
    events: Handle<Counter>,
    /// `stage`: `estimated`, `spent`.
    cost_units: LabelledCounter,
}

impl Series {
    const fn new() -> Series {
        Series {
            wait_seconds: Handle::histogram(m::QUERY_WAIT_SECONDS),
            step_seconds: Handle::histogram(m::QUERY_STEP_SECONDS),
            query_seconds: Handle::histogram(m::QUERY_SECONDS),
            rows_scanned: Handle::counter(m::QUERY_ROWS_SCANNED_TOTAL),
            sent_bytes: Handle::counter(m::QUERY_SENT_BYTES_TOTAL),
            events: Handle::counter(m::QUERY_EVENTS_TOTAL),
            cost_units: LabelledCounter::new(m::QUERY_COST_UNITS_TOTAL, "stage"),
        }
    }
}

/// Most answer buffers kept for reuse.
const SPARE_CHUNKS: usize = 64;
/// A buffer grown past this (a step of very large events) is not kept.
const SPARE_CHUNK_MAX_BYTES: usize = 1 << 20;

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
    /// Where its answers go.
    sink_home: Arc<dyn SinkHome>,
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

impl Reads {
    pub(crate) fn start(
        store: Store,
        throttle: Arc<Limiter>,
        engine: &crate::EngineConfig,
        search: Arc<crate::search::SearchSlot>,
    ) -> Result<Reads, crate::StartError> {
        let cfg = throttle.config().queries;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let sched = FairQueue::new(cfg.clone())
            .map_err(|e| crate::StartError::Config(e.to_string()))?
            .on_cores(cores);
        let slots = sched.slots();
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
            spare: Mutex::new(Vec::new()),
            series: Series::new(),
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
                Ok(w) => reads.workers.lock().push(w),
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

    /// A sink for one session whose open queries never exceed `max_open`,
    /// in an allocation of its own (a session's lives with its live queue:
    /// `crate::live::LiveConn::read_sink`).
    pub fn sink(&self, max_open: usize) -> ReadSink {
        self.open_sink(Arc::new(SinkShared::unopened()), max_open)
    }

    /// Opens the sink that lives in `home` (made unopened) for one session
    /// whose open queries never exceed `max_open`.
    pub(crate) fn open_sink(&self, home: Arc<dyn SinkHome>, max_open: usize) -> ReadSink {
        let mut st = self.inner.lock();
        st.next_sink += 1;
        let chunks = st.cfg.chunks_per_connection;
        let id = st.next_sink;
        drop(st);
        // Room for every chunk in flight and one final message per open
        // query (plus queries just replaced whose end was already sent).
        home.sink()
            .open(id, chunks as usize + 2 * max_open + 2, chunks);
        ReadSink { home }
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
        // shutdown gives the cost back (`sluice_throttle::admission`).
        let throttle = &self.inner.throttle;
        let (id, base) = throttle.admit_query(&who, budget, estimate, |checks| {
            let mut st = self.inner.lock();
            if st.stopping {
                return Err(QueryError::Closed);
            }
            let id = checks.schedule(&mut st.sched, &who, sink.home.sink().id(), estimate)?;
            Ok((id, register(&mut st, id, sink, who, work, estimate)))
        })?;
        let series = &self.inner.series;
        series.cost_units.increment("estimated", estimate);
        series.cost_units.increment("spent", base);
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
        let workers = std::mem::take(&mut *self.workers.lock());
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
            sink_home: sink.home.clone(),
            sink: sink.home.sink().id(),
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

impl Inner {
    /// An empty answer buffer, one given back if any.
    fn chunk(&self) -> EventChunk {
        self.spare.lock().pop().unwrap_or_default()
    }

    /// Keeps a delivered answer's buffer for a later step.
    fn give_back(&self, mut chunk: EventChunk) {
        if chunk.capacity() == 0 || chunk.capacity() > SPARE_CHUNK_MAX_BYTES {
            return;
        }
        chunk.clear();
        let mut spare = self.spare.lock();
        if spare.len() < SPARE_CHUNKS {
            spare.push(chunk);
        }
    }
}
