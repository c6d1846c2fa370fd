use super::*;

/// Takes until refused, failing (not spinning) if it never is.
fn drain(mut take: impl FnMut() -> bool) {
    for _ in 0..1_000_000 {
        if !take() {
            return;
        }
    }
    panic!("never refused");
}

const SEC: u64 = 1_000_000_000;

fn config(rate: f64) -> BucketConfig {
    BucketConfig {
        rate_per_s: rate,
        burst_ratio: 1.0,
        window_ms: 1000,
        catch_up_ms: 0,
    }
}

/// Walks the LRU list both ways and checks it against the index.
fn assert_consistent<K: Hash + Eq + Clone + std::fmt::Debug>(m: &KeyedBuckets<K>) {
    assert!(m.len() <= m.max_keys);
    assert_eq!(m.index.len(), m.slots.len());
    let mut forward = 0;
    let mut cur = m.head;
    let mut prev = NIL;
    while cur != NIL {
        let s = &m.slots[cur as usize];
        assert_eq!(s.prev, prev);
        assert_eq!(m.index[&s.key], cur);
        prev = cur;
        cur = s.next;
        forward += 1;
        assert!(forward <= m.slots.len(), "cycle");
    }
    assert_eq!(prev, m.tail);
    assert_eq!(forward, m.slots.len());
}

#[test]
fn keys_have_separate_buckets() {
    let mut m = KeyedBuckets::new(config(2.0), 10).unwrap();
    // Pool: 1 s at 2/s = 2 ops.
    assert!(m.check(&"a", 0, 1).is_ok());
    assert!(m.check(&"a", 0, 1).is_ok());
    assert!(m.check(&"a", 0, 1).is_err());
    assert!(m.check(&"b", 0, 1).is_ok());
    let s = m.stats();
    assert_eq!((s.keys, s.allowed_total, s.refused_total), (2, 3, 1));
}

#[test]
fn bound_is_never_exceeded_and_lru_is_evicted() {
    let mut m = KeyedBuckets::new(config(10.0), 100).unwrap();
    for k in 0..10_000u32 {
        m.check(&k, u64::from(k) * 1_000, 1).unwrap();
        assert!(m.len() <= 100);
    }
    assert_consistent(&m);
    assert_eq!(m.len(), 100);
    // The last 100 keys are the ones kept.
    for k in 9_900..10_000u32 {
        assert!(m.index.contains_key(&k));
    }
    let s = m.stats();
    assert_eq!(s.evicted_idle_total + s.evicted_active_total, 9_900);
}

#[test]
fn recently_used_keys_survive_eviction() {
    let mut m = KeyedBuckets::new(config(1000.0), 3).unwrap();
    m.check(&1, 0, 1).unwrap();
    m.check(&2, 0, 1).unwrap();
    m.check(&3, 0, 1).unwrap();
    m.check(&1, 1, 1).unwrap(); // 1 is now most recent; 2 is LRU
    m.check(&4, 2, 1).unwrap();
    assert!(!m.index.contains_key(&2));
    assert!(m.index.contains_key(&1) && m.index.contains_key(&3));
    assert_consistent(&m);
}

#[test]
fn evicting_a_full_bucket_is_counted_as_idle_and_loses_nothing() {
    let mut m = KeyedBuckets::new(config(10.0), 1).unwrap();
    m.check(&"a", 0, 1).unwrap();
    // "a" is full again after one interval (0.1 s).
    m.check(&"b", SEC, 1).unwrap();
    assert_eq!(m.stats().evicted_idle_total, 1);
    // "b" has used one op; evicting it at once is a loss.
    m.check(&"c", SEC, 1).unwrap();
    assert_eq!(m.stats().evicted_active_total, 1);
}

#[test]
fn a_flooder_is_refused_while_a_polite_key_is_not() {
    let mut m = KeyedBuckets::new(config(5.0), 1000).unwrap();
    let (mut flood_ok, mut polite_ok) = (0, 0);
    for ms in 0..10_000u64 {
        let now = ms * 1_000_000;
        if m.check(&"flooder", now, 1).is_ok() {
            flood_ok += 1;
        }
        if ms % 500 == 0 && m.check(&"polite", now, 1).is_ok() {
            polite_ok += 1;
        }
    }
    assert_eq!(polite_ok, 20);
    assert!((50..=56).contains(&flood_ok), "{flood_ok}");
}

#[test]
fn set_rate_applies_to_every_key() {
    let mut m = KeyedBuckets::new(config(100.0), 10).unwrap();
    for k in 0..3 {
        drain(|| m.check(&k, 0, 1).is_ok());
    }
    m.set_rate(1.0);
    assert_eq!(m.rate_per_s(), 1.0);
    for k in 0..3 {
        // One op now costs 1 s: 0.5 s of refill is not enough.
        assert!(m.check(&k, SEC / 2, 1).is_err());
        assert!(m.check(&k, SEC + SEC / 2, 1).is_ok());
    }
}

#[test]
fn usage_is_counted_per_key_once_per_drain_and_remote_use_is_debt() {
    let mut m = KeyedBuckets::new(config(10.0), 2).unwrap();
    m.check(&"a", 0, 1).unwrap();
    let mut out = Vec::new();
    m.drain_usage(&mut out);
    assert!(out.is_empty(), "not tracked by default");
    m.set_usage_tracking(true);
    for _ in 0..3 {
        m.check(&"a", 0, 1).unwrap();
    }
    m.check(&"b", 0, 2).unwrap();
    m.drain_usage(&mut out);
    out.sort();
    assert_eq!(out, vec![("a", 3), ("b", 2)]);
    out.clear();
    m.drain_usage(&mut out);
    assert!(out.is_empty());
    // Eviction of a key with undrained use: the new key starts at 0.
    m.check(&"a", 0, 1).unwrap();
    m.check(&"c", 0, 1).unwrap(); // evicts "b" (LRU)
    m.drain_usage(&mut out);
    out.sort();
    assert_eq!(out, vec![("a", 1), ("c", 1)]);
    // Remote use: debt on a known key, nothing for an unknown one.
    assert!(m.charge_remote(&"a", 0, 100));
    assert!(m.check(&"a", 0, 1).is_err());
    assert!(!m.charge_remote(&"zz", 0, 100));
    assert_eq!(m.len(), 2);
    assert_consistent(&m);
}

#[test]
fn shrinking_the_bound_keeps_the_most_recent() {
    let mut m = KeyedBuckets::new(config(100.0), 10).unwrap();
    for k in 0..10 {
        m.check(&k, k, 1).unwrap();
    }
    m.set_config(config(100.0), 4).unwrap();
    assert_eq!(m.len(), 4);
    assert_consistent(&m);
    for k in 6..10 {
        assert!(m.index.contains_key(&k));
    }
    assert_eq!(m.stats().evicted_active_total, 6);
    // Still works after the rebuild.
    for k in 100..120 {
        m.check(&k, 1000, 1).unwrap();
    }
    assert_eq!(m.len(), 4);
    assert_consistent(&m);
    assert!(m.set_config(config(100.0), 0).is_err());
}

#[test]
fn stopping_usage_tracking_forgets_and_starting_again_keeps() {
    let mut m = KeyedBuckets::new(config(10.0), 4).unwrap();
    let mut out = Vec::new();
    m.set_usage_tracking(true);
    m.check(&"a", 0, 2).unwrap();
    m.set_usage_tracking(true);
    m.drain_usage(&mut out);
    assert_eq!(out, vec![("a", 2)], "turning it on again forgets nothing");
    out.clear();
    m.check(&"a", 0, 1).unwrap();
    m.set_usage_tracking(false);
    m.set_usage_tracking(true);
    m.drain_usage(&mut out);
    assert!(out.is_empty(), "stopping forgets what was counted");
    // A key used at cost 0 has nothing to report.
    m.check(&"b", 0, 0).unwrap();
    m.drain_usage(&mut out);
    assert!(out.is_empty());
}

#[test]
fn settle_charges_a_positive_delta_and_refunds_a_negative_one() {
    let mut m = KeyedBuckets::new(config(10.0), 4).unwrap();
    // Zero: nothing to refund, no bucket made.
    m.settle(&"a", 0, 0);
    assert!(m.is_empty());
    m.settle(&"a", 0, 10);
    assert_eq!(m.len(), 1);
    assert!(!m.is_empty());
    assert!(m.check(&"a", 0, 1).is_err(), "the pool (10) is spent");
    m.settle(&"a", 0, -5);
    assert!(m.check(&"a", 0, 5).is_ok(), "5 given back");
    // charge: debt beyond the pool, on a new key too.
    m.charge(&"b", 0, 15);
    assert!(m.check(&"b", SEC / 2, 1).is_err(), "5 of debt left");
    assert!(m.check(&"b", SEC, 1).is_ok());
}

#[test]
fn the_rate_reads_back_as_set() {
    let mut m: KeyedBuckets<u32> = KeyedBuckets::new(config(10.0), 4).unwrap();
    assert_eq!(m.rate_per_s(), 10.0);
    m.set_rate(3.5);
    assert_eq!(m.rate_per_s(), 3.5);
}

#[test]
fn a_reload_at_the_same_bound_keeps_undrained_use() {
    let mut m = KeyedBuckets::new(config(10.0), 2).unwrap();
    m.set_usage_tracking(true);
    m.check(&"a", 0, 1).unwrap();
    m.check(&"b", 0, 1).unwrap();
    m.set_config(config(10.0), 2).unwrap();
    let mut out = Vec::new();
    m.drain_usage(&mut out);
    out.sort();
    assert_eq!(out, vec![("a", 1), ("b", 1)]);
    assert_eq!(m.stats().evicted_active_total, 0);
}

#[test]
fn the_slots_never_grow_past_the_bound() {
    for bound in [1usize, 5, 20, 33, 100] {
        let mut m = KeyedBuckets::new(config(10.0), bound).unwrap();
        for k in 0..bound as u32 * 2 {
            m.check(&k, 0, 1).unwrap();
            assert!(
                m.slots.capacity() <= bound,
                "bound {bound}: {}",
                m.slots.capacity()
            );
        }
        assert_eq!(m.len(), bound);
    }
}
