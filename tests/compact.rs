//! `sluice compact OUT`: a compacted copy of a live store, taken while the
//! relay serves, opened by a second relay.

use crate::support;

use std::collections::HashSet;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use support::*;

/// Runs `sluice compact OUT` on the store in `store` (the relay's options).
fn compact(store: &Path, out: &Path) -> Output {
    sluice_on(store)
        .arg("compact")
        .arg(out)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// Publishing as fast as the tests do is not what they are about.
const NO_EVENT_LIMITS: &[(&str, &str)] = &[
    (
        "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S",
        "10000",
    ),
    (
        "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S",
        "10000",
    ),
];

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Ids of every event the relay serves.
async fn served_ids(c: &mut Client) -> HashSet<String> {
    c.req_ids("all", &[json!({"limit": 5000})])
        .await
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_taken_while_serving_holds_every_event_acknowledged_before_it() {
    let relay = Relay::start_with(NO_EVENT_LIMITS);
    let mut c = relay.client().await;
    let t = now();
    let mut acked: Vec<String> = Vec::new();
    for i in 0..100u64 {
        let e = ev(1, t - 1000 + i, 1, &[], &format!("before {i}"));
        let (ok, msg) = c.publish(&e).await;
        assert!(ok, "{msg}");
        acked.push(e.id_hex());
    }

    // One client publishes without pause, before, during and after the copy.
    let stop = Arc::new(AtomicBool::new(false));
    let writer_acks = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut w = relay.client().await;
    let writer = tokio::spawn({
        let (stop, acks) = (stop.clone(), writer_acks.clone());
        async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 1500 {
                let e = ev(
                    2 + (i % 8) as u8,
                    t - 500 + i % 400,
                    1,
                    &[],
                    &format!("w {i}"),
                );
                if w.publish(&e).await.0 {
                    acks.lock().unwrap().push(e.id_hex());
                }
                i += 1;
            }
        }
    });
    while writer_acks.lock().unwrap().len() < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

    let out = tempfile::tempdir().unwrap();
    let copy_dir = out.path().join("copy");
    // Everything acknowledged so far was committed before the copy began.
    let snapshot = writer_acks.lock().unwrap().clone();
    let writer_before = snapshot.len();
    acked.extend(snapshot);
    let run = tokio::task::spawn_blocking({
        let (store, dir) = (relay.dir.clone(), copy_dir.clone());
        move || compact(&store, &dir)
    })
    .await
    .unwrap();
    let during = writer_acks.lock().unwrap().len();
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    eprintln!(
        "{} events acknowledged before the copy; the writer's: {writer_before} then, \
         {during} when the copy ended",
        acked.len()
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "compact failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("source ") && stdout.contains("copy "),
        "{stdout}"
    );

    // The relay went on serving meanwhile.
    assert!(c.publish(&ev(1, t, 1, &[], "after the copy")).await.0);

    // A second relay on the copy serves every event acknowledged before it,
    // and only events the first one acknowledged.
    let copy = Relay::start_in(&copy_dir, &[]);
    let mut r = copy.client().await;
    let served = served_ids(&mut r).await;
    for id in &acked {
        assert!(served.contains(id), "{id} was acknowledged but is missing");
    }
    let all_acked: HashSet<String> = acked
        .iter()
        .chain(writer_acks.lock().unwrap().iter())
        .cloned()
        .collect();
    assert!(
        served.is_subset(&all_acked),
        "the copy serves an unknown event"
    );
}

#[tokio::test]
async fn a_copy_leaves_out_the_space_deletions_freed_and_never_overwrites() {
    let relay = Relay::start_with(NO_EVENT_LIMITS);
    let mut c = relay.client().await;
    let t = now();
    let events: Vec<_> = (0..300u64)
        .map(|i| {
            ev(
                1,
                t - 1000 + i,
                1,
                &[],
                &format!("{i} {}", "x".repeat(2000)),
            )
        })
        .collect();
    for e in &events {
        let (ok, msg) = c.publish(e).await;
        assert!(ok, "{msg}");
    }
    // NIP-09: the author deletes 280 of them.
    for chunk in events[..280].chunks(70) {
        let tags: Vec<Vec<String>> = chunk
            .iter()
            .map(|e| vec!["e".to_string(), e.id_hex()])
            .collect();
        let refs: Vec<Vec<&str>> = tags
            .iter()
            .map(|t| t.iter().map(String::as_str).collect())
            .collect();
        let refs: Vec<&[&str]> = refs.iter().map(Vec::as_slice).collect();
        let del = ev(1, t, 5, &refs, "");
        let (ok, msg) = c.publish(&del).await;
        assert!(ok, "{msg}");
    }
    let kept: HashSet<String> = events[280..].iter().map(|e| e.id_hex()).collect();
    let served: HashSet<String> = c
        .req_ids("kept", &[json!({"kinds": [1], "limit": 5000})])
        .await
        .into_iter()
        .collect();
    assert_eq!(served, kept);

    let out = tempfile::tempdir().unwrap();
    let run = compact(&relay.dir, out.path());
    assert!(
        run.status.success(),
        "compact failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (source, copied) = (
        size(&relay.dir.join("data.mdb")),
        size(&out.path().join("data.mdb")),
    );
    assert!(copied < source, "copy {copied} bytes, source {source}");

    // A second run into the same directory is refused; the copy stays.
    let again = compact(&relay.dir, out.path());
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(size(&out.path().join("data.mdb")), copied);

    let copy = Relay::start_in(out.path(), &[]);
    let mut r = copy.client().await;
    let served: HashSet<String> = r
        .req_ids("kept", &[json!({"kinds": [1], "limit": 5000})])
        .await
        .into_iter()
        .collect();
    assert_eq!(served, kept);
}
