//! The budget tree at run time: one token bucket per budget, charged
//! along the path from an operation's class to the root, all or nothing
//! (docs/design.md#hierarchical-budgets).
//!
//! Each budget holds `tokens` (refilled at `rate_per_s`, up to `burst`)
//! and, when it may borrow, `ctokens` (refilled at `ceil_per_s`, up to
//! `burst`). An operation asks its class's budget, then up the path:
//! - a budget with a token of its own admits it within its guarantee: the
//!   budgets above are charged for it without a say (their children's
//!   guarantees sum within their rates, P77-3, so this is room they
//!   promised), and may go into debt by at most their burst;
//! - a budget without one that borrows, and has a token under its ceiling,
//!   passes the question to its parent: the parent's idle capacity lends
//!   it (its own token), or the parent borrows in turn; the implicit root
//!   (no `relay` budget) lends without limit;
//! - any other budget refuses, and nothing is charged anywhere.
//!
//! Decided before anything is charged, under the caller's one lock, so a
//! refusal gives back nothing because it took nothing. Invariants over any
//! window `Δt`: a budget admits at most `ceil × Δt + burst`
//! (`rate × Δt + burst` when it does not borrow); every admit of a child is
//! an admit of its parent; a parent admits at most `rate × Δt + burst +
//! debt`, the debt at most the sum of its children's bursts (tokens it
//! lent that guaranteed admits then charge on credit).
//!
//! Hot path: no allocation; a walk up the path twice (depth is small); the
//! routing of a class to its first budget is a table ([`Routing`]).

use std::time::Duration;

use super::{
    AuthorClass, BudgetConfig, Charge, Class, Counted, MAX_DISTANCE, MAX_TIERS, OUTSIDERS, ROOT,
    implicit_burst, validate,
};
use crate::error::ConfigError;
use crate::tiers::TiersConfig;

/// A budget's index in its tree.
pub type NodeId = u16;

/// The refusal text of the outsiders' budget.
pub const OUTSIDER_TEXT: &str = "too many events from outside this relay's web of trust";

/// A budget refused: when it may have room again, and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRefusal {
    pub retry_after: Duration,
    /// Names the budget (without the `rate-limited:` prefix).
    pub message: &'static str,
    /// The outsiders' budget refused.
    pub outsiders: bool,
}

/// One budget's counters and state, for /metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetStats {
    pub name: &'static str,
    /// Operations admitted with this budget on their path.
    pub admitted: u64,
    /// Operations this budget refused (counted in every mode).
    pub refused: u64,
    /// Admits beyond its own rate, on what its parent lent.
    pub borrowed: u64,
    /// Its own tokens now (negative: debt).
    pub tokens: f64,
    /// Its tokens under its ceiling now (its own tokens when it does not
    /// borrow).
    pub ceil_tokens: f64,
    pub rate_per_s: f64,
    pub ceil_per_s: f64,
}

#[derive(Debug, Clone)]
struct Node {
    name: &'static str,
    parent: Option<NodeId>,
    counts: [bool; 2],
    rate: f64,
    burst: f64,
    ceil: f64,
    tokens: f64,
    ctokens: f64,
    last_ns: u64,
    admitted: u64,
    refused: u64,
    borrowed: u64,
    /// Refusal texts by [`Counted`].
    texts: [&'static str; 2],
    outsiders: bool,
    /// Made from `[trust]`, not written.
    implicit: bool,
}

impl Node {
    fn borrows(&self) -> bool {
        self.ceil > self.rate
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns) as f64 / 1e9;
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens = (self.tokens + self.rate * dt).min(self.burst);
        self.ctokens = (self.ctokens + self.ceil * dt).min(self.burst);
    }

    fn same_shape(&self, o: &Node) -> bool {
        (self.rate, self.burst, self.ceil, self.counts) == (o.rate, o.burst, o.ceil, o.counts)
    }
}

/// Where a class's operations enter the tree: its first budget that
/// counts them, by class (`None`: nowhere, or the unlimited root).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Routing {
    outsiders: Option<NodeId>,
    distance: [Option<NodeId>; MAX_DISTANCE as usize + 1],
    tiers: [[Option<NodeId>; 2]; MAX_TIERS],
}

impl Routing {
    /// The budget a charge enters at, and what it counts there; `None`:
    /// nothing to charge at this step.
    pub fn node(&self, charge: Charge) -> Option<(NodeId, Counted)> {
        match charge {
            Charge::Outsider => Some((self.outsiders?, Counted::Events)),
            Charge::Signed(d) => Some((self.distance(d)?, Counted::Events)),
            Charge::Connection {
                counted,
                tier,
                author,
            } => {
                let by_author = match author {
                    AuthorClass::None => false,
                    AuthorClass::Outsider => self.outsiders.is_some(),
                    AuthorClass::Distance(d) => self.distance(d).is_some(),
                };
                if counted == Counted::Events && by_author {
                    return None;
                }
                self.tiers.get(usize::from(tier))?[counted.index()].map(|n| (n, counted))
            }
        }
    }

    fn distance(&self, d: u8) -> Option<NodeId> {
        *self.distance.get(usize::from(d))?
    }
}

/// The budgets of a config and their state.
#[derive(Debug, Clone)]
pub struct BudgetTree {
    routing: Routing,
    nodes: Vec<Node>,
}

impl BudgetTree {
    /// From `[[throttle.budgets]]` (validated here against `tiers`), with
    /// the outsiders' budget of `[trust]` at `outsider_rate` when none is
    /// written; every budget full at `now_ns`.
    pub fn new(
        budgets: &[BudgetConfig],
        tiers: &TiersConfig,
        outsider_rate: f64,
        now_ns: u64,
    ) -> Result<BudgetTree, ConfigError> {
        validate(budgets, tiers).map_err(|e| e.within("throttle"))?;
        let id = |name: &str| budgets.iter().position(|b| b.name == name);
        let root = id(ROOT);
        let mut nodes: Vec<Node> = budgets
            .iter()
            .map(|b| {
                let parent = match b.parent.as_deref() {
                    _ if b.name == ROOT => None,
                    None | Some(ROOT) => root,
                    Some(p) => id(p),
                };
                let class = (b.class.as_deref()).and_then(|c| Class::parse(c, tiers));
                let counts = [Counted::Events, Counted::Requests].map(|c| b.counts.contains(&c));
                node(
                    &b.name,
                    parent,
                    (b.rate_per_s, b.burst(), b.ceil()),
                    counts,
                    class,
                    now_ns,
                )
            })
            .collect();
        let classes: Vec<Option<Class>> = (budgets.iter())
            .map(|b| b.class.as_deref().and_then(|c| Class::parse(c, tiers)))
            .chain(std::iter::once(Some(Class::Outsiders)))
            .collect();
        if !classes[..budgets.len()].contains(&Some(Class::Outsiders)) {
            let shape = (outsider_rate, implicit_burst(outsider_rate), outsider_rate);
            let class = Some(Class::Outsiders);
            let mut n = node(OUTSIDERS, root, shape, [true, false], class, now_ns);
            n.implicit = true;
            nodes.push(n);
        }
        let mut tree = BudgetTree {
            routing: Routing::default(),
            nodes,
        };
        let nid = |i: usize| NodeId::try_from(i).ok();
        for (i, class) in classes.iter().enumerate().take(tree.nodes.len()) {
            match class {
                Some(Class::Outsiders) => tree.routing.outsiders = nid(i),
                Some(Class::Distance(d)) => tree.routing.distance[usize::from(*d)] = nid(i),
                _ => {}
            }
        }
        for t in 0..MAX_TIERS {
            let own = classes
                .iter()
                .position(|c| *c == Some(Class::Tier(t as u8)));
            for counted in [Counted::Events, Counted::Requests] {
                let k = counted.index();
                let start = match own {
                    Some(i) if tree.nodes[i].counts[k] => nid(i),
                    Some(i) => nid(i).and_then(|n| tree.up(n, counted)),
                    None => root.filter(|r| tree.nodes[*r].counts[k]).and_then(nid),
                };
                tree.routing.tiers[t][k] = start;
            }
        }
        Ok(tree)
    }

    /// Where each class enters; copied to be read without the tree's lock.
    pub fn routing(&self) -> Routing {
        self.routing
    }

    /// Takes `cost` for an operation entering at `start` and counted as
    /// `counted`, along the path to the root (see the module docs), or
    /// refuses naming the budget that refused; counts either way.
    pub fn admit(
        &mut self,
        start: NodeId,
        counted: Counted,
        cost: u32,
        now_ns: u64,
    ) -> Result<(), BudgetRefusal> {
        let c = f64::from(cost.max(1));
        let mut at = Some(start);
        while let Some(n) = at {
            if let Some(x) = self.nodes.get_mut(usize::from(n)) {
                x.refill(now_ns);
            }
            at = self.up(n, counted);
        }
        // Who lends: the first budget with a token of its own; `None` when
        // every budget borrowed up to the unlimited root.
        let mut lender = None;
        let mut at = Some(start);
        while let Some(n) = at {
            let Some(x) = self.nodes.get_mut(usize::from(n)) else {
                return Ok(());
            };
            if x.tokens >= c {
                lender = Some(n);
                break;
            }
            if !(x.borrows() && x.ctokens >= c) {
                x.refused += 1;
                let wait = ((c - x.tokens) / x.rate).max(0.0);
                let retry_after = Duration::from_secs_f64(wait.min(86_400.0));
                return Err(BudgetRefusal {
                    retry_after,
                    message: x.texts[counted.index()],
                    outsiders: x.outsiders,
                });
            }
            at = self.up(n, counted);
        }
        let mut lent = false;
        let mut at = Some(start);
        while let Some(n) = at {
            let Some(x) = self.nodes.get_mut(usize::from(n)) else {
                break;
            };
            lent |= lender == Some(n);
            if lent {
                x.tokens = (x.tokens - c).max(-x.burst);
            } else {
                x.borrowed += 1;
            }
            if x.borrows() {
                x.ctokens = (x.ctokens - c).max(-x.burst);
            }
            x.admitted += 1;
            at = self.up(n, counted);
        }
        Ok(())
    }

    /// Sets the outsiders' budget `[trust]` makes (when none is written):
    /// `rate` a second, a second's worth at once (at least 2); it starts
    /// full.
    pub fn set_outsider_rate(&mut self, rate: f64, now_ns: u64) {
        if let Some(x) = self.nodes.iter_mut().find(|n| n.implicit) {
            x.rate = rate;
            x.ceil = rate;
            x.burst = implicit_burst(rate);
            x.tokens = x.burst;
            x.ctokens = x.burst;
            x.last_ns = now_ns;
        }
    }

    /// Keeps what `old` counted, by name, and the tokens of each budget
    /// whose rates, burst and counts did not change (a reload).
    pub fn carry(&mut self, old: &BudgetTree) {
        for x in &mut self.nodes {
            let Some(o) = old.nodes.iter().find(|o| o.name == x.name) else {
                continue;
            };
            (x.admitted, x.refused, x.borrowed) = (o.admitted, o.refused, o.borrowed);
            if x.same_shape(o) {
                (x.tokens, x.ctokens, x.last_ns) = (o.tokens, o.ctokens, o.last_ns);
            }
        }
    }

    /// Every budget's counters and state at `now_ns` (nothing changes).
    pub fn stats(&self, now_ns: u64) -> impl Iterator<Item = BudgetStats> + '_ {
        self.nodes.iter().map(move |n| {
            let mut probe = n.clone();
            probe.refill(now_ns);
            BudgetStats {
                name: n.name,
                admitted: n.admitted,
                refused: n.refused,
                borrowed: n.borrowed,
                tokens: probe.tokens,
                ceil_tokens: if n.borrows() {
                    probe.ctokens
                } else {
                    probe.tokens
                },
                rate_per_s: n.rate,
                ceil_per_s: n.ceil,
            }
        })
    }

    /// The budget named `name`.
    pub fn id(&self, name: &str) -> Option<NodeId> {
        let i = self.nodes.iter().position(|n| n.name == name)?;
        NodeId::try_from(i).ok()
    }

    /// The parent of `n` that counts `counted` (the nearest; with a valid
    /// config it is the parent itself).
    fn up(&self, n: NodeId, counted: Counted) -> Option<NodeId> {
        let mut p = self.nodes.get(usize::from(n))?.parent;
        while let Some(x) = p {
            let node = self.nodes.get(usize::from(x))?;
            if node.counts[counted.index()] {
                return Some(x);
            }
            p = node.parent;
        }
        None
    }
}

/// A full budget of `(rate, burst, ceil)`.
fn node(
    name: &str,
    parent: Option<usize>,
    (rate, burst, ceil): (f64, f64, f64),
    counts: [bool; 2],
    class: Option<Class>,
    now_ns: u64,
) -> Node {
    let outsiders = class == Some(Class::Outsiders);
    let texts = if outsiders {
        [OUTSIDER_TEXT; 2]
    } else {
        [
            intern(&format!("too many events for the {name:?} budget")),
            intern(&format!("too many requests for the {name:?} budget")),
        ]
    };
    Node {
        name: intern(name),
        parent: parent.and_then(|p| NodeId::try_from(p).ok()),
        counts,
        rate,
        burst,
        ceil,
        tokens: burst,
        ctokens: burst,
        last_ns: now_ns,
        admitted: 0,
        refused: 0,
        borrowed: 0,
        texts,
        outsiders,
        implicit: false,
    }
}

/// A text as `&'static str`: each distinct one is leaked once (a few per
/// budget, at start and reload), so a refusal carries it without
/// allocating.
fn intern(text: &str) -> &'static str {
    static TEXTS: parking_lot::Mutex<Vec<&'static str>> = parking_lot::Mutex::new(Vec::new());
    let mut texts = TEXTS.lock();
    if let Some(t) = texts.iter().find(|t| **t == text) {
        return t;
    }
    let leaked: &'static str = Box::leak(text.to_owned().into_boxed_str());
    texts.push(leaked);
    leaked
}
