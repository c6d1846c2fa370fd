//! Many REQs at once are normal (issue 13): clients open 10-20
//! subscriptions when they connect, and hundreds of connections may share
//! one address. The query window weighs what queries are estimated to cost,
//! not how many there are: cheap REQs (author and id lookups) arriving
//! together from one address are all answered, while a pile of expensive
//! scans from one address is still refused at once (`CLOSED
//! rate-limited:`) and a reader from elsewhere is answered beside it.
//!
//! Nothing asserted depends on the machine's speed. The per-IP buckets and
//! read budgets are opened wide, so only the query window decides; its
//! deadline is long, because a deadline is a time (how the window estimates
//! a wait from cost is checked by the unit tests of
//! crates/throttle/src/fair/tests.rs). The expensive scans are kept open by
//! clients that do not read answers far larger than the sockets buffer, so
//! none can finish and give its place back while the pile is built.

use crate::support;

use futures_util::future::join_all;
use serde_json::{Value, json};
use sluice_proto::Event;
use support::*;

/// Connections from one address, and REQs each opens at once.
const CONNECTIONS: usize = 300;
const REQS_PER_CONNECTION: usize = 10;

/// Settings of both tests: every per-IP limit but the query window's wide
/// open, and a deadline no machine reaches.
fn wide_limits() -> Vec<(&'static str, &'static str)> {
    vec![
        ("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "1000"),
        (
            "SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S",
            "1000000",
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_IP__RATE_PER_S",
            "1000000000",
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__RATE_PER_S",
            "1000000000",
        ),
        ("SLUICE_THROTTLE__QUERIES__DEADLINE_MS", "3600000"),
        // Clients that stop reading stay connected.
        ("SLUICE_SERVER__SEND_TIMEOUT_MS", "3600000"),
    ]
}

/// A 64-hex-digit value nobody publishes under: the `n`th of this test.
fn unused_hex(n: usize) -> String {
    format!("{:032x}{:032x}", 0xb0_u128 << 120, n as u128)
}

/// The `j`th REQ of connection `i`: an author lookup (with or without a
/// kind) or an id lookup, on keys that match no stored event.
fn cheap_req(i: usize, j: usize) -> Value {
    let key = unused_hex(i * REQS_PER_CONNECTION + j);
    let filter = match j % 3 {
        0 => json!({"authors": [key]}),
        1 => json!({"authors": [key], "kinds": [1]}),
        _ => json!({"ids": [key]}),
    };
    json!(["REQ", format!("c{i}.{j}"), filter])
}

/// Reads until every one of `n` subscriptions has ended; returns the
/// CLOSED messages among the ends.
async fn ends(c: &mut Client, n: usize) -> Vec<Value> {
    let mut closed = Vec::new();
    let mut ended = 0;
    while ended < n {
        let m = c.recv().await;
        match m[0].as_str() {
            Some("EOSE") => ended += 1,
            Some("CLOSED") => {
                ended += 1;
                closed.push(m);
            }
            _ => {}
        }
    }
    closed
}

/// 300 connections from 127.0.0.1 each send 10 cheap REQs without waiting
/// for any answer; every one gets its EOSE. (The window used to count
/// queries, 64 waiting per address: a burst like this was partly refused.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cheap_reqs_arriving_together_from_one_address_are_all_answered() {
    let relay = Relay::start_with(&wide_limits());
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(relay.client().await);
    }
    // Every REQ of every connection is sent before any answer is read.
    join_all(clients.iter_mut().enumerate().map(|(i, c)| async move {
        for j in 0..REQS_PER_CONNECTION {
            c.send(cheap_req(i, j)).await;
        }
    }))
    .await;
    let closed: Vec<Value> = join_all(
        clients
            .iter_mut()
            .map(|c| async move { ends(c, REQS_PER_CONNECTION).await }),
    )
    .await
    .into_iter()
    .flatten()
    .collect();
    assert!(
        closed.is_empty(),
        "{} of {} cheap REQs were closed, e.g. {:?}",
        closed.len(),
        CONNECTIONS * REQS_PER_CONNECTION,
        &closed[..closed.len().min(3)]
    );
    let refused = relay
        .metric_or_zero(
            "sluice_throttle_refusals_total",
            &["layer=\"query_scheduler\""],
        )
        .await;
    assert_eq!(refused, 0.0, "the query window refused none");
}

/// Notes in the store of the expensive test, and the content bytes of
/// each: an answer to one scan is megabytes, far more than the sockets of
/// a client that does not read can hold.
const STORED: usize = 3000;
const CONTENT_BYTES: usize = 3000;
/// Connections from one address, each with one expensive REQ.
const PILE: usize = 20;

/// A REQ of ten broad scans (no author, id or tag: the whole index, newest
/// first), 5,000 events each.
fn expensive_req(sub: &str, until: u64) -> Value {
    let mut msg = vec![json!("REQ"), json!(sub)];
    msg.extend((0..10).map(|k| json!({"limit": 5000, "until": until - k})));
    Value::Array(msg)
}

/// 20 connections from 127.0.0.7 each send one REQ of ten broad scans and
/// never read its answer, so every admitted scan stays open: the window
/// admits some and refuses the rest with `CLOSED rate-limited:` for their
/// address's queued cost. A polite reader from another address meanwhile
/// gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pile_of_expensive_reqs_from_one_address_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let base = now() - 100_000;
    let notes: Vec<Event> = (0..STORED)
        .map(|i| {
            let content = format!("{i:06} {}", "x".repeat(CONTENT_BYTES));
            ev(1 + (i % 50) as u8, base + i as u64, 1, &[], &content)
        })
        .collect();
    import_events(&store, &notes);
    let relay = Relay::start_in(&store, &wide_limits());

    let mut pile = Vec::with_capacity(PILE);
    for i in 0..PILE {
        let mut c = Client::connect_small_buffer(&relay.url(), "127.0.0.7", 4096).await;
        c.send(expensive_req(&format!("x{i}"), now())).await;
        pile.push(c);
    }
    // The first message of each: an EVENT if admitted (the rest of the
    // answer waits unread), else the CLOSED.
    let (admitted, closed) = first_answers(&mut pile).await;
    assert!(admitted >= 1, "an expensive REQ alone is admitted");
    assert!(
        !closed.is_empty(),
        "all {PILE} expensive REQs from one address were admitted"
    );
    for m in &closed {
        let text = m[2].as_str().unwrap_or_default();
        assert!(text.starts_with("rate-limited:"), "{m}");
    }
    let refused = relay
        .metric(
            "sluice_throttle_refusals_total",
            &["layer=\"query_scheduler\"", "reason=\"client_queue_full\""],
        )
        .await;
    assert_eq!(
        refused,
        closed.len() as f64,
        "each CLOSED is the window's refusal for the address's queued cost"
    );

    // Another address is answered beside the pile.
    let mut polite = Client::connect_from(&relay.url(), "127.0.0.8").await;
    let got = polite
        .req("polite", &[json!({"authors": [pubkey_hex(1)], "limit": 5})])
        .await;
    assert_eq!(got.len(), 5);
    drop(pile);
}
