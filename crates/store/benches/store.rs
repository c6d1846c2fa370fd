//! The store's hot paths on a real LMDB file in a temporary directory:
//! batched inserts and indexed queries with a limit.
//!
//! Run: `cargo bench -p sluice-store --bench store`
//!
//! Events are built from JSON with ids derived from a counter and signatures
//! left as placeholders: the store checks neither (the writer's callers
//! verify before they submit), so signing would only slow the set-up.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use serde_json::json;
use sha2::{Digest, Sha256};
use sluice_proto::{Event, Filter};
use sluice_store::{QueryOptions, Store, StoreOptions};

const AUTHORS: u64 = 500;
const TOPICS: [&str; 8] = [
    "nostr", "bitcoin", "rust", "music", "art", "news", "dev", "food",
];
const KINDS: [u16; 6] = [1, 1, 1, 7, 6, 30023];
const BASE_TIME: u64 = 1_700_000_000;

fn hash(tag: &str, n: u64) -> [u8; 32] {
    Sha256::digest(format!("{tag}{n}")).into()
}

/// Event number `n`: about 1 KB, a kind mix, p/e/t tags, authors and
/// created_at spread so every index has many prefixes.
fn event(n: u64) -> Event {
    let kind = KINDS[(n % KINDS.len() as u64) as usize];
    let author = hash("author", n % AUTHORS);
    let mut tags = vec![
        json!(["p", hex::encode(hash("author", (n * 7) % AUTHORS))]),
        json!(["t", TOPICS[(n % 8) as usize]]),
    ];
    if n > 0 {
        tags.push(json!(["e", hex::encode(hash("id", n / 2))]));
    }
    if kind == 30023 {
        tags.push(json!(["d", format!("article-{}", n % 50)]));
    }
    let content = "lorem ipsum dolor sit amet ".repeat(30);
    let raw = json!({
        "id": hex::encode(hash("id", n)),
        "pubkey": hex::encode(author),
        "created_at": BASE_TIME + n,
        "kind": kind,
        "tags": tags,
        "content": content,
        "sig": "00".repeat(64),
    })
    .to_string();
    Event::parse(&raw).expect("bench event parses")
}

fn open(dir: &tempfile::TempDir) -> Store {
    Store::open(dir.path(), &StoreOptions::default()).expect("open store")
}

fn filter(v: serde_json::Value) -> Filter {
    Filter::from_value(&v).expect("valid filter")
}

/// Batches into a store that already holds 100k events (it grows by each
/// sample's batches). Each batch is one transaction, committed with LMDB's
/// default durability (fsync), as the writer thread and the import commit.
fn bench_insert(c: &mut Criterion) {
    const FILL: u64 = 100_000;
    let mut g = c.benchmark_group("store insert (100k events stored)");
    g.sampling_mode(SamplingMode::Flat).sample_size(10);
    for batch in [100u64, 1000, 16384] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        fill(&store, FILL);
        let mut next = FILL;
        g.throughput(Throughput::Elements(batch));
        g.bench_function(format!("write_batch of {batch} events (1 KB)"), |b| {
            b.iter_batched(
                || {
                    let evs: Vec<Event> = (next..next + batch).map(event).collect();
                    next += batch;
                    evs
                },
                |evs| store.write_batch(evs.iter(), BASE_TIME).unwrap(),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn fill(store: &Store, n: u64) {
    for start in (0..n).step_by(10_000) {
        let evs: Vec<Event> = (start..(start + 10_000).min(n)).map(event).collect();
        store.write_batch(evs.iter(), BASE_TIME).unwrap();
    }
}

fn bench_query(c: &mut Criterion) {
    const N: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    fill(&store, N);
    let opts = QueryOptions {
        now: BASE_TIME,
        max_scan_rows: 100_000,
    };
    let author = hex::encode(hash("author", 42));
    let queries = [
        ("author, limit 20", json!({"authors":[author],"limit":20})),
        (
            "author+kinds, limit 20",
            json!({"authors":[author],"kinds":[1,6],"limit":20}),
        ),
        ("kind, limit 50", json!({"kinds":[7],"limit":50})),
        ("#t, limit 20", json!({"#t":["rust"],"limit":20})),
        ("#p, limit 20", json!({"#p":[author],"limit":20})),
        (
            "#e (one id)",
            json!({"#e":[hex::encode(hash("id", 4_000))]}),
        ),
        (
            "kinds+since+until window, limit 100",
            json!({"kinds":[1],"since":BASE_TIME + 50_000,"until":BASE_TIME + 60_000,"limit":100}),
        ),
        (
            "10 authors, limit 50",
            json!({"authors":(0..10).map(|a| hex::encode(hash("author", a))).collect::<Vec<_>>(),"limit":50}),
        ),
    ];
    let mut g = c.benchmark_group("store query (100k events)");
    g.throughput(Throughput::Elements(1));
    for (name, q) in queries {
        let filters = [filter(q)];
        let out = store.query(&filters, &opts).unwrap();
        assert!(!out.events.is_empty(), "{name} matches something");
        g.bench_function(name, |b| {
            b.iter(|| store.query(black_box(&filters), &opts).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench_insert, bench_query);
criterion_main!(benches);
