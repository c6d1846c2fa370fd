//! What must hold of the protocol parsers for any input, shared by the
//! fuzz targets (`src/bin/*`): a failed check panics, which AFL++ records
//! as a crash with the input that caused it.

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
