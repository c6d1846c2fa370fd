//! The ranked collector: the best `k` documents of a search by the full
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
//! is skipped, one that ties it is compared by the rest of the key.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use tantivy::collector::{Collector, SegmentCollector};
use tantivy::columnar::Column;
use tantivy::query::Weight;
use tantivy::{DocId, Score, SegmentOrdinal, SegmentReader};

use crate::index::RankedHit;

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

/// One segment's best `k`: a min-heap of the keys held.
pub(crate) struct RankedSegment {
    k: usize,
    after: Option<RankedHit>,
    heap: BinaryHeap<Reverse<Key>>,
    created_at: Option<Column<u64>>,
    serial: Option<Column<u64>>,
}

impl RankedSegment {
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
        if self.after.is_some_and(|a| Key(hit) >= Key(a)) {
            return self.threshold();
        }
        if !full {
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
}

impl SegmentCollector for RankedSegment {
    type Fruit = Vec<RankedHit>;

    fn collect(&mut self, doc: DocId, score: Score) {
        self.offer(doc, score);
    }

    fn harvest(self) -> Vec<RankedHit> {
        self.heap.into_iter().map(|Reverse(Key(h))| h).collect()
    }
}

impl Collector for Ranked {
    type Fruit = Vec<RankedHit>;
    type Child = RankedSegment;

    fn for_segment(
        &self,
        _segment_local_id: SegmentOrdinal,
        segment: &SegmentReader,
    ) -> tantivy::Result<RankedSegment> {
        let fast = segment.fast_fields();
        Ok(RankedSegment {
            k: self.k,
            after: self.after,
            heap: BinaryHeap::with_capacity(self.k.min(1024) + 1),
            created_at: fast.u64("created_at").ok(),
            serial: fast.u64("serial").ok(),
        })
    }

    fn requires_scoring(&self) -> bool {
        true
    }

    fn merge_fruits(&self, segments: Vec<Vec<RankedHit>>) -> tantivy::Result<Vec<RankedHit>> {
        let mut all: Vec<RankedHit> = segments.into_iter().flatten().collect();
        sort_best_first(&mut all);
        all.truncate(self.k);
        Ok(all)
    }

    /// Walks the segment through the scorer's pruning (block-max for a
    /// single word), deleted documents left out.
    fn collect_segment(
        &self,
        weight: &dyn Weight,
        segment_ord: SegmentOrdinal,
        reader: &SegmentReader,
    ) -> tantivy::Result<Vec<RankedHit>> {
        let mut seg = self.for_segment(segment_ord, reader)?;
        match reader.alive_bitset() {
            Some(alive) => {
                let mut threshold = Score::MIN;
                weight.for_each_pruning(Score::MIN, reader, &mut |doc, score| {
                    if alive.is_alive(doc) {
                        threshold = seg.offer(doc, score);
                    }
                    threshold
                })?
            }
            None => weight
                .for_each_pruning(Score::MIN, reader, &mut |doc, score| seg.offer(doc, score))?,
        }
        Ok(seg.harvest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(k: usize) -> RankedSegment {
        RankedSegment {
            k,
            after: None,
            heap: BinaryHeap::new(),
            created_at: None,
            serial: None,
        }
    }

    #[test]
    fn the_threshold_lets_a_tie_with_the_kth_through() {
        let mut s = seg(2);
        assert_eq!(s.offer(0, 3.0), Score::MIN);
        let t = s.offer(1, 2.0);
        assert!(t < 2.0 && t.next_up() == 2.0, "{t}");
        // Below the k-th: refused, threshold unchanged.
        assert_eq!(s.offer(2, 1.0), t);
        let t = s.offer(3, 5.0);
        assert!(t < 3.0 && t.next_up() == 3.0, "{t}");
        let mut hits = s.harvest();
        sort_best_first(&mut hits);
        let scores: Vec<f32> = hits.iter().map(|h| h.score).collect();
        assert_eq!(scores, [5.0, 3.0]);
    }

    #[test]
    fn a_tie_is_ranked_by_created_at_then_serial() {
        let hits = |v: &[(f32, u64, u64)]| -> Vec<RankedHit> {
            v.iter()
                .map(|&(score, created_at, serial)| RankedHit {
                    score,
                    created_at,
                    serial,
                })
                .collect()
        };
        let r = Ranked { k: 3, after: None };
        let merged = r
            .merge_fruits(vec![
                hits(&[(1.0, 10, 1), (1.0, 30, 2)]),
                hits(&[(1.0, 30, 7), (2.0, 5, 3), (0.5, 99, 9)]),
            ])
            .unwrap();
        let got: Vec<(f32, u64, u64)> = merged
            .iter()
            .map(|h| (h.score, h.created_at, h.serial))
            .collect();
        assert_eq!(got, [(2.0, 5, 3), (1.0, 30, 7), (1.0, 30, 2)]);
    }

    #[test]
    fn k_zero_takes_nothing() {
        let mut s = seg(0);
        assert_eq!(s.offer(0, 1.0), Score::INFINITY);
        assert!(s.harvest().is_empty());
    }

    /// Against every matching document sorted by the full key: a RAM
    /// index of several segments with deletions, whose texts tie on score
    /// by the hundred, created_at and serial drawn so ties cross pages.
    #[test]
    fn it_takes_the_same_pages_as_a_full_sort() {
        use tantivy::collector::DocSetCollector;
        use tantivy::query::{Query, TermQuery};
        use tantivy::schema::{FAST, INDEXED, IndexRecordOption, Schema, TEXT};
        use tantivy::{Index, TantivyDocument, Term};

        let mut b = Schema::builder();
        let serial = b.add_u64_field("serial", INDEXED | FAST);
        let created_at = b.add_u64_field("created_at", FAST);
        let text = b.add_text_field("text", TEXT);
        let index = Index::create_in_ram(b.build());
        let mut w = index.writer_with_num_threads(1, 15_000_000).unwrap();
        let texts = ["gm", "gm gm", "gm nostr", "gm nostr relay", "nostr relay"];
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for s in 0..3000u64 {
            let mut d = TantivyDocument::default();
            d.add_u64(serial, s);
            d.add_u64(created_at, 1000 + next() % 40);
            d.add_text(text, texts[(next() % 5) as usize]);
            w.add_document(d).unwrap();
            if s % 700 == 699 {
                w.commit().unwrap();
            }
            if s % 11 == 0 && s > 0 {
                w.delete_term(Term::from_field_u64(serial, s - 1));
            }
        }
        w.commit().unwrap();
        let reader = index.reader().unwrap();
        let searcher = reader.searcher();
        assert!(searcher.segment_readers().len() > 1);
        for word in ["gm", "relay"] {
            let q = TermQuery::new(
                Term::from_field_text(text, word),
                IndexRecordOption::WithFreqs,
            );
            // Every match, scored and keyed, then sorted.
            let weight = q
                .weight(tantivy::query::EnableScoring::enabled_from_searcher(
                    &searcher,
                ))
                .unwrap();
            let mut all = Vec::new();
            for addr in searcher.search(&q, &DocSetCollector).unwrap() {
                let seg = searcher.segment_reader(addr.segment_ord);
                let mut scorer = weight.scorer(seg, 1.0).unwrap();
                use tantivy::DocSet;
                assert_eq!(scorer.seek(addr.doc_id), addr.doc_id);
                let fast = seg.fast_fields();
                all.push(RankedHit {
                    score: tantivy::query::Scorer::score(&mut *scorer),
                    created_at: fast.u64("created_at").unwrap().first(addr.doc_id).unwrap(),
                    serial: fast.u64("serial").unwrap().first(addr.doc_id).unwrap(),
                });
            }
            sort_best_first(&mut all);
            assert!(all.len() > 500, "{word}: {}", all.len());
            let key = |h: &RankedHit| (h.score, h.created_at, h.serial);
            let all_keys: Vec<_> = all.iter().map(key).collect();
            for k in [1, 7, 50, 333, all.len() + 5] {
                let got = searcher.search(&q, &Ranked { k, after: None }).unwrap();
                let got: Vec<_> = got.iter().map(key).collect();
                assert_eq!(got, all_keys[..k.min(all.len())], "{word} k={k}");
                // Page by page below the last hit: the same order, to the end.
                let mut paged = Vec::new();
                let mut after = None;
                loop {
                    let page = searcher.search(&q, &Ranked { k, after }).unwrap();
                    assert!(page.len() <= k);
                    let Some(last) = page.last() else { break };
                    after = Some(*last);
                    paged.extend(page.iter().map(key));
                }
                assert_eq!(paged, all_keys, "{word} pages of {k}");
            }
        }
    }
}
