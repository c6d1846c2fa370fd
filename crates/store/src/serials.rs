//! Events by serial, for what is derived from the store in serial order
//! (the NIP-50 full-text index, `crates/search`): the events committed
//! after a serial, and the final check of a search's hits against what
//! the store holds now.

use std::ops::Bound;

use sluice_proto::{Event, Filter, Readers};

use crate::codec::{Be64, StoredEvent};
use crate::query::{QueryOptions, header_matches};
use crate::tables::META_NEXT_SERIAL;
use crate::{Store, StoreError};

/// What the store holds at a serial, for one filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SerialLookup {
    /// No event at this serial any more (deleted, replaced, purged,
    /// removed by retention or NIP-62): whatever points at it is stale.
    Gone,
    /// The event is there but the filter does not match it (or it has
    /// expired, or the reader may not see it).
    NoMatch,
    /// The event matches: its `created_at` and raw JSON.
    Match { created_at: u64, raw: String },
}

/// A stored event as [`Store::visit_events_after`] lends it: its header's
/// fields, and its JSON as stored.
#[derive(Debug, Clone, Copy)]
pub struct StoredRef<'a> {
    pub serial: u64,
    pub kind: u16,
    pub pubkey: &'a [u8; 32],
    pub created_at: u64,
    pub raw: &'a str,
}

impl Store {
    /// The serial the next stored event will get: every event stored so
    /// far has a lower one.
    pub fn next_serial(&self) -> Result<u64, StoreError> {
        let rtxn = self.rtxn()?;
        Ok(self.t.meta.get(&rtxn, META_NEXT_SERIAL)?.unwrap_or(1))
    }

    /// The stored events with a serial above `after`, in serial order, at
    /// most `max` of them (one read transaction), expired ones included.
    pub fn events_after(&self, after: u64, max: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let mut out = Vec::with_capacity(max.min(4096));
        self.visit_events_after(after, max, |e| out.push((e.serial, e.raw.to_owned())))?;
        Ok(out)
    }

    /// Calls `f` with each stored event with a serial above `after`, in
    /// serial order, at most `max` of them, lent from one read
    /// transaction (no copy), expired ones included. Returns the last
    /// serial visited, `None` when there was none.
    pub fn visit_events_after(
        &self,
        after: u64,
        max: usize,
        mut f: impl FnMut(StoredRef<'_>),
    ) -> Result<Option<u64>, StoreError> {
        let rtxn = self.rtxn()?;
        let start = Be64::new(after);
        let range = (Bound::Excluded(start), Bound::Unbounded);
        let mut last = None;
        for item in self.t.events.range(&rtxn, &range)?.take(max) {
            let (serial, StoredEvent { header: h, raw }) =
                item.map_err(|e| self.t.events.error(e))?;
            f(StoredRef {
                serial,
                kind: h.kind,
                pubkey: &h.pubkey,
                created_at: h.created_at,
                raw,
            });
            last = Some(serial);
        }
        Ok(last)
    }

    /// For each serial, whether the store still holds an event there, and
    /// whether `f` (its search words included) matches it for `readers`,
    /// unexpired at `opts.now`; in one read transaction.
    pub fn lookup_serials(
        &self,
        serials: &[u64],
        f: &Filter,
        opts: &QueryOptions,
        readers: Option<&Readers>,
    ) -> Result<Vec<SerialLookup>, StoreError> {
        let rtxn = self.rtxn()?;
        let mut out = Vec::with_capacity(serials.len());
        for &serial in serials {
            let Some(StoredEvent { header: h, raw }) =
                self.t.events.get(&rtxn, &Be64::new(serial))?
            else {
                out.push(SerialLookup::Gone);
                continue;
            };
            if !header_matches(f, &h, opts.now) {
                out.push(SerialLookup::NoMatch);
                continue;
            }
            let ok = match Event::parse(raw) {
                Ok(ev) => f.matches(&ev) && readers.is_none_or(|r| r.may_read(&ev)),
                Err(_) => false,
            };
            out.push(if ok {
                SerialLookup::Match {
                    created_at: h.created_at,
                    raw: raw.to_owned(),
                }
            } else {
                SerialLookup::NoMatch
            });
        }
        Ok(out)
    }
}
