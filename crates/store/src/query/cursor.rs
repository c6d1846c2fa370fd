//! The cursors of a REQ ([`QueryCursor`]) and a COUNT ([`CountCursor`]),
//! and the steps that run them: each step one read transaction, bounded in
//! rows and bytes. A REQ's filters each keep their rows in final order
//! (timestamps collected whole, sorted by id, cut at the limit) and are
//! merged newest first, an event matched by several sent once.

use std::cmp::Reverse;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use heed::RoTxn;
use sluice_proto::{Filter, Readers};

use crate::query::chunk::EventSink;
use crate::query::walk::{Budget, Flow, Hit, StepRows, Walk, WalkCtx, WalkEnd};
use crate::tables::{META_NEXT_SERIAL, Tables};
use crate::{Store, StoreError};

/// Bounds of one query.
#[derive(Debug, Clone, Copy)]
pub struct QueryOptions {
    /// Unix seconds; events expired at this time are never returned.
    pub now: u64,
    /// Most index entries one query may read before it stops with what it has.
    pub max_scan_rows: u64,
}

/// Result of [`Store::query`].
#[derive(Debug, Default)]
pub struct QueryOutput {
    /// Raw JSON of the matching events, newest first, ties by lowest id.
    pub events: Vec<String>,
    /// Index entries read.
    pub rows_scanned: u64,
    /// Serials below this were visible to the query; live delivery takes
    /// over from here.
    pub snapshot_serial: u64,
    /// True when the scan budget ran out before the limits were met.
    pub truncated: bool,
}

/// Bounds of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// Index rows (and id lookups) the step may read.
    pub rows: u64,
    /// Bytes of events the step may return; it stops after the event that
    /// reaches this.
    pub bytes: u64,
}

impl StepLimits {
    /// No bound: the step runs the query to its end.
    pub const UNBOUNDED: StepLimits = StepLimits {
        rows: u64::MAX,
        bytes: u64::MAX,
    };
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// Index rows read by this step.
    pub rows: u64,
    /// Bytes of events this step returned.
    pub bytes: u64,
    /// The query is complete: nothing more will be returned.
    pub done: bool,
}

/// One filter's rows in final order: each timestamp collected whole, sorted
/// by id, and passed on as far as the limit allows.
struct Grouping {
    limit: u64,
    /// Rows of the timestamp being collected, unsorted.
    group: Vec<Hit>,
    /// Rows in final order, waiting for the merge.
    ready: VecDeque<Hit>,
    /// Bytes of JSON in `ready`.
    ready_bytes: usize,
    /// Rows passed to `ready` so far (against the limit).
    passed: u64,
}

impl Grouping {
    /// Takes one row; false when the limit is met and no more are wanted.
    fn accept(&mut self, hit: Hit) -> bool {
        if self
            .group
            .first()
            .is_some_and(|g| hit.created_at < g.created_at)
        {
            self.flush();
            if self.passed >= self.limit {
                return false;
            }
        }
        self.group.push(hit);
        true
    }

    /// The current timestamp is whole: sort it by id and pass on what the
    /// limit allows.
    fn flush(&mut self) {
        self.group.sort_unstable_by_key(|h| h.id);
        let take = (self.limit - self.passed).min(self.group.len() as u64) as usize;
        self.ready_bytes += self.group[..take].iter().map(|h| h.len()).sum::<usize>();
        self.ready.extend(self.group.drain(..take));
        self.group.clear();
        self.passed += take as u64;
    }

    /// The walk may go on: `ready` holds less than the most a filter reads
    /// ahead of the merge.
    fn wants_more(&self) -> bool {
        self.ready.len() < READ_AHEAD_ROWS && self.ready_bytes < READ_AHEAD_BYTES
    }

    /// The next row in final order.
    fn pop(&mut self) -> Option<Hit> {
        let hit = self.ready.pop_front()?;
        self.ready_bytes -= hit.len();
        Some(hit)
    }
}

/// Rows and bytes one filter reads ahead of the merge, at most (a timestamp
/// collected whole may exceed them). A walk that stopped at every ready row
/// opened its index range again for the next one: a seek from the root
/// and a cursor per row, a sixth of a query's work.
const READ_AHEAD_ROWS: usize = 32;
const READ_AHEAD_BYTES: usize = 64 << 10;

/// One filter of a REQ in progress.
struct FilterCursor {
    filter: Filter,
    walk: Walk,
    rows: Grouping,
    /// Nothing more will reach `rows.ready`.
    complete: bool,
}

impl FilterCursor {
    fn new(filter: Filter) -> FilterCursor {
        let limit = filter.limit.unwrap_or(u64::MAX);
        let complete = filter.is_empty_match() || limit == 0;
        FilterCursor {
            walk: Walk::new(&filter),
            filter,
            rows: Grouping {
                limit,
                group: Vec::new(),
                ready: VecDeque::new(),
                ready_bytes: 0,
                passed: 0,
            },
            complete,
        }
    }

    /// Walks until the filter has read as far ahead of the merge as it may
    /// (`Grouping::wants_more`), is complete, or the step's rows run out.
    fn fill(
        &mut self,
        t: &Tables,
        rtxn: &RoTxn<'_, heed::WithoutTls>,
        ctx: &WalkCtx,
        budget: &mut Budget,
        step: &mut StepRows,
    ) -> Result<(), StoreError> {
        let rows = &mut self.rows;
        let mut wants_more = true;
        let end = self
            .walk
            .run(t, rtxn, &self.filter, ctx, budget, step, |hit| {
                if !rows.accept(hit) {
                    wants_more = false;
                    Flow::Stop
                } else if rows.wants_more() {
                    Flow::Continue
                } else {
                    Flow::Pause
                }
            })?;
        if end == WalkEnd::Done || !wants_more {
            self.rows.flush();
            self.complete = true;
        }
        Ok(())
    }
}

/// A REQ in progress: its filters' walks, their merge, and the snapshot.
pub struct QueryCursor {
    filters: Vec<FilterCursor>,
    opts: QueryOptions,
    readers: Option<Arc<Readers>>,
    budget: Budget,
    snapshot_serial: Option<u64>,
    last_sent: Option<(u64, [u8; 32])>,
    /// Serials not to answer: the caller sent them already (a REQ whose
    /// search filters answered first).
    skip: HashSet<u64>,
    done: bool,
}

impl QueryCursor {
    /// A query over `filters` (each filter's `limit` caps its own newest
    /// matches; `None` is no limit). Nothing is read until the first step.
    pub fn new(filters: Vec<Filter>, opts: QueryOptions) -> QueryCursor {
        QueryCursor {
            filters: filters.into_iter().map(FilterCursor::new).collect(),
            budget: Budget::new(opts.max_scan_rows),
            opts,
            readers: None,
            snapshot_serial: None,
            last_sent: None,
            skip: HashSet::new(),
            done: false,
        }
    }

    /// Events of `readers`' private kinds are returned only when one of its
    /// pubkeys wrote them or is in their `p` tags.
    pub fn for_readers(mut self, readers: Arc<Readers>) -> QueryCursor {
        self.readers = Some(readers);
        self
    }

    /// Events with these serials are not answered (the caller has sent
    /// them already). A filter's `limit` still counts them: the union of
    /// what the caller sent and what this answers is the query's.
    pub fn skip_serials(&mut self, serials: HashSet<u64>) {
        self.skip.extend(serials);
    }

    /// Serials below this were visible to the query (fixed by the first
    /// step); live delivery takes over from here.
    pub fn snapshot_serial(&self) -> Option<u64> {
        self.snapshot_serial
    }

    /// Index rows read so far.
    pub fn rows_scanned(&self) -> u64 {
        self.budget.used
    }

    /// True when the scan budget ran out before the limits were met.
    pub fn truncated(&self) -> bool {
        self.budget.exhausted
    }

    pub fn is_done(&self) -> bool {
        self.done
    }
}

/// Makes the hits a REQ keeps past a step own their JSON (read in place
/// during the step, `Hit::own`) when dropped: before the step's
/// transaction ends, a panic's unwinding included.
struct OwnHits<'c>(&'c mut QueryCursor);

impl Drop for OwnHits<'_> {
    fn drop(&mut self) {
        for f in self.0.filters.iter_mut() {
            f.rows.group.iter_mut().for_each(Hit::own);
            f.rows.ready.iter_mut().for_each(Hit::own);
            f.walk.own_hits();
        }
    }
}

/// A COUNT in progress.
pub struct CountCursor {
    filters: Vec<(Filter, Walk)>,
    next_filter: usize,
    /// Serials counted, to count an event matched by several filters once;
    /// `None` with a single filter (no overlap possible).
    seen: Option<HashSet<u64>>,
    count: u64,
    opts: QueryOptions,
    readers: Option<Arc<Readers>>,
    budget: Budget,
    snapshot_serial: Option<u64>,
    done: bool,
}

impl CountCursor {
    /// NIP-45: counts distinct stored events matching any filter (limits
    /// ignored), reading at most `opts.max_scan_rows` rows.
    pub fn new(filters: Vec<Filter>, opts: QueryOptions) -> CountCursor {
        let live: Vec<Filter> = filters
            .into_iter()
            .filter(|f| !f.is_empty_match())
            .collect();
        CountCursor {
            seen: (live.len() > 1).then(HashSet::new),
            filters: live
                .into_iter()
                .map(|f| {
                    let w = Walk::new(&f);
                    (f, w)
                })
                .collect(),
            next_filter: 0,
            count: 0,
            budget: Budget::new(opts.max_scan_rows),
            opts,
            readers: None,
            snapshot_serial: None,
            done: false,
        }
    }

    /// Counts events of `readers`' private kinds only when one of its
    /// pubkeys wrote them or is in their `p` tags.
    pub fn for_readers(mut self, readers: Arc<Readers>) -> CountCursor {
        self.readers = Some(readers);
        self
    }

    /// Events with these serials are not counted (the caller has counted
    /// them already), so the caller's count plus this one is the union's.
    pub fn skip_serials(&mut self, serials: HashSet<u64>) {
        if serials.is_empty() {
            return;
        }
        match &mut self.seen {
            Some(seen) => seen.extend(serials),
            None => self.seen = Some(serials),
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn rows_scanned(&self) -> u64 {
        self.budget.used
    }

    pub fn truncated(&self) -> bool {
        self.budget.exhausted
    }

    pub fn is_done(&self) -> bool {
        self.done
    }
}

impl Store {
    /// Runs the filters of one REQ to the end. Each filter's `limit` (None:
    /// no limit) caps its own newest matches; the union is deduplicated and
    /// returned newest first.
    pub fn query(
        &self,
        filters: &[Filter],
        opts: &QueryOptions,
    ) -> Result<QueryOutput, StoreError> {
        let mut cur = QueryCursor::new(filters.to_vec(), *opts);
        let mut events = Vec::new();
        while !cur.is_done() {
            self.query_step(&mut cur, StepLimits::UNBOUNDED, &mut events)?;
        }
        Ok(QueryOutput {
            events,
            rows_scanned: cur.rows_scanned(),
            snapshot_serial: cur.snapshot_serial().unwrap_or(1),
            truncated: cur.truncated(),
        })
    }

    /// What every step of a REQ or a COUNT starts with: its read
    /// transaction and the context its walks read with, the snapshot
    /// serial fixed by its first step (the next serial then) and kept by
    /// every later one. `None` when the query is done.
    fn open_step<'r>(
        &self,
        done: bool,
        snapshot_serial: &mut Option<u64>,
        opts: &QueryOptions,
        readers: Option<&'r Readers>,
    ) -> Result<Option<(RoTxn<'_, heed::WithoutTls>, WalkCtx<'r>)>, StoreError> {
        if done {
            return Ok(None);
        }
        let rtxn = self.rtxn()?;
        let serial = match *snapshot_serial {
            Some(s) => s,
            None => *snapshot_serial.insert(next_serial(&self.t, &rtxn)?),
        };
        let ctx = WalkCtx {
            now: opts.now,
            snapshot_serial: serial,
            readers,
            with_json: true,
        };
        Ok(Some((rtxn, ctx)))
    }

    /// One step of a REQ: appends the next events, in order, to `out`.
    pub fn query_step(
        &self,
        cur: &mut QueryCursor,
        limits: StepLimits,
        out: &mut impl EventSink,
    ) -> Result<StepOutput, StoreError> {
        let mut did = StepOutput::default();
        let readers = cur.readers.clone();
        let Some((rtxn, ctx)) = self.open_step(
            cur.done,
            &mut cur.snapshot_serial,
            &cur.opts,
            readers.as_deref(),
        )?
        else {
            did.done = true;
            return Ok(did);
        };
        // Declared after the transaction, so dropped before it, on every
        // exit: the hits the cursor keeps own their JSON by then.
        let guard = OwnHits(cur);
        let cur = &mut *guard.0;
        let rows_before = cur.budget.used;
        let mut step = StepRows(limits.rows);
        'merge: loop {
            for f in cur.filters.iter_mut() {
                if f.rows.ready.is_empty() && !f.complete {
                    f.fill(&self.t, &rtxn, &ctx, &mut cur.budget, &mut step)?;
                    if f.rows.ready.is_empty() && !f.complete {
                        // The step's rows ran out before this filter had a row.
                        break 'merge;
                    }
                }
            }
            let best = cur
                .filters
                .iter()
                .enumerate()
                .filter_map(|(i, f)| {
                    f.rows
                        .ready
                        .front()
                        .map(|h| ((Reverse(h.created_at), h.id), i))
                })
                .min();
            let Some((_, i)) = best else {
                cur.done = true;
                break;
            };
            let Some(hit) = cur.filters[i].rows.pop() else {
                continue;
            };
            let key = (hit.created_at, hit.id);
            if cur.last_sent == Some(key) || cur.skip.contains(&hit.serial) {
                cur.last_sent = Some(key);
                continue;
            }
            cur.last_sent = Some(key);
            did.bytes += hit.len() as u64;
            out.push_event(hit.raw());
            if did.bytes >= limits.bytes {
                break;
            }
        }
        did.rows = cur.budget.used - rows_before;
        did.done = cur.done;
        Ok(did)
    }

    /// NIP-45: how many distinct stored events match any of the filters
    /// (limits ignored). Returns `(count, rows_scanned, truncated)`.
    pub fn count(
        &self,
        filters: &[Filter],
        opts: &QueryOptions,
    ) -> Result<(u64, u64, bool), StoreError> {
        let mut cur = CountCursor::new(filters.to_vec(), *opts);
        while !cur.is_done() {
            self.count_step(&mut cur, StepLimits::UNBOUNDED)?;
        }
        Ok((cur.count(), cur.rows_scanned(), cur.truncated()))
    }

    /// One step of a COUNT.
    pub fn count_step(
        &self,
        cur: &mut CountCursor,
        limits: StepLimits,
    ) -> Result<StepOutput, StoreError> {
        let mut did = StepOutput::default();
        let Some((rtxn, mut ctx)) = self.open_step(
            cur.done,
            &mut cur.snapshot_serial,
            &cur.opts,
            cur.readers.as_deref(),
        )?
        else {
            did.done = true;
            return Ok(did);
        };
        // A count needs the serials, not the events' JSON.
        ctx.with_json = false;
        let rows_before = cur.budget.used;
        let mut step = StepRows(limits.rows);
        while let Some((f, walk)) = cur.filters.get_mut(cur.next_filter) {
            let seen = &mut cur.seen;
            let count = &mut cur.count;
            let end = walk.run(&self.t, &rtxn, f, &ctx, &mut cur.budget, &mut step, |hit| {
                if seen.as_mut().is_none_or(|s| s.insert(hit.serial)) {
                    *count += 1;
                }
                Flow::Continue
            })?;
            if end == WalkEnd::Paused {
                break;
            }
            cur.next_filter += 1;
        }
        if cur.next_filter >= cur.filters.len() {
            cur.done = true;
        }
        did.rows = cur.budget.used - rows_before;
        did.done = cur.done;
        Ok(did)
    }
}

fn next_serial(t: &Tables, rtxn: &RoTxn<'_, heed::WithoutTls>) -> Result<u64, StoreError> {
    Ok(t.meta.get(rtxn, META_NEXT_SERIAL)?.unwrap_or(1))
}
