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

    #[test]
    fn mixed_case_and_the_characters_next_to_each_range_are_refused() {
        // NIP-01 hex is lowercase: one uppercase digit anywhere spoils it.
        assert!(decode::<2>("0aFf").is_none());
        assert!(decode::<2>("A0ff").is_none());
        // The bytes just outside '0'..='9' and 'a'..='f'.
        for c in ['/', ':', '`', 'g', 'G', '@', ' '] {
            let s = format!("0{c}ff");
            assert!(decode::<2>(&s).is_none(), "{s:?}");
        }
        // Every digit at both positions of a byte.
        let all: [u8; 8] = decode("0123456789abcdef").unwrap();
        assert_eq!(all, [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
        let swapped: [u8; 8] = decode("1032547698badcfe").unwrap();
        assert_eq!(swapped, [0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe]);
    }
}
