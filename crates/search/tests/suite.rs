//! The search crate's integration tests, one module per file of this
//! folder, built as one test binary: `support/` is compiled once, and one
//! binary is linked instead of one per file. None sets anything
//! process-wide, so none is a binary of its own.
//! Run one module with a filter: `cargo test -p sluice-search --test suite tokens::`.

mod support;

mod caught_up;
mod fresh;
mod tokens;
