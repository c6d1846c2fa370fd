//! Purges an operator asks for (run in order with the writes by the
//! engine's writer thread): an author's stored events, or given events by
//! id (a purge by filter is its matches' ids). Each event goes with all
//! its index entries, through the one delete path (`remove.rs`).

use crate::codec::author_prefix;
use crate::remove::{delete_indexed, delete_serial};
use crate::{Store, StoreError};

impl Store {
    /// Removes up to `max` stored events of `pubkey` (and their index
    /// entries) in one transaction; returns how many. Call again until it
    /// returns fewer than `max`.
    pub fn purge_author(&self, pubkey: &[u8; 32], max: usize) -> Result<usize, StoreError> {
        self.write_txn(|t, wtxn| {
            let prefix = author_prefix(pubkey);
            let from = crate::codec::index_key(&prefix, 0, 0);
            let to = crate::codec::index_key(&prefix, u64::MAX, u64::MAX);
            let range = (
                std::ops::Bound::Included(&from[..]),
                std::ops::Bound::Included(&to[..]),
            );
            delete_indexed(t, wtxn, &t.by_author, &range, max)
        })
    }

    /// Removes the stored events with these ids, in one transaction;
    /// returns how many were there.
    pub fn purge_events(&self, ids: &[[u8; 32]]) -> Result<usize, StoreError> {
        self.write_txn(|t, wtxn| {
            let mut n = 0;
            for id in ids {
                if let Some(serial) = t.ids.get(wtxn, id)? {
                    delete_serial(t, wtxn, serial)?;
                    n += 1;
                }
            }
            Ok(n)
        })
    }

    /// Removes the stored event with this id, if there is one.
    pub fn purge_event(&self, id: &[u8; 32]) -> Result<bool, StoreError> {
        self.write_txn(|t, wtxn| match t.ids.get(wtxn, id)? {
            Some(serial) => delete_serial(t, wtxn, serial).map(|()| true),
            None => Ok(false),
        })
    }
}
