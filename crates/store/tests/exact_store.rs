//! Exact behaviour of the store's own surface (`lib.rs`, `serials.rs`,
//! `runtime_rules.rs`, `purge.rs`, the table statistics): error
//! classification, the options' defaults, the sizes `stats` and
//! `disk_space` report (checked against the file and the filesystem
//! measured here), `force_sync`, the export walk's chunks, `close`, the
//! schema check, the lock that refuses a second process while one is alone
//! in the map, and the serial and purge entry points.

use std::io::{Error as IoError, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use serde_json::json;
use sluice_proto::{Event, Readers};
use sluice_store::{
    DEFAULT_MAP_SIZE_BYTES, QueryOptions, SerialLookup, Store, StoreError, StoreOptions,
    StoreStats, WriteOutcome,
};

use crate::support;

use support::{ev, filter};

const NOW: u64 = 1_700_000_000;
const MAP_SIZE_BYTES: u64 = 64 << 20;

fn options() -> StoreOptions {
    StoreOptions {
        map_size_bytes: MAP_SIZE_BYTES,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: false,
        min_free_disk_bytes: 12_345,
    }
}

fn open(dir: &Path) -> Store {
    Store::open(dir, &options()).unwrap()
}

fn stored(out: &[WriteOutcome]) -> Vec<u64> {
    out.iter()
        .map(|o| match o {
            WriteOutcome::Stored { serial, .. } => *serial,
            other => panic!("not stored: {other:?}"),
        })
        .collect()
}

fn qopts() -> QueryOptions {
    QueryOptions {
        now: NOW,
        max_scan_rows: 1_000_000,
    }
}

/// `(available, total)` bytes of the filesystem holding `path`, measured
/// here with statvfs(3).
fn fs_space(path: &Path) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and writable memory of the right type.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    assert_eq!(rc, 0, "statvfs: {}", IoError::last_os_error());
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)]
    let frsize = st.f_frsize as u64;
    #[allow(clippy::unnecessary_cast)]
    (st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize)
}

// ---------------------------------------------------------------- errors

#[test]
fn disk_full_is_enospc_edquot_or_efbig_wherever_it_is_wrapped() {
    let full = [
        ErrorKind::StorageFull,
        ErrorKind::QuotaExceeded,
        ErrorKind::FileTooLarge,
    ];
    for kind in full {
        let e = StoreError::Io(IoError::from(kind));
        assert!(e.is_disk_full(), "{kind:?}");
        assert!(e.is_io());
        let e = StoreError::Lmdb(heed::Error::Io(IoError::from(kind)));
        assert!(e.is_disk_full(), "lmdb {kind:?}");
        assert!(e.is_io());
    }
    // The operating system's own codes.
    for code in [libc::ENOSPC, libc::EDQUOT, libc::EFBIG] {
        assert!(StoreError::Io(IoError::from_raw_os_error(code)).is_disk_full());
    }
    // Other I/O errors are I/O but not a full disk.
    for kind in [
        ErrorKind::Other,
        ErrorKind::PermissionDenied,
        ErrorKind::NotFound,
    ] {
        let e = StoreError::Io(IoError::from(kind));
        assert!(!e.is_disk_full(), "{kind:?}");
        assert!(e.is_io());
        let e = StoreError::Lmdb(heed::Error::Io(IoError::from(kind)));
        assert!(!e.is_disk_full(), "lmdb {kind:?}");
        assert!(e.is_io());
    }
    assert!(!StoreError::Io(IoError::from_raw_os_error(libc::EIO)).is_disk_full());
}

#[test]
fn errors_that_are_not_the_disk_are_neither_io_nor_disk_full() {
    let others = [
        StoreError::MapFull {
            map_size_bytes: 1 << 20,
        },
        StoreError::Corrupt {
            table: "events",
            detail: "x".into(),
        },
        StoreError::SchemaMismatch {
            path: "/x".into(),
            found: 2,
            expected: 1,
        },
        StoreError::Busy { path: "/x".into() },
        StoreError::Lmdb(heed::Error::Mdb(heed::MdbError::MapFull)),
        StoreError::Lmdb(heed::Error::Mdb(heed::MdbError::NotFound)),
        StoreError::Lmdb(heed::Error::EnvAlreadyOpened),
        StoreError::Open {
            path: "/x".into(),
            source: heed::Error::Mdb(heed::MdbError::Invalid),
        },
    ];
    for e in &others {
        assert!(!e.is_disk_full(), "{e:?}");
        assert!(!e.is_io(), "{e:?}");
    }
}

// --------------------------------------------------------------- options

#[test]
fn default_options_reserve_a_gib_of_free_disk_and_an_8_tib_map() {
    let d = StoreOptions::default();
    assert_eq!(d.min_free_disk_bytes, 1024 * 1024 * 1024);
    assert_eq!(d.map_size_bytes, 8 * 1024 * 1024 * 1024 * 1024);
    assert_eq!(DEFAULT_MAP_SIZE_BYTES, d.map_size_bytes);
    assert_eq!(d.max_readers, 126);
    assert!(!d.write_map && !d.write_map_when_alone);
}

// ----------------------------------------------------------------- stats

#[test]
fn map_fill_ratio_is_file_bytes_over_map_size() {
    let s = |file_bytes, map_size_bytes| StoreStats {
        map_size_bytes,
        file_bytes,
        ..StoreStats::default()
    };
    assert_eq!(s(50, 200).map_fill_ratio(), 0.25);
    assert_eq!(s(200, 200).map_fill_ratio(), 1.0);
    assert_eq!(s(0, 200).map_fill_ratio(), 0.0);
    assert_eq!(s(300, 200).map_fill_ratio(), 1.5);
    // No map: nothing to fill (not a division by zero).
    assert_eq!(s(50, 0).map_fill_ratio(), 0.0);
    assert_eq!(s(0, 0).map_fill_ratio(), 0.0);
}

#[test]
fn stats_report_the_map_the_file_the_pages_and_the_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let data = dir.path().join("data.mdb");
    let empty = store.stats().unwrap();
    assert_eq!(empty.map_size_bytes, MAP_SIZE_BYTES);
    assert_eq!(empty.events, 0);
    assert_eq!(empty.max_readers, 16);
    // The file of an ordinary store ends at its last page.
    assert_eq!(
        empty.file_bytes,
        std::fs::metadata(&data).unwrap().len(),
        "{empty:?}"
    );
    let events: Vec<Event> = (0..300)
        .map(|i| {
            ev(
                1,
                NOW - 1000 + i,
                1,
                &[],
                &format!("{i:04} {}", "x".repeat(1000)),
            )
        })
        .collect();
    store.write_batch(&events, NOW).unwrap();
    let full = store.stats().unwrap();
    assert_eq!(full.events, 300);
    assert_eq!(
        full.file_bytes,
        std::fs::metadata(&data).unwrap().len(),
        "{full:?}"
    );
    // 300 KB of JSON is in pages that hold data, which the file holds.
    let raw: u64 = events.iter().map(|e| e.raw().len() as u64).sum();
    assert!(full.used_bytes >= raw, "{full:?}, {raw} bytes of JSON");
    assert!(full.used_bytes <= full.file_bytes, "{full:?}");
    assert!(full.used_bytes > empty.used_bytes);
    assert_eq!(full.used_bytes, store.used_bytes().unwrap());
    // A read transaction held elsewhere is a reader in use.
    assert!(full.readers_in_use <= full.max_readers);
}

#[test]
fn used_bytes_counts_every_tables_pages() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let before = store.used_bytes().unwrap();
    // Many small events: the index tables grow as much as `events`.
    let events: Vec<Event> = (0..2000)
        .map(|i| ev((i % 50) as u8 + 1, NOW - 5000 + i, 1, &[&["t", "tag"]], "s"))
        .collect();
    store.write_batch(&events, NOW).unwrap();
    let after = store.used_bytes().unwrap();
    // Each event has a value (~300 bytes) and six index entries (~50
    // bytes each): far more than a few pages.
    let raw: u64 = events.iter().map(|e| e.raw().len() as u64).sum();
    assert!(after - before >= raw, "{before} -> {after}, {raw} of JSON");
}

// ------------------------------------------------------------ disk space

#[test]
fn disk_space_is_the_filesystems_free_and_total_space_and_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let got = store.disk_space().unwrap();
    let (free, total) = fs_space(dir.path());
    assert_eq!(got.total_bytes, total);
    assert_eq!(got.min_free_bytes, 12_345);
    assert!(got.free_bytes <= got.total_bytes);
    // Free space moves with other writers: the same within a GiB or 5%.
    let slack = (free / 20).max(1 << 30);
    assert!(
        got.free_bytes.abs_diff(free) <= slack,
        "store says {} free, statvfs {free}",
        got.free_bytes
    );
    // A filesystem that holds a store has a page to spare.
    assert!(got.free_bytes > 4096 && got.total_bytes > 4096);
}

// ------------------------------------------------------------- force_sync

#[repr(C)]
#[derive(Default, Debug)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default, Debug)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Dirty and under-writeback pages of `file` in the page cache
/// (cachestat(2), Linux 6.5); `None` where the kernel lacks it.
fn unsynced_pages(file: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = CachestatRange::default();
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `cs`, both of the kernel's
    // layout, on a descriptor `file` keeps open.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if rc != 0 {
        let e = IoError::last_os_error();
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)),
            "cachestat: {e}"
        );
        return None;
    }
    Some(cs.nr_dirty + cs.nr_writeback)
}

#[test]
fn force_sync_writes_the_files_dirty_pages_to_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store
        .write_batch(&[ev(1, NOW - 10, 1, &[], "synced")], NOW)
        .unwrap();
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(dir.path().join("data.mdb"))
        .unwrap();
    // Dirty the file's first page without changing it: its own bytes
    // written back over it.
    let mut page = vec![0u8; 4096];
    file.read_exact_at(&mut page, 0).unwrap();
    let mut dirtied = false;
    for _ in 0..100 {
        file.write_all_at(&page, 0).unwrap();
        match unsynced_pages(&file) {
            None => {
                eprintln!("cachestat(2) unavailable: force_sync not checked");
                return;
            }
            Some(n) if n > 0 => {
                dirtied = true;
                break;
            }
            // Written back already: dirty it again.
            Some(_) => {}
        }
    }
    assert!(dirtied, "the page written never showed dirty");
    store.force_sync().unwrap();
    assert_eq!(unsynced_pages(&file), Some(0));
    // The store is unchanged.
    assert_eq!(store.stats().unwrap().events, 1);
}

// ------------------------------------------------------------ for_each_raw

#[test]
fn for_each_raw_walks_every_chunk_in_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // 2 chunks of 1024 and a bit, and one expired event.
    let n = 2 * 1024 + 7;
    let events: Vec<Event> = (0..n)
        .map(|i| ev((i % 7) as u8 + 1, NOW - 10_000 + i as u64, 1, &[], "e"))
        .collect();
    store.write_batch(&events, NOW).unwrap();
    let expiring = ev(
        9,
        NOW - 20_000,
        1,
        &[&["expiration", &(NOW + 10).to_string()]],
        "",
    );
    store.write_batch([&expiring], NOW).unwrap();
    let mut seen = Vec::new();
    let got = store
        .for_each_raw(0, u64::MAX, NOW, |raw| {
            seen.push(raw.to_string());
            Ok(())
        })
        .unwrap();
    let mut want = vec![expiring.raw().to_string()];
    want.extend(events.iter().map(|e| e.raw().to_string()));
    assert_eq!(got, want.len() as u64);
    assert_eq!(seen, want);
    // Exactly one chunk's worth.
    let mut seen = 0;
    let got = store
        .for_each_raw(NOW - 10_000, NOW - 10_000 + 1023, NOW + 10, |_| {
            seen += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!((got, seen), (1024, 1024));
}

/// The walk ends with its last, short chunk: an event written while the
/// walk hands that chunk out is not read.
#[test]
fn for_each_raw_ends_after_a_short_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let first = ev(1, NOW - 100, 1, &[], "first");
    let second = ev(1, NOW - 50, 1, &[], "second");
    store.write_batch([&first, &second], NOW).unwrap();
    let later = ev(2, NOW - 10, 1, &[], "written during the walk");
    let writer = store.clone();
    let mut seen = Vec::new();
    let got = store
        .for_each_raw(0, u64::MAX, NOW, |raw| {
            if seen.is_empty() {
                writer.write_batch([&later], NOW).unwrap();
            }
            seen.push(raw.to_string());
            Ok(())
        })
        .unwrap();
    assert_eq!(got, 2);
    assert_eq!(
        seen,
        vec![first.raw().to_string(), second.raw().to_string()]
    );
    assert_eq!(store.stats().unwrap().events, 3);
}

// ------------------------------------------------------------------ close

/// `close` returns only once every clone is gone.
#[test]
fn close_waits_for_the_other_clones() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let clone = store.clone();
    let closed = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(2));
    let closer = {
        let closed = closed.clone();
        let started = started.clone();
        std::thread::spawn(move || {
            started.wait();
            store.close();
            closed.store(true, Ordering::SeqCst);
        })
    };
    started.wait();
    // The clone is in use while `close` waits.
    for i in 0..40 {
        clone
            .write_batch([&ev(1, NOW - 100 + i, 1, &[], "while closing")], NOW)
            .unwrap();
        assert_eq!(
            clone
                .query(&[filter(json!({"kinds": [1]}))], &qopts())
                .unwrap()
                .events
                .len() as u64,
            i + 1
        );
        assert!(
            !closed.load(Ordering::SeqCst),
            "close returned while a clone is open"
        );
    }
    drop(clone);
    closer.join().unwrap();
    assert!(closed.load(Ordering::SeqCst));
    // Closed: the directory opens again in this process.
    let again = open(dir.path());
    assert_eq!(again.stats().unwrap().events, 40);
}

// ----------------------------------------------------------------- schema

fn set_schema_version(dir: &Path, version: u64) {
    support::raw_put(dir, "meta", b"schema_version", &version.to_be_bytes());
}

#[test]
fn a_store_of_another_schema_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).close();
    set_schema_version(dir.path(), 2);
    match Store::open(dir.path(), &options()) {
        Err(StoreError::SchemaMismatch {
            found, expected, ..
        }) => assert_eq!((found, expected), (2, 1)),
        Err(other) => panic!("expected a schema mismatch, got {other}"),
        Ok(_) => panic!("a store of schema 2 opened"),
    }
    set_schema_version(dir.path(), 1);
    open(dir.path()).close();
}

// ------------------------------------------------------------------ locks

#[test]
fn a_store_held_alone_is_busy_for_everyone_else() {
    let dir = tempfile::tempdir().unwrap();
    let alone = Store::open(
        dir.path(),
        &StoreOptions {
            write_map_when_alone: true,
            ..options()
        },
    )
    .unwrap();
    if !alone.is_alone() {
        eprintln!("this filesystem cannot hold the reserve: the lock is not checked");
        return;
    }
    for want_alone in [false, true] {
        let opts = StoreOptions {
            write_map_when_alone: want_alone,
            ..options()
        };
        match Store::open(dir.path(), &opts) {
            Err(StoreError::Busy { path }) => assert_eq!(path, dir.path().display().to_string()),
            Err(other) => panic!("expected Busy, got {other}"),
            Ok(_) => panic!("opened a store held alone"),
        }
    }
    alone.close();
    // Released: an ordinary open, then another beside it, then a second
    // process that asks to be alone gets a shared open.
    let first = open(dir.path());
    assert!(!first.is_alone());
    first.close();
}

// ---------------------------------------------------------------- serials

#[test]
fn serials_count_from_one_and_events_after_pages_through_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.next_serial().unwrap(), 1);
    assert!(store.events_after(0, 10).unwrap().is_empty());
    let events: Vec<Event> = (0..4)
        .map(|i| ev(1, NOW - 100 + i, 1, &[], &format!("n{i}")))
        .collect();
    let serials = stored(&store.write_batch(&events, NOW).unwrap());
    assert_eq!(serials, vec![1, 2, 3, 4]);
    assert_eq!(store.next_serial().unwrap(), 5);
    let all: Vec<(u64, String)> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (i as u64 + 1, e.raw().to_string()))
        .collect();
    assert_eq!(store.events_after(0, 10).unwrap(), all);
    assert_eq!(store.events_after(0, 4).unwrap(), all);
    assert_eq!(store.events_after(0, 2).unwrap(), all[..2].to_vec());
    assert_eq!(store.events_after(2, 10).unwrap(), all[2..].to_vec());
    assert_eq!(store.events_after(1, 1).unwrap(), all[1..2].to_vec());
    assert!(store.events_after(4, 10).unwrap().is_empty());
    assert!(store.events_after(0, 0).unwrap().is_empty());
    // A removed serial is skipped; the next serial never goes back.
    assert_eq!(store.purge_events(&[events[1].id]).unwrap(), 1);
    assert_eq!(
        store.events_after(0, 10).unwrap(),
        vec![all[0].clone(), all[2].clone(), all[3].clone()]
    );
    assert_eq!(store.next_serial().unwrap(), 5);
}

#[test]
fn lookup_serials_tells_gone_from_no_match_from_match() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let reader = ev(3, 0, 1, &[], "").pubkey;
    let tagged = ev(1, NOW - 30, 1, &[&["t", "rust"]], "tagged");
    let plain = ev(1, NOW - 20, 1, &[], "plain");
    let dm = ev(2, NOW - 10, 4, &[], "private, to nobody");
    let serials = stored(&store.write_batch([&tagged, &plain, &dm], NOW).unwrap());
    let gone = 99;
    let lookup = |f: serde_json::Value, readers: Option<&Readers>| {
        let mut s = serials.clone();
        s.push(gone);
        store
            .lookup_serials(&s, &filter(f), &qopts(), readers)
            .unwrap()
    };
    let hit = |e: &Event| SerialLookup::Match {
        created_at: e.created_at,
        raw: e.raw().to_string(),
    };
    use SerialLookup::{Gone, NoMatch};
    assert_eq!(
        lookup(json!({}), None),
        vec![hit(&tagged), hit(&plain), hit(&dm), Gone]
    );
    // The header decides (kind), then the tags (parsed).
    assert_eq!(
        lookup(json!({"kinds": [1]}), None),
        vec![hit(&tagged), hit(&plain), NoMatch, Gone]
    );
    assert_eq!(
        lookup(json!({"#t": ["rust"]}), None),
        vec![hit(&tagged), NoMatch, NoMatch, Gone]
    );
    // A private kind is for its author and recipients only.
    let readers = Readers::new(vec![4], vec![reader]);
    assert_eq!(
        lookup(json!({}), Some(&readers)),
        vec![hit(&tagged), hit(&plain), NoMatch, Gone]
    );
    let author = Readers::new(vec![4], vec![dm.pubkey]);
    assert_eq!(
        lookup(json!({"kinds": [4]}), Some(&author)),
        vec![NoMatch, NoMatch, hit(&dm), Gone]
    );
    // Expired at `now`: no match.
    let expiring = ev(
        1,
        NOW - 5,
        1,
        &[&["expiration", &(NOW + 5).to_string()]],
        "",
    );
    let s = stored(&store.write_batch([&expiring], NOW).unwrap());
    let later = QueryOptions {
        now: NOW + 5,
        ..qopts()
    };
    assert_eq!(
        store
            .lookup_serials(&s, &filter(json!({})), &later, None)
            .unwrap(),
        vec![NoMatch]
    );
}

// ---------------------------------------------------------------- purges

#[test]
fn purge_events_removes_those_there_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let events: Vec<Event> = (0..4)
        .map(|i| ev(1, NOW - 100 + i, 1, &[&["t", "x"]], &format!("n{i}")))
        .collect();
    store.write_batch(&events, NOW).unwrap();
    let missing = ev(2, NOW, 1, &[], "never stored").id;
    assert_eq!(
        store
            .purge_events(&[events[0].id, missing, events[2].id])
            .unwrap(),
        2
    );
    assert_eq!(store.purge_events(&[missing]).unwrap(), 0);
    assert_eq!(store.purge_events(&[]).unwrap(), 0);
    assert_eq!(store.stats().unwrap().events, 2);
    let left = store
        .query(&[filter(json!({"#t": ["x"]}))], &qopts())
        .unwrap();
    assert_eq!(
        left.events,
        vec![events[3].raw().to_string(), events[1].raw().to_string()]
    );
    // Their index entries went with them.
    assert_eq!(left.rows_scanned, 2);
    assert_eq!(
        store.contains_ids([&events[0].id, &events[1].id]).unwrap(),
        vec![false, true]
    );
    assert_eq!(
        store.purge_events(&[events[1].id, events[3].id]).unwrap(),
        2
    );
    assert_eq!(store.stats().unwrap().events, 0);
}

// ---------------------------------------------------------- authors_after

#[test]
fn authors_after_lists_each_author_once_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert!(store.authors_after(None, 10).unwrap().is_empty());
    let mut events = Vec::new();
    for key in [5u8, 2, 9] {
        for i in 0..3 {
            events.push(ev(key, NOW - 100 + i, 1, &[], &format!("{key} {i}")));
        }
    }
    store.write_batch(&events, NOW).unwrap();
    let mut authors: Vec<[u8; 32]> = events.iter().map(|e| e.pubkey).collect();
    authors.sort();
    authors.dedup();
    assert_eq!(authors.len(), 3);
    assert_eq!(store.authors_after(None, 10).unwrap(), authors);
    assert_eq!(store.authors_after(None, 2).unwrap(), authors[..2].to_vec());
    assert_eq!(
        store.authors_after(Some(&authors[0]), 10).unwrap(),
        authors[1..].to_vec()
    );
    assert!(
        store
            .authors_after(Some(&authors[2]), 10)
            .unwrap()
            .is_empty()
    );
}
