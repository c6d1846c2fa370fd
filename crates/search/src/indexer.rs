//! The indexer thread (`sluice-search`): reads the events the store
//! committed after the last indexed serial, in serial order, adds their
//! documents and commits the index with that serial as its payload. It
//! never sits in the writer's path: the writer only rings
//! ([`SearchIndex::ring`]), and the indexer pulls from the store, so it
//! cannot lose an event nor delay an OK. After a crash it resumes from
//! the serial of its last commit: what it had added since is added again
//! (never twice: a commit holds the documents and the serial together).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_proto::search::TOKENS_VERSION;
use sluice_store::Store;
use tantivy::indexer::{IndexWriterOptions, UserOperation};
use tantivy::{IndexWriter, TantivyDocument, Term};

use crate::fresh::Waiting;
use crate::index::{SearchError, SearchIndex};
use crate::metrics_names as m;

/// Events read from the store per read transaction.
const BATCH: usize = 2048;
/// While behind (an import, a restart), commit at most this often: the
/// progress a crash keeps.
const CATCH_UP_COMMIT: Duration = Duration::from_secs(10);
/// A store error is retried after this long.
const RETRY: Duration = Duration::from_secs(1);

/// The running indexer: stopping it commits what it has indexed.
pub struct Indexer {
    index: Arc<SearchIndex>,
    thread: parking_lot::Mutex<Option<JoinHandle<()>>>,
    alive: Arc<AtomicBool>,
    indexed: Arc<AtomicU64>,
}

impl SearchIndex {
    /// The store serial the index's last commit covers (0: none).
    pub fn committed_serial(&self) -> Result<u64, SearchError> {
        Ok(self.committed()?.0)
    }

    /// The last commit's payload, `"SERIAL tVERSION"`: the store serial it
    /// covers (0: none) and the version of the tokens it holds
    /// (`sluice_proto::search::TOKENS_VERSION`; a payload without one is
    /// version 1).
    pub fn committed(&self) -> Result<(u64, u32), SearchError> {
        let payload = self.index.load_metas()?.payload.unwrap_or_default();
        let mut fields = payload.split_whitespace();
        let serial = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let version = fields
            .next()
            .and_then(|v| v.strip_prefix('t'))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        Ok((serial, version))
    }
}

/// How many indexing threads tantivy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One: a relay's trickle of events (each commit starts the threads
    /// again, so more would cost more than they give).
    One,
    /// One per core, each with at least tantivy's least memory budget: a
    /// build that has the machine to itself (the end of an import,
    /// `sluice reindex`).
    Cores,
}

impl Workers {
    fn count(self, memory_mb: usize) -> usize {
        match self {
            Workers::One => 1,
            Workers::Cores => std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(memory_mb / MIN_WORKER_MEMORY_MB)
                .clamp(1, MAX_WORKERS),
        }
    }
}

/// tantivy's least memory budget per indexing thread (15 MB), rounded up.
const MIN_WORKER_MEMORY_MB: usize = 16;
/// Most indexing threads, whatever the cores.
const MAX_WORKERS: usize = 8;

impl Indexer {
    /// Takes the index's writer (an error if another process holds it) and
    /// starts the thread. An index ahead of `store` (the store was replaced
    /// by an older copy) is emptied and built again.
    pub fn start(
        index: Arc<SearchIndex>,
        store: Store,
        workers: Workers,
    ) -> Result<Indexer, SearchError> {
        Self::start_with(index, store, workers, false)
    }

    /// Empties the index and starts the thread to build it again from
    /// the whole store (`sluice reindex`): searches see the old index
    /// until the first commit.
    pub fn rebuild(
        index: Arc<SearchIndex>,
        store: Store,
        workers: Workers,
    ) -> Result<Indexer, SearchError> {
        Self::start_with(index, store, workers, true)
    }

    fn start_with(
        index: Arc<SearchIndex>,
        store: Store,
        workers: Workers,
        rebuild: bool,
    ) -> Result<Indexer, SearchError> {
        let threads = workers.count(index.cfg.writer_memory_mb);
        let writer: IndexWriter<TantivyDocument> = index
            .index
            .writer_with_options(
                IndexWriterOptions::builder()
                    .num_worker_threads(threads)
                    .num_merge_threads(1)
                    .memory_budget_per_thread((index.cfg.writer_memory_mb << 20) / threads)
                    .build(),
            )
            .map_err(|e| match e {
                tantivy::TantivyError::LockFailure(..) => SearchError::Busy {
                    path: index.dir.clone(),
                },
                e => SearchError::Open {
                    path: index.dir.clone(),
                    message: e.to_string(),
                },
            })?;
        let (mut last, version) = index.committed()?;
        if rebuild {
            last = 0;
            writer.delete_all_documents()?;
        } else if last > 0 && version != TOKENS_VERSION {
            tracing::warn!(
                indexed = last,
                version,
                "the search index holds words as an older version split them: rebuilding it \
                 (searches find less until it has caught up)"
            );
            last = 0;
            writer.delete_all_documents()?;
        } else if last >= store.next_serial()? && last > 0 {
            tracing::warn!(
                indexed = last,
                "the search index is ahead of the store (an older store?): rebuilding it"
            );
            last = 0;
            writer.delete_all_documents()?;
        }
        let alive = Arc::new(AtomicBool::new(true));
        let indexed = Arc::new(AtomicU64::new(last));
        index.lock().stopping = false;
        let run = Run {
            index: index.clone(),
            store,
            writer,
            last,
            indexed: indexed.clone(),
        };
        let flag = alive.clone();
        let exit_index = index.clone();
        index.set_running(true);
        let thread = std::thread::Builder::new()
            .name("sluice-search".into())
            .spawn(move || {
                let _exit = Exit(flag, exit_index);
                run.run();
            })
            .map_err(|source| {
                index.set_running(false);
                SearchError::Dir {
                    path: index.dir.clone(),
                    source,
                }
            })?;
        Ok(Indexer {
            index,
            thread: parking_lot::Mutex::new(Some(thread)),
            alive,
            indexed,
        })
    }

    /// Whether the thread runs (false after it failed or was stopped).
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// The serial the index has committed.
    pub fn indexed_serial(&self) -> u64 {
        self.indexed.load(Ordering::Acquire)
    }

    /// Blocks until the index has committed every event below `next`
    /// (the store's next serial) or the thread stopped; false if it did.
    pub fn wait_caught_up(&self, next: u64) -> bool {
        let _waiting = Waiting::new(&self.index);
        self.index.ring();
        while self.indexed_serial() + 1 < next {
            if !self.alive() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Commits what is indexed and stops the thread. Idempotent.
    pub fn stop(&self) {
        self.index.lock().stopping = true;
        self.index.wake.notify_all();
        let thread = self.thread.lock().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Indexer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Clears `alive` when the thread ends, however, and lets the searches
/// waiting for a commit go on; a panic is logged.
struct Exit(Arc<AtomicBool>, Arc<SearchIndex>);

impl Drop for Exit {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
        self.1.set_running(false);
        if std::thread::panicking() {
            tracing::error!("the search indexer panicked; /readyz reports it until a restart");
        }
    }
}

struct Run {
    index: Arc<SearchIndex>,
    store: Store,
    writer: IndexWriter<TantivyDocument>,
    /// The last serial read from the store (indexed or not indexable).
    last: u64,
    /// The last serial committed, for everyone.
    indexed: Arc<AtomicU64>,
}

impl Run {
    fn run(mut self) {
        metrics::gauge!(m::SEARCH_INDEXED_SERIAL).set(self.indexed.load(Ordering::Relaxed) as f64);
        metrics::gauge!(m::SEARCH_INDEX_BYTES).set(self.index.disk_bytes() as f64);
        let mut since_commit = Instant::now();
        let mut dirty = false;
        loop {
            // `every`: the commit interval while searches come, the idle
            // one once none has for that long (crate::fresh).
            let (stopping, removals, hurry, rings, idle) = {
                let mut p = self.index.lock();
                p.rung = false;
                (
                    p.stopping,
                    std::mem::take(&mut p.removals),
                    p.waiters > 0,
                    p.rings,
                    !self.index.searched_lately(&p, Instant::now()),
                )
            };
            let every = self.index.commit_every(idle);
            for serial in &removals {
                self.writer
                    .delete_term(Term::from_field_u64(self.index.fields.serial, *serial));
            }
            if !removals.is_empty() {
                dirty = true;
                metrics::counter!(m::SEARCH_REMOVED_TOTAL).increment(removals.len() as u64);
            }
            let behind = match self.catch_up_batch() {
                Ok(Some(behind)) => {
                    dirty = true;
                    behind
                }
                Ok(None) => false,
                Err(e) => {
                    metrics::counter!(m::SEARCH_ERRORS_TOTAL).increment(1);
                    if let SearchError::Index(_) = e {
                        tracing::error!(error = %e, "search indexer stopped");
                        return;
                    }
                    tracing::warn!(error = %e, "search indexer: store read failed; retrying");
                    self.wait(RETRY);
                    continue;
                }
            };
            self.index.set_behind(behind);
            let due = since_commit.elapsed() >= if behind { CATCH_UP_COMMIT } else { every };
            // Someone waits for the index to catch up: what was read is
            // committed once the batches run out.
            let hurried = hurry && !behind;
            if dirty && (due || stopping || hurried) {
                if let Err(e) = self.commit() {
                    metrics::counter!(m::SEARCH_ERRORS_TOTAL).increment(1);
                    tracing::error!(error = %e, "search index commit failed; indexer stopped");
                    return;
                }
                dirty = false;
                since_commit = Instant::now();
            }
            if !dirty && !behind {
                // Everything the store held at ring `rings` is searchable.
                self.index.covered(rings);
            }
            if stopping {
                return;
            }
            if !behind {
                // Caught up: new events are read, added and committed together
                // once the interval since the last commit has passed (a ring
                // before then does not wake the indexer), so a steady trickle
                // costs one read and one commit per interval, not one read per
                // writer commit. They become searchable no later than before.
                // While someone waits for it to catch up, the indexer reads
                // each commit of the writer's as it rings. A search ends the
                // idle interval's sleep (the interval is short again).
                let since = since_commit.elapsed();
                if since < every && !hurry {
                    self.sleep(every - since, idle);
                } else {
                    self.wait(Duration::from_secs(1));
                }
            }
        }
    }

    /// Sleeps until rung, asked to remove or stop, or `d` passed.
    fn wait(&self, d: Duration) {
        let mut p = self.index.lock();
        if p.rung || p.stopping || !p.removals.is_empty() {
            return;
        }
        self.index.wake.wait_for(&mut p, d);
    }

    /// Sleeps `d`, rings or not, unless asked to stop or remove, someone
    /// waits for the index to catch up, or, sleeping out the `idle`
    /// interval, a search has come since.
    fn sleep(&self, d: Duration, idle: bool) {
        let until = Instant::now() + d;
        let mut p = self.index.lock();
        while !p.stopping
            && p.removals.is_empty()
            && p.waiters == 0
            && !(idle && self.index.searched_lately(&p, Instant::now()))
        {
            if self.index.wake.wait_until(&mut p, until).timed_out() {
                return;
            }
        }
    }

    /// Indexes the next batch of stored events: `None` when there were
    /// none, else whether more may follow.
    fn catch_up_batch(&mut self) -> Result<Option<bool>, SearchError> {
        // One hand-off to tantivy's indexing thread per batch, not one per
        // document: each hand-off is a channel send that wakes that thread.
        let mut docs: Vec<UserOperation<TantivyDocument>> = Vec::new();
        let mut read = 0;
        let last = self.store.visit_events_after(self.last, BATCH, |e| {
            read += 1;
            if let Some(doc) = self.index.document(e) {
                docs.push(UserOperation::Add(doc));
            }
        })?;
        let next = self.store.next_serial()?;
        let Some(end) = last else {
            metrics::gauge!(m::SEARCH_LAG_EVENTS)
                .set(next.saturating_sub(self.indexed.load(Ordering::Relaxed) + 1) as f64);
            return Ok(None);
        };
        let added = docs.len() as u64;
        if added > 0 {
            self.writer.run(docs)?;
        }
        self.last = end;
        metrics::counter!(m::SEARCH_DOCUMENTS_TOTAL).increment(added);
        metrics::gauge!(m::SEARCH_LAG_EVENTS)
            .set(next.saturating_sub(self.indexed.load(Ordering::Relaxed) + 1) as f64);
        Ok(Some(read == BATCH))
    }

    /// Commits the index with the last serial read as its payload, and
    /// lets searches see it.
    fn commit(&mut self) -> Result<(), SearchError> {
        let started = Instant::now();
        let mut prepared = self.writer.prepare_commit()?;
        prepared.set_payload(&format!("{} t{TOKENS_VERSION}", self.last));
        prepared.commit()?;
        self.index.reader.reload()?;
        self.index.committed_now();
        self.indexed.store(self.last, Ordering::Release);
        metrics::histogram!(m::SEARCH_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::gauge!(m::SEARCH_INDEXED_SERIAL).set(self.last as f64);
        if let Ok(next) = self.store.next_serial() {
            metrics::gauge!(m::SEARCH_LAG_EVENTS).set(next.saturating_sub(self.last + 1) as f64);
        }
        metrics::gauge!(m::SEARCH_INDEX_BYTES).set(self.index.disk_bytes() as f64);
        Ok(())
    }
}
