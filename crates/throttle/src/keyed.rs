//! Token buckets per key (per IP, per pubkey) in a map with a hard bound.
//!
//! Invariants:
//! - The map never holds more than `max_keys` entries, whatever the keys
//!   (attackers choose them).
//! - When a new key arrives at a full map, the least recently used entry is
//!   evicted. If that bucket is full again it is equivalent to a new one, so
//!   the eviction loses nothing (`evicted_idle_total`); otherwise its owner
//!   gets a fresh, full bucket next time, a loss counted apart
//!   (`evicted_active_total`) so the operator can see `max_keys` is too low.
//!   Refusing new keys instead would let anyone with many addresses lock
//!   every new client out.
//! - Every check is O(1) amortised: one hash lookup, a few index updates in
//!   an intrusive doubly linked LRU list over a slab, one bucket update. An
//!   existing key never allocates; a new key allocates only while the slab
//!   and table grow towards `max_keys`.
//! - All buckets share one config and one current rate, so scaling every
//!   client's rate with global pressure is one store, not a walk.
//!
//! Keys come from clients, so the map keeps std's randomly seeded SipHash
//! (HashDoS resistance). Callers should key IPv6 clients by prefix (e.g. /64)
//! or one host can rotate through addresses.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bucket::{BucketConfig, BucketState, Params};
use crate::error::{ConfigError, check_range};

/// Largest `max_keys` accepted: slab indices are `u32`, and ten million
/// buckets is already about a gigabyte.
pub const MAX_KEYS_LIMIT: usize = 10_000_000;

/// Marks "no neighbour" in the LRU list.
const NIL: u32 = u32::MAX;

/// Counters and sizes of a [`KeyedBuckets`], for /metrics (labels from
/// closed enums only: export these per map, never per key).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedStats {
    /// Keys currently tracked.
    pub keys: usize,
    /// The bound on `keys`.
    pub max_keys: usize,
    /// Checks that took their tokens.
    pub allowed_total: u64,
    /// Checks refused because the key's bucket was empty.
    pub refused_total: u64,
    /// Evictions of buckets that were full again (lossless).
    pub evicted_idle_total: u64,
    /// Evictions of buckets still in use (their owners start over full).
    pub evicted_active_total: u64,
}

#[derive(Debug, Clone)]
struct Slot<K> {
    key: K,
    bucket: BucketState,
    /// Towards the most recently used end.
    prev: u32,
    /// Towards the least recently used end.
    next: u32,
    /// Operations taken since the last [`KeyedBuckets::drain_usage`]
    /// (only while usage is tracked).
    used: u32,
    /// On the `dirty` list.
    dirty: bool,
}

/// A bounded map from key to token bucket. See the module docs.
#[derive(Debug, Clone)]
pub struct KeyedBuckets<K> {
    config: BucketConfig,
    params: Params,
    max_keys: usize,
    index: HashMap<K, u32>,
    slots: Vec<Slot<K>>,
    /// Most recently used slot.
    head: u32,
    /// Least recently used slot: the eviction candidate.
    tail: u32,
    stats: KeyedStats,
    /// Whether `check` counts what each key takes (a cluster reconciles
    /// it with the other nodes); off by default.
    track: bool,
    /// Slots with usage not yet drained; each at most once (bounded by
    /// `max_keys`).
    dirty: Vec<u32>,
}

impl<K: Hash + Eq + Clone> KeyedBuckets<K> {
    /// An empty map; every new key starts with a full bucket at
    /// `config.rate_per_s`. Fails on an invalid config or a `max_keys`
    /// outside `1..=MAX_KEYS_LIMIT`.
    pub fn new(config: BucketConfig, max_keys: usize) -> Result<Self, ConfigError> {
        validate(&config, max_keys)?;
        let params = Params::new(&config, config.rate_per_s);
        Ok(Self {
            config,
            params,
            max_keys,
            index: HashMap::new(),
            slots: Vec::new(),
            head: NIL,
            tail: NIL,
            stats: KeyedStats {
                max_keys,
                ..KeyedStats::default()
            },
            track: false,
            dirty: Vec::new(),
        })
    }

    /// Takes `cost` operations from `key`'s bucket, creating it (full) if
    /// the key is new, or returns the Retry-After hint. Counted in
    /// [`KeyedStats`].
    pub fn check(&mut self, key: &K, now_ns: u64, cost: u32) -> Result<(), Duration> {
        let idx = self.slot_of(key, now_ns);
        let result = self.slots[idx as usize]
            .bucket
            .try_take(&self.params, now_ns, cost);
        match result {
            Ok(()) => {
                self.stats.allowed_total += 1;
                if self.track {
                    let slot = &mut self.slots[idx as usize];
                    slot.used = slot.used.saturating_add(cost);
                    if !slot.dirty {
                        slot.dirty = true;
                        self.dirty.push(idx);
                    }
                }
            }
            Err(_) => self.stats.refused_total += 1,
        }
        result
    }

    /// Starts or stops counting what each key takes (for
    /// [`KeyedBuckets::drain_usage`]). Stopping forgets what was counted.
    pub fn set_usage_tracking(&mut self, on: bool) {
        self.track = on;
        if !on {
            for idx in self.dirty.drain(..) {
                let slot = &mut self.slots[idx as usize];
                slot.dirty = false;
                slot.used = 0;
            }
        }
    }

    /// Appends each key's operations taken since the last drain (those
    /// with any) to `out`, and starts counting again from zero. Cost:
    /// the keys used since, not the map.
    pub fn drain_usage(&mut self, out: &mut Vec<(K, u32)>) {
        for idx in self.dirty.drain(..) {
            let slot = &mut self.slots[idx as usize];
            slot.dirty = false;
            if slot.used > 0 {
                out.push((slot.key.clone(), slot.used));
                slot.used = 0;
            }
        }
    }

    /// Charges `cost` that another node's clients took from the same key
    /// (debt beyond what the bucket holds), without counting it as local
    /// use nor creating the key: a key unknown here starts full, an error
    /// of at most one burst. Returns whether the key was here.
    pub fn charge_remote(&mut self, key: &K, now_ns: u64, cost: u64) -> bool {
        match self.index.get(key) {
            Some(&idx) => {
                self.slots[idx as usize]
                    .bucket
                    .charge(&self.params, now_ns, cost);
                true
            }
            None => false,
        }
    }

    /// Charges `cost` to `key`'s bucket whatever it holds (debt beyond it);
    /// for settling a cost known only after the work. Creates the bucket
    /// if the key is new.
    pub fn charge(&mut self, key: &K, now_ns: u64, cost: u64) {
        let idx = self.slot_of(key, now_ns);
        self.slots[idx as usize]
            .bucket
            .charge(&self.params, now_ns, cost);
    }

    /// Gives back `cost` charged too much to `key` (nothing if the key was
    /// evicted meanwhile: its owner already has a full bucket).
    pub fn refund(&mut self, key: &K, now_ns: u64, cost: u64) {
        if let Some(&idx) = self.index.get(key) {
            self.slots[idx as usize]
                .bucket
                .refund(&self.params, now_ns, cost);
        }
    }

    /// Charges a positive `delta_units` ([`KeyedBuckets::charge`]),
    /// refunds a negative one ([`KeyedBuckets::refund`]).
    pub fn settle(&mut self, key: &K, now_ns: u64, delta_units: i64) {
        if delta_units > 0 {
            self.charge(key, now_ns, delta_units.unsigned_abs());
        } else {
            self.refund(key, now_ns, delta_units.unsigned_abs());
        }
    }

    fn slot_of(&mut self, key: &K, now_ns: u64) -> u32 {
        match self.index.get(key) {
            Some(&idx) => {
                self.touch(idx);
                idx
            }
            None => self.insert(key, now_ns),
        }
    }

    /// Sets the current rate of every bucket (e.g. from
    /// [`crate::scaled_rate`]), clamped like [`crate::TokenBucket::set_rate`].
    pub fn set_rate(&mut self, rate_per_s: f64) {
        self.params = Params::new(&self.config, rate_per_s);
    }

    /// The current rate, operations per second.
    pub fn rate_per_s(&self) -> f64 {
        self.params.rate_per_s()
    }

    /// Replaces the config (reload) and bound; the current rate becomes the
    /// new base rate. If the bound shrinks, least recently used entries are
    /// dropped (counted as active evictions). On error nothing changes.
    pub fn set_config(&mut self, config: BucketConfig, max_keys: usize) -> Result<(), ConfigError> {
        validate(&config, max_keys)?;
        self.config = config;
        self.params = Params::new(&config, config.rate_per_s);
        self.max_keys = max_keys;
        self.stats.max_keys = max_keys;
        if self.slots.len() > max_keys {
            self.shrink_to_bound();
        }
        Ok(())
    }

    /// Counters and sizes.
    pub fn stats(&self) -> KeyedStats {
        KeyedStats {
            keys: self.slots.len(),
            ..self.stats
        }
    }

    /// Number of keys tracked.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// A slot for a new key: a fresh one while below the bound, else the
    /// least recently used one, reused in place.
    fn insert(&mut self, key: &K, now_ns: u64) -> u32 {
        let bucket = BucketState::full(&self.params, now_ns);
        if self.slots.len() < self.max_keys {
            if self.slots.len() == self.slots.capacity() {
                // Grow geometrically but never past the bound.
                let room = self.max_keys - self.slots.len();
                self.slots.reserve_exact(self.slots.len().max(16).min(room));
            }
            let idx = self.slots.len() as u32;
            self.slots.push(Slot {
                key: key.clone(),
                bucket,
                prev: NIL,
                next: NIL,
                used: 0,
                dirty: false,
            });
            self.index.insert(key.clone(), idx);
            self.push_front(idx);
            return idx;
        }
        let idx = self.tail;
        let victim = &mut self.slots[idx as usize];
        if victim.bucket.is_full(&self.params, now_ns) {
            self.stats.evicted_idle_total += 1;
        } else {
            self.stats.evicted_active_total += 1;
        }
        self.index.remove(&victim.key);
        victim.key = key.clone();
        victim.bucket = bucket;
        // The victim's undrained use is lost (its slot may stay on the
        // dirty list, now for the new key).
        victim.used = 0;
        self.index.insert(key.clone(), idx);
        self.touch(idx);
        idx
    }

    /// Marks `idx` most recently used.
    fn touch(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.push_front(idx);
        }
    }

    fn unlink(&mut self, idx: u32) {
        let Slot { prev, next, .. } = self.slots[idx as usize];
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, idx: u32) {
        let old_head = self.head;
        let slot = &mut self.slots[idx as usize];
        slot.prev = NIL;
        slot.next = old_head;
        match old_head {
            NIL => self.tail = idx,
            h => self.slots[h as usize].prev = idx,
        }
        self.head = idx;
    }

    /// Keeps the `max_keys` most recently used entries (reload only: O(n)).
    fn shrink_to_bound(&mut self) {
        let mut order = Vec::with_capacity(self.max_keys);
        let mut cur = self.head;
        while cur != NIL && order.len() < self.max_keys {
            order.push(cur);
            cur = self.slots[cur as usize].next;
        }
        let dropped = self.slots.len() - order.len();
        // Indices change: undrained use is forgotten (a reload only).
        self.dirty.clear();
        self.stats.evicted_active_total += dropped as u64;
        let mut kept: Vec<Slot<K>> = order
            .iter()
            .map(|&i| self.slots[i as usize].clone())
            .collect();
        let n = kept.len() as u32;
        for (i, slot) in kept.iter_mut().enumerate() {
            let i = i as u32;
            slot.used = 0;
            slot.dirty = false;
            slot.prev = if i == 0 { NIL } else { i - 1 };
            slot.next = if i + 1 == n { NIL } else { i + 1 };
        }
        self.index = kept
            .iter()
            .enumerate()
            .map(|(i, s)| (s.key.clone(), i as u32))
            .collect();
        self.slots = kept;
        self.head = if n == 0 { NIL } else { 0 };
        self.tail = if n == 0 { NIL } else { n - 1 };
    }
}

fn validate(config: &BucketConfig, max_keys: usize) -> Result<(), ConfigError> {
    config.validate()?;
    check_range(
        "max_keys",
        max_keys as f64,
        1.0,
        MAX_KEYS_LIMIT as f64,
        "in 1..=10000000",
    )
}

#[cfg(test)]
mod tests;
