//! Black-box tests of what an attacker can send: unsigned data riding along
//! with a signed event, nesting meant to exhaust a parser, events and
//! filters whose JSON the parser refuses, each answered with the right
//! NIP-01 message and nothing of it stored or served.

use crate::support;

use serde_json::json;
use support::*;

/// A signed event's text with `extra` spliced in as its first field.
fn with_extra(e: &sluice_proto::Event, extra: &str) -> String {
    format!("{{{extra},{}", &e.raw()[1..])
}

#[tokio::test]
async fn unsigned_fields_are_neither_stored_nor_served() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now(), 1, &[], "short");
    // 120 KB of unsigned data beside a 5-byte content.
    let junk = format!(r#""junk":"{}""#, "j".repeat(120_000));
    c.send_text(&format!(r#"["EVENT",{}]"#, with_extra(&e, &junk)))
        .await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(ok, "{msg}");
    let got = c.req("s", &[json!({"ids": [e.id_hex()]})]).await;
    assert_eq!(got.len(), 1);
    assert!(!got[0].contains("junk"), "served with the unsigned field");
    assert!(got[0].len() < 1_000, "served {} bytes", got[0].len());
    let served = sluice_proto::Event::parse(&got[0]).unwrap();
    served.verify().unwrap();
    // The clean copy, sent later, is a duplicate of what is stored.
    let (ok, msg) = c.publish(&e).await;
    assert!(ok && msg.starts_with("duplicate:"), "{msg}");
}

#[tokio::test]
async fn deep_nesting_is_refused_with_the_right_answer() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now(), 1, &[], "x");
    let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    c.send_text(&format!(
        r#"["EVENT",{}]"#,
        with_extra(&e, &format!(r#""junk":{deep}"#))
    ))
    .await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(
        !ok && msg.starts_with("invalid:") && msg.contains("nests deeper"),
        "{msg}"
    );
    // Not stored.
    assert!(c.req("s", &[json!({"ids": [e.id_hex()]})]).await.is_empty());

    // A deep filter: CLOSED for its subscription.
    c.send_text(&format!(r##"["REQ","d",{{"#t":[{deep}]}}]"##))
        .await;
    let m = c.expect("CLOSED").await;
    assert_eq!(m[1], "d");
    let text = m[2].as_str().unwrap();
    assert!(
        text.starts_with("invalid:") && text.contains("nests deeper"),
        "{m}"
    );
    // Anything else that deep: a NOTICE, and the connection goes on.
    c.send_text(&format!(r#"["HELLO",{deep}]"#)).await;
    c.expect("NOTICE").await;
    c.send_text(&format!(r#"["CLOSE",{deep}]"#)).await;
    c.expect("NOTICE").await;
    assert!(c.publish(&e).await.0);
}

/// JSON forbids raw control characters inside strings (and escapes it does
/// not list), so such an EVENT is refused; but it is answered, with
/// exactly one OK false when its id can be read, else a NOTICE.
#[tokio::test]
async fn an_event_with_raw_control_characters_gets_one_ok_false() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now(), 1, &[], "line\nbreak\ttab\rcr\u{8}bs\u{c}ff end");
    // relay-tester's "literals for JSON escape sequences": the escapes
    // written as the raw bytes, and a lone backslash.
    let literal = e
        .raw()
        .replace("\\n", "\n")
        .replace("\\t", "\t")
        .replace("\\r", "\r")
        .replace("\\b", "\u{8}")
        .replace("\\f", "\u{c}")
        .replace(" end", "\\ end");
    assert!(serde_json::from_str::<serde_json::Value>(&literal).is_err());
    c.send_text(&format!("[\"EVENT\",{literal}]")).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Exactly one OK, and nothing stored.
    let got = c.req("s", &[json!({"ids": [e.id_hex()]})]).await;
    assert!(got.is_empty());
    // No id to read: a NOTICE, and the connection goes on.
    c.send_text("[\"EVENT\",{\"content\":\"a\u{1}b\"}]").await;
    let m = c.recv().await;
    assert_eq!(m[0], "NOTICE", "{m}");
    assert!(m[1].as_str().unwrap().starts_with("invalid:"), "{m}");
    c.send(json!(["REQ", "barrier", {"limit": 0}])).await;
    let m = c.recv().await;
    assert_eq!(m, json!(["EOSE", "barrier"]), "nothing else may come first");
    // The same event, escaped properly, is stored.
    assert!(c.publish(&e).await.0);
}

#[tokio::test]
async fn a_filter_the_parser_refuses_is_named_for_what_it_is() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    c.send_text(r#"["REQ","big",{"limit":1e400}]"#).await;
    let m = c.expect("CLOSED").await;
    let text = m[2].as_str().unwrap();
    assert!(text.starts_with("invalid:"), "{m}");
    assert!(!text.contains("must be a JSON object"), "{m}");
    assert!(text.contains("number out of range"), "{m}");
}

/// A TCP connection from `source` that sends half a request head and
/// then nothing.
async fn half_request(addr: &str, source: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n")
        .await
        .unwrap();
    s
}

/// Waits until the relay closes `s` (EOF or reset); panics if it stays
/// open past the answer timeout.
async fn closed_by_relay(s: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(ANSWER_TIMEOUT, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the relay kept a stalled connection open"),
        }
    }
}

#[tokio::test]
async fn stalled_handshakes_are_capped_per_address_and_timed_out() {
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__HANDSHAKE_TIMEOUT_MS", "1000"),
        ("SLUICE_SERVER__MAX_HTTP_CONNECTIONS_PER_IP", "4"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_PER_IP", "4"),
        ("SLUICE_SERVER__HANDSHAKE_QUEUE_TOTAL", "4"),
    ]);
    let mut stalled = Vec::new();
    for _ in 0..12 {
        stalled.push(half_request(&relay.addr, "127.0.0.3").await);
    }
    // Another address is served meanwhile: a WebSocket client publishes.
    let mut c = Client::connect_from(&relay.url(), "127.0.0.4").await;
    assert!(c.publish(&ev(1, now(), 1, &[], "served")).await.0);
    // Every stalled socket is closed: 4 answered 429 at accept (past the
    // address's cap and its place in the queue), 4 when their request
    // head runs out of time, then the 4 that waited meanwhile, given the
    // slots the first 4 freed, when theirs does.
    for s in &mut stalled {
        closed_by_relay(s).await;
    }
    let refused = relay
        .metric(
            "sluice_connections_refused_total",
            &["reason=\"handshake_queue_full\""],
        )
        .await;
    assert_eq!(refused, 4.0);
    let timed_out = relay
        .metric(
            "sluice_http_connections_closed_total",
            &["reason=\"handshake_timeout\""],
        )
        .await;
    assert_eq!(timed_out, 8.0);
    assert_eq!(
        relay
            .metric("sluice_handshake_queue_admitted_total", &[])
            .await,
        4.0
    );
    // The WebSocket client is still connected.
    assert!(c.publish(&ev(1, now(), 1, &[], "still served")).await.0);
}

/// A GET from `source` that tolerates being refused or closed: the status,
/// or `None` when the relay closed without an answer.
async fn try_get(addr: &str, source: &str, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(addr.parse().unwrap()).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The slow-loris defence under a small descriptor budget: 1,100 stalled
/// handshakes (half a request each, then nothing) against a relay limited
/// to 1,024 open files, first all from one address (past its slots they
/// wait in its bounded queue or are refused), then 11 from each of 100
/// addresses (past the total, the oldest slot is evicted or the newcomer
/// refused; refusals are answered at most 32 at a time). The caps are
/// lowered to fit the budget (logged); each time descriptors never run out,
/// a fresh client is served while the flood is held, and once the flood
/// leaves every gauge is idle again.
#[tokio::test]
async fn eleven_hundred_stalled_handshakes_do_not_exhaust_1024_descriptors() {
    let relay = Relay::start_with_nofile(1024, &[]);
    assert!(
        relay
            .log_text()
            .contains("do not fit in the open-files limit"),
        "the caps were not lowered to the descriptor budget:\n{}",
        relay.log_text()
    );
    stalled_flood(&relay, |_| "127.0.3.1".to_string(), "127.0.0.20").await;
    stalled_flood(&relay, |i| format!("127.0.4.{}", i / 11 + 1), "127.0.0.22").await;
    assert_eq!(
        relay
            .metric_or_zero("sluice_accept_errors_total", &["kind=\"descriptors\""])
            .await,
        0.0,
        "descriptors ran out"
    );
    // Both floods met their bounds: the address's queue, then the total
    // cap (where a newcomer evicts a slot held over 1 s, else is refused).
    let queue_full = relay
        .metric(
            "sluice_connections_refused_total",
            &["reason=\"handshake_queue_full\""],
        )
        .await;
    assert!(queue_full > 0.0, "{queue_full}");
    let at_total = relay
        .metric_or_zero(
            "sluice_connections_refused_total",
            &["reason=\"max_http_connections\""],
        )
        .await
        + relay
            .metric_or_zero(
                "sluice_http_connections_closed_total",
                &["reason=\"evicted\""],
            )
            .await;
    assert!(at_total > 0.0, "{at_total}");
}

/// Opens 1,100 stalled handshakes, the `i`th from `source(i)`; checks that
/// a client from `fresh_from` is served meanwhile, then closes them all
/// and waits until every gauge is idle.
async fn stalled_flood(relay: &Relay, source: impl Fn(usize) -> String, fresh_from: &str) {
    use std::time::{Duration, Instant};
    use tokio::io::AsyncWriteExt;
    let mut stalled = Vec::new();
    for i in 0..1100 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(format!("{}:0", source(i)).parse().unwrap())
            .unwrap();
        let mut s = socket.connect(relay.addr.parse().unwrap()).await.unwrap();
        // Refused sockets may already be closed: the write may fail.
        let _ = s
            .write_all(b"GET / HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n")
            .await;
        stalled.push(s);
    }
    // A fresh client gets in while the flood is held (at the total cap, as
    // soon as a stalled slot is old enough to be evicted).
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut fresh = loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(format!("{fresh_from}:0").parse().unwrap())
            .unwrap();
        let s = socket.connect(relay.addr.parse().unwrap()).await.unwrap();
        if let Ok(Ok(c)) = tokio::time::timeout(ANSWER_TIMEOUT, Client::over(&relay.url(), s)).await
        {
            break c;
        }
        assert!(Instant::now() < deadline, "no fresh client got in");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(fresh.publish(&ev(1, now(), 1, &[], "got in")).await.0);
    let mut healthz = None;
    while healthz != Some(200) {
        assert!(Instant::now() < deadline, "/healthz: {healthz:?}");
        healthz = try_get(&relay.addr, fresh_from, "/healthz").await;
    }
    fresh.close().await;
    drop(stalled);
    // Scrapes come from 127.0.0.1, which the floods do not use; once one
    // is answered the slots are no longer all held.
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    while try_get(&relay.addr, "127.0.0.1", "/metrics").await != Some(200) {
        assert!(Instant::now() < deadline, "/metrics refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (name, idle) in [
        ("sluice_connections_open", 0.0),
        ("sluice_handshake_queue_waiting", 0.0),
        // The scrape itself.
        ("sluice_http_connections_open", 1.0),
    ] {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let v = relay.metric_or_zero(name, &[]).await;
            if v == idle {
                break;
            }
            assert!(Instant::now() < deadline, "{name} stayed at {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn at_the_connection_cap_the_oldest_stalled_handshake_makes_room() {
    // Stalled handshakes from many addresses fill the cap of connections
    // that are not sessions; once they are older than the eviction age
    // (1 s), a new client gets in at once and the oldest is closed, long
    // before the handshake timeout.
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__HANDSHAKE_TIMEOUT_MS", "600000"),
        ("SLUICE_SERVER__MAX_HTTP_CONNECTIONS", "4"),
    ]);
    let mut stalled = Vec::new();
    for n in 0..4 {
        stalled.push(half_request(&relay.addr, &format!("127.0.1.{}", n + 1)).await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let mut c = Client::connect_from(&relay.url(), "127.0.0.5").await;
    assert!(c.publish(&ev(1, now(), 1, &[], "got in")).await.0);
    closed_by_relay(&mut stalled[0]).await;
    let evicted = relay
        .metric(
            "sluice_http_connections_closed_total",
            &["reason=\"evicted\""],
        )
        .await;
    assert!(evicted >= 1.0, "{evicted}");
}

#[tokio::test]
async fn shutdown_is_not_held_up_by_a_stalled_client() {
    // A head timeout longer than the test waits for the exit (20 s): the
    // exit must come from the shutdown's own bound (shutdown_grace_ms).
    let mut relay = Relay::start_with(&[
        ("SLUICE_SERVER__HANDSHAKE_TIMEOUT_MS", "60000"),
        ("SLUICE_SERVER__SHUTDOWN_GRACE_MS", "1000"),
    ]);
    let _stalled = half_request(&relay.addr, "127.0.0.5").await;
    let mut c = relay.client().await;
    assert!(c.publish(&ev(1, now(), 1, &[], "x")).await.0);
    let status = relay.stop();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_clients_close_is_answered_with_a_close() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let relay = Relay::start();
    let (mut ws, _) = tokio_tungstenite::connect_async(relay.url()).await.unwrap();
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    })))
    .await
    .unwrap();
    // The AUTH challenge sent at connect comes first.
    let answer = loop {
        match tokio::time::timeout(ANSWER_TIMEOUT, ws.next())
            .await
            .expect("an answer in time")
        {
            Some(Ok(Message::Text(t))) if t.starts_with("[\"AUTH\"") => continue,
            other => break other,
        }
    };
    match answer {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.code, CloseCode::Normal),
        other => panic!("expected the Close echoed, got {other:?}"),
    }
}

#[tokio::test]
async fn at_shutdown_every_stored_event_was_acknowledged_and_the_close_is_clean() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let mut relay = Relay::start_with(&[
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1000"),
        ("SLUICE_THROTTLE__MODE", "off"),
    ]);
    let (ws, _) = tokio_tungstenite::connect_async(relay.url()).await.unwrap();
    let (mut tx, mut rx) = ws.split();
    let t = now();
    let events: Vec<_> = (0..3000u64)
        .map(|i| ev(7, t - 3000 + i, 1, &[], &format!("s{i}")))
        .collect();
    // The client keeps publishing through the shutdown: the relay always
    // has unread frames from it when it closes.
    let texts: Vec<String> = events
        .iter()
        .map(|e| format!(r#"["EVENT",{}]"#, e.raw()))
        .collect();
    let publisher = tokio::spawn(async move {
        for text in texts {
            if tx.send(Message::Text(text.into())).await.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
        tx
    });
    let mut acked = std::collections::HashSet::new();
    let mut signalled = false;
    let close = loop {
        match tokio::time::timeout(ANSWER_TIMEOUT, rx.next())
            .await
            .expect("in time")
        {
            Some(Ok(Message::Text(t))) => {
                let m: serde_json::Value = serde_json::from_str(&t).unwrap();
                if m[0] == "OK" && m[2] == true {
                    acked.insert(m[1].as_str().unwrap().to_string());
                }
                // Shut down once some EVENTs are through, others in flight.
                if !signalled && acked.len() >= 100 {
                    relay.signal("TERM");
                    signalled = true;
                }
            }
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => {}
            other => panic!("the connection ended without a Close: {other:?}"),
        }
    };
    assert_eq!(close.map(|f| f.code), Some(CloseCode::Away));
    let tx = publisher.await.unwrap();
    drop((tx, rx));
    let status = relay.wait_stopped();
    assert!(status.success(), "{status:?}");
    // Every event the store holds got its OK true.
    let again = Relay::start_in(&relay.dir, &[]);
    let mut c = again.client().await;
    let stored: std::collections::HashSet<String> = c
        .req_ids("all", &[json!({"authors": [pubkey_hex(7)], "limit": 5000})])
        .await
        .into_iter()
        .collect();
    let unacked: Vec<_> = stored.difference(&acked).collect();
    assert!(unacked.is_empty(), "{} stored without an OK", unacked.len());
    assert!(
        acked.is_subset(&stored),
        "an OK true for an event not stored"
    );
}

#[tokio::test]
async fn a_stalled_subscriber_is_dropped_by_bytes_not_after_thousands_of_big_events() {
    // A queue of 4,096 events but only 1 MB: big events fill the bytes
    // first. The send timeout is long, so the drop comes from the queue.
    let relay = Relay::start_with(&[
        ("SLUICE_ENGINE__LIVE_BUFFER_BYTES", "1000000"),
        ("SLUICE_SERVER__SEND_TIMEOUT_MS", "600000"),
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "1000"),
        ("SLUICE_THROTTLE__MODE", "off"),
    ]);
    // Subscribes, then never reads again.
    let mut stalled = relay.client().await;
    stalled
        .req("all", &[json!({"authors": [pubkey_hex(8)]})])
        .await;
    let mut publisher = relay.client().await;
    let big = "b".repeat(60_000);
    let t = now();
    // 500 events of 60 KB: 30 MB, more than the socket buffers on both
    // sides and the write buffer can hold, so the live queue fills.
    for chunk in (0..500u64).collect::<Vec<_>>().chunks(50) {
        let events: Vec<_> = chunk
            .iter()
            .map(|i| ev(8, t - 500 + i, 1, &[], &format!("{i}{big}")))
            .collect();
        for e in &events {
            publisher.send_event(e).await;
        }
        // OKs in whatever order they come.
        let mut waiting: std::collections::HashSet<String> =
            events.iter().map(|e| e.id_hex()).collect();
        while !waiting.is_empty() {
            let m = publisher.expect("OK").await;
            assert_eq!(m[2], true, "{m}");
            waiting.remove(m[1].as_str().unwrap());
        }
    }
    // The stalled one was dropped for its queue's bytes, nobody else.
    for _ in 0..200 {
        if relay.metric("sluice_live_queue_full_total", &[]).await >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(relay.metric("sluice_live_queue_full_total", &[]).await, 1.0);
    assert!(publisher.publish(&ev(8, t, 1, &[], "after")).await.0);
}

#[tokio::test]
async fn operator_endpoints_answer_only_direct_connections_from_allowed_addresses() {
    let relay = Relay::start_with(&[("SLUICE_METRICS__ALLOW_FROM", r#"["127.0.0.1/32"]"#)]);
    // Direct, from an allowed address.
    let (status, _, body) = http_get(&relay.addr, "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(body.contains("sluice_build_info"));
    // Another address, or through a proxy: 403, for both endpoints.
    for path in ["/metrics", "/api/throttle"] {
        let (status, _, body) = http_get_with(&relay.addr, path, Some("127.0.0.6"), &[]).await;
        assert_eq!(status, 403, "{path}: {body}");
        let (status, _, _) = http_get_with(
            &relay.addr,
            path,
            Some("127.0.0.1"),
            &[("X-Forwarded-For", "203.0.113.9")],
        )
        .await;
        assert_eq!(status, 403, "{path} through a proxy");
    }
    assert_eq!(
        relay
            .metric("sluice_operator_requests_refused_total", &[])
            .await,
        4.0
    );
    // The relay's public endpoints are unaffected.
    let (status, _, _) = http_get_with(&relay.addr, "/healthz", Some("127.0.0.6"), &[]).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_connection_with_nothing_open_is_closed_when_idle_and_others_are_not() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let relay = Relay::start_with(&[("SLUICE_SERVER__IDLE_TIMEOUT_MS", "300")]);
    let mut subscribed = relay.client().await;
    subscribed.req("s", &[json!({"kinds": [1]})]).await;
    let (mut idle, _) = tokio_tungstenite::connect_async(relay.url()).await.unwrap();
    // The AUTH challenge sent at connect comes first.
    let first = loop {
        match tokio::time::timeout(ANSWER_TIMEOUT, idle.next())
            .await
            .expect("closed in time")
        {
            Some(Ok(Message::Text(t))) if t.starts_with("[\"AUTH\"") => continue,
            other => break other,
        }
    };
    match first {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.reason.as_str(), "idle"),
        other => panic!("expected a Close for idleness, got {other:?}"),
    }
    // The one holding a subscription is still served, and receives live events.
    let mut p = relay.client().await;
    assert!(p.publish(&ev(1, now(), 1, &[], "live")).await.0);
    assert_eq!(subscribed.expect("EVENT").await[1], "s");
    // (The publisher may be closed for idleness too by now.)
    assert!(
        relay
            .metric("sluice_connections_closed_total", &["reason=\"idle\""])
            .await
            >= 1.0
    );
}

/// A frame over the WebSocket layer's bound (twice
/// `limits.max_message_bytes`) is told apart by its error's type, not its
/// wording: the client is told why (NOTICE, then Close 1009) and the close
/// is counted as `message_too_large`, not as a protocol error.
#[tokio::test]
async fn a_frame_over_the_hard_bound_is_answered_and_counted_as_too_large() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let relay = Relay::start_with(&[("SLUICE_LIMITS__MAX_MESSAGE_BYTES", "4096")]);
    let (mut ws, _) = tokio_tungstenite::connect_async(relay.url()).await.unwrap();
    ws.send(Message::Text("x".repeat(20_000).into()))
        .await
        .unwrap();
    let (mut notice, mut code) = (None, None);
    loop {
        match tokio::time::timeout(ANSWER_TIMEOUT, ws.next())
            .await
            .expect("an answer in time")
        {
            Some(Ok(Message::Text(t))) if t.starts_with("[\"AUTH\"") => {}
            Some(Ok(Message::Text(t))) => notice = Some(t.to_string()),
            Some(Ok(Message::Close(frame))) => {
                code = frame.map(|f| f.code);
                break;
            }
            Some(Ok(_)) => {}
            // The relay never read the frame's payload, so its socket may
            // be reset before the answer is read.
            Some(Err(_)) | None => break,
        }
    }
    if let Some(text) = notice {
        let expected = json!(["NOTICE", "invalid: message too large, closing"]);
        assert_eq!(text, expected.to_string());
    }
    if let Some(code) = code {
        assert_eq!(code, CloseCode::Size);
    }
    let closed = |reason: &'static str| {
        let relay = &relay;
        async move {
            let label = format!("reason=\"{reason}\"");
            // Absent until the first such close.
            relay
                .metric_or_zero("sluice_connections_closed_total", &[label.as_str()])
                .await
        }
    };
    let deadline = std::time::Instant::now() + ANSWER_TIMEOUT;
    while closed("message_too_large").await < 1.0 {
        assert!(std::time::Instant::now() < deadline, "not counted in time");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(closed("protocol_error").await, 0.0);
}
