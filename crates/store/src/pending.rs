//! A write batch's pending index entries: what the batch inserts into the
//! five indexes and `ids` at its end, in key order, and what an event
//! removed in the same batch takes back out first (`write.rs` adds them,
//! the delete path in `remove.rs` cancels them).

use std::collections::HashMap;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use heed::RwTxn;
use sluice_proto::Event;

use crate::StoreError;
use crate::codec::Be64;
use crate::tables::{Index, Tables, for_each_index_key};

/// Room for one index key in a reused buffer: the longest, a tag key with
/// an inline value, is 1 + 2 + `MAX_INLINE_TAG_BYTES` + 16 bytes.
pub(crate) const KEY_CAPACITY: usize = 256;

/// The time-ordered index entries of a batch's new events, inserted in key
/// order at the end of the batch's transaction: sorted inserts walk each
/// B-tree from one leaf to the next instead of jumping across it (the
/// trees' pages stay in the CPU caches, and each leaf is dirtied once per
/// batch, not once per entry). An entry removed in the same batch (a
/// replaceable event replaced again, a deletion) is dropped here instead.
/// The batch's hashing: seeded per process (keys hold tag values clients
/// choose), and several times cheaper than SipHash on an import's
/// millions of keys.
type Hashing = foldhash::fast::RandomState;

#[derive(Default)]
pub(crate) struct Pending {
    /// Per index; sorted once, at the flush.
    keys: [Keys; 5],
    hashing: Hashing,
    /// Where each key is built before it is added.
    buf: Vec<u8>,
    /// New events' ids → serials (the `ids` table's entries), looked up
    /// before the table by the batch's duplicate and deletion checks.
    pub(crate) ids: HashMap<[u8; 32], u64, Hashing>,
}

/// One index's pending keys: their bytes end to end in one buffer (an
/// import's batch adds millions of keys: one allocation per key was a
/// tenth of the writer's time), found by their content through a table of
/// where each one is. A cancelled key's bytes stay in the buffer until the
/// batch ends.
#[derive(Default)]
struct Keys {
    bytes: Vec<u8>,
    spans: HashTable<Span>,
}

/// Where one key is in [`Keys::bytes`].
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
}

impl Span {
    fn of(self, bytes: &[u8]) -> &[u8] {
        &bytes[self.start..self.start + self.len]
    }
}

impl Keys {
    /// Adds `key` unless it is pending already.
    fn add(&mut self, hashing: &Hashing, key: &[u8]) {
        let bytes = &self.bytes;
        let entry = self.spans.entry(
            hashing.hash_one(key),
            |s| s.of(bytes) == key,
            |s| hashing.hash_one(s.of(bytes)),
        );
        if let Entry::Vacant(v) = entry {
            let span = Span {
                start: self.bytes.len(),
                len: key.len(),
            };
            v.insert(span);
            self.bytes.extend_from_slice(key);
        }
    }

    /// Drops `key`; false when it was not pending.
    fn cancel(&mut self, hashing: &Hashing, key: &[u8]) -> bool {
        let bytes = &self.bytes;
        match self
            .spans
            .find_entry(hashing.hash_one(key), |s| s.of(bytes) == key)
        {
            Ok(found) => {
                found.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// The pending keys in ascending order. Each is sorted by its first
    /// eight bytes, held beside its span, and only keys that share them
    /// are compared in the buffer: an import's batch sorts millions of
    /// keys, and reaching into the buffer for every comparison made the
    /// sort a tenth of the writer's time.
    fn sorted(&self) -> impl Iterator<Item = &[u8]> {
        let bytes = &self.bytes;
        let mut spans: Vec<(u64, Span)> = (self.spans.iter())
            .map(|s| (head(s.of(bytes)), *s))
            .collect();
        spans.sort_unstable_by(|(ha, a), (hb, b)| {
            ha.cmp(hb).then_with(|| a.of(bytes).cmp(b.of(bytes)))
        });
        spans.into_iter().map(|(_, s)| s.of(bytes))
    }
}

/// A key's first eight bytes as a big-endian number, zeros after a
/// shorter key's end: keys whose heads differ are in the heads' order, so
/// only keys with equal heads need comparing in full.
fn head(key: &[u8]) -> u64 {
    let mut h = [0u8; 8];
    let n = key.len().min(8);
    h[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(h)
}

impl Pending {
    fn slot(index: Index) -> usize {
        match index {
            Index::Created => 0,
            Index::Author => 1,
            Index::Kind => 2,
            Index::AuthorKind => 3,
            Index::Tag => 4,
        }
    }

    /// Adds every index entry of `ev`, stored under `serial`.
    pub(crate) fn add_keys_of(&mut self, ev: &Event, serial: u64) {
        let Pending {
            keys, hashing, buf, ..
        } = self;
        let added: Result<(), std::convert::Infallible> =
            for_each_index_key(ev, serial, buf, |index, key| {
                keys[Self::slot(index)].add(hashing, key);
                Ok(())
            });
        let Ok(()) = added;
    }

    /// Drops a pending entry; false when it was not pending (it is in the
    /// table).
    pub(crate) fn cancel(&mut self, index: Index, key: &[u8]) -> bool {
        self.keys[Self::slot(index)].cancel(&self.hashing, key)
    }

    /// The serial of `id`, stored in this batch or before.
    pub(crate) fn serial_of(
        &self,
        t: &Tables,
        wtxn: &RwTxn<'_>,
        id: &[u8; 32],
    ) -> Result<Option<u64>, StoreError> {
        match self.ids.get(id) {
            Some(&serial) => Ok(Some(serial)),
            None => t.ids.get(wtxn, id),
        }
    }

    pub(crate) fn flush(self, t: &Tables, wtxn: &mut RwTxn<'_>) -> Result<(), StoreError> {
        let mut ids: Vec<([u8; 32], u64)> = self.ids.iter().map(|(k, v)| (*k, *v)).collect();
        ids.sort_unstable();
        let serials: Vec<Be64> = ids.iter().map(|(_, s)| Be64::new(*s)).collect();
        t.ids
            .put_ascending(wtxn, ids.iter().map(|(id, _)| id).zip(serials.iter()))?;
        const ORDER: [Index; 5] = [
            Index::Created,
            Index::Author,
            Index::Kind,
            Index::AuthorKind,
            Index::Tag,
        ];
        for (keys, index) in self.keys.iter().zip(ORDER) {
            t.index_put_ascending(wtxn, index, keys.sorted())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
