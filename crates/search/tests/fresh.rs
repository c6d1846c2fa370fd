//! A search finds what is stored though the index was not committed for
//! it: while nobody searches the indexer commits only every
//! `idle_commit_interval_ms`, and a search that finds the index stale
//! waits for a commit. A search that finds it fresh, or no indexer
//! running, does not wait.

use std::time::{Duration, Instant};

use sluice_proto::Event;
use sluice_search::{Indexer, SearchConfig, SearchIndex, Workers};

use crate::support;
use support::{open_store, write};

fn notes(first: u8, n: u8) -> Vec<Event> {
    (first..first + n)
        .map(|i| Event::sign(&[i; 32], 1_699_999_000 + u64::from(i), 1, vec![], "fresh"))
        .collect()
}

/// Far longer than any test here runs: a commit the indexer made unasked
/// would have to come from the short interval.
const IDLE_MS: u64 = 3_600_000;
const BOUND: Duration = Duration::from_secs(60);

fn docs(index: &SearchIndex) -> u64 {
    index.searcher().num_docs()
}

#[test]
fn the_first_search_after_a_quiet_spell_waits_for_what_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    write(&store, &notes(1, 3));
    let cfg = SearchConfig {
        kinds: vec![1],
        commit_interval_ms: 50,
        idle_commit_interval_ms: IDLE_MS,
        ..SearchConfig::default()
    };
    let index = SearchIndex::open(&dir.path().join("search"), cfg).unwrap();
    let indexer = Indexer::start(index.clone(), store.clone(), Workers::One).unwrap();
    // Nobody searched: the index shows nothing (it commits every hour).
    assert_eq!(docs(&index), 0);
    assert_eq!(indexer.indexed_serial(), 0);
    // The first search waits for a commit of the three events.
    assert_eq!(index.fresh_searcher().num_docs(), 3);
    assert_eq!(indexer.indexed_serial(), 3);

    // Searched lately: more events are committed within the short
    // interval, unasked.
    write(&store, &notes(4, 2));
    index.ring();
    let start = Instant::now();
    while indexer.indexed_serial() < 5 {
        assert!(start.elapsed() < BOUND, "not committed unasked");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(docs(&index), 5);

    // A stopped indexer is not waited for: the search sees the index as
    // it is at once (a wait would last `FRESH_WAIT`; not waiting takes
    // microseconds).
    indexer.stop();
    write(&store, &notes(6, 1));
    index.ring();
    let asked = Instant::now();
    assert_eq!(index.fresh_searcher().num_docs(), 5);
    assert!(
        asked.elapsed() < sluice_search::FRESH_WAIT,
        "waited for no indexer"
    );
}
