//! What a cluster shares of the per-client buckets: each client's use of
//! the maps counted here ([`Limiter::drain_usage`]), and the other nodes'
//! use charged to the same keys ([`Limiter::charge_remote`]). Off until
//! [`Limiter::track_usage`]; then the hot path adds one counter update
//! under the bucket's lock it already holds.
//!
//! While the cluster cannot share use (its Redis unreachable), it leases:
//! [`Limiter::set_lease_share`] runs every shared map at a fraction of its
//! rate (its pools, held as time, hold that fraction of the operations),
//! so the nodes together stay near the one global rate.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use sluice_throttle::admission::Quota;

use super::Limiter;

/// A per-client bucket map whose use a cluster shares among its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageMap {
    /// EVENTs per address.
    EventsIp,
    /// REQs and COUNTs per address.
    ReqsIp,
    /// EVENTs per author.
    Author,
    /// EVENTs per pubkey of the tier with this index (1 = authenticated).
    TierEvents(u8),
    /// REQs per pubkey of the tier with this index.
    TierReqs(u8),
}

impl UsageMap {
    /// A short name for keys shared with other nodes.
    pub fn label(&self) -> String {
        match self {
            UsageMap::EventsIp => "eip".into(),
            UsageMap::ReqsIp => "rip".into(),
            UsageMap::Author => "author".into(),
            UsageMap::TierEvents(t) => format!("t{t}e"),
            UsageMap::TierReqs(t) => format!("t{t}r"),
        }
    }
}

/// The client a use is counted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageKey {
    Ip(IpAddr),
    Pubkey([u8; 32]),
}

impl std::fmt::Display for UsageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UsageKey::Ip(ip) => write!(f, "{ip}"),
            UsageKey::Pubkey(p) => {
                for b in p {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// Operations one client took from one map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub map: UsageMap,
    pub key: UsageKey,
    pub used: u64,
}

impl Limiter {
    /// Starts counting each client's use of the maps a cluster shares
    /// (events and requests per address and per tier pubkey, events per
    /// author), for [`Limiter::drain_usage`].
    pub fn track_usage(&self) {
        self.usage_tracking.store(true, Ordering::Relaxed);
        self.events_ip.lock().set_usage_tracking(true);
        self.reqs_ip.lock().set_usage_tracking(true);
        self.events_pubkey.lock().set_usage_tracking(true);
        for b in self.tiers.load().buckets.iter() {
            b.map(Quota::Events).lock().set_usage_tracking(true);
            b.map(Quota::Requests).lock().set_usage_tracking(true);
        }
    }

    /// Each client's use of the shared maps since the last call.
    pub fn drain_usage(&self) -> Vec<Usage> {
        let mut out = Vec::new();
        let mut ips = Vec::new();
        let mut keys = Vec::new();
        let push_ips = |map, ips: &mut Vec<(IpAddr, u32)>, out: &mut Vec<Usage>| {
            out.extend(ips.drain(..).map(|(ip, n)| Usage {
                map,
                key: UsageKey::Ip(ip),
                used: u64::from(n),
            }))
        };
        self.events_ip.lock().drain_usage(&mut ips);
        push_ips(UsageMap::EventsIp, &mut ips, &mut out);
        self.reqs_ip.lock().drain_usage(&mut ips);
        push_ips(UsageMap::ReqsIp, &mut ips, &mut out);
        let push_keys = |map, keys: &mut Vec<([u8; 32], u32)>, out: &mut Vec<Usage>| {
            out.extend(keys.drain(..).map(|(p, n)| Usage {
                map,
                key: UsageKey::Pubkey(p),
                used: u64::from(n),
            }))
        };
        self.events_pubkey.lock().drain_usage(&mut keys);
        push_keys(UsageMap::Author, &mut keys, &mut out);
        for (i, b) in self.tiers.load().buckets.iter().enumerate() {
            let tier = u8::try_from(i + 1).unwrap_or(u8::MAX);
            b.map(Quota::Events).lock().drain_usage(&mut keys);
            push_keys(UsageMap::TierEvents(tier), &mut keys, &mut out);
            b.map(Quota::Requests).lock().drain_usage(&mut keys);
            push_keys(UsageMap::TierReqs(tier), &mut keys, &mut out);
        }
        out
    }

    /// Charges what other nodes' clients took (debt beyond the bucket) to
    /// the same keys here, where they are known. Returns how many were.
    pub fn charge_remote(&self, usage: &[Usage]) -> usize {
        let now = self.now_ns();
        let tiers = self.tiers.load();
        let tier = |t: u8, quota| tiers.tier(t).map(|b| b.map(quota));
        let mut known = 0;
        for u in usage {
            let hit = match (u.map, u.key) {
                (UsageMap::EventsIp, UsageKey::Ip(ip)) => {
                    self.events_ip.lock().charge_remote(&ip, now, u.used)
                }
                (UsageMap::ReqsIp, UsageKey::Ip(ip)) => {
                    self.reqs_ip.lock().charge_remote(&ip, now, u.used)
                }
                (UsageMap::Author, UsageKey::Pubkey(p)) => {
                    self.events_pubkey.lock().charge_remote(&p, now, u.used)
                }
                (UsageMap::TierEvents(t), UsageKey::Pubkey(p)) => {
                    tier(t, Quota::Events).is_some_and(|m| m.lock().charge_remote(&p, now, u.used))
                }
                (UsageMap::TierReqs(t), UsageKey::Pubkey(p)) => tier(t, Quota::Requests)
                    .is_some_and(|m| m.lock().charge_remote(&p, now, u.used)),
                _ => false,
            };
            known += usize::from(hit);
        }
        known
    }

    /// Runs the maps a cluster shares (events and requests per address and
    /// per tier pubkey, events per author) at `share` of their rate, at
    /// once and at every governor tick after, until set back to 1. `share`
    /// is clamped to `0.001..=1` (NaN: 1).
    pub fn set_lease_share(&self, share: f64) {
        let share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.001, 1.0)
        };
        let last = self.state.lock();
        self.lease_share.store(share.to_bits(), Ordering::Relaxed);
        let (w, r) = last
            .map(|s| (s.write.pid.output, s.read.pid.output))
            .unwrap_or((0.0, 0.0));
        self.set_rates(w, r);
    }

    /// The share [`Limiter::set_lease_share`] set (1: not leasing).
    pub fn lease_share(&self) -> f64 {
        f64::from_bits(self.lease_share.load(Ordering::Relaxed))
    }
}
