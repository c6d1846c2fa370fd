//! The connection's subscriptions (REQ, by subscription id) and running
//! COUNTs (by query id): the query and the live-index entry each one owns,
//! and the live events a subscription holds back until its EOSE.
//!
//! Invariants:
//! - `sluice_subscriptions_open` counts exactly the [`Sub`]s that exist:
//!   each one carries an owned gauge guard, so opening, replacing, closing
//!   and dropping the registry with the session keep it right on every
//!   exit path, with no increment or decrement anywhere else.
//! - A [`Sub`] or [`Count`] owns its query's [`ReadGuard`]: removing or
//!   replacing it cancels the query and gives back what it holds in the
//!   scheduler.
//! - A [`Sub`] owns its [`LiveSub`]: removing or replacing it takes it out
//!   of the engine's live index at once. Deliveries already queued name
//!   the old handle and find no subscription.
//! - Subscriptions plus running COUNTs are what `limits.max_subscriptions`
//!   bounds ([`Subs::open_len`]).

use std::sync::Arc;

use sluice_engine::live::LiveEvent;
use sluice_engine::live::LiveSub;
use sluice_engine::live::SubHandle;
use sluice_engine::reads::ReadGuard;
use sluice_throttle::JobId;

use super::small_str::SmallStr;
use crate::metrics_names as m;

/// One open subscription.
pub(super) struct Sub {
    live: LiveSub,
    /// The stored query while it runs; `None` once it ended (EOSE).
    pub(super) query: Option<ReadGuard>,
    pub(super) phase: Phase,
    _open: sluice_engine::gauge::GaugeGuard,
}

/// Where a subscription is in its life: its stored query, then live
/// (16 bytes in every subscription).
pub(super) enum Phase {
    /// Before EOSE: the live matches held back while the stored query
    /// runs, made at the first (boxed: a pointer in every subscription,
    /// not a `Vec`'s 24 bytes).
    #[allow(clippy::box_collection)]
    Held(Option<Box<Vec<Arc<LiveEvent>>>>),
    /// After EOSE. Serials below `snapshot_serial` were visible to the
    /// stored query; live events still in flight with such serials were
    /// already sent (or cut by the limit) and are skipped.
    Live { snapshot_serial: u64 },
}

/// One running COUNT.
pub(super) struct Count {
    pub(super) sub_id: String,
    _query: ReadGuard,
}

/// What the registry holds: a subscription by its id, or a COUNT by its
/// query.
enum Entry {
    Req(SmallStr, Sub),
    Count(JobId, Count),
}

/// A list, not a map: a connection has a few subscriptions and COUNTs at
/// most (`limits.max_subscriptions`), and most have one subscription; the
/// list grows by one entry at a time, so a connection holds exactly what
/// it has open (one pointer and a length in its task).
#[derive(Default)]
pub(super) struct Subs {
    open: Box<[Entry]>,
}

/// Adds an entry to an exact list (a boxed slice: no spare room, and 8
/// bytes less than a `Vec` in every connection's task).
pub(super) fn push_exact<T>(v: &mut Box<[T]>, item: T) {
    let mut list = std::mem::take(v).into_vec();
    list.reserve_exact(1);
    list.push(item);
    *v = list.into_boxed_slice();
}

/// Removes an entry from an exact list, giving back the room it took.
pub(super) fn remove_at<T>(v: &mut Box<[T]>, at: usize) -> T {
    let mut list = std::mem::take(v).into_vec();
    let item = list.swap_remove(at);
    *v = list.into_boxed_slice();
    item
}

impl Subs {
    /// Open subscriptions plus running COUNTs.
    pub(super) fn open_len(&self) -> usize {
        self.open.len()
    }

    fn reqs(&self) -> impl Iterator<Item = (&SmallStr, &Sub)> {
        self.open.iter().filter_map(|e| match e {
            Entry::Req(id, sub) => Some((id, sub)),
            Entry::Count(..) => None,
        })
    }

    fn reqs_mut(&mut self) -> impl Iterator<Item = (&SmallStr, &mut Sub)> {
        self.open.iter_mut().filter_map(|e| match e {
            Entry::Req(id, sub) => Some((&*id, sub)),
            Entry::Count(..) => None,
        })
    }

    fn position(&self, sub_id: &str) -> Option<usize> {
        self.open
            .iter()
            .position(|e| matches!(e, Entry::Req(id, _) if *id == *sub_id))
    }

    pub(super) fn contains(&self, sub_id: &str) -> bool {
        self.position(sub_id).is_some()
    }

    /// Opens `sub_id`, registered in the live index (`live`) with its
    /// query not yet submitted, holding live matches until EOSE. A
    /// subscription with the same id is replaced: its query is cancelled
    /// and it leaves the live index.
    pub(super) fn open(&mut self, sub_id: &str, live: LiveSub) {
        let sub = Sub {
            live,
            query: None,
            phase: Phase::Held(None),
            _open: sluice_engine::gauge::GaugeGuard::hold(m::SUBSCRIPTIONS_OPEN),
        };
        match self.position(sub_id) {
            // The old one drops here, after its replacement is in place.
            Some(at) => drop(std::mem::replace(
                &mut self.open[at],
                Entry::Req(SmallStr::new(sub_id), sub),
            )),
            None => push_exact(&mut self.open, Entry::Req(SmallStr::new(sub_id), sub)),
        }
    }

    /// Closes `sub_id` (cancelling its query); false if it was not open.
    pub(super) fn close(&mut self, sub_id: &str) -> bool {
        match self.position(sub_id) {
            Some(at) => {
                drop(remove_at(&mut self.open, at));
                true
            }
            None => false,
        }
    }

    /// The open subscription a live delivery names, with its id.
    pub(super) fn by_handle(&mut self, handle: SubHandle) -> Option<(String, &mut Sub)> {
        self.reqs_mut()
            .find(|(_, s)| s.live.handle() == handle)
            .map(|(id, s)| (id.as_str().to_owned(), s))
    }

    pub(super) fn get_mut(&mut self, sub_id: &str) -> Option<&mut Sub> {
        self.reqs_mut()
            .find(|(id, _)| **id == *sub_id)
            .map(|(_, s)| s)
    }

    /// The subscription whose stored query is `job`, if still open.
    pub(super) fn sub_of_query(&self, job: JobId) -> Option<String> {
        self.reqs()
            .find(|(_, s)| s.query.as_ref().is_some_and(|q| q.job() == job))
            .map(|(id, _)| id.as_str().to_owned())
    }

    /// Keeps a COUNT's query until its answer arrives.
    pub(super) fn start_count(&mut self, sub_id: String, query: ReadGuard) {
        let job = query.job();
        push_exact(
            &mut self.open,
            Entry::Count(
                job,
                Count {
                    sub_id,
                    _query: query,
                },
            ),
        );
    }

    fn count_position(&self, job: JobId) -> Option<usize> {
        self.open
            .iter()
            .position(|e| matches!(e, Entry::Count(j, _) if *j == job))
    }

    pub(super) fn is_count(&self, job: JobId) -> bool {
        self.count_position(job).is_some()
    }

    /// Removes the COUNT whose query is `job` (it has answered).
    pub(super) fn finish_count(&mut self, job: JobId) -> Option<Count> {
        let at = self.count_position(job)?;
        match remove_at(&mut self.open, at) {
            Entry::Count(_, count) => Some(count),
            Entry::Req(..) => None,
        }
    }
}
