//! Black-box tests of the one uploader (`crates/sluice/src/peer/upload.rs`):
//! `sluice sync --direction up` and `[[mirror]] direction = "up"` into a
//! second Sluice at its default config (20 EVENTs/s per address) store
//! every event, sending `rate-limited` ones again; a peer refusing with
//! `blocked:` or `pow:` ends the transfer with the counts, never retried;
//! a peer that drops the connection at each EVENT (a tiny WebSocket server
//! here, speaking just enough NIP-77) is connected to again with a growing
//! backoff, within the retry budget, until the sync gives up saying so.
//! Every assertion is an order or a bound that holds at any machine speed.

use crate::support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use sluice_proto::Event;
use support::{Relay, ev, import_events, now, pubkey_hex};
use tokio_tungstenite::tungstenite::Message;

/// The failure bound of every wait for a state.
const DEADLINE: Duration = Duration::from_secs(90);

/// `n` notes from ten authors (so no author's own bucket binds).
fn notes(n: u64, tag: &str) -> Vec<Event> {
    let t = now() - 10_000;
    (0..n)
        .map(|i| ev(1 + (i % 10) as u8, t + i, 1, &[], &format!("{tag} {i}")))
        .collect()
}

/// `sluice sync URL --direction up` on the store at `store`, with `extra`
/// arguments: (success, stderr).
async fn sync_up(store: &Path, url: &str, extra: &[&str]) -> (bool, String) {
    let args: Vec<&str> = [url, "--direction", "up"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    support::sync(store, &args).await
}

/// The number after `word` in the sync's last summary of the upload (the
/// line starting `sync: uploaded`).
fn summary_count(stderr: &str, before: &str) -> u64 {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("sync: uploaded"))
        .unwrap_or_else(|| panic!("no upload summary in {stderr}"));
    let at = line
        .find(before)
        .unwrap_or_else(|| panic!("{before:?} not in {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|w| w.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("no count before {before:?} in {line}"))
}

async fn count_on(relay: &Relay, filter: Value) -> usize {
    let mut c = relay.client().await;
    let n = c.req("all", &[filter]).await.len();
    c.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_up_into_a_sluice_at_its_default_config_stores_every_event() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("a");
    let events = notes(500, "backlog");
    import_events(&store, &events);
    let b = Relay::start();

    let (ok, err) = sync_up(&store, &b.url(), &[]).await;
    assert!(ok, "{err}");
    assert_eq!(
        count_on(&b, json!({"limit": 5000})).await,
        events.len(),
        "{err}"
    );
    assert!(err.contains("uploaded 500 (0 refused)"), "{err}");
    // 500 events are more than the peer takes at once: it answered
    // rate-limited, and each such event went again (once per answer).
    let limited = summary_count(&err, "rate-limited answers");
    let retried = summary_count(&err, "retried after");
    assert!(limited >= 1, "{err}");
    assert_eq!(retried, limited, "{err}");
    // The peer admits at most 20/s plus its burst: the sync ran past its
    // first progress line (5 s), which draws the rate.
    let series: Vec<&str> = err.lines().filter(|l| l.starts_with("sync: up ")).collect();
    assert!(!series.is_empty(), "{err}");
    assert!(
        series[0].contains("pace ") && series[0].contains("accepted "),
        "{err}"
    );
    // Converged to what the peer allows: never above its rate with burst.
    let converged: f64 = err
        .split("converged at ")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(converged > 0.0 && converged <= 40.0, "{converged}: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_other_than_rate_limited_are_final_and_counted_by_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("a");
    // One author the peer blocks, 200 events.
    let blocked: Vec<Event> = (0..200u64)
        .map(|i| ev(9, now() - 1000 + i, 1, &[], &format!("blocked {i}")))
        .collect();
    import_events(&store, &blocked);
    let policy = format!("[policy]\ndeny_pubkeys = [\"{}\"]\n", pubkey_hex(9));
    let b = Relay::start_with_toml(&policy, &[]);
    let started = Instant::now();
    let (ok, err) = sync_up(&store, &b.url(), &[]).await;
    assert!(ok, "{err}");
    assert!(err.contains("uploaded 0 (200 refused)"), "{err}");
    assert!(err.contains("refused by prefix: blocked 200"), "{err}");
    assert_eq!(summary_count(&err, "retried after"), 0, "{err}");
    assert!(started.elapsed() < DEADLINE, "not a loop");
    assert_eq!(count_on(&b, json!({"limit": 5000})).await, 0);

    // A peer asking for proof of work: reported with the difficulty.
    let c = Relay::start_with_toml("[pow]\nmin_difficulty = 4\n", &[]);
    let store = tmp.path().join("c");
    import_events(&store, &notes(30, "unmined"));
    let (ok, err) = sync_up(&store, &c.url(), &[]).await;
    assert!(ok, "{err}");
    assert!(
        err.contains("refused by prefix: pow 30 (difficulty 4 required)"),
        "{err}"
    );
    assert_eq!(summary_count(&err, "retried after"), 0, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pace_flags_are_checked_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("a");
    for (flags, named) in [
        (["--up-start-rate", "0"], "--up-start-rate"),
        (["--up-max-rate", "1"], "--up-max-rate"),
        (["--up-decrease", "1.5"], "--up-decrease"),
    ] {
        let (ok, err) = sync_up(&store, "ws://127.0.0.1:9", &flags).await;
        assert!(!ok);
        assert!(err.contains(named), "{err}");
    }
}

/// A relay that answers NEG-OPEN as if it held nothing and drops the
/// connection at the first EVENT of each. Records when each connection
/// came, and the EVENTs it read.
struct Dropper {
    url: String,
    connections: Arc<Mutex<Vec<Instant>>>,
    events: Arc<Mutex<u64>>,
}

async fn dropper() -> Dropper {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let connections = Arc::new(Mutex::new(Vec::new()));
    let events = Arc::new(Mutex::new(0));
    let (conns, evs) = (connections.clone(), events.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            conns.lock().unwrap().push(Instant::now());
            let evs = evs.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    let Message::Text(t) = msg else { continue };
                    let v: Value = serde_json::from_str(&t).unwrap();
                    match v[0].as_str() {
                        Some("NEG-OPEN") => {
                            let mut empty = negentropy::NegentropyStorageVector::new();
                            empty.seal().unwrap();
                            let mut neg = negentropy::Negentropy::owned(empty, 0).unwrap();
                            let q = hex::decode(v[3].as_str().unwrap()).unwrap();
                            let answer = neg.reconcile(&q).unwrap();
                            let reply = json!(["NEG-MSG", v[1], hex::encode(answer)]);
                            ws.send(Message::Text(reply.to_string().into()))
                                .await
                                .unwrap();
                        }
                        Some("EVENT") => {
                            *evs.lock().unwrap() += 1;
                            return; // dropped, unanswered
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    Dropper {
        url,
        connections,
        events,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_dropping_every_event_is_retried_with_backoff_until_the_sync_gives_up() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("a");
    import_events(&store, &notes(20, "dropped"));
    let peer = dropper().await;
    let (ok, err) = sync_up(&store, &peer.url, &[]).await;
    assert!(!ok, "the sync must fail: {err}");
    assert!(
        err.contains("gave up after 6 reconnections in a row without an answer"),
        "{err}"
    );
    // The counts are reported: nothing accepted, nothing refused.
    assert!(err.contains("uploaded 0 (0 refused)"), "{err}");
    // The first connection and six more, each after a wait at least half
    // of 250 ms doubled per failure (the jitter takes off at most half).
    let times = peer.connections.lock().unwrap().clone();
    assert_eq!(times.len(), 7, "{err}");
    for (i, pair) in times.windows(2).enumerate() {
        let least = Duration::from_millis((250u64 << i) / 2);
        assert!(
            pair[1] - pair[0] >= least,
            "connection {} came {:?} after the one before (at least {least:?})",
            i + 2,
            pair[1] - pair[0]
        );
    }
    // Within the retry budget: its floor of 10 re-sends per 10 s window
    // plus a fifth of the (at most 20) first sends.
    let retried = summary_count(&err, "retried after");
    assert!((1..=14).contains(&retried), "{err}");
    let read = *peer.events.lock().unwrap();
    assert!(read >= 7, "each connection read an EVENT: {read}");
}

/// `[[mirror]]` up to `url` for a relay's config.
fn mirror_up(url: &str) -> String {
    format!(
        "[[mirror]]\nurl = \"{url}\"\ndirection = \"up\"\n\
         reconnect_min_ms = 100\nreconnect_max_ms = 500\n"
    )
}

async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_up_into_a_sluice_at_its_default_config_sends_every_event_and_goes_idle() {
    let b = Relay::start();
    let peer = format!("peer=\"{}\"", b.url());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let backlog = notes(300, "catch-up");
    import_events(&dir, &backlog);
    let a = Relay::start_in_with_toml(&dir, &mirror_up(&b.url()), &[]);
    wait_for("the catch-up stores every event on B", || async {
        count_on(&b, json!({"limit": 5000})).await == backlog.len()
    })
    .await;
    // Live events too, paced by the same uploader.
    let live = notes(20, "live");
    let mut c = a.client().await;
    for e in &live {
        assert!(c.publish(e).await.0);
    }
    wait_for("the live events reach B", || async {
        count_on(&b, json!({"limit": 5000})).await == backlog.len() + live.len()
    })
    .await;
    let accepted = (backlog.len() + live.len()) as f64;
    wait_for("every OK is counted", || async {
        a.metric(
            "sluice_mirror_events_out_total",
            &[&peer, "result=\"accepted\""],
        )
        .await
            == accepted
    })
    .await;
    // Idle: nothing in flight, a pace shown, no final refusal; every
    // rate-limited answer was sent again.
    assert_eq!(a.metric("sluice_mirror_up_in_flight", &[&peer]).await, 0.0);
    assert!(
        a.metric("sluice_mirror_up_rate_events_per_second", &[&peer])
            .await
            > 0.0
    );
    assert_eq!(
        a.metric_or_zero("sluice_mirror_up_refused_total", &[&peer])
            .await,
        0.0
    );
    assert_eq!(
        a.metric_or_zero(
            "sluice_mirror_events_out_total",
            &[&peer, "result=\"refused\""]
        )
        .await,
        0.0
    );
    // The peer gone: still nothing in flight, not connected.
    drop(b);
    wait_for("the mirror sees its peer gone", || async {
        a.metric("sluice_mirror_connected", &[&peer]).await == 0.0
    })
    .await;
    assert_eq!(a.metric("sluice_mirror_up_in_flight", &[&peer]).await, 0.0);
}
