//! Following events one by one: what each event in flight is (`Tracker`'s
//! pending map, filled before the event is handed to a connection), the
//! `Recorder` that tallies each class of client in whole and per sample, and
//! the `Ledger` of accepted events kept for the end-of-run checks: the
//! newest `k` by `created_at`, every exempt author's, and the current
//! version of every replaceable or addressable slot (an event whose slot a
//! newer accepted version took is not expected to be stored).
//! Memory is bounded by the events in flight, `k`, the exempt authors'
//! share and the number of slots, never by the run's length.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use super::mix::{Meta, Slot};
use crate::driver::{Outcome, Recorder, Tally};

/// True when version `a` (created_at, id) wins over `b` in one slot: newer,
/// or as new with the lower id (NIP-01).
pub fn supersedes(a: (u64, [u8; 32]), b: (u64, [u8; 32])) -> bool {
    (a.0, Reverse(a.1)) > (b.0, Reverse(b.1))
}

/// An accepted event as the checks need it: (created_at, id, slot).
type Entry = (u64, [u8; 32], Option<Slot>);

/// Accepted events the end-of-run checks look for.
#[derive(Debug, Default)]
pub struct Ledger {
    k: usize,
    /// The newest `k` accepted, as a min-heap on (created_at, id).
    newest: BinaryHeap<Reverse<Entry>>,
    /// The winning version of each slot among accepted events.
    winners: HashMap<Slot, (u64, [u8; 32])>,
    exempt: Vec<Entry>,
    kinds: BTreeMap<u16, u64>,
}

/// Events expected to be stored, and those left out because a newer
/// version of their slot was accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    pub ids: Vec<[u8; 32]>,
    pub superseded: u64,
}

impl Ledger {
    pub fn new(k: usize) -> Ledger {
        Ledger {
            k,
            ..Ledger::default()
        }
    }

    pub fn accept(&mut self, id: [u8; 32], meta: &Meta) {
        *self.kinds.entry(meta.kind).or_default() += 1;
        let version = (meta.created_at, id);
        if let Some(slot) = meta.slot {
            let w = self.winners.entry(slot).or_insert(version);
            if supersedes(version, *w) {
                *w = version;
            }
        }
        let item = Reverse((meta.created_at, id, meta.slot));
        if self.newest.len() < self.k {
            self.newest.push(item);
        } else if let Some(Reverse(min)) = self.newest.peek()
            && (meta.created_at, id) > (min.0, min.1)
        {
            self.newest.pop();
            self.newest.push(item);
        }
        if meta.exempt {
            self.exempt.push((meta.created_at, id, meta.slot));
        }
    }

    fn current(&self, created_at: u64, id: [u8; 32], slot: Option<Slot>) -> bool {
        slot.is_none_or(|s| self.winners.get(&s) == Some(&(created_at, id)))
    }

    fn expected<'a>(&self, items: impl Iterator<Item = &'a Entry>) -> Expected {
        let mut out = Expected::default();
        for (created_at, id, slot) in items {
            if self.current(*created_at, *id, *slot) {
                out.ids.push(*id);
            } else {
                out.superseded += 1;
            }
        }
        out
    }

    /// The newest `k` accepted events, newest first.
    pub fn newest(&self) -> Expected {
        let mut items: Vec<_> = self.newest.iter().map(|r| r.0).collect();
        items.sort_by_key(|e| Reverse((e.0, e.1)));
        self.expected(items.iter())
    }

    /// Every accepted event of the exempt authors.
    pub fn exempt(&self) -> Expected {
        self.expected(self.exempt.iter())
    }

    /// Accepted events by kind.
    pub fn kinds(&self) -> BTreeMap<u16, u64> {
        self.kinds.clone()
    }
}

/// What is in flight, and the ledger of what was accepted.
pub struct Tracker {
    pending: Mutex<HashMap<[u8; 32], Meta>>,
    ledger: Mutex<Ledger>,
}

impl Tracker {
    pub fn new(newest: usize) -> Tracker {
        Tracker {
            pending: Mutex::default(),
            ledger: Mutex::new(Ledger::new(newest)),
        }
    }

    /// Registers events before they are handed to a connection.
    pub fn expect(&self, events: impl IntoIterator<Item = ([u8; 32], Meta)>) {
        self.pending.lock().expect("pending lock").extend(events);
    }

    fn answered(&self, id: &[u8; 32]) -> Option<Meta> {
        self.pending.lock().expect("pending lock").remove(id)
    }

    pub fn with_ledger<T>(&self, f: impl FnOnce(&Ledger) -> T) -> T {
        f(&self.ledger.lock().expect("ledger lock"))
    }
}

/// One class's counts: the whole run and the current sample.
#[derive(Default, Clone)]
pub struct ClassTally {
    pub tally: Tally,
    /// JSON bytes of the events with an answer (or a timeout or loss).
    pub offered_bytes: u64,
    pub accepted_bytes: u64,
}

impl ClassTally {
    fn add(&mut self, meta: Option<&Meta>, outcome: Outcome<'_>) {
        self.tally.outcome(outcome);
        let bytes = meta.map_or(0, |m| u64::from(m.bytes));
        self.offered_bytes += bytes;
        if matches!(outcome, Outcome::Accepted { .. }) {
            self.accepted_bytes += bytes;
        }
    }
}

/// Tallies one class of clients (writers or polite), in whole and per
/// sample, and feeds the ledger.
pub struct SoakRecorder {
    pub tracker: std::sync::Arc<Tracker>,
    counts: Mutex<(ClassTally, ClassTally)>,
}

impl SoakRecorder {
    pub fn new(tracker: std::sync::Arc<Tracker>) -> SoakRecorder {
        SoakRecorder {
            tracker,
            counts: Mutex::default(),
        }
    }

    /// The counts since the last call (the sample just ended).
    pub fn take_sample(&self) -> ClassTally {
        std::mem::take(&mut self.counts.lock().expect("counts lock").1)
    }

    /// The counts of the whole run so far.
    pub fn total(&self) -> ClassTally {
        self.counts.lock().expect("counts lock").0.clone()
    }

    fn with(&self, f: impl Fn(&mut ClassTally)) {
        let mut g = self.counts.lock().expect("counts lock");
        f(&mut g.0);
        f(&mut g.1);
    }
}

impl Recorder for SoakRecorder {
    fn sent(&self, _due: Instant) {
        self.with(|c| c.tally.sent += 1);
    }
    fn skipped(&self, _due: Instant) {
        self.with(|c| c.tally.skipped += 1);
    }
    fn outcome(&self, _due: Instant, outcome: Outcome<'_>) {
        self.with(|c| c.add(None, outcome));
    }
    fn outcome_of(&self, id: &[u8; 32], _due: Instant, outcome: Outcome<'_>) {
        let meta = self.tracker.answered(id);
        self.with(|c| c.add(meta.as_ref(), outcome));
        if let (Some(meta), Outcome::Accepted { .. }) = (meta, outcome) {
            self.tracker
                .ledger
                .lock()
                .expect("ledger lock")
                .accept(*id, &meta);
        }
    }
    fn connection_error(&self, reason: &str) {
        self.with(|c| {
            c.tally.connection_errors += 1;
            c.tally.connection_error_reasons.add_key(reason);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(created_at: u64, slot: Option<Slot>, exempt: bool) -> Meta {
        Meta {
            created_at,
            kind: if slot.is_some() { 0 } else { 1 },
            bytes: 100,
            exempt,
            slot,
        }
    }

    fn id(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn newest_keeps_the_k_highest_created_at() {
        let mut l = Ledger::new(3);
        for (n, t) in [(1, 50), (2, 10), (3, 70), (4, 60), (5, 20), (6, 70)] {
            l.accept(id(n), &meta(t, None, false));
        }
        let e = l.newest();
        assert_eq!(e.ids, vec![id(6), id(3), id(4)]);
        assert_eq!(e.superseded, 0);
        assert_eq!(l.kinds()[&1], 6);
    }

    #[test]
    fn superseded_versions_are_not_expected() {
        let slot = Slot {
            author: 0,
            kind: 0,
            d: 0,
        };
        let mut l = Ledger::new(10);
        // Arrives newest first, then an older version (as after a sync).
        l.accept(id(1), &meta(100, Some(slot), true));
        l.accept(id(2), &meta(90, Some(slot), true));
        // Same created_at: the lower id wins.
        let other = Slot { author: 1, ..slot };
        l.accept(id(9), &meta(50, Some(other), true));
        l.accept(id(8), &meta(50, Some(other), true));
        l.accept(id(3), &meta(10, None, true));
        l.accept(id(4), &meta(10, None, false));
        let e = l.exempt();
        assert_eq!(e.ids, vec![id(1), id(8), id(3)]);
        assert_eq!(e.superseded, 2);
        let n = l.newest();
        assert_eq!(n.ids, vec![id(1), id(8), id(4), id(3)]);
        assert_eq!(n.superseded, 2);
    }

    #[test]
    fn supersedes_follows_nip01() {
        assert!(supersedes((2, id(9)), (1, id(1))));
        assert!(supersedes((1, id(1)), (1, id(9))));
        assert!(!supersedes((1, id(9)), (1, id(1))));
        assert!(!supersedes((1, id(1)), (1, id(1))));
    }

    #[test]
    fn recorder_tallies_bytes_and_feeds_the_ledger() {
        let tracker = std::sync::Arc::new(Tracker::new(5));
        let r = SoakRecorder::new(tracker.clone());
        tracker.expect([(id(1), meta(5, None, true)), (id(2), meta(6, None, false))]);
        let now = Instant::now();
        let latency = std::time::Duration::from_millis(2);
        r.sent(now);
        r.sent(now);
        r.outcome_of(
            &id(1),
            now,
            Outcome::Accepted {
                latency,
                message: "",
            },
        );
        r.outcome_of(
            &id(2),
            now,
            Outcome::Refused {
                latency,
                message: "rate-limited: slow down",
            },
        );
        let s = r.take_sample();
        assert_eq!((s.tally.sent, s.tally.accepted, s.tally.refused), (2, 1, 1));
        assert_eq!((s.offered_bytes, s.accepted_bytes), (200, 100));
        assert_eq!(r.take_sample().tally.sent, 0);
        assert_eq!(r.total().tally.accepted, 1);
        assert_eq!(tracker.with_ledger(|l| l.exempt().ids.clone()), vec![id(1)]);
        assert!(tracker.pending.lock().unwrap().is_empty());
    }
}
