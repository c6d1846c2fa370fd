//! An operator's operations on the writer thread: runtime policy entries
//! and purges, in order with the writes.

use sluice_proto::Event;
use sluice_store::StoreError;

use super::msg::{AdminDone, AdminOp};
use super::thread::Writer;
use crate::clock::unix_now;

/// Events removed per transaction by a purge (other writes interleave).
pub(super) const PURGE_CHUNK: usize = 1000;

#[expect(
    clippy::disallowed_methods,
    reason = "the writer thread is the store's one writer (clippy.toml)"
)]
impl Writer {
    pub(super) fn admin(&self, op: AdminOp) -> Result<AdminDone, StoreError> {
        match op {
            AdminOp::ReadPolicy => self.store.policy_entries().map(AdminDone::Policy),
            AdminOp::SetPolicy(key, value) => self
                .store
                .set_policy(&key, value.as_deref())
                .map(|()| AdminDone::Set),
            AdminOp::PurgeAuthor(pubkey) => {
                let mut total = 0;
                loop {
                    let n = self.store.purge_author(&pubkey, PURGE_CHUNK)?;
                    total += n;
                    if n < PURGE_CHUNK {
                        return Ok(AdminDone::Purged(total));
                    }
                }
            }
            AdminOp::PurgeEvent(id) => self
                .store
                .purge_event(&id)
                .map(|gone| AdminDone::Purged(usize::from(gone))),
            AdminOp::PurgeMatching { filter, dry_run } => {
                self.purge_matching(*filter, dry_run).map(AdminDone::Purged)
            }
        }
    }

    /// Deletion by filter: chunks of the newest matches, each removed in
    /// one transaction, until none is left or the filter's `limit` is
    /// reached. A dry run counts (limit ignored, as NIP-45 does).
    pub(super) fn purge_matching(
        &self,
        filter: sluice_proto::Filter,
        dry_run: bool,
    ) -> Result<usize, StoreError> {
        let opts = sluice_store::QueryOptions {
            now: unix_now(),
            max_scan_rows: u64::MAX,
        };
        if dry_run {
            let (n, _, _) = self.store.count(std::slice::from_ref(&filter), &opts)?;
            return Ok(n as usize);
        }
        let mut left = filter.limit.unwrap_or(u64::MAX);
        let mut total = 0;
        while left > 0 {
            let mut chunk = filter.clone();
            chunk.limit = Some(left.min(PURGE_CHUNK as u64));
            let out = self.store.query(&[chunk], &opts)?;
            let ids: Vec<[u8; 32]> = out
                .events
                .iter()
                .filter_map(|raw| Event::parse(raw).ok().map(|e| e.id))
                .collect();
            let n = self.store.purge_events(&ids)?;
            total += n;
            left = left.saturating_sub(ids.len() as u64);
            if ids.len() < PURGE_CHUNK || n == 0 {
                break;
            }
        }
        Ok(total)
    }
}
