//! Bursts of connections from one address (many users behind one NAT, a
//! benchmark, a proxy not in `trusted_proxies`) complete, up to the
//! address's session cap: handshakes past `server.max_http_connections_per_ip`
//! wait in the bounded handshake queue instead of being closed at accept.
//! Past the caps the answer is an HTTP 429 (503 for the relay's total) with
//! `Retry-After`; stalled sockets still cannot hold a slot or a place in
//! the queue for longer than their timeouts, and every gauge goes back to
//! idle when they leave. The scrapes of /metrics come from 127.0.0.1, the
//! bursts from other loopback addresses, so a scrape never queues behind a
//! burst.

use crate::support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP connection from `source` that has sent nothing yet.
async fn tcp_from(addr: &str, source: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr.parse().unwrap()).await.unwrap()
}

/// Waits until the relay's `name{labels}` (0 while absent) satisfies
/// `ok`; fails after [`ANSWER_TIMEOUT`] with the last value.
async fn wait_metric(relay: &Relay, name: &str, labels: &[&str], ok: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    loop {
        let v = relay.metric_or_zero(name, labels).await;
        if ok(v) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} stayed at {v} (expected another value)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// No connection of any kind is left: no session, no handshake slot but
/// the scrape's own, nobody waiting.
async fn wait_idle(relay: &Relay) {
    wait_metric(relay, "sluice_connections_open", &[], |v| v == 0.0).await;
    wait_metric(relay, "sluice_http_connections_open", &[], |v| v == 1.0).await;
    wait_metric(relay, "sluice_handshake_queue_waiting", &[], |v| v == 0.0).await;
}

/// Reads until the end of an HTTP response head (or EOF); returns the head.
async fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(ANSWER_TIMEOUT, s.read(&mut chunk))
            .await
            .expect("an answer in time")
            .unwrap_or(0);
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if n == 0 || text.contains("\r\n\r\n") {
            return text.split("\r\n\r\n").next().unwrap_or("").to_string();
        }
    }
}

/// The status of an HTTP response head, and its `Retry-After` in seconds.
fn status_and_retry_after(head: &str) -> (u16, Option<u64>) {
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head:?}"));
    let retry = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("retry-after")
            .then(|| v.trim().parse().ok())
            .flatten()
    });
    (status, retry)
}

/// `n` connections from `source` opened at once, each upgrading and
/// publishing one event of its own key; every one must get OK true.
async fn burst(relay: &Relay, source: &'static str, n: usize) {
    let url = relay.url();
    // Signed before the burst, so the connections open together.
    let events: Vec<_> = (0..n)
        .map(|i| ev((i % 250) as u8, now(), 1, &[], &format!("burst {i}")))
        .collect();
    let tasks: Vec<_> = events
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut c = Client::connect_from(&url, source).await;
                let (ok, msg) = c.publish(&e).await;
                assert!(ok, "connection {i}: {msg}");
                c
            })
        })
        .collect();
    let mut clients = Vec::new();
    for t in tasks {
        clients.push(t.await.expect("every connection upgrades and publishes"));
    }
    assert_eq!(clients.len(), n);
    drop(clients);
}

#[tokio::test]
async fn sixty_connections_at_once_from_one_address_all_upgrade_and_publish() {
    // The default config: 16 handshakes in progress per address, the
    // rest of the burst waits its turn.
    let relay = Relay::start();
    burst(&relay, "127.0.0.9", 60).await;
    assert_eq!(
        relay
            .metric_or_zero(
                "sluice_connections_refused_total",
                &["reason=\"handshake_queue_full\""]
            )
            .await,
        0.0
    );
    wait_idle(&relay).await;
}

#[tokio::test]
async fn two_hundred_at_once_complete_with_the_caps_raised() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "500"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_PER_IP", "256"),
        // The 184 waiting are served 16 at a time: however slow the
        // machine, none waits out its deadline.
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_WAIT_MS", "600000"),
        // 200 events at once from one address, 250 keys.
        (
            "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S",
            "1000",
        ),
    ]);
    burst(&relay, "127.0.0.14", 200).await;
    wait_idle(&relay).await;
}

#[tokio::test]
async fn waiting_connections_hold_no_slot_and_take_their_address_s_slots_in_turn() {
    // The wait deadline is made irrelevant: this test is about who gets a
    // slot, not when.
    let relay = Relay::start_with(&[("SLUICE_SERVER__HANDSHAKE_QUEUE_WAIT_MS", "600000")]);
    // 60 sockets from one address, nothing sent yet: 16 hold the
    // address's slots, 44 wait (the scrape holds one slot of its own).
    let mut socks = Vec::new();
    for _ in 0..60 {
        socks.push(tcp_from(&relay.addr, "127.0.0.10").await);
    }
    wait_metric(&relay, "sluice_http_connections_open", &[], |v| v == 17.0).await;
    wait_metric(&relay, "sluice_handshake_queue_waiting", &[], |v| v == 44.0).await;
    // Now every one upgrades and publishes: the waiting ones get the slots
    // the others free by upgrading.
    let url = relay.url();
    let tasks: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut c = Client::over(&url, s).await.expect("upgraded");
                let e = ev(i as u8, now(), 1, &[], &format!("waited {i}"));
                let (ok, msg) = c.publish(&e).await;
                assert!(ok, "{msg}");
                c
            })
        })
        .collect();
    let mut clients = Vec::new();
    for t in tasks {
        clients.push(t.await.unwrap());
    }
    assert_eq!(
        relay
            .metric("sluice_handshake_queue_admitted_total", &[])
            .await,
        44.0
    );
    assert_eq!(relay.metric("sluice_connections_open", &[]).await, 60.0);
    drop(clients);
    wait_idle(&relay).await;
}

#[tokio::test]
async fn past_the_session_cap_an_upgrade_gets_429_with_retry_after() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "3")]);
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(Client::connect_from(&relay.url(), "127.0.0.11").await);
    }
    let mut s = tcp_from(&relay.addr, "127.0.0.11").await;
    s.write_all(
        b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    let (status, retry) = status_and_retry_after(&head);
    assert_eq!(status, 429, "{head}");
    assert!(retry.is_some_and(|r| r >= 1), "{head}");
    assert_eq!(
        relay
            .metric(
                "sluice_connections_refused_total",
                &["reason=\"max_connections_per_ip\""]
            )
            .await,
        1.0
    );
    // Another address is not affected.
    let mut other = Client::connect_from(&relay.url(), "127.0.0.12").await;
    assert!(other.publish(&ev(1, now(), 1, &[], "other")).await.0);
}

#[tokio::test]
async fn stalled_sockets_past_the_slots_and_the_queue_are_answered_and_all_return_to_idle() {
    // Timeouts far beyond the test: what is held stays held until the
    // stalled client leaves.
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__MAX_HTTP_CONNECTIONS_PER_IP", "4"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_PER_IP", "4"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_TOTAL", "8"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_WAIT_MS", "600000"),
        ("SLUICE_SERVER__HANDSHAKE_TIMEOUT_MS", "600000"),
    ]);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tcp_from(&relay.addr, "127.0.0.12").await);
    }
    wait_metric(&relay, "sluice_http_connections_open", &[], |v| v == 5.0).await;
    for _ in 0..4 {
        held.push(tcp_from(&relay.addr, "127.0.0.12").await);
    }
    wait_metric(&relay, "sluice_handshake_queue_waiting", &[], |v| v == 4.0).await;
    // Past the address's slots and its place in the queue: 429 with
    // Retry-After, then the relay closes.
    for _ in 0..12 {
        let mut s = tcp_from(&relay.addr, "127.0.0.12").await;
        let head = read_head(&mut s).await;
        let (status, retry) = status_and_retry_after(&head);
        assert_eq!(status, 429, "{head}");
        assert_eq!(retry, Some(1), "{head}");
        let mut rest = Vec::new();
        let n = tokio::time::timeout(ANSWER_TIMEOUT, s.read_to_end(&mut rest))
            .await
            .expect("closed in time");
        assert!(n.is_ok_and(|_| rest.len() < 200), "{rest:?}");
    }
    assert_eq!(
        relay
            .metric(
                "sluice_connections_refused_total",
                &["reason=\"handshake_queue_full\""]
            )
            .await,
        12.0
    );
    // The relay answers a fresh client from another address meanwhile.
    let mut fresh = Client::connect_from(&relay.url(), "127.0.0.13").await;
    assert!(fresh.publish(&ev(1, now(), 1, &[], "fresh")).await.0);
    let (status, _, _) = http_get_with(&relay.addr, "/healthz", Some("127.0.0.13"), &[]).await;
    assert_eq!(status, 200);
    fresh.close().await;
    // The stalled clients leave: the slots and the queue empty.
    drop(held);
    wait_idle(&relay).await;
    assert_eq!(
        relay
            .metric_or_zero("sluice_accept_errors_total", &[])
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_waiting_connection_that_gets_no_slot_in_time_is_answered_429() {
    // Two stalled handshakes hold the address's slots for ten minutes;
    // two more wait 300 ms, then are answered.
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__MAX_HTTP_CONNECTIONS_PER_IP", "2"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_WAIT_MS", "300"),
        ("SLUICE_SERVER__HANDSHAKE_TIMEOUT_MS", "600000"),
    ]);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tcp_from(&relay.addr, "127.0.0.15").await);
    }
    wait_metric(&relay, "sluice_http_connections_open", &[], |v| v == 3.0).await;
    for _ in 0..2 {
        let mut s = tcp_from(&relay.addr, "127.0.0.15").await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n")
            .await
            .unwrap();
        let head = read_head(&mut s).await;
        let (status, retry) = status_and_retry_after(&head);
        assert_eq!(status, 429, "{head}");
        assert_eq!(retry, Some(1), "{head}");
    }
    assert_eq!(
        relay
            .metric(
                "sluice_connections_refused_total",
                &["reason=\"handshake_queue_timeout\""]
            )
            .await,
        2.0
    );
    drop(held);
    wait_idle(&relay).await;
}
