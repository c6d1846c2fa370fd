//! The lock, the file size limit and the reserve's arithmetic, on a plain
//! file standing in for `data.mdb`.

use std::os::unix::fs::MetadataExt;

use super::*;

const M: u64 = 64 << 10;

/// A reserve of `min_ahead` over an empty `data.mdb` in `dir`.
fn reserve(dir: &Path, min_ahead: u64) -> Reserve {
    let data = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("data.mdb"))
        .unwrap();
    let (lock, alone) = lock(dir, true).unwrap().unwrap();
    assert!(alone);
    Reserve {
        _lock: lock,
        data,
        min_ahead,
        state: Mutex::new(ReserveState::default()),
    }
}

fn state(r: &Reserve) -> (u64, u64, u64, u64) {
    let st = r.state.lock();
    (st.allocated, st.last_end, st.max_growth, st.trim_to)
}

fn file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("data.mdb")).unwrap().len()
}

#[test]
fn the_lock_is_exclusive_for_one_alone_and_shared_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (first, alone) = lock(d, true).unwrap().unwrap();
    assert!(alone);
    // Held alone: nobody else, shared or alone.
    assert!(matches!(lock(d, false), Ok(None)));
    assert!(matches!(lock(d, true), Ok(None)));
    drop(first);
    // Shared by several; one asking to be alone shares it.
    let (a, alone_a) = lock(d, false).unwrap().unwrap();
    let (b, alone_b) = lock(d, false).unwrap().unwrap();
    let (c, alone_c) = lock(d, true).unwrap().unwrap();
    assert_eq!((alone_a, alone_b, alone_c), (false, false, false));
    drop((a, b, c));
    assert!(matches!(lock(d, true), Ok(Some((_, true)))));
}

#[test]
fn flock_says_false_on_a_conflict_and_errs_on_a_bad_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap()
    };
    let (a, b) = (open(), open());
    assert!(flock(&a, libc::LOCK_EX | libc::LOCK_NB).unwrap());
    assert!(!flock(&b, libc::LOCK_SH | libc::LOCK_NB).unwrap());
    assert!(!flock(&b, libc::LOCK_EX | libc::LOCK_NB).unwrap());
    // Not an operation flock knows: an error, not a conflict.
    let err = flock(&b, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    assert!(flock(&a, libc::LOCK_UN).unwrap());
    assert!(flock(&b, libc::LOCK_SH | libc::LOCK_NB).unwrap());
}

#[test]
fn file_size_limit_is_the_soft_rlimit_fsize_when_set() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) }, 0);
    let want = (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur);
    assert_eq!(file_size_limit(), want);
}

#[test]
fn the_reserve_is_a_quarter_of_the_free_space_within_16_mib_and_1_gib() {
    assert_eq!(MIN_RESERVE_BYTES, (16 * 1024 * 1024, 1024 * 1024 * 1024));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.mdb"), b"").unwrap();
    let (lock, _) = lock(dir.path(), true).unwrap().unwrap();
    let r = Reserve::new(lock, dir.path()).unwrap();
    let (free, _) = crate::statvfs(dir.path()).unwrap();
    let want = (free / 4).clamp(MIN_RESERVE_BYTES.0, MIN_RESERVE_BYTES.1);
    assert!(
        r.min_ahead().abs_diff(want) <= (want / 20).max(1 << 20),
        "{} / {want}",
        r.min_ahead()
    );
    assert!((MIN_RESERVE_BYTES.0..=MIN_RESERVE_BYTES.1).contains(&r.min_ahead()));
}

#[test]
fn ensure_keeps_the_largest_of_the_reserve_the_growth_and_the_batch_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let r = reserve(d, M);
    assert_eq!(r.min_ahead(), M);
    // First call: no growth known; twice the reserve allocated past
    // the end (fallocate sizes the file to it).
    r.ensure(8192, 0).unwrap();
    assert_eq!(state(&r), (8192 + 2 * M, 8192, 0, 8192));
    assert_eq!(file_len(d), 8192 + 2 * M);
    let blocks = std::fs::metadata(d.join("data.mdb")).unwrap().blocks() * 512;
    assert!(blocks >= 2 * M, "{blocks} bytes allocated");
    // A small growth: still inside what is allocated.
    r.ensure(8192 + 4096, 0).unwrap();
    assert_eq!(state(&r), (8192 + 2 * M, 8192 + 4096, 4096, 8192 + 4096));
    assert_eq!(file_len(d), 8192 + 2 * M);
    // A growth of more than a quarter of the reserve: four times it.
    let end = 8192 + 100_000;
    r.ensure(end, 0).unwrap();
    let growth = end - (8192 + 4096);
    let want = end + 4 * growth;
    assert_eq!(state(&r), (want + 4 * growth, end, growth, end));
    assert_eq!(file_len(d), want + 4 * growth);
    // No growth: the largest seen is kept.
    r.ensure(end, 0).unwrap();
    assert_eq!(state(&r), (want + 4 * growth, end, growth, end));
    // A large batch next: four times its bytes.
    r.ensure(end, 1_000_000).unwrap();
    assert_eq!(state(&r).0, end + 8_000_000);
    assert_eq!(file_len(d), end + 8_000_000);
    // A commit that left the end lower: the cut follows it, and what
    // is allocated stays.
    r.committed_at(end - 4096);
    r.ensure(end - 4096, 0).unwrap();
    assert_eq!(state(&r), (end + 8_000_000, end - 4096, growth, end - 4096));
}

#[test]
fn dropping_the_reserve_cuts_the_file_at_the_last_commit_only_once_known() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Nothing committed yet: the file is left as it is.
    let r = reserve(d, M);
    std::fs::write(d.join("data.mdb"), vec![7u8; 10_000]).unwrap();
    drop(r);
    assert_eq!(file_len(d), 10_000);
    // Cut at the last commit, whatever was allocated past it.
    let r = reserve(d, M);
    r.ensure(8192, 0).unwrap();
    assert_eq!(file_len(d), 8192 + 2 * M);
    r.committed_at(4096);
    drop(r);
    assert_eq!(file_len(d), 4096);
}
