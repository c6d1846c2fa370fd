//! What must hold of the protocol parsers and the WebSocket layer for any
//! input, shared by the fuzz targets (`src/bin/*`): a failed check panics,
//! which AFL++ records as a crash with the input that caused it.

use sluice_proto::event::{MAX_EVENT_DEPTH, nests_deeper_than};
use sluice_proto::{ClientMessage, Event, Filter};

/// Any text: `ClientMessage::parse` answers without panicking, and an
/// event it yields satisfies [`check_event`].
pub fn client_message(text: &str) {
    match ClientMessage::parse(text) {
        Ok(ClientMessage::Event(ev)) | Ok(ClientMessage::Auth(ev)) => check_event(&ev),
        Ok(ClientMessage::Req { filters, .. }) | Ok(ClientMessage::Count { filters, .. }) => {
            for f in &filters {
                check_filter(f);
            }
        }
        Ok(ClientMessage::Close { sub_id }) | Ok(ClientMessage::NegClose { sub_id }) => {
            assert!(!sub_id.is_empty())
        }
        Ok(ClientMessage::NegOpen {
            filter, message, ..
        }) => {
            check_filter(&filter);
            assert!(message.len() % 2 == 0 && message.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        Ok(ClientMessage::NegMsg { message, .. }) => {
            assert!(message.len() % 2 == 0 && message.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        Err(_) => {}
    }
}

/// Any text: `Event::parse` answers without panicking; what it accepts is
/// no deeper than the bound, and its kept form parses back to the same
/// event with the kept form unchanged.
pub fn event(text: &str) {
    if let Ok(ev) = Event::parse(text) {
        assert!(
            !nests_deeper_than(text, MAX_EVENT_DEPTH),
            "accepted an event nested deeper than {MAX_EVENT_DEPTH}"
        );
        check_event(&ev);
    }
}

/// An accepted event's kept bytes are the event again, and only the seven
/// NIP-01 fields.
pub fn check_event(ev: &Event) {
    let again = Event::parse(ev.raw()).expect("the kept form of an event parses");
    assert_eq!(again.raw(), ev.raw(), "the kept form is a fixed point");
    assert_eq!(
        (again.id, again.pubkey, again.created_at, again.kind, again.sig),
        (ev.id, ev.pubkey, ev.created_at, ev.kind, ev.sig)
    );
    assert_eq!((&again.tags, &again.content), (&ev.tags, &ev.content));
    let obj: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(ev.raw()).expect("the kept form is a JSON object");
    assert_eq!(obj.len(), 7, "only the seven NIP-01 fields are kept");
    // The canonical form is `[0,"<pubkey>",...]` and the id is its hash,
    // the same for the kept form. (It is not always strict JSON: NIP-01
    // writes control characters other than its seven escapes raw.)
    let canon = ev.canonical_json();
    let head = format!("[0,\"{}\",{},{},", sluice_proto::hex32::encode(&ev.pubkey), ev.created_at, ev.kind);
    assert!(canon.starts_with(head.as_bytes()) && canon.ends_with(b"]"));
    assert_eq!(ev.compute_id(), again.compute_id());
    // Verifying answers (true or false) without panicking.
    let _ = ev.verify();
}

/// Any text: `Filter::parse` answers without panicking; a filter it accepts
/// is checked against a few events.
pub fn filter(text: &str) {
    if let Ok(f) = Filter::parse(text) {
        assert!(!nests_deeper_than(text, 2), "accepted a filter nested deeper than 2");
        check_filter(&f);
    }
}

fn check_filter(f: &Filter) {
    let samples = [
        Event::sign(&[1; 32], 0, 0, vec![], ""),
        Event::sign(
            &[2; 32],
            1_700_000_000,
            1,
            vec![vec!["e".into(), "00".repeat(32)], vec!["t".into(), "x".into()]],
            "hello",
        ),
        Event::sign(&[3; 32], u64::from(u32::MAX), 30023, vec![vec!["d".into()]], ""),
    ];
    for ev in &samples {
        let m = f.matches(ev);
        // Matching is a pure function of the filter and the event.
        assert_eq!(m, f.matches(ev));
        if m {
            assert!(f.matches_time(ev.created_at));
        }
    }
}

/// The message bound `ws_frames` reads with, chosen by the input's first
/// byte: a data message's bound, a control frame's (RFC 6455 section 5.5),
/// the relay's usual order of magnitude, and one that lets a deflate bomb
/// inflate far.
pub const WS_MAX_MESSAGE: [usize; 4] = [64, 125, 4096, 1 << 20];
/// The most the reader takes from the stream at once in the second read of
/// `ws_frames` (14: a whole frame header at most), so that frames and
/// headers are split across reads.
pub const WS_READ_SIZE: [usize; 4] = [14, 15, 64, 1000];

/// A client's byte stream after the upgrade, its first byte the settings:
/// bit 0 permessage-deflate agreed, bits 1-2 the bound
/// ([`WS_MAX_MESSAGE`]), bits 3-4 the read size ([`WS_READ_SIZE`]).
/// The reader gives every message and then ends or fails once, never
/// waits on bytes it has, gives only what RFC 6455 allows within the
/// bound ([`check_reads`]), and gives the same however the stream is
/// split into reads; without deflate, a stream read with no error reads
/// the same with deflate agreed (no frame had RSV1).
pub fn ws_frames(data: &[u8]) {
    use sluice_ws::fuzzing::{read_messages, read_messages_with};
    let Some((&settings, stream)) = data.split_first() else {
        return;
    };
    let deflate = settings & 1 != 0;
    let max = WS_MAX_MESSAGE[usize::from((settings >> 1) & 3)];
    let read_size = WS_READ_SIZE[usize::from((settings >> 3) & 3)];
    let reads = read_messages(stream, max, deflate);
    check_reads(&reads, max);
    assert_eq!(
        read_messages_with(stream, max, deflate, read_size),
        reads,
        "the same stream read {read_size} bytes at a time reads differently"
    );
    if !deflate && reads.iter().all(Result::is_ok) {
        assert_eq!(
            read_messages(stream, max, true),
            reads,
            "agreeing deflate changed a stream with no RSV1 frame"
        );
    }
}

/// What `sluice_ws::fuzzing::read_messages` gave: the reader never
/// waited, at most one error and it is last, a Close is last, data messages
/// are within `max`, control frames within 125 bytes (RFC 6455 section
/// 5.5), a Close's code one an endpoint may send (section 7.4, and 1012-1014
/// of the IANA registry, section 11.7).
pub fn check_reads(reads: &[Result<String, String>], max: usize) {
    let last = reads.len().saturating_sub(1);
    for (i, read) in reads.iter().enumerate() {
        let m = match read {
            Err(e) => {
                assert_ne!(e, sluice_ws::fuzzing::WAITED, "the reader waited");
                assert_eq!(i, last, "an error that is not the last read: {reads:?}");
                continue;
            }
            Ok(m) => m,
        };
        let control_max = max.min(125);
        if let Some(text) = m.strip_prefix("text ") {
            assert!(
                text.len() <= max,
                "a text of {} bytes over {max}",
                text.len()
            );
        } else if let Some(n) = m.strip_prefix("binary ") {
            let n: usize = n.parse().expect("a binary message's length");
            assert!(n <= max, "a binary message of {n} bytes over {max}");
        } else if let Some(hex) = m.strip_prefix("ping ") {
            assert!(hex.len() % 2 == 0 && hex.len() / 2 <= control_max, "{m}");
        } else if m == "close" {
            assert_eq!(i, last, "a read after a Close: {reads:?}");
        } else if let Some(body) = m.strip_prefix("close ") {
            assert_eq!(i, last, "a read after a Close: {reads:?}");
            let (code, reason) = body.split_once(' ').expect("a close code and reason");
            let code: u16 = code.parse().expect("a close code");
            assert!(
                matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999),
                "a close code no endpoint may send: {code}"
            );
            assert!(2 + reason.len() <= control_max, "{m}");
        } else {
            panic!("an unknown read: {m}");
        }
    }
}

/// An HTTP request head (as a client sends it, up to its blank line): the
/// upgrade's checks answer 101, 400 or 426 as RFC 6455 section 4.2.1
/// says ([`expected_status`]). The `Sec-WebSocket-Extensions` answer (RFC 7692
/// section 7.1): none with compression off; with it on, one in both modes
/// or neither, a valid header value naming permessage-deflate with
/// `client_no_context_takeover`, `server_no_context_takeover` always in
/// stateless mode and otherwise the same as in sliding mode, and an answer
/// offered back is accepted as itself.
pub fn ws_upgrade(data: &[u8]) {
    use http::{HeaderMap, HeaderName, HeaderValue, Method};
    use sluice_ws::fuzzing::check_upgrade;

    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut slots);
    let Ok(httparse::Status::Complete(_)) = req.parse(data) else {
        return;
    };
    let Some(method) = req
        .method
        .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
    else {
        return;
    };
    let mut headers = HeaderMap::new();
    for h in req.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return;
        };
        headers.append(name, value);
    }
    let (status, [off, stateless, sliding]) = check_upgrade(&method, &headers);
    assert!(matches!(status, 101 | 400 | 426), "status {status}");
    assert_eq!(status, expected_status(&method, &headers), "{headers:?}");
    assert_eq!(off, None, "an extension agreed with compression off");
    assert_eq!(
        stateless.is_some(),
        sliding.is_some(),
        "{stateless:?} {sliding:?}"
    );
    let (Some(stateless), Some(sliding)) = (stateless, sliding) else {
        return;
    };
    for answer in [&stateless, &sliding] {
        assert!(answer.starts_with("permessage-deflate"), "{answer}");
        assert!(answer.contains("; client_no_context_takeover"), "{answer}");
        assert!(
            HeaderValue::from_str(answer).is_ok(),
            "not a header value: {answer:?}"
        );
        if let Some((_, bits)) = answer.split_once("server_max_window_bits=") {
            let bits: u8 = bits.parse().expect("window bits last, a number");
            assert!((9..=15).contains(&bits), "{answer}");
        }
    }
    let params = sliding
        .strip_prefix("permessage-deflate")
        .expect("checked above");
    let params = params
        .strip_prefix("; server_no_context_takeover")
        .unwrap_or(params);
    assert_eq!(
        stateless,
        format!("permessage-deflate; server_no_context_takeover{params}"),
        "stateless mode answers otherwise than sliding mode"
    );
    for (mode, answer) in [(1, &stateless), (2, &sliding)] {
        let mut again = headers.clone();
        again.remove(http::header::SEC_WEBSOCKET_EXTENSIONS);
        again.insert(
            http::header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_str(answer).expect("checked above"),
        );
        let (_, answers) = check_upgrade(&method, &again);
        assert_eq!(
            answers[mode].as_deref(),
            Some(answer.as_str()),
            "the answer offered back is not accepted as itself"
        );
    }
}

/// The status RFC 6455 section 4.2.1 gives a request: 400 for a request
/// that is not a GET with a `Host`, `Connection: upgrade` and a
/// `Sec-WebSocket-Key` of 16 bytes in base64, 426 with
/// `Sec-WebSocket-Version: 13` for another version (section 4.4), and 101
/// for a valid request. `Upgrade: websocket`
/// is checked before, when a request is routed as an upgrade.
pub fn expected_status(method: &http::Method, headers: &http::HeaderMap) -> u16 {
    use http::header;
    let upgrade = headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
    });
    if method != http::Method::GET || !headers.contains_key(header::HOST) || !upgrade {
        return 400;
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return 426;
    }
    match headers.get(header::SEC_WEBSOCKET_KEY) {
        Some(key) if is_16_bytes_in_base64(key.as_bytes()) => 101,
        _ => 400,
    }
}

/// 16 bytes in canonical padded base64: 22 characters of the standard
/// alphabet, the last of which holds 2 bits (its low 4 zero), then `==`.
fn is_16_bytes_in_base64(key: &[u8]) -> bool {
    fn value(c: u8) -> Option<u8> {
        match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let [data @ .., b'=', b'='] = key else {
        return false;
    };
    data.len() == 22
        && data.iter().all(|&c| value(c).is_some())
        && value(data[21]).is_some_and(|v| v & 0x0F == 0)
}
