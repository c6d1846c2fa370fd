//! The write path: one call, one LMDB write transaction, applying NIP-01
//! replacement, NIP-09 deletion and NIP-40 expiration rules in order, so a
//! batch gives the same result as writing its events one by one.

use heed::RwTxn;
use sluice_proto::kind::DELETION;
use sluice_proto::{Event, KindClass, hex32};

use crate::keys::{self, Header};
use crate::{Index, META_NEXT_SERIAL, Store, StoreError, Tables, decode};

/// What happened to one event of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored under `serial`; `replaced` when it superseded an older version
    /// of a replaceable or addressable event; `deleted` counts the events a
    /// NIP-09 deletion removed.
    Stored {
        serial: u64,
        replaced: bool,
        deleted: u32,
    },
    /// The same id is already stored.
    Duplicate,
    /// A newer version of this replaceable or addressable event is stored.
    Superseded,
    /// Its author deleted it (NIP-09); it is not stored again.
    Deleted,
    /// Its NIP-40 expiration has passed.
    Expired,
    /// Ephemeral kinds are never stored.
    Ephemeral,
}

impl Store {
    /// Writes `events` in one transaction and commits it. On error nothing
    /// of the batch is written.
    pub fn write_batch<'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event>,
        now: u64,
    ) -> Result<Vec<WriteOutcome>, StoreError> {
        let fail = |e| StoreError::from_heed(e, self.map_size_bytes);
        let mut wtxn = self.env.write_txn().map_err(fail)?;
        let mut next = match self.t.meta.get(&wtxn, META_NEXT_SERIAL).map_err(fail)? {
            Some(v) if v.len() == 8 => keys::read_u64(v),
            _ => 1,
        };
        let start = next;
        let mut out = Vec::new();
        for ev in events {
            out.push(write_one(&self.t, &mut wtxn, ev, now, &mut next).map_err(fail)?);
        }
        if next != start {
            self.t
                .meta
                .put(&mut wtxn, META_NEXT_SERIAL, &next.to_be_bytes())
                .map_err(fail)?;
        }
        wtxn.commit().map_err(fail)?;
        Ok(out)
    }

    /// Removes up to `max` events whose expiration is at or before `now`.
    /// Returns how many were removed.
    pub fn purge_expired(&self, now: u64, max: usize) -> Result<usize, StoreError> {
        let fail = |e| StoreError::from_heed(e, self.map_size_bytes);
        let mut wtxn = self.env.write_txn().map_err(fail)?;
        let end = keys::index_key(&[], now, u64::MAX);
        let serials: Vec<u64> = self
            .t
            .expiry
            .range(
                &wtxn,
                &(
                    std::ops::Bound::Unbounded,
                    std::ops::Bound::Included(&end[..]),
                ),
            )
            .map_err(fail)?
            .take(max)
            .map(|r| r.map(|(k, _)| keys::split_index_key(k).1))
            .collect::<Result<_, _>>()
            .map_err(fail)?;
        for &s in &serials {
            delete_serial(&self.t, &mut wtxn, s).map_err(fail)?;
        }
        wtxn.commit().map_err(fail)?;
        Ok(serials.len())
    }
}

fn write_one(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    ev: &Event,
    now: u64,
    next: &mut u64,
) -> Result<WriteOutcome, heed::Error> {
    let class = KindClass::of(ev.kind);
    if class == KindClass::Ephemeral {
        return Ok(WriteOutcome::Ephemeral);
    }
    if t.ids.get(wtxn, &ev.id)?.is_some() {
        return Ok(WriteOutcome::Duplicate);
    }
    // Deleting a deletion does nothing, so kind 5 ignores tombstones.
    if ev.kind != DELETION
        && t.tombstones
            .get(wtxn, &keys::tombstone_key(&ev.id, &ev.pubkey))?
            .is_some()
    {
        return Ok(WriteOutcome::Deleted);
    }
    let expires_at = ev.expiration().ok().flatten().unwrap_or(0);
    if expires_at != 0 && expires_at <= now {
        return Ok(WriteOutcome::Expired);
    }
    let mut replaced = false;
    let address = match class {
        KindClass::Replaceable => Some(keys::address_key(&ev.pubkey, ev.kind, None)),
        KindClass::Addressable => Some(keys::address_key(&ev.pubkey, ev.kind, Some(ev.d_tag()))),
        _ => None,
    };
    if let Some(addr) = &address {
        if let Some(ts) = t.address_tombstones.get(wtxn, addr)?
            && ev.created_at <= keys::read_u64(ts)
        {
            return Ok(WriteOutcome::Deleted);
        }
        if let Some(old) = t.addresses.get(wtxn, addr)? {
            let old_serial = keys::read_u64(old);
            let old_value = t.events.get(wtxn, &keys::serial(old_serial))?;
            if let Some((h, _)) = old_value.and_then(Header::decode) {
                if !ev.supersedes(h.created_at, &h.id) {
                    return Ok(WriteOutcome::Superseded);
                }
                delete_serial(t, wtxn, old_serial)?;
                replaced = true;
            }
        }
    }
    let serial = *next;
    *next += 1;
    insert(t, wtxn, ev, serial, expires_at)?;
    if let Some(addr) = &address {
        t.addresses.put(wtxn, addr, &keys::serial(serial))?;
    }
    let deleted = if ev.kind == DELETION {
        apply_deletion(t, wtxn, ev)?
    } else {
        0
    };
    Ok(WriteOutcome::Stored {
        serial,
        replaced,
        deleted,
    })
}

fn insert(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    ev: &Event,
    serial: u64,
    expires_at: u64,
) -> Result<(), heed::Error> {
    let header = Header {
        id: ev.id,
        pubkey: ev.pubkey,
        created_at: ev.created_at,
        kind: ev.kind,
        expires_at,
    };
    let sk = keys::serial(serial);
    t.events.put(wtxn, &sk, &header.encode_with(ev.raw()))?;
    t.ids.put(wtxn, &ev.id, &sk)?;
    for (table, key) in index_keys(ev, serial) {
        t.index(table).put(wtxn, &key, &[])?;
    }
    if expires_at != 0 {
        t.expiry
            .put(wtxn, &keys::index_key(&[], expires_at, serial), &[])?;
    }
    Ok(())
}

/// Every index entry of an event: the single source for insert and delete.
fn index_keys(ev: &Event, serial: u64) -> Vec<(Index, Vec<u8>)> {
    let ca = ev.created_at;
    let mut v = vec![
        (Index::Created, keys::index_key(&[], ca, serial)),
        (
            Index::Author,
            keys::index_key(&keys::author_prefix(&ev.pubkey), ca, serial),
        ),
        (
            Index::Kind,
            keys::index_key(&keys::kind_prefix(ev.kind), ca, serial),
        ),
        (
            Index::AuthorKind,
            keys::index_key(&keys::author_kind_prefix(&ev.pubkey, ev.kind), ca, serial),
        ),
    ];
    for (letter, value) in ev.indexed_tags() {
        v.push((
            Index::Tag,
            keys::index_key(&keys::tag_prefix(letter, value), ca, serial),
        ));
    }
    v
}

/// Removes an event and all its index entries. A serial that is not there
/// is not an error (it was removed earlier in the same batch).
fn delete_serial(t: &Tables, wtxn: &mut RwTxn<'_>, serial: u64) -> Result<(), heed::Error> {
    let sk = keys::serial(serial);
    let Some(value) = t.events.get(wtxn, &sk)? else {
        return Ok(());
    };
    let (h, raw) = match decode(value, &sk) {
        Ok(x) => x,
        Err(_) => {
            tracing::error!(serial, "corrupt event value, removing the entry only");
            t.events.delete(wtxn, &sk)?;
            return Ok(());
        }
    };
    let expires_at = h.expires_at;
    let ev = match Event::parse(raw) {
        Ok(ev) => ev,
        Err(e) => {
            tracing::error!(serial, error = %e, "stored event does not parse, removing the entry only");
            t.events.delete(wtxn, &sk)?;
            return Ok(());
        }
    };
    for (table, key) in index_keys(&ev, serial) {
        t.index(table).delete(wtxn, &key)?;
    }
    t.ids.delete(wtxn, &ev.id)?;
    if expires_at != 0 {
        t.expiry
            .delete(wtxn, &keys::index_key(&[], expires_at, serial))?;
    }
    let addr = match KindClass::of(ev.kind) {
        KindClass::Replaceable => Some(keys::address_key(&ev.pubkey, ev.kind, None)),
        KindClass::Addressable => Some(keys::address_key(&ev.pubkey, ev.kind, Some(ev.d_tag()))),
        _ => None,
    };
    if let Some(addr) = addr
        && t.addresses.get(wtxn, &addr)? == Some(&sk[..])
    {
        t.addresses.delete(wtxn, &addr)?;
    }
    t.events.delete(wtxn, &sk)?;
    Ok(())
}

/// NIP-09: `e` tags delete the author's own events (and leave a tombstone
/// so a republished copy is refused); `a` tags delete the author's
/// replaceable/addressable versions up to the deletion's created_at.
/// Deletions never delete deletions.
fn apply_deletion(t: &Tables, wtxn: &mut RwTxn<'_>, del: &Event) -> Result<u32, heed::Error> {
    let mut deleted = 0;
    for tag in &del.tags {
        let (Some(name), Some(value)) = (tag.first(), tag.get(1)) else {
            continue;
        };
        match name.as_str() {
            "e" => {
                let Some(id) = hex32::decode::<32>(value) else {
                    continue;
                };
                if let Some(sv) = t.ids.get(wtxn, &id)? {
                    let serial = keys::read_u64(sv);
                    let target = t
                        .events
                        .get(wtxn, &keys::serial(serial))?
                        .and_then(Header::decode);
                    match target {
                        Some((h, _)) if h.pubkey == del.pubkey && h.kind != DELETION => {
                            delete_serial(t, wtxn, serial)?;
                            deleted += 1;
                        }
                        _ => continue,
                    }
                }
                t.tombstones
                    .put(wtxn, &keys::tombstone_key(&id, &del.pubkey), &[])?;
            }
            "a" => {
                let Some((kind, pubkey, d)) = parse_address(value) else {
                    continue;
                };
                if pubkey != del.pubkey {
                    continue;
                }
                let addr = match KindClass::of(kind) {
                    KindClass::Replaceable => keys::address_key(&pubkey, kind, None),
                    KindClass::Addressable => keys::address_key(&pubkey, kind, Some(d)),
                    _ => continue,
                };
                if let Some(sv) = t.addresses.get(wtxn, &addr)? {
                    let serial = keys::read_u64(sv);
                    let target = t
                        .events
                        .get(wtxn, &keys::serial(serial))?
                        .and_then(Header::decode);
                    if let Some((h, _)) = target
                        && h.created_at <= del.created_at
                    {
                        delete_serial(t, wtxn, serial)?;
                        deleted += 1;
                    }
                }
                let prev = t.address_tombstones.get(wtxn, &addr)?.map(keys::read_u64);
                if prev.is_none_or(|p| p < del.created_at) {
                    t.address_tombstones
                        .put(wtxn, &addr, &del.created_at.to_be_bytes())?;
                }
            }
            _ => {}
        }
    }
    Ok(deleted)
}

/// `kind:pubkey:d` of an `a` tag.
fn parse_address(value: &str) -> Option<(u16, [u8; 32], &str)> {
    let mut parts = value.splitn(3, ':');
    let kind = parts.next()?.parse::<u16>().ok()?;
    let pubkey = hex32::decode::<32>(parts.next()?)?;
    let d = parts.next().unwrap_or("");
    Some((kind, pubkey, d))
}
