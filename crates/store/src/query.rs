//! The read path: a planner that picks one index per filter, and scans that
//! walk the index newest first with the filter's time range in the key
//! range and the limit pushed down.
//!
//! Ordering is newest first, ties broken by the lowest id. Index keys order
//! equal timestamps by serial, so a scan that reaches its limit keeps
//! reading the rest of the last timestamp, then sorts by id and truncates:
//! exact, and bounded by the scan budget.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::ops::Bound;

use heed::RoTxn;
use sluice_proto::{Event, Filter};

use crate::keys::{self, Header};
use crate::{Index, META_NEXT_SERIAL, Store, StoreError, Tables, decode};

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
    match (&f.authors, &f.kinds) {
        (Some(a), Some(k)) if a.len() * k.len() <= MAX_AUTHOR_KIND_PREFIXES => scan(
            Index::AuthorKind,
            a.iter()
                .flat_map(|pk| {
                    k.iter()
                        .map(move |kind| keys::author_kind_prefix(pk, *kind))
                })
                .collect(),
        ),
        (Some(a), _) => scan(Index::Author, a.iter().map(keys::author_prefix).collect()),
        _ if !f.tags.is_empty() => {
            let (letter, values) = f
                .tags
                .iter()
                .min_by_key(|(_, v)| v.len())
                .expect("tags is not empty");
            Plan::Scan {
                index: Index::Tag,
                prefixes: values
                    .iter()
                    .map(|v| keys::tag_prefix(*letter, v))
                    .collect(),
                covered_tag: Some(*letter),
            }
        }
        (None, Some(k)) => scan(
            Index::Kind,
            k.iter().map(|k| keys::kind_prefix(*k)).collect(),
        ),
        (None, None) => scan(Index::Created, vec![Vec::new()]),
    }
}

/// One matching event as a scan yields it.
struct Hit<'t> {
    created_at: u64,
    id: [u8; 32],
    serial: u64,
    raw: &'t str,
}

/// Read budget shared by the filters of one query.
struct Budget {
    left: u64,
    used: u64,
    exhausted: bool,
}

impl Budget {
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

impl Store {
    /// Runs the filters of one REQ. Each filter's `limit` (None: no limit)
    /// caps its own newest matches; the union is deduplicated and returned
    /// newest first.
    pub fn query(
        &self,
        filters: &[Filter],
        opts: &QueryOptions,
    ) -> Result<QueryOutput, StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut budget = Budget {
            left: opts.max_scan_rows,
            used: 0,
            exhausted: false,
        };
        let mut all: Vec<Hit<'_>> = Vec::new();
        for f in filters.iter().filter(|f| !f.is_empty_match()) {
            let limit = f.limit.unwrap_or(u64::MAX) as usize;
            if limit == 0 {
                continue;
            }
            let mut got: Vec<Hit<'_>> = Vec::new();
            scan(&self.t, &rtxn, f, opts.now, &mut budget, |hit| {
                if got.len() >= limit && got.last().is_some_and(|l| hit.created_at < l.created_at) {
                    return false;
                }
                got.push(hit);
                true
            })?;
            sort_newest_first(&mut got);
            got.truncate(limit);
            all.extend(got);
        }
        sort_newest_first(&mut all);
        all.dedup_by_key(|h| h.serial);
        Ok(QueryOutput {
            events: all.iter().map(|h| h.raw.to_owned()).collect(),
            rows_scanned: budget.used,
            snapshot_serial: next_serial(&self.t, &rtxn)?,
            truncated: budget.exhausted,
        })
    }

    /// NIP-45: how many distinct stored events match any of the filters
    /// (limits ignored). Returns `(count, rows_scanned, truncated)`.
    pub fn count(
        &self,
        filters: &[Filter],
        opts: &QueryOptions,
    ) -> Result<(u64, u64, bool), StoreError> {
        let rtxn = self.env.read_txn()?;
        let mut budget = Budget {
            left: opts.max_scan_rows,
            used: 0,
            exhausted: false,
        };
        let live: Vec<&Filter> = filters.iter().filter(|f| !f.is_empty_match()).collect();
        let mut seen: HashSet<u64> = HashSet::new();
        let mut n = 0u64;
        for f in &live {
            scan(&self.t, &rtxn, f, opts.now, &mut budget, |hit| {
                if live.len() == 1 || seen.insert(hit.serial) {
                    n += 1;
                }
                true
            })?;
        }
        Ok((n, budget.used, budget.exhausted))
    }
}

fn next_serial(t: &Tables, rtxn: &RoTxn<'_>) -> Result<u64, StoreError> {
    Ok(match t.meta.get(rtxn, META_NEXT_SERIAL)? {
        Some(v) if v.len() == 8 => keys::read_u64(v),
        _ => 1,
    })
}

fn sort_newest_first(hits: &mut [Hit<'_>]) {
    hits.sort_unstable_by_key(|a| (Reverse(a.created_at), a.id));
}

/// Walks the filter's index newest first and calls `visit` with every
/// matching, unexpired event (each once) until `visit` returns false, the
/// index runs out, or the budget does.
fn scan<'t>(
    t: &Tables,
    rtxn: &'t RoTxn<'_>,
    f: &Filter,
    now: u64,
    budget: &mut Budget,
    mut visit: impl FnMut(Hit<'t>) -> bool,
) -> Result<(), StoreError> {
    let since = f.since.unwrap_or(0);
    let until = f.until.unwrap_or(u64::MAX);
    match plan(f) {
        Plan::Ids(ids) => {
            let mut hits = Vec::with_capacity(ids.len());
            for id in &ids {
                if !budget.take() {
                    break;
                }
                let Some(sv) = t.ids.get(rtxn, id)? else {
                    continue;
                };
                let serial = keys::read_u64(sv);
                if let Some(hit) = load_if_match(t, rtxn, f, serial, now, needs_tag_check(f, None))?
                {
                    hits.push(hit);
                }
            }
            sort_newest_first(&mut hits);
            for h in hits {
                if !visit(h) {
                    break;
                }
            }
        }
        Plan::Scan {
            index,
            prefixes,
            covered_tag,
        } => {
            let table = t.index(index);
            let check_tags = needs_tag_check(f, covered_tag);
            let bounds: Vec<(Vec<u8>, Vec<u8>)> = prefixes
                .iter()
                .map(|p| {
                    (
                        keys::index_key(p, since, 0),
                        keys::index_key(p, until, u64::MAX),
                    )
                })
                .collect();
            let mut iters = Vec::with_capacity(bounds.len());
            for (lo, hi) in &bounds {
                iters.push(
                    table.rev_range(rtxn, &(Bound::Included(&lo[..]), Bound::Included(&hi[..])))?,
                );
            }
            // Heads of every prefix's scan, largest (newest) first.
            let mut heap = BinaryHeap::with_capacity(iters.len());
            for (i, it) in iters.iter_mut().enumerate() {
                if let Some(item) = it.next() {
                    let (k, _) = item?;
                    heap.push((keys::split_index_key(k), i));
                }
            }
            let mut last_serial = None;
            while let Some(((_, serial), i)) = heap.pop() {
                if !budget.take() {
                    break;
                }
                if let Some(item) = iters[i].next() {
                    let (k, _) = item?;
                    heap.push((keys::split_index_key(k), i));
                }
                // The same event can sit under several prefixes (two tag
                // values); equal keys pop one after the other.
                if last_serial == Some(serial) {
                    continue;
                }
                last_serial = Some(serial);
                if let Some(hit) = load_if_match(t, rtxn, f, serial, now, check_tags)?
                    && !visit(hit)
                {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Loads an event and applies the full filter: header fields first, the
/// tags (which need the JSON parsed) only when the index did not answer them.
fn load_if_match<'t>(
    t: &Tables,
    rtxn: &'t RoTxn<'_>,
    f: &Filter,
    serial: u64,
    now: u64,
    check_tags: bool,
) -> Result<Option<Hit<'t>>, StoreError> {
    let sk = keys::serial(serial);
    let Some(value) = t.events.get(rtxn, &sk)? else {
        return Ok(None);
    };
    let (h, raw) = decode(value, &sk)?;
    if !header_matches(f, &h, now) {
        return Ok(None);
    }
    if check_tags {
        match Event::parse(raw) {
            Ok(ev) if f.matches(&ev) => {}
            _ => return Ok(None),
        }
    }
    Ok(Some(Hit {
        created_at: h.created_at,
        id: h.id,
        serial,
        raw,
    }))
}

/// Whether rows need their JSON parsed to check tags: some tag condition
/// is not answered by the index scanned, or a filter value is long enough
/// to have been indexed by its hash. Decided once per scan, not per row.
fn needs_tag_check(f: &Filter, covered_tag: Option<u8>) -> bool {
    let uncovered = f.tags.iter().any(|(l, _)| Some(*l) != covered_tag);
    let hashed = f
        .tags
        .iter()
        .any(|(_, v)| v.iter().any(|s| s.len() > keys::MAX_INLINE_TAG_BYTES));
    uncovered || hashed
}

fn header_matches(f: &Filter, h: &Header, now: u64) -> bool {
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
