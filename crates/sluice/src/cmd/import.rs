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
//! ([`pacer`]), counting, progress and the summary.
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
//!                       (smaller under pressure), pacer pause,
//!                       Engine::write_batch_blocking ──► engine writer thread
//!                       (one txn per batch), counts the outcomes
//! progress: every throttle.tick_ms draws progress and notes the heap the
//!           engine's monitor measured
//! search:   the engine's indexer (one tantivy thread per core), started
//!           once the last line is parsed (the writer still writing the
//!           last two batches); the import returns when it has indexed
//!           everything stored
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

mod batcher;
mod input;
mod pacer;
mod parse;
mod pipeline;
mod report;

use sluice_search::Workers;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use sluice_engine::Engine;
use sluice_throttle::PidConfig;

use crate::config::Config;
use input::Source;
use pacer::BulkPacer;
use parse::LineChecks;
use pipeline::pipeline;
use report::Reporter;

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
/// Bytes per chunk handed to a worker (a chunk closes at either bound).
const CHUNK_BYTES: usize = 1 << 20;

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
    checks: LineChecks,
    max_line_bytes: usize,
    workers: usize,
    max_in_flight: usize,
    /// The in-flight bound under memory pressure.
    base_in_flight: usize,
    batch_events: usize,
    batch_bytes: usize,
    strict: bool,
    /// The store held events when the import began: worth looking each
    /// chunk's ids up before verifying (a re-run after a crash). Into an
    /// empty store only this import's earlier batches could hold one (a
    /// line repeated in the dump), and the lookups would cost more than
    /// the verifications they spare.
    look_up_stored: bool,
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
        checks: LineChecks {
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
        look_up_stored: store.stats().map_or(true, |s| s.events > 0),
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
    engine.set_retention(cfg.retention_plan());
    engine.bulk_backlog().set_bound(plan.max_in_flight as u64);
    let limiter = BulkPacer::new(engine.limiter().clone());
    let started = Instant::now();
    // Searchable once imported: the NIP-50 index takes what was stored, on
    // every core, from when the parse threads have finished (indexing
    // beside them, on the same cores, cost more) while the writer writes
    // the last batches; beside a running relay, the relay's indexer does
    // it (it reads what is committed).
    let start_indexer =
        || crate::runtime::start_indexer(&engine, &cfg.search, "the import", Workers::Cores);
    let mut indexed = None;
    let result = pipeline(&plan, &engine, &limiter, &reporter, &mut || {
        indexed.get_or_insert_with(start_indexer);
    });
    // The pipeline ended before the last batch (a store error, a spawn
    // failure): what was stored is indexed all the same.
    let indexed = indexed.unwrap_or_else(start_indexer);
    match &indexed {
        Ok(()) if !engine.wait_search_caught_up() => {
            tracing::warn!("the search indexer stopped; run `sluice reindex`")
        }
        Ok(()) => {}
        Err(e) => {
            tracing::error!(error = %e, "the search index could not be built; run `sluice reindex`")
        }
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
