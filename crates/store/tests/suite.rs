//! The store's integration tests, one module per file of this folder, built
//! as one test binary: `support/` is compiled once, and one binary is linked
//! instead of one per file. Three files are binaries of their own:
//! - `exact_fsize` lowers the process's `RLIMIT_FSIZE` and ignores `SIGXFSZ` (every test beside it would write under the limit).
//! - `exact_alone` checks a reserve sized from the free disk space against the space it measures (within 5% or 1 MiB), which other files' stores, written beside it, would move.
//! - `threads` installs the process's one transaction check (`Store::forbid_transactions_where`, never removed) and counts the process's forbidden transactions.
//!
//! Run one module with a filter: `cargo test -p sluice-store --test suite exact_query::`.

mod support;

mod compact;
mod corrupt;
mod exact_query;
mod exact_store;
mod exact_write;
mod retention_exact;
mod rules;
mod runtime_rules;
mod steps;
