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
//! not repaired from is repaired from too.
//!
//! A heartbeat also names who reads every private event on its node (its
//! full readers, when it has private kinds). A peer that does not list this
//! node's repair key would show a repair only its public events, silently:
//! such a repair fails instead, at once, saying why (the keys differ
//! between the nodes), and is tried again at the next repair, not at each
//! heartbeat (a configuration error does not pass by itself). Any other
//! failure (the peer unreachable, no challenge, AUTH refused) is tried
//! again at the next heartbeat.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

pub(crate) async fn run(sh: Arc<Shared>) {
    let mut conn: Option<MultiplexedConnection> = None;
    // Since when a repair has waited for a peer.
    let mut waiting: Option<Instant> = None;
    let mut last_repair = Instant::now();
    let mut settling: Option<Settling> = None;
    let every_repair = Duration::from_secs(sh.cfg.repair_every_secs);
    let mut every = tokio::time::interval(HEARTBEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = sh.stop.cancelled() => break,
            _ = every.tick() => {}
            _ = sh.repair_wake.notified() => {}
        }
        let peers = match beat(&sh, &mut conn).await {
            Ok(peers) => {
                sh.report(Task::Registry, true, None);
                peers
            }
            Err(e) => {
                sh.report(Task::Registry, false, Some(&e));
                conn = None;
                continue;
            }
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
            let done = repair(&sh, peers).await;
            settling = Some(Settling {
                since: last_repair,
                done,
            });
        } else if let Some(s) = settling.as_mut() {
            if s.since.elapsed() > SETTLE || !sh.cfg.repair_peers.is_empty() {
                settling = None;
            } else {
                let late: Vec<Peer> = peers
                    .into_iter()
                    .filter(|p| !s.done.contains(&p.url))
                    .collect();
                if !late.is_empty() {
                    let urls: Vec<&str> = late.iter().map(|p| p.url.as_str()).collect();
                    tracing::info!(peers = ?urls, "cluster: peers registered after the repair; repairing from them too");
                    s.done.extend(repair(&sh, late).await);
                }
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

/// Another node, as its last heartbeat describes it.
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
    let peers = all
        .into_iter()
        .filter(|(id, _)| *id != sh.node_id)
        .filter_map(|(_, v)| {
            let v: serde_json::Value = serde_json::from_str(&v).ok()?;
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
