//! `sluice sync URL`: reconciles the local store with another relay over
//! NIP-77 (negentropy) and transfers only the difference.
//!
//! - The local set is the `(created_at, id)` of the stored events matching
//!   `--filter` (read from the store named by the config).
//! - `down`: the ids the remote has and this store lacks are fetched with
//!   REQ `{"ids": [...]}` in batches of [`peer::FETCH_BATCH`], verified,
//!   and written through the engine's writer (the import's path: the same
//!   write rules for duplicates, replaceable events, deletions, expiry).
//! - `up`: the ids this store has and the remote lacks are sent as EVENT
//!   by the one uploader (`peer/upload.rs`): paced by AIMD from the
//!   remote's answers (`--up-start-rate`, `--up-max-rate`,
//!   `--up-decrease`), `rate-limited` events sent again within a retry
//!   budget, other refusals final and counted by prefix, at most
//!   [`peer::upload::UP_WINDOW`] awaiting their OK; a lost connection is opened
//!   again with a backoff, a bounded number of times in a row. Every 5 s a
//!   line gives the pace and the accepted rate (the rate over time); the
//!   end gives the rate it converged to, the retries and the refusals.
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
use sluice_throttle::aimd::PaceConfig;

use crate::peer::upload::{self, IdFeed, UpCounts};
use crate::peer::{self, Direction, Item, Reconciled, Tls, Uploader, Ws};

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
    /// Up: the first pace, EVENTs per second (doubled every half second
    /// until the remote's first `rate-limited` answer).
    #[arg(long, default_value_t = PaceConfig::default().start_rate_per_s)]
    up_start_rate: f64,
    /// Up: the highest pace, EVENTs per second.
    #[arg(long, default_value_t = PaceConfig::default().max_rate_per_s)]
    up_max_rate: f64,
    /// Up: a `rate-limited` answer cuts the pace to at least this fraction
    /// of it (to just under the rate the remote admitted, when higher).
    #[arg(long, default_value_t = PaceConfig::default().decrease)]
    up_decrease: f64,
}

impl SyncArgs {
    /// The pace flags, checked; an error names the flag.
    fn pace(&self) -> anyhow::Result<PaceConfig> {
        let pace = PaceConfig {
            start_rate_per_s: self.up_start_rate,
            max_rate_per_s: self.up_max_rate,
            decrease: self.up_decrease,
        };
        pace.validate().map_err(|e| {
            let flag = match e.key.as_str() {
                "start_rate_per_s" => "--up-start-rate",
                "max_rate_per_s" => "--up-max-rate",
                _ => "--up-decrease",
            };
            anyhow::anyhow!("{flag} {} is invalid: must be {}", e.value, e.expected)
        })?;
        Ok(pace)
    }
}

#[derive(Default, Debug)]
struct Summary {
    local: usize,
    remote_only: usize,
    local_only: usize,
    downloaded: usize,
    stored: usize,
    not_stored: usize,
    up: UpCounts,
    rounds: usize,
    /// No progress lines (a cluster repair inside `serve` logs instead).
    quiet: bool,
}

pub fn run(args: SyncArgs) -> anyhow::Result<()> {
    let cfg = crate::config::Config::load(args.config.as_deref())?;
    args.pace()?;
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
        summary.up.accepted,
        summary.up.refused_total(),
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
        let mut up = Uploader::new(args.pace()?, None);
        let started = Instant::now();
        let total = have.len();
        let mut progress = |up: &mut Uploader, feed: &IdFeed<'_>| {
            let c = up.counts().clone();
            eprintln!(
                "sync: up {:.1} s: pace {:.1}/s, accepted {:.1}/s over 10 s; {} of {total} read, \
                 {} sent, {} accepted, {} already there, {} refused, {} rate-limited, \
                 {} retried, {} in flight",
                started.elapsed().as_secs_f64(),
                up.rate_per_s(),
                up.accepted_per_s(),
                feed.taken(),
                c.first_sends + c.retried,
                c.accepted,
                c.already_there,
                c.refused_total(),
                c.rate_limited,
                c.retried,
                up.in_flight()
            );
        };
        let sent = upload::send_stored_reconnecting(
            &mut ws,
            (&args.url, tls),
            &mut up,
            &have,
            store,
            &mut progress,
        )
        .await;
        let c = up.counts().clone();
        eprintln!(
            "sync: uploaded {} ({} refused); {} already there; converged at {:.1}/s \
             (accepted over the last 10 s with a backlog), pace {:.1}/s; {} first sends, \
             {} retried after {} rate-limited answers; refused by prefix: {}; {:.1} s",
            c.accepted,
            c.refused_total(),
            c.already_there,
            up.converged_per_s(),
            up.rate_per_s(),
            c.first_sends,
            c.retried,
            c.rate_limited,
            c.refusals(),
            started.elapsed().as_secs_f64()
        );
        summary.up = c;
        sent.context("uploading")?;
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
