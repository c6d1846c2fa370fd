//! Strict lowercase hex for the fixed-size values of Nostr (ids, pubkeys,
//! signatures). NIP-01 requires lowercase; uppercase is refused.

/// Decodes exactly `N` bytes from `2 * N` lowercase hex characters.
pub fn decode<const N: usize>(s: &str) -> Option<[u8; N]> {
    let bytes = s.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex of any byte string.
pub fn encode(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_strictness() {
        let v: [u8; 2] = decode("0aff").unwrap();
        assert_eq!(v, [0x0a, 0xff]);
        assert_eq!(encode(&v), "0aff");
        assert!(decode::<2>("0AFF").is_none());
        assert!(decode::<2>("0af").is_none());
        assert!(decode::<2>("0afg").is_none());
    }
}
