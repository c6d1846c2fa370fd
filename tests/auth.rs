//! Black-box tests of NIP-42 authentication and what depends on it: the
//! challenge, AUTH events checked field by field, NIP-70 protected events,
//! and private messages (kinds 4, 1059, 1060) served only to their
//! authenticated parties, stored and live, REQ and COUNT.

use crate::support;

use serde_json::{Value, json};
use support::*;

/// A kind-22242 event of key `n` for `challenge` and `relay`.
fn auth_event(n: u8, created_at: u64, challenge: &str, relay: &str) -> sluice_proto::Event {
    ev(
        n,
        created_at,
        22242,
        &[&["relay", relay], &["challenge", challenge]],
        "",
    )
}

/// Authenticates `c` as key `n`; the OK must be true.
async fn authenticate(relay: &Relay, c: &mut Client, n: u8) {
    let challenge = c.challenge().await;
    let e = auth_event(n, now(), &challenge, &relay.url());
    c.send_text(&format!("[\"AUTH\",{}]", e.raw())).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(ok, "AUTH refused: {msg}");
}

async fn auth_answer(c: &mut Client, e: &sluice_proto::Event) -> (bool, String) {
    c.send_text(&format!("[\"AUTH\",{}]", e.raw())).await;
    c.expect_ok(&e.id_hex()).await
}

#[tokio::test]
async fn a_challenge_at_connect_and_each_fault_of_an_auth_event_is_refused() {
    let relay = Relay::start();
    let info = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: Value = serde_json::from_str(&info.2).unwrap();
    let nips: Vec<u64> = doc["supported_nips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(nips.contains(&42) && nips.contains(&70), "{nips:?}");

    let mut c = relay.client().await;
    let challenge = c.challenge().await;
    assert_eq!(challenge.len(), 32, "{challenge}");
    let other = relay.client().await.challenge().await;
    assert_ne!(challenge, other, "each connection has its own challenge");

    let url = relay.url();
    let t = now();
    for (e, why) in [
        (auth_event(1, t, "nope", &url), "challenge"),
        (
            auth_event(1, t, &challenge, "wss://elsewhere.example.com"),
            "relay",
        ),
        (auth_event(1, t - 3600, &challenge, &url), "created_at"),
        (
            ev(1, t, 1, &[&["relay", &url], &["challenge", &challenge]], ""),
            "kind",
        ),
    ] {
        let (ok, msg) = auth_answer(&mut c, &e).await;
        assert!(!ok && msg.starts_with("invalid:"), "{why}: {msg}");
    }
    // A bad signature: a valid event's signature on another content.
    let good = auth_event(1, t, &challenge, &url);
    let forged = good.raw().replace(
        &format!("\"created_at\":{t}"),
        &format!("\"created_at\":{}", t + 1),
    );
    c.send_text(&format!("[\"AUTH\",{forged}]")).await;
    let m = c.expect("OK").await;
    assert_eq!(m[2], false, "{m}");
    assert!(m[3].as_str().unwrap().starts_with("invalid:"), "{m}");

    assert_eq!(
        relay
            .metric_or_zero("sluice_connections_authenticated", &[])
            .await,
        0.0
    );
    let (ok, msg) = auth_answer(&mut c, &good).await;
    assert!(ok, "{msg}");
    // Several pubkeys on one connection.
    let (ok, msg) = auth_answer(&mut c, &auth_event(2, t, &challenge, &url)).await;
    assert!(ok, "{msg}");
    assert_eq!(
        relay.metric("sluice_connections_authenticated", &[]).await,
        1.0
    );
    assert!(
        relay
            .metric("sluice_auth_total", &["result=\"invalid\""])
            .await
            >= 5.0
    );
    c.close().await;
    wait_for_metric(&relay, "sluice_connections_authenticated", 0.0).await;
}

#[tokio::test]
async fn a_protected_event_is_taken_only_from_its_authenticated_author() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let _ = c.challenge().await;
    let protected = ev(1, now(), 1, &[&["-"]], "only mine");
    let (ok, msg) = c.publish(&protected).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");
    authenticate(&relay, &mut c, 2).await;
    let (ok, msg) = c.publish(&protected).await;
    assert!(!ok && msg.starts_with("restricted:"), "{msg}");
    authenticate(&relay, &mut c, 1).await;
    let (ok, msg) = c.publish(&protected).await;
    assert!(ok, "{msg}");
    let ids = c
        .req_ids("p", &[json!({"ids": [protected.id_hex()]})])
        .await;
    assert_eq!(ids, vec![protected.id_hex()]);
}

#[tokio::test]
async fn without_a_challenge_at_connect_it_comes_with_the_first_auth_required() {
    let relay = Relay::start_with(&[("SLUICE_AUTH__CHALLENGE_ON_CONNECT", "false")]);
    let mut c = relay.client().await;
    c.send(json!(["REQ", "dm", {"kinds": [4]}])).await;
    let closed = c.expect("CLOSED").await;
    assert!(
        closed[2].as_str().unwrap().starts_with("auth-required:"),
        "{closed}"
    );
    assert!(c.has_challenge(), "the challenge came before the CLOSED");
    authenticate(&relay, &mut c, 3).await;
    assert!(c.req_ids("dm", &[json!({"kinds": [4]})]).await.is_empty());
}

#[tokio::test]
async fn private_messages_reach_only_their_authenticated_parties() {
    let relay = Relay::start();
    let t = now();
    let (alice, bob, carol) = (1u8, 2u8, 3u8);
    let dm = ev(alice, t, 4, &[&["p", &pubkey_hex(bob)]], "hi bob");
    let wrap = ev(alice, t + 1, 1059, &[&["p", &pubkey_hex(bob)]], "sealed");
    let note = ev(alice, t + 2, 1, &[&["p", &pubkey_hex(bob)]], "public");
    let mut w = relay.client().await;
    for e in [&dm, &wrap, &note] {
        assert!(w.publish(e).await.0);
    }
    let by_alice = json!({"authors": [pubkey_hex(alice)]});
    let to_bob = json!({"#p": [pubkey_hex(bob)]});

    // Nobody authenticated: only the public note, and an explicit DM query
    // is told to authenticate.
    let mut anon = relay.client().await;
    assert_eq!(
        anon.req_ids("a", std::slice::from_ref(&by_alice)).await,
        vec![note.id_hex()]
    );
    assert_eq!(
        anon.req_ids("b", std::slice::from_ref(&to_bob)).await,
        vec![note.id_hex()]
    );
    anon.send(json!(["REQ", "c", {"kinds": [4, 1059]}])).await;
    let closed = anon.expect("CLOSED").await;
    assert!(
        closed[2].as_str().unwrap().starts_with("auth-required:"),
        "{closed}"
    );
    anon.send(json!(["COUNT", "n", to_bob.clone()])).await;
    assert_eq!(anon.expect("COUNT").await[2]["count"], 1);

    // The recipient and the author see all three; a stranger only the note.
    for (who, sees_all) in [(bob, true), (alice, true), (carol, false)] {
        let mut c = relay.client().await;
        authenticate(&relay, &mut c, who).await;
        let ids = c.req_ids("x", std::slice::from_ref(&to_bob)).await;
        let want = if sees_all {
            vec![note.id_hex(), wrap.id_hex(), dm.id_hex()]
        } else {
            vec![note.id_hex()]
        };
        assert_eq!(ids, want, "reader {who}");
        c.send(json!(["COUNT", "n", to_bob.clone()])).await;
        let n = if sees_all { 3 } else { 1 };
        assert_eq!(c.expect("COUNT").await[2]["count"], n, "reader {who}");
    }

    // Live: the same rule.
    let mut bob_live = relay.client().await;
    authenticate(&relay, &mut bob_live, bob).await;
    bob_live.req("live", std::slice::from_ref(&to_bob)).await;
    let mut anon_live = relay.client().await;
    anon_live.req("live", std::slice::from_ref(&to_bob)).await;
    let dm2 = ev(alice, t + 3, 4, &[&["p", &pubkey_hex(bob)]], "again");
    let note2 = ev(alice, t + 4, 1, &[&["p", &pubkey_hex(bob)]], "public again");
    assert!(w.publish(&dm2).await.0);
    assert!(w.publish(&note2).await.0);
    let first = bob_live.expect("EVENT").await;
    assert_eq!(first[2]["id"], dm2.id_hex().as_str());
    // The anonymous subscriber's first live event is the public one: the
    // DM, published before it, never reached it.
    let first = anon_live.expect("EVENT").await;
    assert_eq!(first[2]["id"], note2.id_hex().as_str());
}

/// Sends `events` at once; how many got OK true (OKs come in any order:
/// a refusal is answered before an earlier EVENT's commit).
async fn accepted(c: &mut Client, events: Vec<sluice_proto::Event>) -> usize {
    for e in &events {
        c.send_event(e).await;
    }
    let mut waiting: std::collections::HashSet<String> =
        events.iter().map(|e| e.id_hex()).collect();
    let mut ok = 0;
    while !waiting.is_empty() {
        let m = c.expect("OK").await;
        if waiting.remove(m[1].as_str().unwrap()) && m[2] == true {
            ok += 1;
        }
    }
    ok
}

async fn wait_for_metric(relay: &Relay, name: &str, want: f64) {
    for _ in 0..200 {
        if relay.metric(name, &[]).await == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{name} never became {want}");
}

#[tokio::test]
async fn a_listed_pubkey_is_limited_by_its_tier_not_by_its_address() {
    // The address's bucket holds about one EVENT; the "trusted" tier's
    // pubkey bucket a hundred times that. Twenty EVENTs at once: the
    // anonymous connection is refused some, the trusted one none, from the
    // same address, at any machine speed.
    let toml = format!(
        r#"
[throttle.clients.events_per_ip]
rate_per_s = 0.5
burst_ratio = 1.0
window_ms = 1000
catch_up_ms = 0

# An unlisted pubkey's own bucket is as wide as the trusted tier's: only
# its address's bucket can refuse it.
[throttle.tiers.authenticated]
rate_multiplier = 200.0

[[throttle.tiers.listed]]
name = "trusted"
weight = 4
rate_multiplier = 200.0
pubkeys = ["{}"]
"#,
        pubkey_hex(7)
    );
    let relay = Relay::start_with_toml(&toml, &[]);
    let batch = |from: u8| -> Vec<sluice_proto::Event> {
        (0..20)
            .map(|i| ev(from + i, now(), 1, &[], &format!("note {i}")))
            .collect()
    };
    let mut anon = relay.client().await;
    let anon_ok = accepted(&mut anon, batch(10)).await;
    assert!(
        anon_ok < 20,
        "the address's bucket refused some ({anon_ok}/20)"
    );

    let mut trusted = relay.client().await;
    authenticate(&relay, &mut trusted, 7).await;
    assert_eq!(accepted(&mut trusted, batch(40)).await, 20);
    assert_eq!(
        relay
            .metric("sluice_auth_tier_total", &["tier=\"trusted\""])
            .await,
        1.0
    );
    // An unlisted pubkey is still charged to its address, which the
    // anonymous batch spent (its own bucket would take all twenty).
    let mut unlisted = relay.client().await;
    authenticate(&relay, &mut unlisted, 8).await;
    let unlisted_ok = accepted(&mut unlisted, batch(70)).await;
    assert!(
        unlisted_ok < 20,
        "an unlisted key gets no more than its address ({unlisted_ok}/20)"
    );
}

#[tokio::test]
async fn a_full_reader_reads_every_private_message_and_others_do_not() {
    // Key 9 is a full reader (a backup, a cluster's repair key); key 8 is not.
    let full = pubkey_hex(9);
    let relay = Relay::start_with(&[
        ("SLUICE_AUTH__FULL_READERS", &format!("[\"{full}\"]")),
        ("SLUICE_THROTTLE__MODE", "off"),
    ]);
    let dm = ev(1, now(), 4, &[&["p", &pubkey_hex(2)]], "between 1 and 2");
    let mut author = relay.client().await;
    authenticate(&relay, &mut author, 1).await;
    assert!(author.publish(&dm).await.0);
    let filter = json!({"kinds": [4]});
    let mut stranger = relay.client().await;
    authenticate(&relay, &mut stranger, 8).await;
    stranger.send(json!(["REQ", "s", filter.clone()])).await;
    let m = stranger.recv().await;
    assert!(m[0] == "EOSE" || m[0] == "CLOSED", "a stranger got {m}");
    let mut reader = relay.client().await;
    authenticate(&relay, &mut reader, 9).await;
    let got = reader.req_ids("r", &[filter]).await;
    assert_eq!(got, vec![dm.id_hex()]);
}
