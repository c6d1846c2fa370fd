//! The operator's runtime policy (NIP-86 changes: bans, allows, kinds,
//! blocked addresses, the relay's name), kept in the `policy` table so it
//! survives restarts. The purge of a banned author's or event's stored
//! events is `purge.rs`.
//!
//! The store does not interpret entries: a key is `<list>:<item>` (e.g.
//! `ban_pubkey:<hex>`) and its value the reason given, both UTF-8; the
//! engine's policy owns their meaning. Writes go through the writer thread
//! like every store write (`tests/invariants.rs`).

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
}
