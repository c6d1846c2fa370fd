//! One WebSocket connection: a single task with one loop over a fixed set
//! of sources, polled in this order: shutdown, answered writes, query
//! answers, live events, then client input (the EVENT held by a write
//! delay, or else the next client message), then the idle timer. Work
//! already admitted is answered before new work is read. Each source's
//! bound, and who loses when it fills, is said where it is polled
//! (`Conn::poll_woke`).
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
mod small_str;
mod subs;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};
use sluice_engine::handles::{Handle, LabelledCounter};
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
use self::out::{CloseReason, Out, OutState, Socket, Step};
use self::refusal::{NegError, Refusal};
use self::small_str::SmallStr;
use self::subs::Subs;
use crate::AppState;
use crate::metrics_names as m;
use sluice_ws::read::ReadState;
use sluice_ws::send::WriteState;
use sluice_ws::{Message, WsError, close_code};
use tokio::net::tcp::ReadHalf;

/// Parsed author keys one connection keeps (a few hundred bytes at most).
const SESSION_PUBKEY_CACHE: usize = 4;

/// A session's cache of parsed author keys, made at its first use.
fn keys(slot: &mut Option<Box<PubkeyCache>>) -> &mut PubkeyCache {
    slot.get_or_insert_with(|| Box::new(PubkeyCache::new(SESSION_PUBKEY_CACHE)))
}

/// A connection's [`Extra`], made now if it has none (a field's function:
/// the rest of the session stays free to borrow).
fn extra(slot: &mut Option<Box<Extra>>) -> &mut Extra {
    slot.get_or_insert_with(Default::default)
}

/// What a connection holds once it publishes, authenticates or opens a
/// NIP-77 session, made at the first need: a connection that only reads
/// keeps a pointer, and its task (every connection's is sized alike) stays
/// small.
#[derive(Default)]
struct Extra {
    /// Parsed author keys: a client mostly publishes as one or a few
    /// (made at its first EVENT).
    keys: Option<Box<PubkeyCache>>,
    /// Batching of controller delays (docs/design.md#pid-control) for
    /// writes, made at the first EVENT.
    write_adm: Option<ConnPacer>,
    /// EVENTs handed to the writer, awaiting its answer.
    writes: Writes,
    /// The EVENT waiting out a write delay; no client frame is read while
    /// there is one.
    held: Option<Box<Held>>,
    /// NIP-77 negentropy sessions.
    neg: neg::NegSessions,
    /// Who this connection's requests are charged to once it has
    /// authenticated (before: its address, made when asked for).
    principal: Option<Principal>,
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
    /// Batching of controller delays (docs/design.md#pid-control) for
    /// reads; the writes' pacer is made at the first EVENT ([`Extra`]), with
    /// the batching configured when the connection opened.
    read_adm: ConnPacer,
    write_every_ops: u32,
    /// EVENTs, AUTH and NIP-77 state, made at the first need.
    extra: Option<Box<Extra>>,
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
    /// The `Host` header of the upgrade request (AUTH's `relay` tag is
    /// checked against it when no `auth.relay_urls` are configured).
    host: Option<SmallStr>,
}

/// What a session starts from; taken apart by [`run`] before any future
/// holds it.
/// The series a session records per message and per event, their handles
/// looked up once for the relay (`sluice_engine::handles`).
pub(crate) struct Recorded {
    messages: LabelledCounter,
    pub(crate) events_received: LabelledCounter,
    pub(crate) events_accepted: LabelledCounter,
    pub(crate) ok_latency: Handle<Histogram>,
    pub(crate) live_deliveries: Handle<Counter>,
}

impl Default for Recorded {
    fn default() -> Recorded {
        Recorded {
            messages: LabelledCounter::new(m::MESSAGES_RECEIVED_TOTAL, "type"),
            events_received: LabelledCounter::new(m::EVENTS_RECEIVED_TOTAL, "kind_class"),
            events_accepted: LabelledCounter::new(m::EVENTS_ACCEPTED_TOTAL, "outcome"),
            ok_latency: Handle::histogram(m::OK_LATENCY_SECONDS),
            live_deliveries: Handle::counter(m::LIVE_DELIVERIES_TOTAL),
        }
    }
}

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

/// An upgraded connection: its session, its socket and what each half
/// keeps, and what it counts in (the connection permits,
/// `sluice_connections_open`). Dropped in this order: the session's
/// subscriptions and queries are given back before the socket closes.
struct Conn {
    s: Session,
    sock: Socket,
    stream: ReadState,
    out: OutState,
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
        // Frames are bounded at twice the message limit, so that a message
        // over the limit is answered by the session (with its id when it is an
        // EVENT) rather than cut off by the WebSocket layer.
        let hard_max = front.limits.max_message_bytes.saturating_mul(2);
        let stream = ReadState::new(
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
        let out = OutState::new(
            WriteState::new(
                st.server.write_buffer_bytes,
                st.server.max_write_buffer_bytes,
                deflater,
            ),
            Duration::from_millis(st.server.send_timeout_ms),
        );
        Conn {
            s: Session::new(st, front, ip, host),
            sock: Socket(tcp),
            stream,
            out,
            _open: open,
            _permits: permits,
        }
    }

    /// The session and the outgoing half, for a handler.
    fn parts(&mut self) -> (&mut Session, Out<'_>) {
        let (_, write) = self.sock.0.split();
        (&mut self.s, self.out.bind(write))
    }

    /// Winds the session down for shutdown ([`Session::finish_for_shutdown`]).
    async fn finish_for_shutdown(&mut self) -> CloseReason {
        let (mut read, write) = self.sock.0.split();
        let mut out = self.out.bind(write);
        let stream = &mut self.stream;
        self.s
            .finish_for_shutdown(&mut out, stream, &mut read)
            .await
    }

    /// Serves the connection until it ends; why it ended. Each handler runs
    /// boxed, with the outgoing half it is given (every connection's task
    /// holds a pointer while one runs, not the largest handler).
    async fn serve(&mut self) -> CloseReason {
        if self.s.st.auth.challenge_on_connect {
            let (s, out) = self.parts();
            let sent = Box::pin(async move {
                let mut out = out;
                s.send_challenge(&mut out).await
            });
            if sent.await.is_err() {
                return CloseReason::IoError;
            }
        }
        // The idle timer exists only while the session is idle (a connection
        // with a subscription holds none).
        let mut last_frame = tokio::time::Instant::now();
        let mut idle: Option<Pin<Box<Sleep>>> = None;
        // Whether the socket is left unread (counted once per pause).
        let mut paused = false;
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
                break Box::pin(self.finish_for_shutdown()).await;
            }
            // Writes shaped, not refused: with max_pending_writes EVENTs awaiting their OK no
            // client frame is read until one is answered; TCP holds the client back meanwhile.
            let reading = self.s.reading();
            if !reading && !paused && !self.s.holds_event() {
                metrics::counter!(m::READS_PAUSED_TOTAL).increment(1);
            }
            paused = !reading;
            let woke = std::future::poll_fn(|cx| self.poll_woke(cx, &mut idle)).await;
            if let Woke::Frame(_) = woke
                && self.s.st.server.idle_timeout_ms > 0
            {
                last_frame = tokio::time::Instant::now();
            }
            if let Woke::Live(Err(LiveEnd::Stopped)) = woke {
                break Box::pin(self.finish_for_shutdown()).await;
            }
            let (s, mut out) = self.parts();
            let step = match woke {
                Woke::Written(done) => {
                    Box::pin(async move { s.on_write_done(&mut out, done).await }).await
                }
                Woke::Read(msg) => Box::pin(async move { s.on_read(&mut out, msg).await }).await,
                Woke::Live(r) => Box::pin(async move { s.on_live(&mut out, r).await }).await,
                Woke::Held => Box::pin(async move { s.resume_held(&mut out).await }).await,
                Woke::Frame(msg) => Box::pin(async move { s.on_frame(&mut out, msg).await }).await,
                Woke::Idle => {
                    Box::pin(async move { out.close(close_code::NORMAL, "idle").await }).await;
                    break CloseReason::Idle;
                }
            };
            if let Err(reason) = step {
                break reason;
            }
        }
    }
}

impl Conn {
    /// The first source ready, in the loop's order (each one polled in
    /// place: the loop's future holds no future of its own per source, and
    /// what is ready is taken only by the poll that returns it). As
    /// `tokio::select!` does, nothing is polled once the task's budget is
    /// spent: the task yields.
    fn poll_woke(
        &mut self,
        cx: &mut Context<'_>,
        idle: &mut Option<Pin<Box<Sleep>>>,
    ) -> Poll<Woke> {
        if !tokio::task::coop::has_budget_remaining() {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // At most max_pending_writes: at it this connection's socket is not read (the
        // publisher waits); the writer's queue is engine.writer_queue_events.
        if self.s.writes_len() > 0
            && let Poll::Ready(Some(done)) = self.s.poll_written(cx)
        {
            return Poll::Ready(Woke::Written(done));
        }
        // At most chunks_per_connection unsent: a client that does not read parks its own
        // queries, nobody else's.
        if let Poll::Ready(msg) = std::pin::pin!(self.s.reads.recv()).poll(cx) {
            return Poll::Ready(Woke::Read(msg));
        }
        // Only events matching this connection's subscriptions, at most
        // engine.live_buffer_events / live_buffer_bytes queued: past that the client is
        // disconnected (slow consumer); held per subscription until EOSE at most
        // max_buffered_live_events (that subscription is CLOSED).
        if let Poll::Ready(r) = std::pin::pin!(self.s.live.recv()).poll(cx) {
            return Poll::Ready(Woke::Live(r));
        }
        // One EVENT at most, held by a write delay: meanwhile no client frame is read (the
        // delayed client waits, nobody else).
        if self.s.holds_event() && self.s.poll_held(cx).is_ready() {
            return Poll::Ready(Woke::Held);
        }
        // One message at a time, at most limits.max_message_bytes; a client that sends faster
        // than it is answered is held back by its own socket buffers.
        if self.s.reading() {
            let (mut read, _) = self.sock.0.split();
            if let Poll::Ready(msg) = self.stream.poll_next(&mut read, cx) {
                return Poll::Ready(Woke::Frame(msg));
            }
        }
        // Nothing open and nothing sent for server.idle_timeout_ms: the connection only
        // holds a socket and a connection slot.
        if let Some(sleep) = idle
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Woke::Idle);
        }
        Poll::Pending
    }
}

/// What woke the connection's loop, and what it brought.
enum Woke {
    Written(Box<event::WriteDone>),
    Read(Box<sluice_engine::reads::ReadMsg>),
    Live(Result<sluice_engine::live::LiveDelivery, LiveEnd>),
    Held,
    Frame(Option<Result<Message, WsError>>),
    Idle,
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
            read_adm: throttle.pacer(),
            write_every_ops: throttle.with_config(|c| c.check_every_ops),
            extra: None,
            subs: Subs::default(),
            reads: live.read_sink(st.engine.reads(), front.limits.max_subscriptions),
            read_budget: throttle.connection_read_budget(),
            live,
            auth,
            host: host.map(SmallStr::from),
            front,
            st,
        }
    }

    /// What the connection holds for EVENTs, AUTH and NIP-77, made now if
    /// it has none.
    fn extra(&mut self) -> &mut Extra {
        extra(&mut self.extra)
    }

    /// This connection's NIP-77 sessions.
    fn neg(&mut self) -> &mut neg::NegSessions {
        &mut self.extra().neg
    }

    /// The `Host` header of the upgrade request.
    fn host(&self) -> Option<&str> {
        self.host.as_ref().map(SmallStr::as_str)
    }

    /// Who this connection's requests are charged to. An anonymous
    /// connection keeps none (it is its address's, made when asked for):
    /// only an authenticated one holds its own.
    pub(super) fn principal(&self) -> Principal {
        match self.extra.as_ref().and_then(|x| x.principal) {
            Some(p) => p,
            None => Principal::anonymous(self.ip),
        }
    }

    /// EVENTs awaiting their OK.
    fn writes_len(&self) -> usize {
        self.extra.as_ref().map_or(0, |x| x.writes.len())
    }

    /// An EVENT is held by a write delay.
    fn holds_event(&self) -> bool {
        self.extra.as_ref().is_some_and(|x| x.held.is_some())
    }

    /// NIP-77 sessions open.
    fn neg_len(&self) -> usize {
        self.extra.as_ref().map_or(0, |x| x.neg.len())
    }

    /// Whether client frames are read: not while an EVENT is held by a
    /// write delay, nor while `server.max_pending_writes` EVENTs await
    /// their OK (until one is answered).
    fn reading(&self) -> bool {
        !self.holds_event() && self.writes_len() < self.st.server.max_pending_writes
    }

    /// Nothing this connection asked for is open: no subscription, no
    /// COUNT, no EVENT held or awaiting its OK.
    fn is_idle(&self) -> bool {
        self.subs.open_len() == 0
            && self.neg_len() == 0
            && self.writes_len() == 0
            && !self.holds_event()
    }

    /// One WebSocket message from the client (`None`: the stream ended).
    async fn on_frame(
        &mut self,
        out: &mut Out<'_>,
        frame: Option<Result<Message, WsError>>,
    ) -> Step {
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

    async fn on_text(&mut self, out: &mut Out<'_>, text: &str) -> Step {
        let received = Instant::now();
        let max = self.front.limits.max_message_bytes;
        if text.len() > max {
            self.st.recorded.messages.increment("too_large", 1);
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
        self.st.recorded.messages.increment(msg.type_label(), 1);
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

    async fn on_bad_message(&mut self, out: &mut Out<'_>, e: MessageError) -> Step {
        self.st.recorded.messages.increment("invalid", 1);
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
    async fn finish_for_shutdown(
        &mut self,
        out: &mut Out<'_>,
        stream: &mut ReadState,
        read: &mut ReadHalf<'_>,
    ) -> CloseReason {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.st.server.shutdown_grace_ms);
        let _ = tokio::time::timeout_at(deadline, async {
            let Some(extra) = self.extra.as_mut() else {
                return Ok(());
            };
            if let Some(held) = extra.held.take() {
                out.send(Refusal::ShuttingDown.ok(&held.id_hex())).await?;
            }
            while let Some(done) = self.next_written().await {
                self.on_write_done(out, done).await?;
            }
            Ok::<(), CloseReason>(())
        })
        .await;
        out.close(close_code::AWAY, "relay is shutting down").await;
        let _ = tokio::time::timeout_at(deadline, async {
            while let Some(Ok(msg)) = stream.next(read).await {
                if matches!(msg, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
        CloseReason::Shutdown
    }
}

#[cfg(test)]
mod tests {
    /// The size of what `f` returns, without calling it.
    fn output_size<A, B, C, R>(_: impl FnOnce(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every connection's task holds this future: with tokio's header and
    /// trailer around it, rounded up to 128 bytes, the task is 640 bytes
    /// (docs/benchmarks.md#memory-per-connection).
    #[test]
    fn a_connection_task_stays_within_640_bytes() {
        let size = output_size(super::run);
        assert!(size <= 528, "the session future is {size} bytes");
    }
}
