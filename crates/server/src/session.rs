//! One WebSocket connection: a single task with one `select!` loop over a
//! fixed set of sources, polled in this order (`biased`): shutdown, answered
//! writes, query answers, live events, the next client message. Work already
//! admitted is answered before new work is read.
//!
//! Bounds, and who loses when they fill:
//! - pending EVENTs (`max_pending_writes`): further EVENTs are refused at
//!   once with `rate-limited:` (before any signature check), so a flood
//!   waits in no hidden buffer: the relay keeps reading and answering, and
//!   the excess costs a JSON parse, not a queue slot;
//! - open subscriptions and running COUNTs (`max_subscriptions`): the REQ
//!   is refused with CLOSED `rate-limited:`;
//! - query answers arrive in chunks through the session's read sink, at
//!   most `throttle.queries.chunks_per_connection` unsent; a client that
//!   does not read holds its own queries back (parked), nobody else's;
//! - live events buffered while a subscription's query runs
//!   (`max_buffered_live_events`): that subscription is CLOSED;
//! - the live broadcast (`engine.live_buffer_events`) and each send
//!   (`send_timeout_ms`): a client too slow to read is disconnected.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::SinkExt;
use futures_util::stream::{FuturesUnordered, SplitSink, StreamExt};
use sluice_engine::throttle::{ConnAdmission, ConnReadBudget, ConnectionGuard};
use sluice_engine::{
    Admit, LiveEvent, QueryError, ReadEnd, ReadGuard, ReadMsg, ReadSink, SubmitError, WriteError,
    WriteResult, unix_now,
};
use sluice_proto::message::sniff_id;
use sluice_proto::{
    ClientMessage, Event, Filter, KindClass, MessageError, PubkeyCache, Reason, RelayMessage,
};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, broadcast};

use crate::AppState;
use crate::metrics_names as m;

/// Parsed author keys one connection keeps (a few hundred bytes at most).
const SESSION_PUBKEY_CACHE: usize = 4;

type WriteFut = Pin<Box<dyn Future<Output = WriteDone> + Send>>;

struct WriteDone {
    started: Instant,
    id: [u8; 32],
    /// `None` when the writer stopped before answering.
    result: Option<WriteResult>,
}

struct Sub {
    filters: Vec<Filter>,
    /// The stored query while it runs; dropping it cancels the query and
    /// gives back whatever it holds in the scheduler.
    query: Option<ReadGuard>,
    /// Live matches held back while the stored query runs; `None` once
    /// EOSE is sent.
    pending: Option<Vec<Arc<LiveEvent>>>,
    /// Serials below this were visible to the stored query; live events
    /// still in flight with such serials were already sent (or cut by the
    /// limit) and are skipped.
    snapshot_serial: u64,
}

fn id_hex(id: &[u8; 32]) -> String {
    sluice_proto::hex32::encode(id)
}

/// Why a connection ended (a closed set, used as a metric label).
type CloseReason = &'static str;

struct Out {
    sink: SplitSink<WebSocket, Message>,
    timeout: Duration,
}

impl Out {
    async fn send(&mut self, text: String) -> Result<(), CloseReason> {
        match tokio::time::timeout(self.timeout, self.sink.send(Message::Text(text.into()))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("io_error"),
            Err(_) => Err("slow_consumer"),
        }
    }

    /// Queues a message without flushing (a chunk of events is flushed once).
    async fn feed(&mut self, text: String) -> Result<(), CloseReason> {
        match tokio::time::timeout(self.timeout, self.sink.feed(Message::Text(text.into()))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("io_error"),
            Err(_) => Err("slow_consumer"),
        }
    }

    async fn flush(&mut self) -> Result<(), CloseReason> {
        match tokio::time::timeout(self.timeout, self.sink.flush()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("io_error"),
            Err(_) => Err("slow_consumer"),
        }
    }

    async fn notice(&mut self, text: &str) -> Result<(), CloseReason> {
        metrics::counter!(m::NOTICES_SENT_TOTAL).increment(1);
        self.send(RelayMessage::notice(text)).await
    }

    /// Sends a close frame; the connection is ending, so errors are moot.
    async fn close(&mut self, code: u16, reason: &'static str) {
        let _ = self
            .sink
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })))
            .await;
    }
}

struct Session {
    st: Arc<AppState>,
    /// The client's address (after trusted-proxy headers).
    ip: IpAddr,
    /// Seed 000 batching of controller delays, per direction.
    write_adm: ConnAdmission,
    read_adm: ConnAdmission,
    /// Parsed author keys: a client mostly publishes as one or a few.
    keys: PubkeyCache,
    subs: HashMap<String, Sub>,
    writes: FuturesUnordered<WriteFut>,
    /// Where this connection's query answers arrive.
    reads: ReadSink,
    /// This connection's read budget (cost units).
    read_budget: ConnReadBudget,
    /// COUNTs running, by query id: their sub id and guard.
    counts: HashMap<u64, (String, ReadGuard)>,
    /// Subscribed to the live broadcast only while the connection has
    /// subscriptions: a publisher-only connection is never woken per
    /// stored event and can never fall behind it. Taken before a query is
    /// submitted, so no event between the two is missed.
    live: Option<broadcast::Receiver<Arc<LiveEvent>>>,
}

pub(crate) async fn run(
    socket: WebSocket,
    st: Arc<AppState>,
    ip: IpAddr,
    _permits: (OwnedSemaphorePermit, ConnectionGuard),
) {
    let peer = ip;
    metrics::gauge!(m::CONNECTIONS_OPEN).increment(1.0);
    metrics::counter!(m::CONNECTIONS_OPENED_TOTAL).increment(1);
    tracing::debug!(%peer, "connection opened");
    let (sink, mut stream) = socket.split();
    let mut out = Out {
        sink,
        timeout: Duration::from_millis(st.server.send_timeout_ms),
    };
    let mut s = Session {
        ip,
        write_adm: st.engine.throttle().admission(),
        keys: PubkeyCache::new(SESSION_PUBKEY_CACHE),
        read_adm: st.engine.throttle().admission(),
        reads: st.engine.reads().sink(st.limits.max_subscriptions),
        read_budget: st.engine.throttle().connection_read_budget(),
        st: st.clone(),
        subs: HashMap::new(),
        writes: FuturesUnordered::new(),
        counts: HashMap::new(),
        live: None,
    };
    let reason: CloseReason = loop {
        let step = tokio::select! {
            biased;
            _ = st.shutdown.cancelled() => break s.finish_for_shutdown(&mut out).await,
            Some(done) = s.writes.next(), if !s.writes.is_empty() => s.on_write_done(&mut out, done).await,
            msg = s.reads.recv() => s.on_read(&mut out, msg).await,
            r = async { s.live.as_mut().expect("guarded").recv().await }, if s.live.is_some() => match r {
                Ok(ev) => s.on_live(&mut out, ev).await,
                Err(RecvError::Lagged(_)) => Err("slow_consumer"),
                Err(RecvError::Closed) => Err("shutdown"),
            },
            msg = stream.next() => match msg {
                Some(Ok(Message::Text(t))) => s.on_text(&mut out, t.as_str()).await,
                Some(Ok(Message::Binary(_))) => out.notice("invalid: binary messages are not supported").await,
                Some(Ok(Message::Close(_))) | None => Err("client_closed"),
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => {
                    let text = e.to_string();
                    if text.contains("too long") || text.contains("Space limit") {
                        let _ = out.notice("invalid: message too large, closing").await;
                        out.close(close_code::SIZE, "message too large").await;
                        Err("message_too_large")
                    } else {
                        tracing::debug!(%peer, error = %text, "websocket error");
                        Err("protocol_error")
                    }
                }
            },
        };
        if let Err(reason) = step {
            break reason;
        }
        if s.subs.is_empty() {
            s.live = None;
        }
    };
    if reason == "slow_consumer" {
        metrics::counter!(m::SLOW_CONSUMER_DISCONNECTS_TOTAL).increment(1);
    }
    metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(s.subs.len() as f64);
    metrics::gauge!(m::CONNECTIONS_OPEN).decrement(1.0);
    metrics::counter!(m::CONNECTIONS_CLOSED_TOTAL, "reason" => reason).increment(1);
    tracing::debug!(%peer, reason, "connection closed");
}

impl Session {
    async fn on_text(&mut self, out: &mut Out, text: &str) -> Result<(), CloseReason> {
        let received = Instant::now();
        let max = self.st.limits.max_message_bytes;
        if text.len() > max {
            metrics::counter!(m::MESSAGES_RECEIVED_TOTAL, "type" => "too_large").increment(1);
            let detail = format!("message too large ({} bytes, max {max})", text.len());
            // Refused without parsing it: only the id is read, from the head.
            let head = &text[..text.floor_char_boundary(4096)];
            if head.trim_start().starts_with("[\"EVENT\"")
                && let Some(id) = sniff_id(head)
            {
                return self.refuse_event(out, &id, Reason::Invalid, &detail).await;
            }
            return out.notice(&Reason::Invalid.message(&detail)).await;
        }
        let msg = match ClientMessage::parse(text) {
            Ok(msg) => msg,
            Err(e) => return self.on_bad_message(out, e).await,
        };
        metrics::counter!(m::MESSAGES_RECEIVED_TOTAL, "type" => msg.type_label()).increment(1);
        match msg {
            ClientMessage::Event(ev) => self.on_event(out, ev, received).await,
            ClientMessage::Req { sub_id, filters } => {
                self.on_req(out, sub_id, filters, false).await
            }
            ClientMessage::Count { sub_id, filters } => {
                self.on_req(out, sub_id, filters, true).await
            }
            ClientMessage::Close { sub_id } => {
                if self.subs.remove(&sub_id).is_some() {
                    metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(1.0);
                }
                Ok(())
            }
        }
    }

    async fn on_bad_message(&mut self, out: &mut Out, e: MessageError) -> Result<(), CloseReason> {
        metrics::counter!(m::MESSAGES_RECEIVED_TOTAL, "type" => "invalid").increment(1);
        match e {
            MessageError::BadEvent {
                id: Some(id),
                error,
            } => {
                self.refuse_event(out, &id, Reason::Invalid, &error.to_string())
                    .await
            }
            MessageError::BadFilter { sub_id, error } => {
                if self.subs.remove(&sub_id).is_some() {
                    metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(1.0);
                }
                self.refuse_req(out, &sub_id, Reason::Invalid, &error.to_string())
                    .await
            }
            MessageError::UnknownType(t) => {
                out.notice(
                    &Reason::Unsupported.message(&format!("message type {t:?} is not supported")),
                )
                .await
            }
            other => {
                out.notice(&Reason::Invalid.message(&other.to_string()))
                    .await
            }
        }
    }

    async fn refuse_event(
        &mut self,
        out: &mut Out,
        id: &str,
        reason: Reason,
        detail: &str,
    ) -> Result<(), CloseReason> {
        metrics::counter!(m::EVENTS_REFUSED_TOTAL, "reason" => reason.as_str()).increment(1);
        out.send(RelayMessage::ok(id, false, &reason.message(detail)))
            .await
    }

    async fn refuse_req(
        &mut self,
        out: &mut Out,
        sub_id: &str,
        reason: Reason,
        detail: &str,
    ) -> Result<(), CloseReason> {
        metrics::counter!(m::REQS_REFUSED_TOTAL, "reason" => reason.as_str()).increment(1);
        out.send(RelayMessage::closed(sub_id, &reason.message(detail)))
            .await
    }

    async fn on_event(
        &mut self,
        out: &mut Out,
        ev: Box<Event>,
        received: Instant,
    ) -> Result<(), CloseReason> {
        let class = KindClass::of(ev.kind);
        metrics::counter!(m::EVENTS_RECEIVED_TOTAL, "kind_class" => class.as_str()).increment(1);
        if let Err(e) = ev.check_limits(&self.st.event_limits, unix_now()) {
            return self
                .refuse_event(out, &ev.id_hex(), Reason::Invalid, &e.to_string())
                .await;
        }
        if self.writes.len() >= self.st.server.max_pending_writes {
            metrics::counter!(m::EVENTS_REFUSED_IN_FLIGHT_TOTAL).increment(1);
            let detail = format!(
                "too many events in flight on this connection (max {}); wait for their OKs",
                self.st.server.max_pending_writes
            );
            return self
                .refuse_event(out, &ev.id_hex(), Reason::RateLimited, &detail)
                .await;
        }
        // Throttle before the signature check: a flood costs a bucket
        // lookup, not 30 µs of curve arithmetic per event.
        let throttle = self.st.engine.throttle().clone();
        match throttle.admit_event(self.ip, &mut self.write_adm) {
            Admit::Go => {}
            Admit::Delay(d) => tokio::time::sleep(d).await,
            Admit::Refuse(r) => {
                return self
                    .refuse_event(out, &ev.id_hex(), Reason::RateLimited, &r.detail())
                    .await;
            }
        }
        // The writer wait the monitor sees starts here: after the throttle's
        // own delay (counting it would feed the controller its own output),
        // before the signature check (CPU saturation is load).
        let admitted = Instant::now();
        if let Err(e) = ev.verify_cached(&mut self.keys) {
            return self
                .refuse_event(out, &ev.id_hex(), Reason::Invalid, &e.to_string())
                .await;
        }
        // The author's bucket only after the signature: an unsigned claim
        // must not spend someone else's budget.
        if let Admit::Refuse(r) = throttle.admit_author(&ev.pubkey) {
            return self
                .refuse_event(out, &ev.id_hex(), Reason::RateLimited, &r.detail())
                .await;
        }
        let id = ev.id;
        let ev = Arc::new(*ev);
        if class == KindClass::Ephemeral {
            self.st.engine.publish_ephemeral(ev);
            metrics::counter!(m::EVENTS_ACCEPTED_TOTAL, "outcome" => "ephemeral").increment(1);
            return out.send(RelayMessage::ok(&id_hex(&id), true, "")).await;
        }
        match self.st.engine.submit(ev, admitted) {
            Ok(rx) => {
                let started = received;
                self.writes.push(Box::pin(async move {
                    WriteDone {
                        started,
                        id,
                        result: rx.await.ok(),
                    }
                }));
                Ok(())
            }
            Err(SubmitError::QueueFull) => {
                self.refuse_event(
                    out,
                    &id_hex(&id),
                    Reason::RateLimited,
                    "relay is busy, retry in a few seconds",
                )
                .await
            }
            Err(SubmitError::Closed) => {
                self.refuse_event(out, &id_hex(&id), Reason::Error, "relay is shutting down")
                    .await
            }
        }
    }

    async fn on_write_done(&mut self, out: &mut Out, done: WriteDone) -> Result<(), CloseReason> {
        use sluice_engine::WriteOutcome as W;
        metrics::histogram!(m::OK_LATENCY_SECONDS).record(done.started.elapsed().as_secs_f64());
        let (accepted, reason, detail) = match &done.result {
            Some(Ok(W::Stored { .. } | W::Ephemeral)) => (true, None, ""),
            Some(Ok(W::Duplicate)) => (true, Some(Reason::Duplicate), "already have this event"),
            Some(Ok(W::Superseded)) => (
                false,
                Some(Reason::Duplicate),
                "have a newer version of this event",
            ),
            Some(Ok(W::Deleted)) => (
                false,
                Some(Reason::Blocked),
                "this event was deleted by its author",
            ),
            Some(Ok(W::Expired)) => (false, Some(Reason::Invalid), "event has expired"),
            Some(Err(WriteError::StoreFull)) => {
                (false, Some(Reason::Error), "relay storage is full")
            }
            Some(Err(WriteError::Store(_))) => {
                (false, Some(Reason::Error), "could not store the event")
            }
            None => (false, Some(Reason::Error), "relay is shutting down"),
        };
        if accepted {
            let label = match &done.result {
                Some(Ok(o)) => sluice_engine::outcome_label(o),
                _ => "stored",
            };
            metrics::counter!(m::EVENTS_ACCEPTED_TOTAL, "outcome" => label).increment(1);
        } else if let Some(r) = reason {
            metrics::counter!(m::EVENTS_REFUSED_TOTAL, "reason" => r.as_str()).increment(1);
        }
        let message = reason.map(|r| r.message(detail)).unwrap_or_default();
        out.send(RelayMessage::ok(&id_hex(&done.id), accepted, &message))
            .await
    }

    async fn on_req(
        &mut self,
        out: &mut Out,
        sub_id: String,
        mut filters: Vec<Filter>,
        count: bool,
    ) -> Result<(), CloseReason> {
        let lim = &self.st.limits;
        if sub_id.chars().count() > lim.max_subid_length {
            let detail = format!(
                "subscription id longer than {} characters",
                lim.max_subid_length
            );
            return self
                .refuse_req(out, &sub_id, Reason::Invalid, &detail)
                .await;
        }
        if filters.is_empty() {
            return self
                .refuse_req(
                    out,
                    &sub_id,
                    Reason::Invalid,
                    "at least one filter is required",
                )
                .await;
        }
        if filters.len() > lim.max_filters {
            let detail = format!(
                "too many filters ({}, max {})",
                filters.len(),
                lim.max_filters
            );
            return self
                .refuse_req(out, &sub_id, Reason::Invalid, &detail)
                .await;
        }
        let replacing = !count && self.subs.contains_key(&sub_id);
        if !replacing && self.subs.len() + self.counts.len() >= lim.max_subscriptions {
            let detail = format!(
                "too many open subscriptions (max {})",
                lim.max_subscriptions
            );
            return self
                .refuse_req(out, &sub_id, Reason::RateLimited, &detail)
                .await;
        }
        match self
            .st
            .engine
            .throttle()
            .admit_req(self.ip, &mut self.read_adm)
        {
            // Reads are never delayed (see `Throttle::admit_req`).
            Admit::Go | Admit::Delay(_) => {}
            Admit::Refuse(r) => {
                if self.subs.remove(&sub_id).is_some() {
                    metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(1.0);
                }
                return self
                    .refuse_req(out, &sub_id, Reason::RateLimited, &r.detail())
                    .await;
            }
        }
        // Subscribed before the query can take its snapshot: no gap.
        if self.live.is_none() {
            self.live = Some(self.st.engine.subscribe());
        }
        let reads = self.st.engine.reads();
        if count {
            return match reads.submit_count(&self.reads, self.ip, filters, &mut self.read_budget) {
                Ok(guard) => {
                    self.counts.insert(guard.job(), (sub_id, guard));
                    Ok(())
                }
                Err(e) => self.refuse_query(out, &sub_id, e).await,
            };
        }
        for f in &mut filters {
            f.limit = Some(f.limit.unwrap_or(lim.default_limit).min(lim.max_limit));
        }
        let sub = Sub {
            filters: filters.clone(),
            query: None,
            pending: Some(Vec::new()),
            snapshot_serial: 0,
        };
        // Replacing a REQ drops the old one's guard: its query is cancelled.
        if self.subs.insert(sub_id.clone(), sub).is_none() {
            metrics::gauge!(m::SUBSCRIPTIONS_OPEN).increment(1.0);
        }
        match reads.submit_query(&self.reads, self.ip, filters, &mut self.read_budget) {
            Ok(guard) => {
                if let Some(sub) = self.subs.get_mut(&sub_id) {
                    sub.query = Some(guard);
                }
                Ok(())
            }
            Err(e) => {
                self.subs.remove(&sub_id);
                metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(1.0);
                self.refuse_query(out, &sub_id, e).await
            }
        }
    }

    async fn refuse_query(
        &mut self,
        out: &mut Out,
        sub_id: &str,
        e: QueryError,
    ) -> Result<(), CloseReason> {
        match e {
            QueryError::Refused(r) => {
                self.refuse_req(out, sub_id, Reason::RateLimited, &r.detail())
                    .await
            }
            QueryError::Closed => {
                self.refuse_req(out, sub_id, Reason::Error, "relay is shutting down")
                    .await
            }
            QueryError::Store(e) => {
                tracing::warn!(error = %e, "query failed");
                self.refuse_req(out, sub_id, Reason::Error, "could not run the query")
                    .await
            }
        }
    }

    /// A chunk (and/or the end) of one of this connection's queries. The
    /// message's credit goes back when it is dropped, after the events are
    /// written: the next chunk is read only once this one is on its way.
    async fn on_read(&mut self, out: &mut Out, mut msg: ReadMsg) -> Result<(), CloseReason> {
        let throttle = self.st.engine.throttle().clone();
        throttle.settle_connection_read_cost(&mut self.read_budget, msg.settle_units);
        if let Some((sub_id, _guard)) = self.counts.remove(&msg.job) {
            return match msg.end.take() {
                Some(ReadEnd::Count { count, .. }) => {
                    out.send(RelayMessage::count(&sub_id, count)).await
                }
                Some(ReadEnd::Refused(r)) => {
                    self.refuse_req(out, &sub_id, Reason::RateLimited, &r.detail())
                        .await
                }
                Some(ReadEnd::Failed | ReadEnd::Eose { .. }) => {
                    self.refuse_req(out, &sub_id, Reason::Error, "could not count events")
                        .await
                }
                None => {
                    // Not the end yet: keep waiting.
                    self.counts.insert(msg.job, (sub_id, _guard));
                    Ok(())
                }
            };
        }
        let Some(sub_id) = self
            .subs
            .iter()
            .find(|(_, s)| s.query.as_ref().is_some_and(|q| q.job() == msg.job))
            .map(|(id, _)| id.clone())
        else {
            // A query closed or replaced since: its answer is dropped.
            return Ok(());
        };
        let events = std::mem::take(&mut msg.events);
        let n = events.len();
        for raw in events {
            out.feed(RelayMessage::event(&sub_id, &raw)).await?;
        }
        match msg.end.take() {
            None => {
                if n > 0 {
                    out.flush().await?;
                }
                Ok(())
            }
            Some(ReadEnd::Eose {
                snapshot_serial, ..
            }) => {
                out.feed(RelayMessage::eose(&sub_id)).await?;
                let held = match self.subs.get_mut(&sub_id) {
                    Some(sub) => {
                        sub.query = None;
                        sub.snapshot_serial = snapshot_serial;
                        sub.pending.take().unwrap_or_default()
                    }
                    None => Vec::new(),
                };
                // Events committed after the query's snapshot were not in it.
                for ev in held {
                    if ev.serial.is_none_or(|s| s >= snapshot_serial) {
                        out.feed(RelayMessage::event(&sub_id, ev.event.raw()))
                            .await?;
                        metrics::counter!(m::LIVE_DELIVERIES_TOTAL).increment(1);
                    }
                }
                out.flush().await
            }
            Some(end) => {
                self.subs.remove(&sub_id);
                metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(1.0);
                if n > 0 {
                    out.flush().await?;
                }
                match end {
                    ReadEnd::Refused(r) => {
                        self.refuse_req(out, &sub_id, Reason::RateLimited, &r.detail())
                            .await
                    }
                    _ => {
                        self.refuse_req(out, &sub_id, Reason::Error, "could not run the query")
                            .await
                    }
                }
            }
        }
    }

    async fn on_live(&mut self, out: &mut Out, ev: Arc<LiveEvent>) -> Result<(), CloseReason> {
        if self.subs.is_empty() {
            return Ok(());
        }
        let max_held = self.st.server.max_buffered_live_events;
        let mut overflowed = Vec::new();
        for (sub_id, sub) in &mut self.subs {
            if !sub.filters.iter().any(|f| f.matches(&ev.event)) {
                continue;
            }
            match &mut sub.pending {
                Some(held) if held.len() >= max_held => overflowed.push(sub_id.clone()),
                Some(held) => held.push(ev.clone()),
                None if ev.serial.is_some_and(|n| n < sub.snapshot_serial) => {}
                None => {
                    out.send(RelayMessage::event(sub_id, ev.event.raw()))
                        .await?;
                    metrics::counter!(m::LIVE_DELIVERIES_TOTAL).increment(1);
                }
            }
        }
        for sub_id in overflowed {
            self.subs.remove(&sub_id);
            metrics::gauge!(m::SUBSCRIPTIONS_OPEN).decrement(1.0);
            self.refuse_req(
                out,
                &sub_id,
                Reason::RateLimited,
                "too many live events while the query ran; subscribe again",
            )
            .await?;
        }
        Ok(())
    }

    /// On shutdown: answer the EVENTs already handed to the writer (it
    /// commits them before it stops), then close with 1001 Going Away.
    async fn finish_for_shutdown(&mut self, out: &mut Out) -> CloseReason {
        let grace = Duration::from_millis(self.st.server.shutdown_grace_ms);
        let _ = tokio::time::timeout(grace, async {
            while let Some(done) = self.writes.next().await {
                if self.on_write_done(out, done).await.is_err() {
                    break;
                }
            }
        })
        .await;
        out.close(close_code::AWAY, "relay is shutting down").await;
        "shutdown"
    }
}
