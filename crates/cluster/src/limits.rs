//! Global per-client limits. Admission stays local: each node's buckets
//! are checked on the hot path as on a single node, and count each
//! client's use. Every `limits_tick_ms` this task drains that use and adds
//! it, with one Lua call, to a counter per (map, client) in Redis, which
//! answers each counter's total. What the total grew by beyond this
//! node's own additions since its last look is what the other nodes'
//! clients took: it is charged to the same key here, as debt when the
//! bucket cannot pay. A client spread over N nodes so gets the one rate
//! across them all; the error is what the nodes admit in one tick before
//! they hear of each other, plus one burst per node.
//!
//! Redis away: the use of that tick is not shared, the counters' memory
//! here starts over, the /readyz note says so (see `Shared::report`), and
//! each node enforces its leased share of every limit (`lease.rs`) until
//! Redis answers again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use sluice_engine::limiter::Usage;
use sluice_engine::limiter::UsageKey;
use sluice_engine::limiter::UsageMap;

use crate::metrics_names as m;
use crate::{Shared, Task};

/// Keys sent in one Lua call.
const KEYS_PER_CALL: usize = 500;
/// A key's counter lives this long in Redis after its last use.
const COUNTER_TTL_MS: u64 = 60_000;
/// A key seen here is still read (with zero use) this long after its last
/// local use, so a client that moves between nodes is charged here too.
const FOLLOW_FOR: Duration = Duration::from_secs(5);
/// Keys remembered, at most (each: a total and when it was last used).
const MAX_REMEMBERED: usize = 100_000;

const SCRIPT: &str = r"
local ttl = tonumber(ARGV[1])
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('INCRBY', k, ARGV[i + 1])
  redis.call('PEXPIRE', k, ttl)
  out[i] = v
end
return out
";

struct Seen {
    /// The counter's total after this node's last look.
    total: i64,
    last_local_use: Instant,
}

pub(crate) async fn reconcile(sh: Arc<Shared>) {
    let script = redis::Script::new(SCRIPT);
    let mut conn: Option<MultiplexedConnection> = None;
    let mut seen: HashMap<(UsageMap, UsageKey), Seen> = HashMap::new();
    // The counters live on whatever primary is current.
    let mut made = sh.generation();
    let mut every = tokio::time::interval(Duration::from_millis(sh.cfg.limits_tick_ms));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = sh.stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let usage = sh.engine.limiter().drain_usage();
        if sh.lease.active() {
            let ops: u64 = usage.iter().map(|u| u.used).sum();
            metrics::counter!(m::CLUSTER_LEASE_OPS_TOTAL).increment(ops);
        }
        let now = Instant::now();
        // This tick's own use, plus the keys followed without use.
        let mut own: HashMap<(UsageMap, UsageKey), u64> =
            usage.iter().map(|u| ((u.map, u.key), u.used)).collect();
        for (k, s) in &seen {
            if now.duration_since(s.last_local_use) < FOLLOW_FOR {
                own.entry(*k).or_insert(0);
            }
        }
        seen.retain(|_, s| now.duration_since(s.last_local_use) < FOLLOW_FOR);
        if own.is_empty() {
            continue;
        }
        if made != sh.generation() {
            // A new primary: its counters are not the ones seen here.
            seen.clear();
        }
        sh.drop_stale(&mut conn, &mut made);
        if conn.is_none() {
            match sh.connect(Duration::ZERO).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    sh.report(Task::Limits, false, Some(&e));
                    seen.clear();
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let started = Instant::now();
        let keys: Vec<((UsageMap, UsageKey), u64)> = own.into_iter().collect();
        metrics::gauge!(m::CLUSTER_LIMITS_KEYS).set(keys.len() as f64);
        let mut remote = Vec::new();
        let mut failed = None;
        for chunk in keys.chunks(KEYS_PER_CALL) {
            let mut inv = script.prepare_invoke();
            for ((map, key), _) in chunk {
                inv.key(sh.key(&format!("lim:{}:{key}", map.label())));
            }
            inv.arg(COUNTER_TTL_MS);
            for (_, n) in chunk {
                inv.arg(*n);
            }
            let totals: Vec<i64> = match inv.invoke_async(c).await {
                Ok(t) => t,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            for ((k, n), total) in chunk.iter().zip(totals) {
                let n = *n as i64;
                let room = seen.len() < MAX_REMEMBERED;
                match seen.get_mut(k) {
                    Some(s) => {
                        // Less than before: the counter expired or Redis
                        // lost it; nothing to charge.
                        let others = total - s.total - n;
                        if others > 0 {
                            remote.push(Usage {
                                map: k.0,
                                key: k.1,
                                used: others as u64,
                            });
                        }
                        s.total = total;
                        if n > 0 {
                            s.last_local_use = now;
                        }
                    }
                    None if room => {
                        seen.insert(
                            *k,
                            Seen {
                                total,
                                last_local_use: now,
                            },
                        );
                    }
                    None => {}
                }
            }
        }
        if let Some(e) = failed {
            sh.report(Task::Limits, false, Some(&e));
            conn = None;
            seen.clear();
            continue;
        }
        sh.report(Task::Limits, true, None);
        if !remote.is_empty() {
            let ops: u64 = remote.iter().map(|u| u.used).sum();
            metrics::counter!(m::CLUSTER_LIMITS_REMOTE_OPS_TOTAL).increment(ops);
            sh.engine.limiter().charge_remote(&remote);
        }
        metrics::histogram!(m::CLUSTER_LIMITS_RECONCILE_SECONDS)
            .record(started.elapsed().as_secs_f64());
    }
}
