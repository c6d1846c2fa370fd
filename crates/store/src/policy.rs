//! The operator's runtime policy (NIP-86 changes: bans, allows, kinds,
//! blocked addresses, the relay's name), kept in the `policy` table so it
//! survives restarts, and the purge of a banned author's events.
//!
//! The store does not interpret entries: a key is `<list>:<item>` (e.g.
//! `ban_pubkey:<hex>`) and its value the reason given, both UTF-8; the
//! engine's policy owns their meaning. Writes go through the writer thread
//! like every store write (`tests/invariants.rs`).

use crate::codec::author_prefix;
use crate::write::{delete_indexed, delete_serial};
use crate::{Store, StoreError};

impl Store {
    /// Every runtime policy entry, `(key, value)` in key order.
    pub fn policy_entries(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rtxn = self.rtxn()?;
        let all = ..;
        self.t
            .policy
            .range(&rtxn, &all)?
            .map(|r| r.map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect::<Result<_, _>>()
            .map_err(|e| self.t.policy.error(e))
    }

    /// Sets (`Some`) or removes (`None`) one runtime policy entry, durably.
    pub fn set_policy(&self, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        self.write_txn(|t, wtxn| match value {
            Some(v) => t.policy.put(wtxn, key, v),
            None => t.policy.delete(wtxn, key),
        })
    }

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
