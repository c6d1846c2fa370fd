use super::*;

#[test]
fn urls_parse() {
    let u = RelayUrl::parse("ws://127.0.0.1:7777").unwrap();
    assert_eq!((u.host.as_str(), u.port), ("127.0.0.1", 7777));
    assert_eq!(u.http_base(), "http://127.0.0.1:7777");
    let u = RelayUrl::parse("ws://relay.example/x").unwrap();
    assert_eq!((u.host.as_str(), u.port), ("relay.example", 80));
    let u = RelayUrl::parse("ws://[::1]:8080/").unwrap();
    assert_eq!((u.host.as_str(), u.port), ("::1", 8080));
    assert!(RelayUrl::parse("wss://relay.example").is_err());
    assert!(RelayUrl::parse("http://relay.example").is_err());
}

#[test]
fn relay_messages_parse() {
    let id = "ab".repeat(32);
    let ok = format!(r#"["OK","{id}",false,"rate-limited: slow down"]"#);
    assert_eq!(
        Incoming::parse(&ok),
        Incoming::Ok {
            id: [0xab; 32],
            accepted: false,
            message: "rate-limited: slow down".into()
        }
    );
    let ev = format!(r#"["EVENT","s1",{{"content":"x\"y","id":"{id}","tags":[["e","z"]]}}]"#);
    assert_eq!(
        Incoming::parse(&ev),
        Incoming::Event {
            sub: "s1".into(),
            id: [0xab; 32]
        }
    );
    assert_eq!(
        Incoming::parse(r#"["EOSE","s1"]"#),
        Incoming::Eose { sub: "s1".into() }
    );
    assert_eq!(
        Incoming::parse(r#"["CLOSED","s1","error: x"]"#),
        Incoming::Closed {
            sub: "s1".into(),
            message: "error: x".into()
        }
    );
    assert_eq!(
        Incoming::parse(r#"["NOTICE","hi"]"#),
        Incoming::Notice {
            message: "hi".into()
        }
    );
    assert_eq!(Incoming::parse("not json"), Incoming::Other);
    assert_eq!(
        Incoming::parse(r#"["OK","short",true,""]"#),
        Incoming::Other
    );
}

#[test]
fn loopback_spread_stays_in_127_0_0_2_to_254() {
    assert!(loopback_spread(0).unwrap().is_empty());
    let all = loopback_spread(MAX_LOOPBACK_SPREAD).unwrap();
    assert_eq!(all.len(), 253);
    assert_eq!(all[0], IpAddr::from([127, 0, 0, 2]));
    assert_eq!(all[252], IpAddr::from([127, 0, 0, 254]));
    let distinct: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), 253);
    assert!(loopback_spread(254).is_err());
}

#[test]
fn fd_limit_is_raised_to_the_hard_limit() {
    let l = raise_fd_limit().unwrap();
    assert!(l.soft >= l.soft_before);
    assert!(l.soft == l.hard || l.hard == libc::RLIM_INFINITY);
    // Idempotent: a second call finds the soft limit already raised.
    assert_eq!(raise_fd_limit().unwrap().soft_before, l.soft);
}

#[test]
fn event_sub_reads_only_plain_event_messages() {
    assert_eq!(
        Incoming::event_sub(r#"["EVENT","q1",{"id":"ab"}]"#),
        Some("q1")
    );
    assert_eq!(Incoming::event_sub(r#"["EVENT", "q1", {}]"#), None);
    assert_eq!(Incoming::event_sub(r#"["EVENT","q\"1",{}]"#), None);
    assert_eq!(Incoming::event_sub(r#"["EOSE","q1"]"#), None);
    assert_eq!(Incoming::event_sub(r#"["EVENT","q1"]"#), None);
}

#[test]
fn prepared_reads_the_id() {
    let raw = format!(r#"{{"id":"{}","kind":1}}"#, "cd".repeat(32));
    let p = Prepared::from_raw(&raw).unwrap();
    assert_eq!(p.id, [0xcd; 32]);
    assert!(p.message.as_str().starts_with("[\"EVENT\",{"));
}
