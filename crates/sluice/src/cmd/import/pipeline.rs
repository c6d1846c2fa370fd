//! The import's threads: the reader cuts the sources into numbered chunks,
//! the parse and verify workers turn them into [`Parsed`] chunks, and the
//! [`Batcher`] (on the calling thread) hands their events to the engine's
//! writer; a progress thread draws the bar. The channels and bounds between
//! them are drawn in the parent module's doc.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};

use parking_lot::Mutex;
use std::time::Duration;

use sluice_engine::Engine;
use sluice_engine::clock::unix_now;
use sluice_proto::PubkeyCache;
use sluice_store::Store;

use super::batcher::{Batcher, Parsed};
use super::input::{self, Line, LineKind, LineSplitter};
use super::pacer::BulkPacer;
use super::parse::{self, Item};
use super::report::{Live, Progress, Reporter, Summary};
use super::{CHUNK_BYTES, CHUNK_LINES, Plan};

/// Parsed author keys each worker keeps (about 100 bytes each).
const PUBKEY_CACHE_KEYS: usize = 16_384;

/// A numbered run of lines of one source.
struct Chunk {
    seq: u64,
    source: usize,
    buf: Vec<u8>,
    lines: Vec<Line>,
}

/// Runs reader, workers, progress and batcher; returns the counts even
/// when the store failed, so the operator sees how far it got.
/// `parsed_all` is called once every line is parsed, while the writer may
/// still be writing the last batches.
pub(super) fn pipeline(
    plan: &Plan,
    engine: &Engine,
    limiter: &BulkPacer,
    reporter: &Reporter,
    parsed_all: &mut dyn FnMut(),
) -> (Summary, anyhow::Result<()>) {
    let store = engine.store();
    let live = Live::default();
    // The reader blocks on `tokens` when `max_in_flight` chunks are out.
    let (tokens_tx, tokens_rx) = sync_channel::<()>(plan.max_in_flight);
    // Workers take chunks from a shared receiver; a full channel blocks the reader.
    let (work_tx, work_rx) = sync_channel::<Chunk>(2 * plan.workers);
    let work_rx = Arc::new(Mutex::new(work_rx));
    // Sized to the in-flight bound, so workers block only if the batcher is gone.
    let (results_tx, results_rx) = sync_channel::<Parsed>(plan.max_in_flight);
    // Dropped when the batcher ends: the progress thread's stop signal.
    let (done_tx, done_rx) = sync_channel::<()>(1);
    // Set when the batcher has returned, for a reader waiting on the
    // in-flight count rather than on a channel.
    let batcher_done = std::sync::atomic::AtomicBool::new(false);
    let batcher_done = &batcher_done;
    std::thread::scope(|s| {
        let bytes_read = live.bytes_read.clone();
        let reader = std::thread::Builder::new()
            .name("import-read".into())
            .spawn_scoped(s, move || {
                read(
                    plan,
                    bytes_read,
                    tokens_tx,
                    work_tx,
                    engine,
                    limiter,
                    batcher_done,
                )
            });
        let reader = match reader {
            Ok(r) => r,
            Err(e) => return (Summary::default(), Err(spawn_failed("reader", e))),
        };
        for i in 0..plan.workers {
            let work_rx = work_rx.clone();
            let results_tx = results_tx.clone();
            // On failure the channels drop with this closure: the threads
            // started so far see them closed and end.
            if let Err(e) = std::thread::Builder::new()
                .name(format!("import-parse-{i}"))
                .spawn_scoped(s, move || work(plan, store, &work_rx, &results_tx))
            {
                return (Summary::default(), Err(spawn_failed("parse", e)));
            }
        }
        // Only the workers hold these now, so each side sees the other end.
        drop(work_rx);
        drop(results_tx);
        let live_ref = &live;
        // Draws progress; the heap and the process variable are what the
        // engine's monitor measured at its last tick.
        let progress = std::thread::Builder::new()
            .name("import-progress".into())
            .spawn_scoped(s, move || {
                let mut progress = Progress::new(reporter.clone());
                let mut peak = 0u64;
                loop {
                    let state = engine.limiter().state();
                    let pv = state.map_or(0.0, |st| st.process_variable);
                    peak = peak.max(state.map_or(0, |st| st.memory_bytes));
                    progress.update(live_ref, limiter.throttled(), pv);
                    match done_rx.recv_timeout(limiter.tick) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return peak,
                    }
                }
            });
        let progress = match progress {
            Ok(p) => p,
            Err(e) => return (Summary::default(), Err(spawn_failed("progress", e))),
        };
        let mut batcher = Batcher::new(plan, engine, limiter, reporter, &live);
        let outcome = {
            // Set however run ends, a panic included.
            let _done = SetOnDrop(batcher_done);
            batcher.run(results_rx, tokens_rx, parsed_all)
        };
        // Receivers are dropped: the reader and workers see closed channels
        // and end (this matters when --strict or a store error stops early).
        drop(done_tx);
        let read_error = reader.join().unwrap_or(Ok(()));
        let mut summary = batcher.summary;
        summary.bytes = live.bytes_read.load(Ordering::Relaxed);
        summary.peak_anon_memory_bytes = progress.join().unwrap_or(0);
        (summary, outcome.and(read_error))
    })
}

/// A thread the import needs could not start (out of memory or of the
/// process's thread limit).
fn spawn_failed(what: &str, e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!("cannot start the import's {what} thread: {e}")
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The reader thread: sources in order, lines into numbered chunks.
fn read(
    plan: &Plan,
    bytes_read: Arc<std::sync::atomic::AtomicU64>,
    tokens: SyncSender<()>,
    work: SyncSender<Chunk>,
    engine: &Engine,
    limiter: &BulkPacer,
    batcher_done: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<()> {
    let in_flight = engine.bulk_backlog();
    // Numbers are given at sending, so they have no gaps: the batcher
    // waits for each in turn.
    let mut seq = 0u64;
    // False when the batcher is gone (stopped early): stop quietly.
    let mut send = |mut chunk: Chunk| -> bool {
        // Under pressure only the base share of the in-flight bound is used.
        // The wait ends when the batcher takes a chunk, or when it has
        // stopped (--strict, a store error): then nothing will make room.
        while in_flight.held()
            >= limiter.chunk_limit(plan.max_in_flight, plan.base_in_flight) as u64
        {
            if batcher_done.load(Ordering::Acquire) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if tokens.send(()).is_err() {
            return false;
        }
        chunk.seq = seq;
        seq += 1;
        in_flight.add();
        work.send(chunk).is_ok()
    };
    for (index, source) in plan.sources.iter().enumerate() {
        let new_chunk = || Chunk {
            seq: 0,
            source: index,
            buf: Vec::with_capacity(CHUNK_BYTES.min(64 << 10)),
            lines: Vec::with_capacity(CHUNK_LINES),
        };
        let mut chunk = new_chunk();
        let stream = match input::open(source, bytes_read.clone()) {
            Ok(s) => s,
            Err(e) => {
                chunk.lines.push(read_error(0, &e));
                if !send(chunk) {
                    return Ok(());
                }
                continue;
            }
        };
        let mut lines = LineSplitter::new(stream, plan.max_line_bytes);
        loop {
            // About to wait for the source: pass on the lines read so far,
            // so a slow stream is still written as it comes.
            if !chunk.lines.is_empty() && lines.buffer_is_empty() {
                let next = new_chunk();
                if !send(std::mem::replace(&mut chunk, next)) {
                    return Ok(());
                }
            }
            match lines.next_into(&mut chunk.buf) {
                Ok(Some(line)) => {
                    chunk.lines.push(line);
                    if chunk.lines.len() >= CHUNK_LINES || chunk.buf.len() >= CHUNK_BYTES {
                        let next = new_chunk();
                        if !send(std::mem::replace(&mut chunk, next)) {
                            return Ok(());
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    chunk.lines.push(read_error(lines.number() + 1, &e));
                    break;
                }
            }
        }
        if !chunk.lines.is_empty() && !send(chunk) {
            return Ok(());
        }
    }
    Ok(())
}

fn read_error(number: u64, e: &std::io::Error) -> Line {
    Line {
        number,
        start: 0,
        end: 0,
        kind: LineKind::ReadError(format!("cannot read further: {e}")),
    }
}

/// For each event of `items`, in order, whether the store already holds its
/// id: its signature was checked when it was stored, and the write will
/// count it as a duplicate, so a re-run after a crash skips the costly part
/// for everything committed before. A line with the id of a stored event
/// but a bad signature is therefore reported as a duplicate, not refused.
fn stored_flags(store: &Store, items: &[Item]) -> Vec<bool> {
    let ids = items.iter().filter_map(|item| match item {
        Item::Event { event, .. } => Some(&event.id),
        _ => None,
    });
    // A read error only costs the shortcut: every event is then verified.
    store.contains_ids(ids).unwrap_or_default()
}

/// A worker thread: parse and verify chunks until the reader is done.
fn work(plan: &Plan, store: &Store, chunks: &Mutex<Receiver<Chunk>>, results: &SyncSender<Parsed>) {
    let mut keys = PubkeyCache::new(PUBKEY_CACHE_KEYS);
    loop {
        let chunk = {
            let rx = chunks.lock();
            match rx.recv() {
                Ok(c) => c,
                Err(_) => return,
            }
        };
        let now = unix_now();
        let mut items = Vec::with_capacity(chunk.lines.len());
        let mut blank = 0;
        for l in &chunk.lines {
            match parse::line(&chunk.buf, l, &plan.checks, now) {
                Some(item) => items.push(item),
                None => blank += 1,
            }
        }
        if plan.checks.verify {
            let mut stored = if plan.look_up_stored {
                stored_flags(store, &items)
            } else {
                Vec::new()
            }
            .into_iter();
            for item in &mut items {
                let held = matches!(item, Item::Event { .. }) && stored.next() == Some(true);
                if !held {
                    parse::check_signature(item, &mut keys);
                }
            }
        }
        let parsed = Parsed {
            seq: chunk.seq,
            source: chunk.source,
            items,
            blank,
        };
        if results.send(parsed).is_err() {
            return;
        }
    }
}
