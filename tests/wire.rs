//! Writes shaped at the socket: a client that pipelines its EVENTs is
//! slowed (the relay stops reading its socket while
//! `server.max_pending_writes` of them await their OK), not refused; and
//! one that reads nothing is ended as a slow consumer without holding
//! anything shared.

use crate::support;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use support::*;
use tokio_tungstenite::tungstenite::Message;

/// `n` distinct signed notes.
fn notes(n: usize) -> Vec<sluice_proto::Event> {
    let t = now();
    (0..n)
        .map(|i| {
            ev(
                (i % 7) as u8 + 1,
                t - 60,
                1,
                &[],
                &format!("pipelined note {i}"),
            )
        })
        .collect()
}

/// Sends every event at once from one connection (from a task of its own,
/// so a relay that stops reading only slows the sender), then reads one OK
/// per event; the OKs in the order they came.
async fn pipeline(relay: &Relay, events: &[sluice_proto::Event]) -> Vec<Value> {
    let (ws, _) = tokio_tungstenite::connect_async(relay.url())
        .await
        .expect("connect");
    let (mut sink, mut stream) = ws.split();
    let texts: Vec<String> = events
        .iter()
        .map(|e| format!("[\"EVENT\",{}]", e.raw()))
        .collect();
    let sender = tokio::spawn(async move {
        for t in texts {
            sink.feed(Message::Text(t.into())).await.expect("send");
        }
        sink.flush().await.expect("flush");
        sink
    });
    let mut oks = Vec::new();
    while oks.len() < events.len() {
        let msg = tokio::time::timeout(ANSWER_TIMEOUT, stream.next())
            .await
            .expect("an OK in time")
            .expect("connection open")
            .expect("a message");
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(&t).unwrap();
        if v[0] == "OK" {
            oks.push(v);
        }
    }
    drop(sender.await.unwrap());
    oks
}

#[tokio::test]
async fn a_thousand_pipelined_events_are_all_stored_none_refused() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__MODE", "off")]);
    let events = notes(1000);
    let oks = pipeline(&relay, &events).await;
    let refused: Vec<&Value> = oks.iter().filter(|v| v[2] != true).collect();
    assert!(
        refused.is_empty(),
        "refused: {:?}",
        &refused[..refused.len().min(3)]
    );
    let mut ids: Vec<&str> = oks.iter().map(|v| v[1].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1000, "one OK per event");
    let stored = relay
        .metric("sluice_events_accepted_total", &["outcome=\"stored\""])
        .await;
    assert_eq!(stored, 1000.0);
}

#[tokio::test]
async fn at_the_bound_the_socket_waits_and_answers_keep_their_order() {
    // One EVENT in flight at most: the relay reads the next only once the
    // last is answered, so every pipelined EVENT pauses the reading.
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__MODE", "off"),
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1"),
    ]);
    let events = notes(200);
    let oks = pipeline(&relay, &events).await;
    for (ok, ev) in oks.iter().zip(&events) {
        assert_eq!(ok[1], ev.id_hex(), "answers in the order sent");
        assert_eq!(ok[2], true, "{ok}");
    }
    let paused = relay.metric("sluice_socket_reads_paused_total", &[]).await;
    assert!(paused >= 1.0, "paused {paused}");
}

#[tokio::test]
async fn a_client_that_reads_nothing_is_ended_as_a_slow_consumer() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__MODE", "off"),
        ("SLUICE_SERVER__SEND_TIMEOUT_MS", "500"),
    ]);
    // A small receive buffer: the relay's sends stall once the kernel's
    // buffers are full, and this client reads nothing: not its OKs, not
    // the live copies of what it publishes (16 KB each, past any buffer).
    let mut stalled = Client::connect_small_buffer(&relay.url(), "127.0.0.3", 4096).await;
    stalled.send(serde_json::json!(["REQ", "all", {}])).await;
    let t = now();
    let big = "x".repeat(16_000);
    let events: Vec<_> = (0..600u32)
        .map(|i| ev((i % 7) as u8 + 1, t - 60, 1, &[], &format!("{i} {big}")))
        .collect();
    let sending = tokio::spawn(async move {
        for e in &events {
            let text = format!("[\"EVENT\",{}]", e.raw());
            let sent = tokio::time::timeout(ANSWER_TIMEOUT, stalled.send_text_checked(&text)).await;
            if sent != Ok(true) {
                break;
            }
        }
        stalled
    });
    eventually("the stalled client is ended as a slow consumer", || async {
        relay
            .metric_or_zero("sluice_slow_consumer_disconnects_total", &[])
            .await
            >= 1.0
    })
    .await;
    // Nothing it held is held any more, and the relay serves others.
    eventually("its connection and subscription are given back", || async {
        relay.metric("sluice_connections_open", &[]).await == 0.0
            && relay.metric("sluice_subscriptions_open", &[]).await == 0.0
    })
    .await;
    drop(sending.await.unwrap());
    let mut other = relay.client().await;
    let e = ev(9, now(), 1, &[], "after the stall");
    let (ok, why) = other.publish(&e).await;
    assert!(ok, "{why}");
}
