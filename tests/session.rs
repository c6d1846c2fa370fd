//! Black-box tests of the session loop: a write delay holds back only the
//! delayed EVENT, never the connection's other traffic or its shutdown.
//!
//! The delay is produced by the real controller path: the write
//! controller's output is pinned at its maximum (`write.output_min = 1`),
//! so every tick publishes a steady `Delay(write.max_delay_ms)` verdict;
//! with `check_every_ops = 2` it falls on every second EVENT of a
//! connection (the first goes straight on), and `polite_ops_per_s = 0`
//! exempts no connection. The tests assert the order of answers, not
//! durations: the delay is long enough that the steps before it finish
//! first at any machine speed.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A relay whose write controller delays every second EVENT of a
/// connection by `delay_ms`.
async fn delaying_relay(delay_ms: &str) -> Relay {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__WRITE__OUTPUT_MIN", "1"),
        ("SLUICE_THROTTLE__WRITE__MAX_DELAY_MS", delay_ms),
        ("SLUICE_THROTTLE__CHECK_EVERY_OPS", "2"),
        ("SLUICE_THROTTLE__CLIENTS__POLITE_OPS_PER_S", "0"),
        // Keep the per-client buckets at their base rates (they are
        // otherwise scaled down by the controller's output).
        ("SLUICE_THROTTLE__CLIENTS__MIN_RATE_FRACTION", "1"),
    ]);
    for _ in 0..500 {
        let state = relay.get_json("/api/throttle").await["state"].clone();
        if state["write"]["verdict"]["delay_ns"].is_u64() {
            return relay;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the write controller never published a delay");
}

/// Waits until the relay has delayed an EVENT (counted at admission, when
/// the EVENT starts waiting).
async fn wait_for_a_delayed_event(relay: &Relay) {
    for _ in 0..500 {
        // Polled before the first delay: absent until then.
        let delays = relay
            .metric_or_zero(
                "sluice_throttle_decisions_total",
                &["direction=\"write\"", "action=\"delay\""],
            )
            .await;
        if delays >= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no EVENT was delayed");
}

/// What a message is, for order assertions.
fn label(m: &Value, first: &str, held: &str) -> String {
    match (m[0].as_str(), m[1].as_str()) {
        (Some("OK"), Some(id)) if id == first => format!("OK first {}", m[2]),
        (Some("OK"), Some(id)) if id == held => format!("OK held {}", m[2]),
        (Some("EVENT"), Some(sub)) => format!("EVENT {sub} {}", m[2]["content"]),
        _ => m.to_string(),
    }
}

#[tokio::test]
async fn a_write_delay_holds_back_only_the_delayed_event() {
    let relay = delaying_relay("10000").await;
    let mut a = Client::connect_from(&relay.url(), "127.0.0.2").await;
    let mut b = Client::connect_from(&relay.url(), "127.0.0.3").await;
    let t = now();
    // A follows B's notes.
    let stored = a
        .req("b", &[json!({"authors": [pubkey_hex(3)], "kinds": [1]})])
        .await;
    assert!(stored.is_empty());
    // A's first EVENT goes to the writer; its second is held by the delay.
    // The held one is ephemeral: once released its OK needs no writer, so a
    // session that slept inside the handler (as the old loop did) sends it
    // before anything that arrived during the delay.
    let first = ev(2, t, 1, &[], "first");
    let held = ev(2, t, 20001, &[], "held");
    a.send_event(&first).await;
    a.send_event(&held).await;
    wait_for_a_delayed_event(&relay).await;
    // Now that A's EVENT waits, B (whose first EVENT is not delayed)
    // publishes a note A follows.
    let (ok, msg) = b.publish(&ev(3, t, 1, &[], "live")).await;
    assert!(ok, "{msg}");
    let (first_id, held_id) = (first.id_hex(), held.id_hex());
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(label(&a.recv().await, &first_id, &held_id));
    }
    assert_eq!(
        seen,
        [
            "OK first true",
            "EVENT b \"live\"",
            // Released after the delay, from where it stopped.
            "OK held true",
        ]
    );
    let delays = relay
        .metric(
            "sluice_throttle_decisions_total",
            &[
                "direction=\"write\"",
                "action=\"delay\"",
                "enforced=\"true\"",
            ],
        )
        .await;
    assert_eq!(delays, 1.0, "exactly A's second EVENT was delayed");
}

#[tokio::test]
async fn shutdown_answers_an_event_held_by_a_write_delay() {
    // Longer than the shutdown grace: the held EVENT must not wait it out.
    let relay = delaying_relay("60000").await;
    let mut a = Client::connect_from(&relay.url(), "127.0.0.2").await;
    let t = now();
    let first = ev(2, t, 1, &[], "first");
    let held = ev(2, t + 1, 1, &[], "held");
    a.send_event(&first).await;
    a.send_event(&held).await;
    wait_for_a_delayed_event(&relay).await;
    relay.signal("TERM");
    let mut answers = Vec::new();
    while let Some(m) = a.try_recv(ANSWER_TIMEOUT).await {
        answers.push(m);
    }
    let ok_of = |id: &str| {
        answers
            .iter()
            .find(|m| m[0] == "OK" && m[1] == id)
            .map(|m| (m[2].clone(), m[3].clone()))
    };
    assert_eq!(
        ok_of(&first.id_hex()),
        Some((json!(true), json!(""))),
        "{answers:?}"
    );
    assert_eq!(
        ok_of(&held.id_hex()),
        Some((json!(false), json!("error: relay is shutting down"))),
        "{answers:?}"
    );
}
