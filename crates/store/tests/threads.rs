//! The binary forbids LMDB transactions on async worker threads through
//! `Store::forbid_transactions_where`; a transaction opened where the check
//! says no is counted and, in debug builds, panics. (A test binary of its
//! own: the check is installed once per process.)

use std::cell::Cell;

use sluice_store::{Store, StoreOptions};

thread_local! {
    /// Stands in for "this thread is an async worker".
    static FORBIDDEN: Cell<bool> = const { Cell::new(false) };
}

#[test]
fn a_transaction_on_a_forbidden_thread_is_caught() {
    Store::forbid_transactions_where(|| FORBIDDEN.with(Cell::get));
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        map_size_bytes: 16 << 20,
        max_readers: 8,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    };
    let store = Store::open(dir.path(), &opts).unwrap();
    // An allowed thread: nothing happens.
    store.stats().unwrap();
    assert_eq!(Store::forbidden_transactions(), 0);
    // A forbidden one: counted, and a panic in debug builds.
    FORBIDDEN.with(|f| f.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.stats()));
    FORBIDDEN.with(|f| f.set(false));
    assert_eq!(r.is_err(), cfg!(debug_assertions));
    assert_eq!(Store::forbidden_transactions(), 1);
    store.stats().unwrap();
    assert_eq!(Store::forbidden_transactions(), 1);
}
