//! Black-box tests of NIP-77 negentropy on the relay: a client reconciles
//! its set against the relay's and learns exactly the difference, both
//! ways; bad NEG messages get NEG-ERR and the connection stays usable; a
//! session's guard is given back when the client vanishes.

use crate::support;

use negentropy::{Negentropy, NegentropyStorageVector};
use serde_json::json;
use support::*;

#[tokio::test]
async fn a_client_learns_exactly_the_difference() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__MODE", "off"),
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1000"),
    ]);
    let t = now() - 10_000;
    let shared: Vec<_> = (0..300u64)
        .map(|i| ev(1 + (i % 5) as u8, t + i, 1, &[], &format!("shared {i}")))
        .collect();
    let relay_only: Vec<_> = (0..7u64)
        .map(|i| ev(6, t + 500 + i, 1, &[], &format!("relay {i}")))
        .collect();
    let client_only: Vec<_> = (0..5u64)
        .map(|i| ev(7, t + 600 + i, 1, &[], &format!("client {i}")))
        .collect();
    let mut w = relay.client().await;
    for e in shared.iter().chain(&relay_only) {
        w.send_event(e).await;
    }
    let mut waiting: std::collections::HashSet<String> = shared
        .iter()
        .chain(&relay_only)
        .map(|e| e.id_hex())
        .collect();
    while !waiting.is_empty() {
        let m = w.expect("OK").await;
        assert_eq!(m[2], true, "{m}");
        waiting.remove(m[1].as_str().unwrap());
    }
    let mine: Vec<_> = shared.iter().chain(&client_only).cloned().collect();
    let mut c = relay.client().await;
    let (have, need, _) = reconcile(&mut c, json!({"kinds": [1]}), &mine).await;
    let mut want_have: Vec<String> = client_only.iter().map(|e| e.id_hex()).collect();
    let mut want_need: Vec<String> = relay_only.iter().map(|e| e.id_hex()).collect();
    want_have.sort();
    want_need.sort();
    assert_eq!(have, want_have);
    assert_eq!(need, want_need);
    // The filter applies: over one author, the client lacks nothing.
    let of_six = json!({"authors": [pubkey_hex(6)]});
    let mine: Vec<_> = relay_only.to_vec();
    let (have, need, _) = reconcile(&mut c, of_six, &mine).await;
    assert!(have.is_empty() && need.is_empty());
    assert!(relay.metric("sluice_negentropy_items_total", &[]).await >= 307.0);
}

#[tokio::test]
async fn bad_neg_messages_get_neg_err_and_sessions_are_given_back() {
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_NEGENTROPY_ITEMS", "3")]);
    let mut w = relay.client().await;
    for i in 0..5 {
        assert!(w.publish(&ev(1, now(), 1, &[], &format!("n{i}"))).await.0);
    }
    let mut c = relay.client().await;
    for (msg, why) in [
        (json!(["NEG-MSG", "x", "00"]), "closed:"),
        (json!(["NEG-OPEN", "x", {}, "zz"]), "invalid:"),
        (json!(["NEG-OPEN", "x", {"kinds": "one"}, "61"]), "invalid:"),
        (json!(["NEG-OPEN", "x", {}]), "invalid:"),
        (json!(["NEG-OPEN", "x", {}, "6100"]), "blocked:"),
    ] {
        c.send(msg.clone()).await;
        let m = c.expect("NEG-ERR").await;
        assert_eq!(m[1], "x", "{msg}: {m}");
        assert!(m[2].as_str().unwrap().starts_with(why), "{msg}: {m}");
    }
    // A garbage first message over a small set: NEG-ERR, not a panic.
    c.send(json!(["NEG-OPEN", "y", {"limit": 1, "authors": [pubkey_hex(2)]}, "ff00ff"]))
        .await;
    let m = c.expect("NEG-ERR").await;
    assert_eq!(m[1], "y", "{m}");
    // The connection still works.
    assert_eq!(c.req_ids("r", &[json!({"limit": 1})]).await.len(), 1);
    // A session left open by a client that vanishes is given back.
    let mut storage = NegentropyStorageVector::new();
    storage.seal().unwrap();
    let mut neg = Negentropy::owned(storage, 0).unwrap();
    let first = hex::encode(neg.initiate().unwrap());
    c.send(json!(["NEG-OPEN", "z", {"authors": [pubkey_hex(3)]}, first]))
        .await;
    assert_eq!(c.expect("NEG-MSG").await[1], "z");
    assert_eq!(
        relay.metric("sluice_negentropy_sessions_open", &[]).await,
        1.0
    );
    drop(c);
    for _ in 0..200 {
        if relay.metric("sluice_negentropy_sessions_open", &[]).await == 0.0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the negentropy session was not given back");
}

/// Every stored event id of a relay, sorted.
async fn all_ids(relay: &Relay) -> Vec<String> {
    let mut c = relay.client().await;
    let mut ids = c.req_ids("all", &[json!({"limit": 5000})]).await;
    ids.sort();
    ids
}

#[tokio::test]
async fn sluice_sync_both_ways_makes_two_stores_the_same() {
    let t = now() - 10_000;
    let shared: Vec<_> = (0..40u64)
        .map(|i| ev(1 + (i % 4) as u8, t + i, 1, &[], &format!("shared {i}")))
        .collect();
    let only_remote: Vec<_> = (0..6u64)
        .map(|i| ev(6, t + 100 + i, 1, &[], &format!("remote {i}")))
        .collect();
    let only_local: Vec<_> = (0..4u64)
        .map(|i| ev(7, t + 200 + i, 1, &[], &format!("local {i}")))
        .collect();
    // A replaceable event: the remote has the newer version.
    let old_profile = ev(8, t + 300, 0, &[], "{\"name\":\"old\"}");
    let new_profile = ev(8, t + 301, 0, &[], "{\"name\":\"new\"}");
    // A note the local store has and the remote deleted.
    let doomed = ev(9, t + 400, 1, &[], "doomed");
    let deletion = ev(9, t + 401, 5, &[&["e", &doomed.id_hex()]], "");

    let remote = Relay::start_with(&[
        ("SLUICE_THROTTLE__MODE", "off"),
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1000"),
    ]);
    let mut w = remote.client().await;
    for e in shared
        .iter()
        .chain(&only_remote)
        .chain([&new_profile, &doomed, &deletion])
    {
        let (ok, msg) = w.publish(e).await;
        assert!(ok, "{msg}");
    }
    let dir = tempfile::tempdir().unwrap();
    let local_store = dir.path().join("store");
    let local_events: Vec<_> = shared
        .iter()
        .chain(&only_local)
        .chain([&old_profile, &doomed])
        .cloned()
        .collect();
    import_events(&local_store, &local_events);

    let out = sluice_on(&local_store)
        .args(["sync", &remote.url(), "--direction", "both"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Only the difference moved: the remote's 6 notes, the new profile and
    // the deletion down; the local 4 notes up.
    assert!(stderr.contains("8 only on the remote"), "{stderr}");
    assert!(stderr.contains("uploaded 4"), "{stderr}");

    let local = Relay::start_in(&local_store, &[]);
    let (a, b) = (all_ids(&remote).await, all_ids(&local).await);
    assert_eq!(a, b, "the two stores hold the same events");
    assert!(a.contains(&new_profile.id_hex()) && !a.contains(&old_profile.id_hex()));
    assert!(!a.contains(&doomed.id_hex()) && a.contains(&deletion.id_hex()));
    assert_eq!(a.len(), 40 + 6 + 4 + 1 + 1);
}
