//! Key layouts of the store's tables. Every multi-byte integer is big-endian
//! so LMDB's byte order is numeric order; every index key ends with
//! `created_at ‖ serial` so a reverse range scan over one prefix yields that
//! prefix's events newest first.

use sha2::{Digest, Sha256};
use sluice_proto::TagValue;

pub const SERIAL_LEN: usize = 8;
pub const TIME_SERIAL_LEN: usize = 16;

/// Longest tag value stored verbatim in the tag index; longer values are
/// hashed (the query post-filter compares full values, so this never
/// changes results).
pub const MAX_INLINE_TAG_BYTES: usize = 180;

pub fn serial(s: u64) -> [u8; 8] {
    s.to_be_bytes()
}

pub fn read_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// `prefix ‖ created_at ‖ serial`.
pub fn index_key(prefix: &[u8], created_at: u64, serial: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + TIME_SERIAL_LEN);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&created_at.to_be_bytes());
    k.extend_from_slice(&serial.to_be_bytes());
    k
}

/// The trailing `created_at ‖ serial` of an index key.
pub fn split_index_key(key: &[u8]) -> (u64, u64) {
    let n = key.len();
    (read_u64(&key[n - 16..n - 8]), read_u64(&key[n - 8..]))
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

/// Key of the replaceable/addressable slot: `pubkey ‖ kind` for
/// replaceable kinds, `pubkey ‖ kind ‖ sha256(d)` for addressable ones.
pub fn address_key(pubkey: &[u8; 32], kind: u16, d_tag: Option<&str>) -> Vec<u8> {
    let mut k = author_kind_prefix(pubkey, kind);
    if let Some(d) = d_tag {
        k.extend_from_slice(&Sha256::digest(d.as_bytes()));
    }
    k
}

/// Tombstone of a NIP-09 `e` deletion: `id ‖ deleter pubkey`.
pub fn tombstone_key(id: &[u8; 32], pubkey: &[u8; 32]) -> [u8; 64] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(id);
    k[32..].copy_from_slice(pubkey);
    k
}

/// Fixed header in front of the raw JSON in the `events` table, so that
/// scans can check id, author, kind, time and expiry without parsing JSON.
pub struct Header {
    pub id: [u8; 32],
    pub pubkey: [u8; 32],
    pub created_at: u64,
    pub kind: u16,
    /// NIP-40 expiration, 0 when the event has none.
    pub expires_at: u64,
}

pub const HEADER_LEN: usize = 32 + 32 + 8 + 2 + 8;

impl Header {
    pub fn encode_with(&self, raw: &str) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_LEN + raw.len());
        v.extend_from_slice(&self.id);
        v.extend_from_slice(&self.pubkey);
        v.extend_from_slice(&self.created_at.to_be_bytes());
        v.extend_from_slice(&self.kind.to_be_bytes());
        v.extend_from_slice(&self.expires_at.to_be_bytes());
        v.extend_from_slice(raw.as_bytes());
        v
    }

    /// Splits a stored value into its header and raw JSON. `None` means the
    /// value is not one this code wrote (a corrupt or foreign store).
    pub fn decode(value: &[u8]) -> Option<(Header, &str)> {
        if value.len() < HEADER_LEN {
            return None;
        }
        let h = Header {
            id: value[0..32].try_into().ok()?,
            pubkey: value[32..64].try_into().ok()?,
            created_at: read_u64(&value[64..72]),
            kind: u16::from_be_bytes(value[72..74].try_into().ok()?),
            expires_at: read_u64(&value[74..82]),
        };
        let raw = std::str::from_utf8(&value[HEADER_LEN..]).ok()?;
        Some((h, raw))
    }

    pub fn is_expired(&self, now: u64) -> bool {
        self.expires_at != 0 && self.expires_at <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn index_keys_sort_by_time_then_serial() {
        let p = kind_prefix(1);
        assert!(index_key(&p, 5, 9) < index_key(&p, 6, 1));
        assert!(index_key(&p, 6, 1) < index_key(&p, 6, 2));
        assert_eq!(split_index_key(&index_key(&p, 6, 2)), (6, 2));
    }
}
