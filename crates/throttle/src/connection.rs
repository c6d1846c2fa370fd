//! One connection's side of admission, pure: the key a client is limited
//! under ([`client_key`]) and what the global controller's published
//! verdict means for one operation of one connection ([`ConnPacer`]:
//! politeness, batching of delays (docs/design.md#pid-control), reads never
//! delayed).
//!
//! Invariants: a connection below the polite rate is never delayed or
//! refused by the controller, but an emergency refusal reaches everyone;
//! the decision is computed the same way in every mode, and `enforced`
//! says whether the mode applies it.

use std::net::IpAddr;

use crate::meter::RateMeter;
use crate::verdict::{Decision, DelayBatcher, Direction, Mode, Verdict};

/// The key a client is limited under: its IPv4 address (an IPv4-mapped
/// IPv6 address counts as IPv4), or its IPv6 /64 (one host can rotate
/// through the addresses of its /64 at will).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & (u128::MAX << 64)).into()),
        },
    }
}

/// One connection's pace in one direction: its own rate, and the batching
/// of delays (docs/design.md#pid-control). Turns the published verdict into
/// this operation's ([`ConnPacer::check`]). 24 bytes, no allocation.
#[derive(Debug, Clone, Copy)]
pub struct ConnPacer {
    batching: DelayBatcher,
    meter: RateMeter,
}

impl ConnPacer {
    /// Applies controller delays once every `check_every_ops` operations
    /// (0 counts as 1).
    pub fn new(check_every_ops: u32) -> Self {
        ConnPacer {
            batching: DelayBatcher::new(check_every_ops),
            meter: RateMeter::default(),
        }
    }

    /// Decides one operation in direction `dir` at `now_ns`, given the
    /// verdict published for that direction. Call once per operation.
    ///
    /// The connection's rate is recorded; below `polite_ops_per_s` it
    /// passes unless the verdict is an emergency refusal (the controller
    /// is aimed at the connections causing the load). Delays are batched
    /// ([`DelayBatcher`]), refusals are not. Reads are never delayed: the
    /// read controller acts through the read budgets' rates and its
    /// refusals, and the query scheduler orders what runs.
    pub fn check(
        &mut self,
        dir: Direction,
        mode: Mode,
        published: Verdict,
        polite_ops_per_s: f64,
        now_ns: u64,
    ) -> Decision {
        let rate = self.meter.record(now_ns);
        let verdict = match published {
            v if v.is_emergency() => v,
            _ if rate < polite_ops_per_s => Verdict::Allow,
            other => other,
        };
        let mut decision = self.batching.check(mode, verdict);
        if dir == Direction::Read && matches!(decision.verdict, Verdict::Delay(_)) {
            decision.verdict = Verdict::Allow;
        }
        decision
    }
}

#[cfg(test)]
mod tests;
