//! The one sender of EVENTs to another relay: `sluice sync --direction up`
//! and `[[mirror]]` up (catch-up and live) use an [`Uploader`]
//! (docs/design.md#aimd-leaky-bucket-and-retry-budgets).
//!
//! - Paced: a send goes only when the leaky bucket of
//!   [`sluice_throttle::aimd::SendPace`] allows, at a rate its AIMD loop
//!   sets from the peer's answers (`rate-limited` OKs and rate NOTICEs cut
//!   it; intervals without one raise it, up to the configured maximum).
//! - A `rate-limited` event goes again later; any other refusal is final,
//!   counted by its prefix (`answer.rs`); `duplicate` counts as already
//!   there. Re-sends (after `rate-limited`, or of events unanswered when a
//!   connection was lost) spend the [`RetryBudget`]: while it is spent
//!   they wait, and so do first sends once [`RETRY_CAP`] events wait to go
//!   again or await their OK.
//! - Bounded: at most [`UP_WINDOW`] EVENTs await their OK, [`FRESH_CAP`]
//!   first sends are queued, and retries and those awaiting stay within
//!   [`RETRY_CAP`].
//! - Every event awaiting its OK holds one unit of the `in flight` gauge
//!   (a guard), so the gauge is 0 once nothing is in flight, however the
//!   transfer ended.
//!
//! [`send_stored`] drives one connection through a list of stored ids
//! (sync, a mirror's catch-up); [`send_stored_reconnecting`] adds the
//! sync's reconnections, with a jittered exponential backoff and a bound
//! on failures in a row. A mirror's live loop calls the [`Uploader`]'s
//! parts itself, and reconnects on its own schedule.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use negentropy::Id;
use serde_json::Value;
use sluice_throttle::aimd::{PaceConfig, RetryBudget, SendPace, Window};
use tokio_tungstenite::tungstenite::Message;

use super::answer::{self, Answer};
use super::{ANSWER_TIMEOUT, FETCH_BATCH, Tls, Ws};

/// EVENTs sent up and awaiting their OK, at most.
pub const UP_WINDOW: usize = 64;
/// First sends queued in the uploader, at most.
pub const FRESH_CAP: usize = FETCH_BATCH;
/// Events waiting to be sent again plus those awaiting their OK, at most:
/// first sends wait while it is reached.
pub const RETRY_CAP: usize = 1024;
/// A transfer whose peer answers only `rate-limited` for this long ends.
pub const STALL: Duration = Duration::from_secs(120);
/// How often `sync` prints its progress line.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// The accepted rate is reported over this window.
const ACCEPTED_WINDOW_SLOTS: usize = 10;
/// Failed connections in a row (lost before any answer) after which a
/// sync's upload ends.
pub const RECONNECTS_IN_A_ROW: u32 = 6;
/// A sync's first wait before connecting again; doubles per failure.
const RECONNECT_MIN_MS: u64 = 250;
/// A sync's longest wait before connecting again.
const RECONNECT_MAX_MS: u64 = 8_000;

/// An event to send: its id (hex) and its JSON.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub id: String,
    pub raw: String,
}

/// What an upload counted (since its [`Uploader`] was made).
#[derive(Debug, Clone, Default)]
pub struct UpCounts {
    /// EVENTs sent for the first time.
    pub first_sends: u64,
    /// OK true.
    pub accepted: u64,
    /// Answered `duplicate`: the peer has them.
    pub already_there: u64,
    /// `rate-limited` answers (each event sent again later).
    pub rate_limited: u64,
    /// Re-sends: after `rate-limited`, or unanswered when a connection was
    /// lost.
    pub retried: u64,
    /// Final refusals by prefix.
    pub refused: BTreeMap<&'static str, u64>,
    /// The highest difficulty a `pow` refusal asked for.
    pub pow_difficulty: Option<u64>,
}

impl UpCounts {
    /// Final refusals, all prefixes.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    /// The final refusals by prefix, `blocked 3, pow 2 (difficulty 28
    /// required)`, or `none`.
    pub fn refusals(&self) -> String {
        if self.refused.is_empty() {
            return "none".into();
        }
        let parts: Vec<String> = self
            .refused
            .iter()
            .map(|(reason, n)| match (*reason, self.pow_difficulty) {
                ("pow", Some(d)) => format!("{reason} {n} (difficulty {d} required)"),
                _ => format!("{reason} {n}"),
            })
            .collect();
        parts.join(", ")
    }
}

/// A mirror's per-peer series (docs/metrics.md#mirrors).
pub struct UpMetrics {
    pub peer: String,
    pub rate: metrics::Gauge,
    pub in_flight: metrics::Gauge,
    pub retried_rate_limited: metrics::Counter,
    pub retried_reconnect: metrics::Counter,
    pub accepted: metrics::Counter,
    pub duplicate: metrics::Counter,
    pub refused: metrics::Counter,
}

/// One unit of the in-flight gauge while held.
struct Held(Option<metrics::Gauge>);

impl Held {
    fn hold(g: Option<&metrics::Gauge>) -> Held {
        if let Some(g) = g {
            g.increment(1.0);
        }
        Held(g.cloned())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(g) = &self.0 {
            g.decrement(1.0);
        }
    }
}

struct InFlight {
    raw: String,
    sent_ns: u64,
    _held: Held,
}

/// Which queue the next send comes from.
enum Next {
    Retry,
    Fresh,
}

/// The sender's state across connections (see the module's doc).
pub struct Uploader {
    pace: SendPace,
    budget: RetryBudget,
    origin: Instant,
    fresh: VecDeque<Outgoing>,
    retry: VecDeque<Outgoing>,
    in_flight: HashMap<String, InFlight>,
    counts: UpCounts,
    accepted: Window,
    metrics: Option<UpMetrics>,
    /// Answers (of any kind) since the connection began.
    answered_here: bool,
    /// The last answer other than `rate-limited`, or the connection.
    last_admitted: Instant,
    /// The last answer of any kind, or the last send into an empty window.
    last_heard: Instant,
    /// The accepted rate when the last first send was queued (the backlog
    /// ran out): the rate the transfer converged to.
    converged: Option<f64>,
}

impl Uploader {
    /// An uploader pacing by `cfg` (validated by the caller), counting into
    /// `metrics` if given.
    pub fn new(cfg: PaceConfig, metrics: Option<UpMetrics>) -> Uploader {
        let origin = Instant::now();
        let up = Uploader {
            pace: SendPace::new(cfg, 0),
            budget: RetryBudget::default(),
            origin,
            fresh: VecDeque::with_capacity(FRESH_CAP),
            retry: VecDeque::new(),
            in_flight: HashMap::with_capacity(UP_WINDOW),
            counts: UpCounts::default(),
            accepted: Window::new(1_000_000_000, ACCEPTED_WINDOW_SLOTS),
            metrics,
            answered_here: false,
            last_admitted: origin,
            last_heard: origin,
            converged: None,
        };
        if let Some(m) = &up.metrics {
            m.rate.set(cfg.start_rate_per_s);
        }
        up
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// What it counted.
    pub fn counts(&self) -> &UpCounts {
        &self.counts
    }

    /// The pace now, EVENTs per second.
    pub fn rate_per_s(&mut self) -> f64 {
        let now = self.now_ns();
        self.pace.rate_per_s(now)
    }

    /// Accepted (OK true) per second over the last 10 s.
    pub fn accepted_per_s(&mut self) -> f64 {
        let now = self.now_ns();
        self.accepted.rate_per_s(now, 0)
    }

    /// The accepted rate over the last 10 s of a full backlog: taken when
    /// the caller says the backlog ran out ([`Uploader::backlog_ended`]),
    /// else now.
    pub fn converged_per_s(&mut self) -> f64 {
        match self.converged {
            Some(r) => r,
            None => self.accepted_per_s(),
        }
    }

    /// The backlog ran out (no first send left to queue): the accepted
    /// rate now is the one the transfer converged to.
    pub fn backlog_ended(&mut self) {
        if self.converged.is_none() {
            self.converged = Some(self.accepted_per_s());
        }
    }

    /// EVENTs awaiting their OK.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Events waiting to be sent again.
    pub fn retrying(&self) -> usize {
        self.retry.len()
    }

    /// First sends the queue has room for.
    pub fn room(&self) -> usize {
        FRESH_CAP - self.fresh.len()
    }

    /// Queues a first send (the caller checked [`Uploader::room`]; past it
    /// the event is not queued: false).
    pub fn push(&mut self, out: Outgoing) -> bool {
        if self.fresh.len() >= FRESH_CAP {
            return false;
        }
        self.fresh.push_back(out);
        true
    }

    /// Nothing queued, nothing to send again, nothing awaiting its OK.
    pub fn is_idle(&self) -> bool {
        self.fresh.is_empty() && self.retry.is_empty() && self.in_flight.is_empty()
    }

    /// No first send queued.
    pub fn fresh_is_empty(&self) -> bool {
        self.fresh.is_empty()
    }

    /// What may go next at `now`, and how long until it may: `None` when
    /// nothing may go until an answer comes (or nothing is queued).
    fn next(&mut self, now: u64) -> Option<(Next, u64)> {
        if self.in_flight.len() >= UP_WINDOW {
            return None;
        }
        let pace = self.pace.wait_ns(now);
        if !self.retry.is_empty() && self.budget.left(now) > 0 {
            return Some((Next::Retry, pace));
        }
        let held = self.retry.len() + self.in_flight.len();
        if !self.fresh.is_empty() && held < RETRY_CAP {
            return Some((Next::Fresh, pace));
        }
        if !self.retry.is_empty() {
            // The budget is spent: the transfer pauses until it slides.
            return Some((Next::Retry, pace.max(self.budget.wait_ns(now))));
        }
        None
    }

    /// How long until the next send may go; `None` while nothing may go
    /// before an answer comes.
    pub fn next_send_in(&mut self) -> Option<Duration> {
        let now = self.now_ns();
        self.next(now).map(|(_, ns)| Duration::from_nanos(ns))
    }

    /// Sends the next event if one may go now (else does nothing).
    pub async fn send_next(&mut self, ws: &mut Ws) -> anyhow::Result<()> {
        let now = self.now_ns();
        let out = match self.next(now) {
            Some((Next::Retry, 0)) if self.budget.try_retry(now) => {
                self.counts.retried += 1;
                self.retry.pop_front()
            }
            Some((Next::Fresh, 0)) => {
                self.budget.first_sent(now);
                self.counts.first_sends += 1;
                self.fresh.pop_front()
            }
            _ => None,
        };
        let Some(out) = out else { return Ok(()) };
        self.pace.sent(now);
        if self.in_flight.is_empty() {
            self.last_heard = Instant::now();
        }
        let frame = format!("[\"EVENT\",{}]", out.raw);
        // In flight before the send: if the connection fails meanwhile, it
        // goes again on the next one (`connection_lost`).
        let held = Held::hold(self.metrics.as_ref().map(|m| &m.in_flight));
        self.in_flight.insert(
            out.id,
            InFlight {
                raw: out.raw,
                sent_ns: now,
                _held: held,
            },
        );
        ws.send(Message::Text(frame.into())).await?;
        Ok(())
    }

    /// Takes a message from the peer: an OK for one of ours, or a NOTICE.
    /// Whether it was one.
    pub fn on_message(&mut self, v: &Value) -> bool {
        match v[0].as_str() {
            Some("OK") => {
                let Some(id) = v[1].as_str() else {
                    return false;
                };
                let Some(f) = self.in_flight.remove(id) else {
                    return false;
                };
                let message = v[3].as_str().unwrap_or_default();
                self.answered(id, f, answer::classify(v[2] == true, message));
                true
            }
            Some("NOTICE") => {
                let text = v[1].as_str().unwrap_or_default();
                if answer::is_rate_notice(text) {
                    let now = self.now_ns();
                    self.pace.rate_notice(now);
                    self.show_rate(now);
                }
                true
            }
            _ => false,
        }
    }

    fn answered(&mut self, id: &str, f: InFlight, a: Answer) {
        let now = self.now_ns();
        self.answered_here = true;
        self.last_heard = Instant::now();
        if a != Answer::RateLimited {
            self.pace.admitted(now);
            self.last_admitted = Instant::now();
        }
        let m = self.metrics.as_ref();
        match a {
            Answer::Accepted => {
                self.counts.accepted += 1;
                self.accepted.add(now, 1);
                m.inspect(|m| m.accepted.increment(1));
            }
            Answer::AlreadyThere => {
                self.counts.already_there += 1;
                m.inspect(|m| m.duplicate.increment(1));
            }
            Answer::RateLimited => {
                self.counts.rate_limited += 1;
                self.pace.rate_limited(now, f.sent_ns);
                // Bounded: it was in flight, and in flight plus retries stay
                // within RETRY_CAP.
                self.retry.push_back(Outgoing {
                    id: id.to_string(),
                    raw: f.raw,
                });
                m.inspect(|m| m.retried_rate_limited.increment(1));
            }
            Answer::Refused { reason, pow } => {
                *self.counts.refused.entry(reason).or_insert(0) += 1;
                if pow.is_some() {
                    self.counts.pow_difficulty = self.counts.pow_difficulty.max(pow);
                }
                if let Some(m) = m {
                    m.refused.increment(1);
                    metrics::counter!(
                        crate::metrics_names::MIRROR_UP_REFUSED_TOTAL,
                        "peer" => m.peer.clone(),
                        "reason" => reason
                    )
                    .increment(1);
                }
            }
        }
        self.show_rate(now);
    }

    fn show_rate(&mut self, now: u64) {
        if let Some(m) = &self.metrics {
            m.rate.set(self.pace.rate_per_s(now));
        }
    }

    /// The connection is new: nothing heard on it yet.
    pub fn connected(&mut self) {
        self.answered_here = false;
        self.last_admitted = Instant::now();
        self.last_heard = Instant::now();
    }

    /// Whether the peer answered anything on this connection.
    pub fn answered_here(&self) -> bool {
        self.answered_here
    }

    /// The connection was lost: what awaited its OK goes again first on
    /// the next one (spending the retry budget), in the order sent.
    pub fn connection_lost(&mut self) {
        let mut lost: Vec<(String, InFlight)> = self.in_flight.drain().collect();
        lost.sort_by_key(|(_, f)| std::cmp::Reverse(f.sent_ns));
        for (id, f) in lost {
            if let Some(m) = &self.metrics {
                m.retried_reconnect.increment(1);
            }
            self.retry.push_front(Outgoing { id, raw: f.raw });
        }
    }

    /// Forgets what waits to be sent again and every first send queued: a
    /// reconciliation with the peer has just found what it lacks.
    pub fn forget_queued(&mut self) {
        self.retry.clear();
        self.fresh.clear();
    }

    /// An error when the peer went silent with EVENTs awaiting their OK, or
    /// answered only `rate-limited` for [`STALL`].
    pub fn check_stalled(&self) -> anyhow::Result<()> {
        if !self.in_flight.is_empty() && self.last_heard.elapsed() > ANSWER_TIMEOUT {
            anyhow::bail!("the remote did not answer in time");
        }
        if self.counts.rate_limited > 0 && !self.is_idle() && self.last_admitted.elapsed() > STALL {
            anyhow::bail!(
                "the peer answered only rate-limited for {} s",
                STALL.as_secs()
            );
        }
        Ok(())
    }
}

/// How a transfer on one connection ended early.
pub enum Ended {
    /// The connection was lost: connecting again may go on.
    Lost(anyhow::Error),
    /// Anything else (the store, a stalled peer): the transfer ends.
    Failed(anyhow::Error),
}

/// The ids of stored events still to send, read [`FETCH_BATCH`] at a time.
pub struct IdFeed<'a> {
    ids: &'a [Id],
    at: usize,
}

impl<'a> IdFeed<'a> {
    pub fn new(ids: &'a [Id]) -> IdFeed<'a> {
        IdFeed { ids, at: 0 }
    }

    pub fn is_done(&self) -> bool {
        self.at >= self.ids.len()
    }

    /// Ids handed to the uploader so far.
    pub fn taken(&self) -> usize {
        self.at
    }

    /// Moves up to the uploader's room of the next ids' events into it
    /// (read off the runtime; gone events skipped).
    async fn refill(
        &mut self,
        up: &mut Uploader,
        store: &sluice_store::Store,
    ) -> anyhow::Result<()> {
        let n = up.room().min(self.ids.len() - self.at);
        let ids: Vec<[u8; 32]> = self.ids[self.at..self.at + n]
            .iter()
            .map(|id| *id.as_bytes())
            .collect();
        self.at += n;
        let store = store.clone();
        let raws =
            super::off_runtime("sluice-peer-read", move || super::read_raws(&store, &ids)).await?;
        for (id, raw) in raws {
            up.push(Outgoing { id, raw });
        }
        Ok(())
    }
}

/// Sends the stored events `feed` names through `up` on `ws` until every
/// one is answered (or final); `progress` is called every
/// [`PROGRESS_EVERY`].
pub async fn send_stored(
    ws: &mut Ws,
    up: &mut Uploader,
    feed: &mut IdFeed<'_>,
    store: &sluice_store::Store,
    progress: &mut (dyn FnMut(&mut Uploader, &IdFeed<'_>) + Send),
) -> Result<(), Ended> {
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    loop {
        if up.fresh_is_empty() && !feed.is_done() {
            feed.refill(up, store).await.map_err(Ended::Failed)?;
            continue;
        }
        if feed.is_done() && up.fresh_is_empty() {
            up.backlog_ended();
            if up.is_idle() {
                return Ok(());
            }
        }
        up.check_stalled().map_err(Ended::Failed)?;
        let wait = up.next_send_in();
        if wait == Some(Duration::ZERO) {
            up.send_next(ws).await.map_err(Ended::Lost)?;
            continue;
        }
        // Woken at least every second to check for silence.
        let nap = wait
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        tokio::select! {
            biased;
            frame = ws.next() => {
                let text = match frame {
                    None | Some(Ok(Message::Close(_))) => {
                        return Err(Ended::Lost(anyhow::anyhow!("the peer closed the connection")));
                    }
                    Some(Err(e)) => return Err(Ended::Lost(e.into())),
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(_)) => continue,
                };
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    up.on_message(&v);
                }
            }
            _ = tick.tick() => progress(up, feed),
            () = tokio::time::sleep(nap) => {
                if wait.is_some_and(|w| w <= nap) {
                    up.send_next(ws).await.map_err(Ended::Lost)?;
                }
            }
        }
    }
}

/// [`send_stored`] for a sync: a lost connection is opened again to `url`
/// after a jittered exponential backoff (from 250 ms, doubling to 8 s), and
/// what awaited its OK goes again; after [`RECONNECTS_IN_A_ROW`] failures
/// with no answer between them the upload ends with an error saying so.
pub async fn send_stored_reconnecting(
    ws: &mut Ws,
    (url, tls): (&str, &Tls),
    up: &mut Uploader,
    ids: &[Id],
    store: &sluice_store::Store,
    progress: &mut (dyn FnMut(&mut Uploader, &IdFeed<'_>) + Send),
) -> anyhow::Result<()> {
    let mut feed = IdFeed::new(ids);
    let mut failures: u32 = 0;
    up.connected();
    loop {
        let why = match send_stored(ws, up, &mut feed, store, progress).await {
            Ok(()) => return Ok(()),
            Err(Ended::Failed(e)) => return Err(e),
            Err(Ended::Lost(e)) => e,
        };
        if up.answered_here() {
            failures = 0;
        }
        up.connection_lost();
        loop {
            failures += 1;
            if failures > RECONNECTS_IN_A_ROW {
                return Err(why).with_context(|| {
                    format!(
                        "gave up after {RECONNECTS_IN_A_ROW} reconnections in a row without an \
                         answer; {} events wait to be sent again",
                        up.retrying()
                    )
                });
            }
            let wait = super::backoff(RECONNECT_MIN_MS, RECONNECT_MAX_MS, failures - 1);
            eprintln!(
                "sync: connection lost ({why:#}); connecting again in {} ms",
                wait.as_millis()
            );
            tokio::time::sleep(wait).await;
            match super::connect(url, tls).await {
                Ok(again) => {
                    *ws = again;
                    up.connected();
                    break;
                }
                Err(e) => tracing::debug!(error = %format!("{e:#}"), "sync: reconnecting failed"),
            }
        }
    }
}
