//! The mirrors' tap: where events stored here leave for the peers a
//! `[[mirror]]` sends up to. Each mirror that sends up registers a
//! [`MirrorTap`] (its filter, a bounded queue); the writer offers every
//! event it stored for a client or for a mirror, after the commit, and the
//! session path every ephemeral event, to each registered tap whose filter
//! matches, except the tap of the mirror the event came through (its
//! [`Origin`]): nothing is sent back to the peer it came from. Offering
//! never waits: a full queue drops the event for that peer and counts it
//! on the mirror's own counter (the mirror's next catch-up by negentropy
//! sends it). Events from another cluster node and bulk writes (import,
//! sync, repairs) are not offered.
//!
//! A tap is an owned guard: dropping it removes its entry, so a mirror
//! that stops holds nothing here.

use parking_lot::RwLock;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_proto::{Event, Filter};
use tokio::sync::mpsc::{Receiver, Sender, error::TrySendError};

/// Where an event handed to the writer (or to the live fan-out) came from:
/// where it is offered once stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A client of this relay: to the cluster's tap and to every mirror.
    Client,
    /// Another node of the cluster: to neither (that node offered it).
    Replica,
    /// A mirrored peer, by its mirror's id ([`MirrorTap::origin`]): to the
    /// cluster's tap and to every mirror but that one.
    Mirror(u64),
}

struct Entry {
    id: u64,
    filter: Filter,
    tx: Sender<Arc<Event>>,
    /// The mirror's overflow counter (labelled with its peer).
    dropped: metrics::Counter,
}

#[derive(Default)]
pub(crate) struct MirrorTaps {
    entries: RwLock<Vec<Entry>>,
    next_id: AtomicU64,
}

impl MirrorTaps {
    /// A new mirror id (never 0, never reused).
    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn register(
        self: &Arc<Self>,
        filter: Filter,
        capacity: usize,
        dropped: metrics::Counter,
    ) -> MirrorTap {
        let id = self.new_id();
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        self.entries.write().push(Entry {
            id,
            filter,
            tx,
            dropped,
        });
        MirrorTap {
            id,
            taps: self.clone(),
            rx,
        }
    }

    /// Hands `event` to every registered tap that wants it, or drops and
    /// counts it for those whose queue is full.
    pub(crate) fn offer(&self, event: &Arc<Event>, origin: Origin) {
        let from = match origin {
            Origin::Client => 0,
            Origin::Mirror(id) => id,
            Origin::Replica => return,
        };
        let entries = self.entries.read();
        for e in entries.iter() {
            if e.id == from || !e.filter.matches(event) {
                continue;
            }
            match e.tx.try_send(event.clone()) {
                Ok(()) | Err(TrySendError::Closed(_)) => {}
                Err(TrySendError::Full(_)) => e.dropped.increment(1),
            }
        }
    }

    /// Whether any mirror sends up (the writer skips the offer otherwise).
    pub(crate) fn any(&self) -> bool {
        !self.entries.read().is_empty()
    }

    fn remove(&self, id: u64) {
        self.entries.write().retain(|e| e.id != id);
    }
}

/// One mirror's place at the tap: the events stored here that it sends up,
/// in a bounded queue. Dropping it unregisters the mirror.
pub struct MirrorTap {
    id: u64,
    taps: Arc<MirrorTaps>,
    rx: Receiver<Arc<Event>>,
}

impl MirrorTap {
    /// The origin of the events this mirror brings in: never offered back
    /// to this tap.
    pub fn origin(&self) -> Origin {
        Origin::Mirror(self.id)
    }

    /// The next event to send up.
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        self.rx.recv().await
    }
}

impl Drop for MirrorTap {
    fn drop(&mut self) {
        self.taps.remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u16) -> Arc<Event> {
        Arc::new(Event::sign(&[7; 32], 1_700_000_000, kind, vec![], "x"))
    }

    fn filter(text: &str) -> Filter {
        Filter::parse(text).unwrap()
    }

    #[test]
    fn an_event_goes_to_every_matching_tap_but_its_origins_and_a_full_queue_counts() {
        let taps = Arc::new(MirrorTaps::default());
        let mut all = taps.register(filter("{}"), 1, metrics::Counter::noop());
        let mut notes = taps.register(filter(r#"{"kinds":[1]}"#), 4, metrics::Counter::noop());
        assert!(taps.any());
        taps.offer(&ev(1), Origin::Client);
        taps.offer(&ev(7), Origin::Client);
        // From the `all` mirror: never back to it.
        taps.offer(&ev(1), all.origin());
        taps.offer(&ev(1), Origin::Replica);
        assert_eq!(all.rx.try_recv().unwrap().kind, 1);
        assert!(all.rx.try_recv().is_err(), "the second was dropped (full)");
        assert_eq!(notes.rx.try_recv().unwrap().kind, 1);
        assert_eq!(notes.rx.try_recv().unwrap().kind, 1, "the one from `all`");
        assert!(
            notes.rx.try_recv().is_err(),
            "kind 7 and the replica are not"
        );
        drop(all);
        drop(notes);
        assert!(!taps.any(), "a dropped tap unregisters");
    }
}
