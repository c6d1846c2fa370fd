//! Byte layouts of the store's keys and values, and the heed codecs that
//! read and write them: one codec per layout (`tables.rs` says which
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
        match (header, simdutf8::basic::from_utf8(rest)) {
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
    time_serial_into(&mut k, created_at, serial);
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
    tag_prefix_into(&mut k, letter, value);
    k
}

/// Appends [`tag_prefix`] to `k` (an index key built in a reused buffer).
pub fn tag_prefix_into(k: &mut Vec<u8>, letter: u8, value: &str) {
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
}

/// Appends `created_at ‖ serial`, the end of every index key, to `k`.
pub fn time_serial_into(k: &mut Vec<u8>, created_at: u64, serial: u64) {
    k.extend_from_slice(&created_at.to_be_bytes());
    k.extend_from_slice(&serial.to_be_bytes());
}

#[cfg(test)]
mod tests;
