//! The write path: one call, one LMDB write transaction, applying NIP-01
//! replacement, NIP-09 deletion and NIP-40 expiration rules in order, so a
//! batch gives the same result as writing its events one by one. Bytes that
//! do not decode abort the batch with `StoreError::Corrupt` (nothing of it is
//! written), except an event value being removed anyway, which is removed
//! and logged.

use std::ops::Bound;

use heed::{RoTxn, RwTxn};
use sluice_proto::kind::DELETION;
use sluice_proto::{Event, KindClass, hex32};

use crate::codec::{
    Address, Be64, Header, StoredEvent, author_prefix, index_key, tag_prefix, tombstone_key,
};
use crate::pending::Pending;
use crate::remove::{delete_indexed, delete_serial, delete_serial_pending};
use crate::retention::{Pruned, Retention, Scan, Scope, VANISH};
use crate::tables::{META_NEXT_SERIAL, Tables};

/// Kind of NIP-59 gift wraps.
const GIFT_WRAP: u16 = 1059;
use crate::{Store, StoreError};

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
    /// Retention would remove it at once: older than an age rule for its
    /// kind, beyond its author's newest `keep_per_author`, or older than
    /// what the size target keeps.
    OutsideRetention,
    /// Its author asked this relay to remove their events up to a time
    /// after it (NIP-62), or it is a gift wrap to such an author.
    Vanished,
}

/// What the write path applies besides NIP-01, NIP-09 and NIP-40.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteRules {
    /// Events retention would remove at once are not stored.
    pub retention: Retention,
    /// This relay's URLs (`auth.relay_urls`): a kind-62 request to vanish
    /// whose `relay` tag names one of them (or `ALL_RELAYS`) takes effect;
    /// with none configured, any URL does.
    pub relay_urls: Vec<String>,
}

impl WriteRules {
    /// Whether a kind-62 event asks this relay.
    pub fn vanish_applies(&self, ev: &Event) -> bool {
        ev.kind == VANISH
            && ev.tags.iter().any(|t| {
                t.first().is_some_and(|n| n == "relay")
                    && t.get(1).is_some_and(|url| {
                        url == "ALL_RELAYS"
                            || sluice_proto::auth::relay_matches(url, &self.relay_urls, None)
                    })
            })
    }
}

impl Store {
    /// Writes `events` in one transaction and commits it. On error nothing
    /// of the batch is written.
    pub fn write_batch<'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event>,
        now: u64,
    ) -> Result<Vec<WriteOutcome>, StoreError> {
        write_events(self, events, now, &WriteRules::default(), None).map(|(out, _)| out)
    }

    /// [`Store::write_batch`] with retention and NIP-62 rules.
    pub fn write_batch_ruled<'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event>,
        now: u64,
        rules: &WriteRules,
    ) -> Result<Vec<WriteOutcome>, StoreError> {
        write_events(self, events, now, rules, None).map(|(out, _)| out)
    }

    /// [`Store::write_batch_ruled`], then, in the same transaction (one
    /// commit, one sync), the removal `evict` picks (retention's size
    /// eviction riding on a client batch), raising its scope's horizon.
    pub fn write_batch_evicting<'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event>,
        now: u64,
        rules: &WriteRules,
        evict: &Scan,
    ) -> Result<(Vec<WriteOutcome>, Pruned), StoreError> {
        write_events(self, events, now, rules, Some(evict))
    }

    /// Removes up to `max` events whose expiration is at or before `now`.
    /// Returns how many were removed.
    pub fn purge_expired(&self, now: u64, max: usize) -> Result<usize, StoreError> {
        self.write_txn(|t, wtxn| {
            let end = index_key(&[], now, u64::MAX);
            let range = (
                std::ops::Bound::Unbounded,
                std::ops::Bound::Included(&end[..]),
            );
            delete_indexed(t, wtxn, &t.expiry, &range, max)
        })
    }

    /// Runs `f` in one write transaction and commits it; on error nothing
    /// is written.
    pub(crate) fn write_txn<T>(
        &self,
        f: impl FnOnce(&Tables<'static>, &mut RwTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_txn_adding(0, f)
    }

    /// [`Store::write_txn`] for a transaction that adds about `bytes` of
    /// events (a store written in the map reserves blocks for them first).
    pub(crate) fn write_txn_adding<T>(
        &self,
        bytes: u64,
        f: impl FnOnce(&Tables<'static>, &mut RwTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let run = || {
            let mut wtxn = self.wtxn(bytes)?;
            let out = f(&self.t, &mut wtxn)?;
            wtxn.commit()?;
            self.committed();
            Ok(out)
        };
        run().map_err(|e: StoreError| e.in_write(self.map_size_bytes))
    }
}

/// One batch in one transaction, under `rules`.
fn write_events<'a>(
    store: &Store,
    events: impl IntoIterator<Item = &'a Event>,
    now: u64,
    rules: &WriteRules,
    evict: Option<&Scan>,
) -> Result<(Vec<WriteOutcome>, Pruned), StoreError> {
    let horizons = if rules.retention.size_target {
        store.size_horizons()?
    } else {
        Vec::new()
    };
    let ctx = Ctx {
        rules,
        horizons: &horizons,
        now,
    };
    let events: Vec<&Event> = events.into_iter().collect();
    let bytes = events.iter().map(|e| e.raw().len() as u64).sum();
    store.write_txn_adding(bytes, |t, wtxn| {
        let mut next = t.meta.get(wtxn, META_NEXT_SERIAL)?.unwrap_or(1);
        let start = next;
        let mut out = Vec::new();
        let mut pending = Pending::default();
        for ev in events {
            out.push(write_one(t, wtxn, ev, &ctx, &mut next, &mut pending)?);
        }
        pending.flush(t, wtxn)?;
        if next != start {
            t.meta.put(wtxn, META_NEXT_SERIAL, &Be64::new(next))?;
        }
        let pruned = match evict {
            Some(scan) => {
                crate::retention::prune_in(t, wtxn, scan, true, std::time::Instant::now())?
            }
            None => Pruned::default(),
        };
        Ok((out, pruned))
    })
}

/// What every event of one batch is checked against.
struct Ctx<'a> {
    rules: &'a WriteRules,
    horizons: &'a [(Scope, u64)],
    now: u64,
}

fn write_one(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    ev: &Event,
    ctx: &Ctx,
    next: &mut u64,
    pending: &mut Pending,
) -> Result<WriteOutcome, StoreError> {
    let now = ctx.now;
    let class = KindClass::of(ev.kind);
    if class == KindClass::Ephemeral {
        return Ok(WriteOutcome::Ephemeral);
    }
    if pending.ids.contains_key(&ev.id) || t.ids.contains(wtxn, &ev.id)? {
        return Ok(WriteOutcome::Duplicate);
    }
    // Deleting a deletion does nothing, so kind 5 ignores tombstones.
    if ev.kind != DELETION
        && t.tombstones
            .contains(wtxn, &tombstone_key(&ev.id, &ev.pubkey))?
    {
        return Ok(WriteOutcome::Deleted);
    }
    let expires_at = ev.expiration().ok().flatten().unwrap_or(0);
    if expires_at != 0 && expires_at <= now {
        return Ok(WriteOutcome::Expired);
    }
    if vanished(t, wtxn, ev)? {
        return Ok(WriteOutcome::Vanished);
    }
    if crate::retention::refuses(t, wtxn, &ctx.rules.retention, ctx.horizons, ev, now)? {
        return Ok(WriteOutcome::OutsideRetention);
    }
    let mut replaced = false;
    let address = match class {
        KindClass::Replaceable => Some(Address::new(&ev.pubkey, ev.kind, None)),
        KindClass::Addressable => Some(Address::new(&ev.pubkey, ev.kind, Some(ev.d_tag()))),
        _ => None,
    };
    if let Some(addr) = &address {
        if let Some(deleted_at) = t.address_tombstones.get(wtxn, addr)?
            && ev.created_at <= deleted_at
        {
            return Ok(WriteOutcome::Deleted);
        }
        if let Some(old_serial) = t.addresses.get(wtxn, addr)?
            && let Some(StoredEvent { header: old, .. }) =
                t.events.get(wtxn, &Be64::new(old_serial))?
        {
            if !ev.supersedes(old.created_at, &old.id) {
                return Ok(WriteOutcome::Superseded);
            }
            delete_serial_pending(t, wtxn, old_serial, Some(&mut *pending))?;
            replaced = true;
        }
    }
    let serial = *next;
    *next = serial.checked_add(1).ok_or_else(|| StoreError::Corrupt {
        table: "meta",
        detail: "next_serial is u64::MAX".into(),
    })?;
    insert(t, wtxn, ev, serial, expires_at, pending)?;
    if let Some(addr) = &address {
        t.addresses.put(wtxn, addr, &Be64::new(serial))?;
    }
    let deleted = if ev.kind == DELETION {
        apply_deletion(t, wtxn, ev, pending)?
    } else {
        0
    };
    if ctx.rules.vanish_applies(ev) {
        let prev = t.vanished.get(wtxn, &ev.pubkey)?;
        if prev.is_none_or(|p| p < ev.created_at) {
            t.vanished
                .put(wtxn, &ev.pubkey, &Be64::new(ev.created_at))?;
        }
    }
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
    pending: &mut Pending,
) -> Result<(), StoreError> {
    let value = StoredEvent {
        header: Header {
            id: ev.id,
            pubkey: ev.pubkey,
            created_at: ev.created_at,
            kind: ev.kind,
            expires_at,
        },
        raw: ev.raw(),
    };
    // Serials only grow: appended, no search.
    t.events.append(wtxn, &Be64::new(serial), &value)?;
    pending.ids.insert(ev.id, serial);
    pending.add_keys_of(ev, serial);
    if expires_at != 0 {
        t.expiry
            .put(wtxn, &index_key(&[], expires_at, serial), &())?;
    }
    Ok(())
}

/// NIP-09: `e` tags delete the author's own events (and leave a tombstone
/// so a republished copy is refused); `a` tags delete the author's
/// replaceable/addressable versions up to the deletion's created_at.
/// Deletions never delete deletions.
fn apply_deletion(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    del: &Event,
    pending: &mut Pending,
) -> Result<u32, StoreError> {
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
                if let Some(serial) = pending.serial_of(t, wtxn, &id)? {
                    match t.events.get(wtxn, &Be64::new(serial))? {
                        Some(StoredEvent { header: h, .. })
                            if h.pubkey == del.pubkey && h.kind != DELETION =>
                        {
                            delete_serial_pending(t, wtxn, serial, Some(&mut *pending))?;
                            deleted += 1;
                        }
                        _ => continue,
                    }
                }
                t.tombstones
                    .put(wtxn, &tombstone_key(&id, &del.pubkey), &())?;
            }
            "a" => {
                let Some((kind, pubkey, d)) = parse_address(value) else {
                    continue;
                };
                if pubkey != del.pubkey {
                    continue;
                }
                let addr = match KindClass::of(kind) {
                    KindClass::Replaceable => Address::new(&pubkey, kind, None),
                    KindClass::Addressable => Address::new(&pubkey, kind, Some(d)),
                    _ => continue,
                };
                if let Some(serial) = t.addresses.get(wtxn, &addr)?
                    && let Some(StoredEvent { header: h, .. }) =
                        t.events.get(wtxn, &Be64::new(serial))?
                    && h.created_at <= del.created_at
                {
                    delete_serial_pending(t, wtxn, serial, Some(&mut *pending))?;
                    deleted += 1;
                }
                let prev = t.address_tombstones.get(wtxn, &addr)?;
                if prev.is_none_or(|p| p < del.created_at) {
                    t.address_tombstones
                        .put(wtxn, &addr, &Be64::new(del.created_at))?;
                }
            }
            _ => {}
        }
    }
    Ok(deleted)
}

/// Whether `ev` falls under a NIP-62 request to vanish: its author's (a
/// newer request does not), or, for a gift wrap, a `p`-tagged recipient's.
fn vanished(t: &Tables, txn: &RoTxn, ev: &Event) -> Result<bool, StoreError> {
    if ev.kind != VANISH
        && t.vanished
            .get(txn, &ev.pubkey)?
            .is_some_and(|until| ev.created_at <= until)
    {
        return Ok(true);
    }
    if ev.kind == GIFT_WRAP {
        for tag in &ev.tags {
            if tag.first().is_some_and(|n| n == "p")
                && let Some(p) = tag.get(1).and_then(|v| hex32::decode::<32>(v))
                && t.vanished
                    .get(txn, &p)?
                    .is_some_and(|until| ev.created_at <= until)
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

impl Store {
    /// Removes up to `max` events a NIP-62 request of `pubkey` covers (its
    /// events up to the request's created_at, except requests to vanish,
    /// then gift wraps `p`-tagged to it), in one transaction; returns how
    /// many. Call again until it returns fewer than `max`.
    pub fn purge_vanished(&self, pubkey: &[u8; 32], max: usize) -> Result<usize, StoreError> {
        self.write_txn(|t, wtxn| {
            let Some(until) = t.vanished.get(wtxn, pubkey)? else {
                return Ok(0);
            };
            let mut doomed = Vec::new();
            let prefix = author_prefix(pubkey);
            let (from, to) = (
                index_key(&prefix, 0, 0),
                index_key(&prefix, until, u64::MAX),
            );
            let range = (Bound::Included(&from[..]), Bound::Included(&to[..]));
            for item in t.by_author.range(wtxn, &range)? {
                let ((_, serial), ()) = item.map_err(|e| t.by_author.error(e))?;
                match t.events.get(wtxn, &Be64::new(serial))? {
                    Some(StoredEvent { header, .. }) if header.kind == VANISH => continue,
                    _ => doomed.push(serial),
                }
                if doomed.len() == max {
                    break;
                }
            }
            if doomed.len() < max {
                let prefix = tag_prefix(b'p', &hex32::encode(pubkey));
                let (from, to) = (
                    index_key(&prefix, 0, 0),
                    index_key(&prefix, until, u64::MAX),
                );
                let range = (Bound::Included(&from[..]), Bound::Included(&to[..]));
                for item in t.by_tag.range(wtxn, &range)? {
                    let ((_, serial), ()) = item.map_err(|e| t.by_tag.error(e))?;
                    if let Some(StoredEvent { header, .. }) =
                        t.events.get(wtxn, &Be64::new(serial))?
                        && header.kind == GIFT_WRAP
                    {
                        doomed.push(serial);
                        if doomed.len() == max {
                            break;
                        }
                    }
                }
            }
            for &s in &doomed {
                delete_serial(t, wtxn, s)?;
            }
            Ok(doomed.len())
        })
    }
}

/// `kind:pubkey:d` of an `a` tag.
fn parse_address(value: &str) -> Option<(u16, [u8; 32], &str)> {
    let mut parts = value.splitn(3, ':');
    let kind = parts.next()?.parse::<u16>().ok()?;
    let pubkey = hex32::decode::<32>(parts.next()?)?;
    let d = parts.next().unwrap_or("");
    Some((kind, pubkey, d))
}
