//! The accept loop: every TCP connection is counted and timed from the
//! moment it is accepted, not only once it becomes a WebSocket session.
//!
//! - A connection that is not (yet) a session holds an [`HttpSlot`]: at
//!   most `server.max_http_connections` in all and
//!   `server.max_http_connections_per_ip` per client address (a trusted
//!   proxy's address is not limited per address). Past either, the socket
//!   is closed at accept and counted. The slot is given back when the
//!   connection ends or upgrades (the session then holds the WebSocket
//!   caps), on every path: it is dropped with the connection's task.
//! - At the total cap, a new connection is not refused while a slot has
//!   been held longer than [`EVICT_AFTER`]: the oldest such connection is
//!   closed instead (counted as `evicted`). Half-sent requests from many
//!   addresses then cannot lock new clients out until their timeout: a
//!   slow-loris flood only recycles its own sockets.
//! - hyper reads each request head under `server.handshake_timeout_ms`: a
//!   half-sent request is closed when it runs out.
//! - An accept error (descriptors exhausted above all) is logged, counted
//!   on `sluice_accept_errors_total`, and the loop backs off briefly
//!   instead of spinning.
//! - Shutdown: the loop stops accepting; each HTTP connection finishes its
//!   request in progress and closes, within `server.shutdown_grace_ms`
//!   (then it is cut off), so a stalled client never holds the relay up.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use sluice_throttle::client_key;
use tokio::net::{TcpListener, TcpStream};
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

/// The counts behind [`HttpSlot`]s.
pub(crate) struct HttpSlots {
    max: usize,
    max_per_ip: usize,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    open: usize,
    per_ip: HashMap<IpAddr, usize>,
    /// Slots by age (ids increase): when each was taken, and how to close
    /// its connection to make room.
    by_age: std::collections::BTreeMap<u64, (Instant, CancellationToken)>,
    next_id: u64,
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

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotRefused {
    Total,
    PerIp,
}

impl HttpSlots {
    pub(crate) fn new(max: usize, max_per_ip: usize) -> Arc<HttpSlots> {
        Arc::new(HttpSlots {
            max,
            max_per_ip,
            state: Mutex::new(SlotState::default()),
        })
    }

    /// A slot for a connection from `ip` (`per_ip`: count it against the
    /// address's limit).
    pub(crate) fn take(
        self: &Arc<Self>,
        ip: IpAddr,
        per_ip: bool,
    ) -> Result<HttpSlot, SlotRefused> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let key = per_ip.then(|| client_key(ip));
        if key.is_some_and(|k| st.per_ip.get(&k).is_some_and(|n| *n >= self.max_per_ip)) {
            return Err(SlotRefused::PerIp);
        }
        if st.open >= self.max {
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
        if let Some(k) = key {
            let n = st.per_ip.entry(k).or_insert(0);
            if *n >= self.max_per_ip {
                if *n == 0 {
                    st.per_ip.remove(&k);
                }
                return Err(SlotRefused::PerIp);
            }
            *n += 1;
        }
        st.open += 1;
        st.next_id += 1;
        let id = st.next_id;
        let evicted = CancellationToken::new();
        st.by_age.insert(id, (Instant::now(), evicted.clone()));
        metrics::gauge!(m::HTTP_CONNECTIONS_OPEN).set(st.open as f64);
        Ok(HttpSlot {
            slots: self.clone(),
            key,
            id,
            evicted,
        })
    }
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        let mut st = self
            .slots
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        st.open -= 1;
        st.by_age.remove(&self.id);
        if let Some(k) = self.key
            && let Some(n) = st.per_ip.get_mut(&k)
        {
            *n -= 1;
            if *n == 0 {
                st.per_ip.remove(&k);
            }
        }
        metrics::gauge!(m::HTTP_CONNECTIONS_OPEN).set(st.open as f64);
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
        // A trusted proxy carries many clients: only the total applies.
        let proxied = state
            .engine
            .throttle()
            .with_config(|c| address::TrustedProxies::parse(&c.clients.trusted_proxies))
            .is_ok_and(|p| p.contains(peer.ip()));
        let slot = match state.http_slots.take(peer.ip(), !proxied) {
            Ok(slot) => slot,
            Err(refused) => {
                let reason = match refused {
                    SlotRefused::Total => "max_http_connections",
                    SlotRefused::PerIp => "max_http_connections_per_ip",
                };
                metrics::counter!(m::CONNECTIONS_REFUSED_TOTAL, "reason" => reason).increment(1);
                drop(tcp);
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        conns.spawn(connection(tcp, peer, router.clone(), slot, state.clone()));
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
        // The session takes the socket back as this type (`ws::take_socket`).
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
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_in_all_and_per_address_and_given_back_on_drop() {
        let slots = HttpSlots::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = slots.take(a, true).unwrap();
        let a2 = slots.take(a, true).unwrap();
        assert_eq!(slots.take(a, true).err(), Some(SlotRefused::PerIp));
        let proxy = slots.take(a, false).unwrap();
        assert_eq!(slots.take(b, true).err(), Some(SlotRefused::Total));
        drop(a1);
        let b1 = slots.take(b, true).unwrap();
        drop((a2, proxy, b1));
        let st = slots.state.lock().unwrap();
        assert_eq!(st.open, 0);
        assert!(st.per_ip.is_empty() && st.by_age.is_empty());
    }

    #[test]
    fn at_the_cap_the_oldest_slot_past_the_eviction_age_makes_room() {
        let slots = HttpSlots::new(2, 10);
        let ip = |n: u8| IpAddr::from([10, 0, 0, n]);
        let old = slots.take(ip(1), true).unwrap();
        let young = slots.take(ip(2), true).unwrap();
        // Nobody is old enough yet: refused.
        assert_eq!(slots.take(ip(3), true).err(), Some(SlotRefused::Total));
        // Age the first slot past the eviction age.
        {
            let mut st = slots.state.lock().unwrap();
            let entry = st.by_age.get_mut(&old.id).unwrap();
            entry.0 -= EVICT_AFTER;
        }
        let new = slots.take(ip(3), true).unwrap();
        assert!(old.evicted.is_cancelled(), "the oldest is told to close");
        assert!(!young.evicted.is_cancelled());
        // Its connection ends and gives the slot back.
        drop((old, young, new));
        let st = slots.state.lock().unwrap();
        assert_eq!(st.open, 0);
        assert!(st.per_ip.is_empty());
    }
}
