//! Sluice's LMDB store. The only crate that names heed.
//!
//! Tables ([`tables`] names each with its key and value codec, [`codec`]
//! holds the byte layouts):
//! - `events`: serial → header ‖ raw JSON, the one copy of each event.
//! - `ids`: id → serial, for duplicates and `ids` filters.
//! - `by_created`, `by_author`, `by_kind`, `by_author_kind`, `by_tag`:
//!   `prefix ‖ created_at ‖ serial → ()`, one per filter shape, so every
//!   filter that names ids, authors, kinds or tags is an ordered index scan.
//! - `addresses`: replaceable/addressable slot → serial of its current version.
//! - `tombstones`: `id ‖ deleter` of NIP-09 `e` deletions; `address_tombstones`:
//!   slot → newest deletion created_at of NIP-09 `a` deletions.
//! - `expiry`: `expires_at ‖ serial → ()`, for the background purge.
//! - `meta`: schema version, the next serial, retention's size horizons.
//! - `vanished`: pubkey → created_at of its NIP-62 request to vanish.
//! - `policy`: the operator's runtime policy entries (NIP-86 changes, `sluice admin
//!   --store`), `list:item` → reason, merged with `[policy]` by the engine.
//!
//! Retention (`retention.rs`) removes events in bounded steps, each one
//! transaction, and the write path refuses what it would remove at once.
//!
//! Where things are: `write.rs` the write path (one batch, one
//! transaction), with `pending.rs` (a batch's index entries, inserted at
//! its end in key order) and `remove.rs` (the one delete path every
//! removal takes); `query/` the read path (`planner.rs` the planner,
//! `walk.rs` one filter's resumable walk, `cursor.rs` the REQ and COUNT
//! cursors and their steps); `serials.rs` events by serial, for the search
//! index; `retention.rs`; `purge.rs` the operator's purges;
//! `runtime_rules.rs` the `policy` table; `alone.rs` the lock on the store
//! and the reserve of a process alone in the map.
//!
//! Invariants: every event in `events` has exactly its entries in `ids` and
//! the five indexes (and `expiry` if it expires), written or removed in the
//! same transaction; serials are never reused; LMDB's transactions make a
//! crash at any moment leave either the old or the new state. Bytes that do
//! not decode are [`StoreError::Corrupt`] naming the table, never a panic:
//! a read that meets them fails, a write batch that meets them writes
//! nothing. The API is synchronous: callers keep it off async threads, and
//! [`Store::forbid_transactions_where`] lets the binary check that every
//! transaction opens on a thread allowed to block.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod alone;
mod codec;
mod pending;
mod purge;
mod query;
mod remove;
mod retention;
mod runtime_rules;
mod serials;
mod tables;
mod write;

use std::path::Path;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use heed::{Env, EnvOpenOptions, RoTxn, RwTxn, WithoutTls};

use crate::codec::{Be64, StoredEvent, index_key};
use crate::tables::{META_VERSION, TABLE_COUNT, Tables};

pub use query::{
    CountCursor, EventChunk, EventSink, PlanShape, QueryCursor, QueryOptions, QueryOutput,
    StepLimits, StepOutput, plan_shape,
};
pub use retention::{Picked, Pruned, Retention, Rule, Scan, Scope, VANISH, is_replaceable};
pub use serials::{SerialLookup, StoredRef};
pub use write::{WriteOutcome, WriteRules};

/// Says whether the current thread must not open a transaction (set once
/// by the binary; see [`Store::forbid_transactions_where`]).
static FORBIDDEN_THREAD: OnceLock<fn() -> bool> = OnceLock::new();
/// Transactions opened where [`FORBIDDEN_THREAD`] said no.
static FORBIDDEN_TXNS: AtomicU64 = AtomicU64::new(0);

/// Version of the on-disk layout; a store with another version is refused.
const SCHEMA_VERSION: u64 = 1;

/// Errors of the store. `MapFull` is the one an operator must act on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("LMDB map is full ({map_size_bytes} bytes): raise store.map_size_mb")]
    MapFull { map_size_bytes: u64 },
    #[error("store at {path} uses schema version {found}, this build reads {expected}")]
    SchemaMismatch {
        path: String,
        found: u64,
        expected: u64,
    },
    /// Bytes in `table` that are not a layout this build wrote: a
    /// damaged or foreign store.
    #[error("corrupt data in table {table}: {detail}")]
    Corrupt { table: &'static str, detail: String },
    #[error("cannot open store at {path}: {source}")]
    Open { path: String, source: heed::Error },
    #[error("LMDB error: {0}")]
    Lmdb(#[from] heed::Error),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Another process has the store to itself (`sluice import` writing in
    /// the map); ordinary processes wait until it ends.
    #[error(
        "the store at {path} is held alone by another process (a `sluice import` writing in the map): open it when that ends"
    )]
    Busy { path: String },
}

impl StoreError {
    /// Whether the disk (or the file size limit) stopped the write:
    /// `ENOSPC`, `EDQUOT` or `EFBIG`. Nothing of the batch was written;
    /// the same write succeeds once space returns.
    pub fn is_disk_full(&self) -> bool {
        let io = match self {
            StoreError::Io(e) | StoreError::Lmdb(heed::Error::Io(e)) => e,
            _ => return false,
        };
        io.kind() == std::io::ErrorKind::StorageFull
            || io.kind() == std::io::ErrorKind::QuotaExceeded
            || io.kind() == std::io::ErrorKind::FileTooLarge
    }

    /// An operating-system I/O error (the disk, not the data).
    pub fn is_io(&self) -> bool {
        matches!(
            self,
            StoreError::Io(_) | StoreError::Lmdb(heed::Error::Io(_))
        )
    }

    /// A write that ran out of map space says so, with the map's size.
    fn in_write(self, map_size_bytes: u64) -> StoreError {
        match self {
            StoreError::Lmdb(heed::Error::Mdb(heed::MdbError::MapFull)) => {
                StoreError::MapFull { map_size_bytes }
            }
            other => other,
        }
    }
}

/// How to open the store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub map_size_bytes: u64,
    pub max_readers: u32,
    /// LMDB's `MDB_WRITEMAP`: a transaction's dirty pages are written in
    /// the map, not copied on the heap first. Every process opening the
    /// store must agree (the relay and an import beside it read the same
    /// config).
    pub write_map: bool,
    /// Write in the map when no other process has the store open (an
    /// exclusive lock on `sluice.lock`), else open it as `write_map` says.
    /// `sluice import` asks for this: alone, it is as fast as `write_map`
    /// without its risk to a relay (see `alone.rs`).
    pub write_map_when_alone: bool,
    /// Free space on the store's filesystem below which writes are
    /// refused (checked by the engine's monitor).
    pub min_free_disk_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            map_size_bytes: DEFAULT_MAP_SIZE_BYTES,
            max_readers: 126,
            write_map: false,
            write_map_when_alone: false,
            min_free_disk_bytes: 1 << 30,
        }
    }
}

/// The default map: 8 TiB of address space, reserved, not allocated. The
/// file grows as data is written (without `write_map`), so the disk, not
/// the map, is the limit.
pub const DEFAULT_MAP_SIZE_BYTES: u64 = 8 << 40;

/// Opens the LMDB environment of a store.
fn open_env(path: &Path, opts: &StoreOptions, write_map: bool) -> heed::Result<Env<WithoutTls>> {
    let mut eo = EnvOpenOptions::new().read_txn_without_tls();
    eo.map_size(opts.map_size_bytes as usize)
        .max_readers(opts.max_readers)
        .max_dbs(TABLE_COUNT);
    if write_map {
        // SAFETY: WRITE_MAP is not one of the flags that weaken durability
        // (NO_SYNC, NO_META_SYNC, NO_LOCK); nested write transactions,
        // which it forbids, are never used. Processes never mix it with
        // ordinary opens: `store.write_map` is one config for all, and a
        // process alone in the map holds the exclusive lock (`alone.rs`).
        unsafe {
            eo.flags(heed::EnvFlags::WRITE_MAP);
        }
    }
    // SAFETY: the environment is opened once per process for this path and
    // never mapped with conflicting flags; other processes (import beside
    // serve) use the same flags, which LMDB supports.
    unsafe { eo.open(path) }
}

/// Opens the environment written in the map, holding the exclusive lock,
/// with the first reserve allocated (blocks for the tables' first pages
/// too). On failure the lock is released and the file cut back to its
/// last page.
fn open_alone(
    path: &Path,
    opts: &StoreOptions,
    lock: std::fs::File,
) -> Result<(Env<WithoutTls>, alone::Reserve), StoreError> {
    let env = open_env(path, opts, true)?;
    let end =
        (env.info().last_page_number as u64 + 1) * env.unnamed_database_stat().page_size as u64;
    let reserve = alone::Reserve::new(lock, path)?;
    reserve.committed_at(end);
    match reserve.ensure(end, 0) {
        Ok(()) => Ok((env, reserve)),
        Err(e) => {
            // The environment closes first, then the reserve cuts the file.
            drop(env);
            drop(reserve);
            Err(e.into())
        }
    }
}

/// Space on the filesystem that holds the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskSpace {
    /// Bytes an unprivileged writer may still use, with the blocks the
    /// store reserved ahead of its last page and has not written yet.
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// `store.min_free_disk_mb` in bytes.
    pub min_free_bytes: u64,
}

/// Sizes an operator and the store monitor watch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreStats {
    pub map_size_bytes: u64,
    /// Bytes of the pages that hold data ([`Store::used_bytes`]): what
    /// retention's size target measures.
    pub used_bytes: u64,
    /// Bytes of `data.mdb` up to its last page: the high-water mark, data
    /// and the free pages LMDB reuses.
    pub file_bytes: u64,
    pub events: u64,
    pub readers_in_use: u32,
    pub max_readers: u32,
}

impl StoreStats {
    /// File bytes over map size, 0..1.
    pub fn map_fill_ratio(&self) -> f64 {
        if self.map_size_bytes == 0 {
            0.0
        } else {
            self.file_bytes as f64 / self.map_size_bytes as f64
        }
    }
}

/// An open LMDB store. Cheap to clone; all clones share one environment.
#[derive(Clone)]
pub struct Store {
    env: Env<WithoutTls>,
    t: Tables<'static>,
    map_size_bytes: u64,
    min_free_disk_bytes: u64,
    path: std::path::PathBuf,
    page_size: u64,
    /// The lock on `sluice.lock`, and the reserve when writing in the map
    /// alone. Declared last: dropped after `env`, so the last clone's drop
    /// closes the environment before the reserve trims the file.
    hold: std::sync::Arc<alone::Hold>,
}

impl Store {
    /// Opens (creating if missing) the store in directory `path`.
    pub fn open(path: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(path)?;
        let busy = || StoreError::Busy {
            path: path.display().to_string(),
        };
        // Alone in the map only where the file may be as large as the map.
        let may_map = opts.write_map_when_alone
            && !opts.write_map
            && alone::file_size_limit().is_none_or(|limit| limit >= opts.map_size_bytes);
        let (lock, alone) = alone::lock(path, may_map)?.ok_or_else(busy)?;
        let (env, hold) = if alone {
            match open_alone(path, opts, lock) {
                Ok((env, reserve)) => (env, alone::Hold::Alone(reserve)),
                Err(e) => {
                    // A filesystem that will not hold a file the map's size,
                    // or not the reserve: open as everyone else does.
                    tracing::warn!(error = %e, "cannot write in the map here; opening the store as usual");
                    let (lock, _) = alone::lock(path, false)?.ok_or_else(busy)?;
                    let env = open_env(path, opts, opts.write_map).map_err(open_err)?;
                    (env, alone::Hold::Shared(lock))
                }
            }
        } else {
            let env = open_env(path, opts, opts.write_map).map_err(open_err)?;
            (env, alone::Hold::Shared(lock))
        };
        let page_size = env.unnamed_database_stat().page_size as u64;
        let t = Tables::open(&env).map_err(open_err)?;
        let store = Store {
            env,
            t,
            map_size_bytes: opts.map_size_bytes,
            min_free_disk_bytes: opts.min_free_disk_bytes,
            path: path.to_path_buf(),
            page_size,
            hold: std::sync::Arc::new(hold),
        };
        store.check_schema(path)?;
        Ok(store)
    }

    fn check_schema(&self, path: &Path) -> Result<(), StoreError> {
        let mut wtxn = self.wtxn(0)?;
        match self.t.meta.get(&wtxn, META_VERSION)? {
            Some(found) if found != SCHEMA_VERSION => {
                return Err(StoreError::SchemaMismatch {
                    path: path.display().to_string(),
                    found,
                    expected: SCHEMA_VERSION,
                });
            }
            Some(_) => {}
            None => {
                self.t
                    .meta
                    .put(&mut wtxn, META_VERSION, &Be64::new(SCHEMA_VERSION))?;
            }
        }
        wtxn.commit()?;
        self.committed();
        Ok(())
    }

    /// Whether this process writes in the map (`store.write_map`, or alone).
    pub fn writes_in_map(&self) -> bool {
        self.env
            .get_flags()
            .is_ok_and(|f| f & heed::EnvFlags::WRITE_MAP.bits() != 0)
    }

    /// Whether this process has the store to itself, writing in the map.
    pub fn is_alone(&self) -> bool {
        matches!(*self.hold, alone::Hold::Alone(_))
    }

    /// The most event bytes one transaction should add when the store is
    /// written alone in the map (a quarter of the least reserve), so that
    /// a batch stays inside the blocks reserved for it.
    pub fn alone_batch_bytes(&self) -> Option<u64> {
        match &*self.hold {
            alone::Hold::Alone(r) => Some(r.min_ahead() / alone::BATCH_SHARE),
            alone::Hold::Shared(_) => None,
        }
    }

    /// Bytes of `data.mdb` up to its last committed page.
    fn end_bytes(&self) -> u64 {
        (self.env.info().last_page_number as u64 + 1) * self.page_size
    }

    /// After every commit: where a store written alone is cut back to.
    fn committed(&self) {
        if let alone::Hold::Alone(r) = &*self.hold {
            r.committed_at(self.end_bytes());
        }
    }

    /// Installs the check run before every transaction: `forbidden()`
    /// returns true on a thread that must not block on LMDB (an async
    /// worker). A transaction opened there is counted
    /// ([`Store::forbidden_transactions`]) and logged, and in debug builds
    /// (every test) it panics. The first call wins.
    pub fn forbid_transactions_where(forbidden: fn() -> bool) {
        let _ = FORBIDDEN_THREAD.set(forbidden);
    }

    /// Transactions opened on a thread the check forbids (always 0 in a
    /// correct build).
    pub fn forbidden_transactions() -> u64 {
        FORBIDDEN_TXNS.load(Ordering::Relaxed)
    }

    fn check_thread() {
        if FORBIDDEN_THREAD.get().is_some_and(|forbidden| forbidden()) {
            FORBIDDEN_TXNS.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                thread = std::thread::current().name().unwrap_or("?"),
                "LMDB transaction on an async worker thread"
            );
            debug_assert!(false, "LMDB transaction on an async worker thread");
        }
    }

    /// Every read transaction opens here, after the thread check.
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place a read transaction opens"
    )]
    pub(crate) fn begin_read(env: &Env<WithoutTls>) -> Result<RoTxn<'_, WithoutTls>, heed::Error> {
        Self::check_thread();
        env.read_txn()
    }

    /// Every write transaction opens here, after the thread check.
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place a write transaction opens"
    )]
    pub(crate) fn begin_write(env: &Env<WithoutTls>) -> Result<RwTxn<'_>, heed::Error> {
        Self::check_thread();
        env.write_txn()
    }

    fn rtxn(&self) -> Result<RoTxn<'_, WithoutTls>, StoreError> {
        Ok(Self::begin_read(&self.env)?)
    }

    /// A write transaction that adds about `adding` bytes of events.
    fn wtxn(&self, adding: u64) -> Result<RwTxn<'_>, StoreError> {
        if let alone::Hold::Alone(r) = &*self.hold {
            // Blocks for this transaction's pages, or ENOSPC before it.
            r.ensure(self.end_bytes(), adding)?;
        }
        Ok(Self::begin_write(&self.env)?)
    }

    /// Current sizes; cheap (no scan).
    pub fn stats(&self) -> Result<StoreStats, StoreError> {
        let info = self.env.info();
        let page = self.env.unnamed_database_stat().page_size as u64;
        let events = {
            let rtxn = self.rtxn()?;
            self.t.events.len(&rtxn)?
        };
        Ok(StoreStats {
            map_size_bytes: info.map_size as u64,
            used_bytes: self.used_bytes()?,
            file_bytes: (info.last_page_number as u64 + 1) * page,
            events,
            readers_in_use: info.number_of_readers,
            max_readers: info.maximum_number_of_readers,
        })
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Free and total space of the filesystem holding the store
    /// (statvfs), with the configured floor. Free space includes the blocks
    /// this store has reserved ahead of its last page (an import alone in
    /// the map): they are this store's to write into, so its own reserve
    /// never puts it under the floor.
    pub fn disk_space(&self) -> Result<DiskSpace, StoreError> {
        let (free_bytes, total_bytes) = statvfs(&self.path)?;
        let reserved = match &*self.hold {
            alone::Hold::Alone(r) => r.unwritten(self.end_bytes()),
            alone::Hold::Shared(_) => 0,
        };
        Ok(DiskSpace {
            free_bytes: free_bytes.saturating_add(reserved),
            total_bytes,
            min_free_bytes: self.min_free_disk_bytes,
        })
    }

    /// Flushes to disk; commits are already durable, this is the monitor's
    /// relief action and the shutdown step.
    pub fn force_sync(&self) -> Result<(), StoreError> {
        self.env.force_sync().map_err(StoreError::Lmdb)
    }

    /// The raw JSON of the event with this id, if stored and not expired.
    pub fn get(&self, id: &[u8; 32], now: u64) -> Result<Option<String>, StoreError> {
        let rtxn = self.rtxn()?;
        let Some(serial) = self.t.ids.get(&rtxn, id)? else {
            return Ok(None);
        };
        let Some(StoredEvent { header, raw }) = self.t.events.get(&rtxn, &Be64::new(serial))?
        else {
            return Ok(None);
        };
        Ok((!header.is_expired(now)).then(|| raw.to_owned()))
    }

    /// For each id, whether the store holds an event with it (expired or
    /// not), in one read transaction.
    pub fn contains_ids<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a [u8; 32]>,
    ) -> Result<Vec<bool>, StoreError> {
        let rtxn = self.rtxn()?;
        ids.into_iter()
            .map(|id| self.t.ids.contains(&rtxn, id))
            .collect()
    }

    /// Calls `f` with the raw JSON of every stored, unexpired event whose
    /// created_at is in `since..=until`, oldest first. Reads in chunks of
    /// short read transactions, so a long export never pins old pages and
    /// memory stays constant.
    pub fn for_each_raw(
        &self,
        since: u64,
        until: u64,
        now: u64,
        mut f: impl FnMut(&str) -> std::io::Result<()>,
    ) -> Result<u64, StoreError> {
        use std::ops::Bound;
        const CHUNK: usize = 1024;
        let end = index_key(&[], until, u64::MAX);
        let mut start = Bound::Included(index_key(&[], since, 0));
        let mut n = 0u64;
        loop {
            let mut batch: Vec<String> = Vec::with_capacity(CHUNK);
            let mut last = None;
            {
                let rtxn = self.rtxn()?;
                let range = (start.as_ref().map(|k| &k[..]), Bound::Included(&end[..]));
                let by_created = &self.t.by_created;
                for item in by_created.range(&rtxn, &range)? {
                    let ((created_at, serial), ()) = item.map_err(|e| by_created.error(e))?;
                    if let Some(StoredEvent { header, raw }) =
                        self.t.events.get(&rtxn, &Be64::new(serial))?
                        && !header.is_expired(now)
                    {
                        batch.push(raw.to_owned());
                    }
                    last = Some((created_at, serial));
                    if batch.len() == CHUNK {
                        break;
                    }
                }
            }
            for raw in &batch {
                f(raw)?;
            }
            n += batch.len() as u64;
            match last {
                Some((created_at, serial)) if batch.len() == CHUNK => {
                    start = Bound::Excluded(index_key(&[], created_at, serial));
                }
                _ => return Ok(n),
            }
        }
    }

    /// Closes the environment, waiting until no other clone uses it.
    pub fn close(self) {
        let Store { env, .. } = self;
        env.prepare_for_closing().wait();
    }

    /// Writes a compacted copy of the store to `dir/data.mdb` (LMDB's
    /// compacting copy: free pages left out, the rest renumbered), the
    /// store as of one read transaction, while others go on writing (in
    /// this process or another). `dir` is created if missing; the copy is
    /// created mode 0600; an existing `dir/data.mdb` is refused
    /// (`AlreadyExists`), and a copy that fails is removed. Returns the
    /// copy's size in bytes.
    pub fn compact_to(&self, dir: &Path) -> Result<u64, StoreError> {
        Self::check_thread();
        std::fs::create_dir_all(dir)?;
        let path = dir.join("data.mdb");
        let mut open = std::fs::File::options();
        open.read(true).write(true).create_new(true);
        // Readable by the store's owner only, as LMDB creates the store.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        let mut file = open.open(&path)?;
        let copied = self
            .env
            .copy_to_file(&mut file, heed::CompactionOption::Enabled)
            .map_err(StoreError::from)
            .and_then(|()| Ok(file.sync_all()?))
            .and_then(|()| Ok(file.metadata()?.len()));
        if copied.is_err() {
            drop(file);
            let _ = std::fs::remove_file(&path);
        }
        copied
    }
}

/// `(available, total)` bytes of the filesystem holding `path`.
// statvfs's field types differ between platforms: the casts are needed
// where they are not u64.
#[allow(clippy::unnecessary_cast)]
fn statvfs(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is writable memory of
    // the right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}
