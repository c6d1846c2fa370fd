//! After the flood: the relay's query gauges read once, and one fresh REQ
//! on a new connection.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::args::ReadfloodArgs;
use super::report::{AfterFlood, Probe};
use super::setup::{Plan, metrics_url};
use crate::metrics;
use crate::wire::{self, Incoming, RelayUrl};

/// Gauges read once after the flood, by name prefix (this covers
/// `sluice_query_window_*` too).
const AFTER_GAUGE_PREFIXES: &[&str] = &["sluice_query_"];

/// Reads the query gauges once, then sends one fresh REQ on a new connection.
pub(super) async fn after_flood(args: &ReadfloodArgs, plan: &Plan, t0: Instant) -> AfterFlood {
    let mut out = AfterFlood {
        at_secs: t0.elapsed().as_secs_f64(),
        ..AfterFlood::default()
    };
    if let Some(url) = metrics_url(args, plan) {
        match query_gauges(&url).await {
            Ok(g) => out.gauges = g,
            Err(e) => out.scrape_error = Some(format!("{e:#}")),
        }
    }
    let timeout = Duration::from_millis(args.timeout_ms);
    out.probe = probe(&plan.relay, plan.bind(args.probe_addr), timeout).await;
    out
}

async fn query_gauges(url: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = metrics::http_get(url).await?;
    let types = metrics::metric_types(&text);
    Ok(metrics::parse_prometheus(&text)
        .into_iter()
        .filter(|s| {
            AFTER_GAUGE_PREFIXES.iter().any(|p| s.name.starts_with(p))
                && metrics::is_gauge(&types, &s.name)
        })
        .map(|s| (s.series, s.value))
        .collect())
}

/// One REQ `{"limit":5}` on a new connection: its outcome and time to EOSE.
async fn probe(relay: &RelayUrl, bind: Option<IpAddr>, timeout: Duration) -> Probe {
    let started = Instant::now();
    let mut ws = match wire::connect(relay, bind).await {
        Ok(ws) => ws,
        Err(e) => {
            return Probe {
                outcome: "error".into(),
                message: Some(format!("connect: {}", e.root_cause())),
                ..Probe::default()
            };
        }
    };
    let mut p = Probe {
        connect_ms: started.elapsed().as_secs_f64() * 1000.0,
        ..Probe::default()
    };
    let sent = Instant::now();
    if let Err(e) = ws.send(wire::req("probe", &json!({"limit": 5}))).await {
        p.outcome = "error".into();
        p.message = Some(format!("send: {e}"));
        return p;
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    p.outcome = loop {
        let m = tokio::select! {
            m = ws.next() => m,
            _ = &mut deadline => break "timeout".into(),
        };
        let text = match m {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Close(_))) | None => {
                p.message = Some("closed by relay".into());
                break "error".into();
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                p.message = Some(format!("receive: {e}"));
                break "error".into();
            }
        };
        match Incoming::parse(text.as_str()) {
            Incoming::Event { sub, .. } if sub == "probe" => p.events += 1,
            Incoming::Eose { sub } if sub == "probe" => break "eose".into(),
            Incoming::Closed { sub, message } if sub == "probe" => {
                p.message = Some(message);
                break "closed".into();
            }
            _ => {}
        }
    };
    p.time_ms = sent.elapsed().as_secs_f64() * 1000.0;
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    p
}
