//! The single writer thread and its bounded queue.
//!
//! Group commit: the writer blocks for the first queued event, then takes
//! whatever else is queued (up to `max_batch_events` / `max_batch_bytes`),
//! writes the batch in one transaction and commits. Only then does it hand
//! the stored events to the live index and answer each sender. Under load
//! batches grow and the commit cost is shared, up to what commits in about
//! `engine.commit_target_ms` (`cap.rs`): the rest is carried to the next
//! batch, so a lone event that arrives meanwhile waits for one bounded
//! commit. When idle a lone event is committed at once.
//!
//! Bulk mode (the import): [`WriterHandle::write_bulk`] hands the writer a
//! whole ordered batch, which it writes alone as one transaction with the
//! same write rules, in queue order with the single events, and answers
//! after the commit. The caller blocks until then, so each bulk client has
//! at most one batch in the queue; its size is the client's choice
//! (`sluice import --batch-events`), not `max_batch_events`.
//!
//! The queue is a `sync_channel` of `writer_queue_events` messages (an
//! event, or one bulk batch). When it is full the submitter loses: `submit`
//! fails with `QueueFull` (the session answers `rate-limited:`); a bulk
//! client waits.
//!
//! Load signals for the monitor ([`WriterSignals`]): the longest queue wait
//! and slowest group commit since the last tick, and for bulk batches the
//! commit cost per 1000 stored events against a slow baseline, so batches
//! of any size compare. A bulk client also reports the input it holds for
//! the writer ([`Backlog`]), which the monitor counts as queue fill.

mod admin;
mod bulk;
mod cap;
mod commit;
mod handle;
mod msg;
mod signals;
mod thread;
mod upkeep;

#[cfg(test)]
mod tests;

pub use commit::outcome_label;
pub(crate) use handle::{WriterHandle, spawn};
#[cfg(test)]
pub(crate) use msg::OUTSIDERS_WAIT;
pub use msg::{AdminDone, AdminOp, BulkError, BulkTicket, SubmitError, WriteError, WriteResult};
pub use signals::Backlog;
