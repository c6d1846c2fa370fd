use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use crate::metrics_names as m;
use sluice_proto::Event;
use sluice_store::{Store, StoreError, StoreOptions, WriteOutcome};
use tokio::sync::oneshot;

use super::cap::BatchCap;
use super::commit::*;
use super::handle::*;
use super::msg::*;
use super::signals::*;
use super::thread::{Turns, Writer, WriterMetrics};
use crate::clock::unix_now;
use crate::config::EngineConfig;
use crate::health::DiskGate;
use crate::live::LiveHub;
use crate::mirror_tap::{MirrorTaps, Origin};
use crate::retention::{Retainer, SharedPlan};

#[test]
fn bulk_cost_baseline_follows_drops_and_rises_slowly() {
    let mut c = CommitCost::default();
    assert!(c.record(Duration::from_millis(10), 1000));
    assert!(c.record(Duration::from_millis(40), 1000));
    assert!((c.baseline - 0.0103).abs() < 1e-9, "{c:?}");
    assert!(c.recent > 0.018 && c.recent < 0.02, "{c:?}");
    // Per stored event: twice the time for twice the events is the same cost.
    let mut d = CommitCost::default();
    d.record(Duration::from_millis(20), 2000);
    assert!((d.recent - 0.01).abs() < 1e-12, "{d:?}");
    c.record(Duration::from_millis(2), 1000);
    // Too few stored to say anything: ignored.
    assert!(!c.record(Duration::from_nanos(1), 10));
    assert!((c.baseline - 0.002).abs() < 1e-12, "{c:?}");
}

#[test]
fn backlog_fill_is_held_over_bound() {
    let b = Backlog::default();
    b.add();
    assert_eq!(b.fill(), 0.0, "no bound set: no bulk client");
    b.set_bound(4);
    b.add();
    assert_eq!(b.fill(), 0.5);
    b.remove();
    b.remove();
    b.remove();
    assert_eq!(b.held(), 0);
}

use std::sync::mpsc::sync_channel;

use sluice_proto::Filter;
use sluice_store::{DiskSpace, VANISH};

use crate::limiter::test_metrics::{Recorded, record};
use crate::replica::Tap;
use crate::retention::{RetentionConfig, RetentionRuleConfig};
use crate::search::SearchSlot;
use crate::trust::Trust;

/// A store of its own in a temporary directory.
fn open_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 64 << 20,
        max_readers: 126,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let store = Store::open(dir.path(), &opts).unwrap();
    (dir, store)
}

/// Writes `events` straight into the store as of `now` (what a store
/// holds before the writer starts, or events written when they had
/// not expired yet).
#[expect(
    clippy::disallowed_methods,
    reason = "the test sets up what the store holds"
)]
fn seed(store: &Store, events: &[Event], now: u64) {
    let outcomes = store.write_batch(events, now).unwrap();
    assert!(
        (outcomes.iter()).all(|o| matches!(o, WriteOutcome::Stored { .. })),
        "{outcomes:?}"
    );
}

/// The writer's company, built as `spawn` builds it.
struct Parts {
    live: Arc<LiveHub>,
    tap: Arc<Tap>,
    mirrors: Arc<MirrorTaps>,
    trust: Arc<Trust>,
    search: Arc<SearchSlot>,
    plan: Arc<SharedPlan>,
    disk: Arc<DiskGate>,
}

impl Parts {
    fn new() -> Parts {
        Parts {
            live: LiveHub::new(1024, 4 << 20),
            tap: Arc::default(),
            mirrors: Arc::default(),
            trust: Arc::default(),
            search: Arc::default(),
            plan: Arc::default(),
            disk: Arc::default(),
        }
    }
}

/// A writer the test drives by hand on its own thread: it queues
/// messages on `tx`, then has the writer handle them one at a time.
struct Rig {
    _dir: tempfile::TempDir,
    store: Store,
    w: Writer,
    tx: SyncSender<Msg>,
    parts: Parts,
}

fn rig(cfg: EngineConfig) -> Rig {
    let (dir, store) = open_store();
    let parts = Parts::new();
    let (tx, rx) = sync_channel(cfg.writer_queue_events);
    let cap = BatchCap::new(std::time::Duration::from_millis(cfg.commit_target_ms));
    let w = Writer {
        signals: Arc::default(),
        store: store.clone(),
        cfg,
        live: parts.live.clone(),
        tap: parts.tap.clone(),
        mirrors: parts.mirrors.clone(),
        trust: parts.trust.clone(),
        search: parts.search.clone(),
        rx,
        queued: Arc::default(),
        bulk_cost: CommitCost::default(),
        retainer: Retainer::new(parts.plan.clone()),
        disk: parts.disk.clone(),
        outsiders: Vec::new(),
        outsiders_since: None,
        carry: Vec::new(),
        cap,
        metrics: Default::default(),
    };
    Rig {
        _dir: dir,
        store,
        w,
        tx,
        parts,
    }
}

type Reply = oneshot::Receiver<WriteResult>;

/// A client's event (`lone`, `outsider` as `submit` takes them).
const PIPELINED: (bool, bool) = (false, false);
const LONE: (bool, bool) = (true, false);
const OUTSIDER: (bool, bool) = (false, true);

fn request(ev: &Event, origin: Origin, (lone, outsider): (bool, bool)) -> (Request, Reply) {
    let (reply, rx) = oneshot::channel();
    let r = Request {
        event: Arc::new(ev.clone()),
        enqueued: Instant::now(),
        reply,
        origin,
        lone,
        outsider,
    };
    (r, rx)
}

impl Rig {
    /// Queues `ev` as `submit` does.
    fn queue(&self, ev: &Event, origin: Origin, flags: (bool, bool)) -> Reply {
        let (r, rx) = request(ev, origin, flags);
        self.w.queued.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send(Msg::Write(r)).ok().unwrap();
        rx
    }

    fn queue_all(&self, events: &[Event], flags: (bool, bool)) -> Vec<Reply> {
        (events.iter())
            .map(|ev| self.queue(ev, Origin::Client, flags))
            .collect()
    }

    /// Has the writer handle the next queued message; returns the one
    /// it met while filling a batch, if any.
    fn handle_next(&mut self) -> Option<Msg> {
        let msg = self.w.rx.try_recv().ok().unwrap();
        let mut held = None;
        assert!(self.w.handle(msg, &mut held));
        held
    }

    /// Commits so far.
    fn batches(&self) -> u64 {
        self.w.signals.batches.load(Ordering::Relaxed)
    }

    fn stored(&self, ev: &Event) -> bool {
        self.store.get(&ev.id, unix_now()).unwrap().is_some()
    }

    /// Every event the store holds (expired ones too), by serial.
    fn held(&self) -> Vec<Event> {
        held(&self.store)
    }
}

fn held(store: &Store) -> Vec<Event> {
    (store.events_after(0, 100_000).unwrap().iter())
        .map(|(_, raw)| Event::parse(raw).unwrap())
        .collect()
}

/// The writer's answer, if it answered; panics if it dropped the
/// request unanswered.
fn answer(rx: &mut Reply) -> Option<WriteResult> {
    match rx.try_recv() {
        Ok(r) => Some(r),
        Err(oneshot::error::TryRecvError::Empty) => None,
        Err(oneshot::error::TryRecvError::Closed) => panic!("the request was dropped"),
    }
}

/// The serial an answered request was stored under.
fn serial(rx: &mut Reply) -> u64 {
    match answer(rx) {
        Some(Ok(WriteOutcome::Stored { serial, .. })) => serial,
        other => panic!("not stored: {other:?}"),
    }
}

fn answered(replies: &mut [Reply]) -> Vec<bool> {
    replies.iter_mut().map(|rx| answer(rx).is_some()).collect()
}

/// A note of test key `key` written `ago` seconds ago; notes of the
/// same age class (a 10-digit time) all have the same length.
fn note(key: u8, ago: u64) -> Event {
    Event::sign(&[key; 32], unix_now() - ago, 1, vec![], "a note")
}

fn notes(keys: std::ops::RangeInclusive<u8>) -> Vec<Event> {
    keys.map(|k| note(k, 60)).collect()
}

/// `n` events of key `key` and `kind`, one second apart, the newest
/// `ago` seconds old; `tags` on each.
fn history(key: u8, kind: u16, n: u64, ago: u64, tags: &[&[&str]]) -> Vec<Event> {
    let tags: Vec<Vec<String>> = (tags.iter())
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect();
    let newest = unix_now() - ago;
    (0..n)
        .map(|i| {
            let at = newest - (n - 1 - i);
            Event::sign(&[key; 32], at, kind, tags.clone(), &format!("{i}"))
        })
        .collect()
}

fn pubkey(key: u8) -> [u8; 32] {
    Event::sign(&[key; 32], 0, 1, vec![], "").pubkey
}

/// Runs `f` on a thread of its own, with its own metrics recorder,
/// and waits for it, boundedly: a loop that never ends fails the test
/// instead of hanging it.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (T, Recorded) {
    let (tx, rx) = sync_channel(1);
    std::thread::spawn(move || {
        let _ = tx.send(record(f));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out,
        Err(RecvTimeoutError::Timeout) => panic!("did not finish within 60 s"),
        Err(RecvTimeoutError::Disconnected) => panic!("panicked"),
    }
}

use crate::tests::wait_until;

#[test]
fn a_batch_takes_what_is_queued_up_to_max_batch_events() {
    let mut r = rig(EngineConfig {
        max_batch_events: 3,
        ..EngineConfig::default()
    });
    let events = notes(1..=5);
    let mut replies = r.queue_all(&events, PIPELINED);
    assert!(r.handle_next().is_none());
    assert_eq!(r.batches(), 1);
    assert_eq!(answered(&mut replies), [true, true, true, false, false]);
    assert!(r.handle_next().is_none());
    assert_eq!(r.batches(), 2);
    assert_eq!(answered(&mut replies[3..]), [true, true]);
    assert!(events.iter().all(|ev| r.stored(ev)));
    assert_eq!(r.w.queued.load(Ordering::Relaxed), 0);
}

#[test]
fn a_batch_takes_what_is_queued_up_to_max_batch_bytes() {
    let events = notes(1..=9);
    let len = events[0].raw().len();
    assert!(events.iter().all(|ev| ev.raw().len() == len));
    // Exactly two events' bytes: the second fills the batch.
    let mut r = rig(EngineConfig {
        max_batch_bytes: 2 * len,
        ..EngineConfig::default()
    });
    let mut replies = r.queue_all(&events[..4], PIPELINED);
    r.handle_next();
    assert_eq!(answered(&mut replies), [true, true, false, false]);
    r.handle_next();
    assert_eq!(answered(&mut replies[2..]), [true, true]);
    // A byte more than three: the fourth is taken, not the fifth.
    r.w.cfg.max_batch_bytes = 3 * len + 1;
    let mut replies = r.queue_all(&events[4..], PIPELINED);
    r.handle_next();
    assert_eq!(answered(&mut replies), [true, true, true, true, false]);
    assert_eq!(r.batches(), 3);
}

#[test]
fn a_message_met_while_filling_a_batch_is_handed_back_to_be_handled_next() {
    let mut r = rig(EngineConfig::default());
    let events = notes(1..=3);
    let mut first = r.queue_all(&events[..2], PIPELINED);
    let (reply, mut policy) = oneshot::channel();
    r.tx.try_send(Msg::Admin(AdminOp::ReadPolicy, reply))
        .ok()
        .unwrap();
    let mut last = r.queue_all(&events[2..], PIPELINED);
    let held = r.handle_next();
    assert_eq!(answered(&mut first), [true, true]);
    assert!(policy.try_recv().is_err(), "not handled yet");
    let Some(msg @ Msg::Admin(..)) = held else {
        panic!("the policy read was not handed back");
    };
    let mut none = None;
    assert!(r.w.handle(msg, &mut none));
    assert_eq!(
        policy.try_recv().unwrap().unwrap(),
        AdminDone::Policy(vec![])
    );
    assert!(answer(&mut last[0]).is_none());
    r.handle_next();
    assert_eq!(answered(&mut last), [true]);
    assert_eq!(r.batches(), 2);
}

#[test]
fn lone_events_commit_ahead_of_a_large_batch_of_pipelined_ones() {
    let mut r = rig(EngineConfig::default());
    let events = notes(1..=30);
    // Eight in all: one commit, the lone event among them.
    let mut replies = r.queue_all(&events[..7], PIPELINED);
    replies.extend(r.queue_all(&events[7..8], LONE));
    r.handle_next();
    assert_eq!(r.batches(), 1);
    assert!(answered(&mut replies).iter().all(|a| *a));
    // Nine: the lone one (queued last) first, in a commit of its own.
    let mut pipelined = r.queue_all(&events[8..16], PIPELINED);
    let mut lone = r.queue_all(&events[16..17], LONE);
    r.handle_next();
    assert_eq!(r.batches(), 3);
    let first = serial(&mut lone[0]);
    for rx in &mut pipelined {
        assert!(serial(rx) > first);
    }
    // Nine lone ones: one commit.
    let mut all_lone = r.queue_all(&events[17..26], LONE);
    r.handle_next();
    assert_eq!(r.batches(), 4);
    assert!(answered(&mut all_lone).iter().all(|a| *a));
    assert!(events[..26].iter().all(|ev| r.stored(ev)));
}

/// A rig whose writer has learnt that an event costs 1 ms to commit, so
/// a commit takes 20 of them (`engine.commit_target_ms` = 20).
fn capped_rig() -> Rig {
    let mut r = rig(EngineConfig {
        commit_target_ms: 20,
        ..EngineConfig::default()
    });
    cap_at_20(&mut r.w);
    r
}

/// Sets what the writer has learnt back to 1 ms per event (each commit
/// teaches it the test machine's cost).
fn cap_at_20(w: &mut Writer) {
    w.cap = BatchCap::new(Duration::from_millis(20));
    w.cap.record(false, 40, Duration::from_millis(40));
    assert_eq!(w.cap(), 20);
}

#[test]
fn a_commit_takes_the_caps_worth_and_a_lone_event_goes_ahead_of_the_rest() {
    let mut r = capped_rig();
    let events = notes(1..=31);
    let mut pipelined = r.queue_all(&events[..30], PIPELINED);
    let mut turns = Turns::new(&r.w.cfg);
    assert!(r.w.turn(&mut turns));
    assert_eq!(r.batches(), 1);
    let done = answered(&mut pipelined);
    assert_eq!(done.iter().filter(|a| **a).count(), 20);
    assert!(done[..20].iter().all(|a| *a), "the oldest first");
    assert_eq!(r.w.carry.len(), 10);
    assert_eq!(
        r.w.queued.load(Ordering::Relaxed),
        10,
        "carried is still queued"
    );
    // A person's event queued meanwhile commits before the carried ones.
    let mut lone = r.queue_all(&events[30..], LONE);
    assert!(r.w.turn(&mut turns));
    assert_eq!(r.batches(), 3);
    let first = serial(&mut lone[0]);
    for rx in &mut pipelined[20..] {
        assert!(serial(rx) > first);
    }
    assert!(r.w.carry.is_empty());
    assert_eq!(r.w.queued.load(Ordering::Relaxed), 0);
    assert!(events.iter().all(|ev| r.stored(ev)));
}

#[test]
fn carried_events_commit_before_a_message_queued_after_them() {
    let mut r = capped_rig();
    let events = notes(1..=25);
    let mut replies = r.queue_all(&events, PIPELINED);
    let (reply, mut policy) = oneshot::channel();
    r.tx.try_send(Msg::Admin(AdminOp::ReadPolicy, reply))
        .ok()
        .unwrap();
    let mut turns = Turns::new(&r.w.cfg);
    assert!(r.w.turn(&mut turns));
    assert_eq!(r.w.carry.len(), 5);
    assert!(
        turns.held.is_some(),
        "the policy read was met while filling"
    );
    assert!(r.w.turn(&mut turns));
    assert_eq!(r.batches(), 2);
    assert!(answered(&mut replies).iter().all(|a| *a));
    assert!(policy.try_recv().is_err(), "not before the carried events");
    assert!(r.w.turn(&mut turns));
    assert_eq!(
        policy.try_recv().unwrap().unwrap(),
        AdminDone::Policy(vec![])
    );
}

#[test]
fn waiting_outsiders_ride_in_the_room_under_the_cap_and_flush_in_caps() {
    let mut r = capped_rig();
    let events = notes(1..=60);
    let mut outsiders = r.queue_all(&events[..30], OUTSIDER);
    let mut turns = Turns::new(&r.w.cfg);
    assert!(r.w.turn(&mut turns));
    assert_eq!(r.w.outsiders.len(), 30);
    // Twelve of anyone else's: eight outsiders ride in the room left.
    let mut others = r.queue_all(&events[30..42], PIPELINED);
    assert!(r.w.turn(&mut turns));
    assert_eq!(r.batches(), 1);
    assert!(answered(&mut others).iter().all(|a| *a));
    assert_eq!(
        answered(&mut outsiders),
        [[true; 8].as_slice(), &[false; 22]].concat()
    );
    assert_eq!(r.w.outsiders.len(), 22);
    // Due: flushed a cap's worth at a time, the rest still due.
    r.w.outsiders_since = Some(Instant::now() - 2 * OUTSIDERS_WAIT);
    cap_at_20(&mut r.w);
    r.w.flush_outsiders();
    assert_eq!(r.batches(), 2);
    assert_eq!(r.w.outsiders.len(), 2);
    assert!(r.w.outsiders_due() <= Instant::now());
    r.w.flush_outsiders();
    assert!(r.w.outsiders.is_empty() && r.w.outsiders_since.is_none());
    assert!(answered(&mut outsiders[8..]).iter().all(|a| *a));
    assert!(events[..42].iter().all(|ev| r.stored(ev)));
}

#[test]
fn outsiders_wait_for_a_commit_unless_a_batch_of_them_or_the_oldest_is_due() {
    let mut r = rig(EngineConfig {
        max_batch_events: 3,
        ..EngineConfig::default()
    });
    let events = notes(1..=8);
    // One outsider: it waits.
    let started = Instant::now();
    let mut waiting = r.queue_all(&events[..1], OUTSIDER);
    r.handle_next();
    if started.elapsed() < OUTSIDERS_WAIT {
        assert_eq!(r.batches(), 0);
        assert_eq!(answered(&mut waiting), [false]);
    }
    // A batch's worth waiting: committed at once.
    waiting.extend(r.queue_all(&events[1..3], OUTSIDER));
    r.handle_next();
    if started.elapsed() < OUTSIDERS_WAIT {
        assert_eq!(r.batches(), 1);
        assert_eq!(answered(&mut waiting), [true; 3]);
    }
    r.w.flush_outsiders();
    let before = r.batches();
    // Two, the oldest waiting for longer than OUTSIDERS_WAIT: committed.
    let mut due = r.queue_all(&events[3..4], OUTSIDER);
    r.handle_next();
    r.w.outsiders_since = Some(Instant::now() - 2 * OUTSIDERS_WAIT);
    due.extend(r.queue_all(&events[4..5], OUTSIDER));
    r.handle_next();
    assert_eq!(r.batches(), before + 1);
    assert_eq!(answered(&mut due), [true, true]);
    assert!(r.w.outsiders.is_empty() && r.w.outsiders_since.is_none());
    // An outsider rides on someone else's commit.
    let mut rides = r.queue_all(&events[5..6], OUTSIDER);
    rides.extend(r.queue_all(&events[6..7], LONE));
    r.handle_next();
    assert_eq!(r.batches(), before + 2);
    assert_eq!(answered(&mut rides), [true, true]);
    assert!(events[..7].iter().all(|ev| r.stored(ev)));
}

#[test]
fn stored_events_go_live_and_to_the_tap_but_not_back_to_other_nodes() {
    let mut r = rig(EngineConfig::default());
    let mut live = r.parts.live.connect();
    let _sub = live.subscribe(vec![Filter::from_value(&serde_json::json!({})).unwrap()]);
    let (tap, mut offered) = tokio::sync::mpsc::channel(16);
    r.parts.tap.attach(tap);
    let (mine, replica) = (note(1, 60), note(2, 60));
    let mut replies = [
        r.queue(&mine, Origin::Client, PIPELINED),
        r.queue(&replica, Origin::Replica, PIPELINED),
        r.queue(&mine, Origin::Client, PIPELINED),
    ];
    r.handle_next();
    let outcomes: Vec<_> = replies.iter_mut().map(|rx| answer(rx).unwrap()).collect();
    assert!(matches!(outcomes[0], Ok(WriteOutcome::Stored { .. })));
    assert!(matches!(outcomes[1], Ok(WriteOutcome::Stored { .. })));
    assert_eq!(outcomes[2], Ok(WriteOutcome::Duplicate));
    // Both stored events reach the live subscription, in order.
    let got: Vec<_> = std::iter::from_fn(|| live.try_recv())
        .map(|d| d.event.event.id)
        .collect();
    assert_eq!(got, [mine.id, replica.id]);
    // Only this node's stored event goes to the other nodes.
    let tapped: Vec<_> = std::iter::from_fn(|| offered.try_recv().ok())
        .map(|ev| ev.id)
        .collect();
    assert_eq!(tapped, [mine.id]);
}

#[test]
fn a_request_to_vanish_removes_its_authors_earlier_events_in_chunks() {
    let mut r = rig(EngineConfig::default());
    let (a, b) = (history(1, 1, 1500, 100, &[]), history(2, 1, 1, 100, &[]));
    seed(&r.store, &a, unix_now());
    seed(&r.store, &b, unix_now());
    let bye = history(1, VANISH, 1, 10, &[&["relay", "ALL_RELAYS"]]);
    let (req, mut rx) = request(&bye[0], Origin::Client, LONE);
    let (w, got) = bounded(move || {
        let mut w = r.w;
        w.write(vec![req], false);
        w
    });
    r.w = w;
    assert!(matches!(
        answer(&mut rx),
        Some(Ok(WriteOutcome::Stored { .. }))
    ));
    let ids: Vec<_> = r.held().iter().map(|e| e.id).collect();
    assert_eq!(ids, [b[0].id, bye[0].id]);
    assert_eq!(got.counter(m::EVENTS_VANISHED_TOTAL, &[]), 1500);
    // An event that is not a request to vanish removes nothing.
    let later = note(3, 5);
    let (req, _rx) = request(&later, Origin::Client, LONE);
    r.w.write(vec![req], false);
    assert_eq!(r.held().len(), 3);
}

#[test]
fn admin_purges_an_author_in_chunks_and_one_event() {
    let mut r = rig(EngineConfig::default());
    let (a, b) = (history(1, 1, 1500, 100, &[]), history(2, 1, 2, 100, &[]));
    seed(&r.store, &a, unix_now());
    seed(&r.store, &b, unix_now());
    let (w, purged) = {
        let ((w, purged), _) = bounded(move || {
            let w = r.w;
            let purged = w.admin(AdminOp::PurgeAuthor(pubkey(1)));
            (w, purged)
        });
        (w, purged)
    };
    r.w = w;
    assert_eq!(purged.unwrap(), AdminDone::Purged(1500));
    assert_eq!(r.held().len(), 2);
    let one = |w: &Writer| w.admin(AdminOp::PurgeEvent(b[0].id)).unwrap();
    assert_eq!(one(&r.w), AdminDone::Purged(1));
    assert_eq!(one(&r.w), AdminDone::Purged(0));
    assert_eq!(r.held().iter().map(|e| e.id).collect::<Vec<_>>(), [b[1].id]);
    let set = AdminOp::SetPolicy("ban_pubkey:00".into(), Some("spam".into()));
    assert_eq!(r.w.admin(set).unwrap(), AdminDone::Set);
    let entries = vec![("ban_pubkey:00".to_string(), "spam".to_string())];
    assert_eq!(
        r.w.admin(AdminOp::ReadPolicy).unwrap(),
        AdminDone::Policy(entries)
    );
}

#[test]
fn a_purge_by_filter_removes_the_newest_matches_in_chunks_up_to_its_limit() {
    let mut r = rig(EngineConfig::default());
    let notes = history(1, 1, 1500, 100, &[]);
    let reactions = history(1, 7, 5, 100, &[]);
    let other = history(2, 1, 1, 100, &[]);
    for events in [&notes, &reactions, &other] {
        seed(&r.store, events, unix_now());
    }
    let filter = |limit: Option<u64>| {
        let mut f =
            serde_json::json!({"authors": [sluice_proto::hex32::encode(&pubkey(1))], "kinds": [1]});
        if let Some(l) = limit {
            f["limit"] = l.into();
        }
        Box::new(Filter::from_value(&f).unwrap())
    };
    let purge = |w: Writer, limit, dry_run| {
        bounded(move || {
            let op = AdminOp::PurgeMatching {
                filter: filter(limit),
                dry_run,
            };
            let done = w.admin(op).unwrap();
            (w, done)
        })
        .0
    };
    // A dry run counts every match (its limit ignored) and removes none.
    let (w, done) = purge(r.w, Some(10), true);
    assert_eq!(done, AdminDone::Purged(1500));
    assert_eq!(held(&r.store).len(), 1506);
    // At most the limit, newest first: the oldest 300 notes are left.
    let (w, done) = purge(w, Some(1200), false);
    assert_eq!(done, AdminDone::Purged(1200));
    let left: Vec<_> = held(&r.store).iter().map(|e| e.id).collect();
    let want: Vec<_> = (notes[..300].iter().chain(&reactions).chain(&other))
        .map(|e| e.id)
        .collect();
    assert_eq!(left, want);
    // No limit: every match.
    let (w, done) = purge(w, None, false);
    assert_eq!(done, AdminDone::Purged(300));
    assert_eq!(held(&r.store).len(), 6);
    let (w, done) = purge(w, None, false);
    assert_eq!(done, AdminDone::Purged(0));
    r.w = w;
}

/// An event that expired `ago` seconds ago, written while it had not.
fn expired(key: u8, ago: u64) -> Event {
    let at = unix_now() - ago;
    Event::sign(
        &[key; 32],
        at - 100,
        1,
        vec![vec!["expiration".into(), at.to_string()]],
        "gone soon",
    )
}

#[test]
fn expired_events_are_purged_in_chunks_until_none_is_left() {
    let r = rig(EngineConfig::default());
    let now = unix_now();
    let old: Vec<Event> = (0..1500u64)
        .map(|i| {
            let expiration = (now - 10 - i).to_string();
            Event::sign(
                &[1; 32],
                now - 200 - i,
                1,
                vec![vec!["expiration".into(), expiration]],
                "x",
            )
        })
        .collect();
    seed(&r.store, &old, now - 2000);
    let fresh = note(2, 60);
    seed(&r.store, std::slice::from_ref(&fresh), unix_now());
    assert_eq!(r.held().len(), 1501);
    let (w, got) = bounded(move || {
        r.w.purge_expired();
        r.w
    });
    assert_eq!(
        held(&w.store).iter().map(|e| e.id).collect::<Vec<_>>(),
        [fresh.id]
    );
    assert_eq!(got.counter(m::EVENTS_PURGED_TOTAL, &[]), 1500);
}

#[test]
fn disk_errors_are_taken_for_a_full_disk_only_when_it_is_nearly_full() {
    let r = rig(EngineConfig::default());
    let free = || r.store.disk_space().unwrap().free_bytes;
    let short = || StoreError::Io(std::io::Error::other("short write"));
    let full = || StoreError::Io(std::io::ErrorKind::StorageFull.into());
    // An I/O error while the disk has less than four times the batch
    // free: a full disk, saying how much is free.
    let e = r.w.disk_full_or(short(), free() / 2);
    assert!(e.is_disk_full(), "{e}");
    let text = e.to_string();
    assert!(
        text.ends_with(" KB free on the store's disk (I/O error: short write)"),
        "{text}"
    );
    // Other errors, and a full disk already said, are left as they are.
    let e =
        r.w.disk_full_or(StoreError::MapFull { map_size_bytes: 1 }, free() / 2);
    assert!(matches!(e, StoreError::MapFull { .. }), "{e}");
    let e = r.w.disk_full_or(full(), free() / 2);
    assert_eq!(e.to_string(), full().to_string());
    // Plenty of room for the batch (and at least 8 MiB): an I/O error.
    if free() > 64 << 20 {
        let e = r.w.disk_full_or(short(), 1);
        assert!(e.is_io() && !e.is_disk_full(), "{e}");
        assert_eq!(e.to_string(), "I/O error: short write");
        // Exactly four times the batch free is room enough (free space
        // is whole blocks, a multiple of 4; retried while other writers
        // change it under the test).
        for _ in 0..100 {
            let before = free();
            let e = r.w.disk_full_or(short(), before / 4);
            if free() == before {
                assert!(!e.is_disk_full(), "{e}");
                break;
            }
        }
    }
}

/// Mounts a tmpfs of `mb` MiB at `dir` (root in a sandbox can), as
/// tests/support/mod.rs does: where mounting is not allowed it says so and
/// returns `None` (the test skips), unless `DISK_TESTS_REQUIRE` is set,
/// which fails the test. Unmounted when dropped.
fn tmpfs(dir: &std::path::Path, mb: u64) -> Option<Mount> {
    std::fs::create_dir_all(dir).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("DISK_TESTS_REQUIRE").is_none(),
            "cannot mount a tmpfs, and DISK_TESTS_REQUIRE is set"
        );
        eprintln!("SKIPPED: mounting a tmpfs is not allowed here");
    }
    ok.then(|| Mount(dir.to_path_buf()))
}

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The floor of the full-disk classification on a real file system: with
/// 4 MiB free, an I/O error on a tiny batch (four times it is 4 bytes) is
/// a full disk, since less than 8 MiB is free; with 12 MiB free it is not.
#[test]
fn an_io_error_with_less_than_8_mib_free_is_a_full_disk_however_small_the_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = tmp.path().join("fs");
    let Some(_mount) = tmpfs(&fs, 16) else {
        return;
    };
    let store_dir = fs.join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let opts = StoreOptions {
        map_size_bytes: 1 << 20,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let mut r = rig(EngineConfig::default());
    r.store = Store::open(&store_dir, &opts).unwrap();
    r.w.store = r.store.clone();
    let free = || r.store.disk_space().unwrap().free_bytes;
    let short = || StoreError::Io(std::io::Error::other("short write"));
    // Nothing else writes on this file system: what is free stays so.
    let ballast = fs.join("ballast");
    let len = free() - (4 << 20);
    std::fs::write(&ballast, vec![0u8; len as usize]).unwrap();
    assert_eq!(free(), 4 << 20);
    let e = r.w.disk_full_or(short(), 1);
    assert!(e.is_disk_full(), "{e}");
    let text = e.to_string();
    assert!(
        text.ends_with(" 4096 KB free on the store's disk (I/O error: short write)"),
        "{text}"
    );
    let file = std::fs::OpenOptions::new().write(true).open(&ballast);
    file.unwrap().set_len(len - (8 << 20)).unwrap();
    assert_eq!(free(), 12 << 20);
    let e = r.w.disk_full_or(short(), 1);
    assert!(e.is_io() && !e.is_disk_full(), "{e}");
}

#[test]
fn an_outcome_is_labelled_and_counted() {
    let stored = |replaced, deleted| WriteOutcome::Stored {
        serial: 1,
        replaced,
        deleted,
    };
    let labels = [
        (stored(true, 0), "replaced"),
        (stored(true, 2), "replaced"),
        (stored(false, 1), "deletion"),
        (stored(false, 0), "stored"),
        (WriteOutcome::Duplicate, "duplicate"),
        (WriteOutcome::Superseded, "superseded"),
        (WriteOutcome::Deleted, "deleted"),
        (WriteOutcome::Expired, "expired"),
        (WriteOutcome::Ephemeral, "ephemeral"),
        (WriteOutcome::OutsideRetention, "outside_retention"),
        (WriteOutcome::Vanished, "vanished"),
    ];
    for (o, label) in labels {
        assert_eq!(outcome_label(&o), label, "{o:?}");
    }
    let ((), got) = record(|| {
        let outcomes = WriterMetrics::default().outcomes;
        count_outcome(&outcomes, &stored(false, 0));
        count_outcome(&outcomes, &stored(false, 0));
        count_outcome(&outcomes, &WriteOutcome::Duplicate);
    });
    let written = |label| got.counter(m::EVENTS_WRITTEN_TOTAL, &[("outcome", label)]);
    assert_eq!((written("stored"), written("duplicate")), (2, 1));
    assert_eq!(got.counters(m::EVENTS_WRITTEN_TOTAL).len(), 2);
}

#[test]
fn a_failed_batch_is_counted_by_its_reason() {
    let ((), got) = record(|| {
        report_failure(&StoreError::MapFull { map_size_bytes: 1 }, 3);
        let full = StoreError::Io(std::io::ErrorKind::StorageFull.into());
        report_failure(&full, 2);
        report_failure(&full, 1);
        report_failure(&StoreError::Io(std::io::Error::other("eio")), 1);
    });
    let errors = |reason| got.counter(m::WRITER_ERRORS_TOTAL, &[("reason", reason)]);
    assert_eq!(
        (errors("map_full"), errors("disk_full"), errors("store")),
        (1, 2, 1)
    );
}

#[test]
fn a_store_too_small_for_a_batch_refuses_it_as_full() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 1 << 20,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let mut r = rig(EngineConfig::default());
    r.store = Store::open(dir.path(), &opts).unwrap();
    r.w.store = r.store.clone();
    let big: Vec<Event> = (0..8u8)
        .map(|k| {
            Event::sign(
                &[k + 1; 32],
                unix_now() - 60,
                1,
                vec![],
                &"x".repeat(200_000),
            )
        })
        .collect();
    let mut replies = r.queue_all(&big, PIPELINED);
    let ((), got) = record(|| {
        r.handle_next();
    });
    for rx in &mut replies {
        assert_eq!(answer(rx), Some(Err(WriteError::StoreFull)));
    }
    assert_eq!(
        got.counter(m::WRITER_ERRORS_TOTAL, &[("reason", "map_full")]),
        1
    );
    assert!(r.held().is_empty());
}

#[test]
fn the_cost_of_a_bulk_commit_counts_from_64_stored_events() {
    let mut c = CommitCost::default();
    assert!(!c.record(Duration::from_millis(1), 63));
    assert_eq!(c, CommitCost::default());
    assert!(c.record(Duration::from_millis(64), 64));
    assert!((c.recent - 1.0).abs() < 1e-12, "{c:?}");
}

/// A handle around a queue the test holds (no writer thread).
fn handle_of(capacity: usize) -> (WriterHandle, Receiver<Msg>) {
    let (tx, rx) = sync_channel(capacity);
    let h = WriterHandle {
        signals: Arc::default(),
        backlog: Backlog::default(),
        tx,
        queued: Arc::default(),
        alive: Arc::new(AtomicBool::new(true)),
        thread: Mutex::new(None),
    };
    (h, rx)
}

#[test]
fn a_full_queue_refuses_and_counts_and_the_queue_length_is_kept() {
    let (h, rx) = handle_of(2);
    let ev = Arc::new(note(1, 60));
    let submit = || h.submit(ev.clone(), Instant::now(), Origin::Client, PIPELINED);
    let (results, got) = record(|| [submit().is_ok(), submit().is_ok(), submit().is_ok()]);
    assert_eq!(results, [true, true, false]);
    assert_eq!(got.counter(m::WRITER_QUEUE_FULL_TOTAL, &[]), 1);
    assert_eq!(h.queue_len(), 2);
    assert_eq!(submit().err(), Some(SubmitError::QueueFull));
    // Stopped: refused as closed, not counted as full.
    drop(rx);
    let (e, got) = record(|| submit().err());
    assert_eq!(e, Some(SubmitError::Closed));
    assert_eq!(got.counter(m::WRITER_QUEUE_FULL_TOTAL, &[]), 0);
    assert_eq!(h.queue_len(), 2);
}

#[test]
fn a_wake_is_queued_for_the_writer() {
    let (h, rx) = handle_of(2);
    h.wake();
    assert!(matches!(rx.try_recv(), Ok(Msg::Wake)));
    assert!(rx.try_recv().is_err());
}

/// A writer thread as the engine starts it, over `store`.
fn start(store: &Store, cfg: EngineConfig) -> (WriterHandle, Parts) {
    let parts = Parts::new();
    let h = spawn(
        store.clone(),
        cfg,
        parts.live.clone(),
        (
            parts.tap.clone(),
            parts.mirrors.clone(),
            parts.trust.clone(),
            parts.search.clone(),
        ),
        parts.plan.clone(),
        parts.disk.clone(),
    )
    .unwrap();
    (h, parts)
}

/// Has the writer thread answer a message, so everything queued before
/// it was handled.
fn round_trip(h: &WriterHandle) {
    let (reply, answer) = oneshot::channel();
    h.tx.send(Msg::Admin(AdminOp::ReadPolicy, reply)).unwrap();
    answer.blocking_recv().unwrap().unwrap();
}

fn submit(h: &WriterHandle, ev: &Event, flags: (bool, bool)) -> WriteResult {
    let rx = h.submit(Arc::new(ev.clone()), Instant::now(), Origin::Client, flags);
    rx.unwrap().blocking_recv().unwrap()
}

#[test]
fn an_expired_event_stays_on_disk_until_the_expiry_purge_is_due() {
    let (_dir, store) = open_store();
    let gone = expired(1, 10);
    seed(&store, std::slice::from_ref(&gone), unix_now() - 60);
    let cfg = EngineConfig {
        expiry_purge_interval_ms: 3_600_000,
        ..EngineConfig::default()
    };
    let (h, _parts) = start(&store, cfg);
    // An outsider's event, committed once it has waited (an idle
    // writer's timeout), then a lone one.
    let stored = |r: WriteResult| matches!(r, Ok(WriteOutcome::Stored { .. }));
    assert!(stored(submit(&h, &note(2, 60), OUTSIDER)));
    round_trip(&h);
    assert!(stored(submit(&h, &note(3, 60), LONE)));
    round_trip(&h);
    // Still on disk (never served: it has expired), until the purge.
    assert!(held(&store).iter().any(|e| e.id == gone.id), "purged early");
    assert_eq!(store.get(&gone.id, unix_now()).unwrap(), None);
    h.shutdown();
}

#[test]
fn a_new_retention_plan_wakes_an_idle_writer_which_applies_it() {
    let (_dir, store) = open_store();
    let old = history(1, 1, 3, 10 * 86_400, &[]);
    let recent = note(2, 60);
    seed(&store, &old, unix_now());
    seed(&store, std::slice::from_ref(&recent), unix_now());
    let cfg = EngineConfig {
        expiry_purge_interval_ms: 3_600_000,
        ..EngineConfig::default()
    };
    let (h, parts) = start(&store, cfg);
    // Idle, with nothing due for an hour.
    round_trip(&h);
    let rules = RetentionConfig {
        rules: vec![RetentionRuleConfig {
            kinds: vec![1],
            max_age_secs: Some(86_400),
            keep_per_author: None,
        }],
        ..RetentionConfig::default()
    };
    parts.plan.set(rules.plan(std::iter::empty(), Vec::new()));
    h.wake();
    wait_until("the old notes are removed", || held(&store).len() == 1);
    assert_eq!(held(&store)[0].id, recent.id);
    h.shutdown();
}

#[test]
fn shutdown_commits_what_is_queued_stops_the_thread_and_closes_the_queue() {
    let (_dir, store) = open_store();
    let (h, _parts) = start(&store, EngineConfig::default());
    let ev = note(1, 60);
    let rx = h.submit(
        Arc::new(ev.clone()),
        Instant::now(),
        Origin::Client,
        OUTSIDER,
    );
    h.shutdown();
    assert!(!h.alive());
    assert!(matches!(
        rx.unwrap().blocking_recv().unwrap(),
        Ok(WriteOutcome::Stored { .. })
    ));
    let again = h.submit(Arc::new(note(2, 60)), Instant::now(), Origin::Client, LONE);
    assert_eq!(again.err(), Some(SubmitError::Closed));
    h.shutdown();
}

/// CPU time the writer thread has used.
#[cfg(target_os = "linux")]
fn cpu_time(h: &WriterHandle) -> Duration {
    use std::os::unix::thread::JoinHandleExt;
    let thread = h.thread.lock();
    let pthread = thread.as_ref().unwrap().as_pthread_t();
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the thread is running (joined only by `shutdown`), and
    // `clock` is writable.
    assert_eq!(
        unsafe { libc::pthread_getcpuclockid(pthread, &mut clock) },
        0
    );
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is writable.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Fails if the writer thread uses `budget` of CPU within about
/// `watch` of the wall clock. What an idle writer uses does not depend
/// on how long it is watched or how busy the machine is: it sleeps.
#[cfg(target_os = "linux")]
fn assert_sleeps(h: &WriterHandle, what: &str) {
    let (watch, budget) = (Duration::from_millis(1500), Duration::from_millis(100));
    let (started, cpu) = (Instant::now(), cpu_time(h));
    while started.elapsed() < watch {
        std::thread::sleep(Duration::from_millis(20));
        let used = cpu_time(h) - cpu;
        assert!(
            used < budget,
            "{what}: the writer used {used:?} of CPU in {:?}",
            started.elapsed()
        );
    }
}

/// An idle writer sleeps until the next thing due (an expiry purge,
/// a waiting outsider's commit, a retention step, a look at a closed
/// disk gate every second): it never spins.
#[test]
#[cfg(target_os = "linux")]
fn an_idle_writer_sleeps_between_what_is_due() {
    let (_dir, store) = open_store();
    let cfg = EngineConfig {
        expiry_purge_interval_ms: 200,
        ..EngineConfig::default()
    };
    let (h, parts) = start(&store, cfg);
    round_trip(&h);
    assert_sleeps(&h, "idle, purging expired events every 200 ms");
    // The disk is nearly full: the writer looks again every second.
    parts.disk.update(&DiskSpace {
        free_bytes: 1 << 20,
        total_bytes: 1 << 30,
        min_free_bytes: 64 << 20,
    });
    round_trip(&h);
    assert_sleeps(&h, "idle, the disk gate closed");
    let refused = submit(&h, &note(1, 60), LONE);
    assert!(
        matches!(refused, Err(WriteError::DiskFull(_))),
        "{refused:?}"
    );
    h.shutdown();
}
