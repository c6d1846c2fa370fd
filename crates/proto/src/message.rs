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
    /// An EVENT (or AUTH) whose event is bad; `id` is its id when one could
    /// be read (64 hex characters, [`sniff_id`]), so the answer can be an OK
    /// false; `None`: answer with NOTICE.
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
/// refusal of a malformed or oversized event can still name the event in
/// its OK. Returns it, as sent, only when it is 64 hex characters closed by
/// their quote: an OK's first element is an event id, so anything shorter,
/// longer, cut off or not a string is no id, and the message is answered
/// with a NOTICE. An id in uppercase hex (which `Event::parse` refuses) is
/// still one the client can match its OK to, so it is echoed.
pub fn sniff_id(raw: &str) -> Option<String> {
    let mut from = 0;
    while let Some(at) = raw[from..].find("\"id\"") {
        let after = from + at + 4;
        from = after;
        let Some(rest) = raw[after..].trim_start().strip_prefix(':') else {
            continue;
        };
        let (id, tail) = rest.trim_start().strip_prefix('"')?.split_at_checked(64)?;
        let is_id = tail.starts_with('"') && id.bytes().all(|b| b.is_ascii_hexdigit());
        return is_id.then(|| id.to_owned());
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

    /// What comes before the event in [`RelayMessage::event`]
    /// (`["EVENT", sub_id,`); the message is this, the event, then `]`.
    pub fn event_prefix(sub_id: &str) -> String {
        format!("[\"EVENT\",{},", json_str(sub_id))
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
mod tests;
