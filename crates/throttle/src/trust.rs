//! Web of trust (`[trust]`): who the operator's network knows, from the
//! kind-3 follow lists in the store, as a distance from the seed pubkeys
//! (0 for a seed, 1 for a pubkey a seed follows, ...), and what that
//! distance means for an EVENT's author: a tier of `[throttle.tiers]`
//! (`distance_tiers`), or an outsider, whose writes `outsider_writes`
//! decides (allow, proof of work, one small shared budget, or deny).
//!
//! [`TrustGraph`] is pure: it holds the follow lists that count (those of
//! pubkeys nearer than `max_distance`), recomputes the distances by a
//! breadth-first walk over them when one changes, and stops tracking at
//! `max_pubkeys` (the nearest first), so its memory is bounded whatever
//! the lists say. The engine feeds it (lists read from the store at start,
//! a stored kind 3 of a pubkey that counts) and publishes its distances.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};
use crate::tiers::{TiersConfig, decode_pubkey};

/// What happens to an EVENT whose author is outside the web of trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutsiderWrites {
    /// Taken like anyone's (the `[pow]` floor still applies).
    #[default]
    Allow,
    /// Taken only with a proof of work at the current difficulty.
    Pow,
    /// Taken from one budget shared by every outsider
    /// (`outsider_events_per_s`); a mined event at the current difficulty
    /// passes it when `[pow] adaptive` is on.
    Limited,
    /// Refused: `restricted: not in this relay's web of trust`.
    Deny,
}

impl OutsiderWrites {
    pub fn as_str(self) -> &'static str {
        match self {
            OutsiderWrites::Allow => "allow",
            OutsiderWrites::Pow => "pow",
            OutsiderWrites::Limited => "limited",
            OutsiderWrites::Deny => "deny",
        }
    }
}

/// The tier names of distances 1, 2, ...: a list (`["friends", "known"]`)
/// or a table by distance (`{ 1 = "friends", 2 = "known" }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DistanceTiers {
    List(Vec<String>),
    Table(BTreeMap<String, String>),
}

impl Default for DistanceTiers {
    fn default() -> Self {
        DistanceTiers::List(Vec::new())
    }
}

impl DistanceTiers {
    /// The tier name of `distance` (a seed counts as distance 1), if any.
    pub fn name(&self, distance: u8) -> Option<&str> {
        let d = distance.max(1);
        match self {
            DistanceTiers::List(l) => l.get(usize::from(d) - 1).map(String::as_str),
            DistanceTiers::Table(t) => t.get(&d.to_string()).map(String::as_str),
        }
    }

    fn entries(&self) -> Vec<(String, &str)> {
        match self {
            DistanceTiers::List(l) => l
                .iter()
                .enumerate()
                .map(|(i, n)| ((i + 1).to_string(), n.as_str()))
                .collect(),
            DistanceTiers::Table(t) => t.iter().map(|(k, v)| (k.clone(), v.as_str())).collect(),
        }
    }
}

/// The `[trust]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrustConfig {
    /// Hex pubkeys trust starts from (distance 0), usually the operator's.
    /// Empty: no web of trust, every author is an outsider.
    pub seed_pubkeys: Vec<String>,
    /// Follow hops that count, `1..=4`.
    pub max_distance: u8,
    /// The `[throttle.tiers]` tier each distance puts an author in
    /// (`"authenticated"` or a listed tier's name); a distance without one
    /// is in the web (never an outsider) at the base rates.
    pub distance_tiers: DistanceTiers,
    /// What happens to an EVENT whose author is outside the web.
    pub outsider_writes: OutsiderWrites,
    /// `limited`: EVENTs per second all outsiders together may write,
    /// `0.01..=1000000`.
    pub outsider_events_per_s: f64,
    /// Most pubkeys tracked (the nearest first), `1..=10000000`: bounds
    /// the graph's memory.
    pub max_pubkeys: usize,
    /// Most follows read from one list, `1..=100000`.
    pub max_follows_per_list: usize,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig {
            seed_pubkeys: Vec::new(),
            max_distance: 2,
            distance_tiers: DistanceTiers::default(),
            outsider_writes: OutsiderWrites::Allow,
            outsider_events_per_s: 50.0,
            max_pubkeys: 200_000,
            max_follows_per_list: 10_000,
        }
    }
}

impl TrustConfig {
    /// Checks the section against the tiers it names; the key is named as
    /// the operator writes it (`trust.max_distance`).
    pub fn validate(&self, tiers: &TiersConfig) -> Result<(), ConfigError> {
        self.validate_keys(tiers).map_err(|e| e.within("trust"))
    }

    fn validate_keys(&self, tiers: &TiersConfig) -> Result<(), ConfigError> {
        for (i, p) in self.seed_pubkeys.iter().enumerate() {
            if decode_pubkey(p).is_none() {
                return Err(ConfigError::new(
                    &format!("seed_pubkeys[{i}]"),
                    p.len() as f64,
                    "64 hex characters (the value is its length)",
                ));
            }
        }
        check_range(
            "max_distance",
            f64::from(self.max_distance),
            1.0,
            4.0,
            "in 1..=4",
        )?;
        for (d, name) in self.distance_tiers.entries() {
            let known = name == "authenticated" || tiers.listed.iter().any(|t| t.name == name);
            let distance = d.parse::<u8>().ok().filter(|d| *d >= 1);
            if !known || distance.is_none() {
                return Err(ConfigError::new(
                    &format!("distance_tiers.{d}"),
                    name.len() as f64,
                    "a distance 1..=4 naming \"authenticated\" or a [[throttle.tiers.listed]] name (the value is the name's length)",
                ));
            }
        }
        check_range(
            "outsider_events_per_s",
            self.outsider_events_per_s,
            0.01,
            1_000_000.0,
            "in 0.01..=1000000",
        )?;
        check_range(
            "max_pubkeys",
            self.max_pubkeys as f64,
            1.0,
            10_000_000.0,
            "in 1..=10000000",
        )?;
        check_range(
            "max_follows_per_list",
            self.max_follows_per_list as f64,
            1.0,
            100_000.0,
            "in 1..=100000",
        )
    }

    /// The seeds, decoded (validated keys only).
    pub fn seeds(&self) -> Vec<[u8; 32]> {
        self.seed_pubkeys
            .iter()
            .filter_map(|p| decode_pubkey(p))
            .collect()
    }

    /// Whether a web of trust is configured.
    pub fn enabled(&self) -> bool {
        !self.seed_pubkeys.is_empty()
    }
}

/// What an EVENT's author is to the web of trust, and so what its write
/// meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStanding {
    /// In the web at `distance`; charged to the pubkey buckets of `tier`
    /// (an index of [`crate::Tiers`]) when its distance names one.
    Trusted { distance: u8, tier: Option<u8> },
    /// Outside it.
    Outsider(OutsiderRule),
}

/// What an outsider's EVENT must meet now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutsiderRule {
    pub writes: OutsiderWrites,
    /// The static floor for the event's kind (`[pow]`).
    pub floor: u32,
    /// The difficulty asked now: the floor plus the adaptive bits.
    pub current: u32,
    /// Whether `[pow] adaptive` is on.
    pub adaptive: bool,
}

impl OutsiderRule {
    /// An event of `difficulty` passes the outsiders' budget: it carries
    /// the adaptive work asked now.
    pub fn mined(&self, difficulty: u32) -> bool {
        self.adaptive && self.current > 0 && difficulty >= self.current
    }
}

/// Why an EVENT was refused before its signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustRefusal {
    /// `pow: difficulty N required`.
    Pow { required: u32 },
    /// `restricted: not in this relay's web of trust`.
    NotTrusted,
}

/// The checks before the signature, on the claimed author's standing
/// (a forged claim fails the signature next): `deny`, and the proof of
/// work an outsider must carry (in `pow` and `allow` the difficulty asked
/// now, in `limited` the floor; its budget comes after the signature).
pub fn before_signature(standing: &WriteStanding, difficulty: u32) -> Result<(), TrustRefusal> {
    let WriteStanding::Outsider(rule) = standing else {
        return Ok(());
    };
    let required = match rule.writes {
        OutsiderWrites::Deny => return Err(TrustRefusal::NotTrusted),
        OutsiderWrites::Allow | OutsiderWrites::Pow => rule.current,
        OutsiderWrites::Limited => rule.floor,
    };
    if difficulty < required {
        return Err(TrustRefusal::Pow { required });
    }
    Ok(())
}

/// One pubkey's follow list as it counts: the `p` tags of its newest
/// kind 3.
#[derive(Debug, Clone)]
struct FollowList {
    created_at: u64,
    follows: Box<[[u8; 32]]>,
}

/// Why a pubkey has the distance it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Explanation {
    /// One of `seed_pubkeys`.
    Seed,
    /// Reached through this chain of follows, from a seed to the pubkey
    /// (the seed first, the pubkey last).
    Followed { path: Vec<[u8; 32]> },
    /// Not reached within `max_distance`, or past the tracking cap.
    Outside {
        /// The graph stopped at `max_pubkeys` before it had walked every
        /// list: a pubkey it did not reach may still be followed.
        truncated: bool,
    },
}

/// The web of trust: the follow lists that count and the distances they
/// give. Pure; deterministic for the same lists.
#[derive(Debug, Clone)]
pub struct TrustGraph {
    seeds: Vec<[u8; 32]>,
    max_distance: u8,
    max_pubkeys: usize,
    max_follows: usize,
    /// Lists of pubkeys nearer than `max_distance` (only those count).
    lists: HashMap<[u8; 32], FollowList>,
    /// Distance and, but for seeds, the pubkey it was first reached from.
    reached: HashMap<[u8; 32], (u8, Option<[u8; 32]>)>,
    truncated: bool,
}

impl TrustGraph {
    pub fn new(cfg: &TrustConfig) -> TrustGraph {
        let mut g = TrustGraph {
            seeds: cfg.seeds(),
            max_distance: cfg.max_distance,
            max_pubkeys: cfg.max_pubkeys.max(1),
            max_follows: cfg.max_follows_per_list.max(1),
            lists: HashMap::new(),
            reached: HashMap::new(),
            truncated: false,
        };
        g.recompute();
        g
    }

    /// A pubkey's distance (0 for a seed), if it is in the web.
    pub fn distance(&self, pubkey: &[u8; 32]) -> Option<u8> {
        self.reached.get(pubkey).map(|(d, _)| *d)
    }

    /// Whether a kind 3 of `author` would count: the author is nearer than
    /// `max_distance`.
    pub fn counts(&self, author: &[u8; 32]) -> bool {
        self.distance(author).is_some_and(|d| d < self.max_distance)
    }

    /// Takes a kind 3 of `author` created at `created_at` following
    /// `follows`; returns whether it replaced what the graph held (then
    /// [`TrustGraph::recompute`] is due). An older list than the one held,
    /// or a list of an author that does not count, is ignored.
    pub fn offer(&mut self, author: [u8; 32], created_at: u64, follows: &[[u8; 32]]) -> bool {
        if !self.counts(&author) {
            return false;
        }
        if self
            .lists
            .get(&author)
            .is_some_and(|l| l.created_at >= created_at)
        {
            return false;
        }
        let mut f: Vec<[u8; 32]> = follows.iter().take(self.max_follows).copied().collect();
        f.sort_unstable();
        f.dedup();
        self.lists.insert(
            author,
            FollowList {
                created_at,
                follows: f.into_boxed_slice(),
            },
        );
        true
    }

    /// Walks the lists from the seeds, nearest first, up to `max_distance`
    /// and `max_pubkeys`; drops the lists of authors that no longer count.
    /// Ties between parents at the same distance go to the lowest pubkey,
    /// so the result does not depend on the order lists arrived in.
    pub fn recompute(&mut self) {
        let mut reached: HashMap<[u8; 32], (u8, Option<[u8; 32]>)> = HashMap::new();
        let mut truncated = false;
        let mut seeds = self.seeds.clone();
        seeds.sort_unstable();
        seeds.dedup();
        let mut frontier: VecDeque<[u8; 32]> = VecDeque::new();
        for s in seeds {
            if reached.len() >= self.max_pubkeys {
                truncated = true;
                break;
            }
            reached.insert(s, (0, None));
            frontier.push_back(s);
        }
        // Level by level: every parent at distance d, lowest first.
        let mut level: Vec<[u8; 32]> = frontier.drain(..).collect();
        let mut d = 0u8;
        while d < self.max_distance && !level.is_empty() && !truncated {
            level.sort_unstable();
            let mut next = Vec::new();
            'parents: for parent in &level {
                let Some(list) = self.lists.get(parent) else {
                    continue;
                };
                for f in list.follows.iter() {
                    if reached.contains_key(f) {
                        continue;
                    }
                    if reached.len() >= self.max_pubkeys {
                        truncated = true;
                        break 'parents;
                    }
                    reached.insert(*f, (d + 1, Some(*parent)));
                    next.push(*f);
                }
            }
            level = next;
            d += 1;
        }
        self.reached = reached;
        self.truncated = truncated;
        let max = self.max_distance;
        let reached = &self.reached;
        self.lists
            .retain(|a, _| reached.get(a).is_some_and(|(d, _)| *d < max));
    }

    /// Pubkeys whose lists count but are not held: the engine reads them
    /// from the store.
    pub fn missing_lists(&self) -> Vec<[u8; 32]> {
        let mut v: Vec<[u8; 32]> = self
            .reached
            .iter()
            .filter(|(pk, (d, _))| *d < self.max_distance && !self.lists.contains_key(*pk))
            .map(|(pk, _)| *pk)
            .collect();
        v.sort_unstable();
        v
    }

    /// Marks `author`'s list as read and absent (no kind 3 in the store),
    /// so [`TrustGraph::missing_lists`] stops naming it.
    pub fn no_list(&mut self, author: [u8; 32]) {
        if self.counts(&author) {
            self.lists.entry(author).or_insert(FollowList {
                created_at: 0,
                follows: Box::new([]),
            });
        }
    }

    /// Every pubkey in the web with its distance.
    pub fn distances(&self) -> HashMap<[u8; 32], u8> {
        self.reached.iter().map(|(k, (d, _))| (*k, *d)).collect()
    }

    /// Pubkeys tracked.
    pub fn len(&self) -> usize {
        self.reached.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reached.is_empty()
    }

    /// Whether the cap stopped the walk.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// Lists held, and the follows in them.
    pub fn lists(&self) -> (usize, usize) {
        (
            self.lists.len(),
            self.lists.values().map(|l| l.follows.len()).sum(),
        )
    }

    /// Why `pubkey` is or is not in the web.
    pub fn explain(&self, pubkey: &[u8; 32]) -> Explanation {
        let Some(&(d, parent)) = self.reached.get(pubkey) else {
            return Explanation::Outside {
                truncated: self.truncated,
            };
        };
        if d == 0 {
            return Explanation::Seed;
        }
        let mut path = vec![*pubkey];
        let mut at = parent;
        while let Some(p) = at {
            path.push(p);
            at = self.reached.get(&p).and_then(|(_, up)| *up);
        }
        path.reverse();
        Explanation::Followed { path }
    }
}

#[cfg(test)]
mod tests;
