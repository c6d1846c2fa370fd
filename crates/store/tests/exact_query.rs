//! Exact behaviour of the read path beyond `rules.rs` and `steps.rs`: the
//! plan each filter shape gets (`plan_shape`), the rows a query reads
//! (a limit stops the scan), the cursors' snapshot, row counts and
//! truncation, one unbounded step doing the whole query, and private kinds.

use std::sync::Arc;

use serde_json::json;
use sluice_proto::{Event, Readers, hex32};
use sluice_store::{CountCursor, PlanShape, QueryCursor, QueryOptions, StepLimits, plan_shape};

use crate::support;

use support::{ev, filter, open, pk};

const NOW: u64 = 1_700_000_000;

fn opts(max_scan_rows: u64) -> QueryOptions {
    QueryOptions {
        now: NOW,
        max_scan_rows,
    }
}

fn shape(v: serde_json::Value) -> PlanShape {
    plan_shape(&filter(v))
}

fn scan(prefixes: usize, keyed: bool, post_filter: bool) -> PlanShape {
    PlanShape::Scan {
        prefixes,
        keyed,
        post_filter,
    }
}

/// `n` distinct 64-hex pubkeys.
fn authors(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{i:064x}")).collect()
}

// ------------------------------------------------------------- plan_shape

#[test]
fn each_filter_shape_gets_its_index_and_post_filter() {
    let a = pk(1);
    assert_eq!(shape(json!({})), scan(1, false, false));
    assert_eq!(shape(json!({"authors": [a]})), scan(1, true, false));
    assert_eq!(shape(json!({"authors": [a, pk(2)]})), scan(2, true, false));
    assert_eq!(shape(json!({"kinds": [1, 7]})), scan(2, false, false));
    assert_eq!(
        shape(json!({"authors": [a, pk(2)], "kinds": [1, 7, 9]})),
        scan(6, true, false)
    );
    assert_eq!(shape(json!({"#t": ["x", "y"]})), scan(2, true, false));
    // The index answers the tag; the kinds and other tags are checked on
    // each row.
    assert_eq!(
        shape(json!({"kinds": [1], "#t": ["x"]})),
        scan(1, true, true)
    );
    assert_eq!(
        shape(json!({"#t": ["x"], "#p": [a, pk(2), pk(3)]})),
        scan(1, true, true)
    );
    // Authors answer before tags; the tags are then checked.
    assert_eq!(
        shape(json!({"authors": [a], "#t": ["x"]})),
        scan(1, true, true)
    );
    assert_eq!(
        shape(json!({"authors": [a], "kinds": [1], "#t": ["x"]})),
        scan(1, true, true)
    );
    // Time bounds are in the key range.
    assert_eq!(
        shape(json!({"since": 5, "until": 9})),
        scan(1, false, false)
    );
    // Search words are checked on each row.
    assert_eq!(shape(json!({"search": "word"})), scan(1, false, true));
    assert_eq!(
        shape(json!({"kinds": [1], "search": "word"})),
        scan(1, false, true)
    );
}

#[test]
fn ids_limits_of_zero_and_empty_lists_are_their_own_shapes() {
    assert_eq!(shape(json!({"ids": [pk(1), pk(2)]})), PlanShape::Ids(2));
    assert_eq!(shape(json!({"limit": 0})), PlanShape::Empty);
    assert_eq!(shape(json!({"kinds": [1], "limit": 0})), PlanShape::Empty);
    assert_eq!(shape(json!({"ids": []})), PlanShape::Empty);
    assert_eq!(shape(json!({"kinds": []})), PlanShape::Empty);
    assert_eq!(
        shape(json!({"kinds": [1], "limit": 1})),
        scan(1, false, false)
    );
    assert_eq!(shape(json!({"limit": 5})), scan(1, false, false));
}

/// Author × kind pairs up to 4096 are one range each; beyond, the author
/// index with the kinds checked on each row.
#[test]
fn author_kind_pairs_beyond_4096_fall_back_to_the_author_index() {
    let kinds: Vec<u16> = (0..64).collect();
    let at_most = json!({"authors": authors(64), "kinds": kinds});
    assert_eq!(shape(at_most), scan(64 * 64, true, false));
    let over = json!({"authors": authors(65), "kinds": kinds});
    assert_eq!(shape(over), scan(65, true, true));
    let many_kinds: Vec<u16> = (0..1000).collect();
    let over = json!({"authors": authors(5), "kinds": many_kinds});
    assert_eq!(shape(over), scan(5, true, true));
    let under = json!({"authors": authors(4), "kinds": many_kinds});
    assert_eq!(shape(under), scan(4000, true, false));
}

/// Tag values longer than 180 bytes are indexed by their hash: the rows
/// are checked against the full value.
#[test]
fn only_tag_values_longer_than_the_inline_limit_need_a_check() {
    let at_limit = "v".repeat(180);
    let over = "v".repeat(181);
    assert_eq!(shape(json!({"#t": [at_limit]})), scan(1, true, false));
    assert_eq!(shape(json!({"#t": [over]})), scan(1, true, true));
    assert_eq!(shape(json!({"#t": ["short", over]})), scan(2, true, true));
    assert_eq!(shape(json!({"#t": [""]})), scan(1, true, false));
}

/// The same answers whichever plan: a filter of more than 4096 author ×
/// kind pairs checks the kinds on each row.
#[test]
fn a_wide_author_kind_filter_returns_the_same_as_a_narrow_one() {
    let (_d, s) = open();
    let e1 = ev(1, NOW - 30, 1, &[], "one");
    let e2 = ev(1, NOW - 20, 7, &[], "seven");
    let e3 = ev(2, NOW - 10, 1, &[], "other author");
    s.write_batch([&e1, &e2, &e3], NOW).unwrap();
    let mut wide = authors(65);
    wide.push(pk(1));
    let kinds: Vec<u16> = (1..=64).filter(|k| *k != 7).collect();
    let out = s
        .query(
            &[filter(json!({"authors": wide, "kinds": kinds}))],
            &opts(1000),
        )
        .unwrap();
    assert_eq!(out.events, vec![e1.raw().to_string()]);
    // The author index: both of author 1's rows are read.
    assert_eq!(out.rows_scanned, 2);
}

// ------------------------------------------------------- rows and limits

/// A filter's limit stops its scan: the rows read are the limit's events
/// and the one that shows the next timestamp is older.
#[test]
fn a_limit_stops_the_scan_one_row_past_it() {
    let (_d, s) = open();
    let events: Vec<Event> = (0..10)
        .map(|i| ev(1, NOW - 100 + i, 1, &[], &format!("{i}")))
        .collect();
    s.write_batch(&events, NOW).unwrap();
    let out = s
        .query(&[filter(json!({"kinds": [1], "limit": 2}))], &opts(1000))
        .unwrap();
    assert_eq!(
        out.events,
        vec![events[9].raw().to_string(), events[8].raw().to_string()]
    );
    assert_eq!(out.rows_scanned, 3);
    assert!(!out.truncated);
    // Two limited filters, one step each.
    let mut cur = QueryCursor::new(
        vec![
            filter(json!({"kinds": [1], "limit": 1})),
            filter(json!({"authors": [pk(1)], "limit": 3})),
        ],
        opts(1000),
    );
    let mut got = Vec::new();
    let did = s
        .query_step(&mut cur, StepLimits::UNBOUNDED, &mut got)
        .unwrap();
    assert!(did.done && cur.is_done());
    assert_eq!(got.len(), 3);
    assert_eq!(did.rows, 2 + 4);
    assert_eq!(cur.rows_scanned(), 6);
    assert_eq!(did.bytes, got.iter().map(|r| r.len() as u64).sum::<u64>());
}

/// One unbounded step runs the whole query.
#[test]
fn an_unbounded_step_finishes_the_query() {
    let (_d, s) = open();
    let events: Vec<Event> = (0..6)
        .map(|i| {
            ev(
                1 + (i % 2) as u8,
                NOW - 100 + i,
                1,
                &[&["t", "x"]],
                &format!("{i}"),
            )
        })
        .collect();
    s.write_batch(&events, NOW).unwrap();
    for f in [
        json!({}),
        json!({"kinds": [1]}),
        json!({"#t": ["x"]}),
        json!({"authors": [pk(1)]}),
    ] {
        let mut cur = QueryCursor::new(vec![filter(f.clone())], opts(1000));
        assert_eq!(cur.snapshot_serial(), None);
        let mut got = Vec::new();
        let did = s
            .query_step(&mut cur, StepLimits::UNBOUNDED, &mut got)
            .unwrap();
        assert!(did.done, "{f}");
        assert!(cur.is_done());
        let want = if f.get("authors").is_some() { 3 } else { 6 };
        assert_eq!(got.len(), want, "{f}");
        assert_eq!(did.rows, want as u64, "{f}");
        assert_eq!(cur.snapshot_serial(), Some(7));
        assert!(!cur.truncated());
    }
}

// ------------------------------------------------- snapshot and truncation

#[test]
fn the_first_step_fixes_the_snapshot_at_the_next_serial() {
    let (_d, s) = open();
    let first: Vec<Event> = (0..3)
        .map(|i| ev(1, NOW - 100 + i, 1, &[], &format!("{i}")))
        .collect();
    s.write_batch(&first, NOW).unwrap();
    let mut cur = QueryCursor::new(vec![filter(json!({}))], opts(1000));
    assert_eq!(cur.snapshot_serial(), None);
    let mut got = Vec::new();
    let small = StepLimits {
        rows: 1,
        bytes: u64::MAX,
    };
    s.query_step(&mut cur, small, &mut got).unwrap();
    assert_eq!(cur.snapshot_serial(), Some(4));
    // Written after the first step: not part of this query.
    s.write_batch([&ev(1, NOW - 1, 1, &[], "late")], NOW)
        .unwrap();
    while !cur.is_done() {
        s.query_step(&mut cur, small, &mut got).unwrap();
    }
    assert_eq!(cur.snapshot_serial(), Some(4));
    assert_eq!(got.len(), 3);
    let out = s.query(&[filter(json!({}))], &opts(1000)).unwrap();
    assert_eq!(out.snapshot_serial, 5);
    assert_eq!(out.events.len(), 4);
}

#[test]
fn truncated_says_whether_the_budget_ran_out() {
    let (_d, s) = open();
    let events: Vec<Event> = (0..5)
        .map(|i| ev(1, NOW - 100 + i, 1, &[], &format!("{i}")))
        .collect();
    s.write_batch(&events, NOW).unwrap();
    let run = |max_rows| {
        let mut cur = QueryCursor::new(vec![filter(json!({}))], opts(max_rows));
        let mut got = Vec::new();
        while !cur.is_done() {
            s.query_step(&mut cur, StepLimits::UNBOUNDED, &mut got)
                .unwrap();
        }
        (got.len(), cur.rows_scanned(), cur.truncated())
    };
    assert_eq!(run(5), (5, 5, false));
    assert_eq!(run(100), (5, 5, false));
    assert_eq!(run(3), (3, 3, true));
    let out = s.query(&[filter(json!({}))], &opts(2)).unwrap();
    assert_eq!(
        (out.events.len(), out.rows_scanned, out.truncated),
        (2, 2, true)
    );
    let out = s.query(&[filter(json!({}))], &opts(10)).unwrap();
    assert!(!out.truncated);
}

// ------------------------------------------------------------------ count

#[test]
fn count_reports_its_rows_and_whether_it_was_truncated() {
    let (_d, s) = open();
    let events: Vec<Event> = (0..5)
        .map(|i| ev(1, NOW - 100 + i, 1 + (i % 2) as u16, &[], &format!("{i}")))
        .collect();
    s.write_batch(&events, NOW).unwrap();
    assert_eq!(
        s.count(&[filter(json!({}))], &opts(100)).unwrap(),
        (5, 5, false)
    );
    assert_eq!(
        s.count(&[filter(json!({}))], &opts(5)).unwrap(),
        (5, 5, false)
    );
    assert_eq!(
        s.count(&[filter(json!({}))], &opts(3)).unwrap(),
        (3, 3, true)
    );
    // Two filters: an event matched by both counts once; rows of both.
    assert_eq!(
        s.count(
            &[
                filter(json!({"kinds": [1]})),
                filter(json!({"authors": [pk(1)]}))
            ],
            &opts(100)
        )
        .unwrap(),
        (5, 3 + 5, false)
    );
    let mut cur = CountCursor::new(vec![filter(json!({"kinds": [2]}))], opts(100));
    while !cur.is_done() {
        s.count_step(&mut cur, StepLimits::UNBOUNDED).unwrap();
    }
    assert_eq!(
        (cur.count(), cur.rows_scanned(), cur.truncated()),
        (2, 2, false)
    );
}

/// Each COUNT step reports the rows it read, not the total so far.
#[test]
fn each_count_step_reports_its_own_rows() {
    let (_d, s) = open();
    let events: Vec<Event> = (0..5)
        .map(|i| ev(1, NOW - 100 + i, 1, &[], &format!("{i}")))
        .collect();
    s.write_batch(&events, NOW).unwrap();
    let mut cur = CountCursor::new(vec![filter(json!({}))], opts(100));
    let limits = StepLimits {
        rows: 2,
        bytes: u64::MAX,
    };
    let mut rows = Vec::new();
    while !cur.is_done() {
        let did = s.count_step(&mut cur, limits).unwrap();
        rows.push(did.rows);
    }
    assert_eq!(rows, vec![2, 2, 1]);
    assert_eq!((cur.count(), cur.rows_scanned()), (5, 5));
}

// ------------------------------------------------------------ private kinds

#[test]
fn private_kinds_go_only_to_their_author_or_recipients() {
    let (_d, s) = open();
    let reader = ev(3, 0, 1, &[], "").pubkey;
    let to_reader = ev(1, NOW - 30, 4, &[&["p", &hex32::encode(&reader)]], "to 3");
    let to_other = ev(1, NOW - 20, 4, &[&["p", &pk(2)]], "to 2");
    let own = ev(3, NOW - 10, 4, &[], "3's own");
    let public = ev(1, NOW - 5, 1, &[], "public");
    s.write_batch([&to_reader, &to_other, &own, &public], NOW)
        .unwrap();
    let readers = Arc::new(Readers::new(vec![4], vec![reader]));
    let f = filter(json!({}));
    let mut cur = QueryCursor::new(vec![f.clone()], opts(100)).for_readers(readers.clone());
    let mut got = Vec::new();
    while !cur.is_done() {
        s.query_step(&mut cur, StepLimits::UNBOUNDED, &mut got)
            .unwrap();
    }
    assert_eq!(
        got,
        vec![
            public.raw().to_string(),
            own.raw().to_string(),
            to_reader.raw().to_string()
        ]
    );
    let mut cur =
        CountCursor::new(vec![filter(json!({"kinds": [4]}))], opts(100)).for_readers(readers);
    while !cur.is_done() {
        s.count_step(&mut cur, StepLimits::UNBOUNDED).unwrap();
    }
    assert_eq!(cur.count(), 2);
    // Nobody authenticated: none of them.
    let nobody = Arc::new(Readers::new(vec![4], vec![]));
    let mut cur =
        CountCursor::new(vec![filter(json!({"kinds": [4]}))], opts(100)).for_readers(nobody);
    while !cur.is_done() {
        s.count_step(&mut cur, StepLimits::UNBOUNDED).unwrap();
    }
    assert_eq!(cur.count(), 0);
}

// ------------------------------------------------------------ skip_serials

/// What a caller has already sent (a REQ's search filters) is skipped by
/// the plain query and not counted again by the plain count; a filter's
/// limit still counts the skipped events.
#[test]
fn skipped_serials_are_neither_answered_nor_counted() {
    let (_d, s) = open();
    // One batch each: serials 1..=6, e[i] at serial i + 1, newest last.
    let e: Vec<Event> = (0..6)
        .map(|i| ev(1 + (i % 2) as u8, NOW - 100 + i, 1, &[], &format!("{i}")))
        .collect();
    for x in &e {
        s.write_batch([x], NOW).unwrap();
    }
    let skip = || std::collections::HashSet::from([2u64, 5]);
    let ids = |raws: &[String]| -> Vec<String> {
        raws.iter()
            .map(|r| Event::parse(r).unwrap().id_hex())
            .collect()
    };
    let query = |filters: Vec<serde_json::Value>, skipped: bool| {
        let mut cur = QueryCursor::new(filters.into_iter().map(filter).collect(), opts(1000));
        if skipped {
            cur.skip_serials(skip());
        }
        let mut got = Vec::new();
        while !cur.is_done() {
            s.query_step(&mut cur, StepLimits::UNBOUNDED, &mut got)
                .unwrap();
        }
        ids(&got)
    };
    let id = |i: usize| e[i].id_hex();
    assert_eq!(query(vec![json!({})], true), [id(5), id(3), id(2), id(0)]);
    assert_eq!(query(vec![json!({})], false).len(), 6);
    // The newest three are e5, e4 and e3; e4 was sent already.
    assert_eq!(query(vec![json!({"limit": 3})], true), [id(5), id(3)]);
    // Two overlapping filters: each event once, the skipped ones never.
    assert_eq!(
        query(
            vec![json!({"authors": [pk(1)]}), json!({"kinds": [1]})],
            true
        ),
        [id(5), id(3), id(2), id(0)]
    );
    // An empty set skips nothing.
    let mut cur = QueryCursor::new(vec![filter(json!({}))], opts(1000));
    cur.skip_serials(Default::default());
    let mut got = Vec::new();
    s.query_step(&mut cur, StepLimits::UNBOUNDED, &mut got)
        .unwrap();
    assert_eq!(got.len(), 6);

    let count = |filters: Vec<serde_json::Value>, skipped: Option<Vec<u64>>| {
        let mut cur = CountCursor::new(filters.into_iter().map(filter).collect(), opts(1000));
        if let Some(sk) = skipped {
            cur.skip_serials(sk.into_iter().collect());
        }
        while !cur.is_done() {
            s.count_step(&mut cur, StepLimits::UNBOUNDED).unwrap();
        }
        cur.count()
    };
    assert_eq!(count(vec![json!({})], Some(vec![2, 5])), 4);
    assert_eq!(count(vec![json!({})], Some(vec![])), 6);
    assert_eq!(count(vec![json!({})], None), 6);
    // Several filters (their own set of what they counted) and a skip.
    assert_eq!(
        count(
            vec![json!({"authors": [pk(1)]}), json!({"kinds": [1]})],
            Some(vec![2, 5, 99])
        ),
        4
    );
    assert_eq!(
        count(
            vec![json!({"authors": [pk(1)]}), json!({"kinds": [1]})],
            None
        ),
        6
    );
}
