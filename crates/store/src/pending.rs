//! A write batch's pending index entries: what the batch inserts into the
//! five indexes and `ids` at its end, in key order, and what an event
//! removed in the same batch takes back out first (`write.rs` adds them,
//! the delete path in `remove.rs` cancels them).

use std::collections::{HashMap, HashSet};

use heed::RwTxn;

use crate::StoreError;
use crate::codec::Be64;
use crate::tables::{Index, Tables};

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
    keys: [HashSet<Vec<u8>, Hashing>; 5],
    /// New events' ids → serials (the `ids` table's entries), looked up
    /// before the table by the batch's duplicate and deletion checks.
    pub(crate) ids: HashMap<[u8; 32], u64, Hashing>,
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

    pub(crate) fn add(&mut self, index: Index, key: Vec<u8>) {
        self.keys[Self::slot(index)].insert(key);
    }

    /// Drops a pending entry; false when it was not pending (it is in the
    /// table).
    pub(crate) fn cancel(&mut self, index: Index, key: &[u8]) -> bool {
        self.keys[Self::slot(index)].remove(key)
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
        for (keys, index) in self.keys.into_iter().zip(ORDER) {
            let mut keys: Vec<Vec<u8>> = keys.into_iter().collect();
            keys.sort_unstable();
            t.index_put_ascending(wtxn, index, &keys)?;
        }
        Ok(())
    }
}
