//! `sluice serve`: bind, open the store, start the engine (its writer,
//! query workers and monitor threads), report the bound address, serve
//! until SIGTERM/SIGINT, then shut down in order: stop accepting, let
//! sessions answer pending EVENTs, stop the monitor, let the writer commit
//! what it has, sync and close the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_engine::Engine;
use sluice_server::AppState;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::runtime::cancel_on_signal;
use crate::telemetry;

pub fn run(cfg: Config, config_file: Option<PathBuf>) -> anyhow::Result<()> {
    telemetry::init_logging(&cfg.log);
    let (metrics, status) = telemetry::init_metrics_with_status()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.server.runtime_threads(cores))
        .enable_all()
        .thread_name("sluice-rt")
        .build()
        .context("starting the async runtime")?;
    // Bound first, so a taken port fails before anything starts and the
    // monitor's first tick sees the relay's file descriptors.
    let listeners = runtime.block_on(bind(&cfg))?;
    let store = cfg.store.open()?;
    tracing::info!(path = %cfg.store.path.display(), "store open");
    // No LMDB transaction on an async worker: checked at every transaction
    // (a panic in debug builds, so in every black-box test).
    sluice_store::Store::forbid_transactions_where(|| {
        tokio::runtime::Handle::try_current().is_ok()
    });
    // The writer, query workers and monitor are engine threads, started
    // here (outside the runtime) and stopped by `shutdown`.
    let engine = Engine::start(store.clone(), cfg.engine.clone(), cfg.throttle.clone())?;
    // The NIP-50 indexer catches up with the store on its own thread.
    if let Err(e) = engine.start_search(cfg.search.clone(), sluice_search::Workers::One) {
        engine.shutdown();
        return Err(e.into());
    }
    // Retention runs on the writer thread from here on.
    engine.set_retention(cfg.retention_plan());
    // The web of trust is read from the store by its own thread; clients
    // are served once it has been (else every author would be an outsider
    // for a moment).
    engine.set_trust(cfg.trust.clone(), cfg.pow.clone())?;
    if !engine.trust().wait_ready(Duration::from_secs(120)) {
        tracing::warn!("web of trust still being read from the store after 120 s; serving anyway");
    }
    let result = runtime.block_on(serve(
        cfg,
        config_file,
        listeners,
        engine.clone(),
        metrics,
        status,
    ));
    // Sessions are gone: stop the monitor, let the writer commit what is
    // queued, then close.
    engine.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(5));
    drop(engine);
    store.close();
    tracing::info!("store closed, bye");
    result
}

/// The relay's listener, and the metrics-only one when `metrics.listen` is set.
struct Listeners {
    relay: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
}

async fn bind(cfg: &Config) -> anyhow::Result<Listeners> {
    let relay = tokio::net::TcpListener::bind(&cfg.server.listen)
        .await
        .with_context(|| format!("binding server.listen {}", cfg.server.listen))?;
    let metrics = if cfg.metrics.listen.is_empty() {
        None
    } else {
        let addr = &cfg.metrics.listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding metrics.listen {addr}"))?;
        Some(listener)
    };
    Ok(Listeners { relay, metrics })
}

/// Connections that are not sessions are capped to a quarter of the
/// descriptor limit, and those waiting in the handshake queue to an eighth,
/// when the configured caps do not fit in it: a flood of half-open
/// connections must leave descriptors for sessions, the store and the
/// operator endpoints (the caps answer the rest at accept).
fn fit_descriptors(server: &sluice_server::ServerConfig) -> sluice_server::ServerConfig {
    let mut server = server.clone();
    let Some(limit) = sluice_engine::process::open_files_limit() else {
        return server;
    };
    let wanted = (server.max_connections
        + server.max_http_connections
        + server.handshake_queue_total
        + sluice_server::MAX_ANSWERING) as u64
        + 64;
    if wanted > limit {
        let fit = (limit / 4).max(16) as usize;
        let fit_queue = (limit / 8).max(16) as usize;
        server.max_http_connections = server.max_http_connections.min(fit);
        server.handshake_queue_total = server.handshake_queue_total.min(fit_queue);
        server.handshake_queue_per_ip = server
            .handshake_queue_per_ip
            .min(server.handshake_queue_total);
        tracing::warn!(
            open_files_limit = limit,
            max_connections = server.max_connections,
            "server.max_connections + server.max_http_connections + \
             server.handshake_queue_total do not fit in the open-files limit (raise \
             LimitNOFILE / ulimit -n); connections that are not sessions are capped at {} \
             and those waiting for a handshake slot at {} meanwhile",
            server.max_http_connections,
            server.handshake_queue_total,
        );
    }
    server
}

async fn serve(
    cfg: Config,
    config_file: Option<PathBuf>,
    listeners: Listeners,
    engine: Arc<Engine>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    status: Arc<sluice_server::pages::status::Series>,
) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let upkeep = metrics.clone();
    let render: sluice_server::MetricsRenderer = Arc::new(move || upkeep.render());
    let listener = listeners.relay;
    let addr = listener.local_addr()?;
    engine
        .load_policy(cfg.policy.clone())
        .await
        .context("loading the runtime policy from the store")?;
    let auth = auth_with_cluster_reader(&cfg);
    // Read once here; `config` checked that it can be.
    let landing = sluice_server::pages::Landing::load(&cfg.server.landing_page)
        .map_err(anyhow::Error::msg)?;
    let state = AppState::new(
        engine.clone(),
        sluice_server::FrontEnd {
            server: fit_descriptors(&cfg.server),
            limits: cfg.limits.clone(),
            auth: auth.clone(),
            relay: cfg.relay.clone(),
            landing,
        },
        sluice_server::Renderers {
            on_relay_port: cfg.metrics.on_relay_port.then(|| render.clone()),
            status: Some(status),
        },
        // Validated at load.
        sluice_server::address::TrustedProxies::parse(&cfg.metrics.allow_from).unwrap_or_default(),
        shutdown.clone(),
    );
    reload_on_sighup(config_file, state.clone());
    spawn_metrics_upkeep(metrics, shutdown.clone());
    if let Some(listener) = listeners.metrics {
        tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(sluice_server::serve_metrics_only(
            listener,
            render,
            shutdown.clone(),
        ));
    }
    cancel_on_signal(shutdown.clone());
    let cluster = if cfg.cluster.enabled {
        let repair_engine = engine.clone();
        let repair_key = cfg.cluster.repair_key().map(|(sk, _)| sk);
        let ca_file = &cfg.cluster.repair_ca_file;
        let tls = crate::peer::Tls::new((!ca_file.is_empty()).then(|| Path::new(ca_file)))
            .context("cluster.repair_ca_file")?;
        let repair: sluice_cluster::RepairFn = Arc::new(move |url, since| {
            let engine = repair_engine.clone();
            let tls = tls.clone();
            Box::pin(async move {
                crate::cmd::sync::pull(url, since, engine, (repair_key, &tls))
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
        });
        if repair_key.is_none() && !auth.private_kinds.is_empty() {
            tracing::warn!(
                "cluster.repair_secret_key is empty: repairs read from the peers without \
                 authenticating, so events of auth.private_kinds that miss the stream are not \
                 repaired (set the same key on every node to repair them)"
            );
        }
        // Who reads every private event here, for the registry: a peer
        // whose repair key is not among them does not repair from this node.
        let full_readers = (!auth.private_kinds.is_empty()).then(|| {
            auth.full_readers
                .iter()
                .filter_map(|pk| sluice_proto::hex32::decode::<32>(pk))
                .collect()
        });
        let c = sluice_cluster::Cluster::start(
            cfg.cluster.clone(),
            engine.clone(),
            addr,
            repair,
            full_readers,
        )
        .map_err(anyhow::Error::msg)?;
        Some(c)
    } else {
        None
    };
    let mirrors = crate::cmd::mirror::Mirrors::start(&cfg.mirror, &state, &shutdown)?;
    tracing::info!("listening on ws://{addr}");
    let served = sluice_server::serve(listener, state)
        .await
        .context("serving");
    // The mirrors stop with the sessions; what they handed the writer is
    // committed before the engine stops.
    mirrors
        .stopped(Duration::from_millis(cfg.server.shutdown_grace_ms))
        .await;
    // Sessions are gone: the publisher hands on what they stored.
    if let Some(c) = cluster {
        c.shutdown().await;
    }
    served
}

/// `[auth]`, plus the cluster's repair pubkey as a full reader (the other
/// nodes authenticate with it to repair private kinds from this one).
fn auth_with_cluster_reader(cfg: &Config) -> sluice_server::AuthConfig {
    let mut auth = cfg.auth.clone();
    if cfg.cluster.enabled
        && let Some((_, pk)) = cfg.cluster.repair_key()
    {
        auth.full_readers.push(hex::encode(pk));
    }
    auth
}

/// SIGHUP re-reads the configuration (file and environment) and applies
/// `[throttle]`, `[retention]`, `[trust]`, `[pow]`, `[policy]` (but its
/// plugin), `[limits]` and `[relay]` as one snapshot, all or nothing (see
/// [`apply`]): a refused reload changes nothing, is counted `refused` and
/// logged with its reason.
/// Other sections need a restart (docs/configuration.md#reloading).
/// The handler is installed before this returns, so a SIGHUP sent once
/// the relay answers is a reload, never the default action (the end of
/// the process).
fn reload_on_sighup(config_file: Option<PathBuf>, state: Arc<AppState>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler");
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let applied = Config::load(config_file.as_deref()).and_then(|cfg| apply(cfg, &state));
            let result = if applied.is_ok() {
                "applied"
            } else {
                "refused"
            };
            metrics::counter!("sluice_config_reloads_total", "result" => result).increment(1);
            match applied {
                Ok(()) => tracing::info!(
                    "SIGHUP: settings reloaded (throttle, retention, trust, pow, policy, limits, relay)"
                ),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "SIGHUP: reload refused, keeping the running settings")
                }
            }
        }
    });
}

/// Applies a validated config's reloadable sections, all or nothing:
/// first every part that can refuse is prepared without changing anything
/// (the throttle's buckets and scheduler checked as they check a config,
/// the retention plan built, the new web of trust's thread started but
/// told nothing), then each is swapped in, and no swap can fail. An error
/// before the first swap drops what was prepared (the waiting thread ends).
fn apply(cfg: Config, state: &AppState) -> anyhow::Result<()> {
    let engine = &state.engine;
    let plan = cfg.retention_plan();
    let throttle = engine
        .prepare_throttle(cfg.throttle)
        .map_err(anyhow::Error::msg)?;
    let trust = engine
        .prepare_trust(cfg.trust, cfg.pow, &throttle.config().tiers)
        .map_err(|e| anyhow::anyhow!("[trust]: {e}"))?;
    // Nothing below can fail.
    engine.commit_throttle(throttle);
    engine.set_retention(plan);
    engine.commit_trust(trust);
    if engine.policy().reload(cfg.policy) {
        tracing::warn!(
            "SIGHUP: [policy.plugin] changed; the running plugin keeps its settings until a restart"
        );
    }
    state.reload_front(cfg.limits, cfg.relay);
    Ok(())
}

/// Histograms need periodic upkeep to drain their buffers.
fn spawn_metrics_upkeep(
    handle: metrics_exporter_prometheus::PrometheusHandle,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => handle.run_upkeep(),
            }
        }
    });
}
