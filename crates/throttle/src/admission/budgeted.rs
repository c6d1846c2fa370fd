//! Admission's part of the budget tree (docs/design.md#hierarchical-budgets):
//! the charge of an operation's class, counted like every other limit and
//! applied only when the mode enforces. Which step charges which class is
//! [`crate::budgets`]'s rule: the outsiders' budget before the signature
//! ([`Admission::outsiders`]), an author's distance after it
//! ([`Admission::author`]), the connection's tier with its buckets
//! (here, from [`Admission::operation`]).

use super::{Admission, Buckets, Op, Tally};
use crate::budgets::{AuthorClass, Charge, Counted};
use crate::refusal::{Layer, RateLimited};
use crate::tiers::{ClientKey, Principal};
use crate::verdict::Direction;

impl<B: Buckets, T: Tally> Admission<'_, B, T> {
    /// Takes one token along the tree's path of `charge`; a refusal names
    /// its budget (the outsiders': [`Layer::OutsiderBudget`], any other:
    /// [`Layer::Budget`]).
    pub(super) fn charge_budget(
        &mut self,
        dir: Direction,
        charge: Charge,
    ) -> Result<(), RateLimited> {
        let Err(b) = self.buckets.budget(charge, 1, self.now_ns) else {
            return Ok(());
        };
        let layer = if b.outsiders {
            Layer::OutsiderBudget
        } else {
            Layer::Budget
        };
        self.refusal(dir, RateLimited::bucket(layer, b.retry_after, b.message))
    }

    /// The budgets of the connection's class, after its buckets took their
    /// token: a refusal gives those tokens back (all or nothing along the
    /// path from the leaves up).
    pub(super) fn class_budgets(
        &mut self,
        op: Op,
        who: &Principal,
        author: AuthorClass,
    ) -> Result<(), RateLimited> {
        let counted = match op {
            Op::Event => Counted::Events,
            Op::Request => Counted::Requests,
        };
        let charge = Charge::Connection {
            counted,
            tier: who.tier.index,
            author,
        };
        let refused = self.charge_budget(op.direction(), charge);
        if refused.is_err() {
            let quota = op.quota();
            if who.tier.charges_address {
                let bucket = super::Bucket::Address(quota, who.ip);
                self.buckets.settle(bucket, -1, self.now_ns);
            }
            if let ClientKey::Pubkey(p) = &who.key {
                let bucket = super::Bucket::Pubkey(quota, who.tier.index, p);
                self.buckets.settle(bucket, -1, self.now_ns);
            }
        }
        refused
    }
}
