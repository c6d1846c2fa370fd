//! Queries in bounded steps: the same answer as a naive matcher over every
//! event whatever the step bounds, and the snapshot fixed by the first step.

use std::cmp::Reverse;

use serde_json::json;
use sluice_proto::{Event, Filter, hex32};
use sluice_store::{
    CountCursor, QueryCursor, QueryOptions, StepLimits, Store, StoreOptions, WriteOutcome,
};

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

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn sk(n: u8) -> [u8; 32] {
    [n + 1; 32]
}

fn pk(n: u8) -> String {
    hex32::encode(&sluice_proto::event::public_key_of(&sk(n)))
}

const TAGS: [&str; 4] = ["nostr", "rust", "lmdb", "relay"];
const KINDS: [u16; 3] = [1, 7, 1111];

/// Events from 6 authors over a few seconds (many equal timestamps).
fn fill(store: &Store, rng: &mut Rng, n: usize) -> Vec<Event> {
    let mut all = Vec::new();
    for i in 0..n {
        let author = rng.below(6) as u8;
        let kind = KINDS[rng.below(3) as usize];
        let t = TAGS[rng.below(4) as usize];
        let created = NOW - 40 + rng.below(30);
        let e = Event::sign(
            &sk(author),
            created,
            kind,
            vec![vec!["t".into(), t.into()]],
            &format!("event {i}"),
        );
        assert!(matches!(
            store.write_batch([&e], NOW).unwrap()[0],
            WriteOutcome::Stored { .. }
        ));
        all.push(e);
    }
    all
}

fn random_filter(rng: &mut Rng, all: &[Event]) -> serde_json::Value {
    let mut f = serde_json::Map::new();
    if rng.below(3) == 0 {
        let n = 1 + rng.below(3);
        f.insert(
            "authors".into(),
            json!((0..n).map(|_| pk(rng.below(6) as u8)).collect::<Vec<_>>()),
        );
    }
    if rng.below(3) == 0 {
        f.insert("kinds".into(), json!([KINDS[rng.below(3) as usize]]));
    }
    if rng.below(3) == 0 {
        f.insert("#t".into(), json!([TAGS[rng.below(4) as usize]]));
    }
    if rng.below(5) == 0 {
        let ids: Vec<String> = (0..1 + rng.below(4))
            .map(|_| all[rng.below(all.len() as u64) as usize].id_hex())
            .collect();
        f.insert("ids".into(), json!(ids));
    }
    if rng.below(4) == 0 {
        f.insert("since".into(), json!(NOW - 40 + rng.below(30)));
    }
    if rng.below(4) == 0 {
        f.insert("until".into(), json!(NOW - 40 + rng.below(30)));
    }
    if rng.below(4) != 0 {
        f.insert("limit".into(), json!(rng.below(40)));
    }
    serde_json::Value::Object(f)
}

/// What NIP-01 says the answer is: per filter its newest `limit` matches
/// (ties by lowest id), the union once each, newest first.
fn naive(all: &[Event], filters: &[Filter]) -> Vec<String> {
    let order = |e: &&Event| (Reverse(e.created_at), e.id);
    let mut out: Vec<&Event> = Vec::new();
    for f in filters {
        let mut m: Vec<&Event> = all.iter().filter(|e| f.matches(e)).collect();
        m.sort_by_key(order);
        m.truncate(f.limit.unwrap_or(u64::MAX) as usize);
        out.extend(m);
    }
    out.sort_by_key(order);
    out.dedup_by_key(|e| e.id);
    out.iter().map(|e| e.raw().to_string()).collect()
}

fn opts() -> QueryOptions {
    QueryOptions {
        now: NOW,
        max_scan_rows: 1_000_000,
    }
}

fn stepped(store: &Store, filters: &[Filter], limits: StepLimits) -> Vec<String> {
    let mut cur = QueryCursor::new(filters.to_vec(), opts());
    let mut out = Vec::new();
    let mut steps = 0;
    while !cur.is_done() {
        let before = out.len();
        let did = store.query_step(&mut cur, limits, &mut out).unwrap();
        assert!(
            did.rows <= limits.rows.max(1).saturating_add(8),
            "a step reads about its rows: {did:?} {limits:?}"
        );
        if limits.bytes < u64::MAX && out.len() > before + 1 {
            let extra: u64 = out[before..out.len() - 1]
                .iter()
                .map(|r| r.len() as u64)
                .sum();
            assert!(extra < limits.bytes, "a step stops at its byte bound");
        }
        steps += 1;
        assert!(steps < 100_000, "a query always ends");
    }
    out
}

#[test]
fn stepped_queries_answer_like_a_naive_matcher() {
    let (_d, store) = open();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let all = fill(&store, &mut rng, 300);
    let bounds = [
        StepLimits::UNBOUNDED,
        StepLimits {
            rows: 1,
            bytes: u64::MAX,
        },
        StepLimits { rows: 7, bytes: 1 },
        StepLimits {
            rows: 50,
            bytes: 600,
        },
    ];
    for case in 0..300 {
        let n = 1 + rng.below(3) as usize;
        let values: Vec<serde_json::Value> =
            (0..n).map(|_| random_filter(&mut rng, &all)).collect();
        let filters: Vec<Filter> = values
            .iter()
            .map(|v| Filter::from_value(v).unwrap())
            .collect();
        let want = naive(&all, &filters);
        for b in bounds {
            let got = stepped(&store, &filters, b);
            assert_eq!(got, want, "case {case} {values:?} with {b:?}");
        }
        let mut count = CountCursor::new(filters.clone(), opts());
        while !count.is_done() {
            store
                .count_step(&mut count, StepLimits { rows: 5, bytes: 0 })
                .unwrap();
        }
        let unlimited: Vec<Filter> = filters
            .iter()
            .map(|f| Filter {
                limit: None,
                ..f.clone()
            })
            .collect();
        assert_eq!(
            count.count(),
            naive(&all, &unlimited).len() as u64,
            "count, case {case} {values:?}"
        );
    }
}

#[test]
fn the_first_step_fixes_the_snapshot() {
    let (_d, store) = open();
    let mut rng = Rng(7);
    let all = fill(&store, &mut rng, 50);
    let f = Filter::from_value(&json!({"kinds": [1, 7, 1111]})).unwrap();
    let mut cur = QueryCursor::new(vec![f], opts());
    let mut out = Vec::new();
    store
        .query_step(
            &mut cur,
            StepLimits {
                rows: 3,
                bytes: u64::MAX,
            },
            &mut out,
        )
        .unwrap();
    let snapshot = cur.snapshot_serial().unwrap();
    // Committed after the first step, one newer and one older than every
    // row read so far: neither is returned; live delivery has them.
    let newer = Event::sign(&sk(9), NOW - 1, 1, vec![], "newer");
    let older = Event::sign(&sk(9), NOW - 100, 1, vec![], "older");
    for e in [&newer, &older] {
        match store.write_batch([e], NOW).unwrap()[0] {
            WriteOutcome::Stored { serial, .. } => assert!(serial >= snapshot),
            other => panic!("{other:?}"),
        }
    }
    // A row deleted between steps is not found.
    let victim = all.iter().min_by_key(|e| e.created_at).unwrap();
    let deletion = Event::sign(
        &sk(victim_key(&all, victim)),
        NOW - 1,
        5,
        vec![vec!["e".into(), victim.id_hex()]],
        "",
    );
    store.write_batch([&deletion], NOW).unwrap();
    while !cur.is_done() {
        store
            .query_step(
                &mut cur,
                StepLimits {
                    rows: 3,
                    bytes: u64::MAX,
                },
                &mut out,
            )
            .unwrap();
    }
    assert!(!out.iter().any(|r| r.contains("\"newer\"")));
    assert!(!out.iter().any(|r| r.contains("\"older\"")));
    assert!(!out.iter().any(|r| r == victim.raw()));
    assert_eq!(out.len(), all.len() - 1);
}

fn victim_key(all: &[Event], victim: &Event) -> u8 {
    (0..6)
        .find(|n| pk(*n) == hex32::encode(&victim.pubkey))
        .unwrap_or_else(|| panic!("author of {} among {}", victim.id_hex(), all.len()))
}

/// Hits a step reads ahead and keeps for the next are read in place in the
/// map during the step: they must be copied out before its transaction
/// ends. Here the events they came from are purged and their pages written
/// over between steps; what the first step read is still answered whole.
#[test]
fn hits_kept_between_steps_outlive_their_events_pages() {
    let (_d, store) = open();
    let body = "x".repeat(300);
    let originals: Vec<Event> = (0..120)
        .map(|i| Event::sign(&sk(1), NOW - 200 + i, 1, vec![], &format!("{i} {body}")))
        .collect();
    store.write_batch(originals.iter(), NOW).unwrap();
    let f = Filter::from_value(&json!({"kinds": [1]})).unwrap();
    let mut cur = QueryCursor::new(vec![f], opts());
    let mut out = Vec::new();
    // One event per step: the filter has read up to 32 rows ahead.
    let one = StepLimits {
        rows: 500,
        bytes: 1,
    };
    store.query_step(&mut cur, one, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    let ids: Vec<[u8; 32]> = originals.iter().map(|e| e.id).collect();
    assert_eq!(store.purge_events(&ids).unwrap(), originals.len());
    // Several commits: LMDB reuses a page freed once no snapshot can see it.
    for batch in 0..8 {
        let others: Vec<Event> = (0..40)
            .map(|i| {
                let content = format!("{batch} {i} {}", "y".repeat(300));
                Event::sign(&sk(2), NOW - 100, 7, vec![], &content)
            })
            .collect();
        store.write_batch(others.iter(), NOW).unwrap();
    }
    while !cur.is_done() {
        store.query_step(&mut cur, one, &mut out).unwrap();
    }
    // Newest first, each whole: a prefix of the original answer.
    let want: Vec<&str> = originals.iter().rev().map(|e| e.raw()).collect();
    assert!(out.len() > 1, "rows read ahead are answered: {}", out.len());
    assert_eq!(out, want[..out.len()]);
}
