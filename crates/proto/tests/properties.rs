//! Property tests of the protocol layer (proptest, stable Rust): the parser
//! never panics and answers every input, valid messages keep their parts, events round-trip and verify
//! whatever their strings hold, unsigned fields never change what is kept,
//! the canonical serialization is the one JSON libraries produce, and
//! filter matching agrees with a naive matcher written from NIP-01's words.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_proto::{ClientMessage, Event, Filter, hex32};

const SK: [u8; 32] = [3u8; 32];

/// Any string, controls and astral characters included.
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..40).prop_map(|c| c.into_iter().collect())
}

/// A string without the control characters NIP-01 writes raw (all but
/// its seven escapes).
fn ordinary_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        any::<char>().prop_filter("ordinary", |c| *c >= ' ' || "\n\r\t\u{8}\u{c}".contains(*c)),
        0..40,
    )
    .prop_map(|c| c.into_iter().collect())
}

/// Tags: a few, each a name and a few values.
fn tags() -> impl Strategy<Value = Vec<Vec<String>>> {
    proptest::collection::vec(proptest::collection::vec(text(), 1..4), 0..5)
}

/// Arbitrary JSON, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_parser_answers_any_text_without_panicking(s in text()) {
        let _ = ClientMessage::parse(&s);
    }

    #[test]
    fn valid_messages_keep_their_parts(
        sub in text().prop_filter("non-empty", |s| !s.is_empty()),
        content in text(),
        tags in tags(),
        created_at in 0u64..=u64::from(u32::MAX),
        kind in any::<u16>(),
        auth in any::<bool>(),
    ) {
        let close = json!(["CLOSE", sub]).to_string();
        match ClientMessage::parse(&close) {
            Ok(ClientMessage::Close { sub_id }) => prop_assert_eq!(sub_id, sub.clone()),
            other => prop_assert!(false, "{:?}", other),
        }
        let req = json!(["REQ", sub, {"kinds": [kind], "since": created_at}, {}]).to_string();
        match ClientMessage::parse(&req) {
            Ok(ClientMessage::Req { sub_id, filters }) => {
                prop_assert_eq!(sub_id, sub);
                prop_assert_eq!(filters.len(), 2);
                prop_assert_eq!(filters[0].kinds.as_deref(), Some(&[kind][..]));
            }
            other => prop_assert!(false, "{:?}", other),
        }
        let ev = Event::sign(&SK, created_at, kind, tags, &content);
        let label = if auth { "AUTH" } else { "EVENT" };
        match ClientMessage::parse(&format!("[\"{label}\",{}]", ev.raw())) {
            Ok(ClientMessage::Event(e)) | Ok(ClientMessage::Auth(e)) => {
                prop_assert_eq!(e.raw(), ev.raw());
                prop_assert!(e.verify().is_ok());
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn the_parser_answers_any_json_message_without_panicking(
        kind in prop_oneof![Just("EVENT"), Just("REQ"), Just("COUNT"), Just("CLOSE"), Just("AUTH"), Just("X")],
        rest in proptest::collection::vec(json_value(), 0..4),
    ) {
        let mut msg = vec![json!(kind)];
        msg.extend(rest);
        let _ = ClientMessage::parse(&Value::Array(msg).to_string());
    }

    #[test]
    fn a_signed_event_round_trips_and_verifies_whatever_its_strings(
        created_at in 0u64..4_000_000_000,
        kind in any::<u16>(),
        tags in tags(),
        content in text(),
    ) {
        let ev = Event::sign(&SK, created_at, kind, tags.clone(), &content);
        let back = Event::parse(ev.raw()).unwrap();
        prop_assert_eq!(back.raw(), ev.raw());
        prop_assert_eq!(&back.tags, &tags);
        prop_assert_eq!(&back.content, &content);
        back.verify().unwrap();
    }

    #[test]
    fn unsigned_fields_change_nothing_that_is_kept(
        content in text(),
        extra in proptest::collection::btree_map("[a-z_]{1,8}", json_value(), 1..4),
    ) {
        let ev = Event::sign(&SK, 1_700_000_000, 1, vec![vec!["t".into(), "x".into()]], &content);
        let mut v: serde_json::Map<String, Value> = serde_json::from_str(ev.raw()).unwrap();
        for (k, val) in extra {
            if !["id", "pubkey", "created_at", "kind", "tags", "content", "sig"].contains(&k.as_str()) {
                v.insert(k, val);
            }
        }
        let with = Value::Object(v).to_string();
        let kept = Event::parse(&with).unwrap();
        kept.verify().unwrap();
        let clean = Event::parse(kept.raw()).unwrap();
        prop_assert_eq!(clean.raw(), kept.raw());
        prop_assert_eq!(&clean.content, &content);
        let object: serde_json::Map<String, Value> = serde_json::from_str(kept.raw()).unwrap();
        prop_assert_eq!(object.len(), 7);
    }

    #[test]
    fn the_canonical_form_is_what_json_libraries_write_for_ordinary_text(
        tags in proptest::collection::vec(proptest::collection::vec(ordinary_text(), 1..4), 0..5),
        content in ordinary_text(),
    ) {
        // NIP-01 writes controls other than its seven escapes raw; JSON
        // libraries escape them. Outside those, both must agree.
        let ev = Event::sign(&SK, 1_700_000_000, 1, tags.clone(), &content);
        let library = serde_json::to_vec(&json!([0, hex32::encode(&ev.pubkey), 1_700_000_000u64, 1, tags, content])).unwrap();
        prop_assert_eq!(String::from_utf8(ev.canonical_json()).unwrap(), String::from_utf8(library).unwrap());
    }

    #[test]
    fn filter_matching_agrees_with_a_naive_matcher(
        filter in naive_filter(),
        event in naive_event(),
    ) {
        let parsed = Filter::from_value(&filter).unwrap();
        let ev = Event::sign(&key(event.author), event.created_at, event.kind, event.tags.clone(), "");
        prop_assert_eq!(parsed.matches(&ev), naive_matches(&filter, &ev));
    }
}

#[derive(Debug)]
struct Naive {
    author: u8,
    created_at: u64,
    kind: u16,
    tags: Vec<Vec<String>>,
}

fn key(n: u8) -> [u8; 32] {
    let mut k = [n.max(1); 32];
    k[0] = 1;
    k
}

fn naive_event() -> impl Strategy<Value = Naive> {
    (
        1u8..4,
        0u64..20,
        prop_oneof![Just(0u16), Just(1), Just(7)],
        proptest::collection::vec(
            (
                prop_oneof![Just("e"), Just("p"), Just("t"), Just("tt")],
                prop_oneof![Just("a"), Just("b"), Just("c")],
            )
                .prop_map(|(n, v)| vec![n.to_string(), v.to_string()]),
            0..4,
        ),
    )
        .prop_map(|(author, created_at, kind, tags)| Naive {
            author,
            created_at,
            kind,
            tags,
        })
}

fn naive_filter() -> impl Strategy<Value = Value> {
    let authors = proptest::collection::vec(1u8..5, 0..3).prop_map(|a| {
        json!(
            a.iter()
                .map(|n| hex32::encode(&sluice_proto::event::public_key_of(&key(*n))))
                .collect::<Vec<_>>()
        )
    });
    let kinds = proptest::collection::vec(prop_oneof![Just(0u16), Just(1), Just(7), Just(3)], 0..3)
        .prop_map(|k| json!(k));
    let values = proptest::collection::vec(prop_oneof![Just("a"), Just("b"), Just("z")], 0..3)
        .prop_map(|v| json!(v));
    (
        proptest::option::of(authors),
        proptest::option::of(kinds),
        proptest::option::of(values.clone()),
        proptest::option::of(values),
        proptest::option::of(0u64..20),
        proptest::option::of(0u64..20),
    )
        .prop_map(|(authors, kinds, t, p, since, until)| {
            let mut f = serde_json::Map::new();
            if let Some(a) = authors {
                f.insert("authors".into(), a);
            }
            if let Some(k) = kinds {
                f.insert("kinds".into(), k);
            }
            if let Some(t) = t {
                f.insert("#t".into(), t);
            }
            if let Some(p) = p {
                f.insert("#p".into(), p);
            }
            if let Some(s) = since {
                f.insert("since".into(), json!(s));
            }
            if let Some(u) = until {
                f.insert("until".into(), json!(u));
            }
            Value::Object(f)
        })
}

/// NIP-01, read literally: every field present must hold; a list holds when
/// the event's value is in it; `#x` holds when some tag named `x` has its
/// first value in the list; since <= created_at <= until.
fn naive_matches(f: &Value, ev: &Event) -> bool {
    let f = f.as_object().unwrap();
    let in_list = |key: &str, value: Value| {
        f.get(key)
            .is_none_or(|l| l.as_array().unwrap().contains(&value))
    };
    in_list("authors", json!(hex32::encode(&ev.pubkey)))
        && in_list("kinds", json!(ev.kind))
        && f.get("since")
            .is_none_or(|s| ev.created_at >= s.as_u64().unwrap())
        && f.get("until")
            .is_none_or(|u| ev.created_at <= u.as_u64().unwrap())
        && f.iter()
            .filter(|(k, _)| k.starts_with('#'))
            .all(|(k, list)| {
                let name = &k[1..];
                ev.tags.iter().any(|t| {
                    t.first().is_some_and(|n| n == name)
                        && t.get(1)
                            .is_some_and(|v| list.as_array().unwrap().contains(&json!(v)))
                })
            })
}
