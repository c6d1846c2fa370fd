//! A REQ or COUNT with NIP-50 `search` filters, in bounded steps: each
//! search filter's hits come from the index ranked (relevance, then
//! recency), a page per step, and every hit is checked against the store
//! in the step's one read transaction before it is answered: an event
//! the store no longer holds (deleted, replaced, purged, vanished) is
//! never served, and its document is handed to the indexer for removal;
//! an expired one, or one the rest of the filter or the reader's rights
//! exclude, is skipped. A filter without `search` in the same REQ runs
//! as the store's own query after the search filters, skipping what they
//! answered or counted (an event is sent or counted once).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use sluice_proto::{Filter, Readers};
use sluice_store::{
    CountCursor, EventChunk, QueryCursor, QueryOptions, SerialLookup, StepLimits, StepOutput, Store,
};
use tantivy::Searcher;

use crate::index::{SearchError, SearchIndex};
use crate::metrics_names as m;
use crate::rank::RankedHit;

/// Hits a COUNT checks per step.
const COUNT_PAGE: usize = 1024;
/// Most hits a REQ's search filter asks the index for per step (over
/// what its limit still wants, for the hits the store's check drops).
const REQ_PAGE_MAX: usize = 512;
const REQ_PAGE_SLACK: usize = 8;
/// Most hits a REQ's search filter ranks in one step: what its limit
/// wants (and the slack), in rankings of at most this many, each taking
/// up below the last (a step stays short, and no ranking walks again the
/// hits before it).
const RANK_AHEAD_MAX: usize = 1024;

enum Part {
    Search {
        filter: Filter,
        /// The filter a hit is checked against in the store: `filter`
        /// without its words (the index matched them, and a serial's
        /// content never changes), so the check does not split every
        /// event into words again.
        check: Box<Filter>,
        /// A COUNT's matches from the index, checked a page per step.
        to_check: Option<std::collections::VecDeque<u64>>,
        /// A REQ's hits ranked ahead, not yet checked against the store.
        ranked: VecDeque<RankedHit>,
        /// The index has no hits below `after`.
        exhausted: bool,
        /// The last hit ranked so far.
        after: Option<RankedHit>,
        found: u64,
        limit: u64,
        done: bool,
    },
    Plain(QueryCursor),
    PlainCount(CountCursor),
}

/// A REQ (`count: false`) or a COUNT whose filters include a search.
pub struct SearchCursor {
    index: Arc<SearchIndex>,
    searcher: Option<Searcher>,
    parts: Vec<Part>,
    next: usize,
    opts: QueryOptions,
    readers: Option<Arc<Readers>>,
    snapshot: Option<u64>,
    /// Serials answered by the search filters (an event matched by two is
    /// sent or counted once).
    seen: HashSet<u64>,
    ready: VecDeque<String>,
    /// Hits read from the index so far (against `opts.max_scan_rows`).
    scanned: u64,
    truncated: bool,
    count: u64,
    counting: bool,
    done: bool,
}

impl SearchCursor {
    /// A REQ over `filters` (limits set) or, with `count`, a COUNT.
    pub fn new(
        index: Arc<SearchIndex>,
        filters: Vec<Filter>,
        opts: QueryOptions,
        readers: Arc<Readers>,
        count: bool,
    ) -> SearchCursor {
        let (search, plain): (Vec<Filter>, Vec<Filter>) = filters
            .into_iter()
            .filter(|f| !f.is_empty_match() && f.limit != Some(0))
            .partition(|f| f.search.is_some());
        let mut parts: Vec<Part> = search
            .into_iter()
            .map(|filter| Part::Search {
                limit: if count {
                    u64::MAX
                } else {
                    filter.limit.unwrap_or(u64::MAX)
                },
                check: Box::new(Filter {
                    search: None,
                    ..filter.clone()
                }),
                filter,
                to_check: None,
                ranked: VecDeque::new(),
                exhausted: false,
                after: None,
                found: 0,
                done: false,
            })
            .collect();
        if !plain.is_empty() {
            parts.push(if count {
                Part::PlainCount(CountCursor::new(plain, opts).for_readers(readers.clone()))
            } else {
                Part::Plain(QueryCursor::new(plain, opts).for_readers(readers.clone()))
            });
        }
        SearchCursor {
            index,
            searcher: None,
            parts,
            next: 0,
            opts,
            readers: Some(readers),
            snapshot: None,
            seen: HashSet::new(),
            ready: VecDeque::new(),
            scanned: 0,
            truncated: false,
            count: 0,
            counting: count,
            done: false,
        }
    }

    /// Serials below this were visible to the query; live delivery takes
    /// over from here.
    pub fn snapshot_serial(&self) -> Option<u64> {
        self.snapshot
    }

    /// The index's or the store's scan budget ran out before the limits
    /// were met.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether this is a COUNT.
    pub fn counting(&self) -> bool {
        self.counting
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// One step: answers ranked events into `out` (a REQ) or counts
    /// (a COUNT). `rows` is the postings walked (in rows,
    /// `SearchIndex::cost_rows`) and the hits checked.
    pub fn step(
        &mut self,
        store: &Store,
        limits: StepLimits,
        out: &mut EventChunk,
    ) -> Result<StepOutput, SearchError> {
        let mut did = StepOutput::default();
        if self.snapshot.is_none() {
            self.snapshot = Some(store.next_serial()?);
        }
        loop {
            while let Some(raw) = self.ready.pop_front() {
                did.bytes += raw.len() as u64;
                out.push(&raw);
                if did.bytes >= limits.bytes {
                    return Ok(did);
                }
            }
            if did.rows > 0 && did.rows >= limits.rows {
                return Ok(did);
            }
            let Some(part) = self.parts.get_mut(self.next) else {
                self.done = true;
                did.done = true;
                return Ok(did);
            };
            match part {
                Part::Search { .. } => {
                    did.rows += self.search_page(store)?;
                }
                Part::Plain(cur) => {
                    // What the search filters answered is not sent again.
                    cur.skip_serials(std::mem::take(&mut self.seen));
                    let plain = store.query_step(cur, limits, out)?;
                    did.rows += plain.rows;
                    did.bytes += plain.bytes;
                    if plain.done {
                        self.truncated |= cur.truncated();
                        self.next += 1;
                    }
                    return Ok(did);
                }
                Part::PlainCount(cur) => {
                    // What the search filters counted is not counted again.
                    cur.skip_serials(std::mem::take(&mut self.seen));
                    let plain = store.count_step(cur, limits)?;
                    did.rows += plain.rows;
                    if plain.done {
                        self.truncated |= cur.truncated();
                        self.count += cur.count();
                        self.next += 1;
                    }
                    return Ok(did);
                }
            }
        }
    }

    /// One page of the current search filter: its hits, checked against
    /// the store. Returns the rows it cost.
    fn search_page(&mut self, store: &Store) -> Result<u64, SearchError> {
        let snapshot = self.snapshot.unwrap_or(0);
        let counting = self.counting;
        let Some(Part::Search {
            filter,
            check,
            to_check,
            ranked,
            exhausted,
            after,
            found,
            limit,
            done,
        }) = self.parts.get_mut(self.next)
        else {
            return Ok(0);
        };
        if counting && !*done {
            // A COUNT takes every match from the index at once (order does
            // not matter) and checks them against the store a page a step.
            let mut rows = 0;
            let searcher = self
                .searcher
                .get_or_insert_with(|| self.index.fresh_searcher());
            let pending = match to_check {
                Some(p) => p,
                None => {
                    let postings = self.index.postings(searcher, filter);
                    metrics::counter!(m::SEARCH_POSTINGS_TOTAL).increment(postings);
                    rows += self.index.cost_rows(searcher, filter);
                    let left = self.opts.max_scan_rows.saturating_sub(self.scanned);
                    let (serials, more) = self.index.matching_serials(searcher, filter, left)?;
                    self.truncated |= more;
                    self.scanned += serials.len() as u64;
                    to_check.insert(serials.into())
                }
            };
            let page: Vec<u64> = pending
                .drain(..pending.len().min(COUNT_PAGE))
                .filter(|s| *s < snapshot)
                .collect();
            rows += page.len() as u64;
            let looked = store.lookup_serials(&page, check, &self.opts, self.readers.as_deref())?;
            let (mut gone, mut unmatched) = (0u64, 0u64);
            for (serial, look) in page.iter().zip(looked) {
                match look {
                    SerialLookup::Gone => {
                        gone += 1;
                        self.index.forget(*serial);
                    }
                    SerialLookup::NoMatch => unmatched += 1,
                    SerialLookup::Match { .. } => {
                        if self.seen.insert(*serial) {
                            self.count += 1;
                        }
                    }
                }
            }
            count_dropped(gone, unmatched);
            if pending.is_empty() {
                *done = true;
                self.next += 1;
            }
            return Ok(rows);
        }
        let left = self.opts.max_scan_rows.saturating_sub(self.scanned);
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        let wanted = usize::try_from(limit.saturating_sub(*found))
            .unwrap_or(usize::MAX)
            .saturating_add(REQ_PAGE_SLACK);
        let mut rows = 0;
        if ranked.is_empty() && !*exhausted && !*done && left > 0 {
            // Rank what the limit still wants at once; later pages only
            // check what was ranked.
            let ahead = wanted.min(RANK_AHEAD_MAX).min(left);
            let searcher = self
                .searcher
                .get_or_insert_with(|| self.index.fresh_searcher());
            let postings = self.index.postings(searcher, filter);
            metrics::counter!(m::SEARCH_POSTINGS_TOTAL).increment(postings);
            rows += self.index.cost_rows(searcher, filter);
            let hits = self.index.search(searcher, filter, *after, ahead)?;
            *exhausted = hits.len() < ahead;
            *after = hits.last().copied().or(*after);
            ranked.extend(hits);
        }
        let page = wanted.min(REQ_PAGE_MAX).min(left).min(ranked.len());
        if *done || page == 0 {
            if !*done && left == 0 && !(ranked.is_empty() && *exhausted) {
                self.truncated = true;
            }
            *done = true;
            self.next += 1;
            return Ok(rows);
        }
        self.scanned += page as u64;
        let serials: Vec<u64> = ranked
            .drain(..page)
            .map(|h| h.serial)
            .filter(|s| *s < snapshot)
            .collect();
        let looked = store.lookup_serials(&serials, check, &self.opts, self.readers.as_deref())?;
        let (mut gone, mut unmatched) = (0u64, 0u64);
        for (serial, look) in serials.iter().zip(looked) {
            match look {
                SerialLookup::Gone => {
                    gone += 1;
                    self.index.forget(*serial);
                }
                SerialLookup::NoMatch => unmatched += 1,
                SerialLookup::Match { raw, .. } => {
                    if *found >= *limit {
                        break;
                    }
                    if self.seen.insert(*serial) {
                        *found += 1;
                        self.ready.push_back(raw);
                    }
                }
            }
        }
        count_dropped(gone, unmatched);
        if (ranked.is_empty() && *exhausted) || *found >= *limit {
            *done = true;
        } else if self.scanned >= self.opts.max_scan_rows {
            *done = true;
            self.truncated = true;
        }
        if *done {
            self.next += 1;
        }
        Ok(rows + page as u64)
    }
}

fn count_dropped(gone: u64, unmatched: u64) {
    if gone > 0 {
        metrics::counter!(m::SEARCH_HITS_DROPPED_TOTAL, "reason" => "gone").increment(gone);
    }
    if unmatched > 0 {
        metrics::counter!(m::SEARCH_HITS_DROPPED_TOTAL, "reason" => "unmatched")
            .increment(unmatched);
    }
}
