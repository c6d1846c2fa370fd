//! The writer's upkeep between and after batches: retention steps, NIP-62
//! requests applied, expired events purged, a full disk told apart.

use sluice_proto::Event;
use sluice_store::StoreError;

use super::admin::PURGE_CHUNK;
use super::thread::Writer;
use crate::clock::unix_now;
use crate::metrics_names as m;
use crate::retention::RetentionPlan;

#[expect(
    clippy::disallowed_methods,
    reason = "the writer thread is the store's one writer (clippy.toml)"
)]
impl Writer {
    /// One bounded retention step, if any is due (not while the disk is
    /// too full to commit anything).
    pub(super) fn retention_step(&mut self) {
        if self.disk.refusal().is_some() {
            return;
        }
        self.retainer.step(&self.store, unix_now());
    }

    /// Removes what the NIP-62 requests among `events` cover, in chunks
    /// (before their OKs, so the author sees them gone).
    pub(super) fn apply_vanish<'a>(
        &self,
        plan: &RetentionPlan,
        events: impl IntoIterator<Item = &'a Event>,
    ) {
        for ev in events {
            if !plan.rules.vanish_applies(ev) {
                continue;
            }
            let mut total = 0;
            loop {
                match self.store.purge_vanished(&ev.pubkey, PURGE_CHUNK) {
                    Ok(n) => {
                        total += n;
                        if n < PURGE_CHUNK {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "NIP-62 purge failed; it runs again at the next request");
                        break;
                    }
                }
            }
            metrics::counter!(m::EVENTS_VANISHED_TOTAL).increment(total as u64);
            tracing::info!(pubkey = %sluice_proto::hex32::encode(&ev.pubkey), removed = total, "NIP-62 request to vanish applied");
        }
    }

    /// LMDB reports a write the disk could not take as `EIO` when the
    /// write was short (the disk took part of it): an I/O error while the
    /// store's filesystem has less free space than a few times the batch
    /// (at least 8 MiB) is taken for a full disk.
    pub(super) fn disk_full_or(&self, e: StoreError, batch_bytes: u64) -> StoreError {
        if !e.is_io() || e.is_disk_full() {
            return e;
        }
        match self.store.disk_space() {
            Ok(d) if d.free_bytes < (4 * batch_bytes).max(8 << 20) => {
                StoreError::Io(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    format!("{} KB free on the store's disk ({e})", d.free_bytes >> 10),
                ))
            }
            _ => e,
        }
    }

    pub(super) fn purge_expired(&self) {
        const PURGE_CHUNK: usize = 1000;
        loop {
            match self.store.purge_expired(unix_now(), PURGE_CHUNK) {
                Ok(n) => {
                    metrics::counter!(m::EVENTS_PURGED_TOTAL).increment(n as u64);
                    if n < PURGE_CHUNK {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "expiry purge failed");
                    return;
                }
            }
        }
    }
}
