//! Chaos: publishers on several connections while the relay is killed with
//! SIGKILL at moments chosen by a seeded generator, three times over the
//! same store. After each kill the store must open, and every event that
//! got OK true before the kill must be there (OK true means durable).
//! Events that got no OK may or may not be stored; nothing else is asked.

use crate::support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::*;

/// Events published by one connection until its socket dies; the ids
/// acknowledged with OK true go into `acked`.
async fn publish_until_killed(
    url: String,
    actor: u8,
    round: u64,
    acked: Arc<Mutex<HashSet<String>>>,
) {
    let mut c = Client::connect(&url).await;
    let t = now();
    for i in 0..100_000u64 {
        let e = ev(actor, t - 100_000 + i, 1, &[], &format!("r{round} n{i}"));
        c.send_event(&e).await;
        // Wait for this event's answer (one in flight): a dead relay ends
        // the connection, and the loop with it.
        loop {
            let Some(m) = c.try_recv(Duration::from_secs(10)).await else {
                return;
            };
            if m[0] == "OK" && m[1] == e.id_hex().as_str() {
                if m[2] == true {
                    acked.lock().unwrap().insert(e.id_hex());
                }
                break;
            }
        }
    }
}

#[tokio::test]
async fn every_acknowledged_event_survives_three_sigkills() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let env = [("SLUICE_THROTTLE__MODE", "off")];
    let acked = Arc::new(Mutex::new(HashSet::new()));
    // A fixed seed: the moments differ per round, and a failure reproduces.
    let mut seed: u64 = 0x5eed_c4a0_5000_0001;
    for round in 0..3u64 {
        let relay = Relay::start_in(&dir, &env);
        let publishers: Vec<_> = (0..3u8)
            .map(|actor| {
                tokio::spawn(publish_until_killed(
                    relay.url(),
                    20 + actor,
                    round,
                    acked.clone(),
                ))
            })
            .collect();
        // Let some events through, then kill at a moment 50-550 ms later.
        while acked.lock().unwrap().len() < (round as usize + 1) * 30 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(50 + seed % 500)).await;
        relay.signal("KILL");
        for p in publishers {
            p.await.unwrap();
        }
        drop(relay);
    }
    // The store opens, and holds every acknowledged event.
    let relay = Relay::start_in(&dir, &env);
    let mut c = relay.client().await;
    let mut stored = HashSet::new();
    for actor in 20..23u8 {
        let ids = c
            .req_ids(
                "all",
                &[json!({"authors": [pubkey_hex(actor)], "limit": 5000})],
            )
            .await;
        stored.extend(ids);
    }
    let acked = acked.lock().unwrap();
    assert!(
        acked.len() >= 90,
        "only {} events acknowledged",
        acked.len()
    );
    let lost: Vec<_> = acked.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
}
