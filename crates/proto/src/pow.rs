//! NIP-13 proof of work: an event's difficulty is the number of leading
//! zero bits of its id, counted only up to the target the author committed
//! to in its `nonce` tag (`["nonce", "<n>", "<target>"]`). Without a
//! committed target an event has difficulty 0, whatever its id: a lucky id
//! was not paid for, and a committed target keeps a miner from passing off
//! work done for a lower target (NIP-13, "Delegated Proof of Work" aside).
//!
//! Reading it costs a scan of the tags and of at most 32 bytes: it runs
//! before the signature check.

use crate::Event;

/// Leading zero bits of `id` (0..=256).
pub fn leading_zero_bits(id: &[u8; 32]) -> u32 {
    let mut bits = 0;
    for &b in id {
        if b == 0 {
            bits += 8;
        } else {
            return bits + b.leading_zeros();
        }
    }
    bits
}

/// The target committed in the first `nonce` tag, if it has one that is a
/// number.
pub fn committed_target(ev: &Event) -> Option<u32> {
    let tag = ev
        .tags
        .iter()
        .find(|t| t.first().is_some_and(|n| n == "nonce"))?;
    tag.get(2)?.trim().parse().ok()
}

/// The event's NIP-13 difficulty: its id's leading zero bits, at most its
/// committed target; 0 without one.
pub fn difficulty(ev: &Event) -> u32 {
    committed_target(ev).map_or(0, |target| leading_zero_bits(&ev.id).min(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_zero_bits_count_whole_bytes_then_the_first_set_bit() {
        let mut id = [0u8; 32];
        assert_eq!(leading_zero_bits(&id), 256);
        id[0] = 0x80;
        assert_eq!(leading_zero_bits(&id), 0);
        id[0] = 0x01;
        assert_eq!(leading_zero_bits(&id), 7);
        id[0] = 0;
        id[1] = 0x0f;
        assert_eq!(leading_zero_bits(&id), 12);
        id[1] = 0;
        id[31] = 1;
        assert_eq!(leading_zero_bits(&id), 255);
    }

    /// Mines a note of key 1 until its id has `bits` leading zero bits,
    /// committing to `target`.
    fn mined(bits: u32, target: &str) -> Event {
        (0u64..)
            .map(|n| {
                Event::sign(
                    &[1; 32],
                    1_700_000_000,
                    1,
                    vec![vec!["nonce".into(), n.to_string(), target.into()]],
                    "mined",
                )
            })
            .find(|e| leading_zero_bits(&e.id) >= bits)
            .unwrap()
    }

    #[test]
    fn difficulty_is_the_id_work_capped_by_the_committed_target() {
        let e = mined(8, "8");
        let work = leading_zero_bits(&e.id);
        assert!(work >= 8);
        assert_eq!(difficulty(&e), 8, "capped at its target");
        assert_eq!(committed_target(&e), Some(8));
        let e = mined(6, "20");
        assert_eq!(difficulty(&e), leading_zero_bits(&e.id).min(20));
        assert!(difficulty(&e) >= 6);
    }

    #[test]
    fn without_a_committed_target_an_event_has_no_difficulty() {
        let bare = |tags: Vec<Vec<String>>| {
            (0u64..)
                .map(|n| Event::sign(&[2; 32], 1_700_000_000 + n, 1, tags.clone(), "x"))
                .find(|e| leading_zero_bits(&e.id) >= 4)
                .unwrap()
        };
        assert_eq!(difficulty(&bare(vec![])), 0, "a lucky id is not work");
        let no_target = bare(vec![vec!["nonce".into(), "5".into()]]);
        assert_eq!(committed_target(&no_target), None);
        assert_eq!(difficulty(&no_target), 0);
        let junk = bare(vec![vec!["nonce".into(), "5".into(), "lots".into()]]);
        assert_eq!(difficulty(&junk), 0);
    }
}
