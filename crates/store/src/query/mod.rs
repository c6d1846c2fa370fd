//! The read path: a planner that picks one index per filter, and scans that
//! walk the index newest first with the filter's time range in the key
//! range and the limit pushed down.
//!
//! Ordering is newest first, ties broken by the lowest id. Index keys order
//! equal timestamps by serial, so a filter's scan collects each timestamp
//! whole, sorts it by id and passes on what its limit allows: exact, and
//! bounded by the scan budget. The filters of one REQ are merged in that
//! order, an event matched by several sent once.
//!
//! Queries run in bounded *steps* ([`QueryCursor`], [`CountCursor`]): each
//! step opens its own read transaction, reads at most a given number of
//! index rows and returns at most a given number of bytes of events, and
//! keeps its place in owned keys, so no transaction outlives a step and a
//! long scan never holds a worker. The first step fixes the snapshot: rows
//! with a serial at or above it (committed after the first step) are
//! skipped by later steps, and live delivery takes over from that serial.
//! A row removed between steps (deleted, replaced, expired) is simply not
//! found. [`Store::query`](crate::Store::query) and
//! [`Store::count`](crate::Store::count) run a cursor to the end.
//!
//! - `planner.rs`: the planner (which index answers a filter, and over which
//!   prefixes) and the [`PlanShape`] cost estimates read before a query runs.
//! - `walk.rs`: one filter's resumable walk over its plan (id lookups, or a
//!   newest-first merge of index ranges), the scan budget, and the full
//!   filter applied to each row's event.
//! - `chunk.rs`: [`EventChunk`], a step's events in one buffer.
//! - `cursor.rs`: the cursors of a REQ and a COUNT, each filter's rows put
//!   in final order, the merge of a REQ's filters, and the steps
//!   ([`Store::query_step`](crate::Store::query_step),
//!   [`Store::count_step`](crate::Store::count_step)) that run them.

mod chunk;
mod cursor;
mod planner;
mod walk;

pub use chunk::{EventChunk, EventSink};
pub use cursor::{CountCursor, QueryCursor, QueryOptions, QueryOutput, StepLimits, StepOutput};
pub use planner::{PlanShape, plan_shape};
pub(crate) use walk::header_matches;
