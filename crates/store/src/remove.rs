//! The one delete path: an event removed with its `ids`, index, `expiry`
//! and `addresses` entries, in the caller's write transaction. The write
//! path (replacements, NIP-09 deletions, NIP-62), retention's removals and
//! the operator's purges all remove through here.

use heed::RwTxn;
use sluice_proto::{Event, KindClass};

use crate::StoreError;
use crate::codec::{Address, Be64, StoredEvent, index_key};
use crate::pending::KEY_CAPACITY;
use crate::pending::Pending;
use crate::tables::{Tables, for_each_index_key};

/// Removes the events of the first `max` rows of `range` in `index` (with
/// all their index entries); returns how many rows there were.
pub(crate) fn delete_indexed<P: crate::codec::Prefix + 'static>(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    index: &crate::tables::IndexTable<'_, P>,
    range: &(std::ops::Bound<&[u8]>, std::ops::Bound<&[u8]>),
    max: usize,
) -> Result<usize, StoreError> {
    let serials: Vec<u64> = index
        .range(wtxn, range)?
        .take(max)
        .map(|r| r.map(|((_, serial), ())| serial))
        .collect::<Result<_, _>>()
        .map_err(|e| index.error(e))?;
    for &s in &serials {
        delete_serial(t, wtxn, s)?;
    }
    Ok(serials.len())
}

/// Removes an event and all its index entries. A serial that is not there
/// is not an error (it was removed earlier in the same batch). An event
/// value that does not decode or parse is removed alone (its index entries
/// cannot be known; scans skip them as rows whose event is gone) and logged.
pub(crate) fn delete_serial(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    serial: u64,
) -> Result<(), StoreError> {
    delete_serial_pending(t, wtxn, serial, None)
}

/// [`delete_serial`] inside a write batch: an event the batch stored is
/// taken back from `pending` rather than deleted from the tables.
pub(crate) fn delete_serial_pending(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    serial: u64,
    mut pending: Option<&mut Pending>,
) -> Result<(), StoreError> {
    let sk = Be64::new(serial);
    let (expires_at, parsed) = match t.events.get(wtxn, &sk) {
        Ok(None) => return Ok(()),
        Ok(Some(StoredEvent { header, raw })) => (header.expires_at, Event::parse(raw)),
        Err(e @ StoreError::Corrupt { .. }) => {
            tracing::error!(serial, error = %e, "corrupt event value, removing the entry only");
            return t.events.delete(wtxn, &sk);
        }
        Err(e) => return Err(e),
    };
    let ev = match parsed {
        Ok(ev) => ev,
        Err(e) => {
            tracing::error!(serial, error = %e, "stored event does not parse, removing the entry only");
            return t.events.delete(wtxn, &sk);
        }
    };
    // Stored earlier in this batch: its entries are still pending, and
    // are taken back whole; otherwise they are in the tables.
    if !pending.as_mut().is_some_and(|p| p.cancel(&ev.id, serial)) {
        let mut buf = Vec::with_capacity(KEY_CAPACITY);
        for_each_index_key(&ev, serial, &mut buf, |index, key| {
            t.index_delete(wtxn, index, key)
        })?;
        t.ids.delete(wtxn, &ev.id)?;
    }
    if expires_at != 0 {
        t.expiry.delete(wtxn, &index_key(&[], expires_at, serial))?;
    }
    let addr = match KindClass::of(ev.kind) {
        KindClass::Replaceable => Some(Address::new(&ev.pubkey, ev.kind, None)),
        KindClass::Addressable => Some(Address::new(&ev.pubkey, ev.kind, Some(ev.d_tag()))),
        _ => None,
    };
    if let Some(addr) = addr
        && t.addresses.get(wtxn, &addr)? == Some(serial)
    {
        t.addresses.delete(wtxn, &addr)?;
    }
    t.events.delete(wtxn, &sk)
}
