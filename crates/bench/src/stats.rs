//! Latency percentiles and outcome counters.
//!
//! `Histogram` is HDR-style: log-linear buckets over microseconds with 128
//! sub-buckets per power of two, so any recorded value is reported within
//! 1% of its true value, memory is fixed (about 60 KB) whatever the run
//! length, and histograms merge by adding counts. `percentile_sorted` is the
//! exact nearest-rank reference the tests compare it with.
//! `PrefixCounts` counts NIP-01 reason prefixes with a fixed cap on distinct
//! labels, so a relay that sends free text cannot grow it without bound.

use std::collections::BTreeMap;

use serde::Serialize;

const SUB_BITS: u32 = 7;
const SUB_COUNT: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB_COUNT;

/// A fixed-size log-linear histogram of microsecond values.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram({:?})", self.summary())
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB_COUNT as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let shift = exp - SUB_BITS;
    let mantissa = (v >> shift) as usize; // in [SUB_COUNT, 2 * SUB_COUNT)
    ((shift as usize + 1) << SUB_BITS) + (mantissa - SUB_COUNT)
}

/// The midpoint of a bucket's value range.
fn value_of(bucket: usize) -> u64 {
    if bucket < 2 * SUB_COUNT {
        return bucket as u64;
    }
    let shift = (bucket >> SUB_BITS) - 1;
    let mantissa = (bucket & (SUB_COUNT - 1)) + SUB_COUNT;
    let low = (mantissa as u64) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Histogram {
    pub fn record(&mut self, value_us: u64) {
        self.counts[bucket_of(value_us)] += 1;
        self.total += 1;
        self.sum += u128::from(value_us);
        self.min = self.min.min(value_us);
        self.max = self.max.max(value_us);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    pub fn reset(&mut self) {
        *self = Histogram::default();
    }

    /// The nearest-rank percentile, `q` in `[0, 1]`; 0 when empty.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = rank_for(q, self.total);
        let mut seen = 0u64;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return value_of(bucket).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn summary(&self) -> LatencySummary {
        let ms = |us: u64| us as f64 / 1000.0;
        let mean = if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64 / 1000.0
        };
        LatencySummary {
            count: self.total,
            mean_ms: mean,
            p50_ms: ms(self.percentile(0.50)),
            p90_ms: ms(self.percentile(0.90)),
            p99_ms: ms(self.percentile(0.99)),
            p999_ms: ms(self.percentile(0.999)),
            max_ms: ms(if self.total == 0 { 0 } else { self.max }),
        }
    }
}

/// Nearest rank: the smallest rank whose cumulative share reaches `q`.
fn rank_for(q: f64, total: u64) -> u64 {
    let q = q.clamp(0.0, 1.0);
    ((q * total as f64).ceil() as u64).clamp(1, total)
}

/// The exact nearest-rank percentile of a sorted slice; 0 when empty.
pub fn percentile_sorted(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(rank_for(q, sorted.len() as u64) - 1) as usize]
}

/// Latency percentiles in milliseconds, as reported in every JSON file.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl std::fmt::Display for LatencySummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
            self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        )
    }
}

/// Most distinct prefixes kept; the rest are counted under `other`.
const MAX_PREFIXES: usize = 32;

/// Counts of NIP-01 reason prefixes (`duplicate`, `rate-limited`, ...).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct PrefixCounts(pub BTreeMap<String, u64>);

/// The first full message seen for each prefix, so a report can show what
/// the relay actually said. Bounded like `PrefixCounts`.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Examples(pub BTreeMap<String, String>);

impl Examples {
    pub fn add(&mut self, message: &str) {
        if self.0.len() < MAX_PREFIXES {
            let text: String = message.chars().take(200).collect();
            self.0.entry(prefix_of(message)).or_insert(text);
        }
    }

    pub fn merge(&mut self, other: &Examples) {
        for m in other.0.values() {
            self.add(m);
        }
    }
}

impl PrefixCounts {
    pub fn add(&mut self, message: &str) {
        self.add_n(&prefix_of(message), 1);
    }

    /// Counts `key` as it is (truncated to 100 characters), not by prefix.
    pub fn add_key(&mut self, key: &str) {
        let key: String = key.chars().take(100).collect();
        self.add_n(&key, 1);
    }

    fn add_n(&mut self, prefix: &str, n: u64) {
        if let Some(c) = self.0.get_mut(prefix) {
            *c += n;
        } else if self.0.len() < MAX_PREFIXES {
            self.0.insert(prefix.to_owned(), n);
        } else {
            *self.0.entry("other".to_owned()).or_default() += n;
        }
    }

    pub fn merge(&mut self, other: &PrefixCounts) {
        for (k, v) in &other.0 {
            self.add_n(k, *v);
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

impl std::fmt::Display for PrefixCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return write!(f, "none");
        }
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        write!(f, "{}", parts.join(", "))
    }
}

/// The machine-readable prefix of an OK or CLOSED message: the word before
/// the first colon when it looks like one (`rate-limited: slow down`), else
/// `(none)` for an empty message and `(text)` for free text.
pub fn prefix_of(message: &str) -> String {
    if message.is_empty() {
        return "(none)".to_owned();
    }
    match message.split_once(':') {
        Some((p, _))
            if !p.is_empty()
                && p.len() <= 24
                && p.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') =>
        {
            p.to_owned()
        }
        _ => "(text)".to_owned(),
    }
}

/// Per-second rate, safe for a zero duration.
pub fn per_sec(count: u64, secs: f64) -> f64 {
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn buckets_round_trip_small_values_exactly() {
        for v in 0..256u64 {
            assert_eq!(value_of(bucket_of(v)), v);
        }
    }

    #[test]
    fn buckets_are_monotonic_and_in_range() {
        let mut last = 0;
        for shift in 0..64 {
            let v = 1u64 << shift;
            let b = bucket_of(v);
            assert!(b >= last && b < BUCKETS);
            last = b;
        }
        assert!(bucket_of(u64::MAX) < BUCKETS);
    }

    #[test]
    fn sorted_percentiles_use_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&v, 0.5), 50);
        assert_eq!(percentile_sorted(&v, 0.9), 90);
        assert_eq!(percentile_sorted(&v, 0.99), 99);
        assert_eq!(percentile_sorted(&v, 0.999), 100);
        assert_eq!(percentile_sorted(&v, 0.0), 1);
        assert_eq!(percentile_sorted(&v, 1.0), 100);
        assert_eq!(percentile_sorted(&[], 0.5), 0);
        assert_eq!(percentile_sorted(&[7], 0.999), 7);
    }

    #[test]
    fn histogram_matches_exact_percentiles_within_one_percent() {
        let mut rng = Rng::new(42);
        let mut h = Histogram::default();
        let mut exact = Vec::new();
        for _ in 0..50_000 {
            let v = rng.exp_capped(5_000.0, 10_000_000) + rng.below(3);
            h.record(v);
            exact.push(v);
        }
        exact.sort_unstable();
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let want = percentile_sorted(&exact, q) as f64;
            let got = h.percentile(q) as f64;
            assert!(
                (got - want).abs() <= want * 0.01 + 1.0,
                "q={q} got {got} want {want}"
            );
        }
    }

    #[test]
    fn histogram_merge_equals_single() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        let mut all = Histogram::default();
        for v in 0..1000u64 {
            let x = v * v;
            if v % 2 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            all.record(x);
        }
        a.merge(&b);
        assert_eq!(a.summary(), all.summary());
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let s = Histogram::default().summary();
        assert_eq!(s, LatencySummary::default());
    }

    #[test]
    fn prefixes_are_recognised_and_bounded() {
        assert_eq!(prefix_of("rate-limited: slow down"), "rate-limited");
        assert_eq!(prefix_of("duplicate: already have it"), "duplicate");
        assert_eq!(prefix_of(""), "(none)");
        assert_eq!(prefix_of("Hello: world"), "(text)");
        assert_eq!(prefix_of("no colon"), "(text)");
        let mut p = PrefixCounts::default();
        for i in 0..100 {
            p.add_n(&format!("p{i}"), 1);
        }
        assert_eq!(p.0.len(), MAX_PREFIXES + 1);
        assert_eq!(p.total(), 100);
    }
}
