//! Live fan-out: the index of open subscriptions, and per connection a
//! bounded queue of the live events that matched one of its subscriptions.
//!
//! Each filter of a subscription is indexed under one field, the most
//! selective it has: its `ids`, else its `authors`, else the values of one
//! of its tags (the one with fewest values), else its `kinds`; a filter
//! with none of these (since/until only) goes on the short list of
//! unindexed filters. For each stored or ephemeral event the hub looks up
//! the event's id, author, kind and single-letter tag values, checks the
//! candidates' full filters, and pushes one [`LiveDelivery`] (the event and
//! the matching subscriptions) to each connection that has a match. A
//! connection whose subscriptions match nothing is never woken.
//!
//! Bounds, and who loses: a connection's queue holds at most
//! `engine.live_buffer_events` deliveries and `engine.live_buffer_bytes`
//! of event JSON; a connection that lets it fill is marked lagged, gets
//! nothing more, and its session ends it as a slow consumer (counted on
//! `sluice_live_queue_full_total`). Nobody else waits for it.
//!
//! Ownership (the guard invariant): a connection's entry lives as long as
//! its [`LiveConn`], a subscription's index entries as long as its
//! [`LiveSub`]; both are removed by `Drop`, so a session that ends on any
//! path leaves nothing in the index (`sluice_live_subscriptions` returns to
//! 0).
//!
//! No gap, no repeat: a session registers a subscription before it submits
//! the subscription's query; the query's snapshot is taken later, so every
//! event committed after the snapshot is delivered live, and the session
//! drops live events the snapshot already held (by store serial).

use arc_swap::ArcSwap;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use self::packed::{Packed, Searches, View};
use metrics::{Counter, Gauge, Histogram};

use crate::handles::Handle;
use crate::mailbox::Mailbox;
use crate::metrics_names as m;
use crate::reads::{ReadSink, Reads, SinkHome, SinkShared};
use sluice_proto::{Event, Filter, Readers};
use sluice_throttle::room;

/// An event as live subscriptions receive it.
#[derive(Debug)]
pub struct LiveEvent {
    /// Store serial; `None` for ephemeral events, which are never stored.
    pub serial: Option<u64>,
    pub event: Arc<Event>,
    /// The event as the front end encodes it once for every subscriber
    /// (permessage-deflate's compressed JSON), made by the first
    /// connection that needs it.
    pub encoded: std::sync::OnceLock<Box<[u8]>>,
}

impl LiveEvent {
    pub fn new(serial: Option<u64>, event: Arc<Event>) -> LiveEvent {
        LiveEvent {
            serial,
            event,
            encoded: std::sync::OnceLock::new(),
        }
    }
}

/// A subscription's handle, unique within its connection.
pub type SubHandle = u64;

/// What a connection receives: one event and which of its subscriptions
/// matched it.
#[derive(Debug)]
pub struct LiveDelivery {
    pub event: Arc<LiveEvent>,
    pub subs: Vec<SubHandle>,
}

/// Why a connection's live queue gives nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveEnd {
    /// The connection fell behind: its queue filled, it got nothing since.
    Lagged,
    /// The relay is stopping ([`LiveHub::stop`]): the session winds down.
    Stopped,
}

/// The index of every open subscription. One per engine.
pub struct LiveHub {
    index: RwLock<Index>,
    next_conn: AtomicU64,
    queue_events: usize,
    queue_bytes: usize,
    /// Set once by [`LiveHub::stop`]: every connection's `recv` ends.
    stopping: AtomicBool,
    /// What each publish records, its handles looked up once.
    candidates_total: Handle<Counter>,
    queued_total: Handle<Counter>,
    match_seconds: Handle<Histogram>,
    /// Set at every subscription opened or closed.
    subscriptions: Handle<Gauge>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct SubKey {
    conn: u64,
    sub: SubHandle,
}

/// The one field a filter is indexed under.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Id([u8; 32]),
    Author([u8; 32]),
    Tag(u8, Box<str>),
    Kind(u16),
    Unindexed,
}

struct ConnEntry {
    shared: Arc<ConnShared>,
}

/// What the hub and a connection's session share: its queue (allocated
/// only while events wait in it), its state and its readers.
struct ConnShared {
    queue: Mailbox<LiveDelivery>,
    lagged: AtomicBool,
    /// Bytes of event JSON queued and not yet taken.
    queued_bytes: AtomicUsize,
    /// Who reads on this connection: events of private kinds reach it only
    /// when one of its authenticated pubkeys wrote them or is `p`-tagged.
    readers: ArcSwap<Readers>,
    /// The connection's query answers ([`LiveConn::read_sink`]): in this
    /// allocation, one per connection.
    answers: SinkShared,
}

impl SinkHome for ConnShared {
    fn sink(&self) -> &SinkShared {
        &self.answers
    }
}

/// A subscription's filters (packed: most connections are idle and hold
/// one each). The buckets it is in are recomputed from them when it is
/// removed (`index_keys` is deterministic), so they are not stored twice.
struct SubEntry {
    filters: Packed,
}

#[derive(Default)]
struct Index {
    conns: HashMap<u64, ConnEntry>,
    subs: HashMap<SubKey, SubEntry>,
    /// The NIP-50 searches of the subscriptions that have any, by filter
    /// position (a packed filter only says it has one).
    searches: HashMap<SubKey, Searches>,
    ids: HashMap<[u8; 32], HashSet<SubKey>>,
    authors: HashMap<[u8; 32], HashSet<SubKey>>,
    tags: HashMap<u8, HashMap<Box<str>, HashSet<SubKey>>>,
    kinds: HashMap<u16, HashSet<SubKey>>,
    unindexed: HashSet<SubKey>,
}

impl LiveHub {
    /// `queue_events` and `queue_bytes` bound each connection's queue.
    pub fn new(queue_events: usize, queue_bytes: usize) -> Arc<LiveHub> {
        Arc::new(LiveHub {
            index: RwLock::new(Index::default()),
            next_conn: AtomicU64::new(1),
            queue_events: queue_events.max(1),
            queue_bytes: queue_bytes.max(1),
            stopping: AtomicBool::new(false),
            candidates_total: Handle::counter(m::LIVE_CANDIDATES_TOTAL),
            queued_total: Handle::counter(m::LIVE_QUEUED_TOTAL),
            match_seconds: Handle::histogram(m::LIVE_MATCH_SECONDS),
            subscriptions: Handle::gauge(m::LIVE_SUBSCRIPTIONS),
        })
    }

    /// The relay is stopping: every connection's [`LiveConn::recv`], now
    /// and later, ends with [`LiveEnd::Stopped`]. One wake-up per
    /// connection, so a session needs no shutdown future of its own.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let shared: Vec<Arc<ConnShared>> = self
            .read()
            .conns
            .values()
            .map(|c| c.shared.clone())
            .collect();
        for s in shared {
            s.queue.wake();
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write()
    }

    /// A connection's entry and the receiving end of its queue.
    pub fn connect(self: &Arc<Self>) -> LiveConn {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(ConnShared {
            queue: Mailbox::new(self.queue_events),
            lagged: AtomicBool::new(false),
            queued_bytes: AtomicUsize::new(0),
            readers: ArcSwap::default(),
            answers: SinkShared::unopened(),
        });
        self.write().conns.insert(
            id,
            ConnEntry {
                shared: shared.clone(),
            },
        );
        LiveConn {
            hub: self.clone(),
            id,
            shared,
            next_sub: 1,
        }
    }

    /// Delivers events (in order) to the connections with a matching
    /// subscription. Never blocks: a full queue marks its connection lagged.
    pub fn publish(&self, events: &[Arc<LiveEvent>]) {
        if events.is_empty() {
            return;
        }
        let started = Instant::now();
        let index = self.read();
        if index.subs.is_empty() {
            return;
        }
        let mut matched: Vec<SubKey> = Vec::new();
        let (mut candidates, mut deliveries, mut full) = (0u64, 0u64, 0u64);
        for ev in events {
            candidates += index.matching(&ev.event, &mut matched) as u64;
            for group in matched.chunk_by(|a, b| a.conn == b.conn) {
                let Some(conn) = index.conns.get(&group[0].conn) else {
                    continue;
                };
                let shared = &conn.shared;
                if shared.lagged.load(Ordering::Relaxed) {
                    continue;
                }
                let visible = shared.readers.load().may_read(&ev.event);
                if !visible {
                    continue;
                }
                let len = ev.event.raw().len();
                let bytes = shared.queued_bytes.fetch_add(len, Ordering::AcqRel) + len;
                let delivery = LiveDelivery {
                    event: ev.clone(),
                    subs: group.iter().map(|k| k.sub).collect(),
                };
                let sent = bytes <= self.queue_bytes && shared.queue.try_send(delivery).is_ok();
                if sent {
                    deliveries += 1;
                } else {
                    // Full: it gets nothing more and its session ends it
                    // as a slow consumer.
                    shared.queued_bytes.fetch_sub(len, Ordering::AcqRel);
                    if !shared.lagged.swap(true, Ordering::AcqRel) {
                        full += 1;
                    }
                }
            }
        }
        drop(index);
        self.candidates_total.get().increment(candidates);
        self.queued_total.get().increment(deliveries);
        if full > 0 {
            metrics::counter!(m::LIVE_QUEUE_FULL_TOTAL).increment(full);
        }
        self.match_seconds
            .get()
            .record(started.elapsed().as_secs_f64());
    }

    /// Subscriptions in the index.
    pub fn subscriptions(&self) -> usize {
        self.read().subs.len()
    }

    fn insert(&self, key: SubKey, filters: &[Filter]) {
        let (filters, searches) = Packed::pack(filters);
        let mut keys = Vec::new();
        for f in filters.filters() {
            index_keys(&f, &mut keys);
        }
        let mut index = self.write();
        let ix = &mut *index;
        for k in &keys {
            ix.bucket(k).insert(key);
        }
        // Handles are never reused: nothing is replaced.
        ix.subs.insert(key, SubEntry { filters });
        if let Some(searches) = searches {
            ix.searches.insert(key, searches);
        }
        self.subscriptions.get().set(ix.subs.len() as f64);
    }

    fn remove(&self, key: SubKey) {
        let mut index = self.write();
        if let Some(old) = index.subs.remove(&key) {
            let mut keys = Vec::new();
            for f in old.filters.filters() {
                index_keys(&f, &mut keys);
            }
            index.unlink(key, &keys);
            room::give_back(&mut index.subs);
            if index.searches.remove(&key).is_some() {
                room::give_back(&mut index.searches);
            }
        }
        self.subscriptions.get().set(index.subs.len() as f64);
    }
}

/// The buckets a filter goes in: one per value of its most selective
/// field; none when it can match nothing.
fn index_keys(f: &View<'_>, out: &mut Vec<Key>) {
    if f.is_empty_match() {
        return;
    }
    if let Some(ids) = f.ids {
        out.extend(ids.iter().map(|id| Key::Id(*id)));
    } else if let Some(authors) = f.authors {
        out.extend(authors.iter().map(|a| Key::Author(*a)));
    } else if let Some(tag) = f.tags.clone().min_by_key(|t| t.len()) {
        out.extend(tag.values().map(|v| Key::Tag(tag.letter, v.into())));
    } else if let Some(kinds) = f.kinds {
        out.extend(kinds.iter().map(|k| Key::Kind(u16::from_le_bytes(*k))));
    } else {
        out.push(Key::Unindexed);
    }
}

impl Index {
    fn bucket(&mut self, k: &Key) -> &mut HashSet<SubKey> {
        match k {
            Key::Id(id) => self.ids.entry(*id).or_default(),
            Key::Author(a) => self.authors.entry(*a).or_default(),
            Key::Tag(l, v) => self
                .tags
                .entry(*l)
                .or_default()
                .entry(v.clone())
                .or_default(),
            Key::Kind(k) => self.kinds.entry(*k).or_default(),
            Key::Unindexed => &mut self.unindexed,
        }
    }

    /// Removes `key` from the buckets `keys` name, dropping empty buckets.
    fn unlink(&mut self, key: SubKey, keys: &[Key]) {
        for k in keys {
            match k {
                Key::Id(id) => remove_from(&mut self.ids, id, key),
                Key::Author(a) => remove_from(&mut self.authors, a, key),
                Key::Tag(l, v) => {
                    if let Some(values) = self.tags.get_mut(l) {
                        remove_from(values, v, key);
                        if values.is_empty() {
                            self.tags.remove(l);
                        }
                    }
                }
                Key::Kind(k) => remove_from(&mut self.kinds, k, key),
                Key::Unindexed => {
                    self.unindexed.remove(&key);
                    room::give_back(&mut self.unindexed);
                }
            }
        }
    }

    /// Fills `out` with the subscriptions matching `ev`, sorted by
    /// connection and deduplicated; returns how many candidates were checked.
    fn matching(&self, ev: &Event, out: &mut Vec<SubKey>) -> usize {
        out.clear();
        let mut candidates: Vec<SubKey> = Vec::new();
        let mut take = |set: Option<&HashSet<SubKey>>| {
            if let Some(set) = set {
                candidates.extend(set.iter().copied());
            }
        };
        take(self.ids.get(&ev.id));
        take(self.authors.get(&ev.pubkey));
        take(self.kinds.get(&ev.kind));
        if !self.tags.is_empty() {
            for (letter, value) in ev.indexed_tags() {
                take(self.tags.get(&letter).and_then(|values| values.get(value)));
            }
        }
        take(Some(&self.unindexed));
        candidates.sort_unstable();
        candidates.dedup();
        let checked = candidates.len();
        out.extend(
            candidates
                .into_iter()
                .filter(|k| self.subs.get(k).is_some_and(|s| self.sub_matches(k, s, ev))),
        );
        checked
    }

    /// Whether one of a subscription's filters matches `ev`
    /// ([`Filter::matches`], a search checked with the one kept for it).
    fn sub_matches(&self, key: &SubKey, sub: &SubEntry, ev: &Event) -> bool {
        sub.filters.filters().enumerate().any(|(i, f)| {
            f.matches(ev)
                && (!f.search || {
                    let search = self.searches.get(key).and_then(|s| s.get(i)?.as_deref());
                    search.is_none_or(|s| s.matches(ev))
                })
        })
    }
}

fn remove_from<
    K: std::hash::Hash + Eq + ?Sized,
    Q: std::hash::Hash + Eq + std::borrow::Borrow<K>,
>(
    map: &mut HashMap<Q, HashSet<SubKey>>,
    k: &K,
    key: SubKey,
) {
    if let Some(set) = map.get_mut(k) {
        set.remove(&key);
        room::give_back(set);
        if set.is_empty() {
            map.remove(k);
            room::give_back(map);
        }
    }
}

/// One connection's place in the hub: the receiving end of its queue.
/// Dropping it removes the connection (its subscriptions go with their
/// [`LiveSub`]s).
pub struct LiveConn {
    hub: Arc<LiveHub>,
    /// Its id in the index.
    id: u64,
    shared: Arc<ConnShared>,
    next_sub: SubHandle,
}

impl LiveConn {
    /// Registers a subscription; it receives live matches until the
    /// returned guard is dropped. The index keeps its own (packed) copy of
    /// the filters.
    pub fn subscribe(&mut self, filters: impl AsRef<[Filter]>) -> LiveSub {
        let sub = self.next_sub;
        self.next_sub += 1;
        let key = SubKey { conn: self.id, sub };
        self.hub.insert(key, filters.as_ref());
        LiveSub {
            hub: self.hub.clone(),
            key,
        }
    }

    /// The next delivery. `Err(LiveEnd::Lagged)` once the queue has filled:
    /// the connection must end; `Err(LiveEnd::Stopped)` once the relay
    /// stops. Cancel-safe; the future is one pointer.
    pub fn recv(
        &mut self,
    ) -> impl std::future::Future<Output = Result<LiveDelivery, LiveEnd>> + '_ {
        std::future::poll_fn(move |cx| self.poll_recv(cx))
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<LiveDelivery, LiveEnd>> {
        if self.shared.lagged.load(Ordering::Acquire) {
            return Poll::Ready(Err(LiveEnd::Lagged));
        }
        if self.stopping() {
            return Poll::Ready(Err(LiveEnd::Stopped));
        }
        match self.shared.queue.poll_recv(cx) {
            Poll::Ready(d) => {
                self.shared
                    .queued_bytes
                    .fetch_sub(d.event.event.raw().len(), Ordering::AcqRel);
                if self.shared.lagged.load(Ordering::Acquire) {
                    return Poll::Ready(Err(LiveEnd::Lagged));
                }
                Poll::Ready(Ok(d))
            }
            // Looked at after the waker is registered: a stop between the
            // first look and here wakes this poll's waker.
            Poll::Pending if self.stopping() => Poll::Ready(Err(LiveEnd::Stopped)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// This connection's sink of query answers for a session whose open
    /// queries never exceed `max_open` ([`Reads::sink`]), kept in the
    /// allocation of its live queue. A session opens it once.
    pub fn read_sink(&self, reads: &Reads, max_open: usize) -> ReadSink {
        reads.open_sink(self.shared.clone(), max_open)
    }

    /// Whether the relay is stopping ([`LiveHub::stop`]).
    pub fn stopping(&self) -> bool {
        self.hub.stopping.load(Ordering::SeqCst)
    }

    /// A delivery already queued, if any (it does not report lagging).
    pub fn try_recv(&mut self) -> Option<LiveDelivery> {
        let d = self.shared.queue.try_recv()?;
        self.shared
            .queued_bytes
            .fetch_sub(d.event.event.raw().len(), Ordering::AcqRel);
        Some(d)
    }

    /// Who reads on this connection (NIP-42): from now on, events of private
    /// kinds are delivered only to these readers' parties.
    pub fn set_readers(&self, readers: Arc<Readers>) {
        self.shared.readers.store(readers);
    }

    /// Whether the queue filled (the connection must end).
    pub fn lagged(&self) -> bool {
        self.shared.lagged.load(Ordering::Acquire)
    }
}

impl Drop for LiveConn {
    fn drop(&mut self) {
        let mut index = self.hub.write();
        index.conns.remove(&self.id);
        room::give_back(&mut index.conns);
        drop(index);
        self.shared.queue.close();
    }
}

/// A subscription's entries in the index; dropping it removes them.
pub struct LiveSub {
    hub: Arc<LiveHub>,
    key: SubKey,
}

impl LiveSub {
    /// Its handle, as deliveries name it.
    pub fn handle(&self) -> SubHandle {
        self.key.sub
    }
}

impl Drop for LiveSub {
    fn drop(&mut self) {
        self.hub.remove(self.key);
    }
}

mod packed;
#[cfg(test)]
mod tests;
