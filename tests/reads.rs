//! Black-box tests of the read path's bookkeeping when clients vanish:
//! query slots, places in the query queue, subscriptions and connections
//! must all come back once the clients holding them are gone, however they
//! went: while their REQ waited for a slot, just as it was woken, while its
//! query ran, in the middle of its answer, or dropped by the relay for not
//! reading. A leak here is not a slow drift: with every slot leaked, every
//! REQ from anyone is refused until a restart.
//!
//! The traffic is chosen by a seeded RNG so a failing run can be replayed
//! (`SLUICE_TEST_SEED=<n>`); what the tests assert never depends on timing:
//! they wait for every client to finish, then poll /metrics up to a
//! deadline for the idle state, then check that a new REQ is answered.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use sluice_proto::Event;
use support::*;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

// ------------------------------------------------------------------ setup

/// Notes in the store, and the content bytes of each: a REQ for most of
/// them is an answer of megabytes, far more than the sockets buffer, so a
/// client that does not read stalls the relay's sends.
const STORED: usize = 3000;
const CONTENT_BYTES: usize = 1500;
/// Authors of the stored notes.
const AUTHORS: usize = 60;
/// Limits of the big REQs.
const BIG_LIMITS: [u64; 3] = [1000, 2000, 3000];

const SEND_TIMEOUT_MS: u64 = 300;
const QUEUE_TIMEOUT_MS: u64 = 3000;
/// How long a client that never reads stays connected: long enough for its
/// first REQ to wait out the queue, run, and stall the relay's send past
/// the send timeout, so the relay drops it as a slow consumer first.
const HOLD: Duration = Duration::from_millis(QUEUE_TIMEOUT_MS + 1000);
/// The receive buffer of the clients: a few KiB, so that a client that
/// stops reading stalls the relay after a few messages rather than after
/// the kernel's autotuned megabytes.
const CLIENT_RCVBUF: u32 = 4096;
/// How long the relay may take to be idle once every client has gone.
const IDLE_DEADLINE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);

/// Settings of both tests: a short send timeout (clients that do not read
/// are dropped as slow consumers), a short queue timeout and a small queue
/// window (REQs queue, and are refused quickly), `slots` query slots, and
/// per-IP and per-author buckets wide enough that they refuse none of the
/// tests' traffic.
fn settings(slots: u32) -> Vec<(&'static str, String)> {
    vec![
        (
            "SLUICE_SERVER__SEND_TIMEOUT_MS",
            SEND_TIMEOUT_MS.to_string(),
        ),
        ("SLUICE_THROTTLE__QUERIES__SLOTS", slots.to_string()),
        (
            "SLUICE_THROTTLE__QUERIES__DEADLINE_MS",
            QUEUE_TIMEOUT_MS.to_string(),
        ),
        ("SLUICE_THROTTLE__QUERIES__MAX_QUEUED", "8".into()),
        (
            "SLUICE_THROTTLE__QUERIES__MAX_QUEUED_PER_CLIENT",
            "4".into(),
        ),
        // Small steps: a big answer is many chunks, so clients leave
        // between them as well as during one.
        ("SLUICE_THROTTLE__QUERIES__STEP_ROWS", "100".into()),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_IP__RATE_PER_S",
            "1000000000".into(),
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__RATE_PER_S",
            "1000000000".into(),
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S",
            "10000".into(),
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S",
            "10000".into(),
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S",
            "10000".into(),
        ),
    ]
}

/// A relay on a store that holds [`STORED`] signed notes, imported with
/// `sluice import` before the relay starts. The directory must outlive the
/// relay (drop order: declare the pair as `let (_dir, relay) = ...`).
fn loaded_relay(slots: u32) -> (tempfile::TempDir, Relay) {
    loaded_relay_with(slots, &[])
}

/// [`loaded_relay`] with more settings.
fn loaded_relay_with(slots: u32, more: &[(&str, &str)]) -> (tempfile::TempDir, Relay) {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let base = now() - 100_000;
    let notes: Vec<Event> = (0..STORED)
        .map(|i| {
            let author = 1 + (i % AUTHORS) as u8;
            let content = format!("{i:06} {}", "x".repeat(CONTENT_BYTES));
            ev(author, base + i as u64, 1, &[&["t", "reads"]], &content)
        })
        .collect();
    import_events(&store, &notes);
    let env = settings(slots);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(more);
    let relay = Relay::start_in(&store, &env);
    (tmp, relay)
}

/// The seed of the traffic: `SLUICE_TEST_SEED`, else a fixed one.
fn seed() -> u64 {
    std::env::var("SLUICE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2ead)
}

/// xorshift64*: reproducible choices without a dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng((seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
        for _ in 0..4 {
            r.next();
        }
        r
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn big_limit(&mut self) -> u64 {
        BIG_LIMITS[self.below(BIG_LIMITS.len() as u64) as usize]
    }
}

// ------------------------------------------------------------ raw clients

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A WebSocket from `source` with a small receive buffer; `None` if the
/// relay refused it (a refusal is an answer, not a failure of these tests).
async fn open(url: &str, source: &str) -> Option<Ws> {
    let addr: SocketAddr = url.trim_start_matches("ws://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(CLIENT_RCVBUF).unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(addr).await.ok()?;
    let (ws, _) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream))
        .await
        .ok()?;
    Some(ws)
}

/// Sends one message; false if the relay has already dropped us.
async fn send(ws: &mut Ws, msg: Value) -> bool {
    ws.send(Message::Text(msg.to_string().into())).await.is_ok()
}

async fn send_event(ws: &mut Ws, e: &Event) -> bool {
    ws.send(Message::Text(format!("[\"EVENT\",{}]", e.raw()).into()))
        .await
        .is_ok()
}

/// The next text message before `deadline`; `None` on the deadline or when
/// the connection ended.
async fn next_until(ws: &mut Ws, deadline: Instant) -> Option<Value> {
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, ws.next()).await.ok()?? {
            Ok(Message::Text(t)) => return serde_json::from_str(&t).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Reads up to `n` messages before `deadline`; how many came.
async fn read_some(ws: &mut Ws, n: usize, deadline: Instant) -> usize {
    let mut got = 0;
    while got < n && next_until(ws, deadline).await.is_some() {
        got += 1;
    }
    got
}

/// Reads until the EOSE (or CLOSED) of `sub`, or the deadline.
async fn read_to_end_of(ws: &mut Ws, sub: &str, deadline: Instant) {
    while let Some(m) = next_until(ws, deadline).await {
        if (m[0] == "EOSE" || m[0] == "CLOSED") && m[1] == sub {
            return;
        }
    }
}

/// Leaves: with a close frame, or by dropping the TCP connection with
/// whatever is unread (the kernel answers further data with a reset).
async fn leave(mut ws: Ws, abrupt: bool) {
    if !abrupt {
        let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    }
    drop(ws);
}

fn big_req(sub: &str, limit: u64) -> Value {
    json!(["REQ", sub, {"kinds": [1], "limit": limit}])
}

/// Sends `n` big REQs at once and reads until the first EVENT of one of
/// them, then stops reading: the relay is in the middle of an answer of
/// thousands of events that will never be read, and this client's other
/// REQs are waiting for (or being woken to) a slot behind it. While every
/// REQ of a batch is refused, sends another batch, until `deadline`.
async fn stall(ws: &mut Ws, rng: &mut Rng, n: u64, deadline: Instant) {
    for batch in 0.. {
        for j in 0..n {
            if !send(ws, big_req(&format!("r{batch}.{j}"), rng.big_limit())).await {
                return;
            }
        }
        let mut open = n;
        while open > 0 {
            let Some(m) = next_until(ws, deadline).await else {
                return;
            };
            if m[0] == "EVENT" {
                return;
            }
            if m[0] == "CLOSED" || m[0] == "EOSE" {
                open -= 1;
            }
        }
        // Every REQ refused (the queue was full): try again shortly.
        tokio::time::sleep(Duration::from_millis(20 + rng.below(100))).await;
    }
    unreachable!()
}

// ---------------------------------------------------------------- metrics

/// What a gauge reads when no client is connected.
#[derive(Debug, Clone, Copy)]
enum Idle {
    /// Exactly this value.
    Is(f64),
    /// At most what it read before the first client connected.
    AtMostBefore,
}

/// Every gauge of docs/metrics.md that counts a per-client resource
/// (connections, subscriptions, queries running or waiting, work in
/// flight), with its idle value. A new gauge that counts something a client
/// holds must be added here; `every_gauge_returns_to_idle_after_clients_leave`
/// fails until each gauge of the doc is in this list or in [`NOT_PER_CLIENT`].
const PER_CLIENT_GAUGES: &[(&str, Idle)] = &[
    ("sluice_connections_open", Idle::Is(0.0)),
    ("sluice_ws_deflate_window_bytes", Idle::Is(0.0)),
    ("sluice_connections_authenticated", Idle::Is(0.0)),
    ("sluice_plugin_in_flight", Idle::Is(0.0)),
    ("sluice_negentropy_sessions_open", Idle::Is(0.0)),
    ("sluice_subscriptions_open", Idle::Is(0.0)),
    ("sluice_live_subscriptions", Idle::Is(0.0)),
    ("sluice_query_window_in_flight", Idle::Is(0.0)),
    ("sluice_query_window_queued", Idle::Is(0.0)),
    ("sluice_query_open", Idle::Is(0.0)),
    ("sluice_query_open_units", Idle::Is(0.0)),
    ("sluice_query_parked", Idle::Is(0.0)),
    ("sluice_query_clients", Idle::Is(0.0)),
    ("sluice_query_clients_waiting", Idle::Is(0.0)),
    ("sluice_writer_queue_events", Idle::Is(0.0)),
    // One per connection, plus listeners and the store.
    ("sluice_process_open_fds", Idle::AtMostBefore),
    // The scrape itself is one.
    ("sluice_http_connections_open", Idle::AtMostBefore),
    ("sluice_handshake_queue_waiting", Idle::Is(0.0)),
];

/// How [`every_gauge_returns_to_idle_after_clients_leave`] knows each gauge
/// of [`PER_CLIENT_GAUGES`] was raised by its clients, so that its return
/// to idle means something.
#[derive(Debug, Clone, Copy)]
enum Raised {
    /// A scrape during the traffic read it above its idle value (the
    /// clients hold it for a while: a connection, an open subscription, an
    /// authenticated pubkey, a negentropy session, a parked query, an
    /// event the plugin is slow to judge).
    Seen,
    /// Too brief for a scrape to catch, but this counter rising means it
    /// was raised: e.g. every query step ran in a worker slot.
    ImpliedBy(&'static str),
}

const HOW_RAISED: &[(&str, Raised)] = &[
    ("sluice_connections_open", Raised::Seen),
    ("sluice_connections_authenticated", Raised::Seen),
    ("sluice_plugin_in_flight", Raised::Seen),
    ("sluice_negentropy_sessions_open", Raised::Seen),
    ("sluice_subscriptions_open", Raised::Seen),
    ("sluice_live_subscriptions", Raised::Seen),
    (
        "sluice_query_window_in_flight",
        Raised::ImpliedBy("sluice_query_steps_total"),
    ),
    // Sampled by the monitor from the scheduler's counts every tick, so a
    // short queue may fall between samples; every admitted query joins
    // the queue (and its client the rotation) before its first step.
    (
        "sluice_query_window_queued",
        Raised::ImpliedBy("sluice_query_admitted_total"),
    ),
    ("sluice_query_open", Raised::Seen),
    ("sluice_query_open_units", Raised::Seen),
    ("sluice_query_parked", Raised::Seen),
    ("sluice_query_clients", Raised::Seen),
    (
        "sluice_query_clients_waiting",
        Raised::ImpliedBy("sluice_query_admitted_total"),
    ),
    // Every event written waited in the writer's queue.
    (
        "sluice_writer_queue_events",
        Raised::ImpliedBy("sluice_events_written_total"),
    ),
    ("sluice_process_open_fds", Raised::Seen),
    // A compressing client holds its window until the end of its wave.
    ("sluice_ws_deflate_window_bytes", Raised::Seen),
    // Every WebSocket session began as an HTTP connection.
    (
        "sluice_http_connections_open",
        Raised::ImpliedBy("sluice_connections_opened_total"),
    ),
    // Every connection admitted from the queue waited in it ([`burst`]).
    (
        "sluice_handshake_queue_waiting",
        Raised::ImpliedBy("sluice_handshake_queue_admitted_total"),
    ),
];

/// The highest value each gauge of [`PER_CLIENT_GAUGES`] read while the
/// traffic ran: scrapes every few ms until `stop`.
async fn sample_peaks(addr: String, stop: tokio::sync::watch::Receiver<bool>) -> Vec<f64> {
    let mut peaks = vec![f64::MIN; PER_CLIENT_GAUGES.len()];
    while !*stop.borrow() {
        let body = http_get(&addr, "/metrics", None).await.2;
        for (peak, (name, _)) in peaks.iter_mut().zip(PER_CLIENT_GAUGES) {
            *peak = peak.max(value(&body, name));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    peaks
}

/// Fails unless each gauge of [`PER_CLIENT_GAUGES`] is known to have been
/// raised: read above its idle value, or its counter risen.
fn assert_each_raised(peaks: &[f64], before: &str, after: &str) {
    let mut not_raised = Vec::new();
    for ((name, idle), peak) in PER_CLIENT_GAUGES.iter().zip(peaks) {
        let how = HOW_RAISED
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, how)| *how)
            .unwrap_or_else(|| panic!("{name} is not in HOW_RAISED"));
        let idle_value = match idle {
            Idle::Is(x) => *x,
            Idle::AtMostBefore => value(before, name),
        };
        let raised = match how {
            Raised::Seen => *peak > idle_value,
            Raised::ImpliedBy(counter) => value(after, counter) > value(before, counter),
        };
        if !raised {
            not_raised.push(format!("{name} ({how:?}; peak {peak}, idle {idle_value})"));
        }
    }
    assert!(
        not_raised.is_empty(),
        "seed {}: no client raised {}",
        seed(),
        not_raised.join(", ")
    );
}

/// The doc's other gauges, and why they have no idle value to return to.
const NOT_PER_CLIENT: &[&str] = &[
    // Constant.
    "sluice_build_info",
    // The search index: where the indexer is and the index's size follow
    // the store, not who is connected; its lag drains by itself
    // (tests/search.rs waits for it).
    "sluice_search_indexed_serial",
    "sluice_search_lag_events",
    "sluice_search_index_bytes",
    // Cluster mode only (off here): Redis' state, the stream's lag, the
    // keys of the last limits reconcile. The outbound queue drains when
    // Redis answers, whoever is connected (tests/cluster.rs checks it
    // returns to 0).
    "sluice_cluster_redis_up",
    "sluice_cluster_stream_lag_entries",
    "sluice_cluster_limits_keys",
    "sluice_cluster_outbound_queued",
    // Cluster mode only: the Redis primary followed and when it changed
    // (Sentinel), a lease's share and divisor (Redis' reach and the nodes
    // alive, not who is connected).
    "sluice_cluster_primary",
    "sluice_cluster_primary_changed_timestamp_seconds",
    "sluice_cluster_lease_share",
    "sluice_cluster_lease_nodes",
    // The per-IP read budget's current rate: scaled by the read controller.
    "sluice_query_read_budget_units_per_second",
    // The web of trust's size and cap (the store's follow lists, not who is
    // connected), and the difficulty asked of outsiders (0 without
    // `[pow]`; the adaptive part falls back when calm).
    "sluice_trust_pubkeys",
    "sluice_trust_truncated",
    "sluice_pow_difficulty",
    // Mirrors of other relays (`[[mirror]]`, none here): the relay's own
    // connections out, not clients'; tests/mirror.rs checks them, and
    // tests/upload.rs that nothing is in flight once a mirror is idle.
    "sluice_mirror_connected",
    "sluice_mirror_lag_seconds",
    "sluice_mirror_up_rate_events_per_second",
    "sluice_mirror_up_in_flight",
    // The store's content and size, the disk it is on, retention's target.
    "sluice_store_map_size_bytes",
    "sluice_store_used_bytes",
    "sluice_store_file_bytes",
    "sluice_store_disk_free_bytes",
    "sluice_store_disk_total_bytes",
    "sluice_store_disk_min_free_bytes",
    "sluice_retention_target_bytes",
    "sluice_store_events",
    // LMDB's count of reader slots ever taken in the lock file (a high-water
    // mark: it does not go down when readers end), and the configured maximum.
    "sluice_store_readers_in_use",
    "sluice_store_readers_max",
    // The allocator keeps freed memory; not a count of anything a client holds.
    "sluice_process_resident_memory_bytes",
    "sluice_process_anonymous_memory_bytes",
    // How many client events a group commit takes: learnt from the commits'
    // cost per event (the disk's speed), kept when the clients leave.
    "sluice_writer_batch_cap_events",
    // Controller state and settings.
    "sluice_throttle_mode",
    "sluice_throttle_target_memory_bytes",
    "sluice_throttle_memory_pressure_ratio",
    "sluice_throttle_load_level_ratio",
    "sluice_throttle_signal_ratio",
    "sluice_throttle_process_variable_ratio",
    "sluice_throttle_setpoint_ratio",
    "sluice_throttle_pid_term",
    "sluice_throttle_output_ratio",
    "sluice_throttle_delay_seconds",
    "sluice_throttle_emergency",
    // The budgets of `[[throttle.budgets]]` (none here): a class's shared
    // tokens refill to their burst whoever is connected, and its settings.
    "sluice_throttle_budget_tokens",
    "sluice_throttle_budget_operations_per_second",
    // Clients remembered on purpose after they leave (bounded by
    // throttle.clients.max_tracked_keys; least recently seen evicted).
    "sluice_throttle_bucket_keys",
];

/// The gauges the query-slot test waits on.
const QUERY_GAUGES: &[(&str, Idle)] = &[
    ("sluice_connections_open", Idle::Is(0.0)),
    ("sluice_ws_deflate_window_bytes", Idle::Is(0.0)),
    ("sluice_subscriptions_open", Idle::Is(0.0)),
    ("sluice_live_subscriptions", Idle::Is(0.0)),
    ("sluice_query_window_in_flight", Idle::Is(0.0)),
    ("sluice_query_window_queued", Idle::Is(0.0)),
    ("sluice_query_open", Idle::Is(0.0)),
    ("sluice_query_open_units", Idle::Is(0.0)),
    ("sluice_query_parked", Idle::Is(0.0)),
];

async fn scrape(relay: &Relay) -> String {
    http_get(&relay.addr, "/metrics", None).await.2
}

/// A series' value (summed over label sets); 0 when it was never recorded.
fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Each labelled series of `name`, as `labels value`, for messages.
fn series(body: &str, name: &str) -> String {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(|l| l[name.len()..].to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The gauges' values before any client: the monitor must have ticked, and
/// the open descriptors (counted once a second) must read the same across
/// more than a second, so that what ran before (the plugin's start, a
/// first client) is in them.
async fn before_clients(relay: &Relay) -> String {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut last = None;
    loop {
        let body = scrape(relay).await;
        let fds = value(&body, "sluice_process_open_fds");
        if fds > 0.0 && last == Some(fds) {
            return body;
        }
        last = (fds > 0.0).then_some(fds);
        assert!(Instant::now() < deadline, "the monitor never ticked");
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
}

/// Polls /metrics until every gauge is at its idle value. `Err` describes
/// the last values seen when the deadline passed.
async fn wait_idle(relay: &Relay, gauges: &[(&str, Idle)], before: &str) -> Result<(), String> {
    let deadline = Instant::now() + IDLE_DEADLINE;
    loop {
        let body = scrape(relay).await;
        let busy: Vec<String> = gauges
            .iter()
            .filter_map(|&(name, idle)| {
                let v = value(&body, name);
                let (ok, want) = match idle {
                    Idle::Is(x) => (v == x, format!("{x}")),
                    Idle::AtMostBefore => {
                        let b = value(before, name);
                        (v <= b, format!("<= {b}"))
                    }
                };
                (!ok).then(|| format!("{name} {v} (idle: {want})"))
            })
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let all: Vec<String> = gauges
                .iter()
                .map(|(n, _)| format!("{n} {}", value(&body, n)))
                .collect();
            return Err(format!(
                "not idle {} s after every client left: {}\n  all: {}, sluice_query_open {}\n  \
                 closed by reason: {}\n  query-scheduler refusals: {}",
                IDLE_DEADLINE.as_secs(),
                busy.join(", "),
                all.join(", "),
                value(&body, "sluice_query_open"),
                series(&body, "sluice_connections_closed_total"),
                series(&body, "sluice_throttle_refusals_total")
                    .split(", ")
                    .filter(|s| s.contains("query_scheduler"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A new client's REQ: `Ok` on its EOSE, else what came instead.
async fn probe(relay: &Relay, source: &str) -> Result<(), String> {
    let mut c = Client::connect_from(&relay.url(), source).await;
    c.send(json!(["REQ", "probe", {"kinds": [1], "limit": 2}]))
        .await;
    loop {
        match c.try_recv(ANSWER_TIMEOUT).await {
            Some(m) if m[0] == "EOSE" && m[1] == "probe" => return Ok(()),
            Some(m) if m[0] == "CLOSED" => return Err(format!("a new REQ got {m}")),
            Some(_) => {}
            None => {
                return Err(format!(
                    "a new REQ got no EOSE within {} s",
                    ANSWER_TIMEOUT.as_secs()
                ));
            }
        }
    }
}

/// Fails with the gauges and what a new REQ got, or checks that a new REQ
/// gets its EOSE.
async fn assert_idle_then_answered(relay: &Relay, gauges: &[(&str, Idle)], before: &str) {
    let idle = wait_idle(relay, gauges, before).await;
    let answered = probe(relay, "127.0.0.99").await;
    if let Err(e) = idle {
        let then = match answered {
            Ok(()) => "a new REQ then got its EOSE".to_string(),
            Err(e) => e,
        };
        panic!("seed {}: {e}\n  {then}", seed());
    }
    if let Err(e) = answered {
        panic!("seed {}: idle, but {e}", seed());
    }
}

// ------------------------------------------- query slots and vanishing clients

/// When a client of [`query_permits_come_back_after_clients_vanish`] leaves.
#[derive(Debug, Clone, Copy)]
enum Leave {
    /// Right after sending: its REQs are still queued for a slot.
    AtOnce,
    /// After a pause of this many ms: queued, just woken, or running.
    AfterMs(u64),
    /// After reading this many messages: the relay is in the middle of an answer.
    AfterReading(usize),
    /// Never reads: once an answer is under way the relay's sends stall
    /// and it drops the client as a slow consumer, while the client's other
    /// REQs wait or are being woken.
    NeverReading,
    /// Reads until its first answer has begun, then stops, like a client
    /// that never reads (see [`stall`]); retries while its REQs are refused,
    /// so the relay surely meets a slow consumer.
    StopsReading,
}

#[derive(Debug)]
struct Plan {
    source: String,
    start_ms: u64,
    msgs: Vec<Value>,
    leave: Leave,
    abrupt: bool,
}

fn plan(rng: &mut Rng, source: String) -> Plan {
    let leave = match rng.below(5) {
        0 => Leave::AtOnce,
        1 => Leave::AfterMs(rng.below(400)),
        2 => Leave::AfterReading(1 + rng.below(2 * STORED as u64) as usize),
        3 => Leave::NeverReading,
        _ => Leave::StopsReading,
    };
    // A client that does not read stalls on its first answer; its other
    // REQs are the ones waiting (or being woken) when the relay drops it.
    let min = if matches!(leave, Leave::NeverReading | Leave::StopsReading) {
        2
    } else {
        1
    };
    let n = min + rng.below(5 - min);
    let msgs = (0..n)
        .map(|j| {
            if rng.chance(15) {
                json!(["COUNT", format!("c{j}"), {"kinds": [1]}])
            } else {
                big_req(&format!("s{j}"), rng.big_limit())
            }
        })
        .collect();
    Plan {
        source,
        start_ms: rng.below(100),
        msgs,
        leave,
        abrupt: rng.chance(70),
    }
}

async fn vanishing_client(url: String, plan: Plan, mut rng: Rng) {
    tokio::time::sleep(Duration::from_millis(plan.start_ms)).await;
    let Some(mut ws) = open(&url, &plan.source).await else {
        return;
    };
    if let Leave::StopsReading = plan.leave {
        let deadline = Instant::now() + HOLD;
        stall(&mut ws, &mut rng, plan.msgs.len() as u64, deadline).await;
        tokio::time::sleep_until(deadline.into()).await;
        drop(ws);
        return;
    }
    for m in plan.msgs {
        if !send(&mut ws, m).await {
            return;
        }
    }
    match plan.leave {
        Leave::AtOnce => {}
        Leave::AfterMs(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        Leave::AfterReading(n) => {
            // Bounded even when every REQ waits out the queue.
            let deadline = Instant::now() + HOLD;
            read_some(&mut ws, n, deadline).await;
        }
        Leave::NeverReading | Leave::StopsReading => tokio::time::sleep(HOLD).await,
    }
    leave(ws, plan.abrupt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_permits_come_back_after_clients_vanish() {
    // One query slot: queries queue behind each other, and a single slot
    // lost is every slot lost.
    let (_dir, relay) = loaded_relay(1);
    let before = before_clients(&relay).await;
    const ROUNDS: u64 = 4;
    const CLIENTS: u64 = 24;
    const SOURCES: u64 = 8;
    for round in 0..ROUNDS {
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let mut rng = Rng::new(seed(), round * CLIENTS + i);
                let source = format!("127.0.0.{}", 20 + i % SOURCES);
                let plan = plan(&mut rng, source);
                tokio::spawn(vanishing_client(relay.url(), plan, rng))
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
    assert_idle_then_answered(&relay, QUERY_GAUGES, &before).await;
    // The traffic did what it is for: the relay dropped clients that did not read.
    let body = scrape(&relay).await;
    assert!(
        value(&body, "sluice_slow_consumer_disconnects_total") > 0.0,
        "seed {}: no client was dropped as a slow consumer; closed: {}",
        seed(),
        series(&body, "sluice_connections_closed_total")
    );
}

// ------------------------------------------------------------ mixed traffic

/// One address past its handshake slots (the default 16): 17 sockets that
/// send nothing until the 17th waits in the handshake queue, then all
/// upgrade (the waiting one when a slot frees) and leave.
async fn burst(relay: &Relay) {
    let mut socks = Vec::new();
    for _ in 0..17 {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.39:0".parse().unwrap()).unwrap();
        socks.push(socket.connect(relay.addr.parse().unwrap()).await.unwrap());
    }
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    while value(&scrape(relay).await, "sluice_handshake_queue_waiting") < 1.0 {
        assert!(Instant::now() < deadline, "nobody waited in the queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tasks: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let url = relay.url();
            tokio::spawn(async move {
                let c = Client::over(&url, s).await;
                c.unwrap_or_else(|e| panic!("connection {i}: {e}"))
                    .close()
                    .await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// What one client of [`every_gauge_returns_to_idle_after_clients_leave`] does.
#[derive(Debug, Clone, Copy)]
enum Actor {
    /// Publishes batches and reads their OKs; the last batch it may leave
    /// without reading (its EVENTs are still in the writer queue).
    Publisher,
    /// A live subscription: EOSE, some live events, replaced, CLOSEd, then
    /// another left open when it goes.
    Watcher,
    /// COUNTs, read; then COUNTs it does not wait for.
    Counter,
    /// A big REQ CLOSEd while its query runs, asked again, partly read.
    Closer,
    /// A live subscription and big REQs, read until an answer began
    /// ([`stall`]), then never again.
    Slow,
    /// Big REQs, a part of the answer read, then gone.
    MidAnswer,
    /// Invalid messages, then a valid REQ.
    Garbage,
    /// Authenticates (NIP-42), then stays until the end of the wave.
    Authenticated,
    /// Opens a negentropy session (NIP-77) and leaves it open.
    Negentropy,
    /// Publishes an event the write-policy plugin is slow to judge.
    Plugged,
    /// Agrees permessage-deflate (a socket of its own: tungstenite has no
    /// compression), asks for a big answer and holds its compression
    /// window until the end of the wave.
    Compressing,
}

const ACTORS: [Actor; 11] = [
    Actor::Compressing,
    Actor::Authenticated,
    Actor::Negentropy,
    Actor::Plugged,
    Actor::Publisher,
    Actor::Watcher,
    Actor::Counter,
    Actor::Closer,
    Actor::Slow,
    Actor::MidAnswer,
    Actor::Garbage,
];

async fn actor(url: String, source: String, who: Actor, n: u64, mut rng: Rng) {
    let deadline = Instant::now() + HOLD;
    let abrupt = rng.chance(60);
    if let Actor::Compressing = who {
        return compressing(&url, &source, deadline, abrupt).await;
    }
    let Some(mut ws) = open(&url, &source).await else {
        return;
    };
    match who {
        Actor::Publisher => {
            let author = 100 + (n % 100) as u8;
            let mut i = 0;
            for batch in 0..4 {
                let size = 10 + rng.below(20);
                for _ in 0..size {
                    let e = ev(author, now(), 1, &[&["t", "live"]], &format!("{n}/{i}"));
                    i += 1;
                    if !send_event(&mut ws, &e).await {
                        return;
                    }
                }
                if batch == 3 && abrupt {
                    break;
                }
                read_some(&mut ws, size as usize, deadline).await;
            }
        }
        Actor::Watcher => {
            let live = json!(["REQ", "live", {"kinds": [1], "#t": ["live"], "limit": 5}]);
            send(&mut ws, live.clone()).await;
            read_to_end_of(&mut ws, "live", deadline).await;
            read_some(&mut ws, rng.below(20) as usize, deadline).await;
            send(&mut ws, live).await;
            read_to_end_of(&mut ws, "live", deadline).await;
            send(&mut ws, json!(["CLOSE", "live"])).await;
            send(
                &mut ws,
                json!(["REQ", "left-open", {"kinds": [1], "#t": ["live"], "limit": 1}]),
            )
            .await;
            read_to_end_of(&mut ws, "left-open", deadline).await;
        }
        Actor::Counter => {
            for j in 0..3 {
                send(&mut ws, json!(["COUNT", format!("c{j}"), {"kinds": [1]}])).await;
            }
            read_some(&mut ws, 3, deadline).await;
            for j in 3..6 {
                send(&mut ws, json!(["COUNT", format!("c{j}"), {"kinds": [1]}])).await;
            }
        }
        Actor::Closer => {
            send(&mut ws, big_req("b", rng.big_limit())).await;
            tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            send(&mut ws, json!(["CLOSE", "b"])).await;
            send(&mut ws, big_req("b", rng.big_limit())).await;
            read_some(&mut ws, rng.below(STORED as u64) as usize, deadline).await;
            send(&mut ws, json!(["CLOSE", "b"])).await;
        }
        Actor::Slow => {
            send(
                &mut ws,
                json!(["REQ", "live", {"kinds": [1], "#t": ["live"], "limit": 0}]),
            )
            .await;
            let n = 2 + rng.below(3);
            stall(&mut ws, &mut rng, n, deadline).await;
            tokio::time::sleep_until(deadline.into()).await;
            // Whatever the relay did, this one goes without a word.
            drop(ws);
            return;
        }
        Actor::MidAnswer => {
            for j in 0..1 + rng.below(3) {
                send(&mut ws, big_req(&format!("m{j}"), rng.big_limit())).await;
            }
            read_some(&mut ws, 1 + rng.below(2 * STORED as u64) as usize, deadline).await;
        }
        Actor::Garbage => {
            ws.send(Message::Text("not json".into())).await.ok();
            send(&mut ws, json!(["REQ"])).await;
            send(&mut ws, json!(["REQ", "bad", {"kinds": "one"}])).await;
            send(&mut ws, json!(["REQ", "ok", {"kinds": [1], "limit": 3}])).await;
            read_to_end_of(&mut ws, "ok", deadline).await;
        }
        Actor::Authenticated => {
            // The challenge comes at connect.
            let mut challenge = None;
            while let Some(m) = next_until(&mut ws, deadline).await {
                if m[0] == "AUTH" {
                    challenge = m[1].as_str().map(str::to_owned);
                    break;
                }
            }
            let Some(challenge) = challenge else {
                return leave(ws, abrupt).await;
            };
            let key = 200 + (n % 50) as u8;
            let e = ev(
                key,
                now(),
                22242,
                &[&["relay", &url], &["challenge", &challenge]],
                "",
            );
            ws.send(Message::Text(format!("[\"AUTH\",{}]", e.raw()).into()))
                .await
                .ok();
            tokio::time::sleep_until(deadline.into()).await;
        }
        Actor::Negentropy => {
            // NIP-77's initial message for an empty set: protocol version
            // 0x61, one range to infinity holding no ids.
            send(
                &mut ws,
                json!(["NEG-OPEN", "n", {"kinds": [1], "limit": 10}, "6100000200"]),
            )
            .await;
            read_some(&mut ws, 1, deadline).await;
            tokio::time::sleep_until(deadline.into()).await;
        }
        Actor::Plugged => {
            let e = ev(99, now(), 1, &[], &format!("slow {n}"));
            send_event(&mut ws, &e).await;
            read_some(&mut ws, 1, deadline).await;
        }
        Actor::Compressing => {}
    }
    leave(ws, abrupt).await;
}

/// [`Actor::Compressing`]: the upgrade and one masked REQ written by hand,
/// every byte of the answer read (and dropped) until `deadline`.
async fn compressing(url: &str, source: &str, deadline: Instant, abrupt: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr: SocketAddr = url.trim_start_matches("ws://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let Ok(mut s) = socket.connect(addr).await else {
        return;
    };
    let head = format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
    );
    let req = big_req("z", STORED as u64).to_string();
    // A final text frame, masked with zeros (the payload as it is).
    let mut frame = vec![0x81, 0x80 | 126];
    frame.extend_from_slice(&(req.len() as u16).to_be_bytes());
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(req.as_bytes());
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&frame).await.is_err() {
        return;
    }
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
        if n == 0 {
            return;
        }
    }
    if !abrupt {
        // Close 1000, masked with zeros.
        s.write_all(&[0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8])
            .await
            .ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gauge_returns_to_idle_after_clients_leave() {
    // Every gauge of the doc is classified, so a new one cannot be missed,
    // and every name classified is a gauge of the doc, so a renamed one
    // cannot read as an idle 0 forever.
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let documented: Vec<&str> = doc
        .lines()
        .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() > 3 && cells[2] == "gauge")
        .map(|cells| cells[1].trim_matches('`'))
        .collect();
    for name in &documented {
        assert!(
            PER_CLIENT_GAUGES.iter().any(|(n, _)| n == name) || NOT_PER_CLIENT.contains(name),
            "gauge {name} of docs/metrics.md is in neither PER_CLIENT_GAUGES nor NOT_PER_CLIENT"
        );
    }
    for name in PER_CLIENT_GAUGES
        .iter()
        .map(|(n, _)| n)
        .chain(NOT_PER_CLIENT)
    {
        assert!(
            documented.contains(name),
            "{name} is not a gauge of docs/metrics.md"
        );
    }

    let plugin = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/plugins/slow_when_asked.py"
    );
    let (_dir, relay) = loaded_relay_with(
        2,
        &[
            ("SLUICE_POLICY__PLUGIN__COMMAND", plugin),
            ("SLUICE_POLICY__PLUGIN__TIMEOUT_MS", "5000"),
        ],
    );
    // The plugin's program (and its pipes) running before the idle values
    // are read: one event judged.
    let mut first = relay.client().await;
    let (ok, msg) = first.publish(&ev(98, now(), 1, &[], "first")).await;
    assert!(ok, "{msg}");
    first.close().await;
    let before = before_clients(&relay).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sample_peaks(relay.addr.clone(), stopped));
    burst(&relay).await;
    const WAVES: u64 = 3;
    const CLIENTS: u64 = 21;
    for wave in 0..WAVES {
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let n = wave * CLIENTS + i;
                let mut rng = Rng::new(seed(), 1000 + n);
                // Each kind once per wave, the rest at random.
                let who = if (i as usize) < ACTORS.len() {
                    ACTORS[i as usize]
                } else {
                    ACTORS[rng.below(ACTORS.len() as u64) as usize]
                };
                let source = format!("127.0.0.{}", 40 + i % 10);
                tokio::spawn(actor(relay.url(), source, who, n, rng))
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
    stop.send(true).unwrap();
    let peaks = sampler.await.unwrap();
    assert_idle_then_answered(&relay, PER_CLIENT_GAUGES, &before).await;
    let body = scrape(&relay).await;
    assert_each_raised(&peaks, &before, &body);
    assert!(
        value(&body, "sluice_slow_consumer_disconnects_total") > 0.0,
        "seed {}: no client was dropped as a slow consumer; closed: {}",
        seed(),
        series(&body, "sluice_connections_closed_total")
    );
    assert!(
        value(&body, "sluice_events_written_total") > 0.0,
        "no EVENT reached the writer"
    );
}
