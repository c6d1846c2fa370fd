//! Budgets in a hierarchy (`[[throttle.budgets]]`,
//! docs/design.md#hierarchical-budgets): the whole relay at the root
//! (`relay`), classes of clients under it (anonymous, authenticated, a
//! listed tier, a distance in the web of trust, the outsiders), and under
//! each class, as leaves, the per-address and per-pubkey buckets of
//! `[throttle.clients]`. Each budget is a token bucket of `rate_per_s`
//! (guaranteed) and `burst`; one whose `ceil_per_s` is above its rate may
//! borrow its parent's idle capacity up to that ceiling, as Linux's HTB
//! does.
//!
//! Which budget an operation is charged to (its class), the first that
//! matches and has a budget:
//! 1. `outsiders`: an EVENT the outsiders' budget takes
//!    (`trust.outsider_writes = "limited"`, its author outside the web of
//!    trust, without the adaptive work asked now), before its signature;
//! 2. `distance:N`: an EVENT whose author is at distance N of the web (0 a
//!    seed), after its signature (an unsigned claim spends no one's
//!    budget);
//! 3. the connection's tier: `tier:NAME`, `authenticated` or `anonymous`,
//!    checked with the connection's own buckets (EVENTs before the
//!    signature, and REQs, COUNTs and NEG-OPENs when the budget counts
//!    `requests`).
//!
//! A tier with no budget is charged to the root alone.
//!
//! Validation (P77-3): names are unique, every parent exists, no parent
//! chain loops, the children of a budget guarantee no more than it has
//! (their rates, and their bursts, sum within its own), a child counts no
//! operation its parent does not, and its ceiling is at most its
//! parent's. An error names the keys as the operator writes them.
//!
//! Without an `outsiders` budget, the outsiders' one is built from
//! `trust.outsider_events_per_s` (a second's worth at once, at least 2)
//! under the root; [`check_outsiders`] holds it to the root's rate too.
//!
//! The runtime tree is [`tree::BudgetTree`].

pub mod tree;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, check_range};
use crate::tiers::{MAX_LISTED_TIERS, TiersConfig};
use crate::trust::{OutsiderWrites, WriteStanding};

pub use tree::{BudgetRefusal, BudgetStats, BudgetTree, NodeId, Routing};

/// The name of the root: the whole relay.
pub const ROOT: &str = "relay";
/// The name of the outsiders' budget when `[trust]` makes it.
pub const OUTSIDERS: &str = "outsiders";
/// Most budgets in a tree.
pub const MAX_BUDGETS: usize = 64;
/// Tiers a connection may be in (anonymous, authenticated, listed).
pub const MAX_TIERS: usize = 2 + MAX_LISTED_TIERS;
/// Distances of the web of trust a class may name (0 a seed).
pub const MAX_DISTANCE: u8 = 4;

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Counted {
    /// EVENTs.
    Events,
    /// REQs, COUNTs and NEG-OPENs.
    Requests,
}

impl Counted {
    pub(crate) fn index(self) -> usize {
        match self {
            Counted::Events => 0,
            Counted::Requests => 1,
        }
    }
}

/// One `[[throttle.budgets]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// A name for metrics and refusals (`[a-z0-9_]`, 1-32 characters);
    /// `relay` is the root.
    pub name: String,
    /// The budget it is part of; absent: the root's child (the root has
    /// none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What it matches: `anonymous`, `authenticated`, `tier:NAME`,
    /// `distance:N`, `outsiders`; absent: a group of the budgets under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Guaranteed operations per second, `0.001..=1e9`.
    pub rate_per_s: f64,
    /// Operations at once from full, `1..=1e9`; default a second's worth
    /// (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<f64>,
    /// Most operations per second with what it borrows from its parent's
    /// idle capacity, `rate_per_s..=1e9`; default `rate_per_s` (no
    /// borrowing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceil_per_s: Option<f64>,
    /// What it counts: `events`, `requests` (default `["events"]`).
    #[serde(default = "events_only")]
    pub counts: Vec<Counted>,
}

fn events_only() -> Vec<Counted> {
    vec![Counted::Events]
}

impl BudgetConfig {
    /// `burst`, or a second's worth (at least 1).
    pub fn burst(&self) -> f64 {
        self.burst.unwrap_or(self.rate_per_s.max(1.0))
    }

    /// `ceil_per_s`, or the rate.
    pub fn ceil(&self) -> f64 {
        self.ceil_per_s.unwrap_or(self.rate_per_s)
    }

    fn counts(&self, c: Counted) -> bool {
        self.counts.contains(&c)
    }
}

/// What a class matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A connection's tier, by index (0 anonymous, 1 authenticated, 2..
    /// listed).
    Tier(u8),
    /// An EVENT's author at this distance of the web.
    Distance(u8),
    /// An EVENT the outsiders' budget takes.
    Outsiders,
}

impl Class {
    /// Parses a `class` against the listed tiers.
    pub fn parse(s: &str, tiers: &TiersConfig) -> Option<Class> {
        match s {
            "anonymous" => return Some(Class::Tier(0)),
            "authenticated" => return Some(Class::Tier(1)),
            "outsiders" => return Some(Class::Outsiders),
            _ => {}
        }
        if let Some(name) = s.strip_prefix("tier:") {
            let i = tiers.listed.iter().position(|t| t.name == name)?;
            return u8::try_from(i + 2).ok().map(Class::Tier);
        }
        let d: u8 = s.strip_prefix("distance:")?.parse().ok()?;
        (d <= MAX_DISTANCE).then_some(Class::Distance(d))
    }

    fn by_author(self) -> bool {
        !matches!(self, Class::Tier(_))
    }
}

/// What an EVENT's author makes of it in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorClass {
    /// Nothing: the connection's class decides.
    None,
    /// The outsiders' budget takes it (`limited`, unmined).
    Outsider,
    /// Its author is at this distance of the web.
    Distance(u8),
}

impl AuthorClass {
    /// From the author's standing and the event's proof of work.
    pub fn of(standing: &WriteStanding, difficulty: u32) -> AuthorClass {
        match standing {
            WriteStanding::Trusted { distance, .. } => AuthorClass::Distance(*distance),
            WriteStanding::Outsider(rule)
                if rule.writes == OutsiderWrites::Limited && !rule.mined(difficulty) =>
            {
                AuthorClass::Outsider
            }
            WriteStanding::Outsider(_) => AuthorClass::None,
        }
    }
}

/// One charge of an operation to the tree, at the step that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Before the signature: an EVENT the outsiders' budget takes.
    Outsider,
    /// After the signature: an EVENT of an author at this distance.
    Signed(u8),
    /// With the connection's buckets: what it does, its tier, and for an
    /// EVENT its author's class (an author's budget takes it instead when
    /// there is one).
    Connection {
        counted: Counted,
        tier: u8,
        author: AuthorClass,
    },
}

/// `budgets[i].key`.
fn at(i: usize, key: &str) -> String {
    format!("budgets[{i}].{key}")
}

fn invalid(key: String, value: f64, why: impl Into<Cow<'static, str>>) -> ConfigError {
    ConfigError::new(&key, value, why)
}

/// Checks `[[throttle.budgets]]` against the listed tiers; keys are
/// relative to `[throttle]` (`budgets[2].rate_per_s`).
pub fn validate(budgets: &[BudgetConfig], tiers: &TiersConfig) -> Result<(), ConfigError> {
    if budgets.len() > MAX_BUDGETS {
        let n = budgets.len() as f64;
        return Err(ConfigError::new("budgets", n, "at most 64 budgets"));
    }
    for (i, b) in budgets.iter().enumerate() {
        entry(i, b, budgets, tiers)?;
    }
    let parents = parents(budgets)?;
    for (p, parent) in budgets.iter().enumerate() {
        let children: Vec<usize> = (0..budgets.len())
            .filter(|i| parents[*i] == Some(p))
            .collect();
        conserve(p, parent, &children, budgets)?;
    }
    for (i, b) in budgets.iter().enumerate() {
        let Some(p) = parents[i] else { continue };
        let parent = &budgets[p];
        if let Some(c) = b.counts.iter().find(|c| !parent.counts(**c)) {
            return Err(invalid(
                at(i, "counts"),
                0.0,
                format!("only what its parent {:?} counts (not {c:?})", parent.name),
            ));
        }
        if b.ceil() > parent.ceil() {
            return Err(invalid(
                at(i, "ceil_per_s"),
                b.ceil(),
                format!(
                    "at most its parent {:?}'s ceiling, {}/s",
                    parent.name,
                    parent.ceil()
                ),
            ));
        }
    }
    Ok(())
}

/// One entry on its own: name, class, numbers, counts.
fn entry(
    i: usize,
    b: &BudgetConfig,
    all: &[BudgetConfig],
    tiers: &TiersConfig,
) -> Result<(), ConfigError> {
    let name_ok = (1..=32).contains(&b.name.len())
        && (b.name.bytes()).all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
    if !name_ok {
        let why = "1-32 characters of a-z, 0-9, _ (the value is the name's length)";
        return Err(invalid(at(i, "name"), b.name.len() as f64, why));
    }
    if let Some(j) = all[..i].iter().position(|o| o.name == b.name) {
        return Err(invalid(
            at(i, "name"),
            b.name.len() as f64,
            format!(
                "a name no other budget has ({:?} is budgets[{j}]'s)",
                b.name
            ),
        ));
    }
    let class = match &b.class {
        Some(c) => Some(Class::parse(c, tiers).ok_or_else(|| {
            invalid(
                at(i, "class"),
                c.len() as f64,
                "anonymous, authenticated, tier:NAME of a [[throttle.tiers.listed]], distance:0..4 or outsiders (the value is its length)",
            )
        })?),
        None => None,
    };
    if b.name == ROOT && (b.parent.is_some() || class.is_some()) {
        return Err(invalid(
            at(i, "name"),
            b.name.len() as f64,
            "the root's name: \"relay\" has no parent and no class",
        ));
    }
    if b.name == OUTSIDERS && class != Some(Class::Outsiders) {
        return Err(invalid(
            at(i, "name"),
            b.name.len() as f64,
            "the outsiders' budget's name: give it class = \"outsiders\", or another name",
        ));
    }
    if let (Some(c), Some(j)) = (&b.class, all[..i].iter().position(|o| o.class == b.class)) {
        return Err(invalid(
            at(i, "class"),
            c.len() as f64,
            format!("a class no other budget has ({c:?} is budgets[{j}]'s)"),
        ));
    }
    check_range(
        &at(i, "rate_per_s"),
        b.rate_per_s,
        0.001,
        1e9,
        "in 0.001..=1e9",
    )?;
    check_range(&at(i, "burst"), b.burst(), 1.0, 1e9, "in 1..=1e9")?;
    let ceil_why = "in rate_per_s..=1e9";
    check_range(&at(i, "ceil_per_s"), b.ceil(), b.rate_per_s, 1e9, ceil_why)?;
    if b.name == ROOT && b.ceil() != b.rate_per_s {
        let why = "the root's rate_per_s: it has no parent to borrow from";
        return Err(invalid(at(i, "ceil_per_s"), b.ceil(), why));
    }
    let dup = (b.counts.iter().enumerate()).any(|(k, c)| b.counts[..k].contains(c));
    if b.counts.is_empty() || dup {
        let why = "one or both of \"events\", \"requests\", once each";
        return Err(invalid(at(i, "counts"), b.counts.len() as f64, why));
    }
    if class.is_some_and(Class::by_author) && b.counts != [Counted::Events] {
        let why = "[\"events\"] for a class of authors (distance:N, outsiders)";
        return Err(invalid(at(i, "counts"), b.counts.len() as f64, why));
    }
    Ok(())
}

/// Each entry's parent among the entries (`None`: the root's child, or
/// the root), refusing unknown names and loops.
fn parents(budgets: &[BudgetConfig]) -> Result<Vec<Option<usize>>, ConfigError> {
    let root = budgets.iter().position(|b| b.name == ROOT);
    let mut out = Vec::with_capacity(budgets.len());
    for (i, b) in budgets.iter().enumerate() {
        let p = match b.parent.as_deref() {
            None if b.name == ROOT => None,
            None | Some(ROOT) => root,
            Some(name) => match budgets.iter().position(|o| o.name == name) {
                Some(p) => Some(p),
                None => {
                    return Err(invalid(
                        at(i, "parent"),
                        name.len() as f64,
                        format!(
                            "the name of another budget or \"relay\" (no budget is named {name:?}; the value is its length)"
                        ),
                    ));
                }
            },
        };
        out.push(p);
    }
    for start in 0..budgets.len() {
        let mut chain = vec![start];
        let mut at_ = start;
        while let Some(p) = out[at_] {
            if chain.contains(&p) {
                chain.push(p);
                let names: Vec<&str> = chain.iter().map(|j| budgets[*j].name.as_str()).collect();
                return Err(invalid(
                    at(start, "parent"),
                    0.0,
                    format!(
                        "a chain of parents that reaches \"relay\" (this one loops: {})",
                        names.join(" -> ")
                    ),
                ));
            }
            chain.push(p);
            at_ = p;
        }
    }
    Ok(out)
}

/// P77-3 for one parent: its children's rates and bursts sum within its
/// own. The error names the last child's key, and every key summed.
fn conserve(
    p: usize,
    parent: &BudgetConfig,
    children: &[usize],
    all: &[BudgetConfig],
) -> Result<(), ConfigError> {
    let Some(&last) = children.last() else {
        return Ok(());
    };
    let sum = |f: fn(&BudgetConfig) -> f64| children.iter().map(|c| f(&all[*c])).sum::<f64>();
    let keys = |key: &str| {
        let v: Vec<String> = (children.iter())
            .map(|c| format!("throttle.{}", at(*c, key)))
            .collect();
        v.join(" + ")
    };
    for (key, total, own) in [
        ("rate_per_s", sum(|b| b.rate_per_s), parent.rate_per_s),
        ("burst", sum(BudgetConfig::burst), parent.burst()),
    ] {
        if total > own * (1.0 + 1e-9) {
            let unit = if key == "burst" { "" } else { "/s" };
            return Err(invalid(
                at(last, key),
                all[last].field(key),
                format!(
                    "within its parent's: the children of {:?} guarantee {total}{unit} ({}) > its {own}{unit} (throttle.{})",
                    parent.name,
                    keys(key),
                    at(p, key)
                ),
            ));
        }
    }
    Ok(())
}

impl BudgetConfig {
    fn field(&self, key: &str) -> f64 {
        if key == "burst" {
            self.burst()
        } else {
            self.rate_per_s
        }
    }
}

/// The outsiders' budget `[trust]` makes (`outsider_events_per_s`), when
/// `limited` takes from it and no `outsiders` budget is given: it is a
/// child of the root too, so with a `relay` budget it must fit in what
/// the root's other children leave (P77-3). The key is relative to
/// `[trust]`.
pub fn check_outsiders(budgets: &[BudgetConfig], outsider_rate: f64) -> Result<(), ConfigError> {
    let explicit = (budgets.iter()).any(|b| b.class.as_deref() == Some("outsiders"));
    let Some(root) = budgets.iter().find(|b| b.name == ROOT) else {
        return Ok(());
    };
    if explicit {
        return Ok(());
    }
    let top = || {
        (budgets.iter()).filter(|b| b.name != ROOT && b.parent.as_deref().is_none_or(|p| p == ROOT))
    };
    let rates = top().map(|b| b.rate_per_s).sum::<f64>() + outsider_rate;
    let bursts = top().map(BudgetConfig::burst).sum::<f64>() + implicit_burst(outsider_rate);
    if rates > root.rate_per_s * (1.0 + 1e-9) || bursts > root.burst() * (1.0 + 1e-9) {
        return Err(ConfigError::new(
            "outsider_events_per_s",
            outsider_rate,
            format!(
                "within what the root \"relay\" budget leaves: its children and the outsiders' budget guarantee {rates}/s (burst {bursts}) > its {}/s (burst {}); give the outsiders a [[throttle.budgets]] entry with class = \"outsiders\" to place them",
                root.rate_per_s,
                root.burst()
            ),
        ));
    }
    Ok(())
}

/// The burst of the outsiders' budget `[trust]` makes: a second's worth,
/// at least 2.
pub fn implicit_burst(rate: f64) -> f64 {
    rate.max(2.0)
}

#[cfg(test)]
mod tests;
