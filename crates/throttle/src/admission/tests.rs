//! Deterministic: the time is an argument, the maps are plain
//! [`KeyedBuckets`], and the tally records what it is told.

use std::collections::HashMap;

use super::*;
use crate::budgets::{BudgetConfig, BudgetTree, Counted as BudgetCounted};
use crate::keyed::KeyedBuckets;
use crate::tiers::{ListedTier, Tiers, TiersConfig};
use crate::trust::OutsiderRule;

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000 * MS;

/// Plain maps: per address by quota, per pubkey by (quota, tier), and
/// the authors'; every bucket taken from is logged.
struct Maps {
    cfg: ClientsConfig,
    address: HashMap<Quota, KeyedBuckets<IpAddr>>,
    pubkey: HashMap<(Quota, u8), KeyedBuckets<[u8; 32]>>,
    author: KeyedBuckets<[u8; 32]>,
    kinds: HashMap<u8, KeyedBuckets<[u8; 32]>>,
    outsiders: TokenBucket,
    /// A budget tree, when a test gives one (else the trait's default:
    /// the outsiders' bucket above).
    tree: Option<BudgetTree>,
    log: Vec<String>,
}

impl Maps {
    fn new(cfg: &ClientsConfig) -> Maps {
        let keyed = |b| KeyedBuckets::new(b, 100).unwrap();
        let address = [
            (Quota::Events, keyed(cfg.events_per_ip)),
            (Quota::Requests, keyed(cfg.reqs_per_ip)),
            (Quota::ReadCost, keyed(cfg.read_cost_per_ip)),
        ];
        Maps {
            cfg: cfg.clone(),
            address: address.into_iter().collect(),
            pubkey: HashMap::new(),
            author: KeyedBuckets::new(cfg.events_per_pubkey, 100).unwrap(),
            kinds: HashMap::new(),
            // Two EVENTs back to back, one a second.
            outsiders: TokenBucket::new(
                BucketConfig {
                    rate_per_s: 1.0,
                    burst_ratio: 1.0,
                    window_ms: 2000,
                    catch_up_ms: 0,
                },
                0,
            )
            .unwrap(),
            tree: None,
            log: Vec::new(),
        }
    }

    fn tier(&mut self, quota: Quota, tier: u8) -> &mut KeyedBuckets<[u8; 32]> {
        let cfg = &self.cfg;
        self.pubkey
            .entry((quota, tier))
            .or_insert_with(|| KeyedBuckets::new(tier_bucket(cfg, quota, 1.0), 100).unwrap())
    }

    /// Whether `cost` could be taken now (nothing is kept).
    fn could_take(&mut self, bucket: Bucket<'_>, cost: u32, now_ns: u64) -> bool {
        let ok = self.take(bucket, cost, now_ns).is_ok();
        self.log.pop();
        if ok {
            self.settle(bucket, -i64::from(cost), now_ns);
        }
        ok
    }
}

impl Buckets for Maps {
    fn take(&mut self, bucket: Bucket<'_>, cost: u32, now_ns: u64) -> Result<(), Duration> {
        let (name, r) = match bucket {
            Bucket::Address(q, ip) => (
                format!("address {q:?}"),
                self.address.get_mut(&q).unwrap().check(&ip, now_ns, cost),
            ),
            Bucket::Pubkey(q, t, p) => (
                format!("tier {t} {q:?}"),
                self.tier(q, t).check(p, now_ns, cost),
            ),
            Bucket::Author(p) => ("author".into(), self.author.check(p, now_ns, cost)),
            Bucket::AuthorKind(k, p) => {
                let b = self.cfg.kinds[usize::from(k)].bucket();
                let map = self
                    .kinds
                    .entry(k)
                    .or_insert_with(|| KeyedBuckets::new(b, 100).unwrap());
                (format!("kind class {k}"), map.check(p, now_ns, cost))
            }
            Bucket::Outsiders => ("outsiders".into(), self.outsiders.try_take(now_ns, cost)),
        };
        self.log.push(name);
        r
    }

    fn settle(&mut self, bucket: Bucket<'_>, delta: i64, now_ns: u64) {
        match bucket {
            Bucket::Address(q, ip) => self.address.get_mut(&q).unwrap().settle(&ip, now_ns, delta),
            Bucket::Pubkey(q, t, p) => self.tier(q, t).settle(p, now_ns, delta),
            Bucket::Author(p) => self.author.settle(p, now_ns, delta),
            Bucket::AuthorKind(k, p) => {
                if let Some(map) = self.kinds.get_mut(&k) {
                    map.settle(p, now_ns, delta)
                }
            }
            Bucket::Outsiders => self.outsiders.settle(now_ns, delta),
        }
    }

    fn budget(&mut self, charge: Charge, cost: u32, now_ns: u64) -> Result<(), BudgetRefusal> {
        let Some(tree) = self.tree.as_mut() else {
            return match charge {
                Charge::Outsider => {
                    (self.take(Bucket::Outsiders, cost, now_ns)).map_err(|d| BudgetRefusal {
                        retry_after: d,
                        message: OUTSIDER_TEXT,
                        outsiders: true,
                    })
                }
                _ => Ok(()),
            };
        };
        match tree.routing().node(charge) {
            Some((node, counted)) => {
                self.log.push(format!("budget {counted:?}"));
                tree.admit(node, counted, cost, now_ns)
            }
            None => Ok(()),
        }
    }
}

/// What was counted, as metric-like lines.
#[derive(Default)]
struct Counted(Vec<String>);

impl Counted {
    fn has(&self, line: &str) -> bool {
        self.0.iter().any(|l| l == line)
    }
}

impl Tally for Counted {
    fn decision(&mut self, dir: Direction, layer: Layer, action: Action, enforced: bool) {
        let (d, l, a) = (dir.as_str(), layer.as_str(), action.as_str());
        self.0.push(format!("decision {d} {l} {a} {enforced}"));
    }

    fn refused(&mut self, dir: Direction, r: &RateLimited) {
        let (d, l, c) = (dir.as_str(), r.layer.as_str(), r.cause.as_str());
        self.0.push(format!("refused {d} {l} {c}"));
    }

    fn delayed(&mut self, dir: Direction, delay: Duration) {
        let d = dir.as_str();
        self.0.push(format!("delayed {d} {}ms", delay.as_millis()));
    }

    fn connection_refused(&mut self) {
        self.0.push("connection refused".into());
    }
}

/// Request buckets of two operations back to back and one a second
/// (no catch-up); read budgets of 1,000 units, 100 a second.
fn config(mode: Mode) -> ThrottleConfig {
    let mut cfg = ThrottleConfig {
        mode,
        ..ThrottleConfig::default()
    };
    let c = &mut cfg.clients;
    let tight = BucketConfig {
        rate_per_s: 1.0,
        burst_ratio: 1.0,
        window_ms: 2000,
        catch_up_ms: 0,
    };
    let budget = BucketConfig {
        rate_per_s: 100.0,
        window_ms: 10_000,
        ..tight
    };
    (c.events_per_ip, c.reqs_per_ip, c.events_per_pubkey) = (tight, tight, tight);
    (c.read_cost_per_ip, c.read_cost_per_connection) = (budget, budget);
    c.polite_ops_per_s = 5.0;
    cfg
}

/// Buckets that never refuse: only the controller acts.
fn roomy(mode: Mode) -> ThrottleConfig {
    let mut cfg = config(mode);
    let c = &mut cfg.clients;
    let roomy = BucketConfig {
        rate_per_s: 1e6,
        ..BucketConfig::default()
    };
    (c.events_per_ip, c.reqs_per_ip, c.events_per_pubkey) = (roomy, roomy, roomy);
    cfg
}

const PUBKEY: [u8; 32] = [7; 32];
const LISTED: [u8; 32] = [9; 32];

fn ip() -> IpAddr {
    "192.0.2.1".parse().unwrap()
}

/// Authenticated weighs 2 (the default), the listed `trusted` 4.
fn tiers() -> Tiers {
    let mut cfg = TiersConfig::default();
    cfg.listed.push(ListedTier {
        name: "trusted".into(),
        weight: 4,
        rate_multiplier: 1.0,
        pubkeys: vec![LISTED.iter().map(|b| format!("{b:02x}")).collect()],
    });
    Tiers::new(&cfg)
}

/// One test's world: a config, the maps, the tally.
struct World {
    cfg: ThrottleConfig,
    maps: Maps,
    counted: Counted,
}

impl World {
    fn new(cfg: ThrottleConfig) -> World {
        World {
            maps: Maps::new(&cfg.clients),
            cfg,
            counted: Counted::default(),
        }
    }

    fn at<R>(
        &mut self,
        now_ns: u64,
        f: impl FnOnce(&mut Admission<'_, &mut Maps, &mut Counted>) -> R,
    ) -> R {
        let mut c = Admission {
            config: &self.cfg,
            buckets: &mut self.maps,
            tally: &mut self.counted,
            now_ns,
        };
        f(&mut c)
    }

    /// One EVENT of a fresh connection (the controller allows).
    fn event(&mut self, who: &Principal, now_ns: u64) -> Verdict {
        let mut pacer = ConnPacer::new(1);
        self.at(now_ns, |c| {
            c.operation(Op::Event, who, &mut pacer, Verdict::Allow)
        })
    }
}

fn refusal(v: Verdict) -> RateLimited {
    match v {
        Verdict::Refuse(r) => r,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn an_unlisted_pubkey_is_charged_to_its_pubkey_and_its_address_a_listed_one_to_its_pubkey() {
    let tiers = tiers();
    for (pubkeys, charged) in [
        (&[][..], &["address Events"][..]),
        (&[PUBKEY][..], &["address Events", "tier 1 Events"][..]),
        (&[LISTED][..], &["tier 2 Events"][..]),
    ] {
        let mut w = World::new(config(Mode::Enforce));
        let who = tiers.principal(ip(), pubkeys);
        assert_eq!(w.event(&who, 0), Verdict::Allow);
        assert_eq!(w.maps.log, charged, "{}", who.tier.name);
        assert!(w.counted.0.is_empty(), "{:?}", w.counted.0);
    }
}

#[test]
fn the_layer_that_refused_an_event_and_its_text() {
    let tiers = tiers();
    let authed = tiers.principal(ip(), &[PUBKEY]);
    let mut w = World::new(config(Mode::Enforce));
    // Two back to back; the third is refused by the address's bucket.
    assert_eq!(w.event(&authed, 0), Verdict::Allow);
    assert_eq!(w.event(&authed, 0), Verdict::Allow);
    let r = refusal(w.event(&authed, 0));
    assert_eq!((r.layer, r.cause), (Layer::IpBucket, Cause::Rate));
    assert_eq!(r.message, "too many events from your address");
    let hint = r.retry_after;
    assert!(hint > Duration::from_millis(900) && hint < Duration::from_millis(1100));
    // The same pubkey from another address: its pubkey's bucket.
    let elsewhere = tiers.principal("192.0.2.2".parse().unwrap(), &[PUBKEY]);
    let r = refusal(w.event(&elsewhere, 0));
    assert_eq!(r.layer, Layer::PubkeyBucket);
    assert_eq!(r.message, "too many events from your pubkey");
    // After its signature: the author's bucket.
    let anyone = WriteStanding::Trusted {
        distance: 1,
        tier: None,
    };
    for _ in 0..2 {
        assert_eq!(w.at(0, |c| c.author(&LISTED, 1, &anyone)), Ok(()));
    }
    let Err(AuthorRefusal::Limited(r)) = w.at(0, |c| c.author(&LISTED, 1, &anyone)) else {
        panic!("not limited")
    };
    assert_eq!(r.layer, Layer::PubkeyBucket);
    assert_eq!(r.message, "too many events from this author");
    assert_eq!(
        w.counted.0,
        [
            "decision write ip_bucket refuse true",
            "refused write ip_bucket rate",
            "decision write pubkey_bucket refuse true",
            "refused write pubkey_bucket rate",
            "decision write pubkey_bucket refuse true",
            "refused write pubkey_bucket rate",
        ]
    );
    // A second later the address has a token again.
    assert_eq!(w.event(&authed, SECOND + MS), Verdict::Allow);
}

#[test]
fn requests_take_the_same_path_with_their_own_buckets_and_texts() {
    let who = Principal::anonymous(ip());
    let mut w = World::new(config(Mode::Enforce));
    let mut pacer = ConnPacer::new(1);
    let mut req = |w: &mut World| {
        w.at(0, |c| {
            c.operation(Op::Request, &who, &mut pacer, Verdict::Allow)
        })
    };
    assert_eq!(req(&mut w), Verdict::Allow);
    assert_eq!(req(&mut w), Verdict::Allow);
    let r = refusal(req(&mut w));
    assert_eq!(r.message, "too many requests from your address");
    assert_eq!(w.maps.log, ["address Requests"; 3]);
    assert!(w.counted.has("refused read ip_bucket rate"));
    // EVENTs are metered apart.
    assert_eq!(w.event(&who, 0), Verdict::Allow);
}

#[test]
fn shadow_counts_every_decision_and_applies_none() {
    let who = Principal::anonymous(ip());
    let mut w = World::new(config(Mode::Shadow));
    for _ in 0..5 {
        assert_eq!(w.event(&who, 0), Verdict::Allow);
    }
    // Three would-be refusals, none applied (no `refused` line).
    assert_eq!(w.counted.0, ["decision write ip_bucket refuse false"; 3]);
    // The controller too: a published refusal is counted, not applied.
    let mut w = World::new(roomy(Mode::Shadow));
    let over = Verdict::refuse(Cause::OverCap, Duration::from_secs(1));
    let mut pacer = ConnPacer::new(1);
    for k in 1..=20 {
        let v = w.at(k * MS, |c| c.operation(Op::Event, &who, &mut pacer, over));
        assert_eq!(v, Verdict::Allow);
    }
    assert!(w.counted.has("decision write controller refuse false"));
    assert!(w.counted.0.iter().all(|l| !l.starts_with("refused")));
    // And the read budgets.
    let mut w = World::new(config(Mode::Shadow));
    let mut conn = TokenBucket::new(w.cfg.clients.read_cost_per_connection, 0).unwrap();
    for _ in 0..3 {
        assert_eq!(w.at(0, |c| c.read_cost(&who, &mut conn, 1000)), Ok(()));
    }
    assert!(w.counted.has("decision read read_budget_ip refuse false"));
    assert!(
        w.counted
            .has("decision read read_budget_connection refuse false")
    );
}

#[test]
fn outsiders_share_one_budget_that_the_current_work_passes_and_a_trusted_tier_has_its_own_bucket() {
    let mut w = World::new(roomy(Mode::Enforce));
    let limited = |adaptive, current| {
        WriteStanding::Outsider(OutsiderRule {
            writes: OutsiderWrites::Limited,
            floor: 0,
            current,
            adaptive,
        })
    };
    // Two outsiders' EVENTs take the shared budget, whoever signs them.
    assert_eq!(w.at(0, |c| c.outsiders(&limited(false, 0), 0)), Ok(()));
    assert_eq!(w.at(0, |c| c.outsiders(&limited(false, 0), 0)), Ok(()));
    let Err(AuthorRefusal::Limited(r)) = w.at(0, |c| c.outsiders(&limited(false, 0), 0)) else {
        panic!("the budget is spent")
    };
    assert_eq!((r.layer, r.cause), (Layer::OutsiderBudget, Cause::Rate));
    assert_eq!(r.message, OUTSIDER_TEXT);
    // Adaptive: the refusal asks for the work, and the work passes.
    assert_eq!(
        w.at(0, |c| c.outsiders(&limited(true, 9), 8)),
        Err(AuthorRefusal::Pow { required: 9 })
    );
    assert_eq!(w.at(0, |c| c.outsiders(&limited(true, 9), 9)), Ok(()));
    // Work counts only when adaptive asks for it.
    assert!(w.at(0, |c| c.outsiders(&limited(false, 9), 30)).is_err());
    // The other modes do not touch the budget here.
    let pow = WriteStanding::Outsider(OutsiderRule {
        writes: OutsiderWrites::Pow,
        floor: 0,
        current: 0,
        adaptive: false,
    });
    assert_eq!(w.at(0, |c| c.outsiders(&pow, 0)), Ok(()));
    // A trusted author with a tier: that tier's pubkey bucket.
    let tiered = WriteStanding::Trusted {
        distance: 1,
        tier: Some(2),
    };
    w.maps.log.clear();
    assert_eq!(w.at(0, |c| c.author(&[5; 32], 1, &tiered)), Ok(()));
    assert_eq!(w.maps.log, ["tier 2 Events"]);
    // After a second the budget holds one more.
    assert_eq!(w.at(SECOND, |c| c.outsiders(&limited(false, 0), 0)), Ok(()));
}

#[test]
fn a_kind_class_has_its_own_bucket_per_author_so_reactions_do_not_spend_notes() {
    let mut cfg = config(Mode::Enforce);
    cfg.clients.kinds.push(crate::config::KindLimit {
        name: "reactions".into(),
        kinds: vec![7, 6],
        rate_per_s: 1.0,
        burst_ratio: 1.0,
        window_ms: 3000,
        catch_up_ms: 0,
    });
    cfg.validate().unwrap();
    let mut w = World::new(cfg);
    let anyone = WriteStanding::Trusted {
        distance: 1,
        tier: None,
    };
    // Three reactions back to back, then the class's bucket refuses...
    for _ in 0..3 {
        assert_eq!(w.at(0, |c| c.author(&PUBKEY, 7, &anyone)), Ok(()));
    }
    assert!(w.at(0, |c| c.author(&PUBKEY, 6, &anyone)).is_err());
    // ...while the same author's notes still have their two.
    assert_eq!(w.at(0, |c| c.author(&PUBKEY, 1, &anyone)), Ok(()));
    assert_eq!(w.at(0, |c| c.author(&PUBKEY, 1, &anyone)), Ok(()));
    assert!(w.at(0, |c| c.author(&PUBKEY, 1, &anyone)).is_err());
    assert!(w.maps.log.contains(&"kind class 0".to_string()));
    // Another author's reactions are their own.
    assert_eq!(w.at(0, |c| c.author(&LISTED, 7, &anyone)), Ok(()));
}

#[test]
fn off_decides_nothing() {
    let who = Principal::anonymous(ip());
    let mut w = World::new(config(Mode::Off));
    for _ in 0..10 {
        assert_eq!(w.event(&who, 0), Verdict::Allow);
    }
    let outsider = WriteStanding::Outsider(OutsiderRule {
        writes: OutsiderWrites::Limited,
        floor: 0,
        current: 0,
        adaptive: false,
    });
    for _ in 0..10 {
        assert_eq!(w.at(0, |c| c.outsiders(&outsider, 0)), Ok(()));
    }
    let mut conn = TokenBucket::new(w.cfg.clients.read_cost_per_connection, 0).unwrap();
    for _ in 0..3 {
        assert_eq!(w.at(0, |c| c.read_cost(&who, &mut conn, 1000)), Ok(()));
    }
    assert!(w.maps.log.is_empty() && w.counted.0.is_empty());
}

#[test]
fn delays_are_divided_by_the_weight_and_polite_connections_pass() {
    let tiers = tiers();
    let delay = Verdict::Delay(Duration::from_millis(400));
    for (pubkeys, expect_ms) in [(&[][..], 400), (&[PUBKEY][..], 200), (&[LISTED][..], 100)] {
        let who = tiers.principal(ip(), pubkeys);
        let mut w = World::new(roomy(Mode::Enforce));
        // 1,000 a second: far above the polite rate (5/s × weight).
        let mut pacer = ConnPacer::new(1);
        let last = (1..=50)
            .map(|k| w.at(k * MS, |c| c.operation(Op::Event, &who, &mut pacer, delay)))
            .last();
        let expect = Duration::from_millis(expect_ms);
        assert_eq!(last, Some(Verdict::Delay(expect)), "{}", who.tier.name);
        assert!(w.counted.has(&format!("delayed write {expect_ms}ms")));
        assert!(w.counted.has("decision write controller delay true"));
        // One a second: polite, never delayed.
        let mut pacer = ConnPacer::new(1);
        for k in 1..=20 {
            let v = w.at(100 * SECOND + k * SECOND, |c| {
                c.operation(Op::Event, &who, &mut pacer, delay)
            });
            assert_eq!(v, Verdict::Allow);
        }
    }
    // Reads are never delayed.
    let who = Principal::anonymous(ip());
    let mut w = World::new(roomy(Mode::Enforce));
    let mut pacer = ConnPacer::new(1);
    for k in 1..=50 {
        let v = w.at(k * MS, |c| {
            c.operation(Op::Request, &who, &mut pacer, delay)
        });
        assert_eq!(v, Verdict::Allow);
    }
    assert!(w.counted.0.is_empty(), "{:?}", w.counted.0);
}

#[test]
fn an_emergency_refuses_even_a_polite_connection_with_the_controllers_text() {
    let who = Principal::anonymous(ip());
    let mut w = World::new(config(Mode::Enforce));
    let emergency = Verdict::refuse(Cause::Emergency, Duration::from_secs(3));
    let mut pacer = ConnPacer::new(1);
    let v = w.at(SECOND, |c| {
        c.operation(Op::Event, &who, &mut pacer, emergency)
    });
    let r = refusal(v);
    assert_eq!((r.layer, r.cause), (Layer::Controller, Cause::Emergency));
    assert_eq!(r.message, "relay memory is over its limit");
    assert_eq!(r.retry_after, Duration::from_secs(3));
    assert_eq!(
        w.counted.0,
        [
            "decision write controller refuse true",
            "refused write controller emergency"
        ]
    );
}

/// The read budgets, each refusing in turn, and what each refusal
/// gives back: a refused query leaves no charge behind.
#[test]
fn read_budgets_name_their_layer_and_refund_what_they_took() {
    let tiers = tiers();
    let authed = tiers.principal(ip(), &[PUBKEY]);
    let address = Bucket::Address(Quota::ReadCost, ip());
    let pubkey = Bucket::Pubkey(Quota::ReadCost, 1, &PUBKEY);
    let conn_budget = config(Mode::Enforce).clients.read_cost_per_connection;
    let fresh_conn = || TokenBucket::new(conn_budget, 0).unwrap();
    // A whole budget (1,000 units) can be taken only from a full one.
    let full = |w: &mut World, b| w.maps.could_take(b, 1000, 0);

    // The pubkey's budget is spent (by the same pubkey elsewhere): the
    // refusal names it, and the address gets its charge back.
    let mut w = World::new(config(Mode::Enforce));
    let elsewhere = tiers.principal("192.0.2.9".parse().unwrap(), &[PUBKEY]);
    let mut conn = fresh_conn();
    assert_eq!(
        w.at(0, |c| c.read_cost(&elsewhere, &mut conn, 1000)),
        Ok(())
    );
    let mut conn = fresh_conn();
    let r = w
        .at(0, |c| c.read_cost(&authed, &mut conn, 10))
        .unwrap_err();
    assert_eq!((r.layer, r.cause), (Layer::ReadBudgetPubkey, Cause::Rate));
    assert_eq!(r.message, "your pubkey has read too much; slow down");
    assert!(full(&mut w, address), "the address was refunded");
    assert!(w.counted.has("refused read read_budget_pubkey rate"));

    // The connection's budget is spent: address and pubkey refunded.
    let mut w = World::new(config(Mode::Enforce));
    let mut conn = fresh_conn();
    conn.try_take(0, 1000).unwrap();
    let r = w
        .at(0, |c| c.read_cost(&authed, &mut conn, 10))
        .unwrap_err();
    assert_eq!(r.layer, Layer::ReadBudgetConnection);
    assert_eq!(r.message, "this connection has read too much; slow down");
    assert!(full(&mut w, address) && full(&mut w, pubkey));

    // The address's budget is spent: nothing else is charged.
    let mut w = World::new(config(Mode::Enforce));
    w.maps.take(address, 1000, 0).unwrap();
    let mut conn = fresh_conn();
    let r = w
        .at(0, |c| c.read_cost(&authed, &mut conn, 10))
        .unwrap_err();
    assert_eq!(r.layer, Layer::ReadBudgetIp);
    assert_eq!(r.message, "your address has read too much; slow down");
    assert!(full(&mut w, pubkey));
    assert!(conn.try_take(0, 1000).is_ok(), "the connection untouched");

    // A query the scheduler refuses gets every charge back.
    let mut w = World::new(config(Mode::Enforce));
    let mut conn = fresh_conn();
    let refused: Result<(), RateLimited> = w.at(0, |c| {
        c.query(&authed, &mut conn, 400, |_| {
            Err(RateLimited::of(Cause::QueueFull, Duration::from_secs(1)))
        })
    });
    assert_eq!(refused.unwrap_err().layer, Layer::QueryScheduler);
    assert!(full(&mut w, address) && full(&mut w, pubkey));
    assert!(conn.try_take(0, 1000).is_ok(), "the connection refunded");

    // An admitted one keeps its charge until it settles.
    let mut conn = fresh_conn();
    let admitted: Result<u8, RateLimited> =
        w.at(0, |c| c.query(&authed, &mut conn, 400, |_| Ok(1)));
    assert_eq!(admitted, Ok(1));
    assert!(!full(&mut w, address) && !full(&mut w, pubkey));
    assert!(w.maps.could_take(address, 600, 0));
    w.at(0, |c| c.settle_read_cost(&authed, -400));
    assert!(full(&mut w, address) && full(&mut w, pubkey));
    // The connection settles apart (its session does it).
    assert!(conn.try_take(0, 1000).is_err());
    w.at(0, |c| c.settle_connection(&mut conn, -400));
    assert!(conn.try_take(0, 1000).is_ok());
}

/// A listed pubkey is not charged to its address's read budget.
#[test]
fn a_listed_pubkey_reads_on_its_own_budget() {
    let who = tiers().principal(ip(), &[LISTED]);
    let mut w = World::new(config(Mode::Enforce));
    let mut conn = TokenBucket::new(w.cfg.clients.read_cost_per_connection, 0).unwrap();
    assert_eq!(w.at(0, |c| c.read_cost(&who, &mut conn, 10)), Ok(()));
    assert_eq!(w.maps.log, ["tier 2 ReadCost"]);
}

#[test]
fn the_scheduler_refuses_past_its_deadline_only_when_enforced() {
    // Only the deadline bounds it: 10 ms, at the 1 us a unit assumed
    // before any step ran.
    let queries = crate::config::QueriesConfig {
        slots: crate::QuerySlots::Count(1),
        deadline_ms: 10,
        max_open_units: 1_000_000_000_000,
        max_open_units_per_client: 1_000_000_000_000,
        max_queued: 100_000,
        max_queued_per_client: 100_000,
        ..crate::config::QueriesConfig::default()
    };
    let who = Principal::anonymous(ip());
    for (mode, enforced, counted_as) in [
        (Mode::Enforce, true, "refused read query_scheduler deadline"),
        (
            Mode::Shadow,
            false,
            "decision read query_scheduler refuse false",
        ),
    ] {
        let mut w = World::new(config(mode));
        let mut sched = FairQueue::new(queries.clone()).unwrap();
        let refused = (0..20)
            .filter(|_| w.at(0, |c| c.schedule(&mut sched, &who, 1, 5_000)).is_err())
            .count();
        assert_eq!(refused > 0, enforced, "{mode:?}");
        assert!(w.counted.has(counted_as), "{:?}", w.counted.0);
        // Expiry is enforcement too.
        let expired = w.at(10 * SECOND, |c| c.expire(&mut sched));
        assert_eq!(expired.is_empty(), !enforced, "{mode:?}");
        if enforced {
            let r = w.at(0, |c| c.timed_out(&sched));
            assert_eq!((r.layer, r.cause), (Layer::QueryScheduler, Cause::Timeout));
            assert_eq!(r.retry_after, Duration::from_millis(10));
            assert!(w.counted.has("refused read query_scheduler timeout"));
        }
    }
}

#[test]
fn the_connection_cap_is_enforced_and_shadowed() {
    let mut counted = Counted::default();
    for (mode, allowed) in [
        (Mode::Enforce, false),
        (Mode::Shadow, true),
        (Mode::Off, true),
    ] {
        let mut w = World::new(config(mode));
        w.cfg.clients.max_connections_per_ip = 2;
        assert!(w.at(0, |c| c.connection(1)));
        assert_eq!(w.at(0, |c| c.connection(2)), allowed, "{mode:?}");
        counted.0.append(&mut w.counted.0);
    }
    assert_eq!(
        counted.0,
        [
            "decision read connections_per_ip refuse true",
            "connection refused",
            "decision read connections_per_ip refuse false",
        ]
    );
}

#[test]
fn rates_follow_their_directions_controller() {
    let c = ClientsConfig::default();
    let r = Rates::after(&c, 0.5, 0.0);
    assert_eq!(r.events_per_ip, c.events_per_ip.rate_per_s * 0.5);
    assert_eq!(r.reqs_per_ip, c.reqs_per_ip.rate_per_s);
    assert_eq!(r.read_cost_per_ip, c.read_cost_per_ip.rate_per_s);
    assert_eq!(
        r.tier(Quota::Events, 3.0),
        c.events_per_ip.rate_per_s * 0.5 * 3.0
    );
    let t = tier_bucket(&c, Quota::ReadCost, 2.0);
    assert_eq!(t.rate_per_s, c.read_cost_per_ip.rate_per_s * 2.0);
    assert_eq!(t.window_ms, c.read_cost_per_ip.window_ms);
}

#[test]
fn a_spent_outsider_budget_asks_for_work_only_when_adaptive_work_is_asked() {
    let limited = |adaptive, current| {
        WriteStanding::Outsider(OutsiderRule {
            writes: OutsiderWrites::Limited,
            floor: 0,
            current,
            adaptive,
        })
    };
    let mut w = World::new(roomy(Mode::Enforce));
    for _ in 0..2 {
        assert_eq!(w.at(0, |c| c.outsiders(&limited(false, 0), 0)), Ok(()));
    }
    for (adaptive, current) in [(false, 9), (true, 0), (false, 0)] {
        let refused = w.at(0, |c| c.outsiders(&limited(adaptive, current), 0));
        assert!(
            matches!(refused, Err(AuthorRefusal::Limited(_))),
            "adaptive {adaptive}, current {current}: {refused:?}"
        );
    }
    assert_eq!(
        w.at(0, |c| c.outsiders(&limited(true, 4), 0)),
        Err(AuthorRefusal::Pow { required: 4 })
    );
}

#[test]
fn off_settles_nothing() {
    let who = tiers().principal(ip(), &[PUBKEY]);
    let mut w = World::new(config(Mode::Off));
    w.at(0, |c| c.settle_read_cost(&who, 1000));
    let address = Bucket::Address(Quota::ReadCost, ip());
    let pubkey = Bucket::Pubkey(Quota::ReadCost, 1, &PUBKEY);
    assert!(w.maps.could_take(address, 1000, 0));
    assert!(w.maps.could_take(pubkey, 1000, 0));
    let mut conn = TokenBucket::new(w.cfg.clients.read_cost_per_connection, 0).unwrap();
    w.at(0, |c| c.settle_connection(&mut conn, 1000));
    assert!(conn.try_take(0, 1000).is_ok());
    // Enforced, the same settlements charge.
    let mut w = World::new(config(Mode::Enforce));
    w.at(0, |c| c.settle_read_cost(&who, 1000));
    assert!(!w.maps.could_take(address, 1, 0));
    let mut conn = TokenBucket::new(w.cfg.clients.read_cost_per_connection, 0).unwrap();
    w.at(0, |c| c.settle_connection(&mut conn, 1000));
    assert!(conn.try_take(0, 1).is_err());
}

#[test]
fn shadow_counts_a_query_past_the_deadline_not_one_at_it_and_enforce_counts_no_shadow_line() {
    let queries = crate::config::QueriesConfig {
        slots: crate::QuerySlots::Count(1),
        deadline_ms: 10,
        max_open_units: 1_000_000_000_000,
        max_open_units_per_client: 1_000_000_000_000,
        max_queued: 100_000,
        max_queued_per_client: 100_000,
        ..crate::config::QueriesConfig::default()
    };
    let who = Principal::anonymous(ip());
    let other = Principal::anonymous("192.0.2.2".parse().unwrap());
    let deadline = Duration::from_millis(10);
    let shadow_line = "decision read query_scheduler refuse false";
    // Shadow, an empty queue: nothing to count.
    let mut w = World::new(config(Mode::Shadow));
    let mut sched = FairQueue::new(queries.clone()).unwrap();
    assert!(sched.estimated_wait(&who.key) < deadline);
    w.at(0, |c| c.schedule(&mut sched, &other, 1, 1)).unwrap();
    assert!(w.counted.0.is_empty(), "{:?}", w.counted.0);
    // Raise the wait to the deadline exactly: still not past it.
    let mut sched = FairQueue::new(queries.clone()).unwrap();
    // Before any step ran a unit counts 1 us: newcomers' first steps
    // of 10,000 units in all put a new flow 10 ms behind.
    let mut n = 0u32;
    while sched.estimated_wait(&who.key) < deadline {
        n += 1;
        assert!(n < 1_000, "the wait never reached the deadline");
        let rest = (deadline - sched.estimated_wait(&who.key)).as_micros() as u64;
        let ip = IpAddr::from([10, 0, (n >> 8) as u8, n as u8]);
        let newcomer = Principal::anonymous(ip);
        w.at(0, |c| c.schedule(&mut sched, &newcomer, 1, rest.min(500)))
            .unwrap();
    }
    assert_eq!(sched.estimated_wait(&who.key), deadline);
    w.at(0, |c| c.schedule(&mut sched, &who, 1, 1)).unwrap();
    assert!(w.counted.0.is_empty(), "{:?}", w.counted.0);
    // Enforced past the deadline: a refusal, and no shadow line.
    let mut w = World::new(config(Mode::Enforce));
    let mut sched = FairQueue::new(queries).unwrap();
    let refused = (0..20)
        .filter(|_| w.at(0, |c| c.schedule(&mut sched, &who, 1, 5_000)).is_err())
        .count();
    assert!(refused > 0);
    assert!(!w.counted.has(shadow_line), "{:?}", w.counted.0);
}

#[test]
fn a_heavier_tier_is_polite_up_to_its_weight_times_the_polite_rate() {
    // Listed weighs 4: polite up to 20 a second; 15 a second passes.
    let who = tiers().principal(ip(), &[LISTED]);
    let delay = Verdict::Delay(Duration::from_millis(400));
    let mut w = World::new(roomy(Mode::Enforce));
    let mut pacer = ConnPacer::new(1);
    for k in 1..=60 {
        let v = w.at(k * 66 * MS, |c| {
            c.operation(Op::Event, &who, &mut pacer, delay)
        });
        assert_eq!(v, Verdict::Allow, "op {k}");
    }
    // Anonymous at the same pace is above its 5 a second.
    let anon = Principal::anonymous(ip());
    let mut pacer = ConnPacer::new(1);
    let last = (1..=60)
        .map(|k| {
            w.at(k * 66 * MS, |c| {
                c.operation(Op::Event, &anon, &mut pacer, delay)
            })
        })
        .last();
    assert_eq!(last, Some(delay));
}

/// Budgets of one EVENT at once, no borrowing: `anon` for anonymous
/// connections, `friends` for authors at distance 1.
fn budget_tree() -> BudgetTree {
    let budget = |name: &str, class: &str| BudgetConfig {
        name: name.into(),
        parent: None,
        class: Some(class.into()),
        rate_per_s: 0.01,
        burst: Some(1.0),
        ceil_per_s: None,
        counts: vec![BudgetCounted::Events],
    };
    let budgets = [budget("anon", "anonymous"), budget("friends", "distance:1")];
    BudgetTree::new(&budgets, &TiersConfig::default(), 50.0, 0).unwrap()
}

#[test]
fn a_class_budget_refuses_naming_itself_and_gives_back_the_leaves() {
    let who = Principal::anonymous(ip());
    let address = Bucket::Address(Quota::Events, who.ip);
    let mut w = World::new(config(Mode::Enforce));
    w.maps.tree = Some(budget_tree());
    assert_eq!(w.event(&who, 0), Verdict::Allow);
    assert_eq!(w.maps.log, ["address Events", "budget Events"]);
    // The address has a token left; the class's budget has none.
    let r = refusal(w.event(&who, 0));
    assert_eq!((r.layer, r.cause), (Layer::Budget, Cause::Rate));
    assert_eq!(r.message, "too many events for the \"anon\" budget");
    assert!(w.counted.has("refused write budget rate"));
    // What the address gave is back: it still has that token.
    assert!(w.maps.could_take(address, 1, 0));
    // Shadow: counted, not applied, nothing given back.
    let mut w = World::new(config(Mode::Shadow));
    w.maps.tree = Some(budget_tree());
    assert_eq!(w.event(&who, 0), Verdict::Allow);
    assert_eq!(w.event(&who, 0), Verdict::Allow);
    assert!(w.counted.has("decision write budget refuse false"));
    assert!(!w.maps.could_take(address, 1, 0));
}

#[test]
fn an_author_s_class_takes_its_event_after_the_signature_and_the_connection_s_does_not() {
    let who = Principal::anonymous(ip());
    let mut w = World::new(config(Mode::Enforce));
    w.maps.tree = Some(budget_tree());
    let friend = WriteStanding::Trusted {
        distance: 1,
        tier: None,
    };
    let mut pacer = ConnPacer::new(1);
    let author = AuthorClass::of(&friend, 0);
    let v = w.at(0, |c| c.event(&who, author, &mut pacer, Verdict::Allow));
    assert_eq!(v, Verdict::Allow);
    assert_eq!(w.maps.log, ["address Events"]);
    w.at(0, |c| c.author(&PUBKEY, 1, &friend)).unwrap();
    assert_eq!(w.maps.log[1..], ["author", "budget Events"]);
    // The next one of that author: the distance's budget is spent; the
    // author's bucket gets its token back.
    let r = match w.at(0, |c| c.author(&PUBKEY, 1, &friend)) {
        Err(AuthorRefusal::Limited(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.message, "too many events for the \"friends\" budget");
    assert!(w.maps.could_take(Bucket::Author(&PUBKEY), 1, 0));
    // The anonymous class was never charged: its one EVENT is still there.
    assert_eq!(w.event(&who, SECOND), Verdict::Allow);
}

/// Buckets that keep only the trait's own `budget`: the outsiders' bucket
/// answers `outsiders`, every take is logged.
struct NoTree {
    outsiders: Result<(), Duration>,
    log: Vec<(String, u32, u64)>,
}

impl Buckets for NoTree {
    fn take(&mut self, bucket: Bucket<'_>, cost: u32, now_ns: u64) -> Result<(), Duration> {
        let outsiders = matches!(bucket, Bucket::Outsiders);
        let name = if outsiders { "outsiders" } else { "other" };
        self.log.push((name.into(), cost, now_ns));
        if outsiders { self.outsiders } else { Ok(()) }
    }

    fn settle(&mut self, _: Bucket<'_>, _: i64, _: u64) {}
}

#[test]
fn without_a_tree_only_the_outsiders_charge_takes_from_the_outsiders_bucket() {
    let wait = Duration::from_millis(1500);
    let mut b = NoTree {
        outsiders: Err(wait),
        log: Vec::new(),
    };
    let others = [
        Charge::Signed(1),
        Charge::Connection {
            counted: BudgetCounted::Events,
            tier: 0,
            author: AuthorClass::Outsider,
        },
    ];
    for charge in others {
        assert_eq!(b.budget(charge, 3, 5), Ok(()), "{charge:?}");
    }
    assert!(b.log.is_empty(), "{:?}", b.log);
    let refusal = BudgetRefusal {
        retry_after: wait,
        message: OUTSIDER_TEXT,
        outsiders: true,
    };
    assert_eq!(b.budget(Charge::Outsider, 3, 5), Err(refusal));
    b.outsiders = Ok(());
    assert_eq!(b.budget(Charge::Outsider, 2, 7), Ok(()));
    assert_eq!(
        b.log,
        [("outsiders".into(), 3, 5), ("outsiders".into(), 2, 7)]
    );
}

#[test]
fn a_class_budget_s_refusal_gives_back_the_pubkey_s_token_too() {
    let tiers = tiers();
    let who = tiers.principal(ip(), &[PUBKEY]);
    let budgets = [BudgetConfig {
        name: "authed".into(),
        parent: None,
        class: Some("authenticated".into()),
        rate_per_s: 0.01,
        burst: Some(1.0),
        ceil_per_s: None,
        counts: vec![BudgetCounted::Events],
    }];
    let mut w = World::new(config(Mode::Enforce));
    w.maps.tree = Some(BudgetTree::new(&budgets, &TiersConfig::default(), 50.0, 0).unwrap());
    assert_eq!(w.event(&who, 0), Verdict::Allow);
    let r = refusal(w.event(&who, 0));
    assert_eq!(r.message, "too many events for the \"authed\" budget");
    assert_eq!(
        w.maps.log,
        ["address Events", "tier 1 Events", "budget Events"].repeat(2)
    );
    // Each bucket has the second of its two tokens back, and no more.
    let pubkey = Bucket::Pubkey(Quota::Events, 1, &PUBKEY);
    let address = Bucket::Address(Quota::Events, who.ip);
    for bucket in [pubkey, address] {
        assert!(w.maps.could_take(bucket, 1, 0));
        assert!(!w.maps.could_take(bucket, 2, 0));
    }
}
