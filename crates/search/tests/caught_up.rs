//! Waiting for the index to catch up (the end of an import, a sync, a
//! reindex) does not wait out the commit interval: what the indexer reads
//! while someone waits is committed at once, and an indexer sleeping out
//! its interval looks again when the wait begins.

use std::sync::mpsc;
use std::time::Duration;

use sluice_proto::Event;
use sluice_search::{Indexer, SearchConfig, SearchIndex, Workers};

use crate::support;
use support::{open_store, write};

fn notes(first: u8, n: u8) -> Vec<Event> {
    (first..first + n)
        .map(|i| {
            Event::sign(
                &[i; 32],
                1_699_999_000 + u64::from(i),
                1,
                vec![],
                "caught up",
            )
        })
        .collect()
}

/// Far longer than the bound below: a wait that sat out the interval
/// would fail, at any machine speed.
const INTERVAL_MS: u64 = 600_000;
const BOUND: Duration = Duration::from_secs(60);

/// `wait_caught_up` on another thread; panics unless it returns true
/// within [`BOUND`].
fn wait_within_bound(indexer: &std::sync::Arc<Indexer>, next: u64) {
    let (tx, rx) = mpsc::sync_channel(1);
    let waiter = indexer.clone();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.wait_caught_up(next));
    });
    let caught_up = rx
        .recv_timeout(BOUND)
        .expect("wait_caught_up sat out the commit interval");
    assert!(caught_up, "the indexer stopped");
}

#[test]
fn a_wait_for_the_index_does_not_sit_out_the_commit_interval() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    write(&store, &notes(1, 3));
    let cfg = SearchConfig {
        kinds: vec![1],
        commit_interval_ms: INTERVAL_MS,
        ..SearchConfig::default()
    };
    let index = SearchIndex::open(&dir.path().join("search"), cfg).unwrap();
    let indexer =
        std::sync::Arc::new(Indexer::start(index.clone(), store.clone(), Workers::One).unwrap());
    // The first events: read in one batch (caught up), committed at once.
    wait_within_bound(&indexer, store.next_serial().unwrap());
    assert_eq!(indexer.indexed_serial(), 3);
    // The indexer now sleeps out its interval; more events arrive and
    // someone waits for them.
    write(&store, &notes(4, 2));
    wait_within_bound(&indexer, store.next_serial().unwrap());
    assert_eq!(indexer.indexed_serial(), 5);
    indexer.stop();
}
