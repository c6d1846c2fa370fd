//! `sluice sync URL`: reconciles the local store with another relay over
//! NIP-77 (negentropy) and transfers only the difference.
//!
//! - The local set is the `(created_at, id)` of the stored events matching
//!   `--filter` (read from the store named by the config).
//! - `down`: the ids the remote has and this store lacks are fetched with
//!   REQ `{"ids": [...]}` in batches of [`peer::FETCH_BATCH`], verified,
//!   and written through the engine's writer (the import's path: the same
//!   write rules for duplicates, replaceable events, deletions, expiry).
//! - `up`: the ids this store has and the remote lacks are sent as EVENT,
//!   at most [`peer::UP_WINDOW`] awaiting their OK.
//!
//! The connection, ws:// or wss:// (with `--ca-file` for a private CA),
//! and the NIP-77 rounds are `peer.rs`, shared with the cluster's repairs
//! and the mirrors. Progress goes to stderr; the summary line counts what
//! was compared and moved. Run it with the local relay stopped, or beside
//! it (LMDB lets two processes write; the running relay then serves the
//! new events to REQs, not to live subscriptions).

use sluice_search::Workers;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use negentropy::Id;
use serde_json::{Value, json};
use sluice_engine::Engine;
use sluice_proto::Filter;
use sluice_store::WriteOutcome;

use crate::peer::{self, Direction, Item, Reconciled, Tls, Ws};

#[derive(Args)]
pub struct SyncArgs {
    /// The other relay, ws:// or wss://.
    url: String,
    /// A NIP-01 filter object: only events matching it are reconciled
    /// (`limit` ignored). Default: every event.
    #[arg(long)]
    filter: Option<String>,
    /// Which way events move.
    #[arg(long, value_enum, default_value = "down")]
    direction: Direction,
    /// TOML configuration file (the store path is that of `serve`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// PEM file of CA certificates a wss:// peer's certificate may chain
    /// to, besides the usual public roots (a private peer's CA).
    #[arg(long)]
    ca_file: Option<PathBuf>,
}

#[derive(Default, Debug)]
struct Summary {
    local: usize,
    remote_only: usize,
    local_only: usize,
    downloaded: usize,
    stored: usize,
    not_stored: usize,
    uploaded: usize,
    refused_up: usize,
    rounds: usize,
    /// No progress lines (a cluster repair inside `serve` logs instead).
    quiet: bool,
}

pub fn run(args: SyncArgs) -> anyhow::Result<()> {
    let cfg = crate::config::Config::load(args.config.as_deref())?;
    let filter_text = args.filter.as_deref().unwrap_or("{}");
    let mut filter = Filter::parse(filter_text).context("--filter")?;
    filter.limit = None;
    let tls = Tls::new(args.ca_file.as_deref()).context("--ca-file")?;
    let store = cfg.store.open()?;
    let started = Instant::now();
    let local = peer::local_items(&store, &filter)?;
    eprintln!("sync: {} local events match the filter", local.len());
    let engine = Engine::start(store.clone(), cfg.engine.clone(), cfg.throttle.clone())?;
    // What the sync stores is searchable when it ends.
    if let Err(e) = crate::runtime::start_indexer(&engine, &cfg.search, "the sync", Workers::One) {
        engine.shutdown();
        return Err(e.into());
    }
    engine.set_retention(cfg.retention_plan());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut summary = Summary {
        local: local.len(),
        ..Summary::default()
    };
    let result = runtime.block_on(sync(
        &args,
        (filter_text, &tls),
        &local,
        &store,
        &engine,
        &mut summary,
    ));
    if !engine.wait_search_caught_up() {
        tracing::warn!("the search indexer stopped; run `sluice reindex`");
    }
    engine.shutdown();
    drop(engine);
    store.close();
    eprintln!(
        "sync: {} local, {} only on the remote, {} only here; downloaded {} (stored {}, not stored {}), uploaded {} (refused {}); {} rounds, {:.1} s",
        summary.local,
        summary.remote_only,
        summary.local_only,
        summary.downloaded,
        summary.stored,
        summary.not_stored,
        summary.uploaded,
        summary.refused_up,
        summary.rounds,
        started.elapsed().as_secs_f64()
    );
    result
}

async fn sync(
    args: &SyncArgs,
    (filter_text, tls): (&str, &Tls),
    local: &[Item],
    store: &sluice_store::Store,
    engine: &std::sync::Arc<Engine>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let mut ws = peer::connect(&args.url, tls).await?;
    let filter: Value = serde_json::from_str(filter_text)?;
    let (have, need) = negotiate(&mut ws, filter, local, summary).await?;
    eprintln!(
        "sync: reconciled in {} rounds: {} only on the remote, {} only here",
        summary.rounds,
        need.len(),
        have.len()
    );
    if args.direction.down() {
        download(&mut ws, &need, engine, summary).await?;
    }
    if args.direction.up() {
        let (accepted, refused) = peer::upload(&mut ws, &have, store).await?;
        summary.uploaded = accepted;
        summary.refused_up = refused;
        eprintln!("sync: uploaded {accepted} ({refused} refused)");
    }
    let _ = ws.close(None).await;
    Ok(())
}

/// The NIP-77 rounds, counted in `summary`: `(ids only here, ids only on
/// the remote)`. A remote that does not reconcile is an error.
async fn negotiate(
    ws: &mut Ws,
    filter: Value,
    local: &[Item],
    summary: &mut Summary,
) -> anyhow::Result<(Vec<Id>, Vec<Id>)> {
    match peer::negotiate(ws, filter, local).await? {
        Reconciled::Done { have, need, rounds } => {
            summary.rounds = rounds;
            summary.remote_only = need.len();
            summary.local_only = have.len();
            Ok((have, need))
        }
        Reconciled::Unsupported(why) => bail!("{why}"),
    }
}

/// A cluster node's repair: reconciles the events created at or after
/// `since` (0: all) with the relay at `url` and stores what this node
/// lacks through the running engine's writer. Returns `(fetched,
/// stored)`.
pub async fn pull(
    url: String,
    since: u64,
    engine: std::sync::Arc<Engine>,
    (key, tls): (Option<[u8; 32]>, &Tls),
) -> anyhow::Result<(usize, usize)> {
    let store = engine.store().clone();
    let sized = engine.retention().target_bytes > 0;
    // Store reads: on a thread of its own, outside the runtime (serve
    // forbids transactions on any thread in the runtime's context).
    let (filter, local) =
        peer::off_runtime("sluice-repair", move || repair_items(&store, since, sized)).await?;
    let mut ws = peer::connect(&url, tls).await?;
    if let Some(key) = key {
        peer::authenticate(&mut ws, &url, &key).await?;
    }
    let mut summary = Summary {
        local: local.len(),
        quiet: true,
        ..Summary::default()
    };
    let (_, need) = negotiate(&mut ws, filter, &local, &mut summary).await?;
    download(&mut ws, &need, &engine, &mut summary).await?;
    let _ = ws.close(None).await;
    Ok((summary.downloaded, summary.stored))
}

/// What a repair reconciles: events since `since`, and, with a size target,
/// not older than what size eviction removed here (its horizon over every
/// kind): those were removed on purpose and are not downloaded again. (Age
/// and per-author rules are the same on every node of a cluster, so a peer
/// does not hold what they removed; the write path refuses any that still
/// arrive.) Returns the filter and the local item set.
fn repair_items(
    store: &sluice_store::Store,
    since: u64,
    sized: bool,
) -> anyhow::Result<(Value, Vec<Item>)> {
    let horizon = if sized {
        store
            .size_horizons()?
            .into_iter()
            .filter(|(scope, _)| *scope == sluice_store::Scope::All)
            .map(|(_, h)| h)
            .max()
            .unwrap_or(0)
    } else {
        0
    };
    let since = since.max(horizon);
    let filter = if since == 0 {
        json!({})
    } else {
        json!({ "since": since })
    };
    let parsed = Filter::parse(&filter.to_string()).context("repair filter")?;
    Ok((filter, peer::local_items(store, &parsed)?))
}

/// Fetches `need` by ids and writes each batch through the engine's
/// writer (bulk: the import's path and write rules).
async fn download(
    ws: &mut Ws,
    need: &[Id],
    engine: &std::sync::Arc<Engine>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let mut fetch = peer::Fetch::new(need);
    while let Some(events) = fetch.next(ws).await? {
        summary.downloaded += events.len();
        let engine = engine.clone();
        let outcomes = tokio::task::spawn_blocking(move || engine.write_batch_blocking(events))
            .await?
            .map_err(|e| anyhow::anyhow!("writing: {e}"))?;
        for o in outcomes {
            match o {
                WriteOutcome::Stored { .. } => summary.stored += 1,
                _ => summary.not_stored += 1,
            }
        }
        if !summary.quiet {
            eprintln!("sync: downloaded {} of {}", summary.downloaded, need.len());
        }
    }
    Ok(())
}
