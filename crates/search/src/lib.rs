//! NIP-50 full-text search for Sluice, on tantivy.
//!
//! - [`SearchIndex`] (`index.rs`): the index in `store.path/search/`, its
//!   schema and tokeniser (the proto crate's `search::words`, so the index
//!   and `Filter::matches` agree on what a word is), the documents made
//!   from events (content of `[search] kinds`; a profile's name,
//!   display_name and about; a long-form post's title and summary), and
//!   the ranked search of one filter.
//! - [`Indexer`] (`indexer.rs`): the `sluice-search` thread. The writer
//!   rings after each commit; the indexer pulls the committed events from
//!   the store by serial and commits the index with the last serial read
//!   as its payload, so it resumes after a crash and never delays an OK.
//! - `fresh.rs`: when the index commits without being asked (every
//!   `commit_interval_ms` while searches come, every
//!   `idle_commit_interval_ms` once none has for that long), and a search
//!   that finds it stale waiting for a commit.
//! - [`SearchCursor`] (`cursor.rs`): a REQ or COUNT with search filters in
//!   bounded steps on a query worker; every hit is checked against the
//!   store before it is answered, so the index may lag but never lies.
//!
//! Invariant: a search never serves an event the store does not hold
//! (checked by `tests/search.rs`, deletions, replacements, expiry and a
//! kill -9 while indexing).

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod config;
mod cursor;
mod fresh;
mod index;
mod indexer;
pub mod metrics_names;
mod rank;

pub use config::SearchConfig;
pub use cursor::SearchCursor;
pub use fresh::FRESH_WAIT;
pub use index::{SearchError, SearchIndex};
pub use indexer::{Indexer, Workers};
pub use rank::RankedHit;

/// The index's directory inside the store's.
pub const INDEX_DIR: &str = "search";
