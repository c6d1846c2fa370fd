//! The accept loop: every TCP connection is counted and timed from the
//! moment it is accepted, not only once it becomes a WebSocket session.
//!
//! - The peer's address is taken here, once, and made canonical: an IPv4
//!   client of a dual-stack listener (`server.listen = "[::]:7777"`) is
//!   its IPv4 address, not `::ffff:a.b.c.d`, in every per-address cap, in
//!   `trusted_proxies`, `metrics.allow_from` and the policy's blocks.
//! - A connection that is not (yet) a session holds an [`HttpSlot`]: at
//!   most `server.max_http_connections` in all and
//!   `server.max_http_connections_per_ip` per client address (a trusted
//!   proxy's address is not limited per address). The slot is given back
//!   when the connection ends or upgrades (the session then holds the
//!   WebSocket caps), on every path: it is dropped with the connection's
//!   task.
//! - A connection from an address at its own cap waits for one of that
//!   address's slots (a burst from one NAT, proxy or benchmark completes):
//!   it holds a [`Waiting`] entry in a queue bounded per address
//!   (`server.handshake_queue_per_ip`) and in all
//!   (`server.handshake_queue_total`), and a small task holding its socket
//!   and no HTTP state. Its address's next free slot goes to the oldest
//!   waiter; one still waiting after `server.handshake_queue_wait_ms`, or
//!   one for which the queue has no room, is answered 429 with
//!   `Retry-After`; a waiter whose client closes first is dropped.
//! - At the total cap, a new connection is not refused while a slot has
//!   been held longer than [`EVICT_AFTER`]: the oldest such connection is
//!   closed instead (counted as `evicted`). Half-sent requests from many
//!   addresses then cannot lock new clients out until their timeout: a
//!   slow-loris flood only recycles its own sockets. With no slot that
//!   old, the new connection is answered 503 with `Retry-After`.
//! - A refusal at accept is a canned HTTP response written straight to the
//!   socket (no HTTP task), then a short lingering close that reads what
//!   the client sent, so the answer is not lost to a reset. At most
//!   [`MAX_ANSWERING`] are written at once (each holds a descriptor for at
//!   most [`ANSWER_LINGER`]); past that a refused socket is closed at once
//!   and counted as unanswered.
//! - hyper reads each request head under `server.handshake_timeout_ms`
//!   (from the moment the connection got its slot): a half-sent request is
//!   closed when it runs out.
//! - An accept error (descriptors exhausted above all) is logged, counted
//!   on `sluice_accept_errors_total`, and the loop backs off briefly
//!   instead of spinning.
//! - Shutdown: the loop stops accepting; waiting connections are closed;
//!   each HTTP connection finishes its request in progress and closes,
//!   within `server.shutdown_grace_ms` (then it is cut off), so a stalled
//!   client never holds the relay up.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use sluice_throttle::client_key;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::metrics_names as m;
use crate::{AppState, address};

/// How long the loop pauses after an accept error (the error is usually
/// "too many open files": retrying at once would spin).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// At most one log line per this long about accept errors.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(5);
/// At the total cap, a connection that has held its slot this long may be
/// closed to make room for a new one (a client that sends its request head
/// promptly is done with it well within this).
pub(crate) const EVICT_AFTER: Duration = Duration::from_secs(1);
/// Refusals written to their sockets at once; each holds its descriptor for
/// at most [`ANSWER_WRITE_TIMEOUT`] + [`ANSWER_LINGER`].
pub const MAX_ANSWERING: usize = 32;
/// A canned refusal that does not fit in the socket's buffer at once is
/// given up after this long.
const ANSWER_WRITE_TIMEOUT: Duration = Duration::from_millis(500);
/// After a refusal is written, what the client sends is read and dropped
/// for at most this long (or until it closes, or 16 KiB), so that closing
/// with unread bytes does not reset the connection before the client
/// reads its answer.
const ANSWER_LINGER: Duration = Duration::from_secs(1);
const ANSWER_DRAIN_BYTES: usize = 16 * 1024;
/// `Retry-After` of a refusal at accept (handshakes are short: a slot
/// frees soon).
pub(crate) const RETRY_AFTER_HANDSHAKE_SECS: u32 = 1;
/// `Retry-After` of a refused WebSocket upgrade (sessions last longer).
pub(crate) const RETRY_AFTER_SESSION_SECS: u32 = 5;

/// The bounds of [`HttpSlots`] (from `[server]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotLimits {
    pub max: usize,
    pub max_per_ip: usize,
    pub queue_per_ip: usize,
    pub queue_total: usize,
}

/// The counts behind [`HttpSlot`]s and [`Waiting`] entries.
pub(crate) struct HttpSlots {
    limits: SlotLimits,
    state: Mutex<SlotState>,
    /// Permits of the refusals being written ([`MAX_ANSWERING`]).
    answering: Arc<Semaphore>,
}

#[derive(Default)]
struct SlotState {
    open: usize,
    per_ip: HashMap<IpAddr, usize>,
    /// Slots by age (ids increase): when each was taken, and how to close
    /// its connection to make room.
    by_age: BTreeMap<u64, (Instant, CancellationToken)>,
    next_id: u64,
    /// Connections waiting for a slot of their address, oldest first.
    waiting: HashMap<IpAddr, VecDeque<Waiter>>,
    waiting_total: usize,
    /// Addresses with waiters and room under their own cap, held back by
    /// the total cap (after an eviction overshot it): served first when a
    /// slot frees.
    starved: VecDeque<IpAddr>,
}

/// One queue entry: where its slot is handed.
struct Waiter {
    id: u64,
    grant: oneshot::Sender<HttpSlot>,
}

/// One TCP connection that is not a WebSocket session; given back on drop.
pub(crate) struct HttpSlot {
    slots: Arc<HttpSlots>,
    /// `None` for a trusted proxy (not counted per address).
    key: Option<IpAddr>,
    id: u64,
    /// Cancelled when the slot is taken back for a newer connection.
    pub(crate) evicted: CancellationToken,
}

/// A connection waiting for a slot of its address; leaves the queue on
/// drop (a slot handed to it meanwhile is given back with `slot`).
pub(crate) struct Waiting {
    slots: Arc<HttpSlots>,
    key: IpAddr,
    id: u64,
    /// Receives the slot when one of the address's frees.
    slot: oneshot::Receiver<HttpSlot>,
}

/// What a new connection gets.
pub(crate) enum SlotGrant {
    Now(HttpSlot),
    Wait(Waiting),
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotRefused {
    /// `server.max_http_connections`, and no slot old enough to evict.
    Total,
    /// The address is at its cap and the queue has no room for it (per
    /// address or in all).
    QueueFull,
}

impl HttpSlots {
    pub(crate) fn new(limits: SlotLimits) -> Arc<HttpSlots> {
        Arc::new(HttpSlots {
            limits,
            state: Mutex::new(SlotState::default()),
            answering: Arc::new(Semaphore::new(MAX_ANSWERING)),
        })
    }

    /// A slot, or a place in the queue, for a connection from `ip`
    /// (`per_ip`: count it against the address's limit).
    pub(crate) fn take(
        self: &Arc<Self>,
        ip: IpAddr,
        per_ip: bool,
    ) -> Result<SlotGrant, SlotRefused> {
        let mut st = self.state.lock();
        let key = per_ip.then(|| client_key(ip));
        if let Some(k) = key {
            let at_cap = st
                .per_ip
                .get(&k)
                .is_some_and(|n| *n >= self.limits.max_per_ip);
            // Newcomers queue behind the address's waiters.
            let queued = st.waiting.get(&k).is_some_and(|q| !q.is_empty());
            if at_cap || queued {
                return self.enqueue(&mut st, k).map(SlotGrant::Wait);
            }
        }
        if st.open >= self.limits.max {
            // Make room by closing the oldest connection, if it is old
            // enough; it gives its slot back as its task ends.
            let oldest = st.by_age.first_key_value().map(|(id, (at, _))| (*id, *at));
            match oldest {
                Some((id, at)) if at.elapsed() >= EVICT_AFTER => {
                    if let Some((_, (_, token))) = st.by_age.remove_entry(&id) {
                        token.cancel();
                    }
                }
                _ => return Err(SlotRefused::Total),
            }
        }
        Ok(SlotGrant::Now(self.grant(&mut st, key)))
    }

    fn enqueue(self: &Arc<Self>, st: &mut SlotState, k: IpAddr) -> Result<Waiting, SlotRefused> {
        let here = st.waiting.get(&k).map_or(0, VecDeque::len);
        if here >= self.limits.queue_per_ip || st.waiting_total >= self.limits.queue_total {
            return Err(SlotRefused::QueueFull);
        }
        let (grant, slot) = oneshot::channel();
        st.next_id += 1;
        let id = st.next_id;
        st.waiting
            .entry(k)
            .or_default()
            .push_back(Waiter { id, grant });
        st.waiting_total += 1;
        metrics::gauge!(m::HANDSHAKE_QUEUE_WAITING).set(st.waiting_total as f64);
        Ok(Waiting {
            slots: self.clone(),
            key: k,
            id,
            slot,
        })
    }

    /// Counts a new slot (the caller checked the caps).
    fn grant(self: &Arc<Self>, st: &mut SlotState, key: Option<IpAddr>) -> HttpSlot {
        if let Some(k) = key {
            *st.per_ip.entry(k).or_insert(0) += 1;
        }
        st.open += 1;
        st.next_id += 1;
        let id = st.next_id;
        let evicted = CancellationToken::new();
        st.by_age.insert(id, (Instant::now(), evicted.clone()));
        metrics::gauge!(m::HTTP_CONNECTIONS_OPEN).set(st.open as f64);
        HttpSlot {
            slots: self.clone(),
            key,
            id,
            evicted,
        }
    }

    /// Hands slots to `k`'s waiters, oldest first, while the caps allow;
    /// the slots go out in `handed` (sent after the lock is released: a
    /// send that fails drops its slot, which locks again).
    fn pump(
        self: &Arc<Self>,
        st: &mut SlotState,
        k: IpAddr,
        handed: &mut Vec<(oneshot::Sender<HttpSlot>, HttpSlot)>,
    ) {
        loop {
            let Some(queue) = st.waiting.get_mut(&k) else {
                return;
            };
            // A waiter whose task ended is skipped (its guard finds its
            // entry gone and counts nothing).
            let mut dropped = 0;
            while queue.front().is_some_and(|w| w.grant.is_closed()) {
                queue.pop_front();
                dropped += 1;
            }
            let empty = queue.is_empty();
            st.waiting_total -= dropped;
            if empty {
                st.waiting.remove(&k);
                return;
            }
            if st
                .per_ip
                .get(&k)
                .is_some_and(|n| *n >= self.limits.max_per_ip)
            {
                return;
            }
            if st.open >= self.limits.max {
                if !st.starved.contains(&k) {
                    st.starved.push_back(k);
                }
                return;
            }
            let Some(w) = st.waiting.get_mut(&k).and_then(VecDeque::pop_front) else {
                return;
            };
            st.waiting_total -= 1;
            let slot = self.grant(st, Some(k));
            handed.push((w.grant, slot));
        }
    }

    /// Gives back slot `id` of `key`, then hands free slots to waiters.
    fn release(self: &Arc<Self>, key: Option<IpAddr>, id: u64) {
        let mut handed = Vec::new();
        {
            let mut st = self.state.lock();
            st.open -= 1;
            st.by_age.remove(&id);
            if let Some(k) = key
                && let Some(n) = st.per_ip.get_mut(&k)
            {
                *n -= 1;
                if *n == 0 {
                    st.per_ip.remove(&k);
                }
            }
            if let Some(k) = key {
                self.pump(&mut st, k, &mut handed);
            }
            while st.open < self.limits.max
                && let Some(k) = st.starved.pop_front()
            {
                self.pump(&mut st, k, &mut handed);
            }
            metrics::gauge!(m::HTTP_CONNECTIONS_OPEN).set(st.open as f64);
            metrics::gauge!(m::HANDSHAKE_QUEUE_WAITING).set(st.waiting_total as f64);
        }
        for (grant, slot) in handed {
            // A waiter gone since: its slot comes back through its drop.
            let _ = grant.send(slot);
        }
    }

    /// A permit to write one refusal, if fewer than [`MAX_ANSWERING`] are
    /// being written.
    fn answer_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.answering.clone().try_acquire_owned().ok()
    }
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        self.slots.clone().release(self.key, self.id);
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut st = self.slots.state.lock();
        if let Some(queue) = st.waiting.get_mut(&self.key) {
            let before = queue.len();
            queue.retain(|w| w.id != self.id);
            let removed = before - queue.len();
            let empty = queue.is_empty();
            st.waiting_total -= removed;
            if empty {
                st.waiting.remove(&self.key);
            }
        }
        metrics::gauge!(m::HANDSHAKE_QUEUE_WAITING).set(st.waiting_total as f64);
        // The lock is released before `slot` drops: a slot granted and not
        // taken is given back through `release`.
    }
}

/// A refusal written at accept, before any HTTP task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Canned {
    /// 429: the address has too many connections in progress or waiting.
    TooMany,
    /// 503: the relay has too many connections in progress.
    Busy,
}

impl Canned {
    fn response(self) -> Vec<u8> {
        let (status, body) = match self {
            Canned::TooMany => (
                "429 Too Many Requests",
                "too many connections from your address\n",
            ),
            Canned::Busy => ("503 Service Unavailable", "too many connections\n"),
        };
        format!(
            "HTTP/1.1 {status}\r\nRetry-After: {RETRY_AFTER_HANDSHAKE_SECS}\r\n\
             Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
}

/// Writes `canned` to `tcp` and closes it, lingering briefly (see
/// [`ANSWER_LINGER`]); `permit` bounds how many do this at once.
async fn answer(mut tcp: TcpStream, canned: Canned, permit: OwnedSemaphorePermit) {
    let written = tokio::time::timeout(ANSWER_WRITE_TIMEOUT, tcp.write_all(&canned.response()))
        .await
        .is_ok_and(|r| r.is_ok());
    if written {
        // FIN after the answer; then read (and drop) what the client sent
        // until it closes, so our close is not a reset.
        let _ = tcp.shutdown().await;
        let deadline = tokio::time::Instant::now() + ANSWER_LINGER;
        let mut buf = [0u8; 1024];
        let mut read = 0;
        while read < ANSWER_DRAIN_BYTES {
            match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => read += n,
                _ => break,
            }
        }
    }
    drop(tcp);
    drop(permit);
}

/// Answers a connection refused at accept with `canned` when fewer than
/// [`MAX_ANSWERING`] answers are being written, else closes it at once.
fn refuse(tcp: TcpStream, canned: Canned, slots: &HttpSlots, conns: &TaskTracker) {
    match slots.answer_permit() {
        Some(permit) => {
            conns.spawn(answer(tcp, canned, permit));
        }
        None => {
            metrics::counter!(m::CONNECTIONS_REFUSED_UNANSWERED_TOTAL).increment(1);
            drop(tcp);
        }
    }
}

/// Accepts until `state.shutdown` is cancelled, then waits (bounded) for
/// the HTTP connections in progress.
pub(crate) async fn run(listener: TcpListener, router: Router, state: Arc<AppState>) {
    let conns = TaskTracker::new();
    let mut last_log: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            biased;
            () = state.shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                accept_error(&e, &mut last_log);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // The one place the peer's address is taken: made canonical here
        // (an IPv4 client of a dual-stack listener is `::ffff:a.b.c.d`, its
        // IPv4 address from here on), so every block compares with it in
        // one family (`crates/throttle/src/net.rs`).
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        // A trusted proxy carries many clients: only the total applies.
        let proxied = state
            .engine
            .limiter()
            .with_config(|c| address::TrustedProxies::parse(&c.clients.trusted_proxies))
            .is_ok_and(|p| p.contains(peer.ip()));
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        match state.http_slots.take(peer.ip(), !proxied) {
            Ok(SlotGrant::Now(slot)) => {
                conns.spawn(connection(tcp, peer, router.clone(), slot, state.clone()));
            }
            Ok(SlotGrant::Wait(waiting)) => {
                conns.spawn(wait_for_slot(
                    tcp,
                    peer,
                    waiting,
                    router.clone(),
                    state.clone(),
                    conns.clone(),
                ));
            }
            Err(refused) => {
                let (reason, canned) = match refused {
                    SlotRefused::Total => ("max_http_connections", Canned::Busy),
                    SlotRefused::QueueFull => ("handshake_queue_full", Canned::TooMany),
                };
                metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "reason" => reason).increment(1);
                refuse(tcp, canned, &state.http_slots, &conns);
            }
        }
    }
    drop(listener);
    conns.close();
    // Each connection bounds its own drain; this bound is a backstop.
    let limit = Duration::from_millis(state.server.shutdown_grace_ms) + Duration::from_secs(1);
    if tokio::time::timeout(limit, conns.wait()).await.is_err() {
        tracing::warn!(
            connections = conns.len(),
            "HTTP connections still open at shutdown"
        );
    }
}

/// How a wait in the queue ended.
enum Waited {
    Slot(HttpSlot),
    TimedOut,
    /// The client closed, or the relay is shutting down.
    Gone,
}

/// Holds a queued connection's socket (and nothing of HTTP) until a slot
/// of its address is handed to it, then serves it like any other; answers
/// 429 when `server.handshake_queue_wait_ms` runs out first.
async fn wait_for_slot(
    tcp: TcpStream,
    peer: SocketAddr,
    mut waiting: Waiting,
    router: Router,
    state: Arc<AppState>,
    conns: TaskTracker,
) {
    let wait = Duration::from_millis(state.server.handshake_queue_wait_ms);
    let waited = tokio::select! {
        biased;
        () = state.shutdown.cancelled() => Waited::Gone,
        r = &mut waiting.slot => match r {
            Ok(slot) => Waited::Slot(slot),
            Err(_) => Waited::Gone,
        },
        () = client_closed(&tcp) => Waited::Gone,
        () = tokio::time::sleep(wait) => Waited::TimedOut,
    };
    // Leaves the queue; a slot handed over meanwhile goes to the next.
    drop(waiting);
    match waited {
        Waited::Slot(slot) => {
            metrics::counter!(m::HANDSHAKE_QUEUE_ADMITTED_TOTAL).increment(1);
            // Its own task: this one stays small while it waits.
            conns.spawn(connection(tcp, peer, router, slot, state));
        }
        Waited::TimedOut => {
            metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "reason" => "handshake_queue_timeout")
                .increment(1);
            match state.http_slots.answer_permit() {
                Some(permit) => answer(tcp, Canned::TooMany, permit).await,
                None => {
                    metrics::counter!(m::CONNECTIONS_REFUSED_UNANSWERED_TOTAL).increment(1);
                }
            }
        }
        Waited::Gone => {}
    }
}

/// Completes when the client closes (or resets) before sending anything;
/// once it has sent bytes, never (they wait for the HTTP task).
async fn client_closed(tcp: &TcpStream) {
    let mut b = [0u8; 1];
    match tcp.peek(&mut b).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// Serves one TCP connection's HTTP requests until it ends, upgrades to a
/// WebSocket (the session takes over), or the relay shuts down.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    slot: HttpSlot,
    state: Arc<AppState>,
) {
    let timeout = Duration::from_millis(state.server.handshake_timeout_ms);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        router.clone().oneshot(req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        // The session takes the socket back as this type (`upgrade::take_socket`).
        .serve_connection(TokioIo::new(tcp), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let shutdown: CancellationToken = state.shutdown.clone();
    let evicted = slot.evicted.clone();
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = evicted.cancelled() => {
            // Its slot went to a newer connection: close at once.
            metrics::counter!(m::HTTP_CONNECTIONS_CLOSED_TOTAL, "reason" => "evicted").increment(1);
            Ok(())
        }
        () = shutdown.cancelled() => {
            // Finish the request in progress, then close; bounded by the
            // shutdown grace (a half-sent request is cut off).
            conn.as_mut().graceful_shutdown();
            let grace = Duration::from_millis(state.server.shutdown_grace_ms);
            match tokio::time::timeout(grace, conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = result {
        let reason = if e.is_timeout() {
            "handshake_timeout"
        } else {
            "http_error"
        };
        metrics::counter!(m::HTTP_CONNECTIONS_CLOSED_TOTAL, "reason" => reason).increment(1);
        tracing::debug!(peer = %peer, error = %e, "HTTP connection ended");
    }
    drop(slot);
}

fn accept_error(e: &std::io::Error, last_log: &mut Option<Instant>) {
    let exhausted = matches!(e.raw_os_error(), Some(EMFILE | ENFILE));
    let kind = if exhausted { "descriptors" } else { "other" };
    metrics::counter!(m::ACCEPT_ERRORS_TOTAL, "kind" => kind).increment(1);
    if last_log.is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY) {
        *last_log = Some(Instant::now());
        if exhausted {
            tracing::warn!(error = %e, "cannot accept connections: out of file descriptors (raise LimitNOFILE / ulimit -n, or lower server.max_connections)");
        } else {
            tracing::warn!(error = %e, "accept failed");
        }
    }
}

/// errno values of "too many open files" (process, system). Linux values.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

#[cfg(test)]
mod tests;
