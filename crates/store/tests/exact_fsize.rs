//! `write_map_when_alone` under a file size limit (`RLIMIT_FSIZE`): a map
//! larger than the limit is never written in (the file would be as large
//! as the map), a map within it is.
//!
//! The limit is the process's: this file holds one test, so no other test
//! writes under it.

use std::path::Path;

use sluice_store::{Store, StoreOptions};

const GIB: u64 = 1 << 30;

fn options(map_size_bytes: u64, write_map: bool, write_map_when_alone: bool) -> StoreOptions {
    StoreOptions {
        map_size_bytes,
        max_readers: 16,
        write_map,
        write_map_when_alone,
        min_free_disk_bytes: 0,
    }
}

fn rlimit_fsize() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) }, 0);
    lim
}

fn set_rlimit_fsize(lim: &libc::rlimit) {
    // SAFETY: setrlimit reads the struct passed.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// Opens `dir` asking to be alone; whether it is, and whether it writes in
/// the map.
fn alone(dir: &Path, map_size_bytes: u64) -> (bool, bool) {
    let store = Store::open(dir, &options(map_size_bytes, false, true)).unwrap();
    let got = (store.is_alone(), store.writes_in_map());
    store.close();
    got
}

#[test]
fn a_map_larger_than_the_file_size_limit_is_not_written_in() {
    let saved = rlimit_fsize();
    if saved.rlim_max != libc::RLIM_INFINITY && saved.rlim_max < 4 * GIB {
        eprintln!("hard file size limit {}: not checked", saved.rlim_max);
        return;
    }
    // A file that outgrows the limit is EFBIG, not a signal.
    // SAFETY: ignoring SIGXFSZ installs no handler.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };

    // Under no limit: alone (where the filesystem holds the reserve).
    let probe = tempfile::tempdir().unwrap();
    let (unlimited, _) = alone(probe.path(), 64 << 20);
    if !unlimited {
        eprintln!("this filesystem cannot hold the reserve: not checked");
        return;
    }
    // A store whose file is already the size of an 8 GiB map (written in
    // the map by `write_map`, which sizes the file to the map, sparse),
    // so that writing in the map again would not grow it.
    let big = tempfile::tempdir().unwrap();
    Store::open(big.path(), &options(8 * GIB, true, false))
        .unwrap()
        .close();
    let len = std::fs::metadata(big.path().join("data.mdb"))
        .unwrap()
        .len();
    assert_eq!(len, 8 * GIB);

    set_rlimit_fsize(&libc::rlimit {
        rlim_cur: 4 * GIB,
        rlim_max: saved.rlim_max,
    });
    // The map is twice the limit: opened as usual.
    let over = alone(big.path(), 8 * GIB);
    // A map within the limit: alone, in the map.
    let fresh = tempfile::tempdir().unwrap();
    let within = alone(fresh.path(), 64 << 20);
    // The limit exactly.
    let exact = tempfile::tempdir().unwrap();
    let at_limit = alone(exact.path(), 4 * GIB);
    set_rlimit_fsize(&saved);

    assert_eq!(over, (false, false), "8 GiB map under a 4 GiB limit");
    assert_eq!(within, (true, true), "64 MiB map under a 4 GiB limit");
    assert_eq!(at_limit, (true, true), "4 GiB map under a 4 GiB limit");
}
