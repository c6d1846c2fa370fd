//! The steps of a `wire` run: publishing, the live subscribers, the stored
//! rounds, and one REQ answered (counted from the REQ to its EOSE).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::future::try_join_all;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::figures::{
    Bytes, HandshakeSeen, LiveFigures, PerEvent, PublishFigures, StoredFigures, StoredRound, median,
};
use crate::stats::PrefixCounts;
use crate::wire::{self, Incoming, Prepared, RelayUrl};
use crate::wsraw::codec::Msg;
use crate::wsraw::{self, WsRaw};

/// How long closing a measured connection may take.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// What the phases need from the command line.
#[derive(Debug, Clone)]
pub struct Plan {
    pub opts: wsraw::Options,
    pub subscribers: usize,
    pub ids_per_req: usize,
    pub window: usize,
    pub repeat: usize,
    /// Longest wait for an OK or an EOSE, and for the next live event once
    /// publishing is done.
    pub timeout: Duration,
}

/// One filter per `per_req` ids, each asking for all of them.
pub fn id_filters(ids: &[[u8; 32]], per_req: usize) -> Vec<Value> {
    ids.chunks(per_req.max(1))
        .map(|c| {
            let hex: Vec<String> = c.iter().map(hex::encode).collect();
            json!({"ids": hex, "limit": c.len()})
        })
        .collect()
}

/// What one REQ brought, from sending it to its EOSE (or CLOSED).
struct Answer {
    bytes: Bytes,
    /// Messages for other subscriptions or none (an AUTH challenge, ...).
    other: Bytes,
    closed: Option<String>,
}

async fn request(
    ws: &mut WsRaw,
    sub: &str,
    filter: &Value,
    timeout: Duration,
) -> anyhow::Result<Answer> {
    ws.send_text(&json!(["REQ", sub, filter]).to_string())
        .await?;
    let (mut bytes, mut other, mut closed) = (Bytes::default(), Bytes::default(), None);
    loop {
        let got = tokio::time::timeout(timeout, ws.recv())
            .await
            .with_context(|| format!("no EOSE for {sub} within {timeout:?}"))??;
        let (text, size) = match got {
            Some((Msg::Text(t), size)) => (t, size),
            Some((Msg::Close(code), _)) => bail!("the relay closed the connection ({code:?})"),
            Some((_, size)) => {
                other.add_msg(&size);
                continue;
            }
            None => bail!("the relay dropped the connection"),
        };
        let (ours, end) = match Incoming::parse(&text) {
            Incoming::Event { sub: s, .. } if s == sub => {
                bytes.events += 1;
                (true, false)
            }
            Incoming::Eose { sub: s } if s == sub => (true, true),
            Incoming::Closed { sub: s, message } if s == sub => {
                closed = Some(message);
                (true, true)
            }
            _ => (false, false),
        };
        if ours { &mut bytes } else { &mut other }.add_msg(&size);
        if end {
            break;
        }
    }
    Ok(Answer {
        bytes,
        other,
        closed,
    })
}

/// The live subscribers, each with its REQs answered.
pub struct Live {
    subs: Vec<WsRaw>,
    reqs: usize,
    closed: PrefixCounts,
}

impl Live {
    /// Opens the subscribers and sends their REQs (one at a time, each
    /// waiting for its EOSE), all subscribers at once.
    pub async fn subscribe(
        relay: &RelayUrl,
        plan: &Plan,
        events: &[Prepared],
    ) -> anyhow::Result<Live> {
        let ids: Vec<[u8; 32]> = events.iter().map(|e| e.id).collect();
        let filters = id_filters(&ids, plan.ids_per_req);
        let opts = &plan.opts;
        let opened = try_join_all((0..plan.subscribers).map(|_| async {
            let mut ws = WsRaw::connect(relay, opts).await?;
            let mut closed = PrefixCounts::default();
            for (i, f) in filters.iter().enumerate() {
                if let Some(m) = request(&mut ws, &format!("l{i}"), f, plan.timeout)
                    .await?
                    .closed
                {
                    closed.add(&m);
                }
            }
            anyhow::Ok((ws, closed))
        }))
        .await?;
        let mut closed = PrefixCounts::default();
        let subs = opened
            .into_iter()
            .map(|(ws, c)| {
                closed.merge(&c);
                ws
            })
            .collect();
        Ok(Live {
            subs,
            reqs: filters.len(),
            closed,
        })
    }

    pub fn handshake(&self) -> HandshakeSeen {
        let ws = &self.subs[0];
        HandshakeSeen {
            extensions: ws.handshake().extensions.clone(),
            sent: ws.counters().handshake_sent,
            received: ws.counters().handshake_received,
        }
    }

    /// Publishes the events while the subscribers count what reaches them;
    /// returns the publish figures, the accepted ids (in file order) and
    /// the live figures.
    pub async fn publish_and_receive(
        self,
        relay: &RelayUrl,
        plan: &Plan,
        events: &[Prepared],
        cpu: impl Fn() -> Option<f64>,
    ) -> anyhow::Result<(PublishFigures, Vec<[u8; 32]>, LiveFigures)> {
        let (expected_tx, expected_rx) = watch::channel(None);
        let timeout = plan.timeout;
        let listeners: Vec<_> = self
            .subs
            .into_iter()
            .map(|ws| tokio::spawn(listen(ws, expected_rx.clone(), timeout)))
            .collect();
        let (started, cpu_start) = (Instant::now(), cpu());
        let (publish, accepted) = publish(relay, events, plan.window, timeout).await?;
        let expected = publish.accepted - publish.duplicates;
        expected_tx.send_replace(Some(expected));
        let mut figures = LiveFigures {
            subscribers: plan.subscribers,
            reqs: self.reqs,
            expected_per_subscriber: expected,
            closed: self.closed,
            ..LiveFigures::default()
        };
        for l in listeners {
            let (bytes, other, closed) = l.await.context("a live subscriber panicked")??;
            figures.received.add(&bytes);
            figures.other.add(&other);
            figures.closed.merge(&closed);
        }
        figures.secs = started.elapsed().as_secs_f64();
        figures.per_event = figures.received.per_event();
        figures.relay_cpu_secs = cpu_start.zip(cpu()).map(|(a, b)| b - a);
        figures.relay_cpu_us_per_event = figures
            .relay_cpu_secs
            .filter(|_| figures.received.events > 0)
            .map(|s| s * 1e6 / figures.received.events as f64);
        Ok((publish, accepted, figures))
    }
}

/// Counts what one subscriber reads until it has `expected` events (once
/// that is known) or nothing more comes within `timeout` after it is known.
async fn listen(
    mut ws: WsRaw,
    mut expected: watch::Receiver<Option<u64>>,
    timeout: Duration,
) -> anyhow::Result<(Bytes, Bytes, PrefixCounts)> {
    let (mut bytes, mut other, mut closed) =
        (Bytes::default(), Bytes::default(), PrefixCounts::default());
    loop {
        let target = *expected.borrow_and_update();
        if target.is_some_and(|t| bytes.events >= t) {
            break;
        }
        // Until publishing is done, wait as long as it takes (the
        // publisher has its own timeout).
        let wait = if target.is_some() {
            timeout
        } else {
            Duration::from_secs(3600)
        };
        tokio::select! {
            got = tokio::time::timeout(wait, ws.recv()) => {
                let Ok(got) = got else { break };
                let (msg, size) = match got? {
                    Some((Msg::Close(_), _)) | None => break,
                    Some(m) => m,
                };
                match msg {
                    Msg::Text(t) if matches!(Incoming::parse(&t), Incoming::Event { .. }) => {
                        bytes.events += 1;
                        bytes.add_msg(&size);
                        continue;
                    }
                    Msg::Text(t) => if let Incoming::Closed { message, .. } = Incoming::parse(&t) {
                        closed.add(&message);
                    },
                    _ => {}
                }
                other.add_msg(&size);
            }
            changed = expected.changed() => if changed.is_err() { break },
        }
    }
    ws.close(CLOSE_WAIT).await;
    Ok((bytes, other, closed))
}

/// Publishes over a plain connection, `window` EVENTs in flight; the
/// figures and the ids accepted, in file order.
async fn publish(
    relay: &RelayUrl,
    events: &[Prepared],
    window: usize,
    timeout: Duration,
) -> anyhow::Result<(PublishFigures, Vec<[u8; 32]>)> {
    let mut ws = wire::connect(relay, None).await?;
    let started = Instant::now();
    let mut f = PublishFigures::default();
    let (mut inflight, mut accepted) = (HashSet::new(), HashSet::new());
    let mut next = events.iter();
    loop {
        while inflight.len() < window.max(1) {
            let Some(e) = next.next() else { break };
            ws.send(e.to_message()).await?;
            inflight.insert(e.id);
            f.sent += 1;
        }
        if inflight.is_empty() {
            break;
        }
        let msg = match tokio::time::timeout(timeout, ws.next()).await {
            Err(_) => {
                f.timeouts += inflight.len() as u64;
                break;
            }
            Ok(None) => bail!("the relay closed the publishing connection"),
            Ok(Some(m)) => m?,
        };
        let Some(Incoming::Ok {
            id,
            accepted: ok,
            message,
        }) = Incoming::from_message(&msg)
        else {
            continue;
        };
        if !inflight.remove(&id) {
            continue;
        }
        if ok {
            f.accepted += 1;
            f.duplicates += u64::from(message.starts_with("duplicate:"));
            accepted.insert(id);
        } else {
            f.refused += 1;
            f.refused_prefixes.add(&message);
        }
    }
    f.secs = started.elapsed().as_secs_f64();
    let _ = ws.close(None).await;
    let ids = events
        .iter()
        .filter(|e| accepted.contains(&e.id))
        .map(|e| e.id)
        .collect();
    Ok((f, ids))
}

/// `--repeat` rounds, each on a fresh connection: every filter in turn,
/// each REQ closed after its EOSE.
pub async fn stored(
    relay: &RelayUrl,
    plan: &Plan,
    ids: &[[u8; 32]],
    cpu: impl Fn() -> Option<f64>,
) -> anyhow::Result<StoredFigures> {
    let filters = id_filters(ids, plan.ids_per_req);
    let mut figures = StoredFigures {
        requested: ids.len() as u64,
        reqs_per_round: filters.len(),
        relay_cpu_secs: cpu().map(|_| 0.0),
        ..StoredFigures::default()
    };
    for _ in 0..plan.repeat {
        let mut ws = WsRaw::connect(relay, &plan.opts.clone()).await?;
        let (started, cpu_start, sent_before) = (Instant::now(), cpu(), ws.counters().sent);
        let mut round = StoredRound::default();
        for (i, filter) in filters.iter().enumerate() {
            let sub = format!("q{i}");
            let answer = request(&mut ws, &sub, filter, plan.timeout).await?;
            round.received.add(&answer.bytes);
            round.other.add(&answer.other);
            match answer.closed {
                Some(m) => round.closed.add(&m),
                None => ws.send_text(&json!(["CLOSE", sub]).to_string()).await?,
            }
        }
        let cpu_end = cpu();
        round.secs = started.elapsed().as_secs_f64();
        round.sent_bytes = ws.counters().sent - sent_before;
        figures.relay_cpu_secs = figures
            .relay_cpu_secs
            .zip(cpu_start.zip(cpu_end))
            .map(|(t, (a, b))| t + b - a);
        ws.close(CLOSE_WAIT).await;
        figures.rounds.push(round);
    }
    let per: Vec<_> = figures
        .rounds
        .iter()
        .map(|r| r.received.per_event())
        .collect();
    let pick = |f: fn(&PerEvent) -> f64| median(&per.iter().map(f).collect::<Vec<_>>());
    figures.per_event = PerEvent {
        wire: pick(|p| p.wire),
        payload: pick(|p| p.payload),
        plain_wire: pick(|p| p.plain_wire),
    };
    let served: u64 = figures.rounds.iter().map(|r| r.received.events).sum();
    figures.relay_cpu_us_per_event = figures
        .relay_cpu_secs
        .filter(|_| served > 0)
        .map(|s| s * 1e6 / served as f64);
    Ok(figures)
}
