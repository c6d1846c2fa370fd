//! The batch's pending keys: one copy of each, cancellable, in order; and
//! the keys built in a reused buffer are the codec's.

use super::*;
use crate::codec::{author_kind_prefix, author_prefix, index_key, kind_prefix, tag_prefix};
use proptest::strategy::Just;

fn tagged() -> Event {
    let hex = "ab".repeat(32);
    let long = "t".repeat(300);
    let tags = [
        vec!["e", hex.as_str()],
        vec!["t", "nostr"],
        vec!["t", long.as_str()],
        vec!["p", hex.as_str(), "wss://relay"],
        vec!["alt", "not indexed: two letters"],
    ]
    .map(|t| t.into_iter().map(String::from).collect())
    .to_vec();
    Event::sign(&[7; 32], 1_700_000_000, 30_023, tags, "hello")
}

#[test]
fn the_keys_built_in_one_buffer_are_the_codecs_keys() {
    let ev = tagged();
    let serial = 42;
    let mut got = Vec::new();
    let mut buf = Vec::new();
    for_each_index_key(&ev, serial, &mut buf, |index, key| {
        got.push((index, key.to_vec()));
        Ok::<(), ()>(())
    })
    .unwrap();
    let ca = ev.created_at;
    let mut want = vec![
        (Index::Created, index_key(&[], ca, serial)),
        (
            Index::Author,
            index_key(&author_prefix(&ev.pubkey), ca, serial),
        ),
        (Index::Kind, index_key(&kind_prefix(ev.kind), ca, serial)),
        (
            Index::AuthorKind,
            index_key(&author_kind_prefix(&ev.pubkey, ev.kind), ca, serial),
        ),
    ];
    for (letter, value) in ev.indexed_tags() {
        want.push((
            Index::Tag,
            index_key(&tag_prefix(letter, value), ca, serial),
        ));
    }
    assert_eq!(want.len(), 8);
    assert_eq!(got, want);
    assert!(got.iter().all(|(_, k)| k.len() <= KEY_CAPACITY));
}

#[test]
fn the_first_error_stops_the_walk() {
    let mut seen = 0;
    let r = for_each_index_key(&tagged(), 1, &mut Vec::new(), |_, _| {
        seen += 1;
        if seen == 3 { Err("stop") } else { Ok(()) }
    });
    assert_eq!((r, seen), (Err("stop"), 3));
}

#[test]
fn keys_are_held_once_cancelled_on_request_and_given_in_order() {
    let mut p = Pending::default();
    let h = p.hashing.clone();
    let keys = &mut p.keys[0];
    for k in [&b"m"[..], b"b", b"zz", b"b", b"a", b"mm", b"m"] {
        keys.add(&h, k);
    }
    let sorted: Vec<&[u8]> = keys.sorted().collect();
    assert_eq!(sorted, [&b"a"[..], b"b", b"m", b"mm", b"zz"]);
    assert!(keys.cancel(&h, b"m"));
    assert!(!keys.cancel(&h, b"m"), "cancelled once");
    assert!(!keys.cancel(&h, b"q"), "never added");
    // Added again after a cancel: pending again.
    keys.add(&h, b"zz");
    keys.add(&h, b"c");
    let sorted: Vec<&[u8]> = keys.sorted().collect();
    assert_eq!(sorted, [&b"a"[..], b"b", b"c", b"mm", b"zz"]);
    keys.add(&h, b"m");
    assert!(keys.sorted().any(|k| k == b"m"));
}

proptest::proptest! {
    /// Sorted by their heads first, the keys come out in byte order all
    /// the same: short keys, keys that share their first eight bytes,
    /// keys that differ only past them or only in a trailing zero.
    #[test]
    fn keys_come_out_in_byte_order(
        keys in proptest::collection::vec(
            proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8), proptest::num::u8::ANY], 0..20),
            0..200,
        )
    ) {
        let mut p = Pending::default();
        let h = p.hashing.clone();
        for k in &keys {
            p.keys[0].add(&h, k);
        }
        let mut want: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        want.sort();
        want.dedup();
        let got: Vec<&[u8]> = p.keys[0].sorted().collect();
        proptest::prop_assert_eq!(got, want);
    }
}

#[test]
fn an_events_keys_go_to_their_indexes_and_cancel_there() {
    let ev = tagged();
    let mut p = Pending::default();
    p.add_keys_of(&ev, 9);
    p.add_keys_of(&ev, 9);
    let counts: Vec<usize> = p.keys.iter().map(|k| k.sorted().count()).collect();
    assert_eq!(counts, [1, 1, 1, 1, 4]);
    let author = index_key(&author_prefix(&ev.pubkey), ev.created_at, 9);
    assert!(!p.cancel(Index::Created, &author), "another index's key");
    assert!(p.cancel(Index::Author, &author));
    assert_eq!(p.keys[Pending::slot(Index::Author)].sorted().count(), 0);
}
