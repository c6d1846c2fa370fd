//! Strict lowercase hex for the fixed-size values of Nostr (ids, pubkeys,
//! signatures). NIP-01 requires lowercase; uppercase is refused.

/// Decodes exactly `N` bytes from `2 * N` lowercase hex characters.
///
/// One table lookup per character and no branch per byte: every id,
/// pubkey, signature and tag value of an import goes through here (the
/// writer classifies each tag value by it).
pub fn decode<const N: usize>(s: &str) -> Option<[u8; N]> {
    let bytes = s.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    // Digits' values are under 16, so their union is too; one `NOT_HEX`
    // (all bits set) makes it `NOT_HEX`.
    let mut seen = 0u8;
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let (hi, lo) = (NIBBLE[pair[0] as usize], NIBBLE[pair[1] as usize]);
        seen |= hi | lo;
        *o = (hi << 4) | lo;
    }
    (seen != NOT_HEX).then_some(out)
}

/// What [`NIBBLE`] holds for a byte that is not a lowercase hex digit.
const NOT_HEX: u8 = 0xff;

/// Each byte's value as a lowercase hex digit, or [`NOT_HEX`].
const NIBBLE: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

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

    #[test]
    fn every_byte_is_a_digit_only_where_lowercase_hex_says_so() {
        for c in 0..=255u8 {
            let s = [b'0', c];
            let got = std::str::from_utf8(&s).ok().and_then(decode::<1>);
            let want = (c as char).to_digit(16).filter(|_| !c.is_ascii_uppercase());
            assert_eq!(got, want.map(|d| [d as u8]), "{c}");
        }
        // A bad character anywhere, alone or with others, in any pair.
        for s in ["zz00", "00zz", "zzzz", "z0z0", "0z0z", "GGGG", "ffz0"] {
            assert!(decode::<2>(s).is_none(), "{s:?}");
        }
    }
}
