//! The limiter's budget tree (`[[throttle.budgets]]`,
//! docs/design.md#hierarchical-budgets): the pure
//! `sluice_throttle::BudgetTree` behind one mutex, with its routing copied
//! beside it so that an operation whose class has no budget takes no lock
//! at all; the outsiders' budget (`trust.outsider_events_per_s`) is one of
//! its nodes.
//!
//! Hot path: one `ArcSwap` load, a table lookup, and for a class with a
//! budget one short lock around a walk up a few nodes (no allocation, no
//! I/O). The counters are the tree's own; the monitor's tick exports them
//! ([`Limiter::publish`]), so /metrics is at most one tick behind.
//!
//! A reload that changes `[[throttle.budgets]]` or `[throttle.tiers]`
//! builds a new tree, keeping each budget's counters and, when its rates,
//! burst and counts did not change, its tokens; operations admitted on the
//! old tree while the new one is built are not carried (a tick's worth at
//! most).

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_throttle::budgets::{AuthorClass, BudgetRefusal, BudgetStats, Charge, Routing};
use sluice_throttle::{BudgetTree, ConnPacer, Direction, Principal, ThrottleConfig, Verdict};

use super::{Limiter, dir_index};
use crate::metrics_names as m;

/// `trust.outsider_events_per_s` until `[trust]` is applied (its default).
pub const OUTSIDER_RATE: f64 = 50.0;

/// A tree and where each class enters it.
pub(super) struct Budgets {
    routing: Routing,
    tree: Mutex<BudgetTree>,
}

impl Budgets {
    /// From a validated section, keeping what `old` counted.
    pub(super) fn new(
        cfg: &ThrottleConfig,
        outsider_rate: f64,
        old: Option<&Budgets>,
        now_ns: u64,
    ) -> Budgets {
        let mut tree = BudgetTree::new(&cfg.budgets, &cfg.tiers, outsider_rate, now_ns)
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "budget tree refused after its check: the outsiders' budget alone");
                BudgetTree::new(&[], &cfg.tiers, outsider_rate, now_ns)
                    .unwrap_or_else(|_| unreachable!("no budgets always validate"))
            });
        if let Some(old) = old {
            tree.carry(&old.tree.lock());
        }
        Budgets {
            routing: tree.routing(),
            tree: Mutex::new(tree),
        }
    }
}

impl Limiter {
    /// One charge to the tree (the `Buckets` of admission): nothing when
    /// the charge's class has no budget at this step.
    pub(super) fn charge_budget(
        &self,
        charge: Charge,
        cost: u32,
        now_ns: u64,
    ) -> Result<(), BudgetRefusal> {
        if charge == Charge::Outsider {
            self.outsider_asks.fetch_add(1, Ordering::Relaxed);
        }
        let b = self.budgets.load();
        match b.routing.node(charge) {
            None => Ok(()),
            Some((node, counted)) => b.tree.lock().admit(node, counted, cost, now_ns),
        }
    }

    /// Admission of one EVENT before its signature, its author being of
    /// `author` (the outsiders' budget or a distance's takes it instead of
    /// the connection's class): see
    /// `sluice_throttle::admission::Admission::event`.
    pub fn admit_event(
        &self,
        who: &Principal,
        author: AuthorClass,
        pacer: &mut ConnPacer,
    ) -> Verdict {
        let write = dir_index(Direction::Write);
        let published = Verdict::from_bits(self.verdicts[write].load(Ordering::Relaxed));
        self.checks(|c| c.event(who, author, pacer, published))
    }

    /// Sets the outsiders' budget `[trust]` makes
    /// (`trust.outsider_events_per_s`, when no `outsiders` budget is
    /// written): one second's worth back to back (at least 2); it starts
    /// full.
    pub fn set_outsider_rate(&self, per_s: f64) {
        self.outsider_rate.store(per_s.to_bits(), Ordering::Relaxed);
        let now = self.now_ns();
        self.budgets
            .load()
            .tree
            .lock()
            .set_outsider_rate(per_s, now);
    }

    /// A new tree for a reloaded section (see the module docs).
    pub(super) fn rebuild_budgets(&self, cfg: &ThrottleConfig) {
        let rate = f64::from_bits(self.outsider_rate.load(Ordering::Relaxed));
        let old = self.budgets.load();
        let new = Budgets::new(cfg, rate, Some(&old), self.now_ns());
        self.budgets.store(Arc::new(new));
    }

    /// Every budget's counters and state now.
    pub fn budget_stats(&self) -> Vec<BudgetStats> {
        let now = self.now_ns();
        let b = self.budgets.load();
        let tree = b.tree.lock();
        tree.stats(now).collect()
    }

    /// The budgets' series on /metrics (each tick).
    pub(super) fn export_budgets(&self) {
        for s in self.budget_stats() {
            let budget = s.name;
            metrics::counter!(m::THROTTLE_BUDGET_ADMITTED_TOTAL, "budget" => budget)
                .absolute(s.admitted);
            metrics::counter!(m::THROTTLE_BUDGET_REFUSED_TOTAL, "budget" => budget)
                .absolute(s.refused);
            metrics::counter!(m::THROTTLE_BUDGET_BORROWED_TOTAL, "budget" => budget)
                .absolute(s.borrowed);
            metrics::gauge!(m::THROTTLE_BUDGET_TOKENS, "budget" => budget).set(s.tokens);
            for (limit, v) in [("rate", s.rate_per_s), ("ceil", s.ceil_per_s)] {
                metrics::gauge!(m::THROTTLE_BUDGET_OPERATIONS_PER_SECOND, "budget" => budget, "limit" => limit)
                    .set(v);
            }
        }
    }
}
