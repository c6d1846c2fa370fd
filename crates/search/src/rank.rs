//! The ranked walk: the best `k` documents of a search by the full
//! key (score, then created_at, then serial, all highest first), exactly,
//! with tantivy's block-max pruning kept.
//!
//! tantivy's `TopDocs` by score prunes with a threshold it only passes
//! documents strictly above, and breaks ties by document id. BM25 ties
//! are common (a document's length is quantised into 256 buckets), so a
//! tie at the page's end would be broken by where a document sits in the
//! index, not by recency. Here the threshold handed to the scorer is the
//! float just below the k-th best score once `k` documents are held: a
//! block or document whose best score is below the k-th cannot enter and
//! is skipped, one that ties it is compared by the rest of the key. One
//! heap is held across the segments, so a segment starts from the k-th
//! best of those walked before it.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use tantivy::columnar::Column;
use tantivy::query::{EnableScoring, Query, Weight};
use tantivy::{DocId, Score, Searcher, SegmentReader};

/// One ranked hit: relevance, then recency, then the newer serial.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankedHit {
    pub score: f32,
    pub created_at: u64,
    pub serial: u64,
}

/// A hit ordered by the ranking: greater is better.
#[derive(Debug, Clone, Copy)]
struct Key(RankedHit);

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .score
            .total_cmp(&other.0.score)
            .then(self.0.created_at.cmp(&other.0.created_at))
            .then(self.0.serial.cmp(&other.0.serial))
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Key {}

/// Orders hits best first (the order pages are served in).
pub(crate) fn sort_best_first(hits: &mut [RankedHit]) {
    hits.sort_unstable_by_key(|h| Reverse(Key(*h)));
}

/// The best `k` hits of a search, best first; with `after`, the best `k`
/// ranked below that hit (the next page: no hit is ranked twice, and no
/// ranking walks again what the pages before it took).
pub(crate) struct Ranked {
    pub k: usize,
    pub after: Option<RankedHit>,
}

/// The best `k` held so far, across the segments walked: a min-heap of
/// the keys, and the segment being walked's recency columns.
pub(crate) struct Best {
    k: usize,
    after: Option<RankedHit>,
    heap: BinaryHeap<Reverse<Key>>,
    created_at: Option<Column<u64>>,
    serial: Option<Column<u64>>,
}

impl Best {
    /// Offers a document; returns the score a later document must exceed
    /// to be offered (the float below the k-th best once `k` are held, so
    /// a tie with the k-th is still offered).
    fn offer(&mut self, doc: DocId, score: Score) -> Score {
        if self.k == 0 {
            return Score::INFINITY;
        }
        let full = self.heap.len() >= self.k;
        let below_kth = full
            && self
                .heap
                .peek()
                .is_some_and(|Reverse(min)| score < min.0.score);
        // Above the page before: ranked already.
        if below_kth || self.after.is_some_and(|a| score > a.score) {
            return self.threshold();
        }
        let hit = RankedHit {
            score,
            created_at: self
                .created_at
                .as_ref()
                .and_then(|c| c.first(doc))
                .unwrap_or(0),
            serial: self.serial.as_ref().and_then(|c| c.first(doc)).unwrap_or(0),
        };
        self.offer_hit(hit)
    }

    /// Offers a hit whose score may enter: held if it ranks below the
    /// page before and above the k-th best held.
    fn offer_hit(&mut self, hit: RankedHit) -> Score {
        if self.after.is_some_and(|a| Key(hit) >= Key(a)) {
            return self.threshold();
        }
        if self.heap.len() < self.k {
            self.heap.push(Reverse(Key(hit)));
        } else if let Some(mut min) = self.heap.peek_mut()
            && Key(hit) > min.0
        {
            *min = Reverse(Key(hit));
        }
        self.threshold()
    }

    fn threshold(&self) -> Score {
        match self.heap.peek() {
            Some(Reverse(min)) if self.heap.len() >= self.k => min.0.score.next_down(),
            _ => Score::MIN,
        }
    }

    /// Walks one segment through the scorer's pruning (block-max for a
    /// single word), deleted documents left out, starting from the
    /// threshold the segments before it left: scores are the searcher's
    /// (BM25 over every segment), so a block that cannot beat the k-th
    /// best found anywhere is skipped in every segment, not only once a
    /// segment has filled its own `k`.
    fn walk(&mut self, weight: &dyn Weight, reader: &SegmentReader) -> tantivy::Result<()> {
        let fast = reader.fast_fields();
        self.created_at = fast.u64("created_at").ok();
        self.serial = fast.u64("serial").ok();
        let start = self.threshold();
        match reader.alive_bitset() {
            Some(alive) => {
                let mut threshold = start;
                weight.for_each_pruning(start, reader, &mut |doc, score| {
                    if alive.is_alive(doc) {
                        threshold = self.offer(doc, score);
                    }
                    threshold
                })
            }
            None => {
                weight.for_each_pruning(start, reader, &mut |doc, score| self.offer(doc, score))
            }
        }
    }

    /// The hits held, best first.
    fn harvest(self) -> Vec<RankedHit> {
        let mut hits: Vec<RankedHit> = self.heap.into_iter().map(|Reverse(Key(h))| h).collect();
        sort_best_first(&mut hits);
        hits
    }
}

impl Ranked {
    /// The best `k` hits of `query` in `searcher` (below `after` when
    /// given), best first: one heap across the segments, walked in turn.
    pub(crate) fn best(
        &self,
        searcher: &Searcher,
        query: &dyn Query,
    ) -> tantivy::Result<Vec<RankedHit>> {
        if self.k == 0 {
            return Ok(Vec::new());
        }
        let mut held = Best {
            k: self.k,
            after: self.after,
            heap: BinaryHeap::with_capacity(self.k.min(1024) + 1),
            created_at: None,
            serial: None,
        };
        let weight = query.weight(EnableScoring::enabled_from_searcher(searcher))?;
        for reader in searcher.segment_readers() {
            held.walk(weight.as_ref(), reader)?;
        }
        Ok(held.harvest())
    }
}

#[cfg(test)]
mod tests;
