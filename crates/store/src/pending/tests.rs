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

/// The keys of `keys` in order, none cancelled.
fn in_order(keys: &Keys) -> Vec<&[u8]> {
    keys.sorted(&HashSet::default()).collect()
}

#[test]
fn keys_are_given_once_in_order_but_for_cancelled_serials() {
    let mut keys = Keys::default();
    for k in [&b"m"[..], b"b", b"zz", b"b", b"a", b"mm", b"m"] {
        keys.add(k);
    }
    assert_eq!(in_order(&keys), [&b"a"[..], b"b", b"m", b"mm", b"zz"]);
    // Keys end with their event's serial: those of a cancelled one are
    // left out, wherever they sort.
    let mut keys = Keys::default();
    for (prefix, serial) in [(&b"x"[..], 7u64), (b"a", 9), (b"m", 7), (b"m", 8)] {
        keys.add(&index_key(prefix, 100, serial));
    }
    let cancelled: HashSet<u64, Hashing> = [7].into_iter().collect();
    let got: Vec<&[u8]> = keys.sorted(&cancelled).collect();
    assert_eq!(got, [index_key(b"a", 100, 9), index_key(b"m", 100, 8)]);
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
        let mut pending = Keys::default();
        for k in &keys {
            pending.add(k);
        }
        let mut want: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        want.sort();
        want.dedup();
        let got = in_order(&pending);
        proptest::prop_assert_eq!(got, want);
    }
}

#[test]
fn an_events_keys_go_to_their_indexes_and_are_taken_back_with_it() {
    let ev = tagged();
    let other = Event::sign(&[8; 32], 1_700_000_001, 1, vec![], "other");
    let mut p = Pending::default();
    p.add_keys_of(&ev, 9);
    p.add_keys_of(&ev, 9);
    p.add_keys_of(&other, 10);
    let counts = |p: &Pending| -> Vec<usize> {
        (p.keys.iter())
            .map(|k| k.sorted(&p.cancelled).count())
            .collect()
    };
    assert_eq!(counts(&p), [2, 2, 2, 2, 4]);
    // Not stored by this batch (no `ids` entry), or under another serial:
    // its entries are in the tables.
    assert!(!p.cancel(&ev.id, 9));
    p.ids.insert(ev.id, 9);
    assert!(!p.cancel(&ev.id, 8));
    assert!(p.cancel(&ev.id, 9));
    assert!(!p.ids.contains_key(&ev.id));
    assert!(!p.cancel(&ev.id, 9), "taken back once");
    assert_eq!(counts(&p), [1, 1, 1, 1, 0]);
    let author = index_key(&author_prefix(&other.pubkey), other.created_at, 10);
    let left: Vec<&[u8]> = p.keys[Pending::slot(Index::Author)]
        .sorted(&p.cancelled)
        .collect();
    assert_eq!(left, [author]);
}
