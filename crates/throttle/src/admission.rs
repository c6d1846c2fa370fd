//! Admission of one operation, decided in one place: which limits an
//! EVENT, a REQ/COUNT or a query's read cost is checked against, in what
//! order, who is charged, what `shadow` mode does, how a tier's weight
//! scales the controller, what is refunded on a refusal, and which
//! [`Layer`] refused with which text. Pure: the config snapshot, the
//! client ([`Principal`]), the bucket maps (behind [`Buckets`]), what is
//! counted (behind [`Tally`]) and the time are arguments. The engine owns
//! the clock, the locks around the maps, the atomics the verdicts are
//! published through, and the metrics.
//!
//! Why an EVENT was refused, in order ([`Admission::operation`], then
//! [`Admission::author`] after its signature):
//! 1. its address's EVENT bucket, unless its tier is listed
//!    ([`Layer::IpBucket`], "too many events from your address");
//! 2. its pubkey's EVENT bucket of its tier, when authenticated
//!    ([`Layer::PubkeyBucket`], "too many events from your pubkey"): an
//!    unlisted authenticated pubkey is charged to both, a listed one to its
//!    pubkey's only;
//! 3. its class's budgets of `[[throttle.budgets]]` up to the root, all or
//!    nothing, giving back what 1-2 took when one refuses
//!    ([`Layer::Budget`], naming it; `admission/budgeted.rs`), unless its
//!    author's class takes it (outsiders before, a distance after the
//!    signature: docs/design.md#hierarchical-budgets);
//! 4. the write controller's published verdict as this connection's
//!    [`ConnPacer`] applies it ([`Layer::Controller`]: an emergency
//!    reaches every connection, over the cap only those above
//!    `polite_ops_per_s × weight`); a delay is divided by the weight;
//! 5. after the signature, its author's EVENT bucket
//!    ([`Layer::PubkeyBucket`], "too many events from this author"): the
//!    author's bucket of the event's kind class (`throttle.clients.kinds`)
//!    when one lists its kind, else the pubkey bucket of the tier its
//!    distance in the web of trust gives it (`trust.distance_tiers`), else
//!    the author map, then its distance's budget when there is one;
//!
//! Before the signature, on the claimed author's standing: `deny` and an
//! outsider's proof-of-work floor ([`crate::trust::before_signature`]: a
//! count of leading zero bits), then for an outsider when
//! `trust.outsider_writes` is `limited` the outsiders' shared budget
//! ([`Admission::outsiders`], [`Layer::OutsiderBudget`]), unless the event
//! carries the current adaptive proof of work; with `[pow] adaptive` the
//! refusal asks for that work (`pow:`).
//!
//! A REQ or COUNT takes steps 1-4 with its request buckets, the budgets
//! counting `requests`, and the read
//! controller (reads are refused, never delayed). Its query is then
//! charged its estimated cost ([`Admission::query`]): the address's read
//! budget (unless listed, [`Layer::ReadBudgetIp`]), the pubkey's
//! ([`Layer::ReadBudgetPubkey`]), the connection's
//! ([`Layer::ReadBudgetConnection`]), then the scheduler's bounds and
//! deadline ([`Layer::QueryScheduler`]). Whatever refuses after a budget
//! was charged gives that charge back.
//!
//! Modes: `off` decides nothing (the scheduler's bounds still hold);
//! `shadow` computes and counts every decision (`enforced = false`) and
//! applies none; `enforce` applies them. Every refusal applied is counted
//! once more as a refusal, with its layer and cause.

use std::net::IpAddr;
use std::time::Duration;

use crate::bucket::{BucketConfig, TokenBucket, scaled_rate};
use crate::budgets::tree::OUTSIDER_TEXT;
use crate::budgets::{AuthorClass, BudgetRefusal, Charge};
use crate::config::{ClientsConfig, ThrottleConfig};
use crate::connection::ConnPacer;
use crate::fair::{FairQueue, JobId};
use crate::refusal::{Cause, Layer, RateLimited};
use crate::tiers::{ClientKey, Principal};
use crate::trust::{OutsiderWrites, WriteStanding};
use crate::verdict::{Direction, Mode, Verdict};

/// What a per-client bucket meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    /// EVENTs.
    Events,
    /// REQs, COUNTs and NEG-OPENs.
    Requests,
    /// Query cost units (the read budgets).
    ReadCost,
}

/// One client's bucket in one of the maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket<'a> {
    /// The per-address map of a quota (the address is a client key: an
    /// IPv4 address or an IPv6 /64).
    Address(Quota, IpAddr),
    /// The per-pubkey map of a quota in the tier of this index (1 =
    /// authenticated, 2.. = listed).
    Pubkey(Quota, u8, &'a [u8; 32]),
    /// The per-author EVENT map.
    Author(&'a [u8; 32]),
    /// The per-author EVENT map of a kind class
    /// (`throttle.clients.kinds[index]`).
    AuthorKind(u8, &'a [u8; 32]),
    /// The one budget of every author outside the web of trust.
    Outsiders,
}

/// The bucket maps admission charges. The engine implements it over its
/// locked maps; a map that does not exist (a tier gone with a reload) takes
/// nothing and never refuses.
pub trait Buckets {
    /// Takes `cost` tokens from `bucket`, or says how long until they are
    /// there.
    fn take(&mut self, bucket: Bucket<'_>, cost: u32, now_ns: u64) -> Result<(), Duration>;
    /// Charges a positive `delta_units` (debt beyond what the bucket
    /// holds), refunds a negative one.
    fn settle(&mut self, bucket: Bucket<'_>, delta_units: i64, now_ns: u64);
    /// Takes `cost` along the budget tree's path of `charge`, all or
    /// nothing ([`crate::budgets::tree::BudgetTree::admit`]). Without a
    /// tree: the outsiders' budget ([`Bucket::Outsiders`]), nothing else.
    fn budget(&mut self, charge: Charge, cost: u32, now_ns: u64) -> Result<(), BudgetRefusal> {
        if charge != Charge::Outsider {
            return Ok(());
        }
        self.take(Bucket::Outsiders, cost, now_ns)
            .map_err(|retry_after| BudgetRefusal {
                retry_after,
                message: OUTSIDER_TEXT,
                outsiders: true,
            })
    }
}

impl<B: Buckets + ?Sized> Buckets for &mut B {
    fn take(&mut self, bucket: Bucket<'_>, cost: u32, now_ns: u64) -> Result<(), Duration> {
        (**self).take(bucket, cost, now_ns)
    }

    fn settle(&mut self, bucket: Bucket<'_>, delta_units: i64, now_ns: u64) {
        (**self).settle(bucket, delta_units, now_ns)
    }

    fn budget(&mut self, charge: Charge, cost: u32, now_ns: u64) -> Result<(), BudgetRefusal> {
        (**self).budget(charge, cost, now_ns)
    }
}

/// What a decision did (the `action` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Delay,
    Refuse,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Delay => "delay",
            Action::Refuse => "refuse",
        }
    }
}

/// What admission counts; the engine turns it into metrics.
pub trait Tally {
    /// A delay or refusal was decided, applied or not (`enforced`).
    fn decision(&mut self, dir: Direction, layer: Layer, action: Action, enforced: bool);
    /// A refusal was applied: the client is answered `rate-limited:`.
    fn refused(&mut self, dir: Direction, refusal: &RateLimited);
    /// A delay was applied.
    fn delayed(&mut self, dir: Direction, delay: Duration);
    /// A connection was refused at the per-address cap.
    fn connection_refused(&mut self);
}

/// An operation checked against a client's request buckets and a
/// controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// An EVENT, before its signature.
    Event,
    /// A REQ, COUNT or NEG-OPEN.
    Request,
}

impl Op {
    pub fn direction(self) -> Direction {
        match self {
            Op::Event => Direction::Write,
            Op::Request => Direction::Read,
        }
    }

    fn quota(self) -> Quota {
        match self {
            Op::Event => Quota::Events,
            Op::Request => Quota::Requests,
        }
    }

    /// The texts of its address's and its pubkey's bucket.
    fn texts(self) -> [&'static str; 2] {
        match self {
            Op::Event => [
                "too many events from your address",
                "too many events from your pubkey",
            ],
            Op::Request => [
                "too many requests from your address",
                "too many requests from your pubkey",
            ],
        }
    }
}

const AUTHOR_TEXT: &str = "too many events from this author";

/// Why an EVENT was refused after its signature.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthorRefusal {
    /// A bucket: `rate-limited:`.
    Limited(RateLimited),
    /// The outsiders' budget is spent, and this much work would pass it:
    /// `pow: difficulty N required`.
    Pow { required: u32 },
}

impl From<RateLimited> for AuthorRefusal {
    fn from(r: RateLimited) -> Self {
        AuthorRefusal::Limited(r)
    }
}
const READ_BUDGET_IP_TEXT: &str = "your address has read too much; slow down";
const READ_BUDGET_PUBKEY_TEXT: &str = "your pubkey has read too much; slow down";
const READ_BUDGET_CONNECTION_TEXT: &str = "this connection has read too much; slow down";

impl<T: Tally + ?Sized> Tally for &mut T {
    fn decision(&mut self, dir: Direction, layer: Layer, action: Action, enforced: bool) {
        (**self).decision(dir, layer, action, enforced)
    }

    fn refused(&mut self, dir: Direction, refusal: &RateLimited) {
        (**self).refused(dir, refusal)
    }

    fn delayed(&mut self, dir: Direction, delay: Duration) {
        (**self).delayed(dir, delay)
    }

    fn connection_refused(&mut self) {
        (**self).connection_refused()
    }
}

/// The per-client bucket rates after a governor tick: each map follows the
/// controller of its direction, `rate = base × (1 − output)`, never under
/// `min_rate_fraction` of the base (EVENTs the write controller, requests
/// and read budgets the read controller).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub events_per_ip: f64,
    pub events_per_pubkey: f64,
    pub reqs_per_ip: f64,
    pub read_cost_per_ip: f64,
    pub read_cost_per_connection: f64,
}

impl Rates {
    pub fn after(c: &ClientsConfig, write_output: f64, read_output: f64) -> Rates {
        let scaled =
            |b: &BucketConfig, output: f64| scaled_rate(b.rate_per_s, output, c.min_rate_fraction);
        Rates {
            events_per_ip: scaled(&c.events_per_ip, write_output),
            events_per_pubkey: scaled(&c.events_per_pubkey, write_output),
            reqs_per_ip: scaled(&c.reqs_per_ip, read_output),
            read_cost_per_ip: scaled(&c.read_cost_per_ip, read_output),
            read_cost_per_connection: scaled(&c.read_cost_per_connection, read_output),
        }
    }

    /// The rate of a tier's per-pubkey map: the per-address rate of its
    /// quota × the tier's rate multiplier.
    pub fn tier(&self, quota: Quota, multiplier: f64) -> f64 {
        let base = match quota {
            Quota::Events => self.events_per_ip,
            Quota::Requests => self.reqs_per_ip,
            Quota::ReadCost => self.read_cost_per_ip,
        };
        base * multiplier
    }
}

/// A tier's per-pubkey bucket of a quota: the per-address bucket's, its
/// rate × the tier's multiplier (at most 10^9 a second).
pub fn tier_bucket(c: &ClientsConfig, quota: Quota, multiplier: f64) -> BucketConfig {
    let base = match quota {
        Quota::Events => c.events_per_ip,
        Quota::Requests => c.reqs_per_ip,
        Quota::ReadCost => c.read_cost_per_ip,
    };
    BucketConfig {
        rate_per_s: (base.rate_per_s * multiplier).min(1e9),
        ..base
    }
}

/// One admission: the config snapshot it reads, the maps it charges, what
/// it counts and the time. Built per operation; holds no state of its own.
pub struct Admission<'a, B, T> {
    pub config: &'a ThrottleConfig,
    pub buckets: B,
    pub tally: T,
    pub now_ns: u64,
}

impl<B: Buckets, T: Tally> Admission<'_, B, T> {
    fn mode(&self) -> Mode {
        self.config.mode
    }

    /// An EVENT (before its signature) or a request: the client's buckets
    /// (cost 1), then the controller's verdict `published` for the
    /// operation's direction, through the connection's pacer.
    pub fn operation(
        &mut self,
        op: Op,
        who: &Principal,
        pacer: &mut ConnPacer,
        published: Verdict,
    ) -> Verdict {
        self.operation_by(op, who, AuthorClass::None, pacer, published)
    }

    /// [`Admission::operation`], an EVENT's author being of `author` (the
    /// budget tree charges an author's class instead of the connection's:
    /// docs/design.md#hierarchical-budgets).
    pub fn event(
        &mut self,
        who: &Principal,
        author: AuthorClass,
        pacer: &mut ConnPacer,
        published: Verdict,
    ) -> Verdict {
        self.operation_by(Op::Event, who, author, pacer, published)
    }

    /// The client's buckets (cost 1), its class's budgets (all given back
    /// when a budget refuses), then the controller.
    fn operation_by(
        &mut self,
        op: Op,
        who: &Principal,
        author: AuthorClass,
        pacer: &mut ConnPacer,
        published: Verdict,
    ) -> Verdict {
        if self.mode() == Mode::Off {
            return Verdict::Allow;
        }
        let dir = op.direction();
        let [address_text, pubkey_text] = op.texts();
        let charged = self.client_buckets(
            dir,
            who,
            op.quota(),
            [
                (Layer::IpBucket, address_text),
                (Layer::PubkeyBucket, pubkey_text),
            ],
            1,
        );
        let charged = charged.and_then(|()| self.class_budgets(op, who, author));
        match charged {
            Ok(()) => self.controller(dir, who, pacer, published),
            Err(r) => Verdict::Refuse(r),
        }
    }

    /// An EVENT after its signature: its author's bucket (its kind
    /// class's, else its trust tier's, else the author map).
    pub fn author(
        &mut self,
        pubkey: &[u8; 32],
        kind: u16,
        standing: &WriteStanding,
    ) -> Result<(), AuthorRefusal> {
        if self.mode() == Mode::Off {
            return Ok(());
        }
        let bucket = match (self.config.clients.kind_class(kind), standing) {
            (Some(class), _) => Bucket::AuthorKind(class, pubkey),
            (
                None,
                WriteStanding::Trusted {
                    tier: Some(tier), ..
                },
            ) => Bucket::Pubkey(Quota::Events, *tier, pubkey),
            _ => Bucket::Author(pubkey),
        };
        self.take(
            Direction::Write,
            Layer::PubkeyBucket,
            bucket,
            1,
            AUTHOR_TEXT,
        )?;
        if let WriteStanding::Trusted { distance, .. } = standing
            && let Err(r) = self.charge_budget(Direction::Write, Charge::Signed(*distance))
        {
            self.buckets.settle(bucket, -1, self.now_ns);
            return Err(r.into());
        }
        Ok(())
    }

    /// An outsider's EVENT in `limited`, before its signature: the
    /// outsiders' shared budget, which a mined event at the current
    /// adaptive difficulty passes. Before the signature because the budget
    /// is nobody's: keys are free, so an unsigned claim spends no one
    /// else's share, and a flood of strangers then costs no curve
    /// arithmetic.
    pub fn outsiders(
        &mut self,
        standing: &WriteStanding,
        difficulty: u32,
    ) -> Result<(), AuthorRefusal> {
        if self.mode() == Mode::Off {
            return Ok(());
        }
        let WriteStanding::Outsider(rule) = standing else {
            return Ok(());
        };
        if rule.writes != OutsiderWrites::Limited || rule.mined(difficulty) {
            return Ok(());
        }
        match self.charge_budget(Direction::Write, Charge::Outsider) {
            Ok(()) => Ok(()),
            Err(_) if rule.adaptive && rule.current > 0 => Err(AuthorRefusal::Pow {
                required: rule.current,
            }),
            Err(r) => Err(AuthorRefusal::Limited(r)),
        }
    }

    /// A query estimated at `estimate` units: its read cost
    /// ([`Admission::read_cost`]), then `schedule` (the scheduler's admission,
    /// [`Admission::schedule`], under the caller's lock). Whatever `schedule`
    /// refuses gets the read cost back.
    pub fn query<J, E: From<RateLimited>>(
        &mut self,
        who: &Principal,
        conn: &mut TokenBucket,
        estimate: u64,
        schedule: impl FnOnce(&mut Self) -> Result<J, E>,
    ) -> Result<J, E> {
        self.read_cost(who, conn, estimate)?;
        let admitted = schedule(self);
        if admitted.is_err() {
            let back = negative(estimate);
            self.settle_read_cost(who, back);
            self.settle_connection(conn, back);
        }
        admitted
    }

    /// Charges a query's estimated cost to the read budgets: its address's
    /// (unless the tier is listed), its pubkey's (when authenticated), its
    /// connection's `conn`. A budget that is not empty pays any estimate
    /// (the rest becomes debt when the query settles), so a large query is
    /// slowed, never refused forever. A refusal gives back what the
    /// budgets before it took.
    pub fn read_cost(
        &mut self,
        who: &Principal,
        conn: &mut TokenBucket,
        estimate: u64,
    ) -> Result<(), RateLimited> {
        if self.mode() == Mode::Off {
            return Ok(());
        }
        let cost = u32::try_from(estimate).unwrap_or(u32::MAX);
        let back = negative(estimate);
        let read = Direction::Read;
        if who.tier.charges_address {
            let bucket = Bucket::Address(Quota::ReadCost, who.ip);
            self.take(read, Layer::ReadBudgetIp, bucket, cost, READ_BUDGET_IP_TEXT)?;
        }
        if let ClientKey::Pubkey(p) = &who.key {
            let bucket = Bucket::Pubkey(Quota::ReadCost, who.tier.index, p);
            let text = READ_BUDGET_PUBKEY_TEXT;
            if let Err(r) = self.take(read, Layer::ReadBudgetPubkey, bucket, cost, text) {
                if who.tier.charges_address {
                    let address = Bucket::Address(Quota::ReadCost, who.ip);
                    self.buckets.settle(address, back, self.now_ns);
                }
                return Err(r);
            }
        }
        let taken = conn.try_take(self.now_ns, cost);
        let layer = Layer::ReadBudgetConnection;
        if let Err(r) = self.bucket_answer(read, layer, taken, READ_BUDGET_CONNECTION_TEXT) {
            self.settle_read_cost(who, back);
            return Err(r);
        }
        Ok(())
    }

    /// Settles a query's cost with its client's read budgets (not its
    /// connection's): a positive `delta_units` is charged, a negative one
    /// refunded.
    pub fn settle_read_cost(&mut self, who: &Principal, delta_units: i64) {
        if self.mode() == Mode::Off || delta_units == 0 {
            return;
        }
        if who.tier.charges_address {
            let bucket = Bucket::Address(Quota::ReadCost, who.ip);
            self.buckets.settle(bucket, delta_units, self.now_ns);
        }
        if let ClientKey::Pubkey(p) = &who.key {
            let bucket = Bucket::Pubkey(Quota::ReadCost, who.tier.index, p);
            self.buckets.settle(bucket, delta_units, self.now_ns);
        }
    }

    /// Settles a query's cost with its connection's read budget.
    pub fn settle_connection(&mut self, conn: &mut TokenBucket, delta_units: i64) {
        if self.mode() == Mode::Off || delta_units == 0 {
            return;
        }
        conn.settle(self.now_ns, delta_units);
    }

    /// The scheduler's admission of a query (its client is `who.key`,
    /// weighed by its tier): its bounds hold in every mode; its deadline
    /// only when enforced (in `shadow` a query past it is counted, not
    /// refused).
    pub fn schedule(
        &mut self,
        sched: &mut FairQueue<ClientKey>,
        who: &Principal,
        sink: u64,
        estimate: u64,
    ) -> Result<JobId, RateLimited> {
        let mode = self.mode();
        let deadline = Duration::from_millis(sched.config().deadline_ms);
        if mode == Mode::Shadow && sched.estimated_wait(&who.key) > deadline {
            let layer = Layer::QueryScheduler;
            self.tally
                .decision(Direction::Read, layer, Action::Refuse, false);
        }
        let enforce = mode == Mode::Enforce;
        let weight = who.tier.weight;
        sched
            .submit_weighted(who.key, sink, estimate, weight, self.now_ns, enforce)
            .inspect_err(|r| self.tally.refused(Direction::Read, r))
    }

    /// Drops the queries that waited past the deadline for their first
    /// step (only when enforced); each is then answered
    /// [`Admission::timed_out`].
    pub fn expire(&mut self, sched: &mut FairQueue<ClientKey>) -> Vec<JobId> {
        if self.mode() != Mode::Enforce {
            return Vec::new();
        }
        sched.expire(self.now_ns)
    }

    /// The refusal of a query [`Admission::expire`] dropped, counted.
    pub fn timed_out(&mut self, sched: &FairQueue<ClientKey>) -> RateLimited {
        let retry_after = Duration::from_millis(sched.config().deadline_ms);
        let r = RateLimited::of(Cause::Timeout, retry_after);
        self.tally.refused(Direction::Read, &r);
        r
    }

    /// A new connection from an address that has `open` connections: false
    /// when that is the cap (`clients.max_connections_per_ip`) and the mode
    /// enforces.
    pub fn connection(&mut self, open: u32) -> bool {
        let mode = self.mode();
        if mode == Mode::Off || open < self.config.clients.max_connections_per_ip {
            return true;
        }
        let enforced = mode == Mode::Enforce;
        let layer = Layer::ConnectionsPerIp;
        self.tally
            .decision(Direction::Read, layer, Action::Refuse, enforced);
        if enforced {
            self.tally.connection_refused();
        }
        !enforced
    }

    /// The per-client buckets of one operation: its address's (unless its
    /// tier is listed), then its pubkey's in its tier (when authenticated).
    fn client_buckets(
        &mut self,
        dir: Direction,
        who: &Principal,
        quota: Quota,
        [(address_layer, address_text), (pubkey_layer, pubkey_text)]: [(Layer, &'static str); 2],
        cost: u32,
    ) -> Result<(), RateLimited> {
        if who.tier.charges_address {
            let bucket = Bucket::Address(quota, who.ip);
            self.take(dir, address_layer, bucket, cost, address_text)?;
        }
        if let ClientKey::Pubkey(p) = &who.key {
            let bucket = Bucket::Pubkey(quota, who.tier.index, p);
            self.take(dir, pubkey_layer, bucket, cost, pubkey_text)?;
        }
        Ok(())
    }

    /// Takes `cost` from one bucket (see [`Admission::bucket_answer`]).
    fn take(
        &mut self,
        dir: Direction,
        layer: Layer,
        bucket: Bucket<'_>,
        cost: u32,
        text: &'static str,
    ) -> Result<(), RateLimited> {
        let taken = self.buckets.take(bucket, cost, self.now_ns);
        self.bucket_answer(dir, layer, taken, text)
    }

    /// A bucket's answer: an empty bucket is a refusal, counted in every
    /// mode and returned only when the mode enforces.
    fn bucket_answer(
        &mut self,
        dir: Direction,
        layer: Layer,
        taken: Result<(), Duration>,
        text: &'static str,
    ) -> Result<(), RateLimited> {
        let Err(retry_after) = taken else {
            return Ok(());
        };
        self.refusal(dir, RateLimited::bucket(layer, retry_after, text))
    }

    /// A refusal decided: counted; applied when the mode enforces.
    fn refusal(&mut self, dir: Direction, r: RateLimited) -> Result<(), RateLimited> {
        let enforced = self.mode() == Mode::Enforce;
        self.tally.decision(dir, r.layer, Action::Refuse, enforced);
        if !enforced {
            return Ok(());
        }
        self.tally.refused(dir, &r);
        Err(r)
    }

    /// The controller's say on one operation of a connection (see
    /// [`ConnPacer::check`]), counted and, when enforced, applied. A tier
    /// of weight `w` counts as polite up to `w` times the polite rate and
    /// waits `1/w` of the delay.
    fn controller(
        &mut self,
        dir: Direction,
        who: &Principal,
        pacer: &mut ConnPacer,
        published: Verdict,
    ) -> Verdict {
        let w = who.tier.weight.max(1);
        let polite = self.config.clients.polite_ops_per_s * f64::from(w);
        let d = pacer.check(dir, self.mode(), published, polite, self.now_ns);
        match d.verdict {
            Verdict::Allow => Verdict::Allow,
            Verdict::Delay(delay) => {
                let delay = delay / w;
                let layer = Layer::Controller;
                self.tally.decision(dir, layer, Action::Delay, d.enforced);
                if !d.enforced {
                    return Verdict::Allow;
                }
                self.tally.delayed(dir, delay);
                Verdict::Delay(delay)
            }
            Verdict::Refuse(r) => match self.refusal(dir, r) {
                Ok(()) => Verdict::Allow,
                Err(r) => Verdict::Refuse(r),
            },
        }
    }
}

/// `-units`, saturating.
fn negative(units: u64) -> i64 {
    -i64::try_from(units).unwrap_or(i64::MAX)
}

mod budgeted;
#[cfg(test)]
mod tests;
