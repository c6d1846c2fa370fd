//! Leased budgets: while Redis is unreachable the nodes cannot share their
//! clients' use, so each enforces its share of every global limit alone:
//! the limit divided by the nodes alive at its last heartbeat (this one
//! and every peer whose heartbeat was fresh then). The registry recounts
//! them at each heartbeat that reaches Redis, so a node whose heartbeat
//! ages out gives its share back to the others; during a full outage no
//! heartbeat is seen and the count stays as it was (a silent peer is as
//! likely cut off, and on its own lease, as gone). When Redis answers
//! again the shared counters take over (`limits.rs`).
//!
//! Drift (docs/cluster-scaling.md, "Leased budgets"): with `N` nodes alive
//! at the last heartbeat, one key's bucket at rate `r` admits across the
//! nodes, over an outage of `T` seconds, at most
//! `r·T + P + (N − 1)·(r·D + P)`: `P` is one node's full pools in
//! operations at the rate `r` (once leasing, each node's pools, held as
//! time, hold `1/N` of that at `r/N`), and `D` the time a node takes to
//! notice the outage (at most `limits_tick_ms` plus `redis_timeout_ms`),
//! during which it still admits at the full rate, its pools included.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::Shared;
use crate::metrics_names as m;

/// The nodes alive at `now_ms`: this one, and each peer whose last
/// heartbeat (unix ms, in `peers`) is younger than `fresh_ms`.
pub(crate) fn alive(peers: impl IntoIterator<Item = u64>, now_ms: u64, fresh_ms: u64) -> u64 {
    1 + peers
        .into_iter()
        .filter(|&ms| now_ms.saturating_sub(ms) < fresh_ms)
        .count() as u64
}

/// The share of every global limit one of `nodes` enforces alone.
pub(crate) fn share(nodes: u64) -> f64 {
    1.0 / nodes.max(1) as f64
}

/// This node's lease state, in [`Shared`].
pub(crate) struct Lease {
    /// Nodes alive at the last heartbeat that reached Redis (this one
    /// included; 1 before the first).
    nodes: AtomicU64,
    /// Whether the share is enforced (Redis unreachable).
    active: AtomicBool,
}

impl Lease {
    pub(crate) fn new() -> Lease {
        Lease {
            nodes: AtomicU64::new(1),
            active: AtomicBool::new(false),
        }
    }

    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }
}

impl Shared {
    /// A heartbeat reached Redis and saw `nodes` alive: the divisor of the
    /// next lease, and of the current one if leasing (a peer aged out: its
    /// share is reclaimed).
    pub(crate) fn lease_count(&self, nodes: u64) {
        let nodes = nodes.max(1);
        let before = self.lease.nodes.swap(nodes, Ordering::Relaxed);
        metrics::gauge!(m::CLUSTER_LEASE_NODES).set(nodes as f64);
        if before != nodes && self.lease.active() {
            tracing::info!(
                nodes,
                share = share(nodes),
                "cluster: nodes alive changed while leasing; share of each global limit recomputed"
            );
            self.apply_share(share(nodes));
        }
    }

    /// Redis unreachable: enforce this node's share of every global limit.
    pub(crate) fn lease_start(&self) {
        if !self.cfg.global_limits || self.lease.active.swap(true, Ordering::Relaxed) {
            return;
        }
        let nodes = self.lease.nodes.load(Ordering::Relaxed);
        metrics::counter!(m::CLUSTER_LEASES_TOTAL).increment(1);
        tracing::warn!(
            nodes,
            share = share(nodes),
            "cluster: Redis unreachable; each global limit leased: this node enforces its share \
             (the limit divided by the nodes alive at the last heartbeat)"
        );
        self.apply_share(share(nodes));
    }

    /// Redis back: the shared counters again, the full rate here.
    pub(crate) fn lease_end(&self) {
        if !self.lease.active.swap(false, Ordering::Relaxed) {
            return;
        }
        tracing::info!("cluster: lease ended; global limits shared through Redis again");
        self.apply_share(1.0);
    }

    fn apply_share(&self, share: f64) {
        self.engine.limiter().set_lease_share(share);
        metrics::gauge!(m::CLUSTER_LEASE_SHARE).set(share);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_alive_are_this_one_and_the_fresh_heartbeats() {
        let now = 100_000;
        // Fresh: 0.5 s and 9.999 s old; aged out: 10 s and 60 s old.
        let beats = [99_500, 90_001, 90_000, 40_000];
        assert_eq!(alive(beats, now, 10_000), 3);
        assert_eq!(alive([], now, 10_000), 1, "alone");
        // A heartbeat from the future (another clock) counts as fresh.
        assert_eq!(alive([100_500], now, 10_000), 2);
        // Time passes with no heartbeat: the peers age out one by one and
        // their shares go back to this node.
        let peers = [99_000, 95_000];
        let shares: Vec<f64> = [100_000, 105_000, 108_999, 120_000]
            .into_iter()
            .map(|t| share(alive(peers, t, 10_000)))
            .collect();
        assert_eq!(shares, [1.0 / 3.0, 0.5, 0.5, 1.0]);
    }

    #[test]
    fn the_shares_of_the_nodes_alive_add_up_to_the_limit() {
        for n in 1..=64u64 {
            let total: f64 = (0..n).map(|_| share(n)).sum();
            assert!((total - 1.0).abs() < 1e-9, "{n} nodes: {total}");
        }
        assert_eq!(
            share(0),
            1.0,
            "never above the limit, never a division by 0"
        );
        assert_eq!(share(4), 0.25);
    }
}
