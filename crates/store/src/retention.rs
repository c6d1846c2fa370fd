//! Retention: what the store removes on purpose, and what it refuses to
//! store because it would remove it at once.
//!
//! The store applies rules it is given ([`Retention`]); the engine owns
//! the `[retention]` section, decides when to run a step, and counts. Every
//! removal here is a bounded step in one write transaction (a crash leaves
//! the store as before or after the step), built from two halves: a
//! read-only pick of what to remove (also what `--dry-run` counts) and the
//! removal of the picked serials through the one delete path
//! ([`crate::remove::delete_serial`]).
//!
//! What no rule removes:
//! - events of exempt authors ([`Retention::exempt`]);
//! - the current version of a replaceable or addressable event, except by
//!   an age rule that names its kind (`kinds` lists it);
//! - deletions (kind 5) and vanish requests (kind 62) are never refused at
//!   write time, so their effect is never lost (they may be pruned later).

use std::collections::HashSet;
use std::ops::Bound;
use std::time::{Duration, Instant};

use heed::{RoTxn, RwTxn};
use sluice_proto::{Event, KindClass};

use crate::codec::{
    Be64, Prefix, StoredEvent, author_kind_prefix, author_prefix, index_key, kind_prefix,
};
use crate::remove::delete_serial;
use crate::tables::{IndexTable, META_HORIZON_PREFIX, Tables};
use crate::{Store, StoreError};

/// Kind of NIP-62 requests to vanish.
pub const VANISH: u16 = 62;

/// The rules the store applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Retention {
    pub rules: Vec<Rule>,
    /// Authors whose events no rule removes.
    pub exempt: HashSet<[u8; 32]>,
    /// Whether a size target is set: only then do the size horizons (the
    /// newest `created_at` size eviction removed, per scope) refuse older
    /// events.
    pub size_target: bool,
}

impl Retention {
    /// Whether `scope` is a size phase of these rules (every kind, or the
    /// kinds of an age rule): a horizon left by rules since changed does
    /// not refuse anything.
    fn phase(&self, scope: &Scope) -> bool {
        *scope == Scope::All
            || self
                .rules
                .iter()
                .any(|r| r.max_age_secs.is_some() && Scope::of_kinds(&r.kinds) == *scope)
    }
}

/// One retention rule: events of `kinds` (every kind when empty) older
/// than `max_age_secs`, or beyond the newest `keep_per_author` of their
/// author among those kinds, are removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub kinds: Vec<u16>,
    pub max_age_secs: Option<u64>,
    pub keep_per_author: Option<u64>,
}

/// Replaceable and addressable kinds: only the current version is stored.
pub fn is_replaceable(kind: u16) -> bool {
    matches!(
        KindClass::of(kind),
        KindClass::Replaceable | KindClass::Addressable
    )
}

impl Rule {
    /// Whether this rule's age limit applies to events of `kind`.
    pub fn ages(&self, kind: u16) -> bool {
        self.max_age_secs.is_some()
            && if self.kinds.is_empty() {
                !is_replaceable(kind)
            } else {
                self.kinds.contains(&kind)
            }
    }

    /// Whether this rule's per-author count applies to events of `kind`.
    pub fn counts(&self, kind: u16) -> bool {
        self.keep_per_author.is_some()
            && !is_replaceable(kind)
            && (self.kinds.is_empty() || self.kinds.contains(&kind))
    }

    /// The created_at before which this rule's age limit removes, at `now`.
    pub fn age_cutoff(&self, now: u64) -> Option<u64> {
        self.max_age_secs.map(|age| now.saturating_sub(age))
    }
}

/// Which events a size or age scan walks, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every kind (by the `by_created` index).
    All,
    /// These kinds (by the `by_kind` index, merged by time).
    Kinds(Vec<u16>),
}

impl Scope {
    pub fn of_kinds(kinds: &[u16]) -> Scope {
        if kinds.is_empty() {
            Scope::All
        } else {
            let mut k = kinds.to_vec();
            k.sort_unstable();
            k.dedup();
            Scope::Kinds(k)
        }
    }

    /// The `meta` key of this scope's size horizon.
    fn horizon_key(&self) -> String {
        match self {
            Scope::All => format!("{META_HORIZON_PREFIX}*"),
            Scope::Kinds(k) => {
                let list: Vec<String> = k.iter().map(u16::to_string).collect();
                format!("{META_HORIZON_PREFIX}{}", list.join(","))
            }
        }
    }

    fn contains(&self, kind: u16) -> bool {
        match self {
            Scope::All => true,
            Scope::Kinds(k) => k.contains(&kind),
        }
    }
}

/// One bounded walk over the oldest events of a scope.
#[derive(Debug, Clone)]
pub struct Scan<'a> {
    pub scope: &'a Scope,
    /// Only events with `created_at` below this (`u64::MAX`: all).
    pub before: u64,
    /// Resume after this `(created_at, serial)`.
    pub after: Option<(u64, u64)>,
    /// Whether current versions of replaceable/addressable events may go
    /// (only an age rule naming their kind).
    pub replaceable: bool,
    pub exempt: &'a HashSet<[u8; 32]>,
    /// Most events picked.
    pub max_pick: usize,
    /// Most index entries looked at.
    pub max_examine: usize,
    /// A removal step stops once it has run this long (whatever it
    /// picked), so a client batch never waits long behind it.
    pub max_time: Duration,
}

/// What a walk picked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Picked {
    /// Serials of the events to remove, oldest first.
    pub serials: Vec<u64>,
    /// Their `(created_at, serial)` index positions.
    pub keys: Vec<(u64, u64)>,
    /// Bytes of their JSON.
    pub bytes: u64,
    /// The newest `created_at` picked (0 if none).
    pub newest: u64,
    pub examined: usize,
    /// Where the next walk resumes; `None` when this one reached the end
    /// of the scope (or `before`).
    pub next: Option<(u64, u64)>,
}

/// What one removal step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub removed: u64,
    /// Time spent picking and removing (not the commit).
    pub took: Duration,
    pub bytes: u64,
    pub examined: usize,
    pub next: Option<(u64, u64)>,
}

impl Store {
    /// Bytes of the pages that hold data: every table's branch, leaf and
    /// overflow pages, the catalogue of tables and the two meta pages. The
    /// file (`data.mdb`) also holds free pages, which LMDB reuses; this is
    /// what retention's size target measures. Cheap (no scan).
    pub fn used_bytes(&self) -> Result<u64, StoreError> {
        let rtxn = self.rtxn()?;
        let main = self.env.unnamed_database_stat();
        let page = u64::from(main.page_size);
        let mut pages = 2 + data_pages(&main);
        for s in self.t.stats(&rtxn)? {
            pages += data_pages(&s);
        }
        Ok(pages * page)
    }

    /// Picks (without removing) what [`Store::prune_oldest`] would remove.
    pub fn pick_oldest(&self, scan: &Scan) -> Result<Picked, StoreError> {
        let rtxn = self.rtxn()?;
        pick_oldest(&self.t, &rtxn, scan)
    }

    /// One bounded step: removes the events [`Scan`] picks, in one
    /// transaction. With `horizon`, the size horizon of the scan's scope is
    /// raised to the newest `created_at` removed.
    pub fn prune_oldest(&self, scan: &Scan, horizon: bool) -> Result<Pruned, StoreError> {
        let started = Instant::now();
        self.write_txn(|t, wtxn| prune_in(t, wtxn, scan, horizon, started))
    }

    /// The size horizons: per scope, the newest `created_at` size eviction
    /// removed.
    pub fn size_horizons(&self) -> Result<Vec<(Scope, u64)>, StoreError> {
        let rtxn = self.rtxn()?;
        let range: (Bound<&str>, Bound<&str>) =
            (Bound::Included(META_HORIZON_PREFIX), Bound::Unbounded);
        let mut out = Vec::new();
        for item in self.t.meta.range(&rtxn, &range)? {
            let (key, v) = item.map_err(|e| self.t.meta.error(e))?;
            let Some(rest) = key.strip_prefix(META_HORIZON_PREFIX) else {
                break;
            };
            let scope = if rest == "*" {
                Scope::All
            } else {
                let kinds: Result<Vec<u16>, _> = rest.split(',').map(str::parse).collect();
                match kinds {
                    Ok(k) => Scope::Kinds(k),
                    Err(_) => continue,
                }
            };
            out.push((scope, v));
        }
        Ok(out)
    }

    /// Picks (without removing) the events of `author` beyond the newest
    /// `keep` among `kinds` (every kind when empty; never replaceable or
    /// addressable ones), at most `max_pick`. Returns the serials and
    /// whether more may remain.
    pub fn pick_author_excess(
        &self,
        author: &[u8; 32],
        kinds: &[u16],
        keep: u64,
        max_pick: usize,
    ) -> Result<(Vec<u64>, bool), StoreError> {
        let rtxn = self.rtxn()?;
        pick_author_excess(&self.t, &rtxn, author, kinds, keep, max_pick)
    }

    /// Removes what [`Store::pick_author_excess`] picks, in one
    /// transaction; returns how many and whether more may remain.
    pub fn prune_author_excess(
        &self,
        author: &[u8; 32],
        kinds: &[u16],
        keep: u64,
        max_pick: usize,
        max_time: Duration,
    ) -> Result<(u64, bool), StoreError> {
        let started = Instant::now();
        self.write_txn(|t, wtxn| {
            let (serials, more) = pick_author_excess(t, wtxn, author, kinds, keep, max_pick)?;
            let mut removed = 0;
            for (i, &s) in serials.iter().enumerate() {
                if i % 8 == 7 && started.elapsed() >= max_time {
                    return Ok((removed, true));
                }
                delete_serial(t, wtxn, s)?;
                removed += 1;
            }
            Ok((removed, more))
        })
    }

    /// Up to `max` distinct authors with stored events, in key order,
    /// after `after`.
    pub fn authors_after(
        &self,
        after: Option<&[u8; 32]>,
        max: usize,
    ) -> Result<Vec<[u8; 32]>, StoreError> {
        let rtxn = self.rtxn()?;
        let mut out = Vec::new();
        let mut from = after.map(|a| index_key(a, u64::MAX, u64::MAX));
        while out.len() < max {
            let range: (Bound<&[u8]>, Bound<&[u8]>) = match &from {
                Some(k) => (Bound::Excluded(&k[..]), Bound::Unbounded),
                None => (Bound::Unbounded, Bound::Unbounded),
            };
            let Some(key) = self.t.by_author.first_key_bytes(&rtxn, &range)? else {
                break;
            };
            let Some(author) = key.first_chunk::<32>() else {
                return Err(StoreError::Corrupt {
                    table: "by_author",
                    detail: format!("key of {} bytes", key.len()),
                });
            };
            out.push(*author);
            from = Some(index_key(author, u64::MAX, u64::MAX));
        }
        Ok(out)
    }
}

/// Pages a database's entries take: branch, leaf and overflow.
fn data_pages(s: &heed::DatabaseStat) -> u64 {
    (s.branch_pages + s.leaf_pages + s.overflow_pages) as u64
}

/// Removes what `scan` picks inside `wtxn`, stopping once `scan.max_time`
/// has passed since `started`; with `horizon`, raises the scope's size
/// horizon to the newest `created_at` removed.
pub(crate) fn prune_in(
    t: &Tables,
    wtxn: &mut RwTxn<'_>,
    scan: &Scan,
    horizon: bool,
    started: Instant,
) -> Result<Pruned, StoreError> {
    let picked = pick_oldest(t, wtxn, scan)?;
    let mut done = Pruned {
        examined: picked.examined,
        next: picked.next,
        ..Pruned::default()
    };
    let mut newest = 0;
    for (i, (&serial, &key)) in picked.serials.iter().zip(&picked.keys).enumerate() {
        if i % 8 == 7 && started.elapsed() >= scan.max_time {
            // Out of time: the next step resumes at the first one left.
            done.next = Some(key_before(key));
            break;
        }
        delete_serial(t, wtxn, serial)?;
        done.removed += 1;
        newest = newest.max(key.0);
    }
    done.bytes = picked.bytes;
    done.took = started.elapsed();
    if horizon && done.removed > 0 {
        let key = scan.scope.horizon_key();
        let prev = t.meta.get(wtxn, &key)?.unwrap_or(0);
        if newest > prev {
            t.meta.put(wtxn, &key, &Be64::new(newest))?;
        }
    }
    Ok(done)
}

/// The index position just before `key`, so that a walk resuming after it
/// starts at `key` itself.
fn key_before((created_at, serial): (u64, u64)) -> (u64, u64) {
    match serial.checked_sub(1) {
        Some(s) => (created_at, s),
        None => (created_at.saturating_sub(1), u64::MAX),
    }
}

/// Whether retention would remove `ev` at once, so it is not stored:
/// older than an age rule that applies to it, beyond its author's newest
/// `keep_per_author` of a count rule, or older than the size horizon of
/// its scope. Deletions and vanish requests are always stored.
pub(crate) fn refuses(
    t: &Tables,
    txn: &RoTxn,
    ret: &Retention,
    horizons: &[(Scope, u64)],
    ev: &Event,
    now: u64,
) -> Result<bool, StoreError> {
    if ev.kind == sluice_proto::kind::DELETION
        || ev.kind == VANISH
        || ret.exempt.contains(&ev.pubkey)
    {
        return Ok(false);
    }
    for rule in &ret.rules {
        if rule.ages(ev.kind)
            && let Some(cutoff) = rule.age_cutoff(now)
            && ev.created_at < cutoff
        {
            return Ok(true);
        }
    }
    if ret.size_target && !is_replaceable(ev.kind) {
        for (scope, horizon) in horizons {
            if ev.created_at < *horizon && scope.contains(ev.kind) && ret.phase(scope) {
                return Ok(true);
            }
        }
    }
    for rule in &ret.rules {
        if let Some(keep) = rule.keep_per_author
            && rule.counts(ev.kind)
            && newer_than(t, txn, &ev.pubkey, &rule.kinds, ev.created_at, keep)? >= keep
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How many events of `author` among `kinds` (every non-replaceable kind
/// when empty) are newer than `created_at`, counting up to `limit`.
fn newer_than(
    t: &Tables,
    txn: &RoTxn,
    author: &[u8; 32],
    kinds: &[u16],
    created_at: u64,
    limit: u64,
) -> Result<u64, StoreError> {
    let start = created_at.saturating_add(1);
    let mut n = 0u64;
    if kinds.is_empty() {
        let prefix = author_prefix(author);
        let (from, to) = (
            index_key(&prefix, start, 0),
            index_key(&prefix, u64::MAX, u64::MAX),
        );
        let range = (Bound::Included(&from[..]), Bound::Included(&to[..]));
        for item in t.by_author.range(txn, &range)? {
            let ((_, serial), ()) = item.map_err(|e| t.by_author.error(e))?;
            if let Some(StoredEvent { header, .. }) = t.events.get(txn, &Be64::new(serial))?
                && !is_replaceable(header.kind)
            {
                n += 1;
                if n >= limit {
                    break;
                }
            }
        }
        return Ok(n);
    }
    for &kind in kinds.iter().filter(|k| !is_replaceable(**k)) {
        let prefix = author_kind_prefix(author, kind);
        let (from, to) = (
            index_key(&prefix, start, 0),
            index_key(&prefix, u64::MAX, u64::MAX),
        );
        let range = (Bound::Included(&from[..]), Bound::Included(&to[..]));
        for item in t.by_author_kind.range(txn, &range)? {
            item.map_err(|e| t.by_author_kind.error(e))?;
            n += 1;
            if n >= limit {
                return Ok(n);
            }
        }
    }
    Ok(n)
}

/// Up to `n` entries `(created_at, serial)` of one prefix of an index,
/// oldest first, after `after` and before `before`; and whether it stopped
/// at `n`.
fn oldest_of<P: Prefix + 'static>(
    table: &IndexTable<'_, P>,
    txn: &RoTxn,
    prefix: &[u8],
    after: Option<(u64, u64)>,
    before: u64,
    n: usize,
) -> Result<(Vec<(u64, u64)>, bool), StoreError> {
    let from = match after {
        Some((ca, s)) => Bound::Excluded(index_key(prefix, ca, s)),
        None => Bound::Included(index_key(prefix, 0, 0)),
    };
    let to = if before == u64::MAX {
        Bound::Included(index_key(prefix, u64::MAX, u64::MAX))
    } else {
        Bound::Excluded(index_key(prefix, before, 0))
    };
    let range = (from.as_ref().map(|k| &k[..]), to.as_ref().map(|k| &k[..]));
    let mut out = Vec::new();
    for item in table.range(txn, &range)? {
        let (key, ()) = item.map_err(|e| table.error(e))?;
        out.push(key);
        if out.len() == n {
            return Ok((out, true));
        }
    }
    Ok((out, false))
}

fn pick_oldest(t: &Tables, txn: &RoTxn, scan: &Scan) -> Result<Picked, StoreError> {
    let n = scan.max_examine.max(1);
    // Each source's oldest entries; with several kinds, merged by time.
    let mut entries = Vec::new();
    // The oldest last entry of a source that stopped at `n`: past it, the
    // merge may miss that source's entries, so the walk stops there.
    let mut cutoff: Option<(u64, u64)> = None;
    let mut add = |(got, truncated): (Vec<(u64, u64)>, bool)| {
        if truncated && let Some(&last) = got.last() {
            cutoff = Some(cutoff.map_or(last, |c: (u64, u64)| c.min(last)));
        }
        entries.extend(got);
    };
    match scan.scope {
        Scope::All => add(oldest_of(
            &t.by_created,
            txn,
            &[],
            scan.after,
            scan.before,
            n,
        )?),
        Scope::Kinds(kinds) => {
            for &kind in kinds {
                add(oldest_of(
                    &t.by_kind,
                    txn,
                    &kind_prefix(kind),
                    scan.after,
                    scan.before,
                    n,
                )?);
            }
        }
    }
    entries.sort_unstable();
    let reached_end = cutoff.is_none();
    if let Some(c) = cutoff {
        entries.retain(|e| *e <= c);
    }
    let mut picked = Picked::default();
    let mut last = None;
    let mut walked_all = true;
    for (i, &(created_at, serial)) in entries.iter().enumerate() {
        if picked.serials.len() >= scan.max_pick || i >= n {
            walked_all = false;
            break;
        }
        picked.examined += 1;
        last = Some((created_at, serial));
        let Some(StoredEvent { header, raw }) = t.events.get(txn, &Be64::new(serial))? else {
            continue;
        };
        if scan.exempt.contains(&header.pubkey)
            || (!scan.replaceable && is_replaceable(header.kind))
        {
            continue;
        }
        picked.serials.push(serial);
        picked.keys.push((created_at, serial));
        picked.bytes += raw.len() as u64;
        picked.newest = picked.newest.max(created_at);
    }
    picked.next = if walked_all && reached_end {
        None
    } else {
        last.or(scan.after)
    };
    Ok(picked)
}

fn pick_author_excess(
    t: &Tables,
    txn: &RoTxn,
    author: &[u8; 32],
    kinds: &[u16],
    keep: u64,
    max_pick: usize,
) -> Result<(Vec<u64>, bool), StoreError> {
    let want = usize::try_from(keep)
        .unwrap_or(usize::MAX)
        .saturating_add(max_pick);
    let mut entries: Vec<(u64, u64)> = Vec::new();
    let mut more = false;
    if kinds.is_empty() {
        let prefix = author_prefix(author);
        let (from, to) = (
            index_key(&prefix, 0, 0),
            index_key(&prefix, u64::MAX, u64::MAX),
        );
        let range = (Bound::Included(&from[..]), Bound::Included(&to[..]));
        for item in t.by_author.rev_range(txn, &range)? {
            let ((created_at, serial), ()) = item.map_err(|e| t.by_author.error(e))?;
            if let Some(StoredEvent { header, .. }) = t.events.get(txn, &Be64::new(serial))?
                && !is_replaceable(header.kind)
            {
                if entries.len() == want {
                    more = true;
                    break;
                }
                entries.push((created_at, serial));
            }
        }
    } else {
        for &kind in kinds.iter().filter(|k| !is_replaceable(**k)) {
            let prefix = author_kind_prefix(author, kind);
            let (from, to) = (
                index_key(&prefix, 0, 0),
                index_key(&prefix, u64::MAX, u64::MAX),
            );
            let range = (Bound::Included(&from[..]), Bound::Included(&to[..]));
            for (taken, item) in t.by_author_kind.rev_range(txn, &range)?.enumerate() {
                let (key, ()) = item.map_err(|e| t.by_author_kind.error(e))?;
                if taken == want {
                    more = true;
                    break;
                }
                entries.push(key);
            }
        }
    }
    // Newest first: the first `keep` stay. Every source gave its newest
    // `keep + max_pick`, so the merged first `keep + max_pick` are exact.
    entries.sort_unstable_by(|a, b| b.cmp(a));
    let serials: Vec<u64> = entries
        .iter()
        .skip(usize::try_from(keep).unwrap_or(usize::MAX))
        .take(max_pick)
        .map(|&(_, s)| s)
        .collect();
    Ok((serials, more))
}
