//! Sluice's front end: the axum router, WebSocket sessions, NIP-11, the
//! pages a browser reads (`pages`: the landing page, the live status), and
//! the operator endpoints (`/metrics`, `/healthz`, `/readyz`).
//!
//! Architecture invariant: this is the only crate that names axum. It holds
//! no store handle of its own: everything goes through the engine.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod accept;
pub mod address;
pub mod config;
pub mod metrics_names;
pub mod nip11;
pub mod nip86;
pub mod pages;
mod session;
mod upgrade;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice_engine::Engine;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use accept::MAX_ANSWERING;
pub use config::{AuthConfig, LimitsConfig, RelayInfoConfig, ServerConfig};
pub use session::ingest::{MirrorAnswer, MirrorFut, admit_mirrored};

use crate::metrics_names as m;

/// Renders the Prometheus text exposition; supplied by the binary, which
/// owns the recorder.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Everything a request or session needs, shared read-only.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub server: ServerConfig,
    pub auth: AuthConfig,
    /// Who reads on a connection that has not authenticated: shared by
    /// every such connection.
    anonymous_readers: Arc<sluice_proto::Readers>,
    /// `[limits]` and `[relay]`: replaced whole by a reload.
    front: ArcSwap<Reloadable>,
    /// `None` when /metrics is not served on the relay port.
    render_metrics: Option<MetricsRenderer>,
    /// What the status sampler reads, kept by the recorder's tap
    /// (`None`: no /status).
    status_source: Option<Arc<pages::status::Series>>,
    /// The live status's samples.
    status: pages::status::Board,
    /// What `/` answers a browser.
    landing: pages::Landing,
    /// Who may read the operator endpoints on the relay port.
    operators: address::TrustedProxies,
    /// Cancelled when the relay starts shutting down.
    pub shutdown: CancellationToken,
    sessions: TaskTracker,
    connections: Arc<Semaphore>,
    /// TCP connections not (yet) sessions, counted from accept.
    http_slots: Arc<accept::HttpSlots>,
    /// The connections' compression windows, bounded together.
    deflate_windows: Arc<sluice_ws::deflate::WindowBudget>,
    /// The series sessions record per message, their handles looked up once.
    pub(crate) recorded: session::Recorded,
}

/// The config sections the front end owns.
#[derive(Debug, Clone, Default)]
pub struct FrontEnd {
    pub server: ServerConfig,
    pub limits: LimitsConfig,
    pub auth: AuthConfig,
    pub relay: RelayInfoConfig,
    /// `server.landing_page`, read at start ([`pages::Landing::load`]).
    pub landing: pages::Landing,
}

/// The front end's sections a SIGHUP replaces: NIP-11 answers from the
/// current one, and a session keeps the one current when it opened (its
/// subscription cap, message bound and event limits do not change under
/// it).
#[derive(Debug)]
pub struct Reloadable {
    pub limits: LimitsConfig,
    pub event_limits: sluice_proto::EventLimits,
    pub relay: RelayInfoConfig,
}

impl Reloadable {
    fn new(limits: LimitsConfig, relay: RelayInfoConfig) -> Reloadable {
        Reloadable {
            event_limits: limits.event_limits(),
            limits,
            relay,
        }
    }
}

/// What the front end reads of the recorder: its rendering, for /metrics
/// on the relay port (`on_relay_port`), and the series its tap keeps for
/// the live status (`status`, [`pages::status::Tap`]).
#[derive(Clone, Default)]
pub struct Renderers {
    pub on_relay_port: Option<MetricsRenderer>,
    pub status: Option<Arc<pages::status::Series>>,
}

impl AppState {
    pub fn new(
        engine: Arc<Engine>,
        sections: FrontEnd,
        renderers: Renderers,
        operators: address::TrustedProxies,
        shutdown: CancellationToken,
    ) -> Arc<AppState> {
        let FrontEnd {
            server,
            limits,
            auth,
            relay,
            landing,
        } = sections;
        Arc::new(AppState {
            recorded: session::Recorded::default(),
            front: ArcSwap::from_pointee(Reloadable::new(limits, relay)),
            connections: Arc::new(Semaphore::new(server.max_connections)),
            deflate_windows: sluice_ws::deflate::WindowBudget::new(
                server.compression_windows_mb << 20,
            ),
            http_slots: accept::HttpSlots::new(accept::SlotLimits {
                max: server.max_http_connections,
                max_per_ip: server.max_http_connections_per_ip,
                queue_per_ip: server.handshake_queue_per_ip,
                queue_total: server.handshake_queue_total,
            }),
            anonymous_readers: Arc::new(sluice_proto::Readers::new(
                auth.private_kinds.clone(),
                Vec::new(),
            )),
            engine,
            server,
            auth,
            render_metrics: renderers.on_relay_port,
            status_source: renderers.status,
            status: pages::status::Board::default(),
            landing,
            operators,
            shutdown,
            sessions: TaskTracker::new(),
        })
    }
}

impl AppState {
    /// The current `[limits]` and `[relay]`.
    pub fn front(&self) -> Arc<Reloadable> {
        self.front.load_full()
    }

    /// Replaces `[limits]` and `[relay]` (validated by the caller, with
    /// the rest of the config): NIP-11 shows them at once, connections
    /// opened from now on use them.
    pub fn reload_front(&self, limits: LimitsConfig, relay: RelayInfoConfig) {
        self.front.store(Arc::new(Reloadable::new(limits, relay)));
    }
}

/// The relay's routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(root).options(preflight).post(management))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/throttle", get(throttle_status))
        .route("/status", get(status_page))
        .route("/status.json", get(status_json))
        .route("/assets/{name}", get(asset))
        .with_state(state)
}

/// Serves on an already bound listener until `state.shutdown` is
/// cancelled (see `accept` for how each TCP connection is bounded), then
/// waits (up to `shutdown_grace_ms`) for sessions to answer their pending
/// EVENTs and close.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    if let Some(series) = state.status_source.clone() {
        tokio::spawn(pages::status::run_sampler(state.clone(), series));
    }
    // One wait for the whole relay, not one per session: the sessions
    // learn of the stop through their live queues.
    let stopper = {
        let st = state.clone();
        tokio::spawn(async move {
            st.shutdown.cancelled().await;
            st.engine.stop_sessions();
        })
    };
    // The accept loop runs as a task, on the runtime's workers: what it
    // allocates for each connection (its socket's registration, its HTTP
    // task) comes from their heaps, beside the sessions', not the heap of
    // the thread that waits here, where it would leave its own holes.
    if let Err(e) = tokio::spawn(accept::run(listener, router(state.clone()), state.clone())).await
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
    let _ = stopper.await;
    state.sessions.close();
    let grace = Duration::from_millis(state.server.shutdown_grace_ms);
    if tokio::time::timeout(grace, state.sessions.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            sessions = state.sessions.len(),
            "sessions still open after the shutdown grace period"
        );
    }
    Ok(())
}

async fn root(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
) -> Response {
    let headers = std::mem::take(req.headers_mut());
    if sluice_ws::handshake::wants_upgrade(&headers) {
        let on_upgrade = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>();
        let upgrade = match upgrade::Upgrade::check(
            req.method(),
            &headers,
            on_upgrade,
            st.server.compression,
        ) {
            Ok(u) => u,
            Err(refused) => return refused.into_response(),
        };
        // The list was validated at load (and at each reload); one that
        // does not parse trusts no proxy.
        let proxies = st
            .engine
            .limiter()
            .with_config(|c| address::TrustedProxies::parse(&c.clients.trusted_proxies))
            .unwrap_or_default();
        let ip = proxies.client_ip_of(peer.ip(), &headers);
        if st.engine.policy().rules().ip_blocked(ip) {
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "reason" => "blocked_ip").increment(1);
            return (StatusCode::FORBIDDEN, "blocked\n").into_response();
        }
        let Ok(permit) = st.connections.clone().try_acquire_owned() else {
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "reason" => "max_connections")
                .increment(1);
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                retry_after(),
                "too many connections\n",
            )
                .into_response();
        };
        let Some(per_ip) = st.engine.limiter().open_connection(ip) else {
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "reason" => "max_connections_per_ip")
                .increment(1);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                retry_after(),
                "too many connections from your address\n",
            )
                .into_response();
        };
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // The session keeps the sections current at its upgrade.
        let front = st.front();
        let (answer, on_upgrade, deflate) = upgrade.respond();
        let opening = session::Opening {
            on_upgrade,
            deflate,
            st: st.clone(),
            front,
            host,
        };
        let session = session::run(opening, ip, (permit, per_ip));
        tokio::spawn(st.sessions.track_future(session));
        return answer;
    }
    let wants_nip11 = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/nostr+json"));
    if !wants_nip11 && wants_html(&headers) {
        match &st.landing {
            pages::Landing::Builtin => return landing_page(&st, peer, &headers),
            pages::Landing::Custom(page) => {
                return pages::html_response(page.to_string(), pages::CUSTOM_POLICY);
            }
            pages::Landing::Off => {}
        }
    }
    if wants_nip11 {
        let front = st.front();
        let doc = nip11::document(
            &front.relay,
            &front.limits,
            &st.auth,
            &st.engine.policy().rules(),
            &st.engine.retention().nip11,
            (
                st.engine.trust().difficulty_now(),
                st.engine.search_index().is_some(),
            ),
        );
        let mut resp = doc.into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/nostr+json"),
        );
        add_cors(resp.headers_mut());
        return resp;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "This is a Nostr relay (Sluice). Connect with a Nostr client over WebSocket.\n",
    )
        .into_response()
}

/// Whether the client asks for HTML (a browser).
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

/// The built-in landing page, from the sections current now.
fn landing_page(st: &AppState, peer: SocketAddr, headers: &HeaderMap) -> Response {
    let front = st.front();
    let rules = st.engine.policy().rules();
    let retention = st.engine.retention();
    let page = st.engine.limiter().with_config(|throttle| {
        pages::landing::render(&pages::landing::Facts {
            relay: &front.relay,
            limits: &front.limits,
            auth: &st.auth,
            rules: &rules,
            throttle,
            retention_target_bytes: retention.target_bytes,
            retention_rules: &retention.nip11,
            pow_difficulty: st.engine.trust().difficulty_now(),
            url: relay_url(st, headers),
            status_link: st.server.public_status || is_operator(st, peer, headers),
            search: st.engine.search_index().is_some(),
        })
    });
    pages::html_response(page, &pages::builtin_policy(&front.relay.icon))
}

/// The URL clients connect to: the first of `auth.relay_urls`, else the
/// one the browser used, `wss://` when a proxy says it came over https.
fn relay_url(st: &AppState, headers: &HeaderMap) -> String {
    if let Some(url) = st.auth.relay_urls.first() {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    format!("{}://{host}", if tls { "wss" } else { "ws" })
}

/// `/status`: the live status page (`pages::status`).
async fn status_page(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = status_refusal(&st, peer, &headers) {
        return refused;
    }
    let front = st.front();
    let rules = st.engine.policy().rules();
    let name = rules.name.as_deref().unwrap_or(&front.relay.name);
    let page = pages::status::page(&st.status.document(), name);
    pages::html_response(page, &pages::builtin_policy(""))
}

/// `/status.json`: what the status page's script polls.
async fn status_json(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = status_refusal(&st, peer, &headers) {
        return refused;
    }
    let body = serde_json::to_string(&st.status.document()).unwrap_or_default();
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The status is an operator endpoint unless `server.public_status`; it
/// does not exist where nothing samples (no tap on the recorder).
fn status_refusal(st: &AppState, peer: SocketAddr, headers: &HeaderMap) -> Option<Response> {
    if st.status_source.is_none() {
        return Some(StatusCode::NOT_FOUND.into_response());
    }
    if st.server.public_status {
        return None;
    }
    operator_refusal(st, peer, headers)
}

async fn asset(Path(name): Path<String>) -> Response {
    pages::asset(&name).unwrap_or_else(|| StatusCode::NOT_FOUND.into_response())
}

/// The `Retry-After` of a refused upgrade.
fn retry_after() -> [(header::HeaderName, HeaderValue); 1] {
    [(
        header::RETRY_AFTER,
        HeaderValue::from(accept::RETRY_AFTER_SESSION_SECS),
    )]
}

/// NIP-86 management (JSON-RPC, NIP-98 auth) on the relay URL.
async fn management(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    if !nip86::is_rpc(&headers) {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST here is NIP-86 management: Content-Type: application/nostr+json+rpc\n",
        )
            .into_response();
    }
    nip86::handle(st, headers, body).await
}

async fn preflight(method: Method) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if method == Method::OPTIONS {
        add_cors(resp.headers_mut());
    }
    resp
}

fn add_cors(h: &mut HeaderMap) {
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, OPTIONS"),
    );
}

async fn metrics(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    match &st.render_metrics {
        Some(render) => match operator_refusal(&st, peer, &headers) {
            None => metrics_response(render),
            Some(refused) => refused,
        },
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The operator endpoints on the relay port answer only a direct connection
/// (no proxy headers: a proxy on the same host would otherwise expose them)
/// from an address in `metrics.allow_from`; others get this 403.
fn operator_refusal(st: &AppState, peer: SocketAddr, headers: &HeaderMap) -> Option<Response> {
    if is_operator(st, peer, headers) {
        return None;
    }
    metrics::counter!(m::OPERATOR_REQUESTS_REFUSED_TOTAL).increment(1);
    Some(
        (
            StatusCode::FORBIDDEN,
            "forbidden: operator endpoint (see metrics.allow_from)\n",
        )
            .into_response(),
    )
}

/// A direct connection (no proxy headers) from `metrics.allow_from`.
fn is_operator(st: &AppState, peer: SocketAddr, headers: &HeaderMap) -> bool {
    let proxied = ["x-forwarded-for", "x-real-ip", "forwarded"]
        .iter()
        .any(|h| headers.contains_key(*h));
    !proxied && st.operators.contains(peer.ip())
}

fn metrics_response(render: &MetricsRenderer) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(),
    )
        .into_response()
}

/// Serves only /metrics on its own listener (`metrics.listen`), so an
/// operator can keep it off the public port.
pub async fn serve_metrics_only(
    listener: tokio::net::TcpListener,
    render: MetricsRenderer,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let render = render.clone();
            async move { metrics_response(&render) }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

/// The controller's state as JSON, for humans and scripts: the same
/// numbers /metrics exports, in one document.
async fn throttle_status(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = operator_refusal(&st, peer, &headers) {
        return refused;
    }
    let t = st.engine.limiter();
    let buckets: serde_json::Map<String, serde_json::Value> = t
        .bucket_stats()
        .into_iter()
        .map(|(name, s)| {
            (
                name.to_string(),
                serde_json::to_value(s).unwrap_or_default(),
            )
        })
        .collect();
    let doc = serde_json::json!({
        "mode": t.mode().as_str(),
        "state": t.state(),
        "buckets": buckets,
        "queries": st.engine.reads().stats(),
        "read_budget_units_per_second": t.read_cost_rate_per_ip(),
        "config": t.config(),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        doc.to_string(),
    )
        .into_response()
}

/// 200 `ready` while the engine's writer, monitor and store work and no
/// shutdown has begun; else 503 with what is wrong, e.g. `not ready:
/// writer stopped`. Reads atomics only.
async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let health = if st.shutdown.is_cancelled() {
        Err(sluice_engine::health::Unready::ShuttingDown)
    } else {
        st.engine.health()
    };
    match health {
        Ok(()) => {
            // Degraded but serving (e.g. a cluster node on local limits).
            let mut body = String::from("ready\n");
            for note in st.engine.notes() {
                body.push_str(&note);
                body.push('\n');
            }
            body.into_response()
        }
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}
