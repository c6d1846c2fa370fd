//! What the search crate's tests share: a small store, filled directly.

use std::path::Path;

use sluice_proto::Event;
use sluice_store::{Store, StoreOptions};

pub fn open_store(dir: &Path) -> Store {
    let opts = StoreOptions {
        map_size_bytes: 64 << 20,
        min_free_disk_bytes: 0,
        ..StoreOptions::default()
    };
    Store::open(dir, &opts).unwrap()
}

#[expect(
    clippy::disallowed_methods,
    reason = "the test fills a store of its own, with no writer thread"
)]
pub fn write(store: &Store, events: &[Event]) {
    store.write_batch(events, 1_700_000_000).unwrap();
}
