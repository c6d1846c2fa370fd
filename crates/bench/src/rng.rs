//! A tiny deterministic pseudo-random generator (SplitMix64) and the few
//! distributions the generators need. Deterministic by construction: the same
//! seed always yields the same sequence on every platform, which is what makes
//! `gen` output and query mixes reproducible. Not for cryptography.

/// SplitMix64: 64 bits of state, passes BigCrush, trivially seedable.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// A generator for a sub-stream, so independent parts of a run (for
    /// example each client) draw from sequences that do not overlap in practice.
    pub fn fork(&mut self, stream: u64) -> Rng {
        Rng::new(self.next_u64() ^ stream.wrapping_mul(0xA076_1D64_78BD_642F))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`; `n` must be positive. The modulo bias is below
    /// 2^-32 for the sizes used here, which is irrelevant for load shapes.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.next_u64() % n
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Exponentially distributed with the given mean, capped at `max`: the
    /// usual shape of message lengths (many short, a long tail).
    pub fn exp_capped(&mut self, mean: f64, max: u64) -> u64 {
        let u = 1.0 - self.unit(); // in (0, 1]
        let v = -mean * u.ln();
        (v as u64).min(max)
    }

    /// An index in `[0, n)` skewed towards 0: a cheap power-law stand-in for
    /// Zipf (popular authors, popular topics, recent events).
    pub fn skewed(&mut self, n: u64) -> u64 {
        let u = self.unit();
        ((u * u * u) * n as f64) as u64 % n.max(1)
    }

    /// Picks an index by integer weights.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        let mut r = self.below(total.max(1));
        for (i, w) in weights.iter().enumerate() {
            let w = u64::from(*w);
            if r < w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }

    pub fn bytes32(&mut self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        out
    }

    /// A valid secp256k1 secret key: the top byte is kept below 0xff so the
    /// scalar is below the group order, and the key is never zero.
    pub fn secret_key(&mut self) -> [u8; 32] {
        let mut sk = self.bytes32();
        sk[0] &= 0x7f;
        sk[31] |= 1;
        sk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let a: Vec<u64> = (0..5)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..5)
            .scan(Rng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn weighted_respects_zero_weights() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert_ne!(r.weighted(&[3, 0, 5]), 1);
        }
    }

    #[test]
    fn unit_is_in_range() {
        let mut r = Rng::new(3);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
