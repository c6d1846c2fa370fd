//! Black-box tests of the relay network: `sluice sync` and mirrors over
//! wss:// (a test CA made here, a TLS endpoint in this process in front of
//! a real relay), `[[mirror]]` in `sluice serve` down and both ways
//! (catch-up, live, a restart of the peer), no event sent back to the peer
//! it came from, the local policy applied to mirrored events, and
//! `sluice mirror URL` alone. Every wait is for a state (an event present,
//! a metric's value), with a deadline only as the failure bound.

use crate::support;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_proto::Event;
use support::{Relay, ev, import_events, now, pubkey_hex, sluice_on, sync};

/// The failure bound of every wait for a state.
const DEADLINE: Duration = Duration::from_secs(60);

/// Waits until `check` returns true (polled), or fails naming `what`.
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ids of the events on `relay` matching `filter`.
async fn ids_on(relay: &Relay, filter: Value) -> Vec<String> {
    let mut c = relay.client().await;
    let ids = c.req_ids("ids", &[filter]).await;
    c.close().await;
    ids
}

async fn has(relay: &Relay, e: &Event) -> bool {
    !ids_on(relay, json!({"ids": [e.id_hex()]})).await.is_empty()
}

async fn publish(relay: &Relay, e: &Event) {
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(e).await;
    assert!(ok, "publishing: {msg}");
    c.close().await;
}

/// A test certificate authority and a server certificate it signed for
/// 127.0.0.1 and localhost.
struct TestCa {
    /// The CA's certificate, PEM, in a file.
    ca_file: PathBuf,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    fn new(dir: &Path, name: &str) -> TestCa {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
            KeyUsagePurpose, SanType,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("Sluice test CA {name}"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        leaf.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let leaf = leaf.signed_by(&key, &ca).unwrap();
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        TestCa {
            ca_file,
            server: Arc::new(server),
        }
    }
}

/// A TLS endpoint on 127.0.0.1 that terminates TLS with `ca`'s server
/// certificate and forwards the bytes to `backend` (a relay's plain
/// address), on a thread and runtime of its own for the test's life.
/// Returns its wss:// URL.
fn tls_endpoint(ca: &TestCa, backend: &str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(ca.server.clone());
    let backend = backend.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, backend) = (acceptor.clone(), backend.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(&backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
    });
    format!("wss://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_over_wss_with_the_test_ca_moves_events_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new(tmp.path(), "trusted");
    let remote = Relay::start();
    let t = now() - 1_000;
    let there: Vec<Event> = (0..3).map(|i| ev(1, t + i, 1, &[], "there")).collect();
    for e in &there {
        publish(&remote, e).await;
    }
    let store = tmp.path().join("local");
    let here: Vec<Event> = (0..2).map(|i| ev(2, t + i, 1, &[], "here")).collect();
    import_events(&store, &here);
    let url = tls_endpoint(&ca, &remote.addr);
    let ca_file = ca.ca_file.to_str().unwrap();

    let (ok, err) = sync(&store, &[&url, "--direction", "both", "--ca-file", ca_file]).await;
    assert!(ok, "{err}");
    assert!(err.contains("3 only on the remote"), "{err}");
    assert!(err.contains("uploaded 2 (0 refused)"), "{err}");
    for e in &here {
        assert!(has(&remote, e).await, "sent up over wss");
    }
    let local = Relay::start_in(&store, &[]);
    for e in &there {
        assert!(has(&local, e).await, "brought down over wss");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wss_peer_whose_certificate_no_trusted_ca_signed_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (signer, other) = (
        TestCa::new(tmp.path(), "signer"),
        TestCa::new(tmp.path(), "other"),
    );
    let remote = Relay::start();
    publish(&remote, &ev(1, now(), 1, &[], "unreachable")).await;
    let url = tls_endpoint(&signer, &remote.addr);
    let store = tmp.path().join("local");
    // Neither the public roots nor another CA's file vouch for it.
    for extra in [vec![], vec!["--ca-file", other.ca_file.to_str().unwrap()]] {
        let mut args = vec![url.as_str(), "--direction", "both"];
        args.extend(extra);
        let (ok, err) = sync(&store, &args).await;
        assert!(!ok, "synced with an untrusted certificate: {err}");
        assert!(err.contains("UnknownIssuer"), "{err}");
        assert!(err.contains("trusted CA"), "the error says why: {err}");
    }
}

/// `[[mirror]]` entries for `relay`'s config.
fn mirror_toml(url: &str, direction: &str, extra: &str) -> String {
    format!(
        "[[mirror]]\nurl = \"{url}\"\ndirection = \"{direction}\"\n\
         reconnect_min_ms = 100\nreconnect_max_ms = 500\n{extra}"
    )
}

async fn connected(relay: &Relay, peer: &str) -> f64 {
    relay
        .metric_or_zero("sluice_mirror_connected", &[&format!("peer=\"{peer}\"")])
        .await
}

/// Whether `relay`'s mirror of `peer` has reconciled with it at least
/// `n` times (its local set is read: what is published from now on is
/// caught up, if at all, by the live REQ or the tap).
async fn caught_up(relay: &Relay, peer: &str, n: f64) -> bool {
    relay
        .metric_or_zero(
            "sluice_mirror_catchups_total",
            &[&format!("peer=\"{peer}\"")],
        )
        .await
        >= n
}

/// A peer killed while a mirror follows it.
struct Killed {
    url: String,
    dir: PathBuf,
    addr: String,
    keep: Option<tempfile::TempDir>,
    catchups: f64,
}

/// Kills `peer` (SIGKILL) and waits until `local`'s mirror sees it gone.
async fn kill_peer(local: &Relay, mut peer: Relay) -> Killed {
    let url = peer.url();
    let catchups = local
        .metric(
            "sluice_mirror_catchups_total",
            &[&format!("peer=\"{url}\"")],
        )
        .await;
    let killed = Killed {
        keep: peer.keep_dir(),
        dir: peer.dir.clone(),
        addr: peer.addr.clone(),
        url,
        catchups,
    };
    drop(peer);
    wait_for("the mirror sees its peer gone", || async {
        connected(local, &killed.url).await == 0.0
    })
    .await;
    killed
}

/// Starts a killed peer again on its port and store, and waits until
/// `local`'s mirror has caught up with it again. Returns the new process
/// and the directory holding its store.
async fn start_again(
    local: &Relay,
    k: Killed,
    env: &[(&str, &str)],
) -> (Relay, Option<tempfile::TempDir>) {
    let mut env = env.to_vec();
    env.push(("SLUICE_SERVER__LISTEN", &k.addr));
    let again = Relay::start_in(&k.dir, &env);
    wait_for("the mirror catches up again", || async {
        caught_up(local, &k.url, k.catchups + 1.0).await && connected(local, &k.url).await == 1.0
    })
    .await;
    let label = format!("peer=\"{}\"", k.url);
    assert!(
        local
            .metric("sluice_mirror_reconnects_total", &[&label])
            .await
            >= 1.0
    );
    (again, k.keep)
}

/// [`kill_peer`] then [`start_again`].
async fn restart_peer(local: &Relay, peer: Relay) -> (Relay, Option<tempfile::TempDir>) {
    let killed = kill_peer(local, peer).await;
    start_again(local, killed, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_mirror_catches_up_stays_live_and_survives_a_restart_of_its_peer() {
    let b = Relay::start();
    let t = now() - 500;
    let old: Vec<Event> = (0..5).map(|i| ev(1, t + i, 1, &[], "before")).collect();
    for e in &old {
        publish(&b, e).await;
    }
    // One event in admission at a time: reading from B waits for each.
    let a = Relay::start_with_toml(&mirror_toml(&b.url(), "down", "queue_events = 1\n"), &[]);
    // Catch-up: what B held before the mirror started.
    for e in &old {
        let e = e.clone();
        wait_for("the catch-up brings B's events", || async {
            has(&a, &e).await
        })
        .await;
    }
    assert_eq!(
        a.metric("sluice_mirror_catchups_total", &["method=\"negentropy\""])
            .await,
        1.0
    );
    // Live: published on B now, delivered to A.
    let live = ev(1, now(), 1, &[], "live");
    publish(&b, &live).await;
    wait_for("a live event arrives", || async { has(&a, &live).await }).await;
    // Nothing goes up from a down mirror.
    let local = ev(3, now(), 1, &[], "stays here");
    publish(&a, &local).await;

    let (b, _dir) = restart_peer(&a, b).await;
    let after = ev(1, now(), 1, &[], "after the restart");
    publish(&b, &after).await;
    wait_for("an event published after the restart arrives", || async {
        has(&a, &after).await
    })
    .await;
    assert!(!has(&b, &local).await, "a down mirror sent an event up");
    let peer = format!("peer=\"{}\"", b.url());
    assert!(
        a.metric(
            "sluice_mirror_queue_full_total",
            &[&peer, "direction=\"down\""]
        )
        .await
            >= 1.0,
        "the window of one was full, and nothing was lost"
    );
    // The last live event's age at arrival is shown.
    assert!(a.metric("sluice_mirror_lag_seconds", &[&peer]).await >= 0.0);
    assert_eq!(
        ids_on(&a, json!({"authors": [pubkey_hex(1)]})).await.len(),
        old.len() + 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_way_mirror_converges_sends_nothing_back_and_survives_a_restart() {
    let b = Relay::start();
    let peer = format!("peer=\"{}\"", b.url());
    let a = Relay::start_with_toml(&mirror_toml(&b.url(), "both", "queue_events = 1\n"), &[]);
    wait_for("the mirror catches up", || async {
        caught_up(&a, &b.url(), 1.0).await
    })
    .await;
    let on_a = ev(1, now(), 1, &[], "published on A");
    publish(&a, &on_a).await;
    wait_for("A's event reaches B", || async { has(&b, &on_a).await }).await;
    let on_b = ev(2, now(), 1, &[], "published on B");
    publish(&b, &on_b).await;
    wait_for("B's event reaches A", || async { has(&a, &on_b).await }).await;
    // A marker after both: once it is on B, anything A sent up before it
    // (its queue to B is in order) has been sent.
    let marker = ev(1, now(), 1, &[], "marker");
    publish(&a, &marker).await;
    wait_for("the marker reaches B", || async { has(&b, &marker).await }).await;
    wait_for("B accepted what A sent", || async {
        a.metric(
            "sluice_mirror_events_out_total",
            &[&peer, "result=\"accepted\""],
        )
        .await
            >= 2.0
    })
    .await;
    // B's event came from B: never sent back. B reads one connection's
    // messages in order, so with the marker stored every EVENT A sent
    // before it has been counted: the test's one publish on B and A's two.
    assert_eq!(
        b.metric("sluice_messages_received_total", &["type=\"event\""])
            .await,
        3.0,
        "A sent B's own event back"
    );
    assert_eq!(
        a.metric("sluice_mirror_events_out_total", &[&peer]).await,
        2.0
    );
    assert_eq!(
        a.metric(
            "sluice_mirror_events_in_total",
            &[&peer, "outcome=\"stored\""]
        )
        .await,
        1.0,
        "A stored one event from B (its own came back only as duplicates)"
    );
    assert_eq!(ids_on(&a, json!({})).await.len(), 3);
    assert_eq!(ids_on(&b, json!({})).await.len(), 3);

    // While B is away, A's queue to B (queue_events = 1) keeps the first
    // of three new events and drops the other two, counted; the catch-up
    // after the restart sends all three.
    let killed = kill_peer(&a, b).await;
    let while_away: Vec<Event> = (0..3)
        .map(|i| ev(1, now() + i, 1, &[], "while B is away"))
        .collect();
    for e in &while_away {
        publish(&a, e).await;
    }
    assert_eq!(
        a.metric(
            "sluice_mirror_queue_full_total",
            &[&peer, "direction=\"up\""]
        )
        .await,
        2.0
    );
    let (b2, _dir) = start_again(&a, killed, &[]).await;
    for e in &while_away {
        let e = e.clone();
        wait_for("an event stored while B was away reaches B", || async {
            has(&b2, &e).await
        })
        .await;
    }
    let after_a = ev(1, now(), 1, &[], "on A after the restart");
    publish(&a, &after_a).await;
    let after_b = ev(2, now(), 1, &[], "on B after the restart");
    publish(&b2, &after_b).await;
    wait_for("A's event reaches B after the restart", || async {
        has(&b2, &after_a).await
    })
    .await;
    wait_for("B's event reaches A after the restart", || async {
        has(&a, &after_b).await
    })
    .await;
    assert_eq!(ids_on(&a, json!({})).await.len(), 8);
    assert_eq!(ids_on(&b2, json!({})).await.len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_policy_refuses_a_mirrored_event_of_a_blocked_author() {
    let b = Relay::start();
    let peer = format!("peer=\"{}\"", b.url());
    let policy = format!("[policy]\ndeny_pubkeys = [\"{}\"]\n", pubkey_hex(9));
    let a = Relay::start_with_toml(&mirror_toml(&b.url(), "down", &policy), &[]);
    wait_for("the mirror catches up", || async {
        caught_up(&a, &b.url(), 1.0).await
    })
    .await;
    let blocked = ev(9, now(), 1, &[], "from a blocked author");
    let allowed = ev(1, now(), 1, &[], "from anyone else");
    publish(&b, &blocked).await;
    publish(&b, &allowed).await;
    wait_for("the allowed event arrives", || async {
        has(&a, &allowed).await
    })
    .await;
    wait_for("the blocked event is refused", || async {
        a.metric_or_zero(
            "sluice_mirror_events_in_total",
            &[&peer, "outcome=\"refused\""],
        )
        .await
            == 1.0
    })
    .await;
    assert!(
        !has(&a, &blocked).await,
        "the blocked author's event was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_reconcile_is_caught_up_from_by_req_since_the_newest_seen() {
    // B answers NEG-OPEN over more than one event with NEG-ERR.
    let no_neg = [("SLUICE_LIMITS__MAX_NEGENTROPY_ITEMS", "1")];
    let b = Relay::start_with(&no_neg);
    let t = now() - 100;
    let old: Vec<Event> = (0..3).map(|i| ev(1, t + i, 1, &[], "before")).collect();
    for e in &old {
        publish(&b, e).await;
    }
    let a = Relay::start_with_toml(&mirror_toml(&b.url(), "down", ""), &[]);
    // The first connection's REQ has no `since`: B's stored events come.
    for e in &old {
        let e = e.clone();
        wait_for("B's events arrive by REQ", || async { has(&a, &e).await }).await;
    }
    let peer = format!("peer=\"{}\"", b.url());
    assert_eq!(
        a.metric_or_zero(
            "sluice_mirror_catchups_total",
            &[&peer, "method=\"negentropy\""]
        )
        .await,
        0.0
    );
    assert!(
        a.metric("sluice_mirror_catchups_total", &[&peer, "method=\"req\""])
            .await
            >= 1.0
    );
    // An event B gets while the mirror is away, created after the newest
    // the mirror saw but before the overlap of a live REQ from the
    // reconnection: the REQ since the newest seen brings it.
    let killed = kill_peer(&a, b).await;
    let missed = ev(1, t + 30, 1, &[], "while the mirror was away");
    import_events(&killed.dir, std::slice::from_ref(&missed));
    let (_b, _dir) = start_again(&a, killed, &no_neg).await;
    wait_for("the event B got meanwhile arrives", || async {
        has(&a, &missed).await
    })
    .await;
}

/// A `sluice mirror` process; killed on drop.
struct Alone(std::process::Child);

impl Drop for Alone {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_mirror_alone_over_wss_brings_events_into_its_store_until_interrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = TestCa::new(tmp.path(), "alone");
    let remote = Relay::start();
    let before = ev(1, now() - 100, 1, &[], "before");
    publish(&remote, &before).await;
    let url = tls_endpoint(&ca, &remote.addr);
    let store = tmp.path().join("local");
    let mut child = sluice_on(&store)
        .args(["mirror", &url, "--ca-file", ca.ca_file.to_str().unwrap()])
        .env("SLUICE_METRICS__LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut alone = Alone(child);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(i) = line.find("metrics on http://") {
                let rest = &line[i + "metrics on http://".len()..];
                let _ = tx.send(rest.trim_end_matches("/metrics").to_string());
            }
        }
    });
    let metrics_addr = rx
        .recv_timeout(DEADLINE)
        .expect("the mirror's metrics address");
    let stored = || async {
        let (_, _, body) = support::http_get(&metrics_addr, "/metrics", None).await;
        support::series_sum(
            &body,
            "sluice_mirror_events_in_total",
            &["outcome=\"stored\""],
        )
        .unwrap_or(0.0)
    };
    wait_for("the catch-up stores the peer's event", || async {
        stored().await == 1.0
    })
    .await;
    let live = ev(1, now(), 1, &[], "live");
    publish(&remote, &live).await;
    wait_for("the live event is stored", || async {
        stored().await == 2.0
    })
    .await;
    let (_, _, body) = support::http_get(&metrics_addr, "/metrics", None).await;
    assert_eq!(
        support::series_sum(&body, "sluice_mirror_connected", &[]),
        Some(1.0)
    );

    support::signal(&alone.0, "INT");
    let status = support::wait_exit(&mut alone.0);
    assert!(status.success(), "{status:?}");
    let local = Relay::start_in(&store, &[]);
    assert!(has(&local, &before).await && has(&local, &live).await);
}
