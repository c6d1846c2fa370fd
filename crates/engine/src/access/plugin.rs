//! Write-policy plugins speaking strfry's protocol, so operators can reuse
//! the plugins they run: an external program gets one JSON request per line
//! on its stdin,
//! `{"type":"new","event":{..},"receivedAt":<unix s>,"sourceType":"IP4"|"IP6","sourceInfo":"<ip>","authed":"<hex>"?}`,
//! and answers one line per event, `{"id":"<event id>","action":"accept"|"reject"|"shadowReject","msg":".."}`.
//!
//! Bounds, and what happens at each:
//! - requests wait in a queue of `policy.plugin.queue` (full: the
//!   configured failure answer at once, counted `queue_full`);
//! - each event is answered within `policy.plugin.timeout_ms` (else the
//!   failure answer, counted `timeout`); replies are matched by id;
//! - a program that exits, or cannot be started, is restarted after
//!   `restart_backoff_ms` (counted); meanwhile events get the failure
//!   answer (`unavailable`);
//! - the failure answer is accept (`fail_open = true`) or reject.
//!
//! Ownership: each pending request lives in the manager task's map until it
//! is answered, times out or the program dies, so `sluice_plugin_in_flight`
//! returns to 0; a session that goes away drops its receiver only.

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sluice_proto::{Event, hex32};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::metrics_names as m;

use super::config::PluginConfig;

/// The program's answer for one event (or the failure answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginVerdict {
    Accept,
    /// OK false `blocked:` with the program's message.
    Reject(String),
    /// OK true, not stored.
    ShadowReject,
}

/// Where the event came from, for the request.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub ip: IpAddr,
    pub authed: Option<&'a [u8; 32]>,
}

struct Request {
    line: String,
    id: String,
    reply: oneshot::Sender<PluginVerdict>,
}

/// A running plugin. Cheap to share.
pub struct Plugin {
    tx: mpsc::Sender<Request>,
    fail: PluginVerdict,
    /// Longest answer time since the monitor last looked, ns.
    max_latency_ns: Arc<AtomicU64>,
}

impl Plugin {
    /// Starts the manager task (on the current tokio runtime); `None` when
    /// no command is configured.
    pub fn start(cfg: &PluginConfig) -> Option<Plugin> {
        if cfg.command.is_empty() {
            return None;
        }
        let (tx, rx) = mpsc::channel(cfg.queue);
        let fail = failure(cfg);
        let max_latency_ns = Arc::new(AtomicU64::new(0));
        tokio::spawn(manage(cfg.clone(), rx, max_latency_ns.clone()));
        Some(Plugin {
            tx,
            fail,
            max_latency_ns,
        })
    }

    /// The program's verdict on `ev`.
    pub async fn check(&self, ev: &Event, source: Source<'_>) -> PluginVerdict {
        let mut req = serde_json::json!({
            "type": "new",
            "event": serde_json::from_str::<serde_json::Value>(ev.raw()).unwrap_or_default(),
            "receivedAt": crate::clock::unix_now(),
            "sourceType": if source.ip.is_ipv4() { "IP4" } else { "IP6" },
            "sourceInfo": source.ip.to_string(),
        });
        if let Some(p) = source.authed {
            req["authed"] = serde_json::Value::String(hex32::encode(p));
        }
        let (reply, answer) = oneshot::channel();
        let request = Request {
            line: req.to_string(),
            id: ev.id_hex(),
            reply,
        };
        if self.tx.try_send(request).is_err() {
            count("queue_full");
            return self.fail.clone();
        }
        answer.await.unwrap_or_else(|_| self.fail.clone())
    }

    /// The longest answer time since the last call (a load signal).
    pub fn take_max_latency(&self) -> Duration {
        Duration::from_nanos(self.max_latency_ns.swap(0, Ordering::Relaxed))
    }
}

fn failure(cfg: &PluginConfig) -> PluginVerdict {
    if cfg.fail_open {
        PluginVerdict::Accept
    } else {
        PluginVerdict::Reject("the write policy did not answer".into())
    }
}

fn count(result: &'static str) {
    metrics::counter!(m::PLUGIN_EVENTS_TOTAL, "result" => result).increment(1);
}

struct Pending {
    reply: oneshot::Sender<PluginVerdict>,
    sent: Instant,
}

/// Runs the program, restarting it when it exits, until every [`Plugin`]
/// handle is dropped.
async fn manage(cfg: PluginConfig, mut rx: mpsc::Receiver<Request>, max_latency: Arc<AtomicU64>) {
    let fail = failure(&cfg);
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let backoff = Duration::from_millis(cfg.restart_backoff_ms);
    let mut first = true;
    loop {
        if !first {
            metrics::counter!(m::PLUGIN_RESTARTS_TOTAL).increment(1);
            // Answer what arrives while waiting to restart.
            let until = tokio::time::Instant::now() + backoff;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => break,
                    r = rx.recv() => match r {
                        Some(req) => {
                            count("unavailable");
                            let _ = req.reply.send(fail.clone());
                        }
                        None => return,
                    },
                }
            }
        }
        first = false;
        let child = tokio::process::Command::new(&cfg.command)
            .args(&cfg.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(command = %cfg.command, error = %e, "write-policy plugin could not start");
                continue;
            }
        };
        tracing::info!(command = %cfg.command, "write-policy plugin started");
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            continue;
        };
        let mut lines = BufReader::new(stdout).lines();
        let mut pending: HashMap<String, Pending> = HashMap::new();
        let mut tick = tokio::time::interval(timeout.min(Duration::from_millis(100)));
        let alive = loop {
            metrics::gauge!(m::PLUGIN_IN_FLIGHT).set(pending.len() as f64);
            tokio::select! {
                r = rx.recv() => {
                    let Some(req) = r else { break false };
                    let mut line = req.line;
                    line.push('\n');
                    if stdin.write_all(line.as_bytes()).await.is_err() {
                        count("unavailable");
                        let _ = req.reply.send(fail.clone());
                        break true;
                    }
                    pending.insert(req.id, Pending { reply: req.reply, sent: Instant::now() });
                }
                line = lines.next_line() => {
                    let Ok(Some(line)) = line else { break true };
                    let Some((id, verdict)) = parse_reply(&line) else {
                        tracing::warn!(line = %line.chars().take(200).collect::<String>(), "write-policy plugin sent a line that is not a reply");
                        continue;
                    };
                    if let Some(p) = pending.remove(&id) {
                        let took = p.sent.elapsed();
                        metrics::histogram!(m::PLUGIN_LATENCY_SECONDS).record(took.as_secs_f64());
                        max_latency.fetch_max(took.as_nanos() as u64, Ordering::Relaxed);
                        count(match verdict {
                            PluginVerdict::Accept => "accept",
                            PluginVerdict::Reject(_) => "reject",
                            PluginVerdict::ShadowReject => "shadow_reject",
                        });
                        let _ = p.reply.send(verdict);
                    }
                }
                _ = tick.tick() => {
                    let late: Vec<String> = pending
                        .iter()
                        .filter(|(_, p)| p.sent.elapsed() >= timeout)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in late {
                        if let Some(p) = pending.remove(&id) {
                            count("timeout");
                            max_latency.fetch_max(timeout.as_nanos() as u64, Ordering::Relaxed);
                            let _ = p.reply.send(fail.clone());
                        }
                    }
                }
            }
        };
        for (_, p) in pending.drain() {
            count("unavailable");
            let _ = p.reply.send(fail.clone());
        }
        metrics::gauge!(m::PLUGIN_IN_FLIGHT).set(0.0);
        drop(stdin);
        let _ = child.kill().await;
        if !alive {
            return;
        }
        tracing::warn!(command = %cfg.command, "write-policy plugin exited; restarting");
    }
}

/// `{"id": .., "action": .., "msg": ..}` → the id and the verdict.
fn parse_reply(line: &str) -> Option<(String, PluginVerdict)> {
    #[derive(Deserialize)]
    struct Reply {
        id: String,
        action: String,
        #[serde(default)]
        msg: String,
    }
    let r: Reply = serde_json::from_str(line).ok()?;
    let verdict = match r.action.as_str() {
        "accept" => PluginVerdict::Accept,
        "reject" => PluginVerdict::Reject(r.msg),
        "shadowReject" => PluginVerdict::ShadowReject,
        _ => return None,
    };
    Some((r.id, verdict))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_as_strfry_writes_them() {
        assert_eq!(
            parse_reply(r#"{"id":"ab","action":"reject","msg":"no spam"}"#),
            Some(("ab".into(), PluginVerdict::Reject("no spam".into())))
        );
        assert_eq!(
            parse_reply(r#"{"id":"ab","action":"accept"}"#),
            Some(("ab".into(), PluginVerdict::Accept))
        );
        assert_eq!(
            parse_reply(r#"{"id":"ab","action":"shadowReject","msg":""}"#),
            Some(("ab".into(), PluginVerdict::ShadowReject))
        );
        assert_eq!(parse_reply(r#"{"id":"ab","action":"maybe"}"#), None);
        assert_eq!(parse_reply("not json"), None);
    }
}
