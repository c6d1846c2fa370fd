//! The parallel stage of `sluice import`: one line in, one verdict out.
//! A line is an event object or `["EVENT", {...}]` (also the relay form
//! `["EVENT", "sub", {...}]`); it passes the relay's own checks (limits,
//! then id and signature unless verification is off) or is refused with a
//! [`Reason`] from a closed set. [`line`] does all but the signature, which
//! [`check_signature`] does, so the caller can skip it for events the
//! store already holds.
//!
//! Invariant: the event keeps the exact bytes of its object in the line
//! (fields other than NIP-01's seven are dropped, as the relay does), so
//! the store holds what the dump held.

use serde_json::value::RawValue;
use sluice_proto::{Event, EventError, EventLimits, PubkeyCache};

use super::input::{Line, LineKind};

/// Why a line was refused. A closed set: each is a counter in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The source could not be read (or decompressed) past this line.
    InputError,
    /// Longer than `limits.max_message_bytes`.
    LineTooLong,
    InvalidUtf8,
    /// The last line of a source, without a newline, is not valid JSON.
    Truncated,
    InvalidJson,
    /// Valid JSON, but neither an object nor `["EVENT", {...}]`.
    NotAnObject,
    /// An object that is not a well-formed event (fields, hex, kind range).
    MalformedEvent,
    /// The id is not the hash of the event.
    BadId,
    BadSignature,
    TooManyTags,
    ContentTooLong,
    /// created_at too far in the future (`limits.created_at_max_ahead_secs`).
    TooNew,
    /// created_at older than `limits.created_at_max_age_secs`.
    TooOld,
    /// An `expiration` tag that is not a timestamp.
    BadExpiration,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InputError => "input-error",
            Reason::LineTooLong => "line-too-long",
            Reason::InvalidUtf8 => "invalid-utf8",
            Reason::Truncated => "truncated",
            Reason::InvalidJson => "invalid-json",
            Reason::NotAnObject => "not-an-object",
            Reason::MalformedEvent => "malformed-event",
            Reason::BadId => "bad-id",
            Reason::BadSignature => "bad-signature",
            Reason::TooManyTags => "too-many-tags",
            Reason::ContentTooLong => "content-too-long",
            Reason::TooNew => "too-new",
            Reason::TooOld => "too-old",
            Reason::BadExpiration => "bad-expiration",
        }
    }
}

/// What one non-blank line became.
#[derive(Debug)]
pub enum Item {
    /// A valid event, to be written in order.
    Event { line: u64, event: Event },
    /// Valid, but its NIP-40 expiration has passed: not stored.
    Expired,
    /// Refused.
    Bad {
        line: u64,
        reason: Reason,
        detail: String,
    },
}

/// How lines are checked.
#[derive(Debug, Clone, Copy)]
pub struct LineChecks {
    pub limits: EventLimits,
    pub verify: bool,
}

/// Checks one line of `buf`. `None` for a blank line.
pub fn line(buf: &[u8], l: &Line, checks: &LineChecks, now: u64) -> Option<Item> {
    let number = l.number;
    let bad = |reason, detail: String| {
        Some(Item::Bad {
            line: number,
            reason,
            detail,
        })
    };
    match &l.kind {
        LineKind::TooLong { len_bytes } => {
            return bad(
                Reason::LineTooLong,
                format!("{len_bytes} bytes, more than limits.max_message_bytes"),
            );
        }
        LineKind::ReadError(e) => return bad(Reason::InputError, e.clone()),
        LineKind::Complete | LineKind::NoNewline => {}
    }
    let mut bytes = &buf[l.start..l.end];
    if number == 1 {
        bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    }
    let bytes = bytes.trim_ascii();
    if bytes.is_empty() {
        return None;
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return bad(
                Reason::InvalidUtf8,
                format!("invalid UTF-8 at byte {}", e.valid_up_to()),
            );
        }
    };
    let event = match text.as_bytes()[0] {
        b'{' => Event::parse(text).map_err(|e| (e, text)),
        b'[' => match event_in_array(text) {
            Ok(raw) => Event::parse(raw).map_err(|e| (e, raw)),
            Err(detail) => return bad(not_json(text, l).unwrap_or(Reason::NotAnObject), detail),
        },
        _ => {
            let reason = not_json(text, l).unwrap_or(Reason::NotAnObject);
            return bad(reason, preview(text));
        }
    };
    let event = match event {
        Ok(ev) => ev,
        Err((EventError::Malformed(detail), raw)) => {
            return bad(not_json(raw, l).unwrap_or(Reason::MalformedEvent), detail);
        }
        Err((e, _)) => return bad(reason_of(&e), e.to_string()),
    };
    if let Err(e) = event.check_limits(&checks.limits, now) {
        if e == EventError::Expired {
            return Some(Item::Expired);
        }
        return bad(reason_of(&e), e.to_string());
    }
    if checks.verify && event.compute_id() != event.id {
        return bad(Reason::BadId, EventError::IdMismatch.to_string());
    }
    Some(Item::Event {
        line: number,
        event,
    })
}

/// The signature check, the costly part (tens of µs), done after the
/// caller has learnt whether the store already holds the event.
pub fn check_signature(item: &mut Item, keys: &mut PubkeyCache) {
    let Item::Event { line, event } = item else {
        return;
    };
    if let Err(e) = event.verify_cached(keys) {
        *item = Item::Bad {
            line: *line,
            reason: reason_of(&e),
            detail: e.to_string(),
        };
    }
}

/// The event object of `["EVENT", {...}]` or `["EVENT", "sub", {...}]`.
fn event_in_array(text: &str) -> Result<&str, String> {
    let parts: Vec<&RawValue> = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let is_event = parts.first().map(|p| p.get()) == Some("\"EVENT\"");
    let ok_shape = match parts.len() {
        2 => true,
        3 => parts[1].get().starts_with('"'),
        _ => false,
    };
    match parts.last() {
        Some(obj) if is_event && ok_shape => Ok(obj.get()),
        _ => Err(format!(
            "array is not [\"EVENT\", {{...}}]: {}",
            preview(text)
        )),
    }
}

/// `Some` when `text` is not JSON at all: truncated if it is the final line
/// of its source without a newline, else invalid.
fn not_json(text: &str, l: &Line) -> Option<Reason> {
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .is_err()
        .then_some(if l.kind == LineKind::NoNewline {
            Reason::Truncated
        } else {
            Reason::InvalidJson
        })
}

fn reason_of(e: &EventError) -> Reason {
    match e {
        EventError::Malformed(_)
        | EventError::BadIdHex
        | EventError::BadPubkeyHex
        | EventError::BadSigHex
        | EventError::KindRange(_)
        | EventError::TooDeep { .. } => Reason::MalformedEvent,
        EventError::IdMismatch => Reason::BadId,
        EventError::BadSignature => Reason::BadSignature,
        EventError::TooManyTags { .. } => Reason::TooManyTags,
        EventError::ContentTooLong { .. } => Reason::ContentTooLong,
        EventError::TooNew { .. } => Reason::TooNew,
        EventError::TooOld { .. } => Reason::TooOld,
        // Handled before; kept total so a new variant is a compile error.
        EventError::Expired => Reason::MalformedEvent,
        EventError::BadExpiration => Reason::BadExpiration,
    }
}

/// The start of a line, for messages.
fn preview(text: &str) -> String {
    const MAX_CHARS: usize = 60;
    let mut s: String = text.chars().take(MAX_CHARS).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, kind: LineKind) -> Option<Item> {
        let l = Line {
            number: 7,
            start: 0,
            end: text.len(),
            kind,
        };
        let checks = LineChecks {
            limits: EventLimits::default(),
            verify: true,
        };
        let mut item = line(text.as_bytes(), &l, &checks, 1_700_000_000);
        if let Some(item) = &mut item {
            check_signature(item, &mut PubkeyCache::new(4));
        }
        item
    }

    fn reason(text: &str) -> Reason {
        match check(text, LineKind::Complete) {
            Some(Item::Bad { reason, .. }) => reason,
            other => panic!("{text}: {other:?}"),
        }
    }

    fn signed() -> Event {
        Event::sign(&[3; 32], 1_699_999_000, 1, vec![], "hi")
    }

    #[test]
    fn objects_and_event_arrays_keep_their_bytes() {
        let e = signed();
        for text in [
            e.raw().to_string(),
            format!("[\"EVENT\", {}]", e.raw()),
            format!("[\"EVENT\",\"sub\",{}]", e.raw()),
            format!("  {}\r", e.raw()),
        ] {
            match check(&text, LineKind::Complete) {
                Some(Item::Event { line: 7, event }) => assert_eq!(event.raw(), e.raw()),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(check("   \t", LineKind::Complete).is_none());
    }

    #[test]
    fn each_kind_of_bad_line_has_its_reason() {
        let e = signed();
        assert_eq!(reason("{\"id\":"), Reason::InvalidJson);
        assert_eq!(reason("42"), Reason::NotAnObject);
        assert_eq!(reason("null"), Reason::NotAnObject);
        assert_eq!(reason("[\"REQ\",\"s\",{}]"), Reason::NotAnObject);
        assert_eq!(reason("nonsense"), Reason::InvalidJson);
        assert_eq!(reason("{\"id\":\"00\"}"), Reason::MalformedEvent);
        assert_eq!(reason(&e.raw().replace("\"hi\"", "\"ho\"")), Reason::BadId);
        let sig = sluice_proto::hex32::encode(&e.sig);
        let mut forged = sig.clone().into_bytes();
        forged[10] = if forged[10] == b'0' { b'1' } else { b'0' };
        let forged = e.raw().replace(&sig, std::str::from_utf8(&forged).unwrap());
        assert_eq!(reason(&forged), Reason::BadSignature);
        let cut = &e.raw()[..40];
        match check(cut, LineKind::NoNewline) {
            Some(Item::Bad { reason, .. }) => assert_eq!(reason, Reason::Truncated),
            other => panic!("{other:?}"),
        }
        // A final line without newline that is complete is fine.
        assert!(matches!(
            check(e.raw(), LineKind::NoNewline),
            Some(Item::Event { .. })
        ));
    }
}
