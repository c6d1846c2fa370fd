//! The end-of-run checks: are these events still stored? Asked over REQ by
//! ids, in chunks, on one connection: each chunk's REQ is read to its EOSE
//! and CLOSEd. A chunk the relay refuses (CLOSED, for example
//! `rate-limited:`) or does not answer is asked again after a pause; one
//! still unanswered after the last attempt counts as unchecked, never as
//! missing.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;

use crate::driver::close_reason;
use crate::wire::{self, Incoming, RelayUrl, Ws};

/// Ids per REQ.
const CHUNK_IDS: usize = 100;
/// Tries per chunk before it counts as unchecked.
const ATTEMPTS: u32 = 6;
/// Pause before the next try grows by this each time.
const BACKOFF: Duration = Duration::from_millis(500);
/// Missing ids written to the report, at most.
const MAX_EXAMPLES: usize = 10;
/// Notes (refusals, errors) kept, at most.
const MAX_NOTES: usize = 10;

/// What one check found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct StoredCheck {
    /// Accepted events looked for.
    pub expected: u64,
    pub found: u64,
    /// Asked for and not returned.
    pub missing: u64,
    /// Accepted but not looked for: a newer version of their replaceable or
    /// addressable slot was accepted too.
    pub superseded: u64,
    /// Not asked: the relay refused or did not answer the query.
    pub unchecked: u64,
    /// The first missing ids (hex).
    pub missing_examples: Vec<String>,
    /// Refusals and errors met on the way.
    pub notes: Vec<String>,
}

impl StoredCheck {
    pub fn passed(&self) -> bool {
        self.missing == 0 && self.unchecked == 0
    }

    fn note(&mut self, s: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(s);
        }
    }

    pub fn line(&self) -> String {
        let mut s = format!("{} of {} stored", self.found, self.expected);
        if self.missing > 0 {
            s += &format!(", {} MISSING", self.missing);
        }
        if self.unchecked > 0 {
            s += &format!(", {} unchecked (queries refused)", self.unchecked);
        }
        if self.superseded > 0 {
            s += &format!(
                "; {} older replaceable versions not expected",
                self.superseded
            );
        }
        s
    }
}

enum End {
    Eose,
    Closed(String),
}

/// Looks for `ids` on the relay; `superseded` is carried into the result.
pub async fn check_stored(
    relay: &RelayUrl,
    bind: Option<IpAddr>,
    ids: &[[u8; 32]],
    superseded: u64,
    timeout: Duration,
) -> StoredCheck {
    let mut out = StoredCheck {
        expected: ids.len() as u64,
        superseded,
        ..StoredCheck::default()
    };
    let mut found: HashSet<[u8; 32]> = HashSet::with_capacity(ids.len());
    let mut unanswered: HashSet<[u8; 32]> = HashSet::new();
    let mut ws: Option<Ws> = None;
    for (n, part) in ids.chunks(CHUNK_IDS).enumerate() {
        let mut answered = false;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(BACKOFF * attempt).await;
            }
            if ws.is_none() {
                match wire::connect(relay, bind).await {
                    Ok(w) => ws = Some(w),
                    Err(e) => {
                        out.note(format!("connect: {}", e.root_cause()));
                        continue;
                    }
                }
            }
            let conn = ws.as_mut().expect("connected above");
            let sub = format!("soak-check-{n}-{attempt}");
            match query_ids(conn, &sub, part, &mut found, timeout).await {
                Ok(End::Eose) => {
                    answered = true;
                    break;
                }
                Ok(End::Closed(message)) => out.note(format!("CLOSED {message:?}")),
                Err(e) => {
                    out.note(format!("{e:#}"));
                    ws = None;
                }
            }
        }
        if !answered {
            // What came back before the refusal still counts as found.
            unanswered.extend(part.iter().filter(|id| !found.contains(*id)));
        }
    }
    if let Some(mut w) = ws {
        let _ = w.close(None).await;
    }
    for id in ids {
        if found.contains(id) {
            out.found += 1;
        } else if unanswered.contains(id) {
            out.unchecked += 1;
        } else {
            out.missing += 1;
            if out.missing_examples.len() < MAX_EXAMPLES {
                out.missing_examples.push(hex::encode(id));
            }
        }
    }
    out
}

/// One REQ `{"ids":[...]}` read to its EOSE (then CLOSEd) or CLOSED.
async fn query_ids(
    ws: &mut Ws,
    sub: &str,
    ids: &[[u8; 32]],
    found: &mut HashSet<[u8; 32]>,
    timeout: Duration,
) -> anyhow::Result<End> {
    let hex_ids: Vec<String> = ids.iter().map(hex::encode).collect();
    let filter = json!({"ids": hex_ids, "limit": ids.len()});
    ws.send(wire::req(sub, &filter)).await.context("send REQ")?;
    let wanted: HashSet<&[u8; 32]> = ids.iter().collect();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .with_context(|| format!("no EOSE within {timeout:?}"))?;
        let msg = match msg {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Close(frame))) => {
                bail!("{}", close_reason(frame.as_ref()))
            }
            Some(Ok(m)) => m,
            Some(Err(e)) => bail!("receive: {e}"),
            None => bail!("closed by relay"),
        };
        match Incoming::from_message(&msg) {
            Some(Incoming::Event { sub: s, id }) if s == sub && wanted.contains(&id) => {
                found.insert(id);
            }
            Some(Incoming::Eose { sub: s }) if s == sub => {
                ws.send(wire::close(sub)).await.context("send CLOSE")?;
                return Ok(End::Eose);
            }
            Some(Incoming::Closed { sub: s, message }) if s == sub => {
                return Ok(End::Closed(message));
            }
            _ => {}
        }
    }
}
