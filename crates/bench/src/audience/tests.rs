use super::*;

#[test]
fn answers_are_counted_once_per_subscription() {
    let mut t = IdleReport::default();
    let mut w = Waiting::new(3);
    w.on(Incoming::Eose { sub: sub_id(0) }, &mut t);
    w.on(
        Incoming::Closed {
            sub: sub_id(1),
            message: "rate-limited: busy".into(),
        },
        &mut t,
    );
    // A second answer to an answered subscription, and one for a
    // subscription this connection never opened, change no answer count.
    w.on(Incoming::Eose { sub: sub_id(0) }, &mut t);
    w.on(
        Incoming::Eose {
            sub: "other".into(),
        },
        &mut t,
    );
    assert!(!w.is_empty());
    w.on(
        Incoming::Closed {
            sub: sub_id(0),
            message: "error: shutting down".into(),
        },
        &mut t,
    );
    w.on(
        Incoming::Event {
            sub: sub_id(0),
            id: [1; 32],
        },
        &mut t,
    );
    assert_eq!((t.eose, t.closed, t.closed_later, t.events), (1, 1, 1, 1));
    assert_eq!(t.closed_prefixes.0.get("rate-limited"), Some(&1));
    assert_eq!(t.closed_prefixes.total(), 1);
    w.give_up(&mut t);
    assert_eq!(t.unanswered, 1);
    assert!(w.is_empty());
    // Giving up again finds nothing left.
    w.give_up(&mut t);
    assert_eq!(t.unanswered, 1);
}

/// A relay that answers `idle0` with EOSE and `idle1` with CLOSED,
/// leaves the rest unanswered and closes each connection once it has
/// seen its three REQs.
async fn rude_relay() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
                for _ in 0..3 {
                    let Some(Ok(Message::Text(t))) = ws.next().await else {
                        return;
                    };
                    let req: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                    let reply = match req[1].as_str().unwrap() {
                        "idle0" => json!(["EOSE", "idle0"]),
                        "idle1" => json!(["CLOSED", "idle1", "blocked: not here"]),
                        _ => continue,
                    };
                    ws.send(Message::Text(reply.to_string().into()))
                        .await
                        .unwrap();
                }
                let frame = tokio_tungstenite::tungstenite::protocol::CloseFrame {
                    code: 1008.into(),
                    reason: "bye".into(),
                };
                let _ = ws.close(Some(frame)).await;
            });
        }
    });
    format!("ws://{addr}")
}

#[tokio::test]
async fn answers_refusals_and_drops_of_idle_connections_are_counted() {
    let url = rude_relay().await;
    let args = AudienceArgs {
        relay: url.clone(),
        idle: 4,
        reqs_per_idle: 3,
        rate: 1.0,
        duration_secs: 1.0,
        content_bytes: 10,
        relay_pid: None,
        source_addrs: 2,
        answer_timeout_ms: 60_000,
        settle_secs: 0.0,
        drain_ms: 0,
        seed: 1,
        json: None,
    };
    let addrs = wire::loopback_spread(args.source_addrs).unwrap();
    let crowd = Crowd::open(&RelayUrl::parse(&url).unwrap(), &args, &addrs).await;
    let r = crowd.close().await;
    assert_eq!((r.opened, r.connect_failed, r.reqs_sent), (4, 0, 12));
    assert_eq!((r.eose, r.closed, r.unanswered), (4, 4, 4));
    assert_eq!(r.closed_prefixes.0.get("blocked"), Some(&4));
    assert_eq!(r.dropped, 4);
    assert_eq!(r.dropped_reasons.total(), 4);
    assert!(
        r.dropped_reasons.0.keys().all(|k| k.contains("1008 bye")),
        "{:?}",
        r.dropped_reasons
    );
}

#[test]
fn connections_take_the_source_addresses_in_turn() {
    let addrs = wire::loopback_spread(3).unwrap();
    let picked: Vec<_> = (0..7).map(|i| source_for(&addrs, i).unwrap()).collect();
    assert_eq!(picked[0], IpAddr::from([127, 0, 0, 2]));
    assert_eq!(picked[2], IpAddr::from([127, 0, 0, 4]));
    assert_eq!(picked[3], picked[0]);
    assert_eq!(picked[6], picked[0]);
    assert_eq!(source_for(&[], 5), None);
}

#[test]
fn idle_filters_name_distinct_random_authors() {
    let f = idle_filters(&mut Rng::new(1), 10);
    assert_eq!(f.len(), 10);
    let authors: HashSet<&str> = f
        .iter()
        .map(|f| f["authors"][0].as_str().unwrap())
        .collect();
    assert_eq!(authors.len(), 10);
    assert!(authors.iter().all(|a| a.len() == 64));
}
