//! `Store::compact_to`: a compacted copy opens as a store with the same
//! events, leaves out the pages freed by deletions, and never overwrites.

use sluice_proto::{Event, Filter};
use sluice_store::{QueryOptions, Store, StoreError, StoreOptions};

const NOW: u64 = 1_700_000_000;

fn opts() -> StoreOptions {
    StoreOptions {
        map_size_bytes: 64 << 20,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 0,
    }
}

fn all_ids(store: &Store) -> Vec<String> {
    let f = Filter::parse("{}").unwrap();
    let q = QueryOptions {
        now: NOW,
        max_scan_rows: u64::MAX,
    };
    let mut ids: Vec<String> = store
        .query(&[f], &q)
        .unwrap()
        .events
        .iter()
        .map(|raw| Event::parse(raw).unwrap().id_hex())
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_compacted_copy_holds_the_same_events_in_less_space() {
    let src = tempfile::tempdir().unwrap();
    let store = Store::open(src.path(), &opts()).unwrap();
    let events: Vec<Event> = (0..400u64)
        .map(|i| Event::sign(&[3; 32], NOW - 1000 + i, 1, vec![], &"x".repeat(500)))
        .collect();
    store.write_batch(events.iter(), NOW).unwrap();
    for e in &events[..350] {
        assert!(store.purge_event(&e.id).unwrap());
    }
    let kept = all_ids(&store);
    assert_eq!(kept.len(), 50);

    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("copy");
    let size = store.compact_to(&dir).unwrap();
    let source = std::fs::metadata(src.path().join("data.mdb"))
        .unwrap()
        .len();
    assert_eq!(size, std::fs::metadata(dir.join("data.mdb")).unwrap().len());
    assert!(size < source, "copy {size} bytes, source {source}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("data.mdb"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    // Never over an existing copy; the one there is left as it was.
    match store.compact_to(&dir) {
        Err(StoreError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists),
        other => panic!("{other:?}"),
    }
    assert_eq!(size, std::fs::metadata(dir.join("data.mdb")).unwrap().len());
    store.close();

    let copy = Store::open(&dir, &opts()).unwrap();
    assert_eq!(all_ids(&copy), kept);
}
