//! `sybil --polite-auth`: a polite client that authenticates (NIP-42) as
//! its own key before it publishes, so the relay counts it in the
//! `authenticated` tier (and its budget, `[[throttle.budgets]]`). Open
//! loop at its rate like the other polite clients: each event is sent at
//! its due time (or as soon as the previous answer came, if later) and its
//! latency counted from that due time.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use sluice_proto::Event;
use tokio_tungstenite::tungstenite::Message;

use crate::driver::{Outcome, Recorder};
use crate::report::unix_now;
use crate::timeline::PhasedRecorder;
use crate::wire::{self, Incoming, Prepared, RelayUrl, Ws};

/// One authenticated polite client.
pub(super) struct Authed {
    pub relay: RelayUrl,
    /// The URL its AUTH event names (`relay` tag).
    pub url: String,
    pub bind: Option<IpAddr>,
    pub secret_key: [u8; 32],
    pub rate: f64,
    /// Its first event this long after `t0`.
    pub offset_secs: f64,
    pub timeout: Duration,
}

/// Connects, authenticates, then publishes `pool` on schedule until `stop`.
pub(super) async fn run(
    a: Authed,
    pool: Vec<Prepared>,
    rec: Arc<PhasedRecorder>,
    (t0, stop): (Instant, Instant),
) {
    let mut ws = match wire::connect(&a.relay, a.bind).await {
        Ok(ws) => ws,
        Err(e) => return rec.connection_error(&format!("connect: {}", e.root_cause())),
    };
    if let Err(why) = authenticate(&mut ws, &a).await {
        return rec.connection_error(&why);
    }
    for (i, ev) in pool.into_iter().enumerate() {
        let due = t0 + Duration::from_secs_f64(a.offset_secs + i as f64 / a.rate);
        if due >= stop {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        rec.sent(due);
        if ws.send(ev.to_message()).await.is_err() {
            rec.outcome(due, Outcome::Lost);
            return rec.connection_error("send failed");
        }
        let deadline = Instant::now() + a.timeout;
        let outcome = match ok_of(&mut ws, &ev.id, deadline).await {
            Some((accepted, message)) => {
                let latency = due.elapsed();
                let message = message.as_str();
                if accepted {
                    rec.outcome(due, Outcome::Accepted { latency, message });
                } else {
                    rec.outcome(due, Outcome::Refused { latency, message });
                }
                continue;
            }
            None => Outcome::Timeout,
        };
        rec.outcome(due, outcome);
    }
}

/// The OK of `id` (others are skipped), or `None` past `deadline` or when
/// the connection ends.
async fn ok_of(ws: &mut Ws, id: &[u8; 32], deadline: Instant) -> Option<(bool, String)> {
    loop {
        let msg = tokio::time::timeout_at(deadline.into(), ws.next())
            .await
            .ok()??
            .ok()?;
        if let Some(Incoming::Ok {
            id: got,
            accepted,
            message,
        }) = Incoming::from_message(&msg)
            && got == *id
        {
            return Some((accepted, message));
        }
    }
}

/// Waits for the relay's challenge and answers it (kind 22242).
async fn authenticate(ws: &mut Ws, a: &Authed) -> Result<(), String> {
    let deadline = Instant::now() + a.timeout;
    let challenge = loop {
        let msg = tokio::time::timeout_at(deadline.into(), ws.next())
            .await
            .map_err(|_| "no AUTH challenge in time".to_owned())?
            .ok_or("closed before the AUTH challenge")?
            .map_err(|e| format!("receive: {e}"))?;
        let Message::Text(text) = msg else { continue };
        let v: serde_json::Value = serde_json::from_str(text.as_str()).unwrap_or_default();
        if v[0] == "AUTH"
            && let Some(c) = v[1].as_str()
        {
            break c.to_owned();
        }
    };
    let tags = vec![
        vec!["relay".to_owned(), a.url.clone()],
        vec!["challenge".to_owned(), challenge],
    ];
    let auth = Event::sign(&a.secret_key, unix_now(), 22242, tags, "");
    let text = format!("[\"AUTH\",{}]", auth.raw());
    ws.send(Message::Text(text.into()))
        .await
        .map_err(|e| format!("send AUTH: {e}"))?;
    match ok_of(ws, &auth.id, deadline).await {
        Some((true, _)) => Ok(()),
        Some((false, m)) => Err(format!("AUTH refused: {m}")),
        None => Err("no answer to AUTH".to_owned()),
    }
}
