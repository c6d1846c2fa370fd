//! A client's EVENT: the ingest pipeline (`ingest.rs`, shared with
//! the mirrors) with this connection's own steps between its parts, a write
//! delay that holds back only its own EVENT, then the OK when the writer
//! answers.
//!
//! The order is fixed, cheapest refusal first: admission's checks before
//! the signature (the event's limits, the policy, the web of trust's
//! `deny`, the proof of work an outsider must carry, the outsiders' shared
//! budget), then this connection's buckets, its class's budgets and the
//! write controller (before the signature: a flood costs a bucket lookup,
//! not curve arithmetic), then admission's signature, NIP-70, NIP-62 and
//! the author's bucket and distance's budget (only after the signature: an
//! unsigned claim must not spend someone else's budget), then the plugin
//! and the writer's queue.
//!
//! A controller delay (`Verdict::Delay`) parks the EVENT in [`Held`] (one at
//! most: the session reads no client frame while it holds one) with a timer;
//! OKs, query answers, live events and shutdown keep being served, and when
//! the timer fires the EVENT goes on from the signature check. OK true is
//! sent only when the writer reports the commit (or at once for an
//! ephemeral event, which is never stored).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use sluice_engine::mirror_tap::Origin;
use sluice_proto::{Event, KindClass, RelayMessage};
use sluice_throttle::{ConnPacer, Verdict};
use tokio::time::Sleep;

use super::ingest::{self, Answer, HandedOn, Sender};
use super::out::{Out, Step};
use super::refusal::Refusal;
use super::small_str::SmallStr;
use super::{Session, id_hex};

/// The answer of one EVENT handed to the writer.
pub(super) type WriteFut = Pin<Box<dyn Future<Output = WriteDone> + Send>>;

/// The EVENTs handed on and awaiting their answer. The set is made at the
/// first EVENT: a connection that only reads never holds one (boxed: 8
/// bytes in every connection's task, not 24).
#[derive(Default)]
pub(super) struct Writes(Option<Box<futures_util::stream::FuturesUnordered<WriteFut>>>);

impl Writes {
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |w| w.len())
    }

    fn push(&mut self, fut: WriteFut) {
        self.0.get_or_insert_with(Default::default).push(fut);
    }

    /// The next answer (boxed: it is large, and the connection's task
    /// would otherwise be sized for it). `None` when none is awaited.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Box<WriteDone>>> {
        use futures_util::Stream;
        match self.0.as_mut() {
            Some(w) => Pin::new(&mut **w).poll_next(cx).map(|d| d.map(Box::new)),
            None => Poll::Ready(None),
        }
    }
}

pub(super) struct WriteDone {
    started: Instant,
    id: [u8; 32],
    answer: Answer,
}

/// An EVENT waiting out a write delay. A session holds one at most.
pub(super) struct Held {
    ev: Box<Event>,
    received: Instant,
    until: Pin<Box<Sleep>>,
}

impl Held {
    pub(super) fn id_hex(&self) -> String {
        self.ev.id_hex()
    }
}

impl Session {
    /// The next answer of an EVENT handed to the writer; `None` when none
    /// is awaited.
    pub(super) fn poll_written(&mut self, cx: &mut Context<'_>) -> Poll<Option<Box<WriteDone>>> {
        match self.extra.as_mut() {
            Some(x) => x.writes.poll_next(cx),
            None => Poll::Ready(None),
        }
    }

    /// [`Session::poll_written`] as a future.
    pub(super) fn next_written(&mut self) -> impl Future<Output = Option<Box<WriteDone>>> + '_ {
        std::future::poll_fn(move |cx| self.poll_written(cx))
    }

    /// Ready when the held EVENT's delay is over; pending while none is held.
    pub(super) fn poll_held(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.extra.as_mut().and_then(|x| x.held.as_mut()) {
            Some(h) => h.until.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    pub(super) async fn on_event(
        &mut self,
        out: &mut Out<'_>,
        ev: Box<Event>,
        received: Instant,
    ) -> Step {
        let class = KindClass::of(ev.kind).as_str();
        self.st.recorded.events_received.increment(class, 1);
        match self.admit(&ev) {
            Err(refusal) if refusal.asks_auth() => {
                self.send_asking_auth(out, refusal.ok(&ev.id_hex())).await
            }
            Err(refusal) => out.send(refusal.ok(&ev.id_hex())).await,
            Ok(None) => self.verify_and_submit(out, ev, received).await,
            Ok(Some(delay)) => {
                let until = Box::pin(tokio::time::sleep(delay));
                self.extra().held = Some(Box::new(Held {
                    ev,
                    received,
                    until,
                }));
                Ok(())
            }
        }
    }

    /// The held EVENT's delay is over: it goes on where it stopped.
    pub(super) async fn resume_held(&mut self, out: &mut Out<'_>) -> Step {
        match self.extra.as_mut().and_then(|x| x.held.take()) {
            Some(h) => self.verify_and_submit(out, h.ev, h.received).await,
            None => Ok(()),
        }
    }

    /// Who this connection is, for admission.
    fn sender(&self) -> Sender<'_> {
        Sender {
            ip: self.ip,
            authed: self.auth.pubkeys(),
            host: self.host(),
            origin: Origin::Client,
        }
    }

    /// The checks before the signature (admission's, then this client's
    /// buckets, its class's budgets and the write verdict). `Ok(Some(d))`:
    /// wait `d`, then go on.
    fn admit(&mut self, ev: &Event) -> Result<Option<Duration>, Refusal> {
        let author =
            ingest::before_signature(&self.st, &self.front.event_limits, ev, &self.sender())?;
        let who = self.principal();
        let every = self.write_every_ops;
        let pacer = super::extra(&mut self.extra)
            .write_adm
            .get_or_insert_with(|| ConnPacer::new(every));
        match self.st.engine.limiter().admit_event(&who, author, pacer) {
            Verdict::Allow => Ok(None),
            Verdict::Delay(d) => Ok(Some(d)),
            Verdict::Refuse(r) => Err(r.into()),
        }
    }

    async fn verify_and_submit(
        &mut self,
        out: &mut Out<'_>,
        ev: Box<Event>,
        received: Instant,
    ) -> Step {
        let id = ev.id;
        match self.verify_and_queue(ev) {
            Ok(HandedOn::Pending(answer)) => {
                self.extra().writes.push(Box::pin(async move {
                    WriteDone {
                        started: received,
                        id,
                        answer: answer.await,
                    }
                }));
                Ok(())
            }
            Ok(HandedOn::Ephemeral) => {
                self.st.recorded.events_accepted.increment("ephemeral", 1);
                out.send(RelayMessage::ok(&id_hex(&id), true, "")).await
            }
            Err(refusal) if refusal.asks_auth() => {
                self.send_asking_auth(out, refusal.ok(&id_hex(&id))).await
            }
            Err(refusal) => out.send(refusal.ok(&id_hex(&id))).await,
        }
    }

    /// The checks after any delay (the signature, NIP-70, NIP-62, the
    /// author's bucket), then the plugin and the writer's queue (or the
    /// live fan-out for an ephemeral event).
    fn verify_and_queue(&mut self, ev: Box<Event>) -> Result<HandedOn, Refusal> {
        // The writer wait the monitor sees starts here: after the throttle's
        // own delay (counting it would feed the controller its own output),
        // before the signature check (CPU saturation is load).
        let admitted = Instant::now();
        let lone = self.writes_len() == 0;
        let from = Sender {
            ip: self.ip,
            authed: self.auth.pubkeys(),
            host: self.host.as_ref().map(SmallStr::as_str),
            origin: Origin::Client,
        };
        let keys = super::keys(&mut super::extra(&mut self.extra).keys);
        let outsider = ingest::after_signature(&self.st, &ev, keys, &from)?;
        ingest::hand_on(
            &self.st,
            std::sync::Arc::new(*ev),
            &from,
            (admitted, lone, outsider),
        )
    }

    /// The writer answered an EVENT (or stopped): its OK.
    pub(super) async fn on_write_done(&mut self, out: &mut Out<'_>, done: Box<WriteDone>) -> Step {
        self.st
            .recorded
            .ok_latency
            .get()
            .record(done.started.elapsed().as_secs_f64());
        let id = id_hex(&done.id);
        match done.answer.result() {
            Ok((label, message)) => {
                self.st.recorded.events_accepted.increment(label, 1);
                out.send(RelayMessage::ok(&id, true, &message)).await
            }
            Err(refusal) => out.send(refusal.ok(&id)).await,
        }
    }
}
