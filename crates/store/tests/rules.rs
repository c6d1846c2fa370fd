//! Store rules, one test per rule: replacement, deletion, expiration,
//! ordering, planner coverage and persistence.

use serde_json::json;
use sluice_proto::{Event, Filter, hex32};
use sluice_store::{QueryOptions, Store, StoreOptions, WriteOutcome};

const NOW: u64 = 1_700_000_000;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 64 << 20,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let store = Store::open(dir.path(), &opts).unwrap();
    (dir, store)
}

fn sk(n: u8) -> [u8; 32] {
    [n; 32]
}

fn ev(key: u8, created_at: u64, kind: u16, tags: &[&[&str]], content: &str) -> Event {
    let tags = tags
        .iter()
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect();
    Event::sign(&sk(key), created_at, kind, tags, content)
}

fn put(store: &Store, e: &Event) -> WriteOutcome {
    store.write_batch([e], NOW).unwrap()[0]
}

fn q(store: &Store, filter: serde_json::Value) -> Vec<String> {
    let f = Filter::from_value(&filter).unwrap();
    store
        .query(
            &[f],
            &QueryOptions {
                now: NOW,
                max_scan_rows: 1_000_000,
            },
        )
        .unwrap()
        .events
}

fn ids(raws: &[String]) -> Vec<String> {
    raws.iter()
        .map(|r| Event::parse(r).unwrap().id_hex())
        .collect()
}

fn pk(key: u8) -> String {
    hex32::encode(&sluice_proto::event::public_key_of(&sk(key)))
}

#[test]
fn stored_event_is_returned_byte_identical() {
    let (_d, s) = open();
    let e = ev(1, NOW - 10, 1, &[], "héllo \u{1} \"q\"");
    assert!(matches!(put(&s, &e), WriteOutcome::Stored { .. }));
    assert_eq!(
        q(&s, json!({"ids":[e.id_hex()]})),
        vec![e.raw().to_string()]
    );
}

#[test]
fn duplicate_is_reported() {
    let (_d, s) = open();
    let e = ev(1, NOW - 10, 1, &[], "x");
    put(&s, &e);
    assert_eq!(put(&s, &e), WriteOutcome::Duplicate);
}

#[test]
fn newest_first_ties_by_lowest_id_and_limit() {
    let (_d, s) = open();
    let mut same: Vec<Event> = (0..5)
        .map(|i| ev(1, NOW - 5, 1, &[], &format!("same {i}")))
        .collect();
    let older = ev(1, NOW - 100, 1, &[], "older");
    let newer = ev(1, NOW - 1, 1, &[], "newer");
    for e in same.iter().chain([&older, &newer]) {
        put(&s, e);
    }
    same.sort_by_key(|e| e.id);
    let got = ids(&q(&s, json!({"kinds":[1],"limit":3})));
    assert_eq!(
        got,
        vec![newer.id_hex(), same[0].id_hex(), same[1].id_hex()]
    );
    let all = ids(&q(&s, json!({})));
    assert_eq!(all.len(), 7);
    assert_eq!(all.last().unwrap(), &older.id_hex());
}

#[test]
fn every_filter_field_selects() {
    let (_d, s) = open();
    let a = ev(1, NOW - 30, 1, &[&["t", "nostr"], &["p", &pk(9)]], "a");
    let b = ev(
        2,
        NOW - 20,
        7,
        &[&["t", "other"], &["e", &"ab".repeat(32)]],
        "b",
    );
    let c = ev(1, NOW - 10, 30023, &[&["d", "post"], &["t", "nostr"]], "c");
    for e in [&a, &b, &c] {
        put(&s, e);
    }
    assert_eq!(
        ids(&q(&s, json!({"authors":[pk(1)]}))),
        vec![c.id_hex(), a.id_hex()]
    );
    assert_eq!(
        ids(&q(&s, json!({"authors":[pk(1)],"kinds":[1]}))),
        vec![a.id_hex()]
    );
    assert_eq!(ids(&q(&s, json!({"kinds":[7]}))), vec![b.id_hex()]);
    assert_eq!(
        ids(&q(&s, json!({"#t":["nostr"]}))),
        vec![c.id_hex(), a.id_hex()]
    );
    assert_eq!(
        ids(&q(&s, json!({"#t":["nostr"],"kinds":[1]}))),
        vec![a.id_hex()]
    );
    assert_eq!(ids(&q(&s, json!({"#p":[pk(9)]}))), vec![a.id_hex()]);
    assert_eq!(
        ids(&q(&s, json!({"#e":["ab".repeat(32)]}))),
        vec![b.id_hex()]
    );
    assert_eq!(
        ids(&q(&s, json!({"#t":["nostr"],"#d":["post"]}))),
        vec![c.id_hex()]
    );
    assert_eq!(
        ids(&q(&s, json!({"since":NOW-20,"until":NOW-20}))),
        vec![b.id_hex()]
    );
    assert_eq!(
        ids(&q(&s, json!({"#t":["nostr","other"]}))),
        vec![c.id_hex(), b.id_hex(), a.id_hex()]
    );
    assert!(q(&s, json!({"kinds":[]})).is_empty());
}

#[test]
fn union_of_filters_has_each_event_once() {
    let (_d, s) = open();
    let a = ev(1, NOW - 30, 1, &[&["t", "x"]], "a");
    put(&s, &a);
    let f1 = Filter::from_value(&json!({"kinds":[1]})).unwrap();
    let f2 = Filter::from_value(&json!({"#t":["x"]})).unwrap();
    let out = s
        .query(
            &[f1.clone(), f2.clone()],
            &QueryOptions {
                now: NOW,
                max_scan_rows: 100,
            },
        )
        .unwrap();
    assert_eq!(out.events.len(), 1);
    let (n, _, _) = s
        .count(
            &[f1, f2],
            &QueryOptions {
                now: NOW,
                max_scan_rows: 100,
            },
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn replaceable_keeps_newest_and_refuses_older() {
    let (_d, s) = open();
    let v1 = ev(1, NOW - 30, 0, &[], "v1");
    let v2 = ev(1, NOW - 20, 0, &[], "v2");
    put(&s, &v1);
    assert!(matches!(
        put(&s, &v2),
        WriteOutcome::Stored { replaced: true, .. }
    ));
    assert_eq!(put(&s, &v1), WriteOutcome::Superseded);
    assert_eq!(ids(&q(&s, json!({"kinds":[0]}))), vec![v2.id_hex()]);
}

#[test]
fn replaceable_tie_keeps_lowest_id() {
    let (_d, s) = open();
    let mut pair = [
        ev(1, NOW - 30, 10002, &[], "a"),
        ev(1, NOW - 30, 10002, &[], "b"),
    ];
    pair.sort_by_key(|e| e.id);
    put(&s, &pair[1]);
    assert!(matches!(
        put(&s, &pair[0]),
        WriteOutcome::Stored { replaced: true, .. }
    ));
    assert_eq!(put(&s, &pair[1]), WriteOutcome::Superseded);
    assert_eq!(
        ids(&q(&s, json!({"kinds":[10002]}))),
        vec![pair[0].id_hex()]
    );
}

#[test]
fn addressable_is_per_d_tag_and_missing_d_is_empty() {
    let (_d, s) = open();
    let a1 = ev(1, NOW - 30, 30023, &[&["d", "a"]], "a1");
    let b1 = ev(1, NOW - 30, 30023, &[&["d", "b"]], "b1");
    let a2 = ev(1, NOW - 20, 30023, &[&["d", "a"]], "a2");
    let empty1 = ev(1, NOW - 30, 30023, &[], "e1");
    let empty2 = ev(1, NOW - 20, 30023, &[&["d", ""]], "e2");
    for e in [&a1, &b1, &a2, &empty1, &empty2] {
        put(&s, e);
    }
    let mut got = ids(&q(&s, json!({"kinds":[30023]})));
    got.sort();
    let mut want = vec![a2.id_hex(), b1.id_hex(), empty2.id_hex()];
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn deletion_by_e_tag_removes_own_events_only_and_blocks_republish() {
    let (_d, s) = open();
    let mine = ev(1, NOW - 30, 1, &[], "mine");
    let theirs = ev(2, NOW - 30, 1, &[], "theirs");
    put(&s, &mine);
    put(&s, &theirs);
    let del = ev(
        1,
        NOW - 10,
        5,
        &[&["e", &mine.id_hex()], &["e", &theirs.id_hex()]],
        "",
    );
    assert!(matches!(
        put(&s, &del),
        WriteOutcome::Stored { deleted: 1, .. }
    ));
    assert!(q(&s, json!({"ids":[mine.id_hex()]})).is_empty());
    assert_eq!(q(&s, json!({"ids":[theirs.id_hex()]})).len(), 1);
    assert_eq!(put(&s, &mine), WriteOutcome::Deleted);
    assert_eq!(ids(&q(&s, json!({"kinds":[5]}))), vec![del.id_hex()]);
}

#[test]
fn deletion_arriving_first_blocks_the_event() {
    let (_d, s) = open();
    let later = ev(1, NOW - 30, 1, &[], "later");
    let del = ev(1, NOW - 10, 5, &[&["e", &later.id_hex()]], "");
    put(&s, &del);
    assert_eq!(put(&s, &later), WriteOutcome::Deleted);
}

#[test]
fn deleting_a_deletion_does_nothing() {
    let (_d, s) = open();
    let note = ev(1, NOW - 30, 1, &[], "n");
    put(&s, &note);
    let del = ev(1, NOW - 20, 5, &[&["e", &note.id_hex()]], "");
    put(&s, &del);
    let del2 = ev(1, NOW - 10, 5, &[&["e", &del.id_hex()]], "");
    assert!(matches!(
        put(&s, &del2),
        WriteOutcome::Stored { deleted: 0, .. }
    ));
    assert_eq!(q(&s, json!({"kinds":[5]})).len(), 2);
}

#[test]
fn deletion_by_a_tag_removes_versions_up_to_its_time() {
    let (_d, s) = open();
    let v1 = ev(1, NOW - 30, 30023, &[&["d", "x"]], "v1");
    put(&s, &v1);
    let addr = format!("30023:{}:x", pk(1));
    let del = ev(1, NOW - 20, 5, &[&["a", &addr]], "");
    assert!(matches!(
        put(&s, &del),
        WriteOutcome::Stored { deleted: 1, .. }
    ));
    assert!(q(&s, json!({"kinds":[30023]})).is_empty());
    let older = ev(1, NOW - 25, 30023, &[&["d", "x"]], "older");
    assert_eq!(put(&s, &older), WriteOutcome::Deleted);
    let newer = ev(1, NOW - 15, 30023, &[&["d", "x"]], "newer");
    assert!(matches!(put(&s, &newer), WriteOutcome::Stored { .. }));
    let other_author = ev(2, NOW - 10, 5, &[&["a", &format!("30023:{}:x", pk(1))]], "");
    assert!(matches!(
        put(&s, &other_author),
        WriteOutcome::Stored { deleted: 0, .. }
    ));
    assert_eq!(ids(&q(&s, json!({"kinds":[30023]}))), vec![newer.id_hex()]);
}

#[test]
fn expired_events_are_refused_hidden_and_purged() {
    let (_d, s) = open();
    let gone = ev(
        1,
        NOW - 30,
        1,
        &[&["expiration", &(NOW - 1).to_string()]],
        "x",
    );
    assert_eq!(put(&s, &gone), WriteOutcome::Expired);
    let soon = ev(
        1,
        NOW - 30,
        1,
        &[&["expiration", &(NOW + 10).to_string()]],
        "y",
    );
    put(&s, &soon);
    assert_eq!(q(&s, json!({})).len(), 1);
    let later = QueryOptions {
        now: NOW + 10,
        max_scan_rows: 100,
    };
    assert!(
        s.query(&[Filter::default()], &later)
            .unwrap()
            .events
            .is_empty()
    );
    assert_eq!(s.purge_expired(NOW + 9, 100).unwrap(), 0);
    assert_eq!(s.purge_expired(NOW + 10, 100).unwrap(), 1);
    assert_eq!(s.stats().unwrap().events, 0);
}

#[test]
fn ephemeral_events_are_not_stored() {
    let (_d, s) = open();
    assert_eq!(
        put(&s, &ev(1, NOW, 20001, &[], "e")),
        WriteOutcome::Ephemeral
    );
    assert_eq!(s.stats().unwrap().events, 0);
}

#[test]
fn batch_equals_one_by_one() {
    let (_d, s) = open();
    let v1 = ev(1, NOW - 30, 0, &[], "v1");
    let v2 = ev(1, NOW - 20, 0, &[], "v2");
    let del = ev(1, NOW - 10, 5, &[&["e", &v2.id_hex()]], "");
    let out = s.write_batch([&v1, &v2, &v1, &del, &v2], NOW).unwrap();
    assert!(matches!(out[0], WriteOutcome::Stored { .. }));
    assert!(matches!(
        out[1],
        WriteOutcome::Stored { replaced: true, .. }
    ));
    assert_eq!(out[2], WriteOutcome::Superseded);
    assert!(matches!(out[3], WriteOutcome::Stored { deleted: 1, .. }));
    assert_eq!(out[4], WriteOutcome::Deleted);
    assert!(q(&s, json!({"kinds":[0]})).is_empty());
}

#[test]
fn data_survives_reopen_and_serials_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 64 << 20,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let e1 = ev(1, NOW - 30, 1, &[], "one");
    let e2 = ev(1, NOW - 20, 1, &[], "two");
    let s1 = {
        let s = Store::open(dir.path(), &opts).unwrap();
        let WriteOutcome::Stored { serial, .. } = put(&s, &e1) else {
            panic!()
        };
        let del = ev(1, NOW - 25, 5, &[&["e", &e1.id_hex()]], "");
        put(&s, &del);
        s.close();
        serial
    };
    let s = Store::open(dir.path(), &opts).unwrap();
    let WriteOutcome::Stored { serial: s2, .. } = put(&s, &e2) else {
        panic!()
    };
    assert!(s2 > s1 + 1);
    assert_eq!(q(&s, json!({"kinds":[1]})), vec![e2.raw().to_string()]);
}

#[test]
fn full_map_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 256 << 10,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let s = Store::open(dir.path(), &opts).unwrap();
    let big = "x".repeat(60_000);
    let mut saw_full = false;
    for i in 0..20 {
        match s.write_batch([&ev(1, NOW - 100 + i, 1, &[], &format!("{i}{big}"))], NOW) {
            Ok(_) => {}
            Err(sluice_store::StoreError::MapFull { .. }) => {
                saw_full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(saw_full);
    // The store still reads after a failed write.
    assert!(!q(&s, json!({})).is_empty());
}

#[test]
fn scan_budget_bounds_work() {
    let (_d, s) = open();
    for i in 0..50 {
        put(&s, &ev(1, NOW - 100 + i, 7, &[&["t", "x"]], &i.to_string()));
    }
    // The tag index finds 50 candidates, the kind post-filter rejects them all.
    let f = Filter::from_value(&json!({"#t":["x"],"kinds":[1]})).unwrap();
    let out = s
        .query(
            &[f],
            &QueryOptions {
                now: NOW,
                max_scan_rows: 10,
            },
        )
        .unwrap();
    assert!(out.truncated);
    assert_eq!(out.rows_scanned, 10);
}

#[test]
fn export_walks_everything_in_time_order() {
    let (_d, s) = open();
    let evs: Vec<Event> = (0..2500)
        .map(|i| ev(1, NOW - 5000 + i, 1, &[], &i.to_string()))
        .collect();
    s.write_batch(evs.iter(), NOW).unwrap();
    let mut seen = Vec::new();
    let n = s
        .for_each_raw(0, u64::MAX, NOW, |raw| {
            seen.push(raw.to_owned());
            Ok(())
        })
        .unwrap();
    assert_eq!(n, 2500);
    assert_eq!(seen.first().unwrap(), evs[0].raw());
    assert_eq!(seen.last().unwrap(), evs[2499].raw());
}

#[test]
fn contains_ids_answers_for_each_id_in_order() {
    let (_dir, store) = open();
    let a = ev(1, 1_700_000_000, 1, &[], "a");
    let b = ev(1, 1_700_000_001, 1, &[], "b");
    put(&store, &a);
    let missing = [0u8; 32];
    assert_eq!(
        store.contains_ids([&b.id, &a.id, &missing, &a.id]).unwrap(),
        vec![false, true, false, true]
    );
    assert!(store.contains_ids([]).unwrap().is_empty());
}

/// One batch holding an event, its duplicate, a replaceable event and its
/// newer version, and a deletion of an event of the same batch: the
/// batch's index entries are inserted at its end (in key order), so what
/// the batch itself replaced or deleted must leave no entry behind, with
/// and without MDB_WRITEMAP, across a reopen.
#[test]
fn rules_hold_inside_one_batch_with_and_without_write_map() {
    // Ordinary, `write_map`, and written in the map alone (then reopened
    // as an ordinary process: the file was cut back to its last page).
    for (write_map, write_map_when_alone) in [(false, false), (true, false), (false, true)] {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions {
            map_size_bytes: 64 << 20,
            max_readers: 16,
            write_map,
            write_map_when_alone,
            min_free_disk_bytes: 0,
        };
        let note = ev(1, NOW - 50, 1, &[&["t", "x"]], "note");
        let doomed = ev(1, NOW - 40, 1, &[&["t", "x"]], "doomed");
        let old_meta = ev(1, NOW - 30, 0, &[], "old profile");
        let new_meta = ev(1, NOW - 20, 0, &[], "new profile");
        let delete = ev(1, NOW - 10, 5, &[&["e", &doomed.id_hex()]], "");
        {
            let store = Store::open(dir.path(), &opts).unwrap();
            let out = store
                .write_batch([&note, &note, &doomed, &old_meta, &new_meta, &delete], NOW)
                .unwrap();
            assert!(matches!(out[0], WriteOutcome::Stored { .. }));
            assert_eq!(out[1], WriteOutcome::Duplicate);
            assert!(matches!(
                out[4],
                WriteOutcome::Stored { replaced: true, .. }
            ));
            assert!(matches!(out[5], WriteOutcome::Stored { deleted: 1, .. }));
            assert_eq!(store.writes_in_map(), write_map || write_map_when_alone);
            assert_eq!(store.is_alone(), write_map_when_alone);
            store.close();
        }
        if write_map_when_alone {
            let len = std::fs::metadata(dir.path().join("data.mdb"))
                .unwrap()
                .len();
            assert!(len < 1 << 20, "data.mdb left at {len} bytes");
        }
        let store = Store::open(
            dir.path(),
            &StoreOptions {
                write_map_when_alone: false,
                ..opts.clone()
            },
        )
        .unwrap();
        let author = hex32::encode(&ev(1, 0, 1, &[], "").pubkey);
        let mut want = vec![note.id_hex(), new_meta.id_hex(), delete.id_hex()];
        want.sort();
        for filter in [
            json!({"authors": [author]}),
            json!({}),
            json!({"kinds": [0, 1, 5]}),
            json!({"authors": [author], "kinds": [0, 1, 5]}),
        ] {
            let mut got = ids(&q(&store, filter.clone()));
            got.sort();
            assert_eq!(got, want, "{filter} (write_map {write_map})");
        }
        assert_eq!(ids(&q(&store, json!({"#t": ["x"]}))), vec![note.id_hex()]);
        // No index entry is left behind for what the batch removed: each
        // index scan reads exactly the live events' rows.
        for filter in [
            json!({"authors": [author]}),
            json!({"kinds": [0]}),
            json!({"kinds": [1]}),
            json!({"#t": ["x"]}),
            json!({}),
        ] {
            let f = Filter::from_value(&filter).unwrap();
            let opts = QueryOptions {
                now: NOW,
                max_scan_rows: 1_000_000,
            };
            let out = store.query(&[f], &opts).unwrap();
            assert_eq!(
                out.rows_scanned,
                out.events.len() as u64,
                "{filter}: stale index rows (write_map {write_map})"
            );
        }
        assert_eq!(
            ids(&q(&store, json!({"ids": [doomed.id_hex()]}))),
            Vec::<String>::new()
        );
        assert_eq!(
            ids(&q(&store, json!({"ids": [old_meta.id_hex()]}))),
            Vec::<String>::new()
        );
        // The replaced and deleted events are gone from the ids table too:
        // written again, one is superseded, the other stays deleted.
        let again = store.write_batch([&old_meta, &doomed], NOW).unwrap();
        assert_eq!(again[0], WriteOutcome::Superseded);
        assert_eq!(again[1], WriteOutcome::Deleted);
        assert_eq!(store.stats().unwrap().events, 3);
    }
}
