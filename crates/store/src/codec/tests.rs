//! Unit tests of the byte layouts (`codec.rs`).

use super::*;

fn decode<'a, C: BytesDecode<'a>>(b: &'a [u8]) -> Result<C::DItem, String> {
    C::bytes_decode(b).map_err(|e| e.to_string())
}

#[test]
fn tag_prefixes_are_prefix_free() {
    let a = tag_prefix(b't', "ab");
    let b = tag_prefix(b't', "abc");
    assert!(!b.starts_with(&a));
    let hex = "ab".repeat(32);
    assert_eq!(tag_prefix(b'e', &hex).len(), 34);
    assert_eq!(tag_prefix(b't', &"x".repeat(500)).len(), 34);
}

#[test]
fn index_keys_sort_by_time_then_serial_and_decode() {
    let p = kind_prefix(1);
    assert!(index_key(&p, 5, 9) < index_key(&p, 6, 1));
    assert!(index_key(&p, 6, 1) < index_key(&p, 6, 2));
    assert_eq!(
        decode::<IndexKeyCodec<KindPrefix>>(&index_key(&p, 6, 2)),
        Ok((6, 2))
    );
}

#[test]
fn every_prefix_this_code_builds_decodes() {
    let pk = [7u8; 32];
    let long = "x".repeat(MAX_INLINE_TAG_BYTES + 1);
    let inline = "y".repeat(MAX_INLINE_TAG_BYTES);
    let key = |p: &[u8]| index_key(p, 1_700_000_000, 42);
    assert_eq!(
        decode::<IndexKeyCodec<NoPrefix>>(&key(&[])),
        Ok((1_700_000_000, 42))
    );
    assert!(decode::<IndexKeyCodec<AuthorPrefix>>(&key(&author_prefix(&pk))).is_ok());
    assert!(decode::<IndexKeyCodec<KindPrefix>>(&key(&kind_prefix(30023))).is_ok());
    assert!(decode::<IndexKeyCodec<AuthorKindPrefix>>(&key(&author_kind_prefix(&pk, 1))).is_ok());
    for value in ["", "nostr", &"ab".repeat(32), &inline, &long] {
        let k = key(&tag_prefix(b't', value));
        assert_eq!(
            decode::<IndexKeyCodec<TagPrefix>>(&k),
            Ok((1_700_000_000, 42))
        );
    }
}

#[test]
fn index_keys_of_the_wrong_shape_are_errors() {
    for short in [&[][..], &[1u8; 15][..]] {
        assert!(decode::<IndexKeyCodec<NoPrefix>>(short).is_err());
    }
    // A valid key of another index.
    let kind_key = index_key(&kind_prefix(1), 5, 9);
    assert!(decode::<IndexKeyCodec<NoPrefix>>(&kind_key).is_err());
    assert!(decode::<IndexKeyCodec<AuthorPrefix>>(&kind_key).is_err());
    assert!(decode::<IndexKeyCodec<AuthorKindPrefix>>(&kind_key).is_err());
    // A text tag whose length byte does not match, an unknown encoding.
    let mut bad_len = tag_prefix(b't', "nostr");
    bad_len[2] = 9;
    assert!(decode::<IndexKeyCodec<TagPrefix>>(&index_key(&bad_len, 5, 9)).is_err());
    assert!(decode::<IndexKeyCodec<TagPrefix>>(&index_key(&[b't', 0x03], 5, 9)).is_err());
    assert_eq!(
        decode::<IndexKeyCodec<NoPrefix>>(&[0xab; 3]),
        Err("not a time ‖ serial key (16 bytes): 3 bytes ababab".to_string())
    );
}

#[test]
fn u64_values_must_be_8_bytes() {
    let v = Be64::new(0x0102_0304_0506_0708);
    let bytes = U64Codec::bytes_encode(&v).unwrap();
    assert_eq!(&bytes[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(decode::<U64Codec>(&bytes), Ok(0x0102_0304_0506_0708));
    assert!(decode::<U64Codec>(&bytes[..7]).is_err());
    assert!(decode::<U64Codec>(&[0; 9]).is_err());
}

#[test]
fn event_values_round_trip_and_reject_short_or_non_utf8() {
    let value = StoredEvent {
        header: Header {
            id: [1; 32],
            pubkey: [2; 32],
            created_at: 1_700_000_000,
            kind: 30023,
            expires_at: 0,
        },
        raw: r#"{"kind":30023}"#,
    };
    let bytes = EventCodec::bytes_encode(&value).unwrap().into_owned();
    assert_eq!(bytes.len(), HEADER_LEN + value.raw.len());
    assert_eq!(EventCodec::bytes_decode(&bytes).ok(), Some(value));
    assert!(EventCodec::bytes_decode(&bytes[..HEADER_LEN - 1]).is_err());
    let mut bad = bytes.clone();
    bad[HEADER_LEN] = 0xff;
    assert!(EventCodec::bytes_decode(&bad).is_err());
}

/// Property tests of the layouts the index scans rely on: every key decodes
/// to what was encoded, byte order is `(created_at, serial)` order within a
/// prefix, tag prefixes are prefix-free (a scan of one value never meets
/// another's rows), and no bytes make a decoder panic.
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn decode<'a, C: BytesDecode<'a>>(b: &'a [u8]) -> Option<C::DItem> {
        C::bytes_decode(b).ok()
    }

    fn tag_value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9a-f]{64}",
            "[0-9A-Fa-f]{64}",
            ".{0,40}",
            "[a-z]{150,260}",
            "[0-9a-f]{63,65}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_index_key_decodes_to_its_time_and_serial(
            pubkey in any::<[u8; 32]>(), kind in any::<u16>(), letter in b'A'..=b'z',
            value in tag_value(), t in any::<u64>(), s in any::<u64>(),
        ) {
            prop_assert_eq!(decode::<IndexKeyCodec<NoPrefix>>(&index_key(&[], t, s)), Some((t, s)));
            let k = index_key(&author_prefix(&pubkey), t, s);
            prop_assert_eq!(decode::<IndexKeyCodec<AuthorPrefix>>(&k), Some((t, s)));
            let k = index_key(&kind_prefix(kind), t, s);
            prop_assert_eq!(decode::<IndexKeyCodec<KindPrefix>>(&k), Some((t, s)));
            let k = index_key(&author_kind_prefix(&pubkey, kind), t, s);
            prop_assert_eq!(decode::<IndexKeyCodec<AuthorKindPrefix>>(&k), Some((t, s)));
            let k = index_key(&tag_prefix(letter, &value), t, s);
            prop_assert_eq!(decode::<IndexKeyCodec<TagPrefix>>(&k), Some((t, s)));
        }

        #[test]
        fn within_a_prefix_byte_order_is_time_then_serial_order(
            prefix in prop_oneof![
                any::<[u8; 32]>().prop_map(|p| author_prefix(&p)),
                any::<u16>().prop_map(kind_prefix),
                tag_value().prop_map(|v| tag_prefix(b'e', &v)),
            ],
            a in (any::<u64>(), any::<u64>()), b in (any::<u64>(), any::<u64>()),
        ) {
            let ka = index_key(&prefix, a.0, a.1);
            let kb = index_key(&prefix, b.0, b.1);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }

        #[test]
        fn tag_prefixes_are_prefix_free(
            letter in b'a'..=b'z', a in tag_value(), b in tag_value(),
        ) {
            let (pa, pb) = (tag_prefix(letter, &a), tag_prefix(letter, &b));
            if pa != pb {
                prop_assert!(!pb.starts_with(&pa) && !pa.starts_with(&pb), "{:?} / {:?}", a, b);
            }
            // Distinct values never share a prefix (tag values are
            // case-sensitive strings: upper-case hex is text).
            if a != b {
                prop_assert_ne!(pa, pb);
            }
        }

        #[test]
        fn event_values_round_trip(
            id in any::<[u8; 32]>(), pubkey in any::<[u8; 32]>(), created_at in any::<u64>(),
            kind in any::<u16>(), expires_at in any::<u64>(), raw in ".{0,200}",
        ) {
            let value = StoredEvent {
                header: Header { id, pubkey, created_at, kind, expires_at },
                raw: &raw,
            };
            let bytes = EventCodec::bytes_encode(&value).unwrap().into_owned();
            prop_assert_eq!(EventCodec::bytes_decode(&bytes).ok(), Some(value));
        }

        #[test]
        fn no_bytes_make_a_decoder_panic(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let _ = EventCodec::bytes_decode(&bytes);
            let _ = U64Codec::bytes_decode(&bytes);
            let _ = IndexKeyCodec::<NoPrefix>::bytes_decode(&bytes);
            let _ = IndexKeyCodec::<AuthorPrefix>::bytes_decode(&bytes);
            let _ = IndexKeyCodec::<KindPrefix>::bytes_decode(&bytes);
            let _ = IndexKeyCodec::<AuthorKindPrefix>::bytes_decode(&bytes);
            let _ = IndexKeyCodec::<TagPrefix>::bytes_decode(&bytes);
        }
    }
}

/// Edges of the error text and of the prefixes' shapes.
mod exact_tests {
    use super::*;

    #[test]
    fn hex_prefix_shows_48_bytes_and_marks_more() {
        assert_eq!(hex_prefix(&[]), "");
        assert_eq!(hex_prefix(&[0x0a, 0xff]), "0aff");
        let at = [0xabu8; 48];
        assert_eq!(hex_prefix(&at), "ab".repeat(48));
        let over = [0xabu8; 49];
        assert_eq!(hex_prefix(&over), format!("{}…", "ab".repeat(48)));
        assert_eq!(hex_prefix(&[0xcd; 200]), format!("{}…", "cd".repeat(48)));
    }

    #[test]
    fn a_kind_key_has_a_two_byte_prefix() {
        let decode = |b: &[u8]| IndexKeyCodec::<KindPrefix>::bytes_decode(b).ok();
        assert_eq!(decode(&index_key(&kind_prefix(7), 5, 9)), Some((5, 9)));
        for prefix in [
            &[][..],
            &[1][..],
            &[1, 2, 3][..],
            &[7u8; 32][..],
            &[7u8; 34][..],
        ] {
            assert_eq!(decode(&index_key(prefix, 5, 9)), None, "{prefix:?}");
        }
    }
}
