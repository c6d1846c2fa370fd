//! The publishing driver: one WebSocket connection sending EVENTs from a
//! shared `Source` on a `Schedule`, matching OK replies by id, and reporting
//! every outcome to a `Recorder`.
//!
//! Each connection is one task that sends plus one task that receives, so a
//! relay that stops reading cannot stop us from reading its replies. The map
//! of events in flight is bounded (`max_inflight`): when it is full an
//! open-loop client skips the due event and counts it, instead of queueing
//! without limit. An event without a reply after `timeout` counts as a
//! timeout. A dropped connection is counted and reopened until the run ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::sync::{Notify, Semaphore};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

use crate::source::{Schedule, Source};
use crate::stats::{Examples, Histogram, LatencySummary, PrefixCounts, per_sec};
use crate::wire::{self, Incoming, RelayUrl, Ws};

/// How often replies are checked for timeouts.
const REAP_EVERY: Duration = Duration::from_millis(100);
/// Wait before reopening a dropped connection.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);

/// What became of one event.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    Accepted {
        latency: Duration,
        message: &'a str,
    },
    Refused {
        latency: Duration,
        message: &'a str,
    },
    Timeout,
    /// The connection dropped before a reply came.
    Lost,
}

/// Receives every event's fate; `due` is when the schedule wanted it sent.
pub trait Recorder: Send + Sync {
    fn sent(&self, due: Instant);
    /// Due but not sent because `max_inflight` replies were outstanding.
    fn skipped(&self, due: Instant);
    fn outcome(&self, due: Instant, outcome: Outcome<'_>);
    /// The same, naming the event: a recorder that follows events one by one
    /// (`soak`) overrides it; the others keep this default.
    fn outcome_of(&self, _id: &[u8; 32], due: Instant, outcome: Outcome<'_>) {
        self.outcome(due, outcome);
    }
    /// A connection failed to open or dropped, and why.
    fn connection_error(&self, reason: &str);
}

/// Counts and latencies for a set of events.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub sent: u64,
    pub skipped: u64,
    pub accepted: u64,
    /// Accepted with a `duplicate:` message: the relay already had them, so
    /// they add nothing to goodput.
    pub duplicates: u64,
    pub refused: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub connection_errors: u64,
    /// Why connections failed or dropped, by reason text.
    pub connection_error_reasons: PrefixCounts,
    pub accepted_latency: Histogram,
    pub refused_latency: Histogram,
    /// Prefixes of OK messages with `true` (for example `duplicate`).
    pub accepted_prefixes: PrefixCounts,
    /// Prefixes of OK messages with `false`.
    pub refused_prefixes: PrefixCounts,
    pub examples: Examples,
}

impl Tally {
    pub fn outcome(&mut self, outcome: Outcome<'_>) {
        match outcome {
            Outcome::Accepted { latency, message } => {
                self.accepted += 1;
                self.accepted_latency.record(latency.as_micros() as u64);
                if !message.is_empty() {
                    self.accepted_prefixes.add(message);
                    if message.starts_with("duplicate:") {
                        self.duplicates += 1;
                    }
                }
            }
            Outcome::Refused { latency, message } => {
                self.refused += 1;
                self.refused_latency.record(latency.as_micros() as u64);
                self.refused_prefixes.add(message);
                self.examples.add(message);
            }
            Outcome::Timeout => self.timeouts += 1,
            Outcome::Lost => self.lost += 1,
        }
    }

    pub fn merge(&mut self, o: &Tally) {
        self.sent += o.sent;
        self.skipped += o.skipped;
        self.accepted += o.accepted;
        self.duplicates += o.duplicates;
        self.refused += o.refused;
        self.timeouts += o.timeouts;
        self.lost += o.lost;
        self.connection_errors += o.connection_errors;
        self.connection_error_reasons
            .merge(&o.connection_error_reasons);
        self.accepted_latency.merge(&o.accepted_latency);
        self.refused_latency.merge(&o.refused_latency);
        self.accepted_prefixes.merge(&o.accepted_prefixes);
        self.refused_prefixes.merge(&o.refused_prefixes);
        self.examples.merge(&o.examples);
    }

    /// A JSON-ready view over `secs` seconds of offered load.
    pub fn report(&self, secs: f64) -> TallyReport {
        let offered = self.sent + self.skipped;
        TallyReport {
            offered,
            sent: self.sent,
            skipped: self.skipped,
            accepted: self.accepted,
            duplicates: self.duplicates,
            refused: self.refused,
            timeouts: self.timeouts,
            lost: self.lost,
            connection_errors: self.connection_errors,
            connection_error_reasons: self.connection_error_reasons.clone(),
            offered_per_sec: per_sec(offered, secs),
            accepted_per_sec: per_sec(self.accepted, secs),
            stored_per_sec: per_sec(self.accepted - self.duplicates, secs),
            success_ratio: if offered == 0 {
                0.0
            } else {
                self.accepted as f64 / offered as f64
            },
            accepted_latency: self.accepted_latency.summary(),
            refused_latency: self.refused_latency.summary(),
            accepted_prefixes: self.accepted_prefixes.clone(),
            refused_prefixes: self.refused_prefixes.clone(),
            refusal_examples: self.examples.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TallyReport {
    pub offered: u64,
    pub sent: u64,
    pub skipped: u64,
    pub accepted: u64,
    /// Accepted with a `duplicate:` message (already stored).
    #[serde(default)]
    pub duplicates: u64,
    pub refused: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub connection_errors: u64,
    pub connection_error_reasons: PrefixCounts,
    pub offered_per_sec: f64,
    pub accepted_per_sec: f64,
    /// Accepted and new: (accepted − duplicates) per second.
    #[serde(default)]
    pub stored_per_sec: f64,
    /// accepted / offered.
    pub success_ratio: f64,
    pub accepted_latency: LatencySummary,
    pub refused_latency: LatencySummary,
    pub accepted_prefixes: PrefixCounts,
    pub refused_prefixes: PrefixCounts,
    /// The first message seen for each refusal prefix.
    pub refusal_examples: Examples,
}

impl TallyReport {
    pub fn print(&self, indent: &str) {
        println!(
            "{indent}offered {} ({:.0}/s), sent {}, accepted {} ({:.0}/s, {:.1}%), refused {}, timeouts {}, lost {}, skipped {}, connection errors {}",
            self.offered,
            self.offered_per_sec,
            self.sent,
            self.accepted,
            self.accepted_per_sec,
            self.success_ratio * 100.0,
            self.refused,
            self.timeouts,
            self.lost,
            self.skipped,
            self.connection_errors
        );
        println!("{indent}OK latency (accepted): {}", self.accepted_latency);
        if self.refused > 0 {
            println!("{indent}OK latency (refused):  {}", self.refused_latency);
            println!("{indent}refused by prefix: {}", self.refused_prefixes);
            for m in self.refusal_examples.0.values() {
                println!("{indent}  e.g. {m:?}");
            }
        }
        if self.connection_errors > 0 {
            println!(
                "{indent}connection errors: {}",
                self.connection_error_reasons
            );
        }
        if self.accepted_prefixes.total() > 0 {
            println!("{indent}accepted with message: {}", self.accepted_prefixes);
        }
    }
}

/// A recorder that keeps one `Tally` and the first and last activity times.
#[derive(Default)]
pub struct Totals {
    inner: Mutex<(Tally, Option<Instant>, Option<Instant>)>,
}

impl Totals {
    pub fn snapshot(&self) -> (Tally, Option<Instant>, Option<Instant>) {
        self.inner.lock().expect("totals lock").clone()
    }
}

impl Recorder for Totals {
    fn sent(&self, _due: Instant) {
        let mut g = self.inner.lock().expect("totals lock");
        g.0.sent += 1;
        g.1.get_or_insert_with(Instant::now);
    }
    fn skipped(&self, _due: Instant) {
        self.inner.lock().expect("totals lock").0.skipped += 1;
    }
    fn outcome(&self, _due: Instant, outcome: Outcome<'_>) {
        let mut g = self.inner.lock().expect("totals lock");
        g.0.outcome(outcome);
        g.2 = Some(Instant::now());
    }
    fn connection_error(&self, reason: &str) {
        let mut g = self.inner.lock().expect("totals lock");
        g.0.connection_errors += 1;
        g.0.connection_error_reasons.add_key(reason);
    }
}

/// How one publishing connection behaves.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub relay: RelayUrl,
    pub bind: Option<IpAddr>,
    /// Closed loop: events in flight per connection.
    pub window: usize,
    /// Open loop: most events in flight per connection before skipping.
    pub max_inflight: usize,
    pub timeout: Duration,
    /// No event is sent after this instant.
    pub stop_at: Instant,
}

/// Everything a connection shares with its siblings.
#[derive(Clone)]
pub struct Shared {
    pub source: Arc<Source>,
    pub schedule: Arc<Schedule>,
    pub recorder: Arc<dyn Recorder>,
    /// The run's time zero: due times are offsets from it.
    pub t0: Instant,
}

type Inflight = Arc<Mutex<HashMap<[u8; 32], Instant>>>;

/// Runs one connection until the source, schedule or time runs out,
/// reconnecting after drops.
pub async fn run_publisher(cfg: PublisherConfig, shared: Shared) {
    while Instant::now() < cfg.stop_at {
        let ws = match wire::connect(&cfg.relay, cfg.bind).await {
            Ok(ws) => ws,
            Err(e) => {
                shared
                    .recorder
                    .connection_error(&format!("connect: {}", e.root_cause()));
                tokio::time::sleep(RECONNECT_BACKOFF).await;
                continue;
            }
        };
        match session(&cfg, &shared, ws).await {
            SessionEnd::Finished => return,
            SessionEnd::Dropped(reason) => shared.recorder.connection_error(&reason),
        }
        tokio::time::sleep(RECONNECT_BACKOFF).await;
    }
    if *shared.schedule != Schedule::ClosedLoop {
        skip_rest(&shared, cfg.stop_at).await;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum SessionEnd {
    Finished,
    Dropped(String),
}

async fn session(cfg: &PublisherConfig, shared: &Shared, ws: Ws) -> SessionEnd {
    let (mut sink, stream) = ws.split();
    let inflight: Inflight = Arc::default();
    let window = Arc::new(Semaphore::new(cfg.window.max(1)));
    let dropped = Arc::new(Notify::new());
    let done = Arc::new(AtomicBool::new(false));
    let receiver = tokio::spawn(receive(
        stream,
        Receiver {
            inflight: inflight.clone(),
            window: window.clone(),
            recorder: shared.recorder.clone(),
            timeout: cfg.timeout,
            dropped: dropped.clone(),
            done: done.clone(),
        },
    ));
    let end = tokio::select! {
        end = send_loop(cfg, shared, &mut sink, &inflight, &window) => end,
        _ = dropped.notified() => SessionEnd::Dropped(String::new()),
    };
    done.store(true, Ordering::Release);
    let why_dropped = receiver.await.ok().flatten();
    let _ = sink.close().await;
    match (end, why_dropped) {
        (SessionEnd::Dropped(r), Some(why)) if r.is_empty() => SessionEnd::Dropped(why),
        (SessionEnd::Finished, Some(why)) => {
            // Dropped while waiting for the last replies: nothing left to send.
            shared.recorder.connection_error(&why);
            SessionEnd::Finished
        }
        (end, _) => end,
    }
}

async fn send_loop(
    cfg: &PublisherConfig,
    shared: &Shared,
    sink: &mut SplitSink<Ws, Message>,
    inflight: &Inflight,
    window: &Semaphore,
) -> SessionEnd {
    let closed_loop = *shared.schedule == Schedule::ClosedLoop;
    loop {
        if closed_loop {
            window
                .acquire()
                .await
                .expect("window semaphore is never closed")
                .forget();
        }
        let Some((seq, ev)) = shared.source.next().await else {
            return SessionEnd::Finished;
        };
        let Some(offset) = shared.schedule.due(seq) else {
            return SessionEnd::Finished;
        };
        let due = if closed_loop {
            Instant::now()
        } else {
            shared.t0 + offset
        };
        tokio::time::sleep_until(due.into()).await;
        if Instant::now() >= cfg.stop_at {
            if !closed_loop {
                shared.recorder.skipped(due);
                skip_rest(shared, cfg.stop_at).await;
            }
            return SessionEnd::Finished;
        }
        if !track(inflight, ev.id, due, cfg.max_inflight) {
            shared.recorder.skipped(due);
            continue;
        }
        shared.recorder.sent(due);
        if let Err(e) = sink.send(ev.to_message()).await {
            return SessionEnd::Dropped(format!("send: {e}"));
        }
    }
}

/// Counts as skipped every remaining event that was due before the run
/// ended, so a late client still reports the load it was asked to offer.
async fn skip_rest(shared: &Shared, stop_at: Instant) {
    while let Some((seq, _)) = shared.source.next().await {
        match shared.schedule.due(seq).map(|offset| shared.t0 + offset) {
            Some(due) if due < stop_at => shared.recorder.skipped(due),
            _ => return,
        }
    }
}

/// Records an event as in flight unless the bound is reached.
fn track(inflight: &Inflight, id: [u8; 32], due: Instant, max: usize) -> bool {
    let mut map = inflight.lock().expect("inflight lock");
    if map.len() >= max {
        return false;
    }
    map.insert(id, due);
    true
}

struct Receiver {
    inflight: Inflight,
    window: Arc<Semaphore>,
    recorder: Arc<dyn Recorder>,
    timeout: Duration,
    dropped: Arc<Notify>,
    done: Arc<AtomicBool>,
}

/// Reads replies until the sender is done and nothing is in flight; returns
/// why the connection dropped if it did.
async fn receive(mut stream: SplitStream<Ws>, r: Receiver) -> Option<String> {
    let mut tick = tokio::time::interval(REAP_EVERY);
    let why = loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(Message::Close(frame))) => break close_reason(frame.as_ref()),
                Some(Ok(m)) => r.on_message(&m),
                Some(Err(e)) => break format!("receive: {e}"),
                None => break "closed by relay".to_owned(),
            },
            _ = tick.tick() => r.reap(),
        }
        if r.done.load(Ordering::Acquire) && r.inflight.lock().expect("inflight lock").is_empty() {
            return None;
        }
    };
    r.lose_all();
    r.dropped.notify_one();
    Some(why)
}

/// Why the relay closed a connection, from its close frame.
pub(crate) fn close_reason(frame: Option<&CloseFrame>) -> String {
    match frame {
        Some(f) => format!("closed by relay: {} {}", u16::from(f.code), f.reason),
        None => "closed by relay".to_owned(),
    }
}

impl Receiver {
    fn on_message(&self, m: &Message) {
        let Some(Incoming::Ok {
            id,
            accepted,
            message,
        }) = Incoming::from_message(m)
        else {
            return;
        };
        let Some(due) = self.inflight.lock().expect("inflight lock").remove(&id) else {
            return; // a reply to an event we already gave up on
        };
        let latency = due.elapsed();
        let outcome = if accepted {
            Outcome::Accepted {
                latency,
                message: &message,
            }
        } else {
            Outcome::Refused {
                latency,
                message: &message,
            }
        };
        self.recorder.outcome_of(&id, due, outcome);
        self.window.add_permits(1);
    }

    fn reap(&self) {
        let now = Instant::now();
        let expired: Vec<([u8; 32], Instant)> = {
            let mut map = self.inflight.lock().expect("inflight lock");
            let mut out = Vec::new();
            map.retain(|id, due| {
                let keep = now.duration_since(*due) < self.timeout;
                if !keep {
                    out.push((*id, *due));
                }
                keep
            });
            out
        };
        for (id, due) in &expired {
            self.recorder.outcome_of(id, *due, Outcome::Timeout);
        }
        self.window.add_permits(expired.len());
    }

    fn lose_all(&self) {
        let lost: Vec<([u8; 32], Instant)> = self
            .inflight
            .lock()
            .expect("inflight lock")
            .drain()
            .collect();
        for (id, due) in lost {
            self.recorder.outcome_of(&id, due, Outcome::Lost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_accepted_but_not_stored() {
        let mut t = Tally::default();
        let latency = Duration::from_millis(1);
        t.outcome(Outcome::Accepted {
            latency,
            message: "",
        });
        t.outcome(Outcome::Accepted {
            latency,
            message: "duplicate: already have this event",
        });
        t.outcome(Outcome::Refused {
            latency,
            message: "rate-limited: slow down",
        });
        let r = t.report(1.0);
        assert_eq!((r.accepted, r.duplicates, r.refused), (2, 1, 1));
        assert_eq!(r.accepted_per_sec, 2.0);
        assert_eq!(r.stored_per_sec, 1.0);
    }
}
