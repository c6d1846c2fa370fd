//! The index and the tokeniser's version: an index written with words an
//! older build split differently (its commit payload names no version, or
//! another) is rebuilt from the store when the indexer starts; one of this
//! version is resumed. CJK text is found by the characters and pairs it
//! holds.

use std::path::Path;

use sluice_proto::{Event, Filter};
use sluice_search::{Indexer, SearchConfig, SearchIndex, Workers};
use sluice_store::Store;

use crate::support;
use support::{open_store, write};

fn config(kinds: &[u16]) -> SearchConfig {
    SearchConfig {
        kinds: kinds.to_vec(),
        ..SearchConfig::default()
    }
}

/// Starts an indexer on the index in `dir`, lets it catch up with the
/// store and stops it (committing).
fn index_all(dir: &Path, store: &Store, kinds: &[u16]) -> std::sync::Arc<SearchIndex> {
    let index = SearchIndex::open(dir, config(kinds)).unwrap();
    let indexer = Indexer::start(index.clone(), store.clone(), Workers::One).unwrap();
    assert!(indexer.wait_caught_up(store.next_serial().unwrap()));
    indexer.stop();
    index
}

/// The serials a search finds.
fn found(index: &SearchIndex, search: &str) -> Vec<u64> {
    let f = Filter::parse(&format!(r#"{{"search": "{search}"}}"#)).unwrap();
    let mut serials: Vec<u64> = index
        .search(&index.searcher(), &f, None, 100)
        .unwrap()
        .iter()
        .map(|h| h.serial)
        .collect();
    serials.sort_unstable();
    serials
}

/// Rewrites the payload of the index's last commit (as an older build
/// wrote it).
fn set_payload(dir: &Path, payload: &str) {
    let path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    meta["payload"] = serde_json::Value::String(payload.to_owned());
    std::fs::write(&path, meta.to_string()).unwrap();
}

#[test]
fn an_index_of_an_older_tokeniser_is_rebuilt_and_one_of_this_version_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open_store(&tmp.path().join("store"));
    let idx = tmp.path().join("search");
    let events = [
        Event::sign(&[1; 32], 1_699_999_000, 1, vec![], "東京都に住む"),
        Event::sign(&[2; 32], 1_699_999_001, 0, vec![], r#"{"name":"黒猫"}"#),
        Event::sign(&[3; 32], 1_699_999_002, 1, vec![], "서울에서 만나요 nostr"),
    ];
    write(&store, &events);
    // Kind 0 not indexed at first.
    let index = index_all(&idx, &store, &[1]);
    assert_eq!(found(&index, "東京"), [1]);
    assert_eq!(found(&index, "京都"), [1]);
    assert_eq!(found(&index, "東"), [1]);
    assert_eq!(found(&index, "서울 nostr"), [3]);
    assert!(found(&index, "大阪").is_empty());
    assert!(found(&index, "猫").is_empty());
    assert_eq!(index.committed_serial().unwrap(), 3);
    drop(index);

    // This version's index is resumed: kind 0, now indexed, is not
    // indexed again for what was already covered.
    let index = index_all(&idx, &store, &[0, 1]);
    assert!(found(&index, "猫").is_empty(), "resumed, not rebuilt");
    drop(index);

    // The same index as an older build left it (payload: the serial
    // alone): rebuilt from the store, so kind 0 is found now.
    set_payload(&idx, "3");
    let index = index_all(&idx, &store, &[0, 1]);
    assert_eq!(found(&index, "猫"), [2], "rebuilt");
    assert_eq!(found(&index, "東京"), [1]);
    assert_eq!(index.committed_serial().unwrap(), 3);
    drop(index);

    // Another version named in the payload: rebuilt too.
    set_payload(&idx, "3 t1");
    let index = index_all(&idx, &store, &[1]);
    assert!(found(&index, "猫").is_empty(), "rebuilt with kind 1 only");
    assert_eq!(found(&index, "東京"), [1]);
}
