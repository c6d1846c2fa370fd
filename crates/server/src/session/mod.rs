//! One WebSocket connection: a single task with one `select!` loop over a
//! fixed set of sources, polled in this order (`biased`): shutdown, answered
//! writes, query answers, live events, then client input (the EVENT held by
//! a write delay, or else the next client message). Work already admitted
//! is answered before new work is read. Each source's bound, and who loses
//! when it fills, is said where it is polled in [`run`].
//!
//! Modules:
//! - `ingest`: the one EVENT pipeline (limits, policy, trust, signature,
//!   NIP-70, NIP-62, plugin, writer), shared with the mirrors;
//! - `event`: a client's EVENT through it, with the client's own steps
//!   (buckets, the delayed EVENT held without stalling the connection),
//!   and the OKs; with `server.max_pending_writes` awaiting their OK the
//!   loop reads no frame (writes shaped, not refused);
//! - `req`: REQ, CLOSE, and query answers (chunks, EOSE, held live events);
//! - `auth`: NIP-42 AUTH, NIP-70 protected events, who reads private
//!   messages;
//! - `count`: COUNT;
//! - `live`: live delivery to matching subscriptions;
//! - `neg`: NIP-77 negentropy sessions (read through the REQ path);
//! - `subs`: the registry of subscriptions and running COUNTs (owns the
//!   `sluice_subscriptions_open` gauge and every query guard);
//! - `refusal`: every refusal, its NIP-01 prefix, wording and metrics;
//! - `out`: the outgoing half, every write bounded by `send_timeout_ms`.

mod auth;
mod count;
mod event;
pub(crate) mod ingest;
mod live;
mod neg;
mod out;
mod refusal;
mod req;
mod subs;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_engine::limiter::{ConnReadBudget, ConnectionGuard};
use sluice_engine::live::LiveConn;
use sluice_engine::live::LiveEnd;
use sluice_engine::reads::ReadSink;
use sluice_proto::message::sniff_id;
use sluice_proto::{ClientMessage, MessageError, PubkeyCache};
use sluice_throttle::ConnPacer;
use sluice_throttle::Principal;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use self::event::{Held, Writes};
use self::out::{CloseReason, Out, Step};
use self::refusal::{NegError, Refusal};
use self::subs::Subs;
use crate::AppState;
use crate::metrics_names as m;
use sluice_ws::read::WsRead;
use sluice_ws::send::WsWrite;
use sluice_ws::{Message, WsError, close_code};

/// Parsed author keys one connection keeps (a few hundred bytes at most).
const SESSION_PUBKEY_CACHE: usize = 4;

/// A session's cache of parsed author keys, made at its first use.
fn keys(slot: &mut Option<Box<PubkeyCache>>) -> &mut PubkeyCache {
    slot.get_or_insert_with(|| Box::new(PubkeyCache::new(SESSION_PUBKEY_CACHE)))
}

fn id_hex(id: &[u8; 32]) -> String {
    sluice_proto::hex32::encode(id)
}

struct Session {
    st: Arc<AppState>,
    /// `[limits]` and `[relay]` as they were when this connection opened.
    front: Arc<crate::Reloadable>,
    /// The client's address (after trusted-proxy headers).
    ip: IpAddr,
    /// Batching of controller delays (docs/design.md#pid-control), per
    /// direction.
    write_adm: ConnPacer,
    read_adm: ConnPacer,
    /// Parsed author keys: a client mostly publishes as one or a few
    /// (made at its first EVENT).
    keys: Option<Box<PubkeyCache>>,
    /// EVENTs handed to the writer, awaiting its answer.
    writes: Writes,
    /// The EVENT waiting out a write delay; no client frame is read while
    /// there is one.
    held: Option<Box<Held>>,
    subs: Subs,
    /// Where this connection's query answers arrive.
    reads: ReadSink,
    /// This connection's read budget (cost units).
    read_budget: ConnReadBudget,
    /// This connection's place in the engine's live index: its queue of
    /// events matching its subscriptions.
    live: LiveConn,
    /// NIP-42: the challenge and the pubkeys proven on this connection.
    auth: auth::AuthState,
    /// NIP-77 negentropy sessions.
    neg: neg::NegSessions,
    /// Who this connection's requests are charged to: its tier and key
    /// (its address until it authenticates).
    principal: Option<Box<Principal>>,
    /// The `Host` header of the upgrade request (AUTH's `relay` tag is
    /// checked against it when no `auth.relay_urls` are configured).
    host: Option<Box<str>>,
}

/// What a session starts from; taken apart by [`run`] before any future
/// holds it.
pub(crate) struct Opening {
    pub(crate) on_upgrade: hyper::upgrade::OnUpgrade,
    /// permessage-deflate, when agreed at the upgrade.
    pub(crate) deflate: Option<sluice_ws::extension::Agreed>,
    pub(crate) st: Arc<AppState>,
    /// `[limits]` and `[relay]` as they are at the upgrade.
    pub(crate) front: Arc<crate::Reloadable>,
    /// The `Host` header of the upgrade request.
    pub(crate) host: Option<String>,
}

/// One connection, from its upgrade to its end: the upgrade awaited, then
/// [`Conn`] made (outside any future: what it is made from is not kept
/// beside it), then served. The task holds one of the two futures at a
/// time, and the connection's state once.
pub(crate) fn run(
    opening: Opening,
    ip: IpAddr,
    permits: (OwnedSemaphorePermit, ConnectionGuard),
) -> impl std::future::Future<Output = ()> + Send {
    use futures_util::FutureExt;
    use futures_util::future::Either;
    let Opening {
        on_upgrade,
        deflate,
        st,
        front,
        host,
    } = opening;
    crate::upgrade::take_socket(on_upgrade).then(move |socket| {
        // The permits are given back when the connection ends, whatever the
        // path (here, if the upgrade failed).
        let Some((tcp, already)) = socket else {
            return Either::Left(std::future::ready(()));
        };
        let mut conn = Conn::new(tcp, &already, (st, front), deflate, ip, host, permits);
        Either::Right(async move {
            let reason = conn.serve().await;
            let ip = conn.s.ip;
            // Subscriptions and queries are given back before the close is counted.
            drop(conn);
            if reason == CloseReason::SlowConsumer {
                metrics::counter!(m::SLOW_CONSUMER_DISCONNECTS_TOTAL).increment(1);
            }
            let reason = reason.label();
            metrics::counter!(m::CONNECTIONS_CLOSED_TOTAL, "reason" => reason).increment(1);
            tracing::debug!(peer = %ip, reason, "connection closed");
        })
    })
}

/// An upgraded connection: its session and its two halves, and what it
/// counts in (the connection permits, `sluice_connections_open`).
struct Conn {
    s: Session,
    stream: WsRead,
    out: Out,
    _open: sluice_engine::gauge::GaugeGuard,
    _permits: (OwnedSemaphorePermit, ConnectionGuard),
}

impl Conn {
    fn new(
        tcp: tokio::net::TcpStream,
        already: &[u8],
        (st, front): (Arc<AppState>, Arc<crate::Reloadable>),
        deflate: Option<sluice_ws::extension::Agreed>,
        ip: IpAddr,
        host: Option<String>,
        permits: (OwnedSemaphorePermit, ConnectionGuard),
    ) -> Conn {
        metrics::counter!(m::CONNECTIONS_OPENED_TOTAL).increment(1);
        let open = sluice_engine::gauge::GaugeGuard::hold(m::CONNECTIONS_OPEN);
        tracing::debug!(peer = %ip, "connection opened");
        let (read_half, write_half) = tcp.into_split();
        // Frames are bounded at twice the message limit, so that a message
        // over the limit is answered by the session (with its id when it is an
        // EVENT) rather than cut off by the WebSocket layer.
        let hard_max = front.limits.max_message_bytes.saturating_mul(2);
        let stream = WsRead::new(
            read_half,
            already,
            hard_max,
            st.server.read_buffer_bytes,
            deflate.is_some(),
        );
        let deflater = deflate.map(|agreed| {
            let mode = if agreed.server_no_context {
                "stateless"
            } else {
                "sliding"
            };
            metrics::counter!(m::WS_COMPRESSION_AGREED_TOTAL, "mode" => mode).increment(1);
            let server = &st.server;
            let settings = sluice_ws::deflate::DeflateSettings {
                level: server.compression_level,
                min_bytes: u32::try_from(server.compression_min_bytes).unwrap_or(u32::MAX),
                window_bytes: u32::try_from(server.compression_window_bytes).unwrap_or(u32::MAX),
            };
            sluice_ws::deflate::Deflater::new(agreed, settings, st.deflate_windows.clone())
        });
        let out = Out::new(
            WsWrite::new(
                write_half,
                st.server.write_buffer_bytes,
                st.server.max_write_buffer_bytes,
                deflater,
            ),
            Duration::from_millis(st.server.send_timeout_ms),
        );
        Conn {
            s: Session::new(st, front, ip, host),
            stream,
            out,
            _open: open,
            _permits: permits,
        }
    }

    /// Serves the connection until it ends; why it ended.
    async fn serve(&mut self) -> CloseReason {
        if self.s.st.auth.challenge_on_connect
            && Box::pin(self.s.send_challenge(&mut self.out))
                .await
                .is_err()
        {
            return CloseReason::IoError;
        }
        // The idle timer exists only while the session is idle (a connection
        // with a subscription holds none).
        let mut last_frame = tokio::time::Instant::now();
        let mut idle: Option<Pin<Box<Sleep>>> = None;
        // Whether the socket is left unread (counted once per pause).
        let mut paused = false;
        // The handlers but live delivery (the fan-out's hot path) are boxed:
        // the task of every connection, idle or not, would otherwise be sized
        // for the largest of them.
        loop {
            let idle_after = (self.s.st.server.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(self.s.st.server.idle_timeout_ms));
            match idle_after.filter(|_| self.s.is_idle()) {
                Some(after) => {
                    let at = last_frame + after;
                    match idle.as_mut() {
                        Some(sleep) if sleep.deadline() != at => sleep.as_mut().reset(at),
                        Some(_) => {}
                        None => idle = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                None => idle = None,
            }
            // The relay is stopping (`Engine::stop_sessions`, woken through the
            // live queue): bounded by shutdown_grace_ms; an EVENT the writer has
            // not answered by then gets no OK.
            if self.s.live.stopping() {
                break Box::pin(self.s.finish_for_shutdown(&mut self.out, &mut self.stream)).await;
            }
            // Writes shaped, not refused: with max_pending_writes EVENTs awaiting their OK no
            // client frame is read until one is answered; TCP holds the client back meanwhile.
            let reading = self.s.held.is_none() && !self.s.writes_full();
            if !reading && !paused && self.s.held.is_none() {
                metrics::counter!(m::READS_PAUSED_TOTAL).increment(1);
            }
            paused = !reading;
            let step = tokio::select! {
                biased;
                // At most max_pending_writes: at it this connection's socket is not read (the
                // publisher waits); the writer's queue is engine.writer_queue_events.
                Some(done) = self.s.writes.next(), if !self.s.writes.is_empty() => Box::pin(self.s.on_write_done(&mut self.out, done)).await,
                // At most chunks_per_connection unsent: a client that does not read parks its own
                // queries, nobody else's.
                msg = self.s.reads.recv() => Box::pin(self.s.on_read(&mut self.out, msg)).await,
                // Only events matching this connection's subscriptions, at most
                // engine.live_buffer_events / live_buffer_bytes queued: past that the client is
                // disconnected (slow consumer); held per subscription until EOSE at most
                // max_buffered_live_events (that subscription is CLOSED).
                r = self.s.live.recv() => match r {
                    Err(LiveEnd::Stopped) => break Box::pin(self.s.finish_for_shutdown(&mut self.out, &mut self.stream)).await,
                    r => Box::pin(self.s.on_live(&mut self.out, r)).await,
                },
                // One EVENT at most, held by a write delay: meanwhile no client frame is read (the
                // delayed client waits, nobody else).
                () = event::held_until(&mut self.s.held), if self.s.held.is_some() => Box::pin(self.s.resume_held(&mut self.out)).await,
                // One message at a time, at most limits.max_message_bytes; a client that sends faster
                // than it is answered is held back by its own socket buffers.
                msg = self.stream.next(), if reading => {
                    if self.s.st.server.idle_timeout_ms > 0 {
                        last_frame = tokio::time::Instant::now();
                    }
                    Box::pin(self.s.on_frame(&mut self.out, msg)).await
                }
                // Nothing open and nothing sent for server.idle_timeout_ms: the connection only
                // holds a socket and a connection slot.
                () = idle_elapsed(&mut idle), if idle.is_some() => {
                    Box::pin(self.out.close(close_code::NORMAL, "idle")).await;
                    break CloseReason::Idle;
                }
            };
            if let Err(reason) = step {
                break reason;
            }
        }
    }
}

/// Waits for the idle timer (polled only while there is one). The future
/// is one pointer, as is every one the connection's `select!` holds.
fn idle_elapsed(idle: &mut Option<Pin<Box<Sleep>>>) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| match idle {
        Some(sleep) => sleep.as_mut().poll(cx),
        None => std::task::Poll::Pending,
    })
}

impl Session {
    fn new(
        st: Arc<AppState>,
        front: Arc<crate::Reloadable>,
        ip: IpAddr,
        host: Option<String>,
    ) -> Session {
        let throttle = st.engine.limiter();
        let auth = auth::AuthState::new(&st.anonymous_readers);
        let live = st.engine.live_connect();
        live.set_readers(auth.readers().clone());
        Session {
            ip,
            write_adm: throttle.pacer(),
            read_adm: throttle.pacer(),
            keys: None,
            writes: Writes::default(),
            held: None,
            subs: Subs::default(),
            reads: st.engine.reads().sink(front.limits.max_subscriptions),
            read_budget: throttle.connection_read_budget(),
            live,
            auth,
            principal: None,
            neg: neg::NegSessions::default(),
            host: host.map(String::into_boxed_str),
            front,
            st,
        }
    }

    /// Who this connection's requests are charged to. An anonymous
    /// connection keeps none (it is its address's, made when asked for):
    /// only an authenticated one holds its own, boxed.
    pub(super) fn principal(&self) -> Principal {
        match &self.principal {
            Some(p) => **p,
            None => Principal::anonymous(self.ip),
        }
    }

    /// `server.max_pending_writes` EVENTs await their OK: no client frame
    /// is read until one is answered.
    fn writes_full(&self) -> bool {
        self.writes.len() >= self.st.server.max_pending_writes
    }

    /// Nothing this connection asked for is open: no subscription, no
    /// COUNT, no EVENT held or awaiting its OK.
    fn is_idle(&self) -> bool {
        self.subs.open_len() == 0
            && self.neg.len() == 0
            && self.writes.is_empty()
            && self.held.is_none()
    }

    /// One WebSocket message from the client (`None`: the stream ended).
    async fn on_frame(&mut self, out: &mut Out, frame: Option<Result<Message, WsError>>) -> Step {
        match frame {
            Some(Ok(Message::Text(t))) => self.on_text(out, &t).await,
            Some(Ok(Message::Binary(_))) => out.send(Refusal::Binary.notice()).await,
            Some(Ok(Message::Ping(payload))) => out.pong(&payload).await,
            Some(Ok(Message::Close(frame))) => {
                // Echo the client's code (RFC 6455 section 5.5.1).
                let code = frame.map_or(close_code::NORMAL, |f| f.code);
                out.close(code, "").await;
                Err(CloseReason::ClientClosed)
            }
            None => Err(CloseReason::ClientClosed),
            Some(Err(WsError::TooLarge)) => {
                let _ = out.send(Refusal::FrameTooLarge.notice()).await;
                out.close(close_code::SIZE, "message too large").await;
                Err(CloseReason::MessageTooLarge)
            }
            Some(Err(e)) => {
                tracing::debug!(peer = %self.ip, error = %e, "websocket error");
                match e {
                    WsError::BadUtf8 => out.close(close_code::INVALID_DATA, "not UTF-8").await,
                    WsError::Protocol(what) => out.close(close_code::PROTOCOL, what).await,
                    WsError::Io(_) | WsError::TooLarge => {}
                }
                Err(CloseReason::ProtocolError)
            }
        }
    }

    async fn on_text(&mut self, out: &mut Out, text: &str) -> Step {
        let received = Instant::now();
        let max = self.front.limits.max_message_bytes;
        if text.len() > max {
            metrics::counter!(m::MESSAGES_RECEIVED_TOTAL, "type" => "too_large").increment(1);
            let refusal = Refusal::TooLarge {
                len: text.len(),
                max,
            };
            // Refused without parsing it: only the id is looked for. The
            // whole text is searched (it is bounded by the frame limit):
            // an event's fields come in any order, and an id after a long
            // content must still get its OK.
            if text.trim_start().starts_with("[\"EVENT\"")
                && let Some(id) = sniff_id(text)
            {
                return out.send(refusal.ok(&id)).await;
            }
            return out.send(refusal.notice()).await;
        }
        let msg = match ClientMessage::parse(text) {
            Ok(msg) => msg,
            Err(e) => return self.on_bad_message(out, e).await,
        };
        metrics::counter!(m::MESSAGES_RECEIVED_TOTAL, "type" => msg.type_label()).increment(1);
        match msg {
            ClientMessage::Event(ev) => self.on_event(out, ev, received).await,
            ClientMessage::Req { sub_id, filters } => self.on_req(out, sub_id, filters).await,
            ClientMessage::Count { sub_id, filters } => self.on_count(out, sub_id, filters).await,
            ClientMessage::Close { sub_id } => self.on_close(&sub_id),
            ClientMessage::Auth(ev) => self.on_auth(out, ev).await,
            ClientMessage::NegOpen {
                sub_id,
                filter,
                message,
            } => self.on_neg_open(out, sub_id, *filter, message).await,
            ClientMessage::NegMsg { sub_id, message } => {
                self.on_neg_msg(out, sub_id, message).await
            }
            ClientMessage::NegClose { sub_id } => self.on_neg_close(&sub_id),
        }
    }

    async fn on_bad_message(&mut self, out: &mut Out, e: MessageError) -> Step {
        metrics::counter!(m::MESSAGES_RECEIVED_TOTAL, "type" => "invalid").increment(1);
        match e {
            MessageError::BadEvent {
                id: Some(id),
                error,
            } => out.send(Refusal::Invalid(error.to_string()).ok(&id)).await,
            MessageError::BadFilter { sub_id, error } => {
                // A bad REQ ends the subscription it would have replaced.
                self.subs.close(&sub_id);
                out.send(Refusal::Invalid(error.to_string()).closed(&sub_id))
                    .await
            }
            MessageError::UnknownType(t) => out.send(Refusal::UnknownType(t).notice()).await,
            MessageError::BadNeg { sub_id, error } => {
                out.send(NegError::BadMessage(error).neg_err(&sub_id)).await
            }
            other => out.send(Refusal::Invalid(other.to_string()).notice()).await,
        }
    }

    /// On shutdown: refuse the EVENT held by a write delay (it never reached
    /// the writer), answer the EVENTs already handed to the writer (it
    /// commits them before it stops), close with 1001 Going Away, then read
    /// (and drop) what the client still sends until its Close, so the
    /// socket is not reset with those answers unread. All within
    /// `shutdown_grace_ms`.
    async fn finish_for_shutdown(&mut self, out: &mut Out, stream: &mut WsRead) -> CloseReason {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.st.server.shutdown_grace_ms);
        let _ = tokio::time::timeout_at(deadline, async {
            if let Some(held) = self.held.take() {
                out.send(Refusal::ShuttingDown.ok(&held.id_hex())).await?;
            }
            while let Some(done) = self.writes.next().await {
                self.on_write_done(out, done).await?;
            }
            Ok::<(), CloseReason>(())
        })
        .await;
        out.close(close_code::AWAY, "relay is shutting down").await;
        let _ = tokio::time::timeout_at(deadline, async {
            while let Some(Ok(msg)) = stream.next().await {
                if matches!(msg, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
        CloseReason::Shutdown
    }
}
