//! Black-box tests of live fan-out through the engine's subscription index:
//! a connection whose subscriptions match nothing is never queued to (so
//! it can never be dropped for the relay's global event rate), CLOSE and
//! REQ replacement take effect at once, and a REQ opened while events are
//! being published sees each of them exactly once (stored or live).
//!
//! Order, not timing: the writer queues an event to every matching
//! connection before it sends the OK, and a session serves its live queue
//! before it reads the next client frame, so "an EVENT would have arrived
//! before this EOSE" holds at any machine speed.

use crate::support;

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use support::*;

/// Sends every event at once (pipelined), then waits for all their OKs, in
/// whatever order they come; all must be true.
async fn publish_all(c: &mut Client, events: &[sluice_proto::Event]) {
    for e in events {
        c.send_event(e).await;
    }
    let mut waiting: HashSet<String> = events.iter().map(|e| e.id_hex()).collect();
    while !waiting.is_empty() {
        let m = c.recv().await;
        if m[0] == "OK" {
            let id = m[1].as_str().unwrap();
            assert!(waiting.remove(id), "unexpected OK {m}");
            assert_eq!(m[2], true, "{m}");
        }
    }
}

/// A COUNT with a fresh id, answered after every live event queued to this
/// connection before it was read (a COUNT is not a subscription: it leaves
/// the live index as it was). Returns the messages that came first.
async fn sync(c: &mut Client, n: usize) -> Vec<Value> {
    let sub = format!("sync-{n}");
    c.send(json!(["COUNT", sub, {"ids": ["00".repeat(32)]}]))
        .await;
    let mut before = Vec::new();
    loop {
        let m = c.recv().await;
        if m[0] == "COUNT" && m[1] == sub.as_str() {
            return before;
        }
        before.push(m);
    }
}

#[tokio::test]
async fn a_subscriber_that_matches_nothing_is_never_queued_to_nor_dropped() {
    // A live queue of one event: any connection sent the global stream
    // would fall behind at once and be dropped as a slow consumer.
    let relay = Relay::start_with(&[
        ("SLUICE_ENGINE__LIVE_BUFFER_EVENTS", "1"),
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1000"),
        ("SLUICE_THROTTLE__MODE", "off"),
    ]);
    let mut idle = relay.client().await;
    for i in 0..10 {
        let author = pubkey_hex(100 + i);
        idle.req(&format!("idle-{i}"), &[json!({"authors": [author]})])
            .await;
    }
    let mut publisher = relay.client().await;
    let t = now();
    let events: Vec<_> = (0..200u64)
        .map(|i| ev(1, t - 200 + i, 1, &[&["t", "fanout"]], &format!("note {i}")))
        .collect();
    publish_all(&mut publisher, &events).await;
    // Still connected, and nothing was sent to it.
    assert!(sync(&mut idle, 0).await.is_empty());
    assert_eq!(
        relay
            .metric_or_zero("sluice_slow_consumer_disconnects_total", &[])
            .await,
        0.0
    );
    assert_eq!(relay.metric("sluice_live_queued_total", &[]).await, 0.0);
    assert_eq!(
        relay
            .metric_or_zero("sluice_live_queue_full_total", &[])
            .await,
        0.0
    );
    // Its author-indexed filters were never even checked against them.
    assert_eq!(relay.metric("sluice_live_candidates_total", &[]).await, 0.0);
    assert_eq!(relay.metric("sluice_live_subscriptions", &[]).await, 10.0);
}

#[tokio::test]
async fn close_and_replacement_take_effect_at_once() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__MODE", "off")]);
    let mut watcher = relay.client().await;
    let mut publisher = relay.client().await;
    let (a, b) = (pubkey_hex(1), pubkey_hex(2));
    let t = now();

    watcher.req("s", &[json!({"authors": [a]})]).await;
    let first = ev(1, t, 1, &[], "one");
    publish_all(&mut publisher, std::slice::from_ref(&first)).await;
    let seen = sync(&mut watcher, 1).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0][1], "s");
    assert_eq!(seen[0][2]["id"], first.id_hex().as_str());

    // Replaced: the new filters only.
    watcher.req("s", &[json!({"authors": [b]})]).await;
    let by_a = ev(1, t, 1, &[], "two");
    let by_b = ev(2, t, 1, &[], "three");
    publish_all(&mut publisher, &[by_a, by_b.clone()]).await;
    let seen = sync(&mut watcher, 2).await;
    let ids: Vec<&str> = seen.iter().map(|m| m[2]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![by_b.id_hex().as_str()], "{seen:?}");

    // Closed: nothing more, and the index is empty.
    watcher.send(json!(["CLOSE", "s"])).await;
    assert!(sync(&mut watcher, 3).await.is_empty());
    publish_all(&mut publisher, &[ev(2, t, 1, &[], "four")]).await;
    assert!(sync(&mut watcher, 4).await.is_empty());
    assert_eq!(relay.metric("sluice_live_subscriptions", &[]).await, 0.0);
}

#[tokio::test]
async fn a_req_opened_during_publishing_sees_every_event_once() {
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1000"),
        ("SLUICE_THROTTLE__MODE", "off"),
    ]);
    let author = pubkey_hex(3);
    let t = now();
    let events: Vec<_> = (0..300u64)
        .map(|i| ev(3, t - 300 + i, 1, &[], &format!("n{i}")))
        .collect();
    let (early, late) = events.split_at(150);
    let mut publisher = relay.client().await;
    publish_all(&mut publisher, early).await;

    // The REQ goes in while the second half is being published.
    let mut watcher = relay.client().await;
    let late = late.to_vec();
    let publishing = tokio::spawn(async move {
        publish_all(&mut publisher, &late).await;
        publisher
    });
    watcher
        .send(json!(["REQ", "w", {"authors": [author], "limit": 1000}]))
        .await;
    let _publisher = publishing.await.unwrap();
    // Every event is committed and queued now: the REQ's stored events and
    // EOSE, then the live ones, all come before the sync's answer.
    let mut got: HashMap<String, usize> = HashMap::new();
    let mut eose = false;
    while !eose {
        let m = watcher.recv().await;
        match m[0].as_str().unwrap() {
            "EVENT" => {
                *got.entry(m[2]["id"].as_str().unwrap().to_string())
                    .or_default() += 1
            }
            "EOSE" => eose = true,
            _ => panic!("unexpected {m}"),
        }
    }
    for m in sync(&mut watcher, 0).await {
        assert_eq!(m[0], "EVENT", "{m}");
        *got.entry(m[2]["id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert!(eose, "the REQ ended");
    let repeats: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeats.is_empty(), "sent twice: {repeats:?}");
    let want: HashSet<String> = events.iter().map(|e| e.id_hex()).collect();
    let have: HashSet<String> = got.into_keys().collect();
    assert_eq!(have, want, "missing: {:?}", want.difference(&have).count());
}
