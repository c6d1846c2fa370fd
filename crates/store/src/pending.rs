//! A write batch's pending index entries: what the batch inserts into the
//! five indexes and `ids` at its end, in key order, and which of the
//! batch's own events were removed again before it (`write.rs` adds them,
//! the delete path in `remove.rs` takes an event back).

use std::collections::{HashMap, HashSet};

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
/// batch, not once per entry). An event removed in the same batch (a
/// replaceable event replaced again, a deletion) is taken back whole: its
/// serial, which ends each of its keys, leaves them out at the flush.
/// The batch's hashing: seeded per process (ids are chosen by clients),
/// and several times cheaper than SipHash on an import's millions of keys.
type Hashing = foldhash::fast::RandomState;

#[derive(Default)]
pub(crate) struct Pending {
    /// Per index; sorted once, at the flush.
    keys: [Keys; 5],
    /// Serials of events stored and removed again in this batch.
    cancelled: HashSet<u64, Hashing>,
    /// Where each key is built before it is added.
    buf: Vec<u8>,
    /// New events' ids → serials (the `ids` table's entries), looked up
    /// before the table by the batch's duplicate and deletion checks.
    pub(crate) ids: HashMap<[u8; 32], u64, Hashing>,
}

/// One index's pending keys: their bytes end to end in one buffer (an
/// import's batch adds millions of keys: one allocation per key was a
/// tenth of the writer's time) and where each one is. A key added twice
/// (an event with the same tag twice) is given once.
#[derive(Default)]
struct Keys {
    bytes: Vec<u8>,
    spans: Vec<Span>,
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
    fn add(&mut self, key: &[u8]) {
        self.spans.push(Span {
            start: self.bytes.len(),
            len: key.len(),
        });
        self.bytes.extend_from_slice(key);
    }

    /// The keys in ascending order, each once, but for those ending in a
    /// `cancelled` serial. Each is sorted by its first eight bytes, held
    /// beside its span, and only keys that share them are compared in the
    /// buffer: an import's batch sorts millions of keys, and reaching into
    /// the buffer for every comparison made the sort a tenth of the
    /// writer's time.
    fn sorted<'k, 'c>(
        &'k self,
        cancelled: &'c HashSet<u64, Hashing>,
    ) -> impl Iterator<Item = &'k [u8]> + use<'k, 'c> {
        let bytes = &self.bytes;
        let mut spans: Vec<(u64, Span)> = (self.spans.iter())
            .map(|s| (head(s.of(bytes)), *s))
            .collect();
        spans.sort_unstable_by(|(ha, a), (hb, b)| {
            ha.cmp(hb).then_with(|| a.of(bytes).cmp(b.of(bytes)))
        });
        let mut last: Option<&[u8]> = None;
        (spans.into_iter())
            .map(|(_, s)| s.of(bytes))
            .filter(move |k| {
                let again = last == Some(*k);
                last = Some(k);
                !again && (cancelled.is_empty() || !cancelled.contains(&serial_of_key(k)))
            })
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

/// The serial an index key ends with (`created_at ‖ serial`).
fn serial_of_key(key: &[u8]) -> u64 {
    let mut s = [0u8; 8];
    let n = key.len().min(8);
    s[8 - n..].copy_from_slice(&key[key.len() - n..]);
    u64::from_be_bytes(s)
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
        let Pending { keys, buf, .. } = self;
        let added: Result<(), std::convert::Infallible> =
            for_each_index_key(ev, serial, buf, |index, key| {
                keys[Self::slot(index)].add(key);
                Ok(())
            });
        let Ok(()) = added;
    }

    /// Takes back the event `id` stored under `serial` in this batch: its
    /// `ids` entry and index entries are not written. False when this
    /// batch did not store it (its entries are in the tables).
    pub(crate) fn cancel(&mut self, id: &[u8; 32], serial: u64) -> bool {
        if self.ids.get(id) != Some(&serial) {
            return false;
        }
        self.ids.remove(id);
        self.cancelled.insert(serial);
        true
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
            t.index_put_ascending(wtxn, index, keys.sorted(&self.cancelled))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
