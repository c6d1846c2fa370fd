//! What carries a query's answers to its session: the sink, its chunk
//! credits, the messages, and the guard that owns an admitted query.

use std::sync::Arc;

use sluice_throttle::room;
use sluice_throttle::{JobId, RateLimited};
use tokio::sync::Semaphore;

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
    pub events: Vec<String>,
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
    pub(super) id: u64,
    pub(super) shared: Arc<SinkShared>,
}

/// A sink's queue and read credits, in one allocation per connection.
///
/// A queued answer holds its credit, and the credit this (a cycle): it is
/// broken when the sink goes, since closing the queue drops what it holds.
pub(super) struct SinkShared {
    /// Allocated only while answers wait in it; boxed so that what an
    /// emptied queue keeps is small (8-byte slots, not 113).
    pub(super) queue: Mailbox<Box<ReadMsg>>,
    /// Chunks a query may have unread in the queue.
    pub(super) credits: Semaphore,
}

/// One of a sink's credits, taken; given back when dropped.
pub(super) struct CreditPermit(pub(super) Arc<SinkShared>);

impl CreditPermit {
    pub(super) fn try_take(sink: &Arc<SinkShared>) -> Option<CreditPermit> {
        let permit = sink.credits.try_acquire().ok()?;
        permit.forget();
        Some(CreditPermit(sink.clone()))
    }
}

impl Drop for CreditPermit {
    fn drop(&mut self) {
        self.0.credits.add_permits(1);
    }
}

impl Drop for ReadSink {
    fn drop(&mut self) {
        // Answers still queued return their credits now.
        self.shared.queue.close();
    }
}

impl ReadSink {
    /// The next message of any of this session's queries. Cancel-safe;
    /// the future is one pointer.
    pub fn recv(&mut self) -> impl std::future::Future<Output = Box<ReadMsg>> + '_ {
        self.shared.queue.recv()
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
