//! The abusive readers of `readflood`: each connection keeps `subs` costly
//! REQs open at once, alternating by slot between `{"limit":L}` and
//! `{"kinds":[1],"#t":["<random hex>"]}` (or, with `--abusive-search`,
//! NIP-50 searches for the words given). When a REQ ends (EOSE, CLOSED, or
//! no answer within the timeout) its slot sends CLOSE (unless the relay
//! closed it) and at once a new REQ with a new subscription id.
//!
//! An abuser reads its socket as fast as it can, but does not parse the
//! events: a frame starting `["EVENT",` is only counted (frames and bytes),
//! so the client is not the bottleneck; the short control frames (EOSE,
//! CLOSED, NOTICE) are parsed. Counts are kept per connection and handed to
//! the shared recorder every `FLUSH_EVERY`, not per frame. A dropped
//! connection is counted and reopened until the flood ends. Everything runs
//! between `start` and `stop`; what is still open at `stop` is counted as
//! unanswered, and the connections are closed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::tally::{ReadOutcome, ReadRecorder, ReadReport, ReadSecond};
use crate::rng::Rng;
use crate::stats::PrefixCounts;
use crate::wire::{self, Incoming, RelayUrl, Ws};

/// How often local counts are handed over and timeouts checked.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Wait before reopening a dropped connection.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);
/// How long closing a connection at the end may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the abusive side of a run does.
#[derive(Debug, Clone)]
pub struct AbuseConfig {
    pub relay: RelayUrl,
    /// One entry per connection: the local address it connects from.
    pub binds: Vec<Option<IpAddr>>,
    pub subs: usize,
    pub limit: u64,
    /// Words to search for: when not empty, every REQ is a NIP-50 search
    /// for one of them.
    pub search: Vec<String>,
    pub timeout: Duration,
    /// The run's time zero (phases and seconds are counted from it).
    pub t0: Instant,
    pub phase_secs: Vec<f64>,
    pub start: Instant,
    pub stop: Instant,
    pub seed: u64,
}

/// The abusive class's figures, as the child process hands them back.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct AbuseReport {
    pub connections: usize,
    /// Per phase of the run (only the flood phase has traffic).
    pub phases: Vec<ReadReport>,
    pub seconds: Vec<ReadSecond>,
    /// Connections opened again after the relay dropped one.
    pub reconnects: u64,
    /// Connect failures and drops, by reason.
    pub connection_errors: PrefixCounts,
    pub notices: PrefixCounts,
    /// The process the abusers ran in.
    pub pid: u32,
    /// CPU time of that process (user + system), when it ran only abusers.
    pub cpu_secs: Option<f64>,
}

#[derive(Default)]
struct Counters {
    reconnects: AtomicU64,
    errors: Mutex<PrefixCounts>,
    notices: Mutex<PrefixCounts>,
}

pub async fn run(cfg: AbuseConfig) -> AbuseReport {
    let cfg = Arc::new(cfg);
    let rec = Arc::new(ReadRecorder::new(cfg.t0, &cfg.phase_secs));
    let counters = Arc::new(Counters::default());
    let mut seeds = Rng::new(cfg.seed);
    let tasks: Vec<_> = (0..cfg.binds.len())
        .map(|id| {
            let conn = Conn {
                id,
                cfg: cfg.clone(),
                rec: rec.clone(),
                counters: counters.clone(),
                rng: seeds.fork(id as u64),
                seq: 0,
                pending: HashMap::new(),
                events: 0,
                bytes: 0,
            };
            tokio::spawn(conn.run())
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    AbuseReport {
        connections: cfg.binds.len(),
        phases: rec.phase_reports(),
        seconds: rec.seconds(),
        reconnects: counters.reconnects.load(Ordering::Relaxed),
        connection_errors: counters.errors.lock().expect("errors lock").clone(),
        notices: counters.notices.lock().expect("notices lock").clone(),
        pid: std::process::id(),
        cpu_secs: None,
    }
}

/// One abusive connection, reopened after drops.
struct Conn {
    id: usize,
    cfg: Arc<AbuseConfig>,
    rec: Arc<ReadRecorder>,
    counters: Arc<Counters>,
    rng: Rng,
    seq: u64,
    /// Open REQs: subscription id to (slot, sent at). At most `subs` entries.
    pending: HashMap<String, (usize, Instant)>,
    /// Received since the last flush.
    events: u64,
    bytes: u64,
}

impl Conn {
    async fn run(mut self) {
        tokio::time::sleep_until(self.cfg.start.into()).await;
        let mut opened = 0u64;
        while Instant::now() < self.cfg.stop {
            let bind = self.cfg.binds[self.id];
            let connect = wire::connect(&self.cfg.relay, bind);
            let ws = match tokio::time::timeout_at(self.cfg.stop.into(), connect).await {
                Err(_) => break,
                Ok(Ok(ws)) => ws,
                Ok(Err(e)) => {
                    self.error(&format!("connect: {}", e.root_cause()));
                    self.backoff().await;
                    continue;
                }
            };
            if opened > 0 {
                self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            opened += 1;
            let end = self.session(ws).await;
            self.flush();
            match end {
                Ok(()) => break,
                Err(reason) => {
                    self.settle_pending(ReadOutcome::Lost);
                    self.error(&reason);
                    self.backoff().await;
                }
            }
        }
        self.settle_pending(ReadOutcome::Unanswered);
    }

    /// Runs until `stop` (Ok) or until the connection drops (Err with why).
    async fn session(&mut self, mut ws: Ws) -> Result<(), String> {
        for slot in 0..self.cfg.subs.max(1) {
            self.send_req(&mut ws, slot).await?;
        }
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        let stop = tokio::time::sleep_until(self.cfg.stop.into());
        tokio::pin!(stop);
        loop {
            tokio::select! {
                m = ws.next() => match m {
                    Some(Ok(Message::Text(t))) => self.on_text(&mut ws, t.as_str()).await?,
                    Some(Ok(Message::Close(frame))) => {
                        return Err(match frame {
                            Some(f) => format!("closed by relay: {} {}", u16::from(f.code), f.reason),
                            None => "closed by relay".to_owned(),
                        })
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(format!("receive: {e}")),
                    None => return Err("closed by relay".to_owned()),
                },
                _ = tick.tick() => {
                    self.flush();
                    self.reap(&mut ws).await?;
                }
                _ = &mut stop => {
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, ws.close(None)).await;
                    return Ok(());
                }
            }
        }
    }

    async fn on_text(&mut self, ws: &mut Ws, text: &str) -> Result<(), String> {
        self.bytes += text.len() as u64;
        if text.starts_with(r#"["EVENT","#) {
            self.events += 1;
            return Ok(());
        }
        match Incoming::parse(text) {
            Incoming::Event { .. } => self.events += 1,
            Incoming::Eose { sub } => {
                if let Some((slot, sent)) = self.pending.remove(&sub) {
                    let latency = sent.elapsed();
                    self.rec.outcome(sent, ReadOutcome::Eose { latency });
                    feed(ws, wire::close(&sub)).await?;
                    self.send_req(ws, slot).await?;
                }
            }
            Incoming::Closed { sub, message } => {
                if let Some((slot, sent)) = self.pending.remove(&sub) {
                    let latency = sent.elapsed();
                    let message = message.as_str();
                    self.rec
                        .outcome(sent, ReadOutcome::Closed { latency, message });
                    self.send_req(ws, slot).await?;
                }
            }
            Incoming::Notice { message } => self
                .counters
                .notices
                .lock()
                .expect("notices lock")
                .add(&message),
            Incoming::Ok { .. } | Incoming::Other => {}
        }
        Ok(())
    }

    /// Sends slot `slot`'s next REQ under a new subscription id.
    async fn send_req(&mut self, ws: &mut Ws, slot: usize) -> Result<(), String> {
        self.seq += 1;
        let sub = format!("f{}s{slot}n{}", self.id, self.seq);
        let filter = if !self.cfg.search.is_empty() {
            let at = (self.rng.next_u64() % self.cfg.search.len() as u64) as usize;
            json!({"search": self.cfg.search[at], "limit": self.cfg.limit})
        } else if slot.is_multiple_of(2) {
            json!({"limit": self.cfg.limit})
        } else {
            let tag = format!("{:016x}", self.rng.next_u64());
            json!({"kinds": [1], "#t": [tag]})
        };
        if Instant::now() >= self.cfg.stop {
            return Ok(()); // the flood is over; the session ends at its next turn
        }
        let msg = wire::req(&sub, &filter);
        let now = Instant::now();
        self.pending.insert(sub, (slot, now));
        self.rec.sent(now);
        ws.send(msg).await.map_err(|e| format!("send: {e}"))
    }

    /// Gives up on REQs older than the timeout: CLOSE them and start anew.
    async fn reap(&mut self, ws: &mut Ws) -> Result<(), String> {
        let timeout = self.cfg.timeout;
        let expired: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, (_, sent))| sent.elapsed() >= timeout)
            .map(|(sub, _)| sub.clone())
            .collect();
        for sub in expired {
            if let Some((slot, sent)) = self.pending.remove(&sub) {
                self.rec.outcome(sent, ReadOutcome::Timeout);
                feed(ws, wire::close(&sub)).await?;
                self.send_req(ws, slot).await?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        // What arrived as the flood ended still belongs to it.
        let at = Instant::now().min(self.cfg.stop - Duration::from_micros(1));
        self.rec.received(at, self.events, self.bytes);
        (self.events, self.bytes) = (0, 0);
    }

    fn settle_pending(&mut self, outcome: ReadOutcome<'static>) {
        for (_, (_, sent)) in self.pending.drain() {
            self.rec.outcome(sent, outcome);
        }
    }

    fn error(&self, reason: &str) {
        self.counters
            .errors
            .lock()
            .expect("errors lock")
            .add_key(reason);
    }

    async fn backoff(&self) {
        let until = (Instant::now() + RECONNECT_BACKOFF).min(self.cfg.stop);
        tokio::time::sleep_until(until.into()).await;
    }
}

/// Queues a message without flushing (the REQ that follows flushes both).
async fn feed(ws: &mut Ws, msg: Message) -> Result<(), String> {
    ws.feed(msg).await.map_err(|e| format!("send: {e}"))
}
