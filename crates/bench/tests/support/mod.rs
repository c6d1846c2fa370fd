//! A tiny in-memory NIP-01 relay for the integration tests, so they need
//! nothing but cargo: EVENT (verified, stored, OK), REQ (stored matches,
//! newest first, up to `limit`, then EOSE, then live events), CLOSE.
//! It binds 127.0.0.1:0 and reports its address before serving.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use serde_json::json;
use sluice_proto::{Event, Filter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message;

#[derive(Default)]
struct Store {
    events: Vec<Arc<Event>>,
    ids: std::collections::HashSet<[u8; 32]>,
}

struct Relay {
    store: Mutex<Store>,
    /// Who loses when it fills: a lagging subscriber misses live events.
    live: broadcast::Sender<Arc<Event>>,
}

/// Starts the relay on a free port and returns its ws:// URL.
pub async fn start() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let relay = Arc::new(Relay {
        store: Mutex::default(),
        live: broadcast::channel(65536).0,
    });
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(relay.clone(), stream));
        }
    });
    format!("ws://{addr}")
}

async fn serve(relay: Arc<Relay>, stream: TcpStream) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let mut live = relay.live.subscribe();
    let mut subs: HashMap<String, Vec<Filter>> = HashMap::new();
    loop {
        let out: Vec<String> = tokio::select! {
            m = ws.next() => match m {
                Some(Ok(Message::Text(t))) => handle(&relay, &mut subs, t.as_str()),
                Some(Ok(_)) => continue,
                _ => return,
            },
            ev = live.recv() => match ev {
                Ok(ev) => deliver(&subs, &ev),
                Err(_) => continue,
            },
        };
        for text in out {
            if ws.send(Message::Text(text.into())).await.is_err() {
                return;
            }
        }
    }
}

fn deliver(subs: &HashMap<String, Vec<Filter>>, ev: &Event) -> Vec<String> {
    subs.iter()
        .filter(|(_, fs)| fs.iter().any(|f| f.matches(ev)))
        .map(|(sub, _)| event_message(sub, ev.raw()))
        .collect()
}

fn handle(relay: &Relay, subs: &mut HashMap<String, Vec<Filter>>, text: &str) -> Vec<String> {
    let Ok(Value::Array(parts)) = serde_json::from_str::<Value>(text) else {
        return vec![json!(["NOTICE", "invalid: not a JSON array"]).to_string()];
    };
    match parts.first().and_then(Value::as_str) {
        Some("EVENT") => vec![publish(relay, &parts[1].to_string())],
        Some("REQ") => {
            let sub = parts[1].as_str().unwrap_or_default().to_owned();
            let filters: Vec<Filter> = parts[2..]
                .iter()
                .filter_map(|f| Filter::from_value(f).ok())
                .collect();
            let mut out = stored(relay, &sub, &filters);
            out.push(json!(["EOSE", sub]).to_string());
            subs.insert(sub, filters);
            out
        }
        Some("CLOSE") => {
            subs.remove(parts[1].as_str().unwrap_or_default());
            vec![]
        }
        _ => vec![json!(["NOTICE", "unsupported: message type"]).to_string()],
    }
}

fn publish(relay: &Relay, raw: &str) -> String {
    let Ok(ev) = Event::parse(raw) else {
        return json!(["NOTICE", "invalid: bad event"]).to_string();
    };
    if ev.verify().is_err() {
        return ok_message(&ev, false, "invalid: bad signature");
    }
    let ev = Arc::new(ev);
    {
        let mut store = relay.store.lock().unwrap();
        if !store.ids.insert(ev.id) {
            return ok_message(&ev, true, "duplicate: already have this event");
        }
        store.events.push(ev.clone());
    }
    let _ = relay.live.send(ev.clone());
    ok_message(&ev, true, "")
}

// Relay messages are built here rather than with sluice-proto's builders so
// this stand-in relay does not follow their API changes.
fn ok_message(ev: &Event, accepted: bool, message: &str) -> String {
    json!(["OK", ev.id_hex(), accepted, message]).to_string()
}

fn event_message(sub: &str, raw: &str) -> String {
    format!("[\"EVENT\",{},{raw}]", json!(sub))
}

fn stored(relay: &Relay, sub: &str, filters: &[Filter]) -> Vec<String> {
    let store = relay.store.lock().unwrap();
    let mut out = Vec::new();
    for f in filters {
        let limit = f.limit.unwrap_or(500) as usize;
        let mut hits: Vec<&Arc<Event>> = store.events.iter().filter(|e| f.matches(e)).collect();
        hits.sort_by_key(|e| std::cmp::Reverse(e.created_at));
        out.extend(
            hits.into_iter()
                .take(limit)
                .map(|e| event_message(sub, e.raw())),
        );
    }
    out
}
