//! Bech32 (BIP-173) encoding, for NIP-19's `npub`: the form a person copies
//! a pubkey in. Encoding only: the relay shows keys, it never reads them in
//! this form.

const CHARSET: &[u8; 32] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";
const GENERATOR: [u32; 5] = [
    0x3b6a_57b2,
    0x2650_8e6d,
    0x1ea1_19fa,
    0x3d42_33dd,
    0x2a14_62b3,
];

/// NIP-19 `npub1…` of a 32-byte public key.
pub fn npub(pubkey: &[u8; 32]) -> String {
    encode("npub", pubkey)
}

/// `hrp` (lowercase ASCII), `1`, `bytes` in 5-bit groups (the last one
/// padded with zero bits), and the six-character checksum.
pub fn encode(hrp: &str, bytes: &[u8]) -> String {
    let data = to_five_bits(bytes);
    let mut values: Vec<u8> = hrp.bytes().map(|c| c >> 5).collect();
    values.push(0);
    values.extend(hrp.bytes().map(|c| c & 31));
    values.extend_from_slice(&data);
    values.extend_from_slice(&[0; 6]);
    let check = polymod(&values) ^ 1;
    let mut out = String::with_capacity(hrp.len() + 1 + data.len() + 6);
    out.push_str(hrp);
    out.push('1');
    let checksum = (0..6).map(|i| ((check >> (5 * (5 - i))) & 31) as u8);
    for v in data.iter().copied().chain(checksum) {
        out.push(char::from(CHARSET[usize::from(v)]));
    }
    out
}

fn to_five_bits(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity((bytes.len() * 8).div_ceil(5));
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(((acc >> bits) & 31) as u8);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(((acc << (5 - bits)) & 31) as u8);
    }
    out
}

fn polymod(values: &[u8]) -> u32 {
    let mut chk: u32 = 1;
    for &v in values {
        let top = chk >> 25;
        chk = ((chk & 0x01ff_ffff) << 5) ^ u32::from(v);
        for (i, g) in GENERATOR.iter().enumerate() {
            if (top >> i) & 1 == 1 {
                chk ^= g;
            }
        }
    }
    chk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nip19_example_key() {
        let hex = "3bf0c63fcb93463407af97a5e5ee64fa883d107ef9e558472c4eb9aaaefa459d";
        let key = crate::hex32::decode::<32>(hex).unwrap();
        assert_eq!(
            npub(&key),
            "npub180cvv07tjdrrgpa0j7j7tmnyl2yr6yr7l8j4s3evf6u64th6gkwsyjh6w6"
        );
    }

    #[test]
    fn bip173_vectors_with_whole_bytes() {
        // Valid strings of BIP-173 whose data is a whole number of bytes.
        assert_eq!(encode("a", &[]), "a12uel5l");
        assert_eq!(
            encode("abcdef", &to_bytes(&(0..32).collect::<Vec<u8>>())),
            "abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw"
        );
    }

    /// The bytes whose 5-bit groups are `fives` (a multiple of 8 groups).
    fn to_bytes(fives: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u32, 0u32);
        for &f in fives {
            acc = (acc << 5) | u32::from(f);
            bits += 5;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        out
    }

    #[test]
    fn a_partial_last_group_is_padded_with_zero_bits() {
        assert_eq!(to_five_bits(&[0xff]), vec![31, 28]);
        assert_eq!(to_five_bits(&[0x00, 0x01]), vec![0, 0, 0, 0b10000]);
    }
}
