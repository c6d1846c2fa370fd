//! `sluice import`: load JSONL dumps (plain, gzip or zstd) into the store
//! with the relay's own acceptance rules, fast and in bounded memory.
//!
//! The import is a bulk client of the engine: the engine's writer thread
//! writes its batches (bulk mode, one transaction each) and the engine's
//! monitor ticks the one governor, with the import profile (the write
//! controller's import tuning, setpoint 0.70, against
//! `throttle.target_memory_mb` or `--target-memory-mb`). What is the
//! import's own: reading, parsing and verifying in parallel, putting the
//! chunks back in input order, batching, obeying the published verdict
//! ([`limiter`]), counting, progress and the summary.
//!
//! Pipeline (threads, and the bounded channels between them):
//! ```text
//! reader ──token(in-flight ≤ max_in_flight)──► work: sync_channel(2 × workers) of Chunk
//!    │                                              │ (shared receiver)
//!    │                                  parse+verify workers × N (all cores)
//!    │                                              │
//!    └── chunks numbered in input order     results: sync_channel(max_in_flight) of Parsed
//!                                                   ▼
//!                       batcher (this thread): reorders by number, batches
//!                       (smaller under pressure), limiter pause,
//!                       Engine::write_batch_blocking ──► engine writer thread
//!                       (one txn per batch), counts the outcomes
//! progress: every throttle.tick_ms draws progress and notes the heap the
//!           engine's monitor measured
//! ```
//! Who waits when a bound is hit: the reader, always. It takes a token
//! before sending a chunk and the batcher returns it when it takes that
//! chunk in order, so at most `max_in_flight` chunks (each at most
//! [`CHUNK_LINES`] lines or [`CHUNK_BYTES`]) exist between reader and
//! batcher, including those waiting to be reordered; the batcher holds at
//! most one batch, and waits while the engine writes it. Nothing is ever
//! dropped. The chunks in flight are the engine's bulk backlog
//! ([`Engine::bulk_backlog`]): the monitor reads their fill as the writer
//! queue's.
//!
//! Invariants: events reach the store in input order, so the result equals
//! publishing the lines one by one; each batch is one LMDB transaction, so a
//! crash leaves the store consistent and a re-run completes it (what was
//! committed comes back as duplicates); every non-blank line is counted in
//! exactly one outcome or refusal reason.

mod input;
mod limiter;
mod parse;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sluice_engine::{BulkTicket, Engine, Store, WriteOutcome, unix_now};
use sluice_proto::{Event, PubkeyCache};
use sluice_throttle::PidConfig;

use crate::config::Config;
use input::{Line, LineKind, LineSplitter, Source};
use limiter::Limiter;
use parse::{Checks, Item};
use report::{Live, Progress, Reporter, Sample, Summary};

/// Events per write transaction by default. Bigger transactions rewrite
/// fewer index pages per event as the store grows (docs/import-export.md,
/// "Store scale"), but without `store.write_map` LMDB copies each dirty page
/// to the heap: 32,768 imports the 1M file in 38-40 s instead of 47-49 s at
/// 16,384, with a peak heap of 561 MiB instead of 381 (65,536: 37 s, 834 MiB).
const BATCH_EVENTS: usize = 32_768;
/// The default with `store.write_map = true` (dirty pages live in the map).
const BATCH_EVENTS_WRITE_MAP: usize = 65_536;
/// Lines per chunk handed to a worker.
const CHUNK_LINES: usize = 512;
/// Parsed author keys each worker keeps (about 100 bytes each).
const PUBKEY_CACHE_KEYS: usize = 16_384;
/// Bytes per chunk handed to a worker (a chunk closes at either bound).
const CHUNK_BYTES: usize = 1 << 20;
/// A batch that has waited this long for more events is written anyway,
/// so a slow stream (a pipe) still commits regularly...
const FLUSH_AFTER: Duration = Duration::from_millis(250);
/// ...and one that keeps growing slowly is written at this age.
const MAX_BATCH_AGE: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// TOML configuration file (the store path and limits are those of `serve`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Skip the id and signature checks (for trusted dumps).
    #[arg(long)]
    no_verify: bool,
    /// Stop at the first refused line with a non-zero exit (what came before it is kept).
    #[arg(long)]
    strict: bool,
    /// Heap the import aims to stay under, MiB: the governor slows the
    /// import when pressure passes 0.70 of it [default: throttle.target_memory_mb].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    target_memory_mb: Option<u64>,
    /// Parse and verify threads [default: all cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: Option<u64>,
    /// Most events in one write transaction [default: 32768; 65536 with
    /// store.write_map = true, where a transaction's dirty pages are not heap].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    batch_events: Option<u64>,
    /// Most event bytes in one write transaction, MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch_mb: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// JSONL files, plain, gzip or zstd; `-` or none reads standard input.
    files: Vec<PathBuf>,
}

/// Everything the pipeline needs, fixed at start.
struct Plan {
    sources: Vec<Source>,
    checks: Checks,
    max_line_bytes: usize,
    workers: usize,
    max_in_flight: usize,
    /// The in-flight bound under memory pressure.
    base_in_flight: usize,
    batch_events: usize,
    batch_bytes: usize,
    strict: bool,
}

pub fn run(args: ImportArgs) -> anyhow::Result<()> {
    let mut cfg = Config::load(args.config.as_deref())?;
    crate::telemetry::init_logging(&cfg.log);
    let sources = sources(&args.files)?;
    let workers = args
        .threads
        .map(|n| n as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    // Alone (no relay has the store open), the import writes in the map:
    // the store crate's `alone.rs`.
    let store = cfg.store.open_for_import()?;
    if store.is_alone() {
        tracing::info!("the store is not open elsewhere: writing in the map");
    }
    let batch_events = args.batch_events.map_or(
        if store.writes_in_map() {
            BATCH_EVENTS_WRITE_MAP
        } else {
            BATCH_EVENTS
        },
        |n| n as usize,
    );
    let plan = Plan {
        checks: Checks {
            limits: cfg.limits.event_limits(),
            verify: !args.no_verify,
        },
        max_line_bytes: cfg.limits.max_message_bytes,
        workers,
        // Enough chunks for the workers to keep parsing and verifying the
        // next batch while the writer commits this one (a 16,384-event
        // commit takes about as long as verifying 10,000 events here).
        max_in_flight: 4 * workers + 4 + batch_events.div_ceil(2 * CHUNK_LINES),
        base_in_flight: 4 * workers + 4,
        batch_events,
        // Alone in the map, a batch fits the blocks reserved ahead of it.
        batch_bytes: store
            .alone_batch_bytes()
            .map_or(args.batch_mb << 20, |cap| cap.min(args.batch_mb << 20))
            as usize,
        strict: args.strict,
        sources,
    };
    // The import profile of the one governor.
    if let Some(mb) = args.target_memory_mb {
        cfg.throttle.target_memory_mb = mb;
    }
    cfg.throttle.write = PidConfig::import_default();
    cfg.throttle
        .validate()
        .map_err(|e| anyhow::anyhow!("import throttle configuration: {e}"))?;
    let target_memory_mb = cfg.throttle.target_memory_mb;
    let total_bytes = plan
        .sources
        .iter()
        .map(Source::size_bytes)
        .sum::<Option<u64>>();
    let reporter = Reporter::new(total_bytes);
    // Returns after the monitor's first tick: a first verdict before the
    // first batch, not an optimistic default.
    let engine = Engine::start(store.clone(), cfg.engine.clone(), cfg.throttle.clone())?;
    // The NIP-50 index is fed as the import commits, by its own thread;
    // beside a running relay, by the relay's (it reads what is committed).
    if let Err(e) = crate::reindex::start_indexer(&engine, &cfg.search, "the import") {
        engine.shutdown();
        return Err(e.into());
    }
    engine.set_retention(cfg.retention_plan());
    engine.bulk_backlog().set_bound(plan.max_in_flight as u64);
    let limiter = Limiter::new(engine.throttle().clone());
    let started = Instant::now();
    let result = pipeline(&plan, &engine, &limiter, &reporter);
    // Searchable once imported: the index takes the last batches.
    if !engine.wait_search_caught_up() {
        tracing::warn!("the search indexer stopped; run `sluice reindex`");
    }
    let elapsed = started.elapsed();
    reporter.finish();
    engine.shutdown();
    drop(engine);
    let (mut summary, outcome) = result;
    summary.sources = plan.sources.iter().map(Source::name).collect();
    summary.verified = plan.checks.verify;
    summary.written_in_map = store.writes_in_map();
    summary.elapsed_secs = elapsed.as_secs_f64();
    summary.lines_per_sec = summary.lines as f64 / summary.elapsed_secs.max(1e-9);
    summary.target_memory_mb = target_memory_mb;
    summary.throttled_secs = limiter.throttled().as_secs_f64();
    summary.throttle_pauses = limiter.pauses();
    summary.store_events = store.stats().map(|s| s.events).unwrap_or(0);
    eprint!("{}", summary.text());
    if let Some(path) = &args.summary_json {
        let json = serde_json::to_string_pretty(&summary)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    store.close();
    outcome?;
    if let Some(at) = &summary.stopped_at {
        bail!("--strict: stopped at {at}; the lines before it were imported");
    }
    let input_errors = summary
        .refused_by_reason
        .get(parse::Reason::InputError.as_str());
    if let Some(n) = input_errors {
        bail!("{n} input(s) could not be read to the end (see input-error above)");
    }
    Ok(())
}

/// The inputs, checked before anything starts so a typo fails at once.
fn sources(files: &[PathBuf]) -> anyhow::Result<Vec<Source>> {
    if files.is_empty() {
        return Ok(vec![Source { path: None }]);
    }
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        if f.as_os_str() == "-" {
            out.push(Source { path: None });
        } else {
            std::fs::File::open(f).with_context(|| format!("cannot read {}", f.display()))?;
            out.push(Source {
                path: Some(f.clone()),
            });
        }
    }
    Ok(out)
}

/// A numbered run of lines of one source.
struct Chunk {
    seq: u64,
    source: usize,
    buf: Vec<u8>,
    lines: Vec<Line>,
}

/// A chunk after the workers: its non-blank lines' verdicts, in order.
struct Parsed {
    seq: u64,
    source: usize,
    items: Vec<Item>,
    blank: u64,
}

/// Runs reader, workers, progress and batcher; returns the counts even
/// when the store failed, so the operator sees how far it got.
fn pipeline(
    plan: &Plan,
    engine: &Engine,
    limiter: &Limiter,
    reporter: &Reporter,
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
                    let state = engine.throttle().state();
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
            batcher.run(results_rx, tokens_rx)
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
    limiter: &Limiter,
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
            let Ok(rx) = chunks.lock() else { return };
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
            let mut stored = stored_flags(store, &items).into_iter();
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

/// The batcher: in-order consumer, batcher and counter; the engine's
/// writer writes its batches.
struct Batcher<'a> {
    plan: &'a Plan,
    engine: &'a Engine,
    limiter: &'a Limiter,
    reporter: &'a Reporter,
    live: &'a Live,
    summary: Summary,
    batch: Vec<Event>,
    batch_bytes: usize,
    batch_started: Option<Instant>,
    /// Where the last event of the batch came from, for error messages.
    batch_last: (usize, u64),
    /// The batch the writer has, and where its last event came from: the
    /// next batch is built while it is written (two batches held at most).
    writing: Option<(BulkTicket, (usize, u64))>,
}

impl<'a> Batcher<'a> {
    fn new(
        plan: &'a Plan,
        engine: &'a Engine,
        limiter: &'a Limiter,
        reporter: &'a Reporter,
        live: &'a Live,
    ) -> Self {
        Batcher {
            plan,
            engine,
            limiter,
            reporter,
            live,
            summary: Summary::default(),
            batch: Vec::with_capacity(plan.batch_events),
            batch_bytes: 0,
            batch_started: None,
            batch_last: (0, 0),
            writing: None,
        }
    }

    fn run(&mut self, results: Receiver<Parsed>, tokens: Receiver<()>) -> anyhow::Result<()> {
        let mut next_seq = 0u64;
        // Chunks that arrived ahead of their turn; bounded by the tokens.
        let mut ahead: BTreeMap<u64, Parsed> = BTreeMap::new();
        loop {
            let parsed = match ahead.remove(&next_seq) {
                Some(p) => p,
                None => {
                    let got = match self.batch_started {
                        Some(t) => results.recv_timeout(
                            FLUSH_AFTER.min(MAX_BATCH_AGE.saturating_sub(t.elapsed())),
                        ),
                        None => results.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    };
                    match got {
                        Ok(p) => {
                            ahead.insert(p.seq, p);
                            continue;
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            self.flush()?;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            // Every chunk sent was numbered without gaps.
                            if let Some(seq) = ahead.keys().next() {
                                bail!("internal error: chunk {next_seq} missing before {seq}");
                            }
                            break;
                        }
                    }
                }
            };
            next_seq += 1;
            // Its token goes back: the reader may read one more chunk.
            let _ = tokens.recv();
            self.engine.bulk_backlog().remove();
            if !self.take(parsed)? {
                break;
            }
        }
        self.flush()?;
        self.settle()
    }

    /// Counts one chunk's lines and batches its events. False when
    /// `--strict` must stop here.
    fn take(&mut self, parsed: Parsed) -> anyhow::Result<bool> {
        self.summary.blank_lines += parsed.blank;
        for item in parsed.items {
            self.summary.lines += 1;
            match item {
                Item::Event { line, event } => {
                    self.batch_bytes += event.raw().len();
                    self.batch.push(event);
                    self.batch_last = (parsed.source, line);
                    self.batch_started.get_or_insert_with(Instant::now);
                    if self.batch.len() >= self.limiter.batch_limit(self.plan.batch_events)
                        || self.batch_bytes >= self.plan.batch_bytes
                    {
                        self.flush()?;
                    }
                }
                Item::Expired => self.summary.expired += 1,
                Item::Bad {
                    line,
                    reason,
                    detail,
                } => {
                    let source = self.plan.sources[parsed.source].name();
                    let at = format!("{source}:{line}");
                    let printed = self.summary.refuse(Sample {
                        source,
                        line,
                        reason: reason.as_str(),
                        detail: detail.clone(),
                    });
                    self.live.refused.fetch_add(1, Ordering::Relaxed);
                    if printed {
                        self.reporter
                            .note(&format!("import: {at}: {}: {detail}", reason.as_str()));
                    }
                    if self.plan.strict {
                        self.summary.stopped_at = Some(format!("{at} ({})", reason.as_str()));
                        return Ok(false);
                    }
                }
            }
        }
        self.live.lines.store(self.summary.lines, Ordering::Relaxed);
        Ok(true)
    }

    /// Hands the batch to the engine's writer, to be written in one
    /// transaction (after the limiter's pause), once the batch before it is
    /// committed: the writer writes one batch while the next is built.
    fn flush(&mut self) -> anyhow::Result<()> {
        self.batch_started = None;
        if self.batch.is_empty() {
            return Ok(());
        }
        self.limiter
            .pause(self.batch.len() as f64 / self.plan.batch_events as f64);
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(self.plan.batch_events));
        self.batch_bytes = 0;
        self.settle()?;
        let ticket = self
            .engine
            .submit_batch_blocking(batch)
            .with_context(|| self.batch_error(self.batch_last))?;
        self.writing = Some((ticket, self.batch_last));
        Ok(())
    }

    fn batch_error(&self, (source, line): (usize, u64)) -> String {
        format!(
            "writing the batch ending at {}:{line} (re-run the same import to continue)",
            self.plan.sources[source].name()
        )
    }

    /// Waits for the batch the writer has, if any, and counts its outcomes.
    fn settle(&mut self) -> anyhow::Result<()> {
        let Some((ticket, last)) = self.writing.take() else {
            return Ok(());
        };
        let outcomes = ticket.wait().with_context(|| self.batch_error(last))?;
        let s = &mut self.summary;
        s.batches += 1;
        s.events += outcomes.len() as u64;
        for o in outcomes {
            match o {
                WriteOutcome::Stored {
                    replaced, deleted, ..
                } => {
                    s.stored += 1;
                    s.replaced += u64::from(replaced);
                    s.removed_by_deletions += u64::from(deleted);
                }
                WriteOutcome::Duplicate => s.duplicate += 1,
                WriteOutcome::Superseded => s.superseded += 1,
                WriteOutcome::Deleted => s.deleted += 1,
                WriteOutcome::Expired => s.expired += 1,
                WriteOutcome::Ephemeral => s.ephemeral += 1,
                WriteOutcome::OutsideRetention => s.outside_retention += 1,
                WriteOutcome::Vanished => s.vanished += 1,
            }
        }
        self.live.stored.store(s.stored, Ordering::Relaxed);
        Ok(())
    }
}
