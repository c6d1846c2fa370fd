//! A store written alone in the map (`write_map_when_alone`): the reserve
//! allocated ahead of its last page when it opens, the batch size derived
//! from it, and the file cut back to its last page when it closes, each
//! checked against the file's size and the filesystem measured here.

use std::path::Path;

use sluice_proto::Event;
use sluice_store::{Store, StoreOptions};

const NOW: u64 = 1_700_000_000;
/// Smaller than any reserve (at least 2 × 16 MiB are allocated past the
/// last page), so the file's size after opening is the reserve's end.
const MAP_SIZE_BYTES: u64 = 32 << 20;
const MIN_RESERVE: u64 = 16 << 20;
const MAX_RESERVE: u64 = 1 << 30;

fn options(alone: bool) -> StoreOptions {
    StoreOptions {
        map_size_bytes: MAP_SIZE_BYTES,
        max_readers: 16,
        write_map: false,
        write_map_when_alone: alone,
        min_free_disk_bytes: 0,
    }
}

fn ev(key: u8, created_at: u64, content: &str) -> Event {
    Event::sign(&[key; 32], created_at, 1, vec![], content)
}

fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and writable memory of the right type.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) }, 0);
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)]
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    free
}

fn data_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("data.mdb")).unwrap().len()
}

/// A store of a few hundred KiB written as usual, then closed: its file
/// ends at its last page. Returns that size.
fn prepare(dir: &Path) -> u64 {
    let store = Store::open(dir, &options(false)).unwrap();
    let events: Vec<Event> = (0..200)
        .map(|i| ev(1, NOW - 1000 + i, &format!("{i} {}", "y".repeat(900))))
        .collect();
    store.write_batch(&events, NOW).unwrap();
    let end = store.stats().unwrap().file_bytes;
    store.close();
    assert_eq!(data_len(dir), end);
    end
}

/// Opens alone, or says why the test cannot run here.
fn open_alone(dir: &Path) -> Option<Store> {
    let store = Store::open(dir, &options(true)).unwrap();
    if store.is_alone() {
        Some(store)
    } else {
        eprintln!("this filesystem cannot hold the reserve: not checked");
        None
    }
}

#[test]
fn an_ordinary_store_has_no_batch_size() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &options(false)).unwrap();
    assert!(!store.is_alone());
    assert_eq!(store.alone_batch_bytes(), None);
}

/// The reserve is a quarter of the free space (16 MiB to 1 GiB), a batch
/// a quarter of the reserve; the file reaches twice the reserve past the
/// last page when the store opens, and is cut back to the last page when
/// it closes.
#[test]
fn the_reserve_follows_the_last_page_and_the_free_space() {
    let dir = tempfile::tempdir().unwrap();
    let end = prepare(dir.path());
    let free_before = free_bytes(dir.path());
    let Some(store) = open_alone(dir.path()) else {
        return;
    };
    let batch = store.alone_batch_bytes().unwrap();
    let reserve = 4 * batch;
    assert!(
        (MIN_RESERVE..=MAX_RESERVE).contains(&reserve),
        "batch {batch} bytes"
    );
    // A quarter of what was free when it opened, within the bounds (other
    // writers move the free space a little).
    let want = (free_before / 4).clamp(MIN_RESERVE, MAX_RESERVE);
    assert!(
        reserve.abs_diff(want) <= (want / 20).max(1 << 20),
        "reserve {reserve}, a quarter of the free space {want}"
    );
    // Nothing was written yet: the file is the old store and the reserve
    // allocated twice over past its last page.
    assert_eq!(store.stats().unwrap().file_bytes, end);
    assert_eq!(data_len(dir.path()), end + 2 * reserve);
    // More events: the file ends where the last commit left it.
    let events: Vec<Event> = (0..100)
        .map(|i| ev(2, NOW - 500 + i, &format!("{i} {}", "z".repeat(2000))))
        .collect();
    store.write_batch(&events, NOW).unwrap();
    let last = store.stats().unwrap().file_bytes;
    assert!(last > end);
    store.close();
    assert_eq!(data_len(dir.path()), last);
    // And reads as an ordinary store.
    let store = Store::open(dir.path(), &options(false)).unwrap();
    assert_eq!(store.stats().unwrap().events, 300);
    assert_eq!(store.stats().unwrap().file_bytes, last);
}

#[test]
fn a_new_store_written_alone_is_cut_to_its_last_page() {
    let dir = tempfile::tempdir().unwrap();
    let Some(store) = open_alone(dir.path()) else {
        return;
    };
    assert!(store.writes_in_map());
    store
        .write_batch([&ev(1, NOW - 10, "one event")], NOW)
        .unwrap();
    let last = store.stats().unwrap().file_bytes;
    store.close();
    assert_eq!(data_len(dir.path()), last);
    let store = Store::open(dir.path(), &options(false)).unwrap();
    assert_eq!(store.stats().unwrap().events, 1);
}
