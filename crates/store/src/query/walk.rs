//! One filter's walk over its plan, resumable between steps: the ids looked
//! up, or the index ranges merged newest first, each resumed below its last
//! row taken; the scan budget a query's filters share; and the full filter
//! applied to each row's event (header first, tags only when needed).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Bound;

use heed::types::Unit;
use heed::{RoRevRange, RoTxn};
use sluice_proto::{Event, Filter, Readers};

use crate::StoreError;
use crate::codec::{Be64, Header, IndexKeyCodec, Prefix, StoredEvent, index_key};
use crate::query::planner::{Plan, needs_tag_check, plan};
use crate::tables::{Index, IndexTable, Tables};

/// One matching event: its order, and its JSON where the step's read
/// transaction reads it, copied out only if the hit outlives the step
/// ([`Hit::own`]): an event answered in the step that read it is copied
/// once, into the step's chunk.
pub(super) struct Hit {
    pub(super) created_at: u64,
    pub(super) id: [u8; 32],
    pub(super) serial: u64,
    raw: Json,
}

/// A hit's JSON.
enum Json {
    /// None was asked for (a COUNT).
    None,
    /// In the store's map, as the step's read transaction reads it (LMDB
    /// keeps a read transaction's pages in place until it ends); checked
    /// UTF-8 when decoded.
    Mapped {
        ptr: *const u8,
        len: usize,
    },
    Owned(Box<str>),
}

// SAFETY: a `Json::Mapped` never leaves the step, and so the thread, that
// read it: every hit a step keeps is made owned (`Hit::own`) before the
// step's transaction ends (`QueryCursor`'s `OwnHits`, on every exit).
unsafe impl Send for Hit {}

impl Hit {
    /// The event's JSON (empty for a COUNT's hit).
    pub(super) fn raw(&self) -> &str {
        match &self.raw {
            Json::None => "",
            // SAFETY: the transaction that read these bytes is still
            // open (see `Json::Mapped`), and they were checked UTF-8.
            Json::Mapped { ptr, len } => unsafe {
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(*ptr, *len))
            },
            Json::Owned(s) => s,
        }
    }

    /// Bytes of JSON.
    pub(super) fn len(&self) -> usize {
        match &self.raw {
            Json::None => 0,
            Json::Mapped { len, .. } => *len,
            Json::Owned(s) => s.len(),
        }
    }

    /// Copies the JSON out of the map: the hit outlives the transaction
    /// that read it.
    pub(super) fn own(&mut self) {
        if let Json::Mapped { .. } = self.raw {
            self.raw = Json::Owned(self.raw().into());
        }
    }
}

/// Read budget shared by the filters of one query.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    left: u64,
    pub(super) used: u64,
    pub(super) exhausted: bool,
}

impl Budget {
    pub(super) fn new(max_rows: u64) -> Budget {
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
pub(super) struct StepRows(pub(super) u64);

/// What a walk's visitor wants next.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    /// Go on.
    Continue,
    /// Stop for now (the row was taken; the walk resumes after it).
    Pause,
    /// The filter needs no more rows.
    Stop,
}

/// Why a walk returned.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum WalkEnd {
    /// The visitor paused, or the step's rows ran out: resume later.
    Paused,
    /// The index (or the ids), the query's budget or the visitor's wants
    /// are done: the filter is complete.
    Done,
}

/// A resumable walk over one filter's plan.
pub(super) enum Walk {
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
pub(super) struct IndexWalk {
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
    pub(super) fn new(f: &Filter) -> Walk {
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

    /// The hits it holds own their JSON (see [`Hit::own`]).
    pub(super) fn own_hits(&mut self) {
        if let Walk::Ids { ready, .. } = self {
            ready.iter_mut().for_each(Hit::own);
        }
    }

    /// Hands matching, unexpired rows with a serial below the snapshot to
    /// `visit`, newest first, until the visitor pauses or stops, the step's
    /// rows or the query's budget run out, or the plan is exhausted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
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
pub(super) struct WalkCtx<'a> {
    pub(super) now: u64,
    /// The query's snapshot: rows with this serial or above were committed
    /// after its first step, and are left to live delivery.
    pub(super) snapshot_serial: u64,
    /// Who is asking, when some kinds are private (NIP-42): events of those
    /// kinds go only to their author or a `p`-tagged recipient.
    pub(super) readers: Option<&'a Readers>,
    /// Hits carry their event's JSON (a REQ), or not (a COUNT).
    pub(super) with_json: bool,
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
        raw: if ctx.with_json {
            Json::Mapped {
                ptr: raw.as_ptr(),
                len: raw.len(),
            }
        } else {
            Json::None
        },
    }))
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
