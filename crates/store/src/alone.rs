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

use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;

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
        let mut st = self.state.lock();
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

    /// Bytes allocated past `end` (the last page's end now): reserved for
    /// this store and not yet written.
    pub(crate) fn unwritten(&self, end: u64) -> u64 {
        self.state.lock().allocated.saturating_sub(end)
    }

    /// Records the end of the last page after a commit: where the file is
    /// cut when the store closes.
    pub(crate) fn committed_at(&self, end: u64) {
        let mut st = self.state.lock();
        st.trim_to = end;
    }
}

impl Drop for Reserve {
    /// Runs after the environment closed (it is the store's last field):
    /// the sparse tail and the reserve are cut off, under the lock.
    fn drop(&mut self) {
        let st = self.state.get_mut();
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

#[cfg(test)]
mod tests;
