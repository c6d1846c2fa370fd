use super::*;

#[test]
fn auth_takes_one_event_and_the_relay_sends_its_challenge() {
    let ev = crate::Event::sign(&[3; 32], 1, 22242, vec![], "");
    match ClientMessage::parse(&format!("[\"AUTH\",{}]", ev.raw())) {
        Ok(ClientMessage::Auth(e)) => assert_eq!(e.id, ev.id),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ClientMessage::parse("[\"AUTH\",\"challenge\"]"),
        Err(MessageError::BadEvent { .. })
    ));
    assert!(matches!(
        ClientMessage::parse("[\"AUTH\"]"),
        Err(MessageError::Malformed(_))
    ));
    let v: serde_json::Value = serde_json::from_str(&RelayMessage::auth("a\"b")).unwrap();
    assert_eq!(v, serde_json::json!(["AUTH", "a\"b"]));
}

#[test]
fn event_keeps_raw_bytes() {
    let ev = Event::sign(&[9u8; 32], 1_700_000_000, 1, vec![], "x");
    let spaced = ev.raw().replace(",\"", ", \"");
    let msg = format!("[\"EVENT\", {spaced} ]");
    match ClientMessage::parse(&msg).unwrap() {
        ClientMessage::Event(e) => assert_eq!(e.raw(), spaced),
        other => panic!("{other:?}"),
    }
}

#[test]
fn req_with_bad_filter_names_its_subscription() {
    let err = ClientMessage::parse(r#"["REQ","s1",{"kinds":"x"}]"#).unwrap_err();
    assert!(matches!(err, MessageError::BadFilter { ref sub_id, .. } if sub_id == "s1"));
}

#[test]
fn malformed_and_unknown() {
    assert!(matches!(
        ClientMessage::parse("nope"),
        Err(MessageError::Malformed(_))
    ));
    assert!(matches!(
        ClientMessage::parse("[]"),
        Err(MessageError::Malformed(_))
    ));
    assert!(matches!(
        ClientMessage::parse("[1]"),
        Err(MessageError::Malformed(_))
    ));
    assert!(matches!(
        ClientMessage::parse(r#"["HELLO"]"#),
        Err(MessageError::UnknownType(_))
    ));
    assert!(matches!(
        ClientMessage::parse(r#"["REQ",""]"#),
        Err(MessageError::BadSubId)
    ));
    assert!(matches!(
        ClientMessage::parse(r#"["CLOSE",5]"#),
        Err(MessageError::BadSubId)
    ));
}

#[test]
fn bad_event_still_yields_its_id() {
    let id = "ab".repeat(32);
    let msg = format!(r#"["EVENT",{{"id":"{id}","kind":"x"}}]"#);
    match ClientMessage::parse(&msg).unwrap_err() {
        MessageError::BadEvent { id: Some(got), .. } => assert_eq!(got, id),
        other => panic!("{other:?}"),
    }
}

/// JSON forbids raw control characters in strings and escapes it does
/// not list; such an EVENT is refused, but as an EVENT: with its id
/// when it can be read (OK false), else without (a NOTICE).
#[test]
fn an_event_that_is_not_json_is_still_an_event() {
    let ev = Event::sign(&[9u8; 32], 1_700_000_000, 1, vec![], "a\tb\nc");
    let id = ev.id_hex();
    // The escapes written as the raw characters (as relay-tester's
    // "literals for JSON escape sequences" does), and a bad escape.
    for raw in [
        ev.raw().replace("\\t", "\t").replace("\\n", "\n"),
        ev.raw().replace("\\t", "\\c"),
    ] {
        assert!(serde_json::from_str::<serde_json::Value>(&raw).is_err());
        for msg in [
            format!("[\"EVENT\",{raw}]"),
            format!(" [ \"EVENT\" ,\n{raw}]"),
        ] {
            match ClientMessage::parse(&msg).unwrap_err() {
                MessageError::BadEvent {
                    id: got,
                    error: EventError::Malformed(why),
                } => {
                    assert_eq!(got.as_deref(), Some(id.as_str()), "{msg:?}");
                    assert!(!why.is_empty());
                }
                other => panic!("{msg:?}: {other:?}"),
            }
        }
        match ClientMessage::parse(&format!("[\"AUTH\",{raw}]")).unwrap_err() {
            MessageError::BadEvent { id: Some(got), .. } => assert_eq!(got, id),
            other => panic!("{other:?}"),
        }
    }
    // No id to read: still a bad event (answered with a NOTICE).
    assert!(matches!(
        ClientMessage::parse("[\"EVENT\",{\"content\":\"a\u{1}b\"}]"),
        Err(MessageError::BadEvent { id: None, .. })
    ));
    // An extra element: the id is still read.
    let msg = format!("[\"EVENT\",{},1]", ev.raw());
    assert!(matches!(
        ClientMessage::parse(&msg),
        Err(MessageError::BadEvent { id: Some(ref got), .. }) if *got == id
    ));
    // Other types that are not JSON stay malformed messages.
    for msg in [
        "[\"REQ\",\"a\u{1}\"]",
        "[\"EV\\u0045NT\",{\"id\":\"ab\"",
        "nope",
    ] {
        assert!(
            matches!(ClientMessage::parse(msg), Err(MessageError::Malformed(_))),
            "{msg:?}"
        );
    }
}

/// An OK's first element is an event id (64 hex characters), so only
/// such an id is read out of a bad event; without one the message is
/// answered with a NOTICE.
#[test]
fn a_bad_event_names_its_id_only_when_it_is_64_hex() {
    let id = "0123456789abcdef".repeat(4);
    let read = |raw: &str| sniff_id(raw);
    // Truncated after a full id (its closing quote): read.
    assert_eq!(read(&format!(r#"{{"id": "{id}", "#)), Some(id.clone()));
    assert_eq!(read(&format!(r#"{{"id":"{id}""#)), Some(id.clone()));
    // Truncated after a short id.
    assert_eq!(read(r#"{"id": "abc", "#), None);
    // Cut inside the id, or after its 64th character before its quote
    // (the id may go on).
    assert_eq!(read(&format!(r#"{{"id":"{}"#, &id[..40])), None);
    assert_eq!(read(&format!(r#"{{"id":"{id}"#)), None);
    // One character short, one too many.
    assert_eq!(read(&format!(r#"{{"id":"{}"}}"#, &id[..63])), None);
    assert_eq!(read(&format!(r#"{{"id":"{id}0"}}"#)), None);
    // Not a string.
    assert_eq!(read(r#"{"id":5,"kind":1}"#), None);
    assert_eq!(read(&format!(r#"{{"id":["{id}"]}}"#)), None);
    assert_eq!(read(r#"{"id":"#), None);
    // Not hex, a character straddling the 64th byte; uppercase hex is
    // echoed as sent (the event itself is refused).
    assert_eq!(read(&format!(r#"{{"id":"{}g"}}"#, &id[..63])), None);
    assert_eq!(
        read(&format!(r#"{{"id":"{}"}}"#, id.to_uppercase())),
        Some(id.to_uppercase())
    );
    assert_eq!(read(&format!("{{\"id\":\"{}\u{e9}\"}}", &id[..63])), None);
    assert_eq!(read(r#"{"id":"<script>"}"#), None);
    // `"id"` as a tag value or inside a string is not the key.
    let tagged = format!(r#"{{"tags":[["x","id"]],"content":"\"id\"","id" : "{id}"}}"#);
    assert_eq!(read(&tagged), Some(id.clone()));
    assert_eq!(read(r#"{"tags":[["id"]]}"#), None);

    // Through the parser: an EVENT or AUTH cut after a short id, or
    // with a 63-character id, has no id to answer with.
    for msg in [
        r#"["EVENT", {"id": "abc", "#.to_string(),
        r#"["AUTH",{"id":"abc","#.to_string(),
        format!(
            r#"["EVENT",{{"content":"has \"id\" inside","id":"{}","kind":1}}]"#,
            &id[..63]
        ),
    ] {
        assert!(
            matches!(
                ClientMessage::parse(&msg),
                Err(MessageError::BadEvent { id: None, .. })
            ),
            "{msg:?}"
        );
    }
    let cut = format!(r#"["EVENT", {{"id": "{id}", "#);
    match ClientMessage::parse(&cut).unwrap_err() {
        MessageError::BadEvent { id: got, .. } => assert_eq!(got, Some(id.clone())),
        other => panic!("{other:?}"),
    }
}

/// The `type` label of `sluice_messages_received_total` (the REQ
/// refusal-ratio alert and dashboard panel select `type=~"req|count"`).
#[test]
fn each_message_type_has_its_metric_label() {
    let ev = Event::sign(&[3; 32], 1, 1, vec![], "");
    let auth = Event::sign(&[3; 32], 1, 22242, vec![], "");
    for (msg, label) in [
        (format!("[\"EVENT\",{}]", ev.raw()), "event"),
        (r#"["REQ","s",{}]"#.to_string(), "req"),
        (r#"["COUNT","s",{}]"#.to_string(), "count"),
        (r#"["CLOSE","s"]"#.to_string(), "close"),
        (format!("[\"AUTH\",{}]", auth.raw()), "auth"),
        (r#"["NEG-OPEN","n",{},"6100"]"#.to_string(), "neg_open"),
        (r#"["NEG-MSG","n","6100"]"#.to_string(), "neg_msg"),
        (r#"["NEG-CLOSE","n"]"#.to_string(), "neg_close"),
    ] {
        assert_eq!(ClientMessage::parse(&msg).unwrap().type_label(), label);
    }
}

/// NIP-77: `["NEG-OPEN", sub_id, filter, hex]` and `["NEG-MSG", sub_id,
/// hex]`; the hex is handed on as sent.
#[test]
fn negentropy_messages_keep_their_parts() {
    match ClientMessage::parse(r#"["NEG-OPEN","n1",{"kinds":[1]},"61AB00"]"#).unwrap() {
        ClientMessage::NegOpen {
            sub_id,
            filter,
            message,
        } => {
            assert_eq!(sub_id, "n1");
            assert_eq!(filter.kinds, Some(vec![1]));
            assert_eq!(message, "61AB00");
        }
        other => panic!("{other:?}"),
    }
    match ClientMessage::parse(r#"["NEG-MSG","n1","ff00"]"#).unwrap() {
        ClientMessage::NegMsg { sub_id, message } => {
            assert_eq!((sub_id.as_str(), message.as_str()), ("n1", "ff00"));
        }
        other => panic!("{other:?}"),
    }
}

/// A negentropy message that cannot be used is answered NEG-ERR for its
/// subscription: wrong arity, a bad filter, or a message that is not an
/// even-length string of hex digits.
#[test]
fn bad_negentropy_messages_name_their_subscription() {
    let neg_err = |msg: &str| match ClientMessage::parse(msg) {
        Err(MessageError::BadNeg { sub_id, error }) => {
            assert_eq!(sub_id, "n1", "{msg}");
            error
        }
        other => panic!("{msg}: {other:?}"),
    };
    for msg in [
        r#"["NEG-OPEN","n1",{}]"#,
        r#"["NEG-OPEN","n1",{},"00","00"]"#,
        r#"["NEG-MSG","n1"]"#,
        r#"["NEG-MSG","n1","00","00"]"#,
    ] {
        assert!(neg_err(msg).contains("takes"), "{msg}");
    }
    assert!(neg_err(r#"["NEG-OPEN","n1",{"kinds":"x"},"00"]"#).contains("kinds"));
    for bad in [r#""abc""#, r#""0g""#, r#""zz""#, r#""00 0""#, "0", "[]"] {
        for msg in [
            format!(r#"["NEG-OPEN","n1",{{}},{bad}]"#),
            format!(r#"["NEG-MSG","n1",{bad}]"#),
        ] {
            assert_eq!(neg_err(&msg), "message must be a hex string", "{msg}");
        }
    }
}

/// The NOTICE for an unknown type echoes it, cut to 32 characters.
#[test]
fn an_unknown_type_is_named_in_at_most_32_characters() {
    assert_eq!(
        ClientMessage::parse(r#"["HELLO"]"#).unwrap_err(),
        MessageError::UnknownType("HELLO".into())
    );
    let long = "é".repeat(40);
    assert_eq!(
        ClientMessage::parse(&format!("[\"{long}\"]")).unwrap_err(),
        MessageError::UnknownType("é".repeat(32))
    );
}

#[test]
fn negentropy_answers_are_framed_as_nip77_says() {
    assert_eq!(
        RelayMessage::neg_msg("n\"1", "61ab"),
        r#"["NEG-MSG","n\"1","61ab"]"#
    );
    assert_eq!(
        RelayMessage::neg_err("n1", "closed: no such session"),
        r#"["NEG-ERR","n1","closed: no such session"]"#
    );
}

#[test]
fn an_event_message_is_its_prefix_the_event_and_a_bracket() {
    for sub in ["s", "a\"b", "ü\\x"] {
        let raw = r#"{"id":"x"}"#;
        assert_eq!(
            RelayMessage::event(sub, raw),
            format!("{}{raw}]", RelayMessage::event_prefix(sub))
        );
    }
    assert_eq!(RelayMessage::event_prefix("s"), r#"["EVENT","s","#);
}

#[test]
fn relay_messages_are_valid_json() {
    for s in [
        RelayMessage::event("a\"b", "{}"),
        RelayMessage::ok(&"01".repeat(32), false, "invalid: \"x\""),
        RelayMessage::eose("s"),
        RelayMessage::closed("s", "rate-limited: slow down"),
        RelayMessage::notice("hi"),
        RelayMessage::count("s", 3, false),
        RelayMessage::count("s", 3, true),
    ] {
        serde_json::from_str::<serde_json::Value>(&s).unwrap();
    }
}

#[test]
fn a_count_says_approximate_only_when_it_is() {
    let exact: serde_json::Value =
        serde_json::from_str(&RelayMessage::count("c", 7, false)).unwrap();
    assert_eq!(exact, serde_json::json!(["COUNT", "c", {"count": 7}]));
    let cut: serde_json::Value = serde_json::from_str(&RelayMessage::count("c", 9, true)).unwrap();
    assert_eq!(
        cut,
        serde_json::json!(["COUNT", "c", {"count": 9, "approximate": true}])
    );
}
