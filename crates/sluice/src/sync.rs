//! `sluice sync URL`: reconciles the local store with another relay over
//! NIP-77 (negentropy) and transfers only the difference.
//!
//! - The local set is the `(created_at, id)` of the stored events matching
//!   `--filter` (read from the store named by the config).
//! - `down`: the ids the remote has and this store lacks are fetched with
//!   REQ `{"ids": [...]}` in batches of [`FETCH_BATCH`], verified, and
//!   written through the engine's writer (the import's path: the same write
//!   rules for duplicates, replaceable events, deletions, expiry).
//! - `up`: the ids this store has and the remote lacks are sent as EVENT,
//!   at most [`UP_WINDOW`] awaiting their OK.
//!
//! Progress goes to stderr; the summary line counts what was compared and
//! moved. Run it with the local relay stopped, or beside it (LMDB lets two
//! processes write; the running relay then serves the new events to REQs,
//! not to live subscriptions).

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use futures_util::{SinkExt, StreamExt};
use negentropy::{Id, Negentropy, NegentropyStorageVector};
use serde_json::{Value, json};
use sluice_engine::{Engine, QueryOptions, StoreError, WriteOutcome};
use sluice_proto::{Event, Filter};
use tokio_tungstenite::tungstenite::Message;

/// Ids asked for in one REQ.
const FETCH_BATCH: usize = 500;
/// EVENTs sent up and awaiting their OK, at most.
const UP_WINDOW: usize = 64;
/// Longest wait for any one answer of the remote.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Direction {
    Down,
    Up,
    Both,
}

#[derive(Args)]
pub struct SyncArgs {
    /// The other relay, ws:// or wss:// (wss needs a TLS build of the
    /// WebSocket client: use a local tunnel or ws://).
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

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub fn run(args: SyncArgs) -> anyhow::Result<()> {
    let cfg = crate::config::Config::load(args.config.as_deref())?;
    let filter_text = args.filter.as_deref().unwrap_or("{}");
    let mut filter = Filter::parse(filter_text).context("--filter")?;
    filter.limit = None;
    let store = cfg.store.open()?;
    let started = Instant::now();
    let local = local_items(&store, &filter)?;
    eprintln!("sync: {} local events match the filter", local.len());
    let engine = Engine::start(store.clone(), cfg.engine.clone(), cfg.throttle.clone())?;
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
        filter_text,
        &local,
        &store,
        &engine,
        &mut summary,
    ));
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

/// `(created_at, id)` of the stored events matching `filter`.
fn local_items(
    store: &sluice_engine::Store,
    filter: &Filter,
) -> anyhow::Result<Vec<(u64, [u8; 32])>> {
    let opts = QueryOptions {
        now: sluice_engine::unix_now(),
        max_scan_rows: u64::MAX,
    };
    let out = store
        .query(std::slice::from_ref(filter), &opts)
        .context("reading the local store")?;
    let mut items = Vec::with_capacity(out.events.len());
    for raw in &out.events {
        let ev = Event::parse(raw).context("a stored event does not parse")?;
        items.push((ev.created_at, ev.id));
    }
    Ok(items)
}

async fn next_text(ws: &mut Ws) -> anyhow::Result<Value> {
    loop {
        let msg = tokio::time::timeout(ANSWER_TIMEOUT, ws.next())
            .await
            .context("the remote did not answer in time")?
            .context("the remote closed the connection")??;
        if let Message::Text(t) = msg {
            let v: Value =
                serde_json::from_str(&t).context("the remote sent something not JSON")?;
            if v[0] == "AUTH" || v[0] == "NOTICE" {
                continue;
            }
            return Ok(v);
        }
    }
}

async fn sync(
    args: &SyncArgs,
    filter_text: &str,
    local: &[(u64, [u8; 32])],
    store: &sluice_engine::Store,
    engine: &std::sync::Arc<Engine>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let (mut ws, _) = tokio_tungstenite::connect_async(&args.url)
        .await
        .with_context(|| format!("connecting to {}", args.url))?;
    let filter: Value = serde_json::from_str(filter_text)?;
    let (have, need) = negotiate(&mut ws, filter, local, summary).await?;
    eprintln!(
        "sync: reconciled in {} rounds: {} only on the remote, {} only here",
        summary.rounds,
        need.len(),
        have.len()
    );
    if args.direction != Direction::Up {
        download(&mut ws, &need, engine, summary).await?;
    }
    if args.direction != Direction::Down {
        upload(&mut ws, &have, store, summary).await?;
    }
    let _ = ws.close(None).await;
    Ok(())
}

/// The NEG-OPEN / NEG-MSG rounds: `(ids only here, ids only on the
/// remote)`.
async fn negotiate(
    ws: &mut Ws,
    mut filter: Value,
    local: &[(u64, [u8; 32])],
    summary: &mut Summary,
) -> anyhow::Result<(Vec<Id>, Vec<Id>)> {
    let mut storage = NegentropyStorageVector::with_capacity(local.len());
    for (t, id) in local {
        storage.insert(*t, Id::from_byte_array(*id))?;
    }
    storage.seal()?;
    let mut neg = Negentropy::owned(storage, 60_000)?;
    if let Some(obj) = filter.as_object_mut() {
        obj.remove("limit");
    }
    let first = neg.initiate()?;
    send(ws, json!(["NEG-OPEN", "sync", filter, hex::encode(first)])).await?;
    let (mut have, mut need): (Vec<Id>, Vec<Id>) = (Vec::new(), Vec::new());
    loop {
        let m = next_text(ws).await?;
        match m[0].as_str() {
            Some("NEG-MSG") if m[1] == "sync" => {
                summary.rounds += 1;
                let msg = hex::decode(m[2].as_str().unwrap_or(""))
                    .context("the remote's NEG-MSG is not hex")?;
                match neg.reconcile_with_ids(&msg, &mut have, &mut need)? {
                    Some(next) => send(ws, json!(["NEG-MSG", "sync", hex::encode(next)])).await?,
                    None => break,
                }
            }
            Some("NEG-ERR") => bail!("the remote refused the reconciliation: {}", m[2]),
            _ => {}
        }
    }
    send(ws, json!(["NEG-CLOSE", "sync"])).await?;
    summary.remote_only = need.len();
    summary.local_only = have.len();
    Ok((have, need))
}

/// A cluster node's repair: reconciles the events created at or after
/// `since` (0: all) with the relay at `url` and stores what this node
/// lacks through the running engine's writer. Returns `(fetched,
/// stored)`.
pub async fn pull(
    url: String,
    since: u64,
    engine: std::sync::Arc<Engine>,
    key: Option<[u8; 32]>,
) -> anyhow::Result<(usize, usize)> {
    let store = engine.store().clone();
    let sized = engine.retention().target_bytes > 0;
    // Store reads: on a thread of its own, outside the runtime (serve
    // forbids transactions on any thread in the runtime's context).
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sluice-repair".into())
        .spawn(move || {
            let _ = tx.send(repair_items(&store, since, sized));
        })
        .context("starting the repair's reader thread")?;
    let (filter, local) = rx.await.context("the repair's reader thread failed")??;
    let (mut ws, _) = tokio_tungstenite::connect_async(&url)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    if let Some(key) = key {
        authenticate(&mut ws, &url, &key).await?;
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

/// A negentropy item: `(created_at, id)`.
type Item = (u64, [u8; 32]);

/// What a repair reconciles: events since `since`, and, with a size target,
/// not older than what size eviction removed here (its horizon over every
/// kind): those were removed on purpose and are not downloaded again. (Age
/// and per-author rules are the same on every node of a cluster, so a peer
/// does not hold what they removed; the write path refuses any that still
/// arrive.) Returns the filter and the local item set.
fn repair_items(
    store: &sluice_engine::Store,
    since: u64,
    sized: bool,
) -> anyhow::Result<(Value, Vec<Item>)> {
    let horizon = if sized {
        store
            .size_horizons()?
            .into_iter()
            .filter(|(scope, _)| *scope == sluice_engine::Scope::All)
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
    Ok((filter, local_items(store, &parsed)?))
}

/// How long a repair waits for the challenge a peer sends at connect.
const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(5);

/// NIP-42 with `key`: waits for the challenge the peer sends at connect
/// (`auth.challenge_on_connect`), answers it and waits for OK true. An
/// error says why, for the repair's log line.
async fn authenticate(ws: &mut Ws, url: &str, key: &[u8; 32]) -> anyhow::Result<()> {
    let challenge = loop {
        let msg = tokio::time::timeout(CHALLENGE_TIMEOUT, ws.next())
            .await
            .with_context(|| {
                format!(
                    "the peer sent no AUTH challenge within {} s: its auth.enabled or \
                     auth.challenge_on_connect is off, and a repair with \
                     cluster.repair_secret_key needs both",
                    CHALLENGE_TIMEOUT.as_secs()
                )
            })?
            .context("the peer closed the connection")??;
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).context("the peer sent something not JSON")?;
            if v[0] == "AUTH"
                && let Some(c) = v[1].as_str()
            {
                break c.to_string();
            }
        }
    };
    let tags = vec![
        vec!["relay".to_string(), url.to_string()],
        vec!["challenge".to_string(), challenge],
    ];
    let ev = Event::try_sign(key, sluice_engine::unix_now(), 22242, tags, "")
        .context("the repair key is not a secp256k1 secret key")?;
    ws.send(Message::Text(format!("[\"AUTH\",{}]", ev.raw()).into()))
        .await?;
    loop {
        let m = next_text(ws).await?;
        if m[0] == "OK" && m[1] == ev.id_hex().as_str() {
            if m[2] == true {
                return Ok(());
            }
            bail!(
                "the peer refused our AUTH: {}",
                m[3].as_str().unwrap_or_default()
            );
        }
    }
}

async fn send(ws: &mut Ws, v: Value) -> anyhow::Result<()> {
    ws.send(Message::Text(v.to_string().into())).await?;
    Ok(())
}

async fn download(
    ws: &mut Ws,
    need: &[Id],
    engine: &std::sync::Arc<Engine>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    for (n, batch) in need.chunks(FETCH_BATCH).enumerate() {
        let sub = format!("get{n}");
        let ids: Vec<String> = batch.iter().map(|i| hex::encode(i.as_bytes())).collect();
        let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
        send(ws, json!(["REQ", sub, {"ids": ids, "limit": batch.len()}])).await?;
        let mut events = Vec::new();
        loop {
            let m = next_text(ws).await?;
            match m[0].as_str() {
                Some("EVENT") if m[1] == sub.as_str() => {
                    let raw = m[2].to_string();
                    let Ok(ev) = Event::parse(&raw) else { continue };
                    if !wanted.contains(ev.id_hex().as_str()) || ev.verify().is_err() {
                        continue;
                    }
                    events.push(ev);
                }
                Some("EOSE") if m[1] == sub.as_str() => break,
                Some("CLOSED") if m[1] == sub.as_str() => {
                    bail!("the remote closed a fetch: {}", m[2])
                }
                _ => {}
            }
        }
        send(ws, json!(["CLOSE", sub])).await?;
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

async fn upload(
    ws: &mut Ws,
    have: &[Id],
    store: &sluice_engine::Store,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let now = sluice_engine::unix_now();
    let mut waiting: HashSet<String> = HashSet::new();
    let mut queue = have.iter();
    loop {
        while waiting.len() < UP_WINDOW {
            let Some(id) = queue.next() else { break };
            let raw = store
                .get(id.as_bytes(), now)
                .map_err(|e: StoreError| anyhow::anyhow!("reading a local event: {e}"))?;
            let Some(raw) = raw else { continue };
            ws.send(Message::Text(format!("[\"EVENT\",{raw}]").into()))
                .await?;
            waiting.insert(hex::encode(id.as_bytes()));
        }
        if waiting.is_empty() {
            break;
        }
        let m = next_text(ws).await?;
        if m[0] == "OK"
            && let Some(id) = m[1].as_str()
            && waiting.remove(id)
        {
            if m[2] == true {
                summary.uploaded += 1;
            } else {
                summary.refused_up += 1;
            }
        }
    }
    eprintln!(
        "sync: uploaded {} ({} refused)",
        summary.uploaded, summary.refused_up
    );
    Ok(())
}
