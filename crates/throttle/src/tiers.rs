//! Identity tiers (weighted fair share, no priority inversion:
//! docs/design.md#backpressure):
//! who a request is charged to ([`ClientKey`]) and what share it gets
//! ([`Tier`]), from the pubkeys a connection has authenticated as (NIP-42).
//!
//! - **anonymous** (tier 0): limited by its address, weight 1, the base
//!   bucket rates;
//! - **authenticated** (tier 1): a pubkey no tier lists. Its reads and
//!   writes are charged to buckets of its pubkey at the base rates × its
//!   `rate_multiplier`, and still to its address's buckets: a fresh key
//!   costs nothing, so an unlisted pubkey never gets more than its address
//!   would;
//! - **listed** tiers (2..): pubkeys the operator names (e.g. "trusted",
//!   "paid"), charged to their pubkey only, at the base rates × the tier's
//!   `rate_multiplier`.
//!
//! The weight is the tier's share wherever capacity is divided: the query
//! scheduler's rotation (weighted deficit round robin), the controller's
//! politeness threshold (`polite_ops_per_s × weight`) and its delays
//! (`delay / weight`). A tier of weight above 1 also has more of the query
//! window: up to three times its relay-wide bound, where weight-1 clients
//! stop at once (twice for a client with nothing open): a burst of lower
//! tiers cannot take the last third, so it cannot starve a higher tier
//! (no priority inversion).
//!
//! Pure: the session resolves its tier once per AUTH, not per request.

use std::collections::HashMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};

/// The key per-client limits are kept under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    /// An address (IPv6: its /64; see [`crate::client_key`]).
    Ip(IpAddr),
    /// An authenticated pubkey.
    Pubkey([u8; 32]),
}

/// One tier's share (`[throttle.tiers.authenticated]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TierShare {
    /// Share of contended capacity relative to anonymous clients (1),
    /// `1..=1000`.
    pub weight: u32,
    /// Its per-client bucket rates are the base rates × this, `0.01..=1000`.
    pub rate_multiplier: f64,
}

impl Default for TierShare {
    fn default() -> Self {
        TierShare {
            weight: 1,
            rate_multiplier: 1.0,
        }
    }
}

/// An operator-listed tier (`[[throttle.tiers.listed]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListedTier {
    /// A name for metrics and logs (`[a-z0-9_]`, 1-32 characters).
    pub name: String,
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default = "one_f")]
    pub rate_multiplier: f64,
    /// Hex pubkeys in this tier.
    #[serde(default)]
    pub pubkeys: Vec<String>,
}

fn one() -> u32 {
    1
}

fn one_f() -> f64 {
    1.0
}

/// The `[throttle.tiers]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TiersConfig {
    /// A connection authenticated as a pubkey no listed tier names.
    pub authenticated: TierShare,
    /// Operator-listed tiers, at most 14; a pubkey in several counts in
    /// the one of highest weight.
    pub listed: Vec<ListedTier>,
}

impl Default for TiersConfig {
    fn default() -> Self {
        TiersConfig {
            authenticated: TierShare {
                weight: 2,
                rate_multiplier: 1.0,
            },
            listed: Vec::new(),
        }
    }
}

/// Most listed tiers.
pub const MAX_LISTED_TIERS: usize = 14;

fn check_share(weight: u32, multiplier: f64) -> Result<(), ConfigError> {
    check_range("weight", f64::from(weight), 1.0, 1000.0, "in 1..=1000")?;
    check_range(
        "rate_multiplier",
        multiplier,
        0.01,
        1000.0,
        "in 0.01..=1000",
    )
}

impl TiersConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_share(
            self.authenticated.weight,
            self.authenticated.rate_multiplier,
        )
        .map_err(|e| e.within("authenticated"))?;
        if self.listed.len() > MAX_LISTED_TIERS {
            return Err(ConfigError::new(
                "listed",
                self.listed.len() as f64,
                "at most 14 tiers",
            ));
        }
        for (i, t) in self.listed.iter().enumerate() {
            let at = format!("listed[{i}]");
            check_share(t.weight, t.rate_multiplier).map_err(|e| e.within(&at))?;
            let name_ok = (1..=32).contains(&t.name.len())
                && t.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !name_ok || matches!(t.name.as_str(), "anonymous" | "authenticated") {
                return Err(ConfigError::new(
                    "name",
                    t.name.len() as f64,
                    "1-32 characters of a-z, 0-9, _ (not anonymous or authenticated)",
                )
                .within(&at));
            }
            for (j, p) in t.pubkeys.iter().enumerate() {
                if decode_pubkey(p).is_none() {
                    return Err(ConfigError::new(
                        &format!("pubkeys[{j}]"),
                        p.len() as f64,
                        "64 hex characters (the value is its length)",
                    )
                    .within(&at));
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn decode_pubkey(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = nibble(b[2 * i])? << 4 | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

/// A resolved tier: its index (0 anonymous, 1 authenticated, 2.. listed in
/// config order), name, weight and rate multiplier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    pub index: u8,
    pub name: &'static str,
    pub weight: u32,
    pub rate_multiplier: f64,
    /// Charged to its address's buckets too (anonymous, authenticated).
    pub charges_address: bool,
}

pub const ANONYMOUS: Tier = Tier {
    index: 0,
    name: "anonymous",
    weight: 1,
    rate_multiplier: 1.0,
    charges_address: true,
};

/// Who a connection's requests are charged to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Principal {
    /// The connection's address key (always charged unless the tier is listed).
    pub ip: IpAddr,
    /// The key its own buckets and its place in the query rotation use.
    pub key: ClientKey,
    pub tier: Tier,
}

impl Principal {
    /// An anonymous connection from `ip`.
    pub fn anonymous(ip: IpAddr) -> Principal {
        let ip = crate::client_key(ip);
        Principal {
            ip,
            key: ClientKey::Ip(ip),
            tier: ANONYMOUS,
        }
    }
}

/// The tiers of a config, resolved for lookups.
#[derive(Debug, Clone)]
pub struct Tiers {
    tiers: Vec<Tier>,
    by_pubkey: HashMap<[u8; 32], u8>,
}

impl Tiers {
    /// From a validated config. Names are leaked once per distinct name
    /// (a handful, at start and reload) so a [`Tier`] stays `Copy`.
    pub fn new(cfg: &TiersConfig) -> Tiers {
        let mut tiers = vec![
            ANONYMOUS,
            Tier {
                index: 1,
                name: "authenticated",
                weight: cfg.authenticated.weight,
                rate_multiplier: cfg.authenticated.rate_multiplier,
                charges_address: true,
            },
        ];
        let mut by_pubkey: HashMap<[u8; 32], u8> = HashMap::new();
        for (i, t) in cfg.listed.iter().enumerate() {
            let index = (i + 2) as u8;
            tiers.push(Tier {
                index,
                name: intern(&t.name),
                weight: t.weight,
                rate_multiplier: t.rate_multiplier,
                charges_address: false,
            });
            for p in t.pubkeys.iter().filter_map(|p| decode_pubkey(p)) {
                let slot = by_pubkey.entry(p).or_insert(index);
                if tiers[*slot as usize].weight < t.weight {
                    *slot = index;
                }
            }
        }
        Tiers { tiers, by_pubkey }
    }

    /// Every tier, by index.
    pub fn all(&self) -> &[Tier] {
        &self.tiers
    }

    /// The principal of a connection from `ip` authenticated as `pubkeys`
    /// (none: anonymous): the pubkey of the highest tier among them.
    pub fn principal(&self, ip: IpAddr, pubkeys: &[[u8; 32]]) -> Principal {
        self.principal_with(ip, pubkeys, |_| None)
    }

    /// [`Tiers::principal`], where a pubkey no tier lists may get a tier
    /// from `other` (its distance in the web of trust): a listed tier wins,
    /// then `other`'s, then authenticated.
    pub fn principal_with(
        &self,
        ip: IpAddr,
        pubkeys: &[[u8; 32]],
        other: impl Fn(&[u8; 32]) -> Option<u8>,
    ) -> Principal {
        let mut best = Principal::anonymous(ip);
        for p in pubkeys {
            let index = self
                .by_pubkey
                .get(p)
                .copied()
                .or_else(|| other(p).filter(|i| usize::from(*i) < self.tiers.len() && *i > 0))
                .unwrap_or(1);
            let tier = self.tiers[usize::from(index)];
            if best.tier.index == 0 || tier.weight > best.tier.weight {
                best = Principal {
                    ip: best.ip,
                    key: ClientKey::Pubkey(*p),
                    tier,
                };
            }
        }
        best
    }
}

/// A tier name as `&'static str`: each distinct name is leaked once.
fn intern(name: &str) -> &'static str {
    static NAMES: parking_lot::Mutex<Vec<&'static str>> = parking_lot::Mutex::new(Vec::new());
    let mut names = NAMES.lock();
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(leaked);
    leaked
}

#[cfg(test)]
mod tests;
