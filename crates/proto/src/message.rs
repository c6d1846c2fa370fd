//! Client messages in, relay messages out.
//!
//! Parsing splits the top-level array into raw elements first, so an EVENT
//! keeps the exact bytes of its event object, and a REQ whose filter is bad
//! can still be answered with CLOSED for its subscription id.

use serde_json::value::RawValue;

use crate::event::short_serde_error;
use crate::{Event, EventError, Filter, FilterError};

/// A message from a client.
#[derive(Debug)]
pub enum ClientMessage {
    Event(Box<Event>),
    Req {
        sub_id: String,
        filters: Vec<Filter>,
    },
    Count {
        sub_id: String,
        filters: Vec<Filter>,
    },
    Close {
        sub_id: String,
    },
    /// NIP-42: a signed kind-22242 event answering the relay's challenge.
    Auth(Box<Event>),
    /// NIP-77: open a negentropy reconciliation over the events matching
    /// `filter`; `message` is the client's first message, hex.
    NegOpen {
        sub_id: String,
        filter: Box<Filter>,
        message: String,
    },
    /// NIP-77: the next message of a reconciliation, hex.
    NegMsg {
        sub_id: String,
        message: String,
    },
    NegClose {
        sub_id: String,
    },
}

impl ClientMessage {
    /// Label for metrics (a closed set).
    pub fn type_label(&self) -> &'static str {
        match self {
            ClientMessage::Event(_) => "event",
            ClientMessage::Req { .. } => "req",
            ClientMessage::Count { .. } => "count",
            ClientMessage::Close { .. } => "close",
            ClientMessage::Auth(_) => "auth",
            ClientMessage::NegOpen { .. } => "neg_open",
            ClientMessage::NegMsg { .. } => "neg_msg",
            ClientMessage::NegClose { .. } => "neg_close",
        }
    }
}

/// Why a client message could not be taken. The variant says how to answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Not JSON, not an array, or missing the type: answer with NOTICE.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A type this relay does not implement: answer with NOTICE.
    #[error("unsupported message type {0}")]
    UnknownType(String),
    /// An EVENT whose event is bad; `id` is its id when it could be read, so
    /// the answer can be an OK false.
    #[error("{error}")]
    BadEvent {
        id: Option<String>,
        error: EventError,
    },
    /// A REQ or COUNT with a bad filter: answer with CLOSED for `sub_id`.
    #[error("{error}")]
    BadFilter { sub_id: String, error: FilterError },
    /// A REQ/COUNT/CLOSE without a usable subscription id.
    #[error("subscription id must be a non-empty string")]
    BadSubId,
    /// A NEG-OPEN or NEG-MSG that cannot be used: answer with NEG-ERR.
    #[error("{error}")]
    BadNeg { sub_id: String, error: String },
}

impl ClientMessage {
    /// Parses one WebSocket text message.
    pub fn parse(text: &str) -> Result<ClientMessage, MessageError> {
        // Splitting into raw parts walks nesting iteratively (linear, no
        // stack); each part's own parser bounds its depth (`Event::parse`,
        // `Filter::parse`).
        let parts: Vec<&RawValue> = match serde_json::from_str(text) {
            Ok(parts) => parts,
            // Text that is not JSON (a raw control character or a bad
            // escape inside a string, say) is still an EVENT or AUTH when
            // it says so: it gets its OK false whenever its id can be read.
            Err(e) if matches!(leading_type(text), Some("EVENT" | "AUTH")) => {
                return Err(MessageError::BadEvent {
                    id: sniff_id(text),
                    error: EventError::Malformed(short_serde_error(&e)),
                });
            }
            Err(e) => return Err(MessageError::Malformed(short_serde_error(&e))),
        };
        let Some(first) = parts.first() else {
            return Err(MessageError::Malformed("empty array".into()));
        };
        let kind: String = serde_json::from_str(first.get())
            .map_err(|_| MessageError::Malformed("message type must be a string".into()))?;
        match kind.as_str() {
            "EVENT" => {
                if parts.len() != 2 {
                    return Err(MessageError::BadEvent {
                        id: parts.get(1).and_then(|raw| sniff_id(raw.get())),
                        error: EventError::Malformed("EVENT takes exactly one event".into()),
                    });
                }
                let raw = parts[1].get();
                Event::parse(raw)
                    .map(|e| ClientMessage::Event(Box::new(e)))
                    .map_err(|error| MessageError::BadEvent {
                        id: sniff_id(raw),
                        error,
                    })
            }
            "REQ" | "COUNT" => {
                let sub_id = sub_id(parts.get(1))?;
                let filters = parts[2..]
                    .iter()
                    .map(|raw| Filter::parse(raw.get()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| MessageError::BadFilter {
                        sub_id: sub_id.clone(),
                        error,
                    })?;
                if kind == "REQ" {
                    Ok(ClientMessage::Req { sub_id, filters })
                } else {
                    Ok(ClientMessage::Count { sub_id, filters })
                }
            }
            "AUTH" => {
                if parts.len() != 2 {
                    return Err(MessageError::Malformed(
                        "AUTH takes exactly one event".into(),
                    ));
                }
                let raw = parts[1].get();
                Event::parse(raw)
                    .map(|e| ClientMessage::Auth(Box::new(e)))
                    .map_err(|error| MessageError::BadEvent {
                        id: sniff_id(raw),
                        error,
                    })
            }
            "NEG-OPEN" => {
                let sub_id = sub_id(parts.get(1))?;
                let bad = |error: String| MessageError::BadNeg {
                    sub_id: sub_id.clone(),
                    error,
                };
                if parts.len() != 4 {
                    return Err(bad("NEG-OPEN takes a filter and a message".into()));
                }
                let filter = Filter::parse(parts[2].get()).map_err(|e| bad(e.to_string()))?;
                let message = hex_message(parts[3]).map_err(bad)?;
                Ok(ClientMessage::NegOpen {
                    sub_id,
                    filter: Box::new(filter),
                    message,
                })
            }
            "NEG-MSG" => {
                let sub_id = sub_id(parts.get(1))?;
                if parts.len() != 3 {
                    return Err(MessageError::BadNeg {
                        sub_id,
                        error: "NEG-MSG takes one message".into(),
                    });
                }
                match hex_message(parts[2]) {
                    Ok(message) => Ok(ClientMessage::NegMsg { sub_id, message }),
                    Err(error) => Err(MessageError::BadNeg { sub_id, error }),
                }
            }
            "NEG-CLOSE" => Ok(ClientMessage::NegClose {
                sub_id: sub_id(parts.get(1))?,
            }),
            "CLOSE" => Ok(ClientMessage::Close {
                sub_id: sub_id(parts.get(1))?,
            }),
            other => Err(MessageError::UnknownType(truncate(other, 32))),
        }
    }
}

/// A NIP-77 message: a string of hex digits, even in length.
fn hex_message(raw: &RawValue) -> Result<String, String> {
    let s: String =
        serde_json::from_str(raw.get()).map_err(|_| "message must be a hex string".to_string())?;
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("message must be a hex string".into());
    }
    Ok(s)
}

fn sub_id(raw: Option<&&RawValue>) -> Result<String, MessageError> {
    let raw = raw.ok_or(MessageError::BadSubId)?;
    let s: String = serde_json::from_str(raw.get()).map_err(|_| MessageError::BadSubId)?;
    if s.is_empty() {
        return Err(MessageError::BadSubId);
    }
    Ok(s)
}

/// Reads the `"id"` string out of an event text without parsing it, so a
/// refusal of a malformed or oversized event can still name the event.
/// Returns the text as sent when it is 1-64 ASCII letters and digits
/// (anything else is not worth echoing).
pub fn sniff_id(raw: &str) -> Option<String> {
    let mut from = 0;
    while let Some(at) = raw[from..].find("\"id\"") {
        let after = from + at + 4;
        from = after;
        let Some(rest) = raw[after..].trim_start().strip_prefix(':') else {
            continue;
        };
        let rest = rest.trim_start().strip_prefix('"')?;
        let end = rest.find('"')?;
        let id = &rest[..end];
        let plausible =
            (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric());
        return plausible.then(|| id.to_owned());
    }
    None
}

/// The type of a message that may not be valid JSON: the first element of
/// its top-level array when that is a string without escapes.
fn leading_type(text: &str) -> Option<&str> {
    let rest = text
        .trim_start()
        .strip_prefix('[')?
        .trim_start()
        .strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    rest[end..].starts_with('"').then(|| &rest[..end])
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// Relay-to-client messages, serialized straight to text.
pub struct RelayMessage;

impl RelayMessage {
    /// `["EVENT", sub_id, <raw event>]`; the event JSON is copied as stored.
    pub fn event(sub_id: &str, raw_event: &str) -> String {
        let sid = json_str(sub_id);
        let mut s = String::with_capacity(12 + sid.len() + raw_event.len());
        s.push_str("[\"EVENT\",");
        s.push_str(&sid);
        s.push(',');
        s.push_str(raw_event);
        s.push(']');
        s
    }

    /// `["OK", id, accepted, message]`; `id` is the event id as text.
    pub fn ok(id: &str, accepted: bool, message: &str) -> String {
        format!(
            "[\"OK\",{},{},{}]",
            json_str(id),
            accepted,
            json_str(message)
        )
    }

    pub fn eose(sub_id: &str) -> String {
        format!("[\"EOSE\",{}]", json_str(sub_id))
    }

    pub fn closed(sub_id: &str, message: &str) -> String {
        format!("[\"CLOSED\",{},{}]", json_str(sub_id), json_str(message))
    }

    pub fn notice(message: &str) -> String {
        format!("[\"NOTICE\",{}]", json_str(message))
    }

    /// `["NEG-MSG", sub_id, hex]` (NIP-77).
    pub fn neg_msg(sub_id: &str, message_hex: &str) -> String {
        format!(
            "[\"NEG-MSG\",{},{}]",
            json_str(sub_id),
            json_str(message_hex)
        )
    }

    /// `["NEG-ERR", sub_id, reason]` (NIP-77).
    pub fn neg_err(sub_id: &str, reason: &str) -> String {
        format!("[\"NEG-ERR\",{},{}]", json_str(sub_id), json_str(reason))
    }

    /// `["AUTH", challenge]` (NIP-42).
    pub fn auth(challenge: &str) -> String {
        format!("[\"AUTH\",{}]", json_str(challenge))
    }

    /// `["COUNT", sub_id, {"count": n}]` (NIP-45); with `approximate`, the
    /// count is a lower bound (the relay stopped counting) and says so:
    /// `{"count": n, "approximate": true}`. An exact count has no such key.
    pub fn count(sub_id: &str, count: u64, approximate: bool) -> String {
        let flag = if approximate {
            ",\"approximate\":true"
        } else {
            ""
        };
        format!(
            "[\"COUNT\",{},{{\"count\":{}{}}}]",
            json_str(sub_id),
            count,
            flag
        )
    }
}

fn json_str(s: &str) -> String {
    // A JSON value's Display cannot fail, unlike `to_string`'s signature.
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn malformed_ids_are_echoed_as_sent() {
        let upper = "AB".repeat(32);
        let msg = format!(r#"["EVENT",{{"content":"has \"id\" inside","id":"{upper}","kind":1}}]"#);
        match ClientMessage::parse(&msg).unwrap_err() {
            MessageError::BadEvent { id, .. } => assert_eq!(id.as_deref(), Some(upper.as_str())),
            other => panic!("{other:?}"),
        }
        assert_eq!(sniff_id(r#"{"id":"<script>"}"#), None);
        assert_eq!(
            sniff_id(r#"{"tags":[["x","id"]],"id":"abc"}"#).as_deref(),
            Some("abc")
        );
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
        let cut: serde_json::Value =
            serde_json::from_str(&RelayMessage::count("c", 9, true)).unwrap();
        assert_eq!(
            cut,
            serde_json::json!(["COUNT", "c", {"count": 9, "approximate": true}])
        );
    }
}
