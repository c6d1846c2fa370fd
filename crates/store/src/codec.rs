//! Byte layouts of the store's keys and values, and the heed codecs that
//! read and write them: one codec per layout ([`crate::tables`] says which
//! table uses which).
//!
//! Every multi-byte integer is big-endian so LMDB's byte order is numeric
//! order; every index key ends with `created_at ‖ serial` so a reverse range
//! scan over one prefix yields that prefix's events newest first.
//!
//! Decoding never trusts the bytes: a key or value of the wrong length or
//! shape is a [`Malformed`] error (the table turns it into
//! `StoreError::Corrupt` naming itself), never a panic. Encoding borrows the
//! caller's bytes wherever the layout allows, and decoding borrows from the
//! page, so a lookup or a scan step does not allocate; only an event value
//! is assembled (once per insert).

use std::borrow::Cow;
use std::marker::PhantomData;

use heed::{BoxedError, BytesDecode, BytesEncode};
use sha2::{Digest, Sha256};
use sluice_proto::TagValue;

/// Bytes of `created_at ‖ serial` at the end of every index key.
const TIME_SERIAL_LEN: usize = 16;

/// Longest tag value stored verbatim in the tag index; longer values are
/// hashed (the query post-filter compares full values, so this never
/// changes results).
pub const MAX_INLINE_TAG_BYTES: usize = 180;

/// Bytes that are not the layout a codec reads.
#[derive(Debug, thiserror::Error)]
#[error("not {layout}: {len} bytes {hex}")]
pub struct Malformed {
    layout: &'static str,
    len: usize,
    /// The first bytes, in hex.
    hex: String,
}

impl Malformed {
    fn boxed(layout: &'static str, bytes: &[u8]) -> BoxedError {
        Box::new(Malformed {
            layout,
            len: bytes.len(),
            hex: hex_prefix(bytes),
        })
    }
}

/// Up to 48 bytes in hex, `…` when there are more: enough to find the
/// entry, short enough for a log line.
pub fn hex_prefix(bytes: &[u8]) -> String {
    const SHOWN: usize = 48;
    let mut s: String = bytes
        .iter()
        .take(SHOWN)
        .map(|b| format!("{b:02x}"))
        .collect();
    if bytes.len() > SHOWN {
        s.push('…');
    }
    s
}

/// Takes the next `N` bytes of `b`, `None` when fewer are left.
fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = b.split_first_chunk::<N>()?;
    *b = rest;
    Some(*head)
}

/// A `u64` in its stored form, 8 big-endian bytes, built on the stack so
/// that encoding it borrows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Be64([u8; 8]);

impl Be64 {
    pub fn new(v: u64) -> Be64 {
        Be64(v.to_be_bytes())
    }
}

/// `u64` as 8 big-endian bytes: serials, timestamps and counters.
pub enum U64Codec {}

impl<'a> BytesEncode<'a> for U64Codec {
    type EItem = Be64;

    fn bytes_encode(item: &'a Be64) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(&item.0))
    }
}

impl BytesDecode<'_> for U64Codec {
    type DItem = u64;

    fn bytes_decode(bytes: &[u8]) -> Result<u64, BoxedError> {
        match <[u8; 8]>::try_from(bytes) {
            Ok(b) => Ok(u64::from_be_bytes(b)),
            Err(_) => Err(Malformed::boxed("a big-endian u64 (8 bytes)", bytes)),
        }
    }
}

/// An event id, 32 bytes (only looked up, never decoded).
pub enum IdCodec {}

impl<'a> BytesEncode<'a> for IdCodec {
    type EItem = [u8; 32];

    fn bytes_encode(item: &'a [u8; 32]) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(item))
    }
}

/// Tombstone of a NIP-09 `e` deletion, `id ‖ deleter pubkey`, 64 bytes
/// (only looked up, never decoded).
pub enum TombstoneCodec {}

impl<'a> BytesEncode<'a> for TombstoneCodec {
    type EItem = [u8; 64];

    fn bytes_encode(item: &'a [u8; 64]) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(item))
    }
}

/// `id ‖ deleter pubkey`.
pub fn tombstone_key(id: &[u8; 32], pubkey: &[u8; 32]) -> [u8; 64] {
    let mut k = [0u8; 64];
    let (a, b) = k.split_at_mut(32);
    a.copy_from_slice(id);
    b.copy_from_slice(pubkey);
    k
}

/// Key of a replaceable/addressable slot, built by [`Address::new`] (only
/// looked up, never decoded).
pub enum AddressCodec {}

/// `pubkey ‖ kind` for replaceable kinds, `pubkey ‖ kind ‖ sha256(d)` for
/// addressable ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address(Vec<u8>);

impl Address {
    pub fn new(pubkey: &[u8; 32], kind: u16, d_tag: Option<&str>) -> Address {
        let mut k = author_kind_prefix(pubkey, kind);
        if let Some(d) = d_tag {
            k.extend_from_slice(&Sha256::digest(d.as_bytes()));
        }
        Address(k)
    }
}

impl<'a> BytesEncode<'a> for AddressCodec {
    type EItem = Address;

    fn bytes_encode(item: &'a Address) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(&item.0))
    }
}

/// Fixed header in front of the raw JSON in the `events` table, so that
/// scans can check id, author, kind, time and expiry without parsing JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub id: [u8; 32],
    pub pubkey: [u8; 32],
    pub created_at: u64,
    pub kind: u16,
    /// NIP-40 expiration, 0 when the event has none.
    pub expires_at: u64,
}

impl Header {
    /// Reads a header from the front of `b`, leaving the rest in `b`.
    fn take(b: &mut &[u8]) -> Option<Header> {
        Some(Header {
            id: take(b)?,
            pubkey: take(b)?,
            created_at: u64::from_be_bytes(take(b)?),
            kind: u16::from_be_bytes(take(b)?),
            expires_at: u64::from_be_bytes(take(b)?),
        })
    }

    pub fn is_expired(&self, now: u64) -> bool {
        self.expires_at != 0 && self.expires_at <= now
    }
}

/// One value of the `events` table: `id (32) ‖ pubkey (32) ‖ created_at (8)
/// ‖ kind (2) ‖ expires_at (8) ‖ raw JSON (UTF-8)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredEvent<'a> {
    pub header: Header,
    pub raw: &'a str,
}

const HEADER_LEN: usize = 32 + 32 + 8 + 2 + 8;

pub enum EventCodec {}

impl<'a> BytesEncode<'a> for EventCodec {
    type EItem = StoredEvent<'a>;

    fn bytes_encode(item: &'a StoredEvent<'a>) -> Result<Cow<'a, [u8]>, BoxedError> {
        let h = &item.header;
        let mut v = Vec::with_capacity(HEADER_LEN + item.raw.len());
        v.extend_from_slice(&h.id);
        v.extend_from_slice(&h.pubkey);
        v.extend_from_slice(&h.created_at.to_be_bytes());
        v.extend_from_slice(&h.kind.to_be_bytes());
        v.extend_from_slice(&h.expires_at.to_be_bytes());
        v.extend_from_slice(item.raw.as_bytes());
        Ok(Cow::Owned(v))
    }
}

impl<'a> BytesDecode<'a> for EventCodec {
    type DItem = StoredEvent<'a>;

    fn bytes_decode(bytes: &'a [u8]) -> Result<StoredEvent<'a>, BoxedError> {
        let mut rest = bytes;
        let header = Header::take(&mut rest);
        match (header, std::str::from_utf8(rest)) {
            (Some(header), Ok(raw)) => Ok(StoredEvent { header, raw }),
            _ => Err(Malformed::boxed(
                "an event (82-byte header ‖ UTF-8 JSON)",
                bytes,
            )),
        }
    }
}

/// The prefix layout of one index table, whose keys are `prefix ‖
/// created_at ‖ serial`.
pub trait Prefix {
    /// The whole key's layout, for errors.
    const LAYOUT: &'static str;
    fn is_valid(prefix: &[u8]) -> bool;
}

/// No prefix: `created_at ‖ serial` (and `expires_at ‖ serial`).
pub enum NoPrefix {}

/// `pubkey (32)`.
pub enum AuthorPrefix {}

/// `kind (2)`.
pub enum KindPrefix {}

/// `pubkey (32) ‖ kind (2)`.
pub enum AuthorKindPrefix {}

/// `letter ‖ encoded value`, see [`tag_prefix`].
pub enum TagPrefix {}

impl Prefix for NoPrefix {
    const LAYOUT: &'static str = "a time ‖ serial key (16 bytes)";
    fn is_valid(prefix: &[u8]) -> bool {
        prefix.is_empty()
    }
}

impl Prefix for AuthorPrefix {
    const LAYOUT: &'static str = "a pubkey ‖ created_at ‖ serial key (48 bytes)";
    fn is_valid(prefix: &[u8]) -> bool {
        prefix.len() == 32
    }
}

impl Prefix for KindPrefix {
    const LAYOUT: &'static str = "a kind ‖ created_at ‖ serial key (18 bytes)";
    fn is_valid(prefix: &[u8]) -> bool {
        prefix.len() == 2
    }
}

impl Prefix for AuthorKindPrefix {
    const LAYOUT: &'static str = "a pubkey ‖ kind ‖ created_at ‖ serial key (50 bytes)";
    fn is_valid(prefix: &[u8]) -> bool {
        prefix.len() == 34
    }
}

impl Prefix for TagPrefix {
    const LAYOUT: &'static str = "a tag ‖ created_at ‖ serial key";
    fn is_valid(prefix: &[u8]) -> bool {
        match prefix {
            [_, 0x00, hex @ ..] => hex.len() == 32,
            [_, 0x01, len, text @ ..] => text.len() == usize::from(*len),
            [_, 0x02, hash @ ..] => hash.len() == 32,
            _ => false,
        }
    }
}

/// Key of an index table: `prefix ‖ created_at ‖ serial`, built by
/// [`index_key`], decoded to `(created_at, serial)`.
pub struct IndexKeyCodec<P>(PhantomData<P>);

impl<'a, P> BytesEncode<'a> for IndexKeyCodec<P> {
    type EItem = [u8];

    fn bytes_encode(item: &'a [u8]) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(item))
    }
}

impl<P: Prefix> BytesDecode<'_> for IndexKeyCodec<P> {
    type DItem = (u64, u64);

    fn bytes_decode(bytes: &[u8]) -> Result<(u64, u64), BoxedError> {
        let split = bytes.split_last_chunk::<8>().and_then(|(rest, serial)| {
            let (prefix, time) = rest.split_last_chunk::<8>()?;
            Some((prefix, time, serial))
        });
        match split {
            Some((prefix, time, serial)) if P::is_valid(prefix) => {
                Ok((u64::from_be_bytes(*time), u64::from_be_bytes(*serial)))
            }
            _ => Err(Malformed::boxed(P::LAYOUT, bytes)),
        }
    }
}

/// `prefix ‖ created_at ‖ serial`.
pub fn index_key(prefix: &[u8], created_at: u64, serial: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + TIME_SERIAL_LEN);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&created_at.to_be_bytes());
    k.extend_from_slice(&serial.to_be_bytes());
    k
}

pub fn author_prefix(pubkey: &[u8; 32]) -> Vec<u8> {
    pubkey.to_vec()
}

pub fn kind_prefix(kind: u16) -> Vec<u8> {
    kind.to_be_bytes().to_vec()
}

pub fn author_kind_prefix(pubkey: &[u8; 32], kind: u16) -> Vec<u8> {
    let mut k = Vec::with_capacity(34);
    k.extend_from_slice(pubkey);
    k.extend_from_slice(&kind.to_be_bytes());
    k
}

/// `letter ‖ encoded value`, where the encoding is prefix-free: `0x00 ‖ 32
/// bytes` for a 64-hex value, `0x01 ‖ len ‖ bytes` for a short text, `0x02 ‖
/// sha256` for a long one.
pub fn tag_prefix(letter: u8, value: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(40);
    k.push(letter);
    match TagValue::classify(value) {
        TagValue::Hex32(b) => {
            k.push(0x00);
            k.extend_from_slice(&b);
        }
        TagValue::Text(s) if s.len() <= MAX_INLINE_TAG_BYTES => {
            k.push(0x01);
            k.push(s.len() as u8);
            k.extend_from_slice(s.as_bytes());
        }
        TagValue::Text(s) => {
            k.push(0x02);
            k.extend_from_slice(&Sha256::digest(s.as_bytes()));
        }
    }
    k
}

#[cfg(test)]
mod tests {
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
        assert!(
            decode::<IndexKeyCodec<AuthorKindPrefix>>(&key(&author_kind_prefix(&pk, 1))).is_ok()
        );
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
}

/// Property tests of the layouts the index scans rely on: every key decodes
/// to what was encoded, byte order is `(created_at, serial)` order within a
/// prefix, tag prefixes are prefix-free (a scan of one value never meets
/// another's rows), and no bytes make a decoder panic.
#[cfg(test)]
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
#[cfg(test)]
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
