//! The read path: a planner that picks one index per filter, and scans that
//! walk the index newest first with the filter's time range in the key
//! range and the limit pushed down.
//!
//! Ordering is newest first, ties broken by the lowest id. Index keys order
//! equal timestamps by serial, so a filter's scan collects each timestamp
//! whole, sorts it by id and passes on what its limit allows: exact, and
//! bounded by the scan budget. The filters of one REQ are merged in that
//! order, an event matched by several sent once.
//!
//! Queries run in bounded *steps* ([`QueryCursor`], [`CountCursor`]): each
//! step opens its own read transaction, reads at most a given number of
//! index rows and returns at most a given number of bytes of events, and
//! keeps its place in owned keys, so no transaction outlives a step and a
//! long scan never holds a worker. The first step fixes the snapshot: rows
//! with a serial at or above it (committed after the first step) are
//! skipped by later steps, and live delivery takes over from that serial.
//! A row removed between steps (deleted, replaced, expired) is simply not
//! found. [`Store::query`] and [`Store::count`] run a cursor to the end.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use heed::types::Unit;
use heed::{RoRevRange, RoTxn};
use sluice_proto::{Event, Filter, Readers};

use crate::codec::{
    Be64, Header, IndexKeyCodec, MAX_INLINE_TAG_BYTES, Prefix, StoredEvent, author_kind_prefix,
    author_prefix, index_key, kind_prefix, tag_prefix,
};
use crate::tables::{Index, IndexTable, META_NEXT_SERIAL, Tables};
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

/// Most author×kind prefixes one filter may expand to before the planner
/// falls back to the author index.
const MAX_AUTHOR_KIND_PREFIXES: usize = 4096;

enum Plan {
    Ids(Vec<[u8; 32]>),
    Scan {
        index: Index,
        prefixes: Vec<Vec<u8>>,
        /// The tag letter the index answers, so the post-filter can skip it.
        covered_tag: Option<u8>,
    },
}

fn plan(f: &Filter) -> Plan {
    if let Some(ids) = &f.ids {
        return Plan::Ids(ids.clone());
    }
    let scan = |index, prefixes| Plan::Scan {
        index,
        prefixes,
        covered_tag: None,
    };
    // The tag condition with the fewest values, when there is one.
    let rarest_tag = f.tags.iter().min_by_key(|(_, v)| v.len());
    match (&f.authors, &f.kinds, rarest_tag) {
        (Some(a), Some(k), _) if a.len() * k.len() <= MAX_AUTHOR_KIND_PREFIXES => scan(
            Index::AuthorKind,
            a.iter()
                .flat_map(|pk| k.iter().map(move |kind| author_kind_prefix(pk, *kind)))
                .collect(),
        ),
        (Some(a), _, _) => scan(Index::Author, a.iter().map(author_prefix).collect()),
        (None, _, Some((letter, values))) => Plan::Scan {
            index: Index::Tag,
            prefixes: values.iter().map(|v| tag_prefix(*letter, v)).collect(),
            covered_tag: Some(*letter),
        },
        (None, Some(k), None) => scan(Index::Kind, k.iter().map(|k| kind_prefix(*k)).collect()),
        (None, None, None) => scan(Index::Created, vec![Vec::new()]),
    }
}

/// How the planner answers one filter: for cost estimates made before a
/// query runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanShape {
    /// Matches nothing: no row is read.
    Empty,
    /// Looks up this many ids.
    Ids(usize),
    /// Walks this many index ranges; `keyed` when each range is one key's
    /// events (an author, an author and kind, a tag value), not a whole
    /// index or a kind; `post_filter` when rows are checked against
    /// conditions the index does not answer (and may be dropped).
    Scan {
        prefixes: usize,
        keyed: bool,
        post_filter: bool,
    },
}

/// The plan of one filter, as a [`PlanShape`].
pub fn plan_shape(f: &Filter) -> PlanShape {
    if f.is_empty_match() || f.limit == Some(0) {
        return PlanShape::Empty;
    }
    match plan(f) {
        Plan::Ids(ids) => PlanShape::Ids(ids.len()),
        Plan::Scan {
            index,
            prefixes,
            covered_tag,
        } => {
            let answered_authors = matches!(index, Index::Author | Index::AuthorKind);
            let answered_kinds = matches!(index, Index::Kind | Index::AuthorKind);
            let post_filter = (f.authors.is_some() && !answered_authors)
                || (f.kinds.is_some() && !answered_kinds)
                || needs_tag_check(f, covered_tag);
            PlanShape::Scan {
                prefixes: prefixes.len(),
                keyed: matches!(index, Index::Author | Index::AuthorKind | Index::Tag),
                post_filter,
            }
        }
    }
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

/// One matching event, owned: it outlives the step's transaction.
struct Hit {
    created_at: u64,
    id: [u8; 32],
    serial: u64,
    raw: String,
}

/// Read budget shared by the filters of one query.
#[derive(Debug, Clone, Copy)]
struct Budget {
    left: u64,
    used: u64,
    exhausted: bool,
}

impl Budget {
    fn new(max_rows: u64) -> Budget {
        Budget {
            left: max_rows,
            used: 0,
            exhausted: false,
        }
    }

    fn take(&mut self) -> bool {
        if self.left == 0 {
            self.exhausted = true;
            return false;
        }
        self.left -= 1;
        self.used += 1;
        true
    }
}

/// Rows a step may still read; shared by the filters the step serves.
struct StepRows(u64);

/// What a walk's visitor wants next.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Go on.
    Continue,
    /// Stop for now (the row was taken; the walk resumes after it).
    Pause,
    /// The filter needs no more rows.
    Stop,
}

/// Why a walk returned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WalkEnd {
    /// The visitor paused, or the step's rows ran out: resume later.
    Paused,
    /// The index (or the ids), the query's budget or the visitor's wants
    /// are done: the filter is complete.
    Done,
}

/// A resumable walk over one filter's plan.
enum Walk {
    /// Id lookups, all in the first step (their number is bounded by the
    /// message size), then handed out in order.
    Ids {
        /// The ids to look up; `None` once the first step has.
        pending: Option<Vec<[u8; 32]>>,
        /// Matches in order, not handed out yet.
        ready: VecDeque<Hit>,
    },
    /// A newest-first merge of index ranges.
    Index(IndexWalk),
}

/// A newest-first merge of index ranges, one per prefix, each resumed
/// below its last row taken.
struct IndexWalk {
    index: Index,
    check_tags: bool,
    ranges: Vec<Range>,
    started: bool,
    /// The same event can sit under several prefixes (two tag values);
    /// equal keys are taken one after the other.
    last_serial: Option<u64>,
}

/// One prefix's range and the next row to take in it.
struct Range {
    lo: Vec<u8>,
    hi: Vec<u8>,
    /// The next row, `(created_at, serial)`; `None` when the range is done.
    head: Option<(u64, u64)>,
    prefix: Vec<u8>,
}

impl Range {
    fn key_of(&self, at: (u64, u64)) -> Vec<u8> {
        index_key(&self.prefix, at.0, at.1)
    }
}

impl Walk {
    fn new(f: &Filter) -> Walk {
        match plan(f) {
            Plan::Ids(ids) => Walk::Ids {
                pending: Some(ids),
                ready: VecDeque::new(),
            },
            Plan::Scan {
                index,
                prefixes,
                covered_tag,
            } => {
                let since = f.since.unwrap_or(0);
                let until = f.until.unwrap_or(u64::MAX);
                Walk::Index(IndexWalk {
                    index,
                    check_tags: needs_tag_check(f, covered_tag),
                    ranges: prefixes
                        .into_iter()
                        .map(|p| Range {
                            lo: index_key(&p, since, 0),
                            hi: index_key(&p, until, u64::MAX),
                            head: None,
                            prefix: p,
                        })
                        .collect(),
                    started: false,
                    last_serial: None,
                })
            }
        }
    }

    /// Hands matching, unexpired rows with a serial below the snapshot to
    /// `visit`, newest first, until the visitor pauses or stops, the step's
    /// rows or the query's budget run out, or the plan is exhausted.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        t: &Tables,
        rtxn: &RoTxn<'_, heed::WithoutTls>,
        f: &Filter,
        ctx: &WalkCtx,
        budget: &mut Budget,
        step: &mut StepRows,
        mut visit: impl FnMut(Hit) -> Flow,
    ) -> Result<WalkEnd, StoreError> {
        match self {
            Walk::Ids { pending, ready } => {
                if let Some(ids) = pending.take() {
                    let check_tags = needs_tag_check(f, None);
                    let mut hits = Vec::with_capacity(ids.len());
                    for id in &ids {
                        step.0 = step.0.saturating_sub(1);
                        if !budget.take() {
                            break;
                        }
                        let Some(serial) = t.ids.get(rtxn, id)? else {
                            continue;
                        };
                        if serial >= ctx.snapshot_serial {
                            continue;
                        }
                        if let Some(hit) = load_if_match(t, rtxn, f, serial, ctx, check_tags)? {
                            hits.push(hit);
                        }
                    }
                    hits.sort_unstable_by_key(|a| (Reverse(a.created_at), a.id));
                    *ready = hits.into();
                }
                while let Some(hit) = ready.pop_front() {
                    match visit(hit) {
                        Flow::Continue => {}
                        Flow::Pause => return Ok(WalkEnd::Paused),
                        Flow::Stop => return Ok(WalkEnd::Done),
                    }
                }
                Ok(WalkEnd::Done)
            }
            Walk::Index(w) => match w.index {
                Index::Created => w.run(&t.by_created, t, rtxn, f, ctx, budget, step, visit),
                Index::Author => w.run(&t.by_author, t, rtxn, f, ctx, budget, step, visit),
                Index::Kind => w.run(&t.by_kind, t, rtxn, f, ctx, budget, step, visit),
                Index::AuthorKind => w.run(&t.by_author_kind, t, rtxn, f, ctx, budget, step, visit),
                Index::Tag => w.run(&t.by_tag, t, rtxn, f, ctx, budget, step, visit),
            },
        }
    }
}

impl IndexWalk {
    /// [`Walk::run`] over `table`, the index the plan chose.
    #[allow(clippy::too_many_arguments)]
    fn run<P: Prefix>(
        &mut self,
        table: &IndexTable<'_, P>,
        t: &Tables,
        rtxn: &RoTxn<'_, heed::WithoutTls>,
        f: &Filter,
        ctx: &WalkCtx,
        budget: &mut Budget,
        step: &mut StepRows,
        mut visit: impl FnMut(Hit) -> Flow,
    ) -> Result<WalkEnd, StoreError> {
        if !self.started {
            for r in self.ranges.iter_mut() {
                let mut it = table.rev_range(
                    rtxn,
                    &(Bound::Included(&r.lo[..]), Bound::Included(&r.hi[..])),
                )?;
                r.head = next_head(table, &mut it)?;
            }
            self.started = true;
        }
        // Iterators opened in this step, lazily, for the ranges whose head
        // is taken.
        let mut open: Vec<Option<RoRevRange<'_, IndexKeyCodec<P>, Unit>>> =
            (0..self.ranges.len()).map(|_| None).collect();
        let mut heap: BinaryHeap<((u64, u64), usize)> = self
            .ranges
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.head.map(|h| (h, i)))
            .collect();
        while let Some(&(at, i)) = heap.peek() {
            if step.0 == 0 {
                return Ok(WalkEnd::Paused);
            }
            if !budget.take() {
                return Ok(WalkEnd::Done);
            }
            step.0 -= 1;
            heap.pop();
            let r = &mut self.ranges[i];
            let mut it = match open[i].take() {
                Some(it) => it,
                None => {
                    let below = r.key_of(at);
                    table.rev_range(
                        rtxn,
                        &(Bound::Included(&r.lo[..]), Bound::Excluded(&below[..])),
                    )?
                }
            };
            r.head = next_head(table, &mut it)?;
            open[i] = Some(it);
            if let Some(h) = r.head {
                heap.push((h, i));
            }
            let serial = at.1;
            if self.last_serial == Some(serial) || serial >= ctx.snapshot_serial {
                continue;
            }
            self.last_serial = Some(serial);
            if let Some(hit) = load_if_match(t, rtxn, f, serial, ctx, self.check_tags)? {
                match visit(hit) {
                    Flow::Continue => {}
                    Flow::Pause => return Ok(WalkEnd::Paused),
                    Flow::Stop => return Ok(WalkEnd::Done),
                }
            }
        }
        Ok(WalkEnd::Done)
    }
}

/// Fixed for the whole query.
struct WalkCtx<'a> {
    now: u64,
    /// The query's snapshot: rows with this serial or above were committed
    /// after its first step, and are left to live delivery.
    snapshot_serial: u64,
    /// Who is asking, when some kinds are private (NIP-42): events of those
    /// kinds go only to their author or a `p`-tagged recipient.
    readers: Option<&'a Readers>,
}

/// The next `(created_at, serial)` of a range; a key that does not decode
/// is `Corrupt`.
fn next_head<P: Prefix>(
    table: &IndexTable<'_, P>,
    it: &mut RoRevRange<'_, IndexKeyCodec<P>, Unit>,
) -> Result<Option<(u64, u64)>, StoreError> {
    match it.next() {
        None => Ok(None),
        Some(Ok((at, ()))) => Ok(Some(at)),
        Some(Err(e)) => Err(table.error(e)),
    }
}

/// One filter's rows in final order: each timestamp collected whole, sorted
/// by id, and passed on as far as the limit allows.
struct Grouping {
    limit: u64,
    /// Rows of the timestamp being collected, unsorted.
    group: Vec<Hit>,
    /// Rows in final order, waiting for the merge.
    ready: VecDeque<Hit>,
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
        self.ready.extend(self.group.drain(..take));
        self.group.clear();
        self.passed += take as u64;
    }
}

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
                passed: 0,
            },
            complete,
        }
    }

    /// Walks until a row is ready, the filter is complete or the step's
    /// rows run out.
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
                } else if rows.ready.is_empty() {
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
        };
        Ok(Some((rtxn, ctx)))
    }

    /// One step of a REQ: appends the next events, in order, to `out`.
    pub fn query_step(
        &self,
        cur: &mut QueryCursor,
        limits: StepLimits,
        out: &mut Vec<String>,
    ) -> Result<StepOutput, StoreError> {
        let mut did = StepOutput::default();
        let Some((rtxn, ctx)) = self.open_step(
            cur.done,
            &mut cur.snapshot_serial,
            &cur.opts,
            cur.readers.as_deref(),
        )?
        else {
            did.done = true;
            return Ok(did);
        };
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
            let Some(hit) = cur.filters[i].rows.ready.pop_front() else {
                continue;
            };
            let key = (hit.created_at, hit.id);
            if cur.last_sent == Some(key) {
                continue;
            }
            cur.last_sent = Some(key);
            if cur.skip.contains(&hit.serial) {
                continue;
            }
            did.bytes += hit.raw.len() as u64;
            out.push(hit.raw);
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
        let Some((rtxn, ctx)) = self.open_step(
            cur.done,
            &mut cur.snapshot_serial,
            &cur.opts,
            cur.readers.as_deref(),
        )?
        else {
            did.done = true;
            return Ok(did);
        };
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

/// Loads an event and applies the full filter: header fields first, the
/// tags (which need the JSON parsed) only when the index did not answer them.
fn load_if_match(
    t: &Tables,
    rtxn: &RoTxn<'_, heed::WithoutTls>,
    f: &Filter,
    serial: u64,
    ctx: &WalkCtx<'_>,
    check_tags: bool,
) -> Result<Option<Hit>, StoreError> {
    let Some(StoredEvent { header: h, raw }) = t.events.get(rtxn, &Be64::new(serial))? else {
        return Ok(None);
    };
    if !header_matches(f, &h, ctx.now) {
        return Ok(None);
    }
    let private = ctx
        .readers
        .filter(|r| !r.may_read_header(h.kind, &h.pubkey));
    if check_tags || private.is_some() {
        match Event::parse(raw) {
            Ok(ev) if f.matches(&ev) && private.is_none_or(|r| r.may_read(&ev)) => {}
            _ => return Ok(None),
        }
    }
    Ok(Some(Hit {
        created_at: h.created_at,
        id: h.id,
        serial,
        raw: raw.to_owned(),
    }))
}

/// Whether rows need their JSON parsed to check tags: some tag condition
/// is not answered by the index scanned, a filter value is long enough
/// to have been indexed by its hash, or there are search words. Decided once per scan, not per row.
fn needs_tag_check(f: &Filter, covered_tag: Option<u8>) -> bool {
    // A NIP-50 `search` is checked on the parsed event too (a search the
    // full-text index does not answer, as when `[search]` is off, scans).
    if f.search.is_some() {
        return true;
    }
    let uncovered = f.tags.iter().any(|(l, _)| Some(*l) != covered_tag);
    let hashed = f
        .tags
        .iter()
        .any(|(_, v)| v.iter().any(|s| s.len() > MAX_INLINE_TAG_BYTES));
    uncovered || hashed
}

pub(crate) fn header_matches(f: &Filter, h: &Header, now: u64) -> bool {
    !h.is_expired(now)
        && f.matches_time(h.created_at)
        && f.ids
            .as_ref()
            .is_none_or(|v| v.binary_search(&h.id).is_ok())
        && f.authors
            .as_ref()
            .is_none_or(|v| v.binary_search(&h.pubkey).is_ok())
        && f.kinds
            .as_ref()
            .is_none_or(|v| v.binary_search(&h.kind).is_ok())
}
