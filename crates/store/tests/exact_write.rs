//! Exact behaviour of the write path's rules beyond the single-event
//! cases of `rules.rs`: which kind-62 requests to vanish take effect, what
//! a request covers (its author's older events, gift wraps to it) and how
//! later requests move it, the purge of what it covers, NIP-09 `a`
//! deletions of replaceable events and the deletion horizon they leave,
//! and the entries a removed event leaves behind (none).

use std::collections::HashSet;
use std::time::Duration;

use sluice_proto::Event;
use sluice_store::{Scan, Scope, Store, WriteOutcome, WriteRules};

use crate::support;

use support::{ev, open_at as open, pk};

const NOW: u64 = 1_700_000_000;
const VANISH: u16 = 62;
const GIFT_WRAP: u16 = 1059;

/// Any relay URL names this relay (none configured).
fn any_relay() -> WriteRules {
    WriteRules::default()
}

fn put(store: &Store, e: &Event) -> WriteOutcome {
    store.write_batch_ruled([e], NOW, &any_relay()).unwrap()[0]
}

fn is_stored(o: WriteOutcome) -> bool {
    matches!(o, WriteOutcome::Stored { .. })
}

// ---------------------------------------------------------- vanish_applies

#[test]
fn a_request_to_vanish_applies_when_its_relay_tag_names_this_relay() {
    let here = WriteRules {
        relay_urls: vec!["wss://relay.example.com".into()],
        ..WriteRules::default()
    };
    let req = |kind, tags: &[&[&str]]| ev(1, NOW, kind, tags, "");
    let applies = |rules: &WriteRules, e: &Event| rules.vanish_applies(e);
    assert!(applies(
        &here,
        &req(VANISH, &[&["relay", "wss://relay.example.com"]])
    ));
    assert!(applies(&here, &req(VANISH, &[&["relay", "ALL_RELAYS"]])));
    // One of several tags is enough.
    assert!(applies(
        &here,
        &req(
            VANISH,
            &[
                &["relay", "wss://other.example.com"],
                &["relay", "ALL_RELAYS"]
            ]
        )
    ));
    assert!(!applies(
        &here,
        &req(VANISH, &[&["relay", "wss://other.example.com"]])
    ));
    // Not a `relay` tag, no URL, no tag, not kind 62.
    assert!(!applies(&here, &req(VANISH, &[&["r", "ALL_RELAYS"]])));
    assert!(!applies(
        &here,
        &req(VANISH, &[&["r", "wss://relay.example.com"]])
    ));
    assert!(!applies(&here, &req(VANISH, &[&["relay"]])));
    assert!(!applies(&here, &req(VANISH, &[])));
    assert!(!applies(&here, &req(1, &[&["relay", "ALL_RELAYS"]])));
    assert!(!applies(
        &here,
        &req(5, &[&["relay", "wss://relay.example.com"]])
    ));
    // None configured: any relay URL, but a relay URL.
    let any = any_relay();
    assert!(applies(
        &any,
        &req(VANISH, &[&["relay", "wss://other.example.com"]])
    ));
    assert!(applies(&any, &req(VANISH, &[&["relay", "ALL_RELAYS"]])));
    assert!(!applies(&any, &req(VANISH, &[&["relay", "not a url"]])));
    assert!(!applies(&any, &req(1, &[&["relay", "ALL_RELAYS"]])));
}

// ----------------------------------------------------- what a request covers

#[test]
fn a_request_covers_its_authors_events_up_to_it_and_gift_wraps_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let at = NOW - 100;
    let request = ev(1, at, VANISH, &[&["relay", "ALL_RELAYS"]], "bye");
    let out = store
        .write_batch_ruled([&request], NOW, &any_relay())
        .unwrap();
    assert!(is_stored(out[0]), "{out:?}");
    // The author's events up to the request are refused, later ones not.
    assert_eq!(
        put(&store, &ev(1, at - 50, 1, &[], "older")),
        WriteOutcome::Vanished
    );
    assert_eq!(
        put(&store, &ev(1, at, 1, &[], "same second")),
        WriteOutcome::Vanished
    );
    assert!(is_stored(put(&store, &ev(1, at + 1, 1, &[], "newer"))));
    // Another author's events are not.
    assert!(is_stored(put(&store, &ev(2, at - 50, 1, &[], "other"))));
    // Gift wraps `p`-tagged to the author, up to the request.
    let wrap = |created_at, tags: &[&[&str]], content| ev(3, created_at, GIFT_WRAP, tags, content);
    let to_1 = pk(1);
    assert_eq!(
        put(&store, &wrap(at - 50, &[&["p", &to_1]], "w1")),
        WriteOutcome::Vanished
    );
    assert_eq!(
        put(&store, &wrap(at, &[&["p", &pk(4)], &["p", &to_1]], "w2")),
        WriteOutcome::Vanished
    );
    assert!(is_stored(put(
        &store,
        &wrap(at + 1, &[&["p", &to_1]], "w3")
    )));
    assert!(is_stored(put(
        &store,
        &wrap(at - 50, &[&["p", &pk(4)]], "w4")
    )));
    // A `p` tag that is not a recipient's name, a tag that is not `p`.
    assert!(is_stored(put(
        &store,
        &wrap(at - 50, &[&["P", &to_1]], "w5")
    )));
    assert!(is_stored(put(
        &store,
        &wrap(at - 50, &[&["e", &to_1]], "w6")
    )));
    // Only gift wraps: a note tagging the author is not covered.
    assert!(is_stored(put(
        &store,
        &ev(3, at - 50, 1, &[&["p", &to_1]], "n")
    )));
    // A second request of the author's, older than the first, is stored
    // (requests are not covered), and leaves the first in force.
    let older_request = ev(1, at - 60, VANISH, &[&["relay", "ALL_RELAYS"]], "again");
    assert!(is_stored(put(&store, &older_request)));
    assert_eq!(
        put(&store, &ev(1, at - 30, 1, &[], "between")),
        WriteOutcome::Vanished
    );
    // A newer one moves it on.
    let newer_request = ev(1, at + 100, VANISH, &[&["relay", "ALL_RELAYS"]], "later");
    assert!(is_stored(put(&store, &newer_request)));
    assert_eq!(
        put(&store, &ev(1, at + 50, 1, &[], "now covered")),
        WriteOutcome::Vanished
    );
    assert_eq!(
        put(&store, &wrap(at + 50, &[&["p", &to_1]], "w7")),
        WriteOutcome::Vanished
    );
    assert!(is_stored(put(&store, &ev(1, at + 101, 1, &[], "after"))));
    // A request for another relay covers nothing.
    let elsewhere = WriteRules {
        relay_urls: vec!["wss://relay.example.com".into()],
        ..WriteRules::default()
    };
    let other_request = ev(
        2,
        NOW - 10,
        VANISH,
        &[&["relay", "wss://x.example.com"]],
        "",
    );
    let out = store
        .write_batch_ruled([&other_request], NOW, &elsewhere)
        .unwrap();
    assert!(is_stored(out[0]));
    assert!(is_stored(put(
        &store,
        &ev(2, NOW - 20, 1, &[], "still here")
    )));
}

// ------------------------------------------------------------ the purge

#[test]
fn purge_vanished_removes_what_the_request_covers_in_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let at = NOW - 100;
    let to_1 = pk(1);
    let a1 = ev(1, at - 200, 1, &[], "a1");
    let a2 = ev(1, at - 150, 1, &[], "a2");
    let a_after = ev(1, at + 50, 1, &[], "after the request");
    let w1 = ev(2, at - 180, GIFT_WRAP, &[&["p", &to_1]], "w1");
    let w2 = ev(2, at - 160, GIFT_WRAP, &[&["p", &to_1]], "w2");
    let w_after = ev(2, at + 10, GIFT_WRAP, &[&["p", &to_1]], "w after");
    let note = ev(2, at - 170, 1, &[&["p", &to_1]], "a note to 1");
    let others = ev(2, at - 190, 1, &[], "2's own");
    let all = [&a1, &a2, &a_after, &w1, &w2, &w_after, &note, &others];
    let out = store.write_batch_ruled(all, NOW, &any_relay()).unwrap();
    assert!(out.iter().all(|o| is_stored(*o)), "{out:?}");
    // Nothing to purge before a request.
    assert_eq!(store.purge_vanished(&all[0].pubkey, 100).unwrap(), 0);
    let request = ev(1, at, VANISH, &[&["relay", "ALL_RELAYS"]], "");
    assert!(is_stored(put(&store, &request)));
    let present = |e: &Event| store.contains_ids([&e.id]).unwrap()[0];
    let left = || -> Vec<&str> {
        all.iter()
            .chain([&&request])
            .filter(|e| present(e))
            .map(|e| e.content.as_str())
            .collect()
    };
    // The author's own events first, oldest first, at most `max`.
    assert_eq!(store.purge_vanished(&request.pubkey, 1).unwrap(), 1);
    assert!(!present(&a1) && present(&a2));
    assert_eq!(store.purge_vanished(&request.pubkey, 1).unwrap(), 1);
    assert!(!present(&a2) && present(&w1));
    // Then the gift wraps to the author; the request stays.
    assert_eq!(store.purge_vanished(&request.pubkey, 1).unwrap(), 1);
    assert!(!present(&w1) && present(&w2));
    assert_eq!(store.purge_vanished(&request.pubkey, 100).unwrap(), 1);
    assert_eq!(store.purge_vanished(&request.pubkey, 100).unwrap(), 0);
    assert_eq!(
        left(),
        vec!["after the request", "w after", "a note to 1", "2's own", ""]
    );
}

#[test]
fn purge_vanished_takes_both_kinds_in_one_step_and_stops_at_max() {
    let at = NOW - 100;
    let to_1 = pk(1);
    let setup = || {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let events = [
            ev(1, at - 200, 1, &[], "a1"),
            ev(1, at - 150, 30_000, &[&["d", "x"]], "a2"),
            ev(2, at - 180, GIFT_WRAP, &[&["p", &to_1]], "w1"),
            ev(2, at - 160, GIFT_WRAP, &[&["p", &to_1]], "w2"),
            ev(2, at - 170, 1, &[&["p", &to_1]], "note"),
            ev(1, at, VANISH, &[&["relay", "ALL_RELAYS"]], "request"),
        ];
        let out = store.write_batch_ruled(&events, NOW, &any_relay()).unwrap();
        assert!(out.iter().all(|o| is_stored(*o)), "{out:?}");
        (dir, store, events)
    };
    let left = |store: &Store, events: &[Event]| -> Vec<String> {
        events
            .iter()
            .filter(|e| store.contains_ids([&e.id]).unwrap()[0])
            .map(|e| e.content.clone())
            .collect()
    };
    // `max` met by the author's events: no gift wrap goes.
    let (_d, store, events) = setup();
    assert_eq!(store.purge_vanished(&events[0].pubkey, 2).unwrap(), 2);
    assert_eq!(left(&store, &events), ["w1", "w2", "note", "request"]);
    // `max` met inside the gift wraps.
    let (_d, store, events) = setup();
    assert_eq!(store.purge_vanished(&events[0].pubkey, 3).unwrap(), 3);
    assert_eq!(left(&store, &events), ["w2", "note", "request"]);
    // All in one step.
    let (_d, store, events) = setup();
    assert_eq!(store.purge_vanished(&events[0].pubkey, 10).unwrap(), 4);
    assert_eq!(left(&store, &events), ["note", "request"]);
    assert_eq!(store.purge_vanished(&events[0].pubkey, 10).unwrap(), 0);
}

// -------------------------------------------------------- NIP-09 `a` tags

#[test]
fn an_a_deletion_removes_a_replaceable_event_and_keeps_the_newest_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let author = pk(1);
    let profile = ev(1, NOW - 100, 0, &[], "profile");
    assert!(is_stored(put(&store, &profile)));
    let slot = format!("0:{author}:");
    let delete = ev(1, NOW - 50, 5, &[&["a", &slot]], "");
    assert_eq!(
        put(&store, &delete),
        WriteOutcome::Stored {
            serial: 2,
            replaced: false,
            deleted: 1
        }
    );
    assert!(!store.contains_ids([&profile.id]).unwrap()[0]);
    // Versions up to the deletion are refused, newer ones stored.
    assert_eq!(
        put(&store, &ev(1, NOW - 60, 0, &[], "p2")),
        WriteOutcome::Deleted
    );
    assert_eq!(
        put(&store, &ev(1, NOW - 50, 0, &[], "p3")),
        WriteOutcome::Deleted
    );
    // An older deletion does not lower the horizon.
    let older = ev(1, NOW - 80, 5, &[&["a", &slot]], "older");
    assert!(matches!(
        put(&store, &older),
        WriteOutcome::Stored { deleted: 0, .. }
    ));
    assert_eq!(
        put(&store, &ev(1, NOW - 70, 0, &[], "p4")),
        WriteOutcome::Deleted
    );
    // A newer one raises it.
    let newer = ev(1, NOW - 20, 5, &[&["a", &slot]], "newer");
    assert!(matches!(
        put(&store, &newer),
        WriteOutcome::Stored { deleted: 0, .. }
    ));
    assert_eq!(
        put(&store, &ev(1, NOW - 30, 0, &[], "p5")),
        WriteOutcome::Deleted
    );
    let fresh = ev(1, NOW - 10, 0, &[], "p6");
    assert!(is_stored(put(&store, &fresh)));
    // The same for an addressable slot.
    let article = ev(1, NOW - 100, 30023, &[&["d", "post"]], "article");
    assert!(is_stored(put(&store, &article)));
    let aslot = format!("30023:{author}:post");
    let out = put(&store, &ev(1, NOW - 40, 5, &[&["a", &aslot]], ""));
    assert!(matches!(out, WriteOutcome::Stored { deleted: 1, .. }));
    assert_eq!(
        put(&store, &ev(1, NOW - 45, 30023, &[&["d", "post"]], "a2")),
        WriteOutcome::Deleted
    );
    // Another author's slot, a regular kind: nothing.
    let theirs = format!("0:{}:", pk(2));
    let out = put(
        &store,
        &ev(
            1,
            NOW - 5,
            5,
            &[&["a", &theirs], &["a", &format!("1:{author}:")]],
            "",
        ),
    );
    assert!(matches!(out, WriteOutcome::Stored { deleted: 0, .. }));
    assert!(store.contains_ids([&fresh.id]).unwrap()[0]);
}

// ----------------------------------------- what a removed event leaves behind

/// An `e` deletion, a replacement, a purge and the expiry purge leave no
/// `addresses` or `expiry` entry pointing at what they removed.
#[test]
fn removed_events_leave_no_address_or_expiry_entry() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        let expires = (NOW + 100).to_string();
        let profile = ev(1, NOW - 100, 0, &[], "profile");
        let contacts = ev(1, NOW - 100, 3, &[], "contacts v1");
        let contacts2 = ev(1, NOW - 90, 3, &[], "contacts v2");
        let article = ev(1, NOW - 100, 30023, &[&["d", "a"]], "article");
        let short_lived = ev(1, NOW - 100, 1, &[&["expiration", &expires]], "soon gone");
        let purged = ev(1, NOW - 100, 1, &[&["expiration", &expires]], "purged");
        let out = store
            .write_batch(
                [
                    &profile,
                    &contacts,
                    &contacts2,
                    &article,
                    &short_lived,
                    &purged,
                ],
                NOW,
            )
            .unwrap();
        assert!(out.iter().all(|o| is_stored(*o)), "{out:?}");
        let ids: Vec<String> = [&profile, &article, &short_lived]
            .iter()
            .map(|e| e.id_hex())
            .collect();
        let del = ev(
            1,
            NOW - 10,
            5,
            &[&["e", &ids[0]], &["e", &ids[1]], &["e", &ids[2]]],
            "",
        );
        let out = store.write_batch([&del], NOW).unwrap();
        assert!(
            matches!(out[0], WriteOutcome::Stored { deleted: 3, .. }),
            "{out:?}"
        );
        assert!(store.purge_event(&purged.id).unwrap());
        // Nothing is left to expire.
        assert_eq!(store.purge_expired(NOW + 1000, 10).unwrap(), 0);
        assert_eq!(store.stats().unwrap().events, 2);
        store.close();
    }
    // Only the contact list's slot is left, pointing at its new version.
    assert_eq!(support::raw_len(dir.path(), "addresses"), 1);
    assert_eq!(support::raw_len(dir.path(), "expiry"), 0);
    let store = open(dir.path());
    assert_eq!(store.stats().unwrap().events, 2);
}

#[test]
fn an_expiring_event_is_purged_once_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let e = ev(
        1,
        NOW - 100,
        1,
        &[&["expiration", &(NOW + 100).to_string()]],
        "x",
    );
    let keep = ev(1, NOW - 100, 1, &[], "kept");
    store.write_batch([&e, &keep], NOW).unwrap();
    assert_eq!(store.purge_expired(NOW + 99, 10).unwrap(), 0);
    assert_eq!(store.purge_expired(NOW + 100, 10).unwrap(), 1);
    assert_eq!(store.purge_expired(NOW + 100, 10).unwrap(), 0);
    assert_eq!(store.stats().unwrap().events, 1);
}

// ---------------------------------------------------- eviction with a batch

#[test]
fn a_batch_with_eviction_stores_its_events_and_removes_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let old: Vec<Event> = (0..3)
        .map(|i| ev(1, NOW - 1000 + i, 1, &[], &format!("old {i}")))
        .collect();
    store.write_batch(&old, NOW).unwrap();
    let new = ev(2, NOW - 10, 1, &[], "new");
    let exempt = HashSet::new();
    let scan = Scan {
        scope: &Scope::All,
        before: u64::MAX,
        after: None,
        replaceable: false,
        exempt: &exempt,
        max_pick: 2,
        max_examine: 100,
        max_time: Duration::from_secs(3600),
    };
    let (out, pruned) = store
        .write_batch_evicting([&new], NOW, &WriteRules::default(), &scan)
        .unwrap();
    assert_eq!(
        out,
        vec![WriteOutcome::Stored {
            serial: 4,
            replaced: false,
            deleted: 0
        }]
    );
    assert_eq!(pruned.removed, 2);
    let present = store
        .contains_ids([&old[0].id, &old[1].id, &old[2].id, &new.id])
        .unwrap();
    assert_eq!(present, vec![false, false, true, true]);
}
