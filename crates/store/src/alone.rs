//! Who else has the store open, and writing in the map when nobody does.
//!
//! Every process that opens a store holds an advisory lock on
//! `sluice.lock` in its directory: shared for an ordinary open (the relay,
//! an import beside it, export, compact), exclusive for an open that asked
//! to write in the map when it is alone ([`crate::StoreOptions::write_map_when_alone`],
//! `sluice import`). LMDB forbids mixing `MDB_WRITEMAP` and ordinary
//! processes on one environment, so the exclusive holder is the only
//! process that may use it, and an ordinary open while it runs is refused
//! with [`crate::StoreError::Busy`].
//!
//! With `MDB_WRITEMAP` LMDB sizes `data.mdb` to the whole map (sparse) and
//! writes pages straight into the mapping. A page written into a hole
//! when the disk is full is a SIGBUS, not an error. [`Reserve`] keeps the
//! blocks ahead of the store's last page allocated (fallocate) before each
//! write transaction: a quarter of the free space at open (16 MiB to 1 GiB),
//! at least four times the most one transaction has grown the file so far,
//! and four times the event bytes the next one adds (an import's batches
//! are at most a quarter of the least reserve). What remains is a transaction that outgrows its reserve while
//! another program takes the disk's last blocks: that is a SIGBUS, which
//! is why only the import, never the relay, writes in the map by default. When the filesystem cannot give
//! them, the transaction is not begun and the write fails with `ENOSPC`
//! ([`crate::StoreError::is_disk_full`]). When the store closes, the file
//! is cut back to its last page, so what is left is an ordinary store.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Mutex;

/// The lock file's name in the store's directory.
pub const LOCK_FILE: &str = "sluice.lock";

/// Blocks kept allocated ahead of the last page, at least: a quarter of
/// the filesystem's free space when the store opens, within these bounds.
const MIN_RESERVE_BYTES: (u64, u64) = (16 << 20, 1 << 30);
/// The reserve is this many times the largest growth of one transaction,
/// and of the event bytes the next one adds.
const GROWTH_FACTOR: u64 = 4;
/// A bulk batch adds at most this fraction of the least reserve.
pub(crate) const BATCH_SHARE: u64 = 4;

/// How the store was opened, held for its lifetime.
pub(crate) enum Hold {
    /// Shared with other ordinary processes.
    Shared(#[allow(dead_code)] File),
    /// This process alone, writing in the map.
    Alone(Reserve),
}

/// Takes the store's lock: exclusive if `want_alone` and nobody else has
/// it open, otherwise shared. `Ok(None)` from the shared attempt means an
/// exclusive holder (an import writing in the map) has it.
pub(crate) fn lock(dir: &Path, want_alone: bool) -> std::io::Result<Option<(File, bool)>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK_FILE))?;
    if want_alone && flock(&file, libc::LOCK_EX | libc::LOCK_NB)? {
        return Ok(Some((file, true)));
    }
    if flock(&file, libc::LOCK_SH | libc::LOCK_NB)? {
        return Ok(Some((file, false)));
    }
    Ok(None)
}

/// `flock`; `Ok(false)` when another holder's lock conflicts.
fn flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on a file descriptor this `File` owns and keeps open.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// The soft `RLIMIT_FSIZE`, when one is set: `MDB_WRITEMAP` sizes the file
/// to the whole map, so a map larger than this cannot be written in.
pub(crate) fn file_size_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// The blocks allocated ahead of the last page of an environment written
/// in the map, and the exclusive lock.
pub(crate) struct Reserve {
    _lock: File,
    data: File,
    /// The least kept ahead (see [`MIN_RESERVE_BYTES`]).
    min_ahead: u64,
    state: Mutex<ReserveState>,
}

#[derive(Default)]
struct ReserveState {
    /// Bytes from the file's start known to be allocated.
    allocated: u64,
    /// End of the last page when the previous transaction began.
    last_end: u64,
    /// Largest growth of the end between two transactions.
    max_growth: u64,
    /// Where to cut the file when the store closes: the end after the
    /// last commit.
    trim_to: u64,
}

impl Reserve {
    pub(crate) fn new(lock: File, dir: &Path) -> std::io::Result<Reserve> {
        let data = OpenOptions::new().write(true).open(dir.join("data.mdb"))?;
        let (free, _) = crate::statvfs(dir)?;
        Ok(Reserve {
            _lock: lock,
            data,
            min_ahead: (free / 4).clamp(MIN_RESERVE_BYTES.0, MIN_RESERVE_BYTES.1),
            state: Mutex::new(ReserveState::default()),
        })
    }

    /// The least kept ahead of the last page.
    pub(crate) fn min_ahead(&self) -> u64 {
        self.min_ahead
    }

    /// Makes sure the blocks from the last page `end` (bytes) on are
    /// allocated far enough for the next transaction, which adds about
    /// `adding` bytes of events. Called before every write transaction, on
    /// the one writing thread.
    pub(crate) fn ensure(&self, end: u64, adding: u64) -> std::io::Result<()> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.last_end != 0 {
            st.max_growth = st.max_growth.max(end.saturating_sub(st.last_end));
        }
        st.last_end = end;
        st.trim_to = st.trim_to.max(end);
        let ahead = self
            .min_ahead
            .max(GROWTH_FACTOR.saturating_mul(st.max_growth))
            .max(GROWTH_FACTOR.saturating_mul(adding));
        let want = end.saturating_add(ahead);
        if st.allocated >= want {
            return Ok(());
        }
        // Allocate a step past what is wanted, so this runs rarely.
        let from = st.allocated.max(end);
        let to = want.saturating_add(ahead);
        fallocate(&self.data, from, to - from)?;
        st.allocated = to;
        Ok(())
    }

    /// Records the end of the last page after a commit: where the file is
    /// cut when the store closes.
    pub(crate) fn committed_at(&self, end: u64) {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.trim_to = end;
    }
}

impl Drop for Reserve {
    /// Runs after the environment closed (it is the store's last field):
    /// the sparse tail and the reserve are cut off, under the lock.
    fn drop(&mut self) {
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.trim_to > 0
            && let Err(e) = self.data.set_len(st.trim_to)
        {
            tracing::warn!(error = %e, "could not trim data.mdb to its last page");
        }
    }
}

fn fallocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate (mode 0: allocate, size unchanged inside the file)
    // on a descriptor this `File` owns.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            0,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The lock, the file size limit and the reserve's arithmetic, on a plain
/// file standing in for `data.mdb`.
#[cfg(test)]
mod exact_tests {
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
        let st = r.state.lock().unwrap();
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
}
