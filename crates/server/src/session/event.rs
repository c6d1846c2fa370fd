//! EVENT: admission, a write delay that holds back only its own EVENT, the
//! signature, the author's bucket, the writer; then the OK when the writer
//! answers.
//!
//! The order is fixed, cheapest refusal first: the event's limits, this
//! connection's EVENTs in flight (`server.max_pending_writes`), the IP's
//! bucket and the write controller (before the signature: a flood costs a
//! bucket lookup, not curve arithmetic), the web of trust's `deny`, the
//! proof of work an outsider must carry (a lookup and a count of zero
//! bits) and the outsiders' shared budget (nobody's own: keys are free),
//! then the signature, then the author's bucket (only after the signature:
//! an unsigned claim must not spend someone else's budget), then the
//! writer's queue.
//!
//! A controller delay (`Verdict::Delay`) parks the EVENT in [`Held`] (one at
//! most: the session reads no client frame while it holds one) with a timer;
//! OKs, query answers, live events and shutdown keep being served, and when
//! the timer fires the EVENT goes on from the signature check. OK true is
//! sent only when the writer reports the commit (or at once for an
//! ephemeral event, which is never stored).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_engine::plugin::{PluginVerdict, Source};
use sluice_engine::{Op, Verdict, WriteResult, unix_now};
use sluice_proto::{Event, KindClass, RelayMessage};
use sluice_throttle::trust::WriteStanding;
use tokio::time::Sleep;

use super::out::{Out, Step};
use super::refusal::Refusal;
use super::{Session, id_hex};
use crate::metrics_names as m;

/// The answer of one EVENT handed to the writer.
pub(super) type WriteFut = Pin<Box<dyn Future<Output = WriteDone> + Send>>;

/// The EVENTs handed on and awaiting their answer. The set is made at the
/// first EVENT: a connection that only reads never holds one.
#[derive(Default)]
pub(super) struct Writes(Option<futures_util::stream::FuturesUnordered<WriteFut>>);

impl Writes {
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |w| w.len())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, fut: WriteFut) {
        self.0.get_or_insert_with(Default::default).push(fut);
    }

    /// The next answer; pending forever while there is none (the session
    /// polls it only when some are awaited).
    pub(super) async fn next(&mut self) -> Option<WriteDone> {
        use futures_util::StreamExt;
        match self.0.as_mut() {
            Some(w) => w.next().await,
            None => None,
        }
    }
}

pub(super) struct WriteDone {
    started: Instant,
    id: [u8; 32],
    answer: Answer,
}

/// How an EVENT handed on ended.
enum Answer {
    /// The writer's outcome; `None` when it stopped before answering.
    Written(Option<WriteResult>),
    /// Refused before the writer (the write-policy plugin, or the writer's
    /// queue after the plugin accepted).
    Refused(Refusal),
    /// Taken without storing: the plugin's `shadowReject`, or an ephemeral
    /// event published after the plugin accepted it.
    Taken(&'static str),
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

/// Completes when the held EVENT's delay is over; pending while none is held.
pub(super) async fn held_until(held: &mut Option<Held>) {
    match held {
        Some(h) => h.until.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Hands an event to the writer: an outsider's to wait for a commit to
/// ride on, anyone else's to be committed at once.
fn submit(
    engine: &sluice_engine::Engine,
    ev: Arc<Event>,
    admitted: Instant,
    lone: bool,
    outsider: bool,
) -> Result<tokio::sync::oneshot::Receiver<WriteResult>, sluice_engine::SubmitError> {
    if outsider {
        engine.submit_outsider(ev, admitted)
    } else {
        engine.submit(ev, admitted, lone)
    }
}

/// Where an admitted EVENT went.
enum Queued {
    Writer,
    /// Published to live subscribers; nothing to wait for.
    Ephemeral,
}

impl Session {
    pub(super) async fn on_event(
        &mut self,
        out: &mut Out,
        ev: Box<Event>,
        received: Instant,
    ) -> Step {
        let class = KindClass::of(ev.kind).as_str();
        metrics::counter!(m::EVENTS_RECEIVED_TOTAL, "kind_class" => class).increment(1);
        match self.admit(&ev) {
            Err(refusal) if refusal.asks_auth() => {
                self.send_asking_auth(out, refusal.ok(&ev.id_hex())).await
            }
            Err(refusal) => out.send(refusal.ok(&ev.id_hex())).await,
            Ok(None) => self.verify_and_submit(out, ev, received).await,
            Ok(Some(delay)) => {
                let until = Box::pin(tokio::time::sleep(delay));
                self.held = Some(Held {
                    ev,
                    received,
                    until,
                });
                Ok(())
            }
        }
    }

    /// The held EVENT's delay is over: it goes on where it stopped.
    pub(super) async fn resume_held(&mut self, out: &mut Out) -> Step {
        match self.held.take() {
            Some(h) => self.verify_and_submit(out, h.ev, h.received).await,
            None => Ok(()),
        }
    }

    /// The checks before the signature. `Ok(Some(d))`: wait `d`, then go on.
    fn admit(&mut self, ev: &Event) -> Result<Option<Duration>, Refusal> {
        ev.check_limits(&self.front.event_limits, unix_now())
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        self.st
            .engine
            .policy()
            .rules()
            .check_event(ev, self.ip, self.auth.pubkeys())
            .map_err(Refusal::Policy)?;
        // The web of trust and proof of work on the claimed author: a
        // lookup and a count of zero bits (the signature comes later).
        let standing = self.st.engine.trust().standing(&ev.pubkey, ev.kind);
        let difficulty = sluice_proto::pow::difficulty(ev);
        sluice_throttle::trust::before_signature(&standing, difficulty)?;
        self.st
            .engine
            .throttle()
            .admit_outsider(&standing, difficulty)?;
        let max = self.st.server.max_pending_writes;
        if self.writes.len() >= max {
            return Err(Refusal::InFlight { max });
        }
        match self
            .st
            .engine
            .throttle()
            .admit(Op::Event, &self.principal, &mut self.write_adm)
        {
            Verdict::Allow => Ok(None),
            Verdict::Delay(d) => Ok(Some(d)),
            Verdict::Refuse(r) => Err(r.into()),
        }
    }

    async fn verify_and_submit(
        &mut self,
        out: &mut Out,
        ev: Box<Event>,
        received: Instant,
    ) -> Step {
        let id = ev.id;
        match self.verify_and_queue(ev, received) {
            Ok(Queued::Writer) => Ok(()),
            Ok(Queued::Ephemeral) => {
                metrics::counter!(m::EVENTS_ACCEPTED_TOTAL, "outcome" => "ephemeral").increment(1);
                out.send(RelayMessage::ok(&id_hex(&id), true, "")).await
            }
            Err(refusal) if refusal.asks_auth() => {
                self.send_asking_auth(out, refusal.ok(&id_hex(&id))).await
            }
            Err(refusal) => out.send(refusal.ok(&id_hex(&id))).await,
        }
    }

    /// The checks after any delay: the signature, the author's bucket, then
    /// the writer's queue (or the live fan-out for an ephemeral event).
    fn verify_and_queue(&mut self, ev: Box<Event>, received: Instant) -> Result<Queued, Refusal> {
        // The writer wait the monitor sees starts here: after the throttle's
        // own delay (counting it would feed the controller its own output),
        // before the signature check (CPU saturation is load).
        let admitted = Instant::now();
        ev.verify_cached(&mut self.keys)
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        self.check_protected(&ev)?;
        self.check_vanish(&ev)?;
        let throttle = self.st.engine.throttle();
        let standing = self.st.engine.trust().standing(&ev.pubkey, ev.kind);
        throttle.admit_author(&ev.pubkey, ev.kind, &standing)?;
        // With a web of trust, a stranger's event waits to ride on the
        // writer's next commit (strangers wait, the web does not).
        let outsider = matches!(standing, WriteStanding::Outsider(_))
            && self.st.engine.trust().settings().trust.enabled();
        let id = ev.id;
        let ev = Arc::new(*ev);
        if let Some(plugin) = self.st.engine.plugin() {
            // The write policy answers first; the writer (or the live
            // fan-out) only after it accepted. The OK comes with the others.
            let engine = self.st.engine.clone();
            let lone = self.writes.is_empty();
            let source = (self.ip, self.auth.pubkeys().first().copied());
            self.writes.push(Box::pin(async move {
                let verdict = plugin
                    .check(
                        &ev,
                        Source {
                            ip: source.0,
                            authed: source.1.as_ref(),
                        },
                    )
                    .await;
                let answer = match verdict {
                    PluginVerdict::Reject(msg) => Answer::Refused(Refusal::Plugin(msg)),
                    PluginVerdict::ShadowReject => Answer::Taken("shadow_rejected"),
                    PluginVerdict::Accept if KindClass::of(ev.kind) == KindClass::Ephemeral => {
                        engine.publish_ephemeral(ev);
                        Answer::Taken("ephemeral")
                    }
                    PluginVerdict::Accept => match submit(&engine, ev, admitted, lone, outsider) {
                        Ok(rx) => Answer::Written(rx.await.ok()),
                        Err(e) => Answer::Refused(e.into()),
                    },
                };
                WriteDone {
                    started: received,
                    id,
                    answer,
                }
            }));
            return Ok(Queued::Writer);
        }
        if KindClass::of(ev.kind) == KindClass::Ephemeral {
            self.st.engine.publish_ephemeral(ev);
            return Ok(Queued::Ephemeral);
        }
        let lone = self.writes.is_empty();
        let rx = submit(&self.st.engine, ev, admitted, lone, outsider)?;
        self.writes.push(Box::pin(async move {
            WriteDone {
                started: received,
                id,
                answer: Answer::Written(rx.await.ok()),
            }
        }));
        Ok(Queued::Writer)
    }

    /// The writer answered an EVENT (or stopped): its OK.
    pub(super) async fn on_write_done(&mut self, out: &mut Out, done: WriteDone) -> Step {
        metrics::histogram!(m::OK_LATENCY_SECONDS).record(done.started.elapsed().as_secs_f64());
        let id = id_hex(&done.id);
        let result = match done.answer {
            Answer::Written(result) => Refusal::of_write(result.as_ref()),
            Answer::Refused(refusal) => Err(refusal),
            Answer::Taken(label) => Ok((label, String::new())),
        };
        match result {
            Ok((label, message)) => {
                metrics::counter!(m::EVENTS_ACCEPTED_TOTAL, "outcome" => label).increment(1);
                out.send(RelayMessage::ok(&id, true, &message)).await
            }
            Err(refusal) => out.send(refusal.ok(&id)).await,
        }
    }
}
