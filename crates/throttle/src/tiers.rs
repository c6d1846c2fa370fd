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
    use std::sync::{Mutex, PoisonError};
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TiersConfig {
        TiersConfig {
            authenticated: TierShare {
                weight: 2,
                rate_multiplier: 1.5,
            },
            listed: vec![
                ListedTier {
                    name: "paid".into(),
                    weight: 4,
                    rate_multiplier: 5.0,
                    pubkeys: vec!["11".repeat(32), "22".repeat(32)],
                },
                ListedTier {
                    name: "trusted".into(),
                    weight: 8,
                    rate_multiplier: 10.0,
                    pubkeys: vec!["22".repeat(32)],
                },
            ],
        }
    }

    #[test]
    fn the_highest_tier_among_the_authenticated_pubkeys_wins() {
        let tiers = Tiers::new(&cfg());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let anon = tiers.principal(ip, &[]);
        assert_eq!(anon.tier.name, "anonymous");
        assert_eq!(anon.key, ClientKey::Ip(ip));
        let unlisted = tiers.principal(ip, &[[9; 32]]);
        assert_eq!(unlisted.tier.name, "authenticated");
        assert!(unlisted.tier.charges_address);
        assert_eq!(unlisted.key, ClientKey::Pubkey([9; 32]));
        let paid = tiers.principal(ip, &[[9; 32], [0x11; 32]]);
        assert_eq!((paid.tier.name, paid.tier.weight), ("paid", 4));
        assert_eq!(paid.key, ClientKey::Pubkey([0x11; 32]));
        assert!(!paid.tier.charges_address);
        // In two tiers: the heavier.
        let both = tiers.principal(ip, &[[0x22; 32]]);
        assert_eq!(both.tier.name, "trusted");
        let order = tiers.principal(ip, &[[0x22; 32], [0x11; 32]]);
        assert_eq!(order.tier.name, "trusted", "order does not matter");
    }

    #[test]
    fn bad_tiers_are_named() {
        let mut c = cfg();
        c.listed[0].weight = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("listed[0].weight")
        );
        let mut c = cfg();
        c.listed[1].name = "Trusted!".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("listed[1].name")
        );
        let mut c = cfg();
        c.listed[1].pubkeys.push("zz".into());
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("listed[1].pubkeys")
        );
        let mut c = cfg();
        c.authenticated.rate_multiplier = 0.0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("authenticated.rate_multiplier")
        );
        assert!(cfg().validate().is_ok());
    }

    #[test]
    fn a_listed_tier_without_weight_or_multiplier_gets_one_of_each() {
        let t: ListedTier = serde_json::from_str(r#"{"name":"paid"}"#).unwrap();
        assert_eq!(t.weight, 1);
        assert_eq!(t.rate_multiplier, 1.0);
        assert!(t.pubkeys.is_empty());
    }

    #[test]
    fn fourteen_listed_tiers_are_taken_and_fifteen_refused() {
        let tier = |i: usize| ListedTier {
            name: format!("t{i}"),
            weight: 1,
            rate_multiplier: 1.0,
            pubkeys: Vec::new(),
        };
        let mut c = TiersConfig {
            listed: (0..MAX_LISTED_TIERS).map(tier).collect(),
            ..TiersConfig::default()
        };
        c.validate().unwrap();
        assert_eq!(Tiers::new(&c).all().len(), MAX_LISTED_TIERS + 2);
        c.listed.push(tier(MAX_LISTED_TIERS));
        assert_eq!(c.validate().unwrap_err().key, "listed");
    }

    #[test]
    fn a_listed_tier_may_not_take_a_built_in_name() {
        for name in ["anonymous", "authenticated"] {
            let mut c = cfg();
            c.listed[0].name = name.into();
            assert_eq!(c.validate().unwrap_err().key, "listed[0].name", "{name}");
        }
    }

    #[test]
    fn every_tier_is_listed_by_index() {
        let tiers = Tiers::new(&cfg());
        let names: Vec<(u8, &str)> = tiers.all().iter().map(|t| (t.index, t.name)).collect();
        assert_eq!(
            names,
            [
                (0, "anonymous"),
                (1, "authenticated"),
                (2, "paid"),
                (3, "trusted")
            ]
        );
    }

    #[test]
    fn a_tier_from_the_web_of_trust_must_name_a_tier_above_anonymous() {
        let tiers = Tiers::new(&cfg());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let by = |index: u8| tiers.principal_with(ip, &[[9; 32]], move |_| Some(index));
        assert_eq!(by(3).tier.name, "trusted");
        assert_eq!(by(2).tier.name, "paid");
        assert_eq!(by(1).tier.name, "authenticated");
        // Out of range, or anonymous: authenticated.
        assert_eq!(by(4).tier.name, "authenticated");
        assert_eq!(by(200).tier.name, "authenticated");
        assert_eq!(by(0).tier.name, "authenticated");
        // A listed tier wins over the web's.
        let listed = tiers.principal_with(ip, &[[0x11; 32]], |_| Some(3));
        assert_eq!(listed.tier.name, "paid");
    }

    #[test]
    fn between_tiers_of_equal_weight_the_first_pubkey_is_kept() {
        let tiers = Tiers::new(&cfg());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let p = tiers.principal(ip, &[[8; 32], [9; 32]]);
        assert_eq!(p.key, ClientKey::Pubkey([8; 32]));
        let p = tiers.principal(ip, &[[9; 32], [8; 32]]);
        assert_eq!(p.key, ClientKey::Pubkey([9; 32]));
        // A heavier tier later in the list takes over.
        let p = tiers.principal(ip, &[[9; 32], [0x11; 32], [8; 32]]);
        assert_eq!(p.key, ClientKey::Pubkey([0x11; 32]));
    }
}
