//! Hot paths of the protocol crate, on real events from the test fixture.
//!
//! Run: `cargo bench -p sluice-proto --bench proto`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use sluice_proto::{ClientMessage, Event, Filter};

const FIXTURE: &str = include_str!("../../../tests/fixtures/real-events.jsonl");

/// A real kind-1 note of about 1 KB (the size of typical traffic) with tags.
fn typical_event() -> &'static str {
    FIXTURE
        .lines()
        .filter(|l| l.contains("\"kind\":1,") && l.contains("[\"p\","))
        .min_by_key(|l| l.len().abs_diff(1024))
        .expect("fixture holds kind-1 notes with p tags")
}

fn filter(v: serde_json::Value) -> Filter {
    Filter::from_value(&v).expect("valid filter")
}

fn bench(c: &mut Criterion) {
    let raw = typical_event();
    let event = Event::parse(raw).expect("fixture event parses");
    event.verify().expect("fixture event verifies");
    let msg = format!("[\"EVENT\",{raw}]");
    let mut g = c.benchmark_group("proto");
    g.throughput(Throughput::Elements(1));

    g.bench_function("parse EVENT message (1 KB note)", |b| {
        b.iter(|| ClientMessage::parse(black_box(&msg)).unwrap())
    });
    let req = r##"["REQ","sub1",{"authors":["5192759b0e0c91d936115ca57b7fedea4116258f9d99cc3933ec3f1c3e81e2ed"],"kinds":[1,6,7],"limit":50},{"#p":["5192759b0e0c91d936115ca57b7fedea4116258f9d99cc3933ec3f1c3e81e2ed"],"since":1600000000}]"##;
    g.bench_function("parse REQ message (2 filters)", |b| {
        b.iter(|| ClientMessage::parse(black_box(req)).unwrap())
    });
    g.bench_function("canonical id (serialize + SHA-256)", |b| {
        b.iter(|| black_box(&event).compute_id())
    });
    g.bench_function("verify (id + BIP-340 signature)", |b| {
        b.iter(|| black_box(&event).verify().unwrap())
    });
    // What the relay asks of an outsider's EVENT before its signature: the
    // nonce tag's target and the id's leading zero bits.
    let mined = Event::sign(
        &[1; 32],
        1_700_000_000,
        1,
        vec![
            vec!["t".into(), "nostr".into()],
            vec!["nonce".into(), "12345".into(), "16".into()],
        ],
        "a mined note",
    );
    g.bench_function("NIP-13 difficulty (nonce tag + id bits)", |b| {
        b.iter(|| sluice_proto::pow::difficulty(black_box(&mined)))
    });

    let author = hex::encode(event.pubkey);
    let p = event.first_tag_value("p").expect("has a p tag").to_owned();
    let miss_author = "00".repeat(32);
    let filters = [
        (
            "authors+kinds hit",
            filter(json!({"authors":[author],"kinds":[1,6,7]})),
        ),
        (
            "authors miss",
            filter(json!({"authors":[miss_author],"kinds":[1]})),
        ),
        ("#p hit", filter(json!({"#p":[p]}))),
        (
            "kinds+since+#t miss",
            filter(json!({"kinds":[1],"since":1,"#t":["nostr","bitcoin"]})),
        ),
    ];
    for (name, f) in &filters {
        g.bench_function(format!("filter match ({name})"), |b| {
            b.iter(|| black_box(f).matches(black_box(&event)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
