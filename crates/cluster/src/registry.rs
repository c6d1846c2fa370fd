//! The node registry and repairs. Every second: this node's advertised
//! URL and heartbeat in `<prefix>:nodes`, and its consumer group's lag.
//! When a repair is wanted (a new consumer group, the stream trimmed past
//! this node, Redis back after an outage, every `repair_every_secs`), it reconciles with a peer by
//! negentropy, downloading what it lacks from every peer
//! (`cluster.repair_peers`, else the other nodes whose heartbeat is
//! fresh): each peer holds at least its own clients' events, so the union
//! is complete whatever gaps the peers have themselves.
//!
//! A repair's peer list is the registry as it stands; after Redis comes
//! back empty the peers register again one heartbeat at a time, so for
//! [`SETTLE`] after a repair, a peer that appears in the registry and was
//! not repaired from is repaired from too. At any time, a peer whose
//! heartbeat is fresh and was not at the last heartbeat (a node that
//! joined, or one back after its heartbeat aged out: paused, cut off) is
//! repaired from at once: it may hold events the stream never carried.
//!
//! The heartbeat and the repairs are two tasks: a repair waiting on a
//! peer that does not answer (paused, cut off; bounded by the connection's
//! timeouts) never holds back this node's heartbeat, by which the others
//! count it alive (and divide a lease).
//!
//! A heartbeat also names who reads every private event on its node (its
//! full readers, when it has private kinds). A peer that does not list this
//! node's repair key would show a repair only its public events, silently:
//! such a repair fails instead, at once, saying why (the keys differ
//! between the nodes), and is tried again at the next repair, not at each
//! heartbeat (a configuration error does not pass by itself). Any other
//! failure (the peer unreachable, no challenge, AUTH refused) is tried
//! again at the next heartbeat.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Value;
use redis::aio::MultiplexedConnection;

use crate::metrics_names as m;
use crate::stream::{group_field, text};
use crate::{Shared, Task, now_ms};

const HEARTBEAT: Duration = Duration::from_secs(1);
/// A peer whose heartbeat is older than this is not asked for a repair.
const PEER_FRESH_MS: u64 = 10_000;
/// A repair that finds no peer is tried again at each heartbeat for this
/// long (after Redis comes back empty, the peers register again within a
/// heartbeat); then this node is taken to be alone.
const WAIT_FOR_PEERS: Duration = Duration::from_secs(30);
/// After a repair, peers that register within this long are repaired
/// from as they appear (more than a peer's heartbeat plus its reconnect
/// backoff after a Redis outage).
const SETTLE: Duration = Duration::from_secs(30);

/// The peers repaired from since the last repair began, while the
/// registry settles.
struct Settling {
    since: Instant,
    done: std::collections::HashSet<String>,
}

/// The registry: the heartbeat task and the repair loop it feeds. They
/// are apart so that a repair waiting on a peer (paused, cut off: up to a
/// connection's timeouts) never delays this node's heartbeat, which is
/// what the others count it alive by.
pub(crate) async fn run(sh: Arc<Shared>) {
    let (tx, rx) = tokio::sync::watch::channel(None);
    let appeared = Arc::new(Mutex::new(HashSet::new()));
    let repairs = tokio::spawn(repairs(sh.clone(), rx, appeared.clone()));
    heartbeats(&sh, tx, &appeared).await;
    let _ = repairs.await;
}

/// What the last heartbeat saw: the peers with a fresh heartbeat (`None`:
/// it did not reach Redis).
type Beat = Option<Vec<Peer>>;

/// Every [`HEARTBEAT`]: this node's heartbeat and the registry's view, to
/// the repair loop, with the peers that appeared (fresh, and not at the
/// heartbeat before) added to `appeared` until the loop takes them.
/// Leaving cleanly, drops out of the registry.
async fn heartbeats(
    sh: &Shared,
    tx: tokio::sync::watch::Sender<Beat>,
    appeared: &Mutex<HashSet<String>>,
) {
    let mut conn: Option<MultiplexedConnection> = None;
    // The peers fresh at the last heartbeat that reached Redis.
    let mut fresh: Option<HashSet<String>> = None;
    let mut made = sh.generation();
    let mut every = tokio::time::interval(HEARTBEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = sh.stop.cancelled() => break,
            _ = every.tick() => {}
            _ = sh.beat_wake.notified() => {}
        }
        sh.drop_stale(&mut conn, &mut made);
        // A heartbeat waiting on an unreachable Redis does not hold up a
        // shutdown (nor does the registry entry it would have refreshed:
        // it ages out).
        let beat = tokio::select! {
            biased;
            _ = sh.stop.cancelled() => break,
            b = beat(sh, &mut conn) => b,
        };
        match beat {
            Ok(peers) => {
                sh.report(Task::Registry, true, None);
                // Peers fresh now and not at the last heartbeat: a node
                // that joined, or one back after its heartbeat aged out
                // (paused, cut off, restarted). Not at the first heartbeat.
                let now_fresh: HashSet<String> = peers.iter().map(|p| p.url.clone()).collect();
                if let Some(before) = &fresh {
                    appeared
                        .lock()
                        .extend(now_fresh.difference(before).cloned());
                }
                fresh = Some(now_fresh);
                tx.send_replace(Some(peers));
            }
            Err(e) => {
                sh.report(Task::Registry, false, Some(&e));
                conn = None;
                tx.send_replace(None);
            }
        }
    }
    // Leaving cleanly: drop out of the registry (best effort).
    if let Some(c) = conn.as_mut() {
        let _: redis::RedisResult<()> = redis::cmd("HDEL")
            .arg(sh.key("nodes"))
            .arg(&sh.node_id)
            .query_async(c)
            .await;
    }
}

/// Runs the repairs the node wants, after each heartbeat (one is asked
/// for: the heartbeat runs at once).
async fn repairs(
    sh: Arc<Shared>,
    mut rx: tokio::sync::watch::Receiver<Beat>,
    appeared: Arc<Mutex<HashSet<String>>>,
) {
    // Since when a repair has waited for a peer.
    let mut waiting: Option<Instant> = None;
    let mut last_repair = Instant::now();
    let mut settling: Option<Settling> = None;
    let every_repair = Duration::from_secs(sh.cfg.repair_every_secs);
    loop {
        tokio::select! {
            biased;
            _ = sh.stop.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
        let Some(peers) = rx.borrow_and_update().clone() else {
            continue;
        };
        let appeared = std::mem::take(&mut *appeared.lock());
        // A peer that appeared may hold events that never reached the
        // stream (its clients' while it was cut off): repaired from at once.
        let appeared = if sh.cfg.repair_peers.is_empty() {
            appeared
        } else {
            HashSet::new()
        };
        if !every_repair.is_zero() && last_repair.elapsed() >= every_repair {
            sh.repair_wanted.store(true, Ordering::Relaxed);
        }
        if sh.repair_wanted.swap(false, Ordering::Relaxed) {
            if peers.is_empty() && sh.cfg.repair_peers.is_empty() {
                let since = *waiting.get_or_insert_with(Instant::now);
                if since.elapsed() < WAIT_FOR_PEERS {
                    sh.repair_wanted.store(true, Ordering::Relaxed);
                    continue;
                }
            }
            waiting = None;
            last_repair = Instant::now();
            let done = tokio::select! {
                _ = sh.stop.cancelled() => return,
                done = repair(&sh, peers) => done,
            };
            settling = Some(Settling {
                since: last_repair,
                done,
            });
        } else {
            if settling
                .as_ref()
                .is_some_and(|s| s.since.elapsed() > SETTLE || !sh.cfg.repair_peers.is_empty())
            {
                settling = None;
            }
            let late: Vec<Peer> = peers
                .into_iter()
                .filter(|p| {
                    appeared.contains(&p.url)
                        || settling.as_ref().is_some_and(|s| !s.done.contains(&p.url))
                })
                .collect();
            if !late.is_empty() {
                let urls: Vec<&str> = late.iter().map(|p| p.url.as_str()).collect();
                tracing::info!(
                    peers = ?urls,
                    "cluster: peers registered (new, back after their heartbeat aged out, or \
                     after the repair); repairing from them"
                );
                let done = tokio::select! {
                    _ = sh.stop.cancelled() => return,
                    done = repair(&sh, late) => done,
                };
                if let Some(s) = settling.as_mut() {
                    s.done.extend(done);
                }
            }
        }
    }
}

/// Another node, as its last heartbeat describes it.
#[derive(Clone)]
struct Peer {
    url: String,
    /// Who reads every private event there (hex pubkeys); `None`: nothing
    /// is private there, or it does not say (`cluster.repair_peers`).
    full_readers: Option<Vec<String>>,
}

/// Heartbeat and lag; returns the other nodes with a fresh heartbeat.
async fn beat(
    sh: &Shared,
    conn: &mut Option<MultiplexedConnection>,
) -> redis::RedisResult<Vec<Peer>> {
    if conn.is_none() {
        *conn = Some(sh.connect(Duration::ZERO).await?);
    }
    let Some(c) = conn.as_mut() else {
        return Ok(Vec::new());
    };
    let now = now_ms();
    let mut me = serde_json::json!({"url": sh.advertise_url, "ms": now});
    if let Some(readers) = &sh.full_readers {
        me["full_readers"] = serde_json::json!(readers);
    }
    let me = me.to_string();
    let nodes = sh.key("nodes");
    let (_, all, groups): ((), Vec<(String, String)>, Value) = redis::pipe()
        .cmd("HSET")
        .arg(&nodes)
        .arg(&sh.node_id)
        .arg(me)
        .cmd("HGETALL")
        .arg(&nodes)
        .cmd("XINFO")
        .arg("GROUPS")
        .arg(sh.stream_key())
        .query_async(c)
        .await
        .or_else(|e| {
            // No stream yet (the consumer creates it): no lag to show.
            if e.code() == Some("ERR") || e.to_string().contains("no such key") {
                Ok(((), Vec::new(), Value::Nil))
            } else {
                Err(e)
            }
        })?;
    if let Some(lag) = group_field(&groups, &sh.node_id, "lag")
        .and_then(text)
        .and_then(|s| s.parse::<f64>().ok())
    {
        metrics::gauge!(m::CLUSTER_STREAM_LAG_ENTRIES).set(lag);
    }
    let others: Vec<serde_json::Value> = all
        .into_iter()
        .filter(|(id, _)| *id != sh.node_id)
        .filter_map(|(_, v)| serde_json::from_str(&v).ok())
        .collect();
    // What a lease divides each global limit by, should Redis go away.
    sh.lease_count(crate::lease::alive(
        others.iter().filter_map(|v| v["ms"].as_u64()),
        now,
        PEER_FRESH_MS,
    ));
    let peers = others
        .into_iter()
        .filter_map(|v| {
            let fresh = now.saturating_sub(v["ms"].as_u64()?) < PEER_FRESH_MS;
            let url = fresh.then(|| v["url"].as_str().map(String::from))??;
            let full_readers = v["full_readers"].as_array().map(|a| {
                a.iter()
                    .filter_map(|pk| pk.as_str().map(String::from))
                    .collect()
            });
            Some(Peer { url, full_readers })
        })
        .collect();
    Ok(peers)
}

/// Why a repair from `peer` cannot read everything it holds: it names who
/// reads its private events, and this node's repair key is not among them.
/// `None` without a repair key here (repairs then read public events only,
/// as documented) or when the peer does not say.
fn unreadable(sh: &Shared, peer: &Peer) -> Option<String> {
    let (_, pk) = sh.cfg.repair_key()?;
    let readers = peer.full_readers.as_ref()?;
    let pk = sluice_proto::hex32::encode(&pk);
    (!readers.contains(&pk)).then(|| {
        format!(
            "the peer does not show its private events to this node's repair key \
             (pubkey {pk} is not among its auth.full_readers): give every node the same \
             cluster.repair_secret_key, or list this pubkey in the peer's auth.full_readers; \
             not repaired from it, tried again at the next repair"
        )
    })
}

/// Repairs from every peer; returns the peers done with until the next
/// repair: those repaired from, and those refused for their configuration
/// ([`unreadable`]).
async fn repair(sh: &Shared, registered: Vec<Peer>) -> std::collections::HashSet<String> {
    let mut done = std::collections::HashSet::new();
    let peers = if sh.cfg.repair_peers.is_empty() {
        registered
    } else {
        sh.cfg
            .repair_peers
            .iter()
            .map(|url| Peer {
                url: url.clone(),
                full_readers: None,
            })
            .collect()
    };
    if peers.is_empty() {
        tracing::info!("cluster: no peer to repair from (this node is alone)");
        metrics::counter!(m::CLUSTER_REPAIRS_TOTAL, "result" => "no_peer").increment(1);
        return done;
    }
    let since = match sh.cfg.repair_window_secs {
        0 => 0,
        w => (now_ms() / 1000).saturating_sub(w),
    };
    // Every peer: each holds at least the events its own clients sent,
    // whatever gaps it has itself, so the union is complete.
    let mut failed = false;
    for peer in peers {
        if let Some(why) = unreadable(sh, &peer) {
            tracing::warn!(peer = %peer.url, error = %why, "cluster: repair failed");
            metrics::counter!(m::CLUSTER_REPAIRS_TOTAL, "result" => "failed").increment(1);
            done.insert(peer.url);
            continue;
        }
        let url = peer.url;
        let started = Instant::now();
        tracing::info!(peer = %url, since, "cluster: repair by negentropy");
        match (sh.repair)(url.clone(), since).await {
            Ok((fetched, stored)) => {
                tracing::info!(
                    peer = %url,
                    fetched,
                    stored,
                    secs = started.elapsed().as_secs_f64(),
                    "cluster: repair done"
                );
                metrics::counter!(m::CLUSTER_REPAIRS_TOTAL, "result" => "ok").increment(1);
                metrics::counter!(m::CLUSTER_REPAIR_EVENTS_TOTAL).increment(stored as u64);
                done.insert(url);
            }
            Err(e) => {
                tracing::warn!(peer = %url, error = %e, "cluster: repair failed");
                metrics::counter!(m::CLUSTER_REPAIRS_TOTAL, "result" => "failed").increment(1);
                failed = true;
            }
        }
    }
    if failed {
        // Try again at the next heartbeat.
        sh.repair_wanted.store(true, Ordering::Relaxed);
    }
    done
}
