//! Live mirroring of another relay: `[[mirror]]` entries run inside
//! `sluice serve`, and `sluice mirror URL` runs one alone against the local
//! store (like `sluice sync`), until interrupted.
//!
//! One task per mirror. At every connection (ws:// or wss://, `peer.rs`):
//! 1. catch-up: NIP-77 over the mirror's filter; `down` fetches what only
//!    the peer has, `up` sends what only this store has. A peer that does
//!    not reconcile (NEG-ERR, a NOTICE, or silence) is caught up from by
//!    the live REQ instead, `since` the newest event seen from it;
//! 2. live: `down` keeps a REQ with the filter open (`since` the
//!    connection's start less `live_overlap_secs`); `up` sends what the
//!    engine's mirror tap offers (`engine/src/mirror_tap.rs`).
//!
//! Up, both parts go through the mirror's one `peer::Uploader`
//! (`peer/upload.rs`), kept across connections: paced by AIMD from the
//! peer's answers, `rate-limited` events sent again within a retry budget,
//! other refusals final and counted by prefix (`up_start_rate_per_s`,
//! `up_max_rate_per_s`, `up_decrease`). What awaited its OK when a
//! connection was lost goes again on the next, unless that connection's
//! reconciliation says what the peer lacks first.
//!
//! On a lost connection it tries again after an exponential backoff
//! (`reconnect_min_ms` doubling to `reconnect_max_ms`, jittered) and
//! catches up again.
//!
//! Invariants:
//! - Every event from the peer goes through the one admission pipeline
//!   (`sluice_server::admit_mirrored`: limits, policy, trust and proof of
//!   work, signature, NIP-70, NIP-62, plugin, writer) but the client
//!   buckets, with this mirror's origin: the writer never offers it back to
//!   this mirror's tap, so nothing is sent back to the peer it came from.
//! - Bounded: down, at most `queue_events` events in admission (reading
//!   the socket pauses while it is full, counted); up, the tap's queue of
//!   `queue_events` (full: dropped and counted, the next catch-up sends
//!   them), the uploader's own bounded queues, and at most
//!   [`peer::upload::UP_WINDOW`] EVENTs awaiting their OK.
//! - Everything a mirror holds is owned by its task (the connection, the
//!   `connected` gauge's guard, the tap's registration, the uploader with
//!   one `in_flight` guard per EVENT awaiting its OK): it stops with the
//!   shutdown token, and the gauges return to 0 (`in_flight` also when a
//!   connection is lost).

use sluice_search::Workers;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use sluice_engine::Engine;
use sluice_engine::clock::unix_now;
use sluice_engine::mirror_tap::MirrorTap;
use sluice_engine::mirror_tap::Origin;
use sluice_proto::{Event, PubkeyCache};
use sluice_server::{AppState, MirrorAnswer, MirrorFut};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, MirrorConfig};
use crate::metrics_names as m;
use crate::peer::Direction;
use crate::peer::upload::{self, Ended, IdFeed, Outgoing, UpMetrics};
use crate::peer::{self, Reconciled, Tls, Uploader, Ws};

/// A peer silent this long (no frame, not even a Pong) is taken as gone.
const SILENT_FOR: Duration = Duration::from_secs(75);
/// How often a Ping goes to the peer (it also keeps the connection out of
/// a relay's idle timeout).
const PING_EVERY: Duration = Duration::from_secs(20);
/// How long an event the writer's full queue turned away waits before it
/// is handed in again.
const BUSY_PAUSE: Duration = Duration::from_millis(50);
/// Authors' parsed keys a mirror keeps.
const KEY_CACHE: usize = 256;
/// The live subscription's id at the peer.
const LIVE_SUB: &str = "mirror";

/// The running mirrors.
pub struct Mirrors {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Mirrors {
    /// Starts one task per entry (on the current runtime); each stops when
    /// `stop` is cancelled. An error names the entry whose CA file is bad.
    pub fn start(
        cfgs: &[MirrorConfig],
        state: &Arc<AppState>,
        stop: &CancellationToken,
    ) -> anyhow::Result<Mirrors> {
        let mut mirrors = Vec::with_capacity(cfgs.len());
        for (i, cfg) in cfgs.iter().enumerate() {
            let tls = cfg.tls().with_context(|| format!("mirror[{i}].ca_file"))?;
            mirrors.push(Mirror::new(cfg.clone(), tls, state.clone()));
        }
        let tasks = mirrors
            .into_iter()
            .map(|mirror| tokio::spawn(mirror.run(stop.clone())))
            .collect();
        Ok(Mirrors { tasks })
    }

    /// Waits (at most `grace`) for every task to end after the stop.
    pub async fn stopped(self, grace: Duration) {
        let all = futures_util::future::join_all(self.tasks);
        if tokio::time::timeout(grace, all).await.is_err() {
            tracing::warn!("mirrors still running after the shutdown grace period");
        }
    }
}

/// One mirror's metric handles, labelled with its peer.
struct Tally {
    peer: String,
    connected: metrics::Gauge,
    lag: metrics::Gauge,
    reconnects: metrics::Counter,
    down_full: metrics::Counter,
}

impl Tally {
    fn new(peer: &str) -> Tally {
        let p = peer.to_string();
        Tally {
            connected: metrics::gauge!(m::MIRROR_CONNECTED, "peer" => p.clone()),
            lag: metrics::gauge!(m::MIRROR_LAG_SECONDS, "peer" => p.clone()),
            reconnects: metrics::counter!(m::MIRROR_RECONNECTS_TOTAL, "peer" => p.clone()),
            down_full: metrics::counter!(m::MIRROR_QUEUE_FULL_TOTAL, "peer" => p.clone(), "direction" => "down"),
            peer: p,
        }
    }

    /// The uploader's series.
    fn up(&self) -> UpMetrics {
        let p = || self.peer.clone();
        UpMetrics {
            peer: p(),
            rate: metrics::gauge!(m::MIRROR_UP_RATE_EVENTS_PER_SECOND, "peer" => p()),
            in_flight: metrics::gauge!(m::MIRROR_UP_IN_FLIGHT, "peer" => p()),
            retried_rate_limited: metrics::counter!(m::MIRROR_UP_RETRIES_TOTAL, "peer" => p(), "cause" => "rate_limited"),
            retried_reconnect: metrics::counter!(m::MIRROR_UP_RETRIES_TOTAL, "peer" => p(), "cause" => "reconnect"),
            accepted: metrics::counter!(m::MIRROR_EVENTS_OUT_TOTAL, "peer" => p(), "result" => "accepted"),
            duplicate: metrics::counter!(m::MIRROR_EVENTS_OUT_TOTAL, "peer" => p(), "result" => "duplicate"),
            refused: metrics::counter!(m::MIRROR_EVENTS_OUT_TOTAL, "peer" => p(), "result" => "refused"),
        }
    }

    fn up_full(&self) -> metrics::Counter {
        metrics::counter!(m::MIRROR_QUEUE_FULL_TOTAL, "peer" => self.peer.clone(), "direction" => "up")
    }

    fn event_in(&self, outcome: &'static str) {
        metrics::counter!(m::MIRROR_EVENTS_IN_TOTAL, "peer" => self.peer.clone(), "outcome" => outcome)
            .increment(1);
    }

    fn catch_up(&self, method: &'static str) {
        metrics::counter!(m::MIRROR_CATCHUPS_TOTAL, "peer" => self.peer.clone(), "method" => method)
            .increment(1);
    }
}

/// The `connected` gauge at 1 while held.
struct Connected(metrics::Gauge);

impl Connected {
    fn hold(g: &metrics::Gauge) -> Connected {
        g.set(1.0);
        Connected(g.clone())
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.set(0.0);
    }
}

/// Events from the peer in admission, at most `cap`.
struct Down {
    st: Arc<AppState>,
    origin: Origin,
    keys: PubkeyCache,
    window: FuturesUnordered<MirrorFut>,
    cap: usize,
    /// The newest `created_at` seen from the peer (the catch-up of a peer
    /// that does not reconcile starts there).
    newest_seen: u64,
}

impl Down {
    /// Hands `ev` to admission, first waiting for room in the window (the
    /// socket is not read meanwhile).
    async fn admit(&mut self, ev: Event, peer: IpAddr, tally: &Tally) {
        if self.window.len() >= self.cap {
            tally.down_full.increment(1);
            while self.window.len() >= self.cap {
                if let Some(a) = self.window.next().await {
                    self.settled(a, tally);
                }
            }
        }
        self.push(ev, peer);
    }

    fn push(&mut self, ev: Event, peer: IpAddr) {
        self.newest_seen = self.newest_seen.max(ev.created_at);
        let first =
            sluice_server::admit_mirrored(&self.st, ev.clone(), peer, self.origin, &mut self.keys);
        let (st, origin) = (self.st.clone(), self.origin);
        self.window.push(Box::pin(async move {
            let mut answer = first.await;
            // The writer's queue was full: backpressure, not a refusal.
            while answer.busy {
                tokio::time::sleep(BUSY_PAUSE).await;
                let mut keys = PubkeyCache::new(1);
                answer =
                    sluice_server::admit_mirrored(&st, ev.clone(), peer, origin, &mut keys).await;
            }
            answer
        }));
    }

    fn settled(&mut self, a: MirrorAnswer, tally: &Tally) {
        tally.event_in(a.outcome);
        if a.outcome == "refused" {
            tracing::debug!(peer = %tally.peer, reason = %a.message, "mirror: an event from the peer was refused");
        }
    }
}

struct Mirror {
    cfg: MirrorConfig,
    tls: Tls,
    filter: Value,
    st: Arc<AppState>,
    /// The tap of what this relay stores (up), or none (down only).
    tap: Option<MirrorTap>,
    /// The sender up (up), or none (down only).
    up: Option<Uploader>,
    down: Down,
    tally: Tally,
}

impl Mirror {
    fn new(cfg: MirrorConfig, tls: Tls, st: Arc<AppState>) -> Mirror {
        let tally = Tally::new(&peer::redact(&cfg.url));
        let engine = &st.engine;
        let tap = match (cfg.direction.up(), cfg.parsed_filter()) {
            (true, Ok(filter)) => {
                Some(engine.mirror_tap(filter, cfg.queue_events, tally.up_full()))
            }
            _ => None,
        };
        let origin = match &tap {
            Some(t) => t.origin(),
            None => engine.mirror_origin(),
        };
        let down = Down {
            st: st.clone(),
            origin,
            keys: PubkeyCache::new(KEY_CACHE),
            window: FuturesUnordered::new(),
            cap: cfg.queue_events,
            newest_seen: 0,
        };
        let up = cfg
            .direction
            .up()
            .then(|| Uploader::new(cfg.pace(), Some(tally.up())));
        Mirror {
            filter: cfg.filter_value(),
            cfg,
            tls,
            st,
            tap,
            up,
            down,
            tally,
        }
    }

    async fn run(mut self, stop: CancellationToken) {
        tracing::info!(peer = %self.tally.peer, direction = ?self.cfg.direction, "mirror: starting");
        let mut failures: u32 = 0;
        loop {
            let mut live = false;
            let ended = tokio::select! {
                () = stop.cancelled() => break,
                r = self.session(&mut live) => r,
            };
            if live {
                failures = 0;
            }
            if let Some(up) = &mut self.up {
                up.connection_lost();
            }
            let why = match ended {
                Ok(()) => "the peer closed the connection".to_string(),
                Err(e) => format!("{e:#}"),
            };
            let wait = backoff(&self.cfg, failures);
            failures = failures.saturating_add(1);
            tracing::warn!(peer = %self.tally.peer, error = %why, retry_in_ms = wait.as_millis() as u64, "mirror: connection lost");
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
            self.tally.reconnects.increment(1);
        }
        tracing::info!(peer = %self.tally.peer, "mirror: stopped");
    }

    /// One connection: catch up, then stay live until it is lost. `live`
    /// is set once the live part works (the live REQ's EOSE, or at once
    /// for an up-only mirror): the backoff starts over only then, so a
    /// peer that refuses the REQ is not asked again every
    /// `reconnect_min_ms`.
    async fn session(&mut self, live: &mut bool) -> anyhow::Result<()> {
        let mut ws = peer::connect(&self.cfg.url, &self.tls).await?;
        let ip = peer::peer_ip(&ws);
        let _connected = Connected::hold(&self.tally.connected);
        if let Some(up) = &mut self.up {
            up.connected();
        }
        let started = unix_now();
        let reconciled = self.catch_up(&mut ws, ip).await?;
        if self.cfg.direction.down() {
            let since = if reconciled {
                Some(started)
            } else {
                (self.down.newest_seen > 0).then_some(self.down.newest_seen)
            };
            let mut filter = self.filter.clone();
            if let (Some(since), Some(obj)) = (since, filter.as_object_mut()) {
                let since = since.saturating_sub(self.cfg.live_overlap_secs);
                let floor = obj.get("since").and_then(Value::as_u64).unwrap_or(0);
                obj.insert("since".into(), json!(since.max(floor)));
            }
            peer::send(&mut ws, json!(["REQ", LIVE_SUB, filter])).await?;
        }
        self.live(&mut ws, ip, live).await
    }

    /// The catch-up by NIP-77. Whether the peer reconciled.
    async fn catch_up(&mut self, ws: &mut Ws, ip: IpAddr) -> anyhow::Result<bool> {
        let store = self.st.engine.store().clone();
        let filter = self.cfg.parsed_filter().map_err(anyhow::Error::msg)?;
        let local = peer::off_runtime("sluice-mirror-read", move || {
            peer::local_items(&store, &filter)
        })
        .await?;
        let (have, need) = match peer::negotiate(ws, self.filter.clone(), &local).await? {
            Reconciled::Done { have, need, .. } => (have, need),
            Reconciled::Unsupported(why) => {
                tracing::info!(peer = %self.tally.peer, %why, "mirror: the peer does not reconcile (NIP-77); catching up by REQ since the newest event seen");
                self.tally.catch_up("req");
                return Ok(false);
            }
        };
        self.tally.catch_up("negentropy");
        tracing::info!(peer = %self.tally.peer, only_there = need.len(), only_here = have.len(), "mirror: reconciled");
        if self.cfg.direction.down() {
            let mut fetch = peer::Fetch::new(&need);
            while let Some(events) = fetch.next(ws).await? {
                for ev in events {
                    self.down.admit(ev, ip, &self.tally).await;
                }
            }
        }
        if let Some(up) = &mut self.up {
            // The reconciliation found what the peer lacks, queued or not.
            up.forget_queued();
            let store = self.st.engine.store().clone();
            let mut feed = IdFeed::new(&have);
            let sent = upload::send_stored(ws, up, &mut feed, &store, &mut |_, _| {}).await;
            if let Err(Ended::Lost(e) | Ended::Failed(e)) = sent {
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Live: events from the live REQ into admission, events from the tap
    /// up to the peer; a Ping every [`PING_EVERY`]. Returns when the
    /// connection is lost.
    async fn live(&mut self, ws: &mut Ws, ip: IpAddr, eose: &mut bool) -> anyhow::Result<()> {
        let up_only = !self.cfg.direction.down();
        // Up only: live once the peer answers (or with nothing to send), so
        // a peer that drops every EVENT meets a growing backoff.
        *eose = up_only && self.up.as_ref().is_none_or(Uploader::is_idle);
        let mut ping = tokio::time::interval(PING_EVERY);
        let mut heard = tokio::time::Instant::now();
        let down_cap = self.down.cap;
        loop {
            let up_room = self.up.as_ref().is_some_and(|u| u.room() > 0);
            let send_in = self.up.as_mut().and_then(Uploader::next_send_in);
            if let (Some(up), Some(Duration::ZERO)) = (&mut self.up, send_in) {
                up.send_next(ws).await?;
                continue;
            }
            let nap = send_in.unwrap_or(PING_EVERY);
            tokio::select! {
                biased;
                // At most queue_events in admission (the socket is not read while full).
                Some(a) = self.down.window.next(), if !self.down.window.is_empty() => {
                    self.down.settled(a, &self.tally);
                }
                // Into the uploader's bounded queue while it has room (the
                // tap's queue holds queue_events meanwhile).
                ev = next_up(&mut self.tap), if up_room => {
                    let Some(ev) = ev else { bail!("the engine stopped") };
                    if let Some(up) = &mut self.up {
                        up.push(Outgoing { id: ev.id_hex(), raw: ev.raw().to_string() });
                    }
                }
                // The next send, when the pace and the retry budget allow.
                () = tokio::time::sleep(nap), if send_in.is_some() => {}
                frame = ws.next(), if self.down.window.len() < down_cap => {
                    heard = tokio::time::Instant::now();
                    let text = match frame {
                        None => return Ok(()),
                        Some(Err(e)) => return Err(e.into()),
                        Some(Ok(Message::Text(t))) => t,
                        Some(Ok(Message::Close(_))) => return Ok(()),
                        Some(Ok(_)) => continue,
                    };
                    let Ok(v) = serde_json::from_str::<Value>(&text) else { continue };
                    self.on_message(v, ip, eose)?;
                    if up_only && self.up.as_ref().is_some_and(Uploader::answered_here) {
                        *eose = true;
                    }
                }
                _ = ping.tick() => {
                    if self.down.window.len() >= down_cap {
                        // Not listening: silence cannot be judged.
                        heard = tokio::time::Instant::now();
                    }
                    if heard.elapsed() > SILENT_FOR {
                        bail!("the peer sent nothing for {} s", SILENT_FOR.as_secs());
                    }
                    ws.send(Message::Ping(Vec::new().into())).await?;
                }
            }
        }
    }

    fn on_message(&mut self, v: Value, ip: IpAddr, eose: &mut bool) -> anyhow::Result<()> {
        match v[0].as_str() {
            Some("EVENT") if v[1] == LIVE_SUB => {
                let Ok(ev) = Event::parse(&v[2].to_string()) else {
                    self.tally.event_in("invalid");
                    return Ok(());
                };
                if *eose {
                    let lag = unix_now().saturating_sub(ev.created_at);
                    self.tally.lag.set(lag as f64);
                }
                self.down.push(ev, ip);
                if self.down.window.len() >= self.down.cap {
                    // The socket is not read until there is room again.
                    self.tally.down_full.increment(1);
                }
            }
            Some("EOSE") if v[1] == LIVE_SUB => *eose = true,
            Some("CLOSED") if v[1] == LIVE_SUB => {
                bail!("the peer closed the live subscription: {}", v[2]);
            }
            Some("OK" | "NOTICE") => {
                if v[0] == "NOTICE" {
                    tracing::debug!(peer = %self.tally.peer, notice = %v[1], "mirror: notice from the peer");
                } else if v[2] != true {
                    tracing::debug!(peer = %self.tally.peer, reason = %v[3], "mirror: the peer refused an event");
                }
                if let Some(up) = &mut self.up {
                    up.on_message(&v);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The next event the tap offers; never, without a tap.
async fn next_up(tap: &mut Option<MirrorTap>) -> Option<Arc<Event>> {
    match tap {
        Some(t) => t.recv().await,
        None => std::future::pending().await,
    }
}

/// The wait before the next connection after `failures` failures in a row:
/// `reconnect_min_ms` doubled per failure, at most `reconnect_max_ms`,
/// then a random half of it taken off (so mirrors that lost their peer
/// together do not come back together).
fn backoff(cfg: &MirrorConfig, failures: u32) -> Duration {
    peer::backoff(cfg.reconnect_min_ms, cfg.reconnect_max_ms, failures)
}

#[derive(Args)]
pub struct MirrorArgs {
    /// The other relay, ws:// or wss://.
    url: String,
    /// Which way events move.
    #[arg(long, value_enum, default_value = "down")]
    direction: Direction,
    /// A NIP-01 filter object: only events matching it move (`limit`
    /// ignored). Default: every event.
    #[arg(long)]
    filter: Option<String>,
    /// TOML configuration file (the store path is that of `serve`; its
    /// `[[mirror]]` entries are not run here).
    #[arg(long)]
    config: Option<PathBuf>,
    /// PEM file of CA certificates a wss:// peer's certificate may chain
    /// to, besides the usual public roots (a private peer's CA).
    #[arg(long)]
    ca_file: Option<PathBuf>,
}

/// `sluice mirror URL`: one mirror against the local store until SIGINT or
/// SIGTERM. Its metrics are served on `metrics.listen` when that is set.
pub fn run(args: MirrorArgs) -> anyhow::Result<()> {
    let cfg = Config::load(args.config.as_deref())?;
    let filter = match &args.filter {
        Some(text) => match serde_json::from_str::<Value>(text).context("--filter")? {
            Value::Object(map) => map,
            _ => bail!("--filter: not a JSON object"),
        },
        None => Map::new(),
    };
    let mirror = MirrorConfig {
        url: args.url.clone(),
        direction: args.direction,
        filter,
        ca_file: args
            .ca_file
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        ..MirrorConfig::default()
    };
    mirror
        .validate(0)
        .map_err(|e| anyhow::anyhow!("{}", e.replacen("mirror[0].", "--", 1)))?;
    crate::telemetry::init_logging(&cfg.log);
    let metrics = crate::telemetry::init_metrics()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-rt")
        .build()
        .context("starting the async runtime")?;
    let store = cfg.store.open()?;
    sluice_store::Store::forbid_transactions_where(|| {
        tokio::runtime::Handle::try_current().is_ok()
    });
    let engine = Engine::start(store.clone(), cfg.engine.clone(), cfg.throttle.clone())?;
    engine.set_retention(cfg.retention_plan());
    // What the mirror stores is indexed as it goes.
    let result = crate::runtime::start_indexer(&engine, &cfg.search, "the mirror", Workers::One)
        .map_err(anyhow::Error::new)
        .and_then(|()| {
            engine
                .set_trust(cfg.trust.clone(), cfg.pow.clone())
                .map_err(anyhow::Error::new)
        })
        .and_then(|()| runtime.block_on(alone(&cfg, mirror, engine.clone(), metrics)));
    engine.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(5));
    drop(engine);
    store.close();
    result
}

async fn alone(
    cfg: &Config,
    mirror: MirrorConfig,
    engine: Arc<Engine>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> anyhow::Result<()> {
    engine
        .load_policy(cfg.policy.clone())
        .await
        .context("loading the runtime policy from the store")?;
    let stop = CancellationToken::new();
    let state = AppState::new(
        engine,
        sluice_server::FrontEnd {
            server: cfg.server.clone(),
            limits: cfg.limits.clone(),
            auth: cfg.auth.clone(),
            relay: cfg.relay.clone(),
            landing: sluice_server::pages::Landing::Off,
        },
        sluice_server::Renderers::default(),
        sluice_server::address::TrustedProxies::default(),
        stop.clone(),
    );
    if !cfg.metrics.listen.is_empty() {
        let listener = tokio::net::TcpListener::bind(&cfg.metrics.listen)
            .await
            .with_context(|| format!("binding metrics.listen {}", cfg.metrics.listen))?;
        tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
        let render: sluice_server::MetricsRenderer = Arc::new(move || metrics.render());
        tokio::spawn(sluice_server::serve_metrics_only(
            listener,
            render,
            stop.clone(),
        ));
    }
    crate::runtime::cancel_on_signal(stop.clone());
    let mirrors =
        Mirrors::start(std::slice::from_ref(&mirror), &state, &stop).context("--ca-file")?;
    stop.cancelled().await;
    mirrors
        .stopped(Duration::from_millis(cfg.server.shutdown_grace_ms))
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_takes_off_at_most_half() {
        let cfg = MirrorConfig {
            reconnect_min_ms: 100,
            reconnect_max_ms: 1_000,
            ..MirrorConfig::default()
        };
        for (failures, full) in [(0, 100), (1, 200), (3, 800), (4, 1_000), (60, 1_000)] {
            let d = backoff(&cfg, failures).as_millis() as u64;
            assert!(
                (full - full / 2..=full).contains(&d),
                "{failures} failures: {d} ms"
            );
        }
    }

    #[test]
    fn an_entry_names_its_bad_key() {
        let bad = |f: fn(&mut MirrorConfig)| {
            let mut c = MirrorConfig {
                url: "wss://relay.example".into(),
                ..MirrorConfig::default()
            };
            f(&mut c);
            c.validate(2).unwrap_err()
        };
        assert!(bad(|c| c.url = "https://x".into()).starts_with("mirror[2].url"));
        assert!(
            bad(|c| {
                c.filter.insert("kinds".into(), json!("x"));
            })
            .starts_with("mirror[2].filter")
        );
        assert!(bad(|c| c.queue_events = 0).starts_with("mirror[2].queue_events"));
        assert!(bad(|c| c.reconnect_max_ms = 1).starts_with("mirror[2].reconnect_max_ms"));
        assert!(bad(|c| c.up_decrease = 1.0).starts_with("mirror[2].up_decrease"));
        assert!(bad(|c| c.up_start_rate_per_s = 0.0).starts_with("mirror[2].up_start_rate_per_s"));
        assert!(bad(|c| c.up_max_rate_per_s = 1.0).starts_with("mirror[2].up_max_rate_per_s"));
    }
}
