//! What is queued to the writer thread, and its answers: a client's event,
//! a bulk batch, an operator's operation.

use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use sluice_proto::Event;
use sluice_store::{StoreError, WriteOutcome};
use tokio::sync::oneshot;

use crate::mirror_tap::Origin;

/// What the writer answers for one event.
pub type WriteResult = Result<WriteOutcome, WriteError>;

/// A write that did not happen; the event is not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("store is full")]
    StoreFull,
    /// The disk holding the store is full, or has less free space than
    /// `store.min_free_disk_mb`; writes resume when space returns.
    #[error("disk is full: {0}")]
    DiskFull(String),
    #[error("store error: {0}")]
    Store(String),
}

/// Why an event could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("writer queue is full")]
    QueueFull,
    #[error("writer has stopped")]
    Closed,
}

/// Why a bulk batch was not written; none of its events is stored.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writer has stopped")]
    Closed,
}

pub(super) enum Msg {
    Write(Request),
    Bulk(Bulk),
    /// An operator's change (policy entries, purges), in order with writes.
    Admin(AdminOp, oneshot::Sender<Result<AdminDone, StoreError>>),
    Shutdown,
    /// Look again at the retention plan (it changed).
    Wake,
    /// Makes the writer thread panic: how the engine's tests kill it.
    #[cfg(test)]
    Panic,
}

pub(super) struct Request {
    pub(super) event: Arc<Event>,
    pub(super) enqueued: Instant,
    pub(super) reply: oneshot::Sender<WriteResult>,
    /// Where it came from: a stored event goes to the replication tap
    /// unless another node sent it, and to every mirror's tap but the
    /// mirror it came through (`mirror_tap.rs`).
    pub(super) origin: Origin,
    /// Its connection had no other EVENT awaiting an OK (a person, not a
    /// pipelining bulk writer): it is committed ahead of a large batch.
    pub(super) lone: bool,
    /// Its author is outside the web of trust: it waits (at most
    /// [`OUTSIDERS_WAIT`]) to ride on the next commit, so a flood of
    /// strangers' events costs the writer few commits and the web's
    /// authors none of their latency.
    pub(super) outsider: bool,
}

/// Longest an outsider's event waits for a commit to ride on.
pub(crate) const OUTSIDERS_WAIT: Duration = Duration::from_millis(100);

/// What an operator asks the writer to do.
#[derive(Debug, Clone)]
pub enum AdminOp {
    /// Every runtime policy entry (read on the writer thread, in order
    /// with its changes).
    ReadPolicy,
    /// Sets (`Some`) or removes (`None`) a runtime policy entry.
    SetPolicy(String, Option<String>),
    /// Removes every stored event of an author.
    PurgeAuthor([u8; 32]),
    /// Removes one stored event.
    PurgeEvent([u8; 32]),
    /// Removes (or with `dry_run`, counts) the stored events matching a
    /// filter, newest first, at most its `limit`.
    PurgeMatching {
        filter: Box<sluice_proto::Filter>,
        dry_run: bool,
    },
}

/// The writer's answer to an [`AdminOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminDone {
    Policy(Vec<(String, String)>),
    Set,
    Purged(usize),
}

/// A bulk batch queued to the writer: [`BulkTicket::wait`] returns its
/// outcomes, in order, after its commit. Dropping it does not cancel the
/// write (the batch is the writer's once queued); the outcomes are then
/// dropped.
#[must_use = "a queued batch's outcomes are known only by waiting"]
pub struct BulkTicket(
    pub(super) Option<std::sync::mpsc::Receiver<Result<Vec<WriteOutcome>, StoreError>>>,
);

impl BulkTicket {
    /// Blocks the calling (non-async) thread until the batch is committed.
    pub fn wait(self) -> Result<Vec<WriteOutcome>, BulkError> {
        match self.0 {
            None => Ok(Vec::new()),
            // A writer that stops without answering drops the reply.
            Some(answer) => Ok(answer.recv().map_err(|_| BulkError::Closed)??),
        }
    }
}

pub(super) struct Bulk {
    pub(super) events: Vec<Event>,
    pub(super) enqueued: Instant,
    pub(super) reply: SyncSender<Result<Vec<WriteOutcome>, StoreError>>,
}
