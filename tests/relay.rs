//! Black-box tests of `sluice serve`: the real binary on port 0 with a
//! temporary LMDB store, spoken to over a real WebSocket. One test per
//! rule, named after it.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use sluice_proto::{Event, KindClass};
use support::*;

// ---------------------------------------------------------------- EVENT / OK

#[tokio::test]
async fn stored_event_gets_ok_true_and_is_served_byte_identical() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    // Unusual but valid JSON spacing and escapes must come back as sent.
    let e = ev(
        1,
        now() - 5,
        1,
        &[&["t", "nostr"]],
        "hello \"world\" \u{1F600} \\ /",
    );
    let spaced = e.raw().replacen(",\"", " , \"", 2);
    c.send_text(&format!("[\"EVENT\", {spaced}]")).await;
    assert_eq!(c.expect_ok(&e.id_hex()).await, (true, String::new()));
    assert_eq!(
        c.req("s", &[json!({"ids":[e.id_hex()]})]).await,
        vec![spaced]
    );
}

#[tokio::test]
async fn duplicate_event_gets_ok_true_with_duplicate_prefix() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now() - 5, 1, &[], "dup");
    assert!(c.publish(&e).await.0);
    let (ok, msg) = c.publish(&e).await;
    assert!(ok);
    assert!(msg.starts_with("duplicate:"), "{msg}");
}

#[tokio::test]
async fn wrong_id_is_refused_with_invalid() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now() - 5, 1, &[], "original");
    let forged = e.raw().replace("original", "forged");
    c.send_text(&format!("[\"EVENT\",{forged}]")).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(!ok);
    assert!(msg.starts_with("invalid:"), "{msg}");
}

#[tokio::test]
async fn bad_signature_is_refused_with_invalid() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now() - 5, 1, &[], "x");
    let other = ev(2, now() - 5, 1, &[], "y");
    let sig = sluice_proto::hex32::encode(&e.sig);
    let bad = e
        .raw()
        .replace(&sig, &sluice_proto::hex32::encode(&other.sig));
    c.send_text(&format!("[\"EVENT\",{bad}]")).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(!ok);
    assert!(
        msg.starts_with("invalid:") && msg.contains("signature"),
        "{msg}"
    );
}

#[tokio::test]
async fn uppercase_hex_is_refused() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now() - 5, 1, &[], "x");
    let pk = sluice_proto::hex32::encode(&e.pubkey);
    let upper = e.raw().replace(&pk, &pk.to_uppercase());
    c.send_text(&format!("[\"EVENT\",{upper}]")).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(!ok);
    assert!(msg.starts_with("invalid:"), "{msg}");
}

/// NIP-01: an OK's first element is the event id. A bad EVENT whose id
/// cannot be read as 64 hex characters (cut short, truncated after a short
/// id, one character short, oversized with such an id) gets a NOTICE, never
/// an OK naming something that is not an event id; one whose id can be
/// read gets its OK false, with the id as sent (uppercase included).
#[tokio::test]
async fn a_bad_event_gets_ok_false_only_with_a_64_hex_id() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_MESSAGE_BYTES", "2048")]);
    let mut c = relay.client().await;
    let e = ev(1, now() - 5, 1, &[], "x");
    let id = e.id_hex();
    let notice = |m: serde_json::Value| {
        assert_eq!(m[0], "NOTICE", "{m}");
        assert!(m[1].as_str().unwrap().starts_with("invalid:"), "{m}");
    };
    // Truncated after a short id.
    c.send_text(r#"["EVENT", {"id": "abc", "#).await;
    notice(c.recv().await);
    // Truncated after a full id: its OK false, first.
    c.send_text(&format!(r#"["EVENT", {{"id": "{id}", "#)).await;
    let m = c.recv().await;
    assert_eq!(
        (&m[0], &m[1], &m[2]),
        (&json!("OK"), &json!(id), &json!(false)),
        "{m}"
    );
    assert!(m[3].as_str().unwrap().starts_with("invalid:"), "{m}");
    // A whole event whose id is uppercase: OK false naming it as sent.
    let upper = id.to_uppercase();
    c.send_text(&format!("[\"EVENT\",{}]", e.raw().replace(&id, &upper)))
        .await;
    let (ok, msg) = c.expect_ok(&upper).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // One character short: no id, a NOTICE.
    c.send_text(&format!("[\"EVENT\",{}]", e.raw().replace(&id, &id[..63])))
        .await;
    notice(c.recv().await);
    // Over `limits.max_message_bytes`, refused unparsed: the same rule.
    let big = ev(1, now() - 5, 1, &[], &"x".repeat(3000));
    let short = big.raw().replace(&big.id_hex(), "abc");
    c.send_text(&format!("[\"EVENT\",{short}]")).await;
    notice(c.recv().await);
    // Nothing else was sent, and the connection goes on.
    c.send(json!(["REQ", "barrier", {"limit": 0}])).await;
    assert_eq!(c.recv().await, json!(["EOSE", "barrier"]));
    assert!(c.publish(&e).await.0);
}

#[tokio::test]
async fn kind_out_of_range_and_non_string_tags_are_refused() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now() - 5, 1, &[], "x");
    let mut v: serde_json::Value = serde_json::from_str(e.raw()).unwrap();
    v["kind"] = json!(70000);
    c.send(json!(["EVENT", v])).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    v["kind"] = json!(1);
    v["tags"] = json!([["p", 5]]);
    c.send(json!(["EVENT", v])).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
}

#[tokio::test]
async fn event_too_far_in_the_future_is_refused() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(1, now() + 3600, 1, &[], "future")).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    let (ok, _) = c
        .publish(&ev(1, now() + 60, 1, &[], "slightly ahead"))
        .await;
    assert!(ok);
}

#[tokio::test]
async fn event_older_than_the_lower_limit_is_refused() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__CREATED_AT_MAX_AGE_SECS", "3600")]);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(1, now() - 7200, 1, &[], "old")).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
}

#[tokio::test]
async fn too_many_tags_and_too_long_content_are_refused() {
    let relay = Relay::start_with(&[
        ("SLUICE_LIMITS__MAX_EVENT_TAGS", "3"),
        ("SLUICE_LIMITS__MAX_CONTENT_BYTES", "10"),
    ]);
    let mut c = relay.client().await;
    let tags: &[&[&str]] = &[&["t", "a"], &["t", "b"], &["t", "c"], &["t", "d"]];
    let (ok, msg) = c.publish(&ev(1, now(), 1, tags, "x")).await;
    assert!(
        !ok && msg.starts_with("invalid:") && msg.contains("tags"),
        "{msg}"
    );
    let (ok, msg) = c.publish(&ev(1, now(), 1, &[], "this is too long")).await;
    assert!(
        !ok && msg.starts_with("invalid:") && msg.contains("content"),
        "{msg}"
    );
}

#[tokio::test]
async fn oversized_message_is_refused_without_parsing() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_MESSAGE_BYTES", "2048")]);
    let mut c = relay.client().await;
    let e = ev(1, now(), 1, &[], &"x".repeat(3000));
    c.send_text(&format!("[\"EVENT\",{}]", e.raw())).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(
        !ok && msg.starts_with("invalid:") && msg.contains("too large"),
        "{msg}"
    );
    c.send_text(&format!(
        "[\"REQ\",\"s\",{{\"#t\":[\"{}\"]}}]",
        "y".repeat(3000)
    ))
    .await;
    let n = c.expect("NOTICE").await;
    assert!(n[1].as_str().unwrap().starts_with("invalid:"));
    // The connection stays usable.
    assert!(c.publish(&ev(1, now(), 1, &[], "small")).await.0);
}

// ------------------------------------------------------------- kind classes

#[tokio::test]
async fn replaceable_event_keeps_only_the_newest() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let t = now() - 100;
    let v1 = ev(1, t, 0, &[], "v1");
    let v2 = ev(1, t + 10, 0, &[], "v2");
    assert!(c.publish(&v1).await.0);
    assert!(c.publish(&v2).await.0);
    assert_eq!(
        c.req_ids("s", &[json!({"kinds":[0],"authors":[pubkey_hex(1)]})])
            .await,
        vec![v2.id_hex()]
    );
}

#[tokio::test]
async fn older_replaceable_version_is_not_stored() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let t = now() - 100;
    let newer = ev(1, t + 10, 10002, &[], "new");
    let older = ev(1, t, 10002, &[], "old");
    assert!(c.publish(&newer).await.0);
    let (ok, msg) = c.publish(&older).await;
    assert!(!ok && msg.starts_with("duplicate:"), "{msg}");
    assert_eq!(
        c.req_ids("s", &[json!({"kinds":[10002]})]).await,
        vec![newer.id_hex()]
    );
}

#[tokio::test]
async fn replaceable_tie_keeps_the_lowest_id() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let t = now() - 100;
    let mut pair = [ev(1, t, 3, &[], "a"), ev(1, t, 3, &[], "b")];
    pair.sort_by_key(|e| e.id);
    assert!(c.publish(&pair[1]).await.0);
    assert!(c.publish(&pair[0]).await.0);
    assert!(!c.publish(&pair[1]).await.0);
    assert_eq!(
        c.req_ids("s", &[json!({"kinds":[3]})]).await,
        vec![pair[0].id_hex()]
    );
}

#[tokio::test]
async fn addressable_event_is_replaced_per_d_tag_and_missing_d_is_empty() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let t = now() - 100;
    let a1 = ev(1, t, 30023, &[&["d", "a"]], "a1");
    let a2 = ev(1, t + 1, 30023, &[&["d", "a"]], "a2");
    let b1 = ev(1, t, 30023, &[&["d", "b"]], "b1");
    let none = ev(1, t, 30023, &[], "no d");
    let empty = ev(1, t + 1, 30023, &[&["d", ""]], "empty d");
    for e in [&a1, &a2, &b1, &none, &empty] {
        assert!(c.publish(e).await.0);
    }
    let mut got = c.req_ids("s", &[json!({"kinds":[30023]})]).await;
    got.sort();
    let mut want = vec![a2.id_hex(), b1.id_hex(), empty.id_hex()];
    want.sort();
    assert_eq!(got, want);
}

#[tokio::test]
async fn ephemeral_event_is_delivered_live_and_never_stored() {
    let relay = Relay::start();
    let mut sub = relay.client().await;
    assert!(
        sub.req("live", &[json!({"kinds":[20001]})])
            .await
            .is_empty()
    );
    let mut c = relay.client().await;
    let e = ev(1, now(), 20001, &[], "ephemeral");
    assert_eq!(c.publish(&e).await, (true, String::new()));
    let got = sub.expect("EVENT").await;
    assert_eq!(got[2]["id"], e.id_hex());
    assert!(c.req("later", &[json!({"kinds":[20001]})]).await.is_empty());
}

// ------------------------------------------------------------------ filters

async fn seed_filters(c: &mut Client) -> Vec<Event> {
    let t = now() - 1000;
    let evs = vec![
        ev(1, t, 1, &[&["t", "nostr"], &["p", &pubkey_hex(9)]], "a"),
        ev(
            2,
            t + 10,
            7,
            &[&["e", &"ab".repeat(32)], &["t", "other"]],
            "b",
        ),
        ev(1, t + 20, 1, &[&["t", "nostr"]], "c"),
        ev(3, t + 30, 30023, &[&["d", "x"], &["t", "nostr"]], "d"),
    ];
    for e in &evs {
        assert!(c.publish(e).await.0);
    }
    evs
}

#[tokio::test]
async fn filter_fields_select_and_combine_with_and() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = seed_filters(&mut c).await;
    let t = e[0].created_at;
    let id = |i: usize| e[i].id_hex();
    assert_eq!(
        c.req_ids("1", &[json!({"ids":[id(1), id(2)]})]).await,
        vec![id(2), id(1)]
    );
    assert_eq!(
        c.req_ids("2", &[json!({"authors":[pubkey_hex(1)]})]).await,
        vec![id(2), id(0)]
    );
    assert_eq!(c.req_ids("3", &[json!({"kinds":[7]})]).await, vec![id(1)]);
    assert_eq!(
        c.req_ids("4", &[json!({"#t":["nostr"]})]).await,
        vec![id(3), id(2), id(0)]
    );
    assert_eq!(
        c.req_ids("5", &[json!({"#p":[pubkey_hex(9)]})]).await,
        vec![id(0)]
    );
    assert_eq!(
        c.req_ids("6", &[json!({"#e":["ab".repeat(32)]})]).await,
        vec![id(1)]
    );
    assert_eq!(
        c.req_ids("7", &[json!({"since":t+10,"until":t+20})]).await,
        vec![id(2), id(1)]
    );
    assert_eq!(
        c.req_ids(
            "8",
            &[json!({"#t":["nostr"],"kinds":[1],"authors":[pubkey_hex(1)],"since":t+1})]
        )
        .await,
        vec![id(2)]
    );
    assert_eq!(
        c.req_ids("9", &[json!({"#t":["nostr"],"#d":["x"]})]).await,
        vec![id(3)]
    );
    assert_eq!(
        c.req_ids("10", &[json!({"kinds":[]})]).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn filters_are_ored_and_each_event_is_sent_once() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = seed_filters(&mut c).await;
    let got = c
        .req_ids(
            "s",
            &[
                json!({"kinds":[1]}),
                json!({"#t":["nostr"]}),
                json!({"kinds":[7]}),
            ],
        )
        .await;
    assert_eq!(
        got,
        vec![e[3].id_hex(), e[2].id_hex(), e[1].id_hex(), e[0].id_hex()]
    );
}

#[tokio::test]
async fn results_are_newest_first_with_ties_by_lowest_id_and_limit() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let t = now() - 500;
    let mut same: Vec<Event> = (0..6)
        .map(|i| ev(1, t, 1, &[], &format!("tie {i}")))
        .collect();
    let newest = ev(1, t + 5, 1, &[], "newest");
    for e in same.iter().chain([&newest]) {
        assert!(c.publish(e).await.0);
    }
    same.sort_by_key(|e| e.id);
    let got = c.req_ids("s", &[json!({"kinds":[1],"limit":4})]).await;
    let want: Vec<String> = [&newest, &same[0], &same[1], &same[2]]
        .iter()
        .map(|e| e.id_hex())
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn default_limit_and_max_limit_apply() {
    let relay = Relay::start_with(&[
        ("SLUICE_LIMITS__DEFAULT_LIMIT", "3"),
        ("SLUICE_LIMITS__MAX_LIMIT", "5"),
    ]);
    let mut c = relay.client().await;
    for i in 0..8 {
        assert!(
            c.publish(&ev(1, now() - 100 + i, 1, &[], &i.to_string()))
                .await
                .0
        );
    }
    assert_eq!(c.req("a", &[json!({"kinds":[1]})]).await.len(), 3);
    assert_eq!(
        c.req("b", &[json!({"kinds":[1],"limit":100})]).await.len(),
        5
    );
}

#[tokio::test]
async fn limit_zero_gives_eose_at_once_then_live_events() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    assert!(c.publish(&ev(1, now() - 10, 1, &[], "stored")).await.0);
    assert!(
        c.req("s", &[json!({"kinds":[1],"limit":0})])
            .await
            .is_empty()
    );
    let mut p = relay.client().await;
    let e = ev(2, now(), 1, &[], "live");
    assert!(p.publish(&e).await.0);
    let got = c.expect("EVENT").await;
    assert_eq!(got[1], "s");
    assert_eq!(got[2]["id"], e.id_hex());
}

// ------------------------------------------------------------ subscriptions

#[tokio::test]
async fn live_events_matching_a_subscription_are_pushed_after_eose() {
    let relay = Relay::start();
    let mut sub = relay.client().await;
    sub.req("feed", &[json!({"#t":["rust"]})]).await;
    let mut p = relay.client().await;
    let miss = ev(1, now(), 1, &[&["t", "go"]], "no");
    let hit = ev(1, now(), 1, &[&["t", "rust"]], "yes");
    assert!(p.publish(&miss).await.0);
    assert!(p.publish(&hit).await.0);
    let text = sub.recv_text().await;
    assert!(text.starts_with("[\"EVENT\",\"feed\","), "{text}");
    assert_eq!(event_object_text(&text), hit.raw());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_racing_writes_gets_each_event_once() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__MODE", "off")]);
    for round in 0..5u64 {
        let mut p = relay.client().await;
        let mut sub = relay.client().await;
        let author = 100 + round as u8;
        let events: Vec<Event> = (0..300)
            .map(|i| ev(author, now() - 1000 + i, 1, &[], &format!("race {i}")))
            .collect();
        // Pipelined in chunks under the connection's in-flight cap (64), so
        // commits keep landing while the REQ's query runs.
        let chunks: Vec<&[Event]> = events.chunks(50).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            if i == 3 {
                sub.send(json!(["REQ", "race", {"authors": [pubkey_hex(author)], "limit": 5000}]))
                    .await;
            }
            for e in chunk.iter() {
                p.send_event(e).await;
            }
            for _ in 0..chunk.len() {
                assert_eq!(p.expect("OK").await[2], true);
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut eose = false;
        while seen.len() < 300 || !eose {
            let m = sub.recv().await;
            match m[0].as_str() {
                Some("EOSE") => eose = true,
                Some("EVENT") => {
                    let id = m[2]["id"].as_str().unwrap().to_string();
                    assert!(
                        seen.insert(id.clone()),
                        "event {id} delivered twice in round {round}"
                    );
                }
                _ => panic!("{m}"),
            }
        }
        // A barrier: every OK has come, so every live copy is queued on
        // this connection, and the relay sends what is queued before it
        // reads the next REQ: a duplicate would come before its EOSE.
        sub.send(json!(["REQ", "barrier", {"limit": 0}])).await;
        let m = sub.recv().await;
        assert_eq!(m, json!(["EOSE", "barrier"]), "round {round}");
    }
}

#[tokio::test]
async fn events_beyond_the_in_flight_cap_wait_and_are_all_stored() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__MODE", "off"),
        // One in flight: the next EVENT, already in the socket's buffer,
        // waits for its OK even where the store's fsync costs nothing (a
        // tmpfs) and the writer answers within microseconds.
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1"),
    ]);
    let mut c = relay.client().await;
    let events: Vec<Event> = (0..40)
        .map(|i| ev(1, now() - 100 + i, 1, &[], &format!("burst {i}")))
        .collect();
    for e in &events {
        c.send_event(e).await;
    }
    for _ in 0..40 {
        let m = c.expect("OK").await;
        assert_eq!(m[2], true, "{m}");
    }
    // The socket was left unread while one awaited its OK.
    let paused = relay.metric("sluice_socket_reads_paused_total", &[]).await;
    assert!(paused >= 1.0, "paused {paused}");
}

#[tokio::test]
async fn req_with_an_existing_id_replaces_the_subscription() {
    let relay = Relay::start();
    let mut sub = relay.client().await;
    sub.req("s", &[json!({"kinds":[1]})]).await;
    sub.req("s", &[json!({"kinds":[7]})]).await;
    let mut p = relay.client().await;
    assert!(p.publish(&ev(1, now(), 1, &[], "kind 1")).await.0);
    let seven = ev(1, now(), 7, &[], "+");
    assert!(p.publish(&seven).await.0);
    let got = sub.expect("EVENT").await;
    assert_eq!(got[2]["id"], seven.id_hex());
}

#[tokio::test]
async fn close_ends_a_subscription() {
    let relay = Relay::start();
    let mut sub = relay.client().await;
    sub.req("a", &[json!({"kinds":[1]})]).await;
    sub.req("b", &[json!({"kinds":[1]})]).await;
    sub.send(json!(["CLOSE", "a"])).await;
    // The CLOSE is read before the publish below: the session reads its
    // messages in order, and this one answers.
    sub.send(json!(["REQ", "closed", {"kinds": [40000], "limit": 0}]))
        .await;
    assert_eq!(sub.recv().await, json!(["EOSE", "closed"]));
    let mut p = relay.client().await;
    assert!(p.publish(&ev(1, now(), 1, &[], "x")).await.0);
    let got = sub.expect("EVENT").await;
    assert_eq!(got[1], "b");
    // "a" would have had its copy in the same fan-out, queued before the
    // relay reads the barrier.
    sub.send(json!(["REQ", "barrier", {"limit": 0}])).await;
    assert_eq!(sub.recv().await, json!(["EOSE", "barrier"]));
}

#[tokio::test]
async fn subscriptions_are_scoped_to_their_connection() {
    let relay = Relay::start();
    let mut a = relay.client().await;
    let mut b = relay.client().await;
    a.req("same", &[json!({"kinds":[1]})]).await;
    b.req("same", &[json!({"kinds":[7]})]).await;
    b.send(json!(["CLOSE", "same"])).await;
    let mut p = relay.client().await;
    assert!(p.publish(&ev(1, now(), 1, &[], "x")).await.0);
    assert_eq!(a.expect("EVENT").await[1], "same");
}

#[tokio::test]
async fn bad_filter_gets_closed_with_invalid() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    c.send(json!(["REQ", "bad", {"kinds": "one"}])).await;
    let m = c.expect("CLOSED").await;
    assert_eq!(m[1], "bad");
    assert!(m[2].as_str().unwrap().starts_with("invalid:"), "{m}");
    c.send(json!(["REQ", "bad2", {"authors": ["XYZ"]}])).await;
    assert!(
        c.expect("CLOSED").await[2]
            .as_str()
            .unwrap()
            .starts_with("invalid:")
    );
}

#[tokio::test]
async fn too_many_subscriptions_gets_closed() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_SUBSCRIPTIONS", "2")]);
    let mut c = relay.client().await;
    c.req("1", &[json!({"kinds":[1]})]).await;
    c.req("2", &[json!({"kinds":[1]})]).await;
    c.send(json!(["REQ", "3", {"kinds":[1]}])).await;
    let m = c.expect("CLOSED").await;
    assert_eq!(m[1], "3");
    assert!(m[2].as_str().unwrap().starts_with("rate-limited:"), "{m}");
    // Replacing an existing one is still allowed.
    c.req("2", &[json!({"kinds":[7]})]).await;
}

#[tokio::test]
async fn subscription_id_too_long_gets_closed() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let long = "x".repeat(65);
    c.send(json!(["REQ", long, {"kinds":[1]}])).await;
    let m = c.expect("CLOSED").await;
    assert!(m[2].as_str().unwrap().starts_with("invalid:"), "{m}");
    assert!(
        c.req(&"y".repeat(64), &[json!({"kinds":[1]})])
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn too_many_filters_gets_closed() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_FILTERS", "2")]);
    let mut c = relay.client().await;
    c.send(json!(["REQ", "s", {}, {}, {}])).await;
    let m = c.expect("CLOSED").await;
    assert!(m[2].as_str().unwrap().starts_with("invalid:"), "{m}");
}

#[tokio::test]
async fn malformed_json_gets_a_notice_and_the_connection_stays_open() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    c.send_text("this is not json").await;
    assert!(
        c.expect("NOTICE").await[1]
            .as_str()
            .unwrap()
            .starts_with("invalid:")
    );
    c.send_text("{\"an\":\"object\"}").await;
    c.expect("NOTICE").await;
    assert!(c.publish(&ev(1, now(), 1, &[], "still here")).await.0);
}

#[tokio::test]
async fn unknown_message_type_gets_a_notice() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    c.send(json!(["HELLO", 1])).await;
    let m = c.expect("NOTICE").await;
    assert!(m[1].as_str().unwrap().starts_with("unsupported:"), "{m}");
    assert!(c.req("s", &[json!({})]).await.is_empty());
}

// ------------------------------------------------------------------- NIP-09

#[tokio::test]
async fn deletion_removes_the_authors_events_and_blocks_republishing() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let mine = ev(1, now() - 50, 1, &[], "mine");
    let theirs = ev(2, now() - 50, 1, &[], "theirs");
    assert!(c.publish(&mine).await.0);
    assert!(c.publish(&theirs).await.0);
    let del = ev(
        1,
        now() - 10,
        5,
        &[&["e", &mine.id_hex()], &["e", &theirs.id_hex()]],
        "",
    );
    assert!(c.publish(&del).await.0);
    assert!(
        c.req("a", &[json!({"ids":[mine.id_hex()]})])
            .await
            .is_empty()
    );
    assert_eq!(
        c.req("b", &[json!({"ids":[theirs.id_hex()]})]).await.len(),
        1
    );
    assert_eq!(
        c.req_ids("c", &[json!({"kinds":[5]})]).await,
        vec![del.id_hex()]
    );
    let (ok, msg) = c.publish(&mine).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
}

#[tokio::test]
async fn deletion_by_address_removes_versions_up_to_its_time() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let t = now() - 100;
    let art = ev(1, t, 30023, &[&["d", "post"]], "v1");
    assert!(c.publish(&art).await.0);
    let del = ev(
        1,
        t + 10,
        5,
        &[&["a", &format!("30023:{}:post", pubkey_hex(1))]],
        "",
    );
    assert!(c.publish(&del).await.0);
    assert!(c.req("a", &[json!({"kinds":[30023]})]).await.is_empty());
    assert!(
        !c.publish(&ev(1, t + 5, 30023, &[&["d", "post"]], "old"))
            .await
            .0
    );
    let newer = ev(1, t + 20, 30023, &[&["d", "post"]], "v2");
    assert!(c.publish(&newer).await.0);
    assert_eq!(
        c.req_ids("b", &[json!({"kinds":[30023]})]).await,
        vec![newer.id_hex()]
    );
}

#[tokio::test]
async fn deleting_a_deletion_does_nothing() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let note = ev(1, now() - 50, 1, &[], "n");
    let del = ev(1, now() - 40, 5, &[&["e", &note.id_hex()]], "");
    let undel = ev(1, now() - 30, 5, &[&["e", &del.id_hex()]], "");
    for e in [&note, &del, &undel] {
        assert!(c.publish(e).await.0);
    }
    assert_eq!(c.req("a", &[json!({"kinds":[5]})]).await.len(), 2);
    assert!(c.req("b", &[json!({"kinds":[1]})]).await.is_empty());
}

// ------------------------------------------------------------------- NIP-40

#[tokio::test]
async fn already_expired_event_is_refused() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(
        1,
        now() - 50,
        1,
        &[&["expiration", &(now() - 1).to_string()]],
        "gone",
    );
    let (ok, msg) = c.publish(&e).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
}

#[tokio::test]
async fn expired_event_is_never_served_and_is_purged() {
    let relay = Relay::start_with(&[("SLUICE_ENGINE__EXPIRY_PURGE_INTERVAL_MS", "200")]);
    let mut c = relay.client().await;
    let exp = now() + 2;
    let e = ev(
        1,
        now() - 50,
        1,
        &[&["expiration", &exp.to_string()]],
        "soon gone",
    );
    assert!(c.publish(&e).await.0);
    assert_eq!(c.req("a", &[json!({"kinds":[1]})]).await.len(), 1);
    // This test is about time passing: wait until the expiration is past.
    while now() <= exp {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.req("b", &[json!({"kinds":[1]})]).await.is_empty());
    // The background purge removes it from disk: watch the store gauge.
    let mut purged = false;
    for _ in 0..100 {
        let (_, _, body) = http_get(&relay.addr, "/metrics", None).await;
        if body
            .lines()
            .any(|l| l.starts_with("sluice_events_expired_purged_total") && !l.ends_with(" 0"))
        {
            purged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(purged, "expired event was not purged");
}

// ------------------------------------------------------------------- NIP-45

#[tokio::test]
async fn count_returns_the_number_of_matching_events() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    seed_filters(&mut c).await;
    c.send(json!(["COUNT", "c1", {"#t":["nostr"]}, {"kinds":[7]}]))
        .await;
    let m = c.expect("COUNT").await;
    assert_eq!(m[1], "c1");
    assert_eq!(m[2]["count"], 4);
    c.send(json!(["COUNT", "c2", {"kinds":[1]}])).await;
    assert_eq!(c.expect("COUNT").await[2]["count"], 2);
}

#[tokio::test]
async fn a_count_cut_off_at_max_count_rows_says_it_is_approximate() {
    let relay = Relay::start_with(&[
        ("SLUICE_ENGINE__MAX_COUNT_ROWS", "10"),
        (
            "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S",
            "1000",
        ),
    ]);
    let mut c = relay.client().await;
    let t = now();
    for i in 0..25u64 {
        let author = if i < 3 { 1 } else { 2 };
        let e = ev(author, t - 100 + i, 1, &[], &format!("counted {i}"));
        assert!(c.publish(&e).await.0);
    }
    // 25 kind-1 events, 10 index rows read: a lower bound, and it says so.
    c.send(json!(["COUNT", "many", {"kinds": [1]}])).await;
    let m = c.expect("COUNT").await;
    assert_eq!(m[1], "many");
    let n = m[2]["count"].as_u64().unwrap();
    assert!((1..25).contains(&n), "{m}");
    assert_eq!(m[2]["approximate"], true, "{m}");
    // Under the cap: exact, and no `approximate` key.
    c.send(json!(["COUNT", "few", {"authors": [pubkey_hex(1)], "kinds": [1]}]))
        .await;
    let m = c.expect("COUNT").await;
    assert_eq!(m[1], "few");
    assert_eq!(m[2], json!({"count": 3}), "{m}");
}

// ------------------------------------------------------------------- NIP-11

#[tokio::test]
async fn nip11_document_lists_every_limit_with_cors() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_SUBSCRIPTIONS", "7")]);
    let (status, head, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    assert_eq!(status, 200);
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("access-control-allow-origin: *"), "{head}");
    assert!(
        lower.contains("content-type: application/nostr+json"),
        "{head}"
    );
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["software"], "sluice");
    assert!(doc["version"].is_string());
    // NIP-86 management is always served on the relay URL.
    assert_eq!(
        doc["supported_nips"],
        json!([1, 9, 11, 13, 40, 42, 45, 50, 62, 70, 77, 86])
    );
    let lim = &doc["limitation"];
    assert_eq!(lim["max_subscriptions"], 7);
    for key in [
        "max_message_length",
        "max_subscriptions",
        "max_limit",
        "default_limit",
        "max_subid_length",
        "max_event_tags",
        "max_content_length",
        "created_at_upper_limit",
    ] {
        assert!(lim[key].is_u64(), "limitation.{key} missing: {lim}");
    }
    let (status, _, body) = http_get(&relay.addr, "/", None).await;
    assert_eq!(status, 200);
    assert!(body.contains("Nostr relay"));
}

#[tokio::test]
async fn nip11_created_at_lower_limit_is_left_out_unless_one_is_enforced() {
    // No lower limit by default: the field is left out (NIP-11 has no
    // value meaning "none"; 0 would read as "nothing older than now").
    let relay = Relay::start();
    let (_, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lim = &doc["limitation"];
    assert!(lim.get("created_at_lower_limit").is_none(), "{lim}");
    assert_eq!(lim["created_at_upper_limit"], 900, "{lim}");
    let mut c = relay.client().await;
    assert!(c.publish(&ev(1, 1_000_000, 1, &[], "old is fine")).await.0);
    drop(relay);

    let relay = Relay::start_with(&[
        ("SLUICE_LIMITS__CREATED_AT_MAX_AGE_SECS", "3600"),
        ("SLUICE_LIMITS__CREATED_AT_MAX_AHEAD_SECS", "60"),
    ]);
    let (_, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lim = &doc["limitation"];
    assert_eq!(lim["created_at_lower_limit"], 3600, "{lim}");
    assert_eq!(lim["created_at_upper_limit"], 60, "{lim}");
    // The advertised window is the one enforced.
    let mut c = relay.client().await;
    let t = now();
    let (ok, msg) = c.publish(&ev(1, t - 7200, 1, &[], "too old")).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    let (ok, msg) = c.publish(&ev(1, t + 600, 1, &[], "too new")).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    assert!(c.publish(&ev(1, t - 1800, 1, &[], "inside")).await.0);
}

// ------------------------------------------------------- operator endpoints

#[tokio::test]
async fn metrics_health_and_readiness_endpoints_answer() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    assert!(c.publish(&ev(1, now(), 1, &[], "counted")).await.0);
    let (status, _, body) = http_get(&relay.addr, "/metrics", None).await;
    assert_eq!(status, 200);
    for name in [
        "sluice_events_received_total",
        "sluice_connections_open",
        "sluice_build_info",
    ] {
        assert!(body.contains(name), "{name} missing from /metrics");
    }
    assert_eq!(http_get(&relay.addr, "/healthz", None).await.0, 200);
    assert_eq!(http_get(&relay.addr, "/readyz", None).await.0, 200);
    // Every series carries the meaning docs/metrics.md gives it as # HELP.
    assert!(
        body.contains("# HELP sluice_connections_open WebSocket connections open now."),
        "no HELP text in /metrics"
    );
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE sluice_") {
            let name = rest.split(' ').next().unwrap();
            assert!(
                body.contains(&format!("# HELP sluice_{name} ")),
                "sluice_{name} has no HELP line"
            );
        }
    }
}

// ------------------------------------------------------ lifecycle and store

#[tokio::test]
async fn events_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let e = ev(1, now() - 5, 1, &[], "persistent");
    {
        let mut relay = Relay::start_in(&dir, &[]);
        let mut c = relay.client().await;
        assert!(c.publish(&e).await.0);
        assert!(relay.stop().success());
    }
    let relay = Relay::start_in(&dir, &[]);
    let mut c = relay.client().await;
    assert_eq!(
        c.req("s", &[json!({"ids":[e.id_hex()]})]).await,
        vec![e.raw().to_string()]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_exits_zero_and_every_ok_true_event_is_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut relay = Relay::start_in(&dir, &[("SLUICE_THROTTLE__MODE", "off")]);
    let mut c = relay.client().await;
    let events: Vec<Event> = (0..300)
        .map(|i| ev(1, now() - 300 + i, 1, &[], &format!("n{i}")))
        .collect();
    // Pipeline all of them, then stop the relay while OKs are flowing.
    for e in &events {
        c.send_text(&format!("[\"EVENT\",{}]", e.raw())).await;
    }
    let mut accepted = Vec::new();
    while accepted.len() < 50 {
        let m = c.expect("OK").await;
        if m[2] == true {
            accepted.push(m[1].as_str().unwrap().to_string());
        }
    }
    let status = tokio::task::block_in_place(|| relay.stop());
    assert!(status.success(), "exit status {status:?}");
    while let Some(m) = c.try_recv(Duration::from_secs(2)).await {
        if m[0] == "OK" && m[2] == true {
            accepted.push(m[1].as_str().unwrap().to_string());
        }
    }
    let relay = Relay::start_in(&dir, &[]);
    let mut c = relay.client().await;
    let stored: std::collections::HashSet<String> = c
        .req_ids("s", &[json!({"kinds":[1],"limit":5000})])
        .await
        .into_iter()
        .collect();
    for id in &accepted {
        assert!(
            stored.contains(id),
            "event {id} got OK true but is not on disk"
        );
    }
}

#[tokio::test]
async fn full_store_answers_error_and_stays_readable() {
    // Throttling off: one author publishing ~30 events back to back passes
    // its bucket's 20-event allowance only because commits are slow here.
    let relay = Relay::start_with(&[
        ("SLUICE_STORE__MAP_SIZE_MB", "1"),
        ("SLUICE_THROTTLE__MODE", "off"),
    ]);
    let mut c = relay.client().await;
    let big = "z".repeat(30_000);
    let mut refused = None;
    for i in 0..200 {
        let (ok, msg) = c
            .publish(&ev(1, now() - 1000 + i, 1, &[], &format!("{i}{big}")))
            .await;
        if !ok {
            refused = Some(msg);
            break;
        }
    }
    let msg = refused.expect("a 1 MB store never filled");
    assert!(msg.starts_with("error:"), "{msg}");
    assert!(
        !c.req("s", &[json!({"kinds":[1],"limit":1})])
            .await
            .is_empty()
    );
    // The log reaches the test through a reader thread: wait for the line.
    eventually("the full store is logged", || async {
        relay.log_text().contains("STORE IS FULL")
    })
    .await;
}

// --------------------------------------------------------- real traffic

#[tokio::test]
async fn real_events_are_stored_except_the_expired_and_served_back_identical() {
    // One client publishing 1,830 events back to back: per-client limits off.
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__MODE", "off")]);
    let mut c = relay.client().await;
    let lines: Vec<&str> = include_str!("fixtures/real-events.jsonl").lines().collect();
    assert_eq!(lines.len(), 1830);
    let mut refused = 0;
    // The newest version of each replaceable/addressable slot.
    let mut slots: HashMap<String, String> = HashMap::new();
    let mut stored = Vec::new();
    for l in &lines {
        let e = Event::parse(l).unwrap();
        let (ok, msg) = c.publish(&e).await;
        if !ok {
            assert!(
                msg.starts_with("invalid:") && msg.contains("expired"),
                "{msg}"
            );
            refused += 1;
            continue;
        }
        let pk = sluice_proto::hex32::encode(&e.pubkey);
        match KindClass::of(e.kind) {
            KindClass::Replaceable => slots.insert(format!("{}:{pk}", e.kind), e.id_hex()),
            KindClass::Addressable => {
                slots.insert(format!("{}:{pk}:{}", e.kind, e.d_tag()), e.id_hex())
            }
            _ => None,
        };
        stored.push(e);
    }
    assert_eq!(refused, 24);
    let current: std::collections::HashSet<String> = slots.into_values().collect();
    let mut served = 0;
    for (i, chunk) in stored.chunks(500).enumerate() {
        let ids: Vec<String> = chunk.iter().map(|e| e.id_hex()).collect();
        let raws = c
            .req(&format!("q{i}"), &[json!({"ids": ids, "limit": 500})])
            .await;
        let by_id: HashMap<String, String> = raws
            .into_iter()
            .map(|r| (Event::parse(&r).unwrap().id_hex(), r))
            .collect();
        for e in chunk {
            let slotted = matches!(
                KindClass::of(e.kind),
                KindClass::Replaceable | KindClass::Addressable
            );
            match by_id.get(&e.id_hex()) {
                Some(raw) => {
                    assert_eq!(raw, e.raw(), "event {} not byte-identical", e.id_hex());
                    assert!(
                        !slotted || current.contains(&e.id_hex()),
                        "replaced version {} served",
                        e.id_hex()
                    );
                    served += 1;
                }
                None => assert!(
                    slotted && !current.contains(&e.id_hex()),
                    "event {} stored but not served",
                    e.id_hex()
                ),
            }
        }
    }
    // Only the 7 replaced versions of the fixture's replaceable slots are gone.
    assert_eq!(served, 1806 - 7);
}

// ------------------------------------------------------------------ config

#[test]
fn unknown_config_key_stops_start_up_naming_the_key() {
    let out = std::process::Command::new(BIN)
        .arg("serve")
        .env_clear()
        .env("SLUICE_SERVER__LISTN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.listn"), "{err}");
}

#[test]
fn invalid_config_value_stops_start_up_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("sluice.toml");
    std::fs::write(&file, "[limits]\nmax_limit = \"lots\"\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&file)
        .env_clear()
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limits.max_limit"), "{err}");
}

#[test]
fn config_check_prints_the_effective_config_from_file_and_env() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("sluice.toml");
    std::fs::write(
        &file,
        "[server]\nlisten = \"0.0.0.0:8080\"\n[limits]\nmax_limit = 600\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["config", "check", "--config"])
        .arg(&file)
        .env_clear()
        .env("SLUICE_LIMITS__MAX_LIMIT", "700")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("listen = \"0.0.0.0:8080\""), "{text}");
    assert!(text.contains("max_limit = 700"), "{text}");
}

#[test]
fn shipped_config_file_lists_every_key_with_its_default() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/sluice.toml");
    let out = std::process::Command::new(BIN)
        .args(["config", "check", "--config", shipped])
        .env_clear()
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let defaults = std::process::Command::new(BIN)
        .args(["config", "check"])
        .env_clear()
        .output()
        .unwrap();
    // The shipped file sets every key to its default...
    assert_eq!(out.stdout, defaults.stdout);
    // ...and names every key.
    let file = std::fs::read_to_string(shipped).unwrap();
    let mut section = String::new();
    for line in String::from_utf8_lossy(&defaults.stdout).lines() {
        if let Some(s) = line.strip_prefix('[') {
            section = s.trim_end_matches(']').to_string();
        } else if let Some((key, _)) = line.split_once(" = ") {
            let needle = format!("\n{key} = ");
            let in_section = file
                .split(&format!("[{section}]"))
                .nth(1)
                .map(|rest| rest.split("\n[").next().unwrap_or(""))
                .unwrap_or("");
            assert!(
                in_section.contains(&needle),
                "config/sluice.toml lacks {section}.{key}"
            );
        }
    }
}

#[tokio::test]
async fn shutdown_in_the_middle_of_an_answer_sends_whole_messages_then_a_1001_close() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    // An answer of some 4 MB: many chunks, each written through the cork.
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let notes: Vec<Event> = (0..2000)
        .map(|i| {
            ev(
                1 + (i % 20) as u8,
                now() - 10_000 + i,
                1,
                &[],
                &"x".repeat(2000),
            )
        })
        .collect();
    import_events(&store, &notes);
    let mut relay = Relay::start_in(&store, &[]);
    let (mut ws, _) = tokio_tungstenite::connect_async(relay.url()).await.unwrap();
    ws.send(Message::Text(
        json!(["REQ", "all", {"kinds": [1], "limit": 2000}])
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let (mut events, mut terminated) = (0, false);
    let close = loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("the relay neither answered nor closed")
            .expect("the connection ended without a close frame")
            .expect("a WebSocket error instead of a close frame");
        match msg {
            Message::Text(t) => {
                // Every message whole: a frame cut by the shutdown would not parse.
                let v: serde_json::Value = serde_json::from_str(&t).expect("a whole JSON message");
                if v[0] == "EVENT" {
                    events += 1;
                    if events == 1 {
                        relay.signal("TERM");
                        terminated = true;
                    }
                }
            }
            Message::Close(frame) => break frame,
            _ => {}
        }
    };
    assert!(terminated);
    let close = close.expect("a close frame with a code");
    assert_eq!(close.code, CloseCode::Away, "{close:?}");
    assert!((1..=2000).contains(&events));
    assert!(relay.wait_stopped().success());
}

/// The environment the relay process runs with, from /proc.
fn environ_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap()
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

/// `sluice serve` runs with glibc's thread caches off and a fixed trim
/// threshold (docs/operating.md, "The allocator"), the same process (pid) still serving; an operator's own
/// `GLIBC_TUNABLES`, even empty, is kept as it is.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test]
async fn serve_runs_without_glibcs_thread_caches_unless_the_operator_says() {
    let relay = Relay::start();
    // glibc, parsing the variable at start, ends each tunable with a NUL
    // in place: read as one string, either separator.
    let raw = std::fs::read(format!("/proc/{}/environ", relay.pid())).unwrap();
    let raw = String::from_utf8_lossy(&raw).replace('\0', "\n");
    let want = "GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=131072";
    assert!(
        raw.contains(want) || raw.contains(&want.replace(':', "\n")),
        "{raw:?}"
    );
    let mut c = relay.client().await;
    assert!(c.publish(&ev(1, now(), 1, &[], "after the exec")).await.0);
    drop(c);
    for own in ["glibc.malloc.arena_max=4", ""] {
        let relay = Relay::start_with(&[("GLIBC_TUNABLES", own)]);
        let env = environ_of(relay.pid());
        let set: Vec<&String> = env
            .iter()
            .filter(|v| v.starts_with("GLIBC_TUNABLES="))
            .collect();
        assert_eq!(set, [&format!("GLIBC_TUNABLES={own}")]);
    }
}
