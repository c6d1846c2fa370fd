//! The polite clients of `readflood`: each has its own key and one
//! connection, and on a fixed schedule (open loop) sends cheap REQs
//! `{"authors":[own pubkey],"limit":N}` and EVENTs signed before the clock
//! started. Time to EOSE and OK latency run from the due time, not from the
//! actual send, so a relay that stalls the client cannot hide the stall.
//! A REQ is CLOSEd at its EOSE, or at its timeout (counted as one). A
//! dropped connection loses what was open, is counted, and is reopened; items
//! that fall due while it is down are sent late (their latency grows). Every
//! item is due before `end` and is sent even if late; then the client waits
//! for the open ones to be answered or to time out. Only a client that cannot
//! reconnect until `end` plus the timeout counts what is left as skipped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::tally::{ReadOutcome, ReadRecorder};
use crate::driver::{Outcome, Recorder};
use crate::stats::PrefixCounts;
use crate::timeline::PhasedRecorder;
use crate::wire::{self, Incoming, Prepared, RelayUrl, Ws};

/// How often open items are checked for timeouts.
const REAP_EVERY: Duration = Duration::from_millis(100);
/// Wait before reopening a dropped connection.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);
/// Most REQs and EVENTs open at once per client; beyond, due items are skipped.
const MAX_OPEN: usize = 1000;

/// One polite client's schedule and identity.
pub struct PoliteConfig {
    pub index: usize,
    pub relay: RelayUrl,
    pub bind: Option<IpAddr>,
    pub pubkey_hex: String,
    /// Signed before the clock starts; one per EVENT due.
    pub events: Vec<Prepared>,
    /// First REQ due at `t0 + req_offset`, then every `req_period` until `end`.
    pub req_period: Option<Duration>,
    pub req_offset: Duration,
    pub event_period: Option<Duration>,
    pub event_offset: Duration,
    pub limit: u64,
    pub timeout: Duration,
    pub t0: Instant,
    pub end: Instant,
}

/// Where the polite clients report.
#[derive(Clone)]
pub struct PoliteSinks {
    pub reads: Arc<ReadRecorder>,
    pub writes: Arc<PhasedRecorder>,
    pub connection_errors: Arc<Mutex<PrefixCounts>>,
    pub notices: Arc<Mutex<PrefixCounts>>,
}

/// How many items a schedule of `period` from `offset` holds before `span`.
pub fn due_count(span: Duration, offset: Duration, period: Option<Duration>) -> usize {
    match period {
        Some(p) if !p.is_zero() && offset < span => {
            ((span - offset).as_secs_f64() / p.as_secs_f64()).ceil() as usize
        }
        _ => 0,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Req(usize),
    Event(usize),
}

struct OpenReq {
    due: Instant,
    events: u64,
    bytes: u64,
}

pub struct PoliteClient {
    cfg: PoliteConfig,
    sinks: PoliteSinks,
    next_req: usize,
    next_event: usize,
    reqs: HashMap<String, OpenReq>,
    oks: HashMap<[u8; 32], Instant>,
}

impl PoliteClient {
    pub fn new(cfg: PoliteConfig, sinks: PoliteSinks) -> PoliteClient {
        PoliteClient {
            cfg,
            sinks,
            next_req: 0,
            next_event: 0,
            reqs: HashMap::new(),
            oks: HashMap::new(),
        }
    }

    fn req_due(&self, k: usize) -> Option<Instant> {
        let due = self.cfg.t0 + self.cfg.req_offset + self.cfg.req_period? * k as u32;
        (due < self.cfg.end).then_some(due)
    }

    fn event_due(&self, k: usize) -> Option<Instant> {
        if k >= self.cfg.events.len() {
            return None;
        }
        let due = self.cfg.t0 + self.cfg.event_offset + self.cfg.event_period? * k as u32;
        (due < self.cfg.end).then_some(due)
    }

    /// The next item on the schedule and when it is due.
    fn next_due(&self) -> Option<(Instant, Item)> {
        let r = self
            .req_due(self.next_req)
            .map(|d| (d, Item::Req(self.next_req)));
        let e = self
            .event_due(self.next_event)
            .map(|d| (d, Item::Event(self.next_event)));
        match (r, e) {
            (Some(r), Some(e)) => Some(if e.0 < r.0 { e } else { r }),
            (r, e) => r.or(e),
        }
    }

    fn open(&self) -> usize {
        self.reqs.len() + self.oks.len()
    }

    pub async fn run(mut self) {
        // Past this, a client that cannot reconnect gives up on what is left.
        let give_up = self.cfg.end + self.cfg.timeout;
        while (self.next_due().is_some() || self.open() > 0) && Instant::now() < give_up {
            let ws = match wire::connect(&self.cfg.relay, self.cfg.bind).await {
                Ok(ws) => ws,
                Err(e) => {
                    self.error(&format!("connect: {}", e.root_cause()));
                    tokio::time::sleep(RECONNECT_BACKOFF).await;
                    continue;
                }
            };
            match self.session(ws).await {
                Ok(()) => break,
                Err(reason) => {
                    self.lose_all();
                    self.error(&reason);
                    tokio::time::sleep(RECONNECT_BACKOFF).await;
                }
            }
        }
        self.skip_rest();
    }

    /// Runs until everything due was sent and answered (Ok) or the
    /// connection drops (Err with why).
    async fn session(&mut self, mut ws: Ws) -> Result<(), String> {
        let mut tick = tokio::time::interval(REAP_EVERY);
        loop {
            let next = self.next_due();
            if next.is_none() && self.open() == 0 {
                let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
                return Ok(());
            }
            let wake = next.map_or(self.cfg.end, |(due, _)| due);
            tokio::select! {
                m = ws.next() => match m {
                    Some(Ok(Message::Text(t))) => self.on_text(&mut ws, t.as_str()).await?,
                    Some(Ok(Message::Close(_))) | None => return Err("closed by relay".to_owned()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(format!("receive: {e}")),
                },
                _ = tokio::time::sleep_until(wake.into()), if next.is_some() => {
                    if let Some((due, item)) = next {
                        self.send_item(&mut ws, due, item).await?;
                    }
                }
                _ = tick.tick() => self.reap(&mut ws).await?,
            }
        }
    }

    async fn send_item(&mut self, ws: &mut Ws, due: Instant, item: Item) -> Result<(), String> {
        let full = self.open() >= MAX_OPEN;
        let msg = match item {
            Item::Req(k) => {
                self.next_req += 1;
                if full {
                    self.sinks.reads.skipped(due);
                    return Ok(());
                }
                let sub = format!("p{}n{k}", self.cfg.index);
                let filter = json!({"authors": [self.cfg.pubkey_hex], "limit": self.cfg.limit});
                let msg = wire::req(&sub, &filter);
                let open = OpenReq {
                    due,
                    events: 0,
                    bytes: 0,
                };
                self.reqs.insert(sub, open);
                self.sinks.reads.sent(due);
                msg
            }
            Item::Event(k) => {
                self.next_event += 1;
                if full {
                    self.sinks.writes.skipped(due);
                    return Ok(());
                }
                let ev = &self.cfg.events[k];
                self.oks.insert(ev.id, due);
                self.sinks.writes.sent(due);
                ev.to_message()
            }
        };
        ws.send(msg).await.map_err(|e| format!("send: {e}"))
    }

    async fn on_text(&mut self, ws: &mut Ws, text: &str) -> Result<(), String> {
        if let Some(sub) = event_sub(text) {
            if let Some(open) = self.reqs.get_mut(sub) {
                open.events += 1;
                open.bytes += text.len() as u64;
            }
            return Ok(());
        }
        match Incoming::parse(text) {
            Incoming::Eose { sub } => {
                if let Some(open) = self.reqs.remove(&sub) {
                    let latency = open.due.elapsed();
                    self.finish_req(&open, ReadOutcome::Eose { latency });
                    ws.send(wire::close(&sub))
                        .await
                        .map_err(|e| format!("send: {e}"))?;
                }
            }
            Incoming::Closed { sub, message } => {
                if let Some(open) = self.reqs.remove(&sub) {
                    let latency = open.due.elapsed();
                    let message = message.as_str();
                    self.finish_req(&open, ReadOutcome::Closed { latency, message });
                }
            }
            Incoming::Ok {
                id,
                accepted,
                message,
            } => {
                if let Some(due) = self.oks.remove(&id) {
                    let latency = due.elapsed();
                    let message = message.as_str();
                    let outcome = if accepted {
                        Outcome::Accepted { latency, message }
                    } else {
                        Outcome::Refused { latency, message }
                    };
                    self.sinks.writes.outcome(due, outcome);
                }
            }
            Incoming::Notice { message } => self
                .sinks
                .notices
                .lock()
                .expect("notices lock")
                .add(&message),
            Incoming::Event { sub, .. } => {
                if let Some(open) = self.reqs.get_mut(&sub) {
                    open.events += 1;
                    open.bytes += text.len() as u64;
                }
            }
            Incoming::Other => {}
        }
        Ok(())
    }

    fn finish_req(&self, open: &OpenReq, outcome: ReadOutcome<'_>) {
        self.sinks.reads.outcome(open.due, outcome);
        self.sinks.reads.received(open.due, open.events, open.bytes);
    }

    /// Times out open items past the timeout; CLOSEs the REQs among them.
    async fn reap(&mut self, ws: &mut Ws) -> Result<(), String> {
        for sub in self.settle_expired() {
            ws.send(wire::close(&sub))
                .await
                .map_err(|e| format!("send: {e}"))?;
        }
        Ok(())
    }

    /// Counts open items past the timeout as timeouts; returns the REQs' ids.
    fn settle_expired(&mut self) -> Vec<String> {
        let timeout = self.cfg.timeout;
        let subs: Vec<String> = self
            .reqs
            .iter()
            .filter(|(_, o)| o.due.elapsed() >= timeout)
            .map(|(s, _)| s.clone())
            .collect();
        for sub in &subs {
            if let Some(open) = self.reqs.remove(sub) {
                self.finish_req(&open, ReadOutcome::Timeout);
            }
        }
        let writes = &self.sinks.writes;
        self.oks.retain(|_, due| {
            let keep = due.elapsed() < timeout;
            if !keep {
                writes.outcome(*due, Outcome::Timeout);
            }
            keep
        });
        subs
    }

    fn lose_all(&mut self) {
        for (_, open) in std::mem::take(&mut self.reqs) {
            self.finish_req(&open, ReadOutcome::Lost);
        }
        for (_, due) in self.oks.drain() {
            self.sinks.writes.outcome(due, Outcome::Lost);
        }
    }

    /// Counts every item still on the schedule as skipped.
    fn skip_rest(&mut self) {
        while let Some((due, item)) = self.next_due() {
            match item {
                Item::Req(_) => {
                    self.next_req += 1;
                    self.sinks.reads.skipped(due);
                }
                Item::Event(_) => {
                    self.next_event += 1;
                    self.sinks.writes.skipped(due);
                }
            }
        }
    }

    fn error(&self, reason: &str) {
        self.sinks
            .connection_errors
            .lock()
            .expect("errors lock")
            .add_key(reason);
    }
}

/// The subscription id of an `["EVENT","<sub>",...]` frame, found without
/// parsing the event; `None` for any other frame (or an id with escapes).
pub fn event_sub(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(r#"["EVENT",""#)?;
    let end = rest.find('"')?;
    let sub = &rest[..end];
    (!sub.contains('\\')).then_some(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_frames_name_their_subscription_cheaply() {
        assert_eq!(event_sub(r#"["EVENT","p0n3",{"id":"x"}]"#), Some("p0n3"));
        assert_eq!(event_sub(r#"["EOSE","p0n3"]"#), None);
        assert_eq!(event_sub(r#"[ "EVENT","p0n3",{}]"#), None);
    }

    #[test]
    fn schedules_count_their_items() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(due_count(s(10), ms(0), Some(ms(500))), 20);
        assert_eq!(due_count(s(10), ms(100), Some(ms(500))), 20);
        assert_eq!(due_count(s(10), ms(500), Some(ms(500))), 19);
        assert_eq!(due_count(s(10), ms(0), None), 0);
        assert_eq!(due_count(s(1), s(2), Some(ms(500))), 0);
    }
}
