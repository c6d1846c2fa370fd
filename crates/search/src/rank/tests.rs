//! Unit tests of the ranked collector (`rank.rs`): the threshold, ties, and
//! pages against a full sort.

use super::*;

fn seg(k: usize) -> Best {
    Best {
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
    // Two segments' hits offered into one heap, as `best` walks them.
    let mut s = seg(3);
    for h in hits(&[(1.0, 10, 1), (1.0, 30, 2)])
        .into_iter()
        .chain(hits(&[(1.0, 30, 7), (2.0, 5, 3), (0.5, 99, 9)]))
    {
        s.offer_hit(h);
    }
    let got: Vec<(f32, u64, u64)> = s
        .harvest()
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
            let got = Ranked { k, after: None }.best(&searcher, &q).unwrap();
            let got: Vec<_> = got.iter().map(key).collect();
            assert_eq!(got, all_keys[..k.min(all.len())], "{word} k={k}");
            // Page by page below the last hit: the same order, to the end.
            let mut paged = Vec::new();
            let mut after = None;
            loop {
                let page = Ranked { k, after }.best(&searcher, &q).unwrap();
                assert!(page.len() <= k);
                let Some(last) = page.last() else { break };
                after = Some(*last);
                paged.extend(page.iter().map(key));
            }
            assert_eq!(paged, all_keys, "{word} pages of {k}");
        }
    }
}
