//! A Nostr event that keeps the exact JSON it arrived as.
//!
//! Parsing checks structure (lowercase hex of the right lengths, kind in
//! 0..=65535, tags as arrays of strings) but not the id or signature:
//! [`Event::verify`] does that, separately, so a trusted bulk import can skip
//! it. The raw JSON is what the relay stores and serves back: byte for byte
//! when the object has only the seven NIP-01 fields, else those seven with
//! their exact bytes, in NIP-01 order (unsigned extra fields are dropped).

use secp256k1::{XOnlyPublicKey, schnorr};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::hex32;

/// Parsed x-only public keys by their 32 bytes, for [`Event::verify_cached`].
/// Bounded: when `capacity` keys are held it starts over, so memory stays
/// at about `capacity` × 100 bytes whatever the input.
pub struct PubkeyCache {
    keys: std::collections::HashMap<[u8; 32], Option<XOnlyPublicKey>>,
    capacity: usize,
}

impl PubkeyCache {
    pub fn new(capacity: usize) -> PubkeyCache {
        PubkeyCache {
            // Grows on demand: a connection's cache costs nothing until it
            // sees an EVENT.
            keys: std::collections::HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The parsed key, or None when the bytes are not a curve point.
    pub fn get(&mut self, bytes: &[u8; 32]) -> Option<XOnlyPublicKey> {
        if let Some(k) = self.keys.get(bytes) {
            return *k;
        }
        if self.keys.len() >= self.capacity {
            self.keys.clear();
        }
        let k = XOnlyPublicKey::from_byte_array(*bytes).ok();
        self.keys.insert(*bytes, k);
        k
    }
}

/// Structural and semantic errors of a single event. Every variant maps to the
/// `invalid:` prefix except where the caller decides otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("malformed event: {0}")]
    Malformed(String),
    #[error("id must be 64 lowercase hex characters")]
    BadIdHex,
    #[error("pubkey must be 64 lowercase hex characters")]
    BadPubkeyHex,
    #[error("sig must be 128 lowercase hex characters")]
    BadSigHex,
    #[error("kind {0} is out of range 0-65535")]
    KindRange(u64),
    #[error("event id does not match its content")]
    IdMismatch,
    #[error("signature is invalid")]
    BadSignature,
    #[error("too many tags: {count} > {max}")]
    TooManyTags { count: usize, max: usize },
    #[error("content too long: {len} bytes > {max}")]
    ContentTooLong { len: usize, max: usize },
    #[error(
        "created_at {created_at} is too far in the future (more than {max_ahead_secs} s ahead)"
    )]
    TooNew {
        created_at: u64,
        max_ahead_secs: u64,
    },
    #[error("created_at {created_at} is too old (more than {max_age_secs} s ago)")]
    TooOld { created_at: u64, max_age_secs: u64 },
    #[error("event has expired")]
    Expired,
    #[error("event nests deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("expiration tag is not a valid timestamp")]
    BadExpiration,
}

/// Acceptance limits that depend only on the event itself and the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_event_tags: usize,
    pub max_content_length: usize,
    /// Refuse events whose created_at is more than this many seconds ahead of now.
    pub created_at_max_ahead_secs: u64,
    /// Refuse events whose created_at is more than this many seconds before now; 0 means no limit.
    pub created_at_max_age_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_event_tags: 2000,
            max_content_length: 65536,
            created_at_max_ahead_secs: 900,
            created_at_max_age_secs: 0,
        }
    }
}

/// A parsed Nostr event with its original JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: [u8; 32],
    pub pubkey: [u8; 32],
    pub created_at: u64,
    pub kind: u16,
    pub tags: Vec<Vec<String>>,
    pub content: String,
    pub sig: [u8; 64],
    raw: Box<str>,
}

/// Deepest JSON nesting accepted anywhere in an event object (the event
/// itself needs 3: the object, `tags`, a tag). Checked before parsing, so
/// no parser ever walks a deeper document.
pub const MAX_EVENT_DEPTH: usize = 8;

/// The seven NIP-01 fields as their exact JSON text, and whether the
/// object had any other field.
#[derive(Default)]
struct Fields<'a> {
    id: Option<&'a RawValue>,
    pubkey: Option<&'a RawValue>,
    created_at: Option<&'a RawValue>,
    kind: Option<&'a RawValue>,
    tags: Option<&'a RawValue>,
    content: Option<&'a RawValue>,
    sig: Option<&'a RawValue>,
    unknown: bool,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    Id,
    Pubkey,
    CreatedAt,
    Kind,
    Tags,
    Content,
    Sig,
    #[serde(other)]
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Fields<'a>, M::Error> {
                let mut f = Fields::default();
                while let Some(key) = map.next_key::<Field>()? {
                    let (slot, name) = match key {
                        Field::Id => (&mut f.id, "id"),
                        Field::Pubkey => (&mut f.pubkey, "pubkey"),
                        Field::CreatedAt => (&mut f.created_at, "created_at"),
                        Field::Kind => (&mut f.kind, "kind"),
                        Field::Tags => (&mut f.tags, "tags"),
                        Field::Content => (&mut f.content, "content"),
                        Field::Sig => (&mut f.sig, "sig"),
                        Field::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            f.unknown = true;
                            continue;
                        }
                    };
                    if slot.is_some() {
                        return Err(serde::de::Error::duplicate_field(name));
                    }
                    *slot = Some(map.next_value()?);
                }
                Ok(f)
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A field's JSON text, or the error serde gives for a missing one.
fn field<'a>(v: Option<&'a RawValue>, name: &'static str) -> Result<&'a str, EventError> {
    v.map(RawValue::get)
        .ok_or_else(|| EventError::Malformed(format!("missing field `{name}`")))
}

/// A field's typed value.
fn typed<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, EventError> {
    serde_json::from_str(text).map_err(|e| EventError::Malformed(short_serde_error(&e)))
}

/// True when `text` nests arrays and objects deeper than `max` (strings
/// are skipped, escapes included). Linear, no recursion.
pub fn nests_deeper_than(text: &str, max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in text.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

impl Event {
    /// Parses an event object from JSON text. The raw form kept (what the
    /// relay stores and serves) is the text itself when the object has only
    /// the seven NIP-01 fields; otherwise those seven are rebuilt, each with
    /// its exact bytes, in NIP-01 order, and anything else is dropped (the
    /// signature covers only them). Nesting deeper than [`MAX_EVENT_DEPTH`]
    /// is refused before any parsing.
    pub fn parse(text: &str) -> Result<Event, EventError> {
        if nests_deeper_than(text, MAX_EVENT_DEPTH) {
            return Err(EventError::TooDeep {
                max: MAX_EVENT_DEPTH,
            });
        }
        let f: Fields<'_> = typed(text)?;
        let (id, pubkey, created_at, kind, tags, content, sig) = (
            field(f.id, "id")?,
            field(f.pubkey, "pubkey")?,
            field(f.created_at, "created_at")?,
            field(f.kind, "kind")?,
            field(f.tags, "tags")?,
            field(f.content, "content")?,
            field(f.sig, "sig")?,
        );
        let raw: Box<str> = if f.unknown {
            format!(
                r#"{{"id":{id},"pubkey":{pubkey},"created_at":{created_at},"kind":{kind},"tags":{tags},"content":{content},"sig":{sig}}}"#
            )
            .into()
        } else {
            text.into()
        };
        let kind: u64 = typed(kind)?;
        Ok(Event {
            id: hex32::decode::<32>(typed(id)?).ok_or(EventError::BadIdHex)?,
            pubkey: hex32::decode::<32>(typed(pubkey)?).ok_or(EventError::BadPubkeyHex)?,
            created_at: typed(created_at)?,
            kind: u16::try_from(kind).map_err(|_| EventError::KindRange(kind))?,
            tags: typed(tags)?,
            content: typed(content)?,
            sig: hex32::decode::<64>(typed(sig)?).ok_or(EventError::BadSigHex)?,
            raw,
        })
    }

    /// The JSON text the event arrived as.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    pub fn id_hex(&self) -> String {
        hex32::encode(&self.id)
    }

    /// The NIP-01 serialization `[0,pubkey,created_at,kind,tags,content]`
    /// whose SHA-256 is the event id.
    pub fn canonical_json(&self) -> Vec<u8> {
        canonical_json(
            &self.pubkey,
            self.created_at,
            self.kind,
            &self.tags,
            &self.content,
        )
    }

    /// SHA-256 of the canonical serialization.
    pub fn compute_id(&self) -> [u8; 32] {
        Sha256::digest(self.canonical_json()).into()
    }

    /// Checks that the id is the hash of the content and the signature is a
    /// valid BIP-340 signature of the id by the pubkey.
    ///
    /// NIP-01 names seven escapes and says every other character is written
    /// as is; the common client libraries (nostr-tools' `JSON.stringify`,
    /// rust-nostr's serde_json) instead escape the other control characters
    /// as `\u00XX`. When the content or tags hold such a character, an id
    /// computed either way is accepted, so events from both camps verify.
    pub fn verify(&self) -> Result<(), EventError> {
        self.check_id()?;
        let pk =
            XOnlyPublicKey::from_byte_array(self.pubkey).map_err(|_| EventError::BadSignature)?;
        self.verify_signature(&pk)
    }

    /// [`Event::verify`] with the author's parsed key taken from `keys`:
    /// parsing an x-only key costs a field square root (about a tenth of a
    /// verify), and bulk loads see the same authors again and again.
    pub fn verify_cached(&self, keys: &mut PubkeyCache) -> Result<(), EventError> {
        self.check_id()?;
        let pk = keys.get(&self.pubkey).ok_or(EventError::BadSignature)?;
        self.verify_signature(&pk)
    }

    fn check_id(&self) -> Result<(), EventError> {
        if self.compute_id() == self.id {
            return Ok(());
        }
        let alt = self.has_other_controls().then(|| -> [u8; 32] {
            Sha256::digest(canonical_json_as(
                &self.pubkey,
                self.created_at,
                self.kind,
                &self.tags,
                &self.content,
                Escapes::AllControls,
            ))
            .into()
        });
        if alt == Some(self.id) {
            Ok(())
        } else {
            Err(EventError::IdMismatch)
        }
    }

    fn verify_signature(&self, pk: &XOnlyPublicKey) -> Result<(), EventError> {
        let sig = schnorr::Signature::from_byte_array(self.sig);
        schnorr::verify(&sig, &self.id, pk).map_err(|_| EventError::BadSignature)
    }

    /// True when content or tags hold a control character other than the
    /// seven NIP-01 escapes, where serializers disagree.
    fn has_other_controls(&self) -> bool {
        let odd = |s: &str| {
            s.bytes()
                .any(|b| b < 0x20 && !matches!(b, b'\n' | b'\r' | b'\t' | 0x08 | 0x0c))
        };
        odd(&self.content) || self.tags.iter().flatten().any(|t| odd(t))
    }

    /// Checks the size limits and the created_at window against `now`
    /// (unix seconds), and refuses events whose NIP-40 expiration has passed.
    pub fn check_limits(&self, limits: &Limits, now: u64) -> Result<(), EventError> {
        if self.tags.len() > limits.max_event_tags {
            return Err(EventError::TooManyTags {
                count: self.tags.len(),
                max: limits.max_event_tags,
            });
        }
        if self.content.len() > limits.max_content_length {
            return Err(EventError::ContentTooLong {
                len: self.content.len(),
                max: limits.max_content_length,
            });
        }
        if self.created_at > now.saturating_add(limits.created_at_max_ahead_secs) {
            return Err(EventError::TooNew {
                created_at: self.created_at,
                max_ahead_secs: limits.created_at_max_ahead_secs,
            });
        }
        if limits.created_at_max_age_secs > 0
            && self.created_at < now.saturating_sub(limits.created_at_max_age_secs)
        {
            return Err(EventError::TooOld {
                created_at: self.created_at,
                max_age_secs: limits.created_at_max_age_secs,
            });
        }
        if let Some(exp) = self.expiration()?
            && exp <= now
        {
            return Err(EventError::Expired);
        }
        Ok(())
    }

    /// The NIP-40 expiration time, if the event carries an `expiration` tag.
    pub fn expiration(&self) -> Result<Option<u64>, EventError> {
        match self.first_tag_value("expiration") {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| EventError::BadExpiration),
        }
    }

    /// Value of the first tag named `name`, if any.
    pub fn first_tag_value(&self, name: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|t| t.len() >= 2 && t[0] == name)
            .map(|t| t[1].as_str())
    }

    /// The `d` tag of an addressable event; a missing tag counts as empty.
    pub fn d_tag(&self) -> &str {
        self.first_tag_value("d").unwrap_or("")
    }

    /// Single-letter tags with a value: the tags NIP-01 filters can select on.
    pub fn indexed_tags(&self) -> impl Iterator<Item = (u8, &str)> {
        self.tags.iter().filter_map(|t| {
            let name = t.first()?.as_bytes();
            let value = t.get(1)?;
            (name.len() == 1 && name[0].is_ascii_alphabetic()).then(|| (name[0], value.as_str()))
        })
    }

    /// True when `self` wins over `other` as the stored version of the same
    /// replaceable or addressable slot: newer, or as new with the lower id.
    pub fn supersedes(&self, other_created_at: u64, other_id: &[u8; 32]) -> bool {
        (self.created_at, std::cmp::Reverse(self.id))
            > (other_created_at, std::cmp::Reverse(*other_id))
    }

    /// Builds and signs an event. For tests and benchmarks, whose keys are
    /// constants; a key read from outside goes through [`Event::try_sign`].
    ///
    /// # Panics
    /// When `secret_key` is not a valid secp256k1 secret key.
    #[allow(clippy::expect_used)] // test and benchmark keys are constants
    pub fn sign(
        secret_key: &[u8; 32],
        created_at: u64,
        kind: u16,
        tags: Vec<Vec<String>>,
        content: &str,
    ) -> Event {
        Event::try_sign(secret_key, created_at, kind, tags, content)
            .expect("secret key must be a valid secp256k1 scalar")
    }

    /// Builds and signs an event; `None` when `secret_key` is not a valid
    /// secp256k1 secret key (zero, or not below the curve order). The
    /// relay never signs anything; its tools (`sluice admin`, `sluice
    /// sync`) do.
    pub fn try_sign(
        secret_key: &[u8; 32],
        created_at: u64,
        kind: u16,
        tags: Vec<Vec<String>>,
        content: &str,
    ) -> Option<Event> {
        let keypair = secp256k1::Keypair::from_secret_bytes(*secret_key).ok()?;
        let (xonly, _) = keypair.x_only_public_key();
        let pubkey = xonly.to_byte_array();
        let canonical = canonical_json(&pubkey, created_at, kind, &tags, content);
        let id: [u8; 32] = Sha256::digest(&canonical).into();
        let sig = schnorr::sign_no_aux_rand(&id, &keypair).to_byte_array();
        let raw = serde_json::json!({
            "id": hex32::encode(&id),
            "pubkey": hex32::encode(&pubkey),
            "created_at": created_at,
            "kind": kind,
            "tags": tags,
            "content": content,
            "sig": hex32::encode(&sig),
        })
        .to_string();
        Some(Event {
            id,
            pubkey,
            created_at,
            kind,
            tags,
            content: content.to_owned(),
            sig,
            raw: raw.into(),
        })
    }
}

/// The public key (x-only, 32 bytes) of a secret key. For tests and
/// benchmarks, whose keys are constants; a key read from outside goes
/// through [`try_public_key_of`].
///
/// # Panics
/// When `secret_key` is not a valid secp256k1 secret key.
#[allow(clippy::expect_used)] // test and benchmark keys are constants
pub fn public_key_of(secret_key: &[u8; 32]) -> [u8; 32] {
    let keypair = secp256k1::Keypair::from_secret_bytes(*secret_key)
        .expect("secret key must be a valid secp256k1 scalar");
    keypair.x_only_public_key().0.to_byte_array()
}

/// The public key of a secret key, or `None` when the bytes are not a
/// valid secp256k1 secret key (zero, or not below the curve order).
pub fn try_public_key_of(secret_key: &[u8; 32]) -> Option<[u8; 32]> {
    secp256k1::Keypair::from_secret_bytes(*secret_key)
        .ok()
        .map(|k| k.x_only_public_key().0.to_byte_array())
}

/// How strings are escaped in the id serialization.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escapes {
    /// NIP-01: the seven named escapes only.
    Nip01,
    /// JSON.stringify / serde_json: also `\u00XX` for other control characters.
    AllControls,
}

fn canonical_json(
    pubkey: &[u8; 32],
    created_at: u64,
    kind: u16,
    tags: &[Vec<String>],
    content: &str,
) -> Vec<u8> {
    canonical_json_as(pubkey, created_at, kind, tags, content, Escapes::Nip01)
}

fn canonical_json_as(
    pubkey: &[u8; 32],
    created_at: u64,
    kind: u16,
    tags: &[Vec<String>],
    content: &str,
    escapes: Escapes,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + content.len() + tags.len() * 80);
    out.extend_from_slice(b"[0,\"");
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in pubkey {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0xf)]);
    }
    out.extend_from_slice(b"\",");
    out.extend_from_slice(created_at.to_string().as_bytes());
    out.push(b',');
    out.extend_from_slice(kind.to_string().as_bytes());
    out.extend_from_slice(b",[");
    for (i, tag) in tags.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (j, s) in tag.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            write_json_string(&mut out, s, escapes);
        }
        out.push(b']');
    }
    out.extend_from_slice(b"],");
    write_json_string(&mut out, content, escapes);
    out.push(b']');
    out
}

/// Bytes that may need an escape in a JSON string: controls, `"` and backslash.
const MAY_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Whether any of the eight bytes of `w` is one [`MAY_ESCAPE`] names
/// (never false when one is): a word without one is copied as it is.
fn word_may_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte below `n` (n <= 128) sets its high bit in (w - n) & !w.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let controls = below(w, 0x20);
    let quotes = below(w ^ (ONES * u64::from(b'"')), 1);
    let backslashes = below(w ^ (ONES * u64::from(b'\\')), 1);
    controls | quotes | backslashes != 0
}

/// Writes a JSON string with exactly the seven escapes NIP-01 names
/// (`\n \" \\ \r \t \b \f`); every other character is written as is,
/// unless `escapes` asks for `\u00XX` on the other control characters.
/// Runs of eight bytes with nothing to escape are passed over a word at a
/// time (an event's id is the hash of this text, computed for every event
/// received).
fn write_json_string(out: &mut Vec<u8>, s: &str, escapes: Escapes) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Bytes before `start` are written; `i` is the next to look at.
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8)
            && let Ok(word) = <[u8; 8]>::try_from(word)
            && !word_may_escape(u64::from_le_bytes(word))
        {
            i += 8;
            continue;
        }
        let b = bytes[i];
        i += 1;
        if !MAY_ESCAPE[b as usize] {
            continue;
        }
        let esc: &[u8] = match b {
            b'\n' => b"\\n",
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            c if escapes == Escapes::AllControls => {
                out.extend_from_slice(&bytes[start..i - 1]);
                out.extend_from_slice(format!("\\u{c:04x}").as_bytes());
                start = i;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i - 1]);
        out.extend_from_slice(esc);
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// serde_json errors carry line and column; keep the message short and
/// free of the offending input.
pub(crate) fn short_serde_error(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod unsigned_fields {
    use super::*;

    const SK: [u8; 32] = [9u8; 32];

    /// `ev` as a JSON object text with `extra` spliced in before `"id"`.
    fn with_extra(ev: &Event, extra: &str) -> String {
        format!("{{{extra},{}", &ev.raw()[1..])
    }

    #[test]
    fn unknown_fields_are_dropped_and_the_seven_kept_exactly_in_order() {
        let ev = Event::sign(
            &SK,
            1_700_000_000,
            1,
            vec![vec!["t".into(), "x".into()]],
            "hi \u{e9}",
        );
        let text = with_extra(
            &ev,
            r#""relays":["wss://a"],"junk":{"deep":[[1,2],{"x":null}]}"#,
        );
        let parsed = Event::parse(&text).unwrap();
        parsed.verify().unwrap();
        assert_eq!(parsed.content, ev.content);
        assert!(!parsed.raw().contains("junk") && !parsed.raw().contains("relays"));
        // The seven in NIP-01 order, each value's bytes as sent.
        let v: serde_json::Value = serde_json::from_str(parsed.raw()).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 7);
        assert!(
            parsed
                .raw()
                .starts_with(&format!(r#"{{"id":"{}","pubkey":"#, ev.id_hex()))
        );
        assert!(
            parsed
                .raw()
                .ends_with(&format!(r#""sig":"{}"}}"#, hex32::encode(&ev.sig)))
        );
        // Parsing the kept form again keeps it byte for byte.
        assert_eq!(Event::parse(parsed.raw()).unwrap().raw(), parsed.raw());
    }

    #[test]
    fn an_event_with_only_the_seven_is_kept_byte_for_byte() {
        let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "x");
        let spaced = ev.raw().replace(",\"", " ,  \"");
        assert_eq!(Event::parse(&spaced).unwrap().raw(), spaced);
    }

    #[test]
    fn a_duplicate_field_is_refused() {
        let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "x");
        let text = with_extra(&ev, r#""content":"other""#);
        assert!(
            matches!(Event::parse(&text), Err(EventError::Malformed(m)) if m.contains("duplicate field `content`"))
        );
    }

    #[test]
    fn nesting_is_refused_before_parsing_at_any_depth() {
        let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "x");
        let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
        let text = with_extra(&ev, &format!(r#""junk":{deep}"#));
        assert_eq!(
            Event::parse(&text),
            Err(EventError::TooDeep {
                max: MAX_EVENT_DEPTH
            })
        );
        // Brackets inside strings do not count; escapes are followed.
        assert!(!nests_deeper_than(r#"{"a":"[[[[\"[[[[[[[[[["}"#, 1));
        assert!(nests_deeper_than(r#"{"a":[[]]}"#, 2));
        assert!(!nests_deeper_than(r#"{"a":[[]]}"#, 3));
    }
}
