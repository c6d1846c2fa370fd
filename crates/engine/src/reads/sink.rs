//! What carries a query's answers to its session: the sink, its chunk
//! credits, the messages, and the guard that owns an admitted query.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use sluice_store::EventChunk;
use sluice_throttle::room;
use sluice_throttle::{JobId, RateLimited};

use super::Inner;
use crate::mailbox::Mailbox;

/// How a query ended, as its last message says.
#[derive(Debug)]
pub enum ReadEnd {
    /// A REQ's stored events are all sent: EOSE, and live events from
    /// `snapshot_serial` on.
    Eose {
        snapshot_serial: u64,
        truncated: bool,
    },
    /// A COUNT's answer.
    Count { count: u64, truncated: bool },
    /// Dropped before its first step (deadline passed): `rate-limited:`.
    Refused(RateLimited),
    /// The store failed (or a step panicked); logged here.
    Failed,
}

/// One answer chunk (and/or the end) of a query, for the session.
pub struct ReadMsg {
    pub job: JobId,
    pub events: EventChunk,
    pub end: Option<ReadEnd>,
    /// Units to charge (positive) or refund (negative) to the connection's
    /// read budget, settling the estimate charged at admission.
    pub settle_units: i64,
    pub(super) _credit: Option<Credit>,
}

/// A chunk's place in its sink; returned when the message is dropped, and
/// the sink's parked queries may then run.
pub(super) struct Credit {
    pub(super) permit: Option<CreditPermit>,
    pub(super) inner: Arc<Inner>,
    pub(super) sink: u64,
}

impl Drop for ReadMsg {
    /// The answer's buffer goes back to the workers for a later step.
    fn drop(&mut self) {
        if let Some(c) = &self._credit {
            c.inner.give_back(std::mem::take(&mut self.events));
        }
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        // Return the credit first: a worker that checks for one after this
        // point sees it; one that parked before is woken below.
        drop(self.permit.take());
        let mut st = self.inner.lock();
        st.sched.unpark(self.sink);
        let runnable = st.sched.stats().queued > 0;
        drop(st);
        if runnable {
            self.inner.work.notify_one();
        }
    }
}

/// A session's receiving end for all its queries' answers.
pub struct ReadSink {
    pub(super) home: Arc<dyn SinkHome>,
}

/// The allocation a sink's [`SinkShared`] lives in: its connection's,
/// beside the live queue (`crate::live::LiveConn::read_sink`), or its own
/// ([`super::Reads::sink`]). The queries and their chunks hold it.
pub(crate) trait SinkHome: Send + Sync + 'static {
    fn sink(&self) -> &SinkShared;
}

/// A sink's queue and read credits.
///
/// A queued answer holds its credit, and the credit this (a cycle): it is
/// broken when the sink goes, since closing the queue drops what it holds.
pub(crate) struct SinkShared {
    /// The sink's id in the scheduler (it parks and unparks its queries),
    /// set when the sink is opened ([`super::Reads::open_sink`]).
    id: AtomicU64,
    /// Allocated only while answers wait in it (a query's answers come
    /// seldom: an emptied queue keeps nothing); boxed so that the queue's
    /// slots are small (8 bytes, not 113). Its bound is set when the sink
    /// is opened.
    pub(super) queue: Mailbox<Box<ReadMsg>, 0>,
    /// Chunks this connection's queries may have unread in the queue:
    /// taken by a worker ([`CreditPermit::try_take`]), never waited for.
    pub(super) credits: AtomicU32,
}

impl SinkShared {
    /// A sink not opened yet: no credit, no id.
    pub(crate) fn unopened() -> SinkShared {
        SinkShared {
            id: AtomicU64::new(0),
            queue: Mailbox::keeping_nothing(1),
            credits: AtomicU32::new(0),
        }
    }

    /// Opens it: its id, the bound of its queue and its credits.
    pub(super) fn open(&self, id: u64, queue_cap: usize, credits: u32) {
        self.id.store(id, Ordering::Release);
        self.queue.set_cap(queue_cap);
        self.credits.store(credits, Ordering::Release);
    }

    pub(super) fn id(&self) -> u64 {
        self.id.load(Ordering::Acquire)
    }

    /// Credits not taken.
    pub(super) fn credits_left(&self) -> u32 {
        self.credits.load(Ordering::Acquire)
    }
}

impl SinkHome for SinkShared {
    fn sink(&self) -> &SinkShared {
        self
    }
}

/// One of a sink's credits, taken; given back when dropped.
pub(super) struct CreditPermit(pub(super) Arc<dyn SinkHome>);

impl CreditPermit {
    pub(super) fn try_take(home: &Arc<dyn SinkHome>) -> Option<CreditPermit> {
        home.sink()
            .credits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()?;
        Some(CreditPermit(home.clone()))
    }
}

impl Drop for CreditPermit {
    fn drop(&mut self) {
        self.0.sink().credits.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for ReadSink {
    fn drop(&mut self) {
        // Answers still queued return their credits now.
        self.home.sink().queue.close();
    }
}

impl ReadSink {
    /// The next message of any of this session's queries. Cancel-safe;
    /// the future is one pointer.
    pub fn recv(&mut self) -> impl std::future::Future<Output = Box<ReadMsg>> + '_ {
        self.home.sink().queue.recv()
    }
}

/// Owns one admitted query: dropping it cancels the query and gives back
/// its queue position or worker.
pub struct ReadGuard {
    pub(super) job: JobId,
    pub(super) inner: Arc<Inner>,
}

impl ReadGuard {
    /// The id its messages carry.
    pub fn job(&self) -> JobId {
        self.job
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        if st.sched.cancel(self.job)
            && let Some(body) = st.bodies.remove(&self.job)
        {
            room::give_back(&mut st.bodies);
            drop(st);
            self.inner.finish(body, false);
        }
    }
}
