use super::*;

#[test]
fn connection_cap_per_ip() {
    let mut cfg = ThrottleConfig::default();
    cfg.clients.max_connections_per_ip = 2;
    let t = Limiter::new(cfg);
    let ip: IpAddr = "192.0.2.1".parse().unwrap();
    let a = t.open_connection(ip).unwrap();
    let _b = t.open_connection(ip).unwrap();
    assert!(t.open_connection(ip).is_none());
    drop(a);
    assert!(t.open_connection(ip).is_some());
}

#[test]
fn reload_applies_the_mode_and_refuses_a_bad_section_naming_the_key() {
    let t = Limiter::new(ThrottleConfig::default());
    let mut cfg = ThrottleConfig {
        mode: sluice_throttle::Mode::Shadow,
        ..ThrottleConfig::default()
    };
    t.reload(cfg.clone()).unwrap();
    assert_eq!(t.mode(), Mode::Shadow);
    cfg.mode = sluice_throttle::Mode::Off;
    cfg.read.kp = -1.0;
    let err = t.reload(cfg).unwrap_err();
    assert!(err.starts_with("throttle.read.kp = -1"), "{err}");
    assert_eq!(t.mode(), Mode::Shadow);
}

/// A pubkey's read budget refusal is labelled as such (it was
/// `read_budget_ip`), and the address gets its charge back.
#[test]
fn the_pubkey_read_budget_names_its_own_layer() {
    let t = Limiter::new(ThrottleConfig::default());
    let ip: IpAddr = "192.0.2.1".parse().unwrap();
    let who = t.principal(ip, &[[3; 32]]);
    // Spend the pubkey's budget from another address (its address's
    // budget, charged the same, refuses first).
    let elsewhere = t.principal("192.0.2.2".parse().unwrap(), &[[3; 32]]);
    let query = |who: &Principal| {
        let mut budget = t.connection_read_budget();
        t.admit_query(who, &mut budget, 1 << 31, |_| Ok::<_, RateLimited>(()))
    };
    let spent = (0..1000).find_map(|_| query(&elsewhere).err());
    assert_eq!(spent.map(|r| r.layer), Some(Layer::ReadBudgetIp));
    let r = query(&who);
    assert_eq!(r.unwrap_err().layer, Layer::ReadBudgetPubkey);
}

use std::time::Duration;

use sluice_throttle::Governor;
use sluice_throttle::refusal::Cause;
use sluice_throttle::tiers::ListedTier;
use sluice_throttle::trust::{OutsiderRule, OutsiderWrites};

use super::test_metrics::record;

const IP: &str = "192.0.2.7";

fn ip() -> IpAddr {
    IP.parse().unwrap()
}

/// Two operations back to back, then (for ~1000 s) none: a bucket a
/// test spends exactly.
fn two_only() -> BucketConfig {
    BucketConfig {
        rate_per_s: 0.001,
        burst_ratio: 1.0,
        window_ms: 1,
        catch_up_ms: 0,
    }
}

/// Kind 7 (reactions) in a class of its own, two per author.
fn reactions() -> sluice_throttle::config::KindLimit {
    sluice_throttle::config::KindLimit {
        name: "reactions".into(),
        kinds: vec![7],
        rate_per_s: 0.001,
        burst_ratio: 1.0,
        window_ms: 1,
        catch_up_ms: 0,
    }
}

const TRUSTED: WriteStanding = WriteStanding::Trusted {
    distance: 0,
    tier: None,
};

fn limited(current: u32, adaptive: bool) -> WriteStanding {
    WriteStanding::Outsider(OutsiderRule {
        writes: OutsiderWrites::Limited,
        floor: 0,
        current,
        adaptive,
    })
}

/// `pubkey`'s events of `kind` admitted (true) or refused by its
/// author's bucket (false), `n` in a row.
fn authors(t: &Limiter, pubkey: &[u8; 32], kind: u16, n: usize) -> Vec<bool> {
    (0..n)
        .map(|_| match t.admit_author(pubkey, kind, &TRUSTED) {
            Ok(()) => true,
            Err(AuthorRefusal::Limited(r)) => {
                assert_eq!(r.layer, Layer::PubkeyBucket, "{r:?}");
                false
            }
            Err(e) => panic!("{e:?}"),
        })
        .collect()
}

fn listed(name: &str, pubkey: &[u8; 32]) -> ListedTier {
    ListedTier {
        name: name.into(),
        weight: 3,
        rate_multiplier: 1.0,
        pubkeys: vec![sluice_proto::hex32::encode(pubkey)],
    }
}

fn refused_by(v: &Verdict) -> Option<Layer> {
    match v {
        Verdict::Refuse(r) => Some(r.layer),
        _ => None,
    }
}

#[test]
fn an_authors_events_are_charged_to_its_bucket_and_a_kind_class_to_its_own() {
    let mut cfg = ThrottleConfig::default();
    cfg.clients.events_per_pubkey = two_only();
    cfg.clients.kinds = vec![reactions()];
    let t = Limiter::new(cfg);
    let (a, b) = ([1; 32], [2; 32]);
    assert_eq!(authors(&t, &a, 1, 3), [true, true, false]);
    // Reactions have their own bucket: the notes spent none of it.
    assert_eq!(authors(&t, &a, 7, 3), [true, true, false]);
    // Another author has buckets of its own.
    assert_eq!(authors(&t, &b, 7, 1), [true]);
    assert_eq!(authors(&t, &b, 1, 1), [true]);
}

#[test]
fn a_reload_rebuilds_the_kind_buckets_when_the_classes_or_the_key_bound_change() {
    let t = Limiter::new(ThrottleConfig::default());
    let a = [1; 32];
    // No class: reactions share the author's bucket (20 back to back).
    assert_eq!(authors(&t, &a, 7, 3), [true; 3]);
    let mut classes = ThrottleConfig::default();
    classes.clients.kinds = vec![reactions()];
    t.reload(classes.clone()).unwrap();
    assert_eq!(authors(&t, &a, 7, 3), [true, true, false]);
    // The same classes and bound, another change in and out of
    // `clients`: the spent bucket stays spent.
    let mut same = classes.clone();
    same.tick_ms = 250;
    same.clients.polite_ops_per_s = 3.0;
    t.reload(same.clone()).unwrap();
    assert_eq!(authors(&t, &a, 7, 1), [false]);
    // A new bound on tracked keys: the classes' maps start again.
    let mut bound = same;
    bound.clients.max_tracked_keys = 1000;
    t.reload(bound).unwrap();
    assert_eq!(authors(&t, &a, 7, 3), [true, true, false]);
}

#[test]
fn a_reload_rebuilds_the_tiers_only_when_tiers_or_clients_change() {
    let (friend, ip) = ([9; 32], ip());
    let mut cfg = ThrottleConfig::default();
    cfg.clients.events_per_ip = two_only();
    let t = Limiter::new(cfg.clone());
    assert_eq!(t.principal(ip, &[friend]).tier.index, 1);
    let mut tiers = cfg;
    tiers.tiers.listed = vec![listed("friends", &friend)];
    t.reload(tiers.clone()).unwrap();
    let who = t.principal(ip, &[friend]);
    assert_eq!((who.tier.index, who.tier.name), (2, "friends"));
    let mut pacer = t.pacer();
    let mut events = |n| -> Vec<Option<Layer>> {
        (0..n)
            .map(|_| refused_by(&t.admit(Op::Event, &who, &mut pacer)))
            .collect()
    };
    assert_eq!(events(3), [None, None, Some(Layer::PubkeyBucket)]);
    // Nothing of the tiers or the clients changed: the friend's bucket
    // is still spent.
    let mut other = tiers;
    other.tick_ms = 250;
    t.reload(other).unwrap();
    assert_eq!(events(1), [Some(Layer::PubkeyBucket)]);
}

#[test]
fn a_tiers_pubkey_buckets_are_one_per_quota() {
    let friend = [9; 32];
    let mut cfg = ThrottleConfig::default();
    // A listed tier's per-pubkey rates are the per-address ones: two
    // EVENTs, forty requests back to back.
    cfg.clients.events_per_ip = two_only();
    cfg.tiers.listed = vec![listed("friends", &friend)];
    let t = Limiter::new(cfg);
    let who = t.principal(ip(), &[friend]);
    let mut pacer = t.pacer();
    let mut admit = |op, n| -> Vec<_> {
        (0..n)
            .map(|_| refused_by(&t.admit(op, &who, &mut pacer)))
            .collect()
    };
    assert_eq!(admit(Op::Event, 3), [None, None, Some(Layer::PubkeyBucket)]);
    assert_eq!(admit(Op::Request, 3), [None, None, None]);
    // Its read budget is a third map: a query is admitted.
    let mut budget = t.connection_read_budget();
    assert!(
        t.admit_query(&who, &mut budget, 10, |_| Ok::<_, RateLimited>(()))
            .is_ok()
    );
}

#[test]
fn the_outsiders_share_one_budget_and_their_asks_are_counted() {
    let t = Limiter::new(ThrottleConfig::default());
    let outsider = limited(0, false);
    let admit = |standing: &WriteStanding, difficulty, n| -> Vec<Result<(), AuthorRefusal>> {
        (0..n)
            .map(|_| t.admit_outsider(standing, difficulty))
            .collect()
    };
    // The default budget, 50 a second.
    assert!(admit(&outsider, 0, 10).iter().all(Result::is_ok));
    assert_eq!(t.take_outsider_asks(), 10);
    t.set_outsider_rate(0.001);
    let got = admit(&outsider, 0, 3);
    assert!(got[0].is_ok() && got[1].is_ok(), "{got:?}");
    match &got[2] {
        Err(AuthorRefusal::Limited(r)) => assert_eq!(r.layer, Layer::OutsiderBudget),
        other => panic!("{other:?}"),
    }
    // The web's authors never ask.
    assert!(admit(&TRUSTED, 0, 2).iter().all(Result::is_ok));
    assert_eq!(t.take_outsider_asks(), 3);
    assert_eq!(t.take_outsider_asks(), 0);
    // With adaptive work asked: the refusal asks for it, and an event
    // carrying it passes without asking for the budget.
    let adaptive = limited(12, true);
    assert_eq!(
        admit(&adaptive, 0, 1),
        [Err(AuthorRefusal::Pow { required: 12 })]
    );
    assert_eq!(admit(&adaptive, 12, 1), [Ok(())]);
    assert_eq!(t.take_outsider_asks(), 1);
    // A new rate starts full.
    t.set_outsider_rate(0.001);
    assert!(admit(&outsider, 0, 2).iter().all(Result::is_ok));
}

#[test]
fn settled_read_costs_are_charged_and_refunded() {
    let t = Limiter::new(ThrottleConfig::default());
    for who in [t.principal(ip(), &[]), t.principal(ip(), &[[4; 32]])] {
        let query = |budget: &mut ConnReadBudget| {
            t.admit_query(&who, budget, 1, |_| Ok::<_, RateLimited>(()))
        };
        assert!(query(&mut t.connection_read_budget()).is_ok());
        // A query read far more than its estimate: its client owes it.
        t.settle_read_cost(&who, 1 << 40);
        let r = query(&mut t.connection_read_budget()).unwrap_err();
        assert_eq!(r.layer, Layer::ReadBudgetIp);
        t.settle_read_cost(&who, -(1 << 40));
        assert!(query(&mut t.connection_read_budget()).is_ok());
        // Its connection's budget likewise.
        let mut budget = t.connection_read_budget();
        t.settle_connection_read_cost(&mut budget, 1 << 40);
        let r = query(&mut budget).unwrap_err();
        assert_eq!(r.layer, Layer::ReadBudgetConnection);
        t.settle_connection_read_cost(&mut budget, -(1 << 40));
        assert!(query(&mut budget).is_ok());
    }
    // A listed pubkey is not charged to its address: its own budget
    // owes.
    let friend = [9; 32];
    let mut cfg = ThrottleConfig::default();
    cfg.tiers.listed = vec![listed("friends", &friend)];
    t.reload(cfg).unwrap();
    let who = t.principal(ip(), &[friend]);
    t.settle_read_cost(&who, 1 << 40);
    let mut budget = t.connection_read_budget();
    let r = t.admit_query(&who, &mut budget, 1, |_| Ok::<_, RateLimited>(()));
    assert_eq!(r.unwrap_err().layer, Layer::ReadBudgetPubkey);
}

#[test]
fn published_verdicts_apply_to_their_own_direction() {
    let cfg = ThrottleConfig::default();
    let t = Limiter::new(cfg.clone());
    let who = t.principal(ip(), &[]);
    let emergency = Verdict::refuse(Cause::Emergency, Duration::from_secs(3));
    let mut state = *Governor::new(cfg).unwrap().state();
    let admit = |op| refused_by(&t.admit(op, &who, &mut t.pacer()));
    state.write.verdict = emergency;
    t.publish(&state);
    assert_eq!(admit(Op::Event), Some(Layer::Controller));
    assert_eq!(admit(Op::Request), None);
    state.write.verdict = Verdict::Allow;
    state.read.verdict = emergency;
    t.publish(&state);
    assert_eq!(admit(Op::Event), None);
    assert_eq!(admit(Op::Request), Some(Layer::Controller));
    assert_eq!(t.state(), Some(state));
}

#[test]
fn decisions_refusals_delays_and_refused_connections_are_counted() {
    let mut cfg = ThrottleConfig {
        check_every_ops: 1,
        ..ThrottleConfig::default()
    };
    cfg.clients.polite_ops_per_s = 0.0;
    cfg.clients.events_per_pubkey = two_only();
    cfg.clients.max_connections_per_ip = 1;
    let t = Limiter::new(cfg.clone());
    let mut state = *Governor::new(cfg).unwrap().state();
    state.write.verdict = Verdict::Delay(Duration::from_millis(250));
    t.publish(&state);
    let ((), got) = record(|| {
        assert_eq!(authors(&t, &[1; 32], 1, 3), [true, true, false]);
        let who = t.principal(ip(), &[]);
        let v = t.admit(Op::Event, &who, &mut t.pacer());
        assert_eq!(v, Verdict::Delay(Duration::from_millis(250)));
        let _open = t.open_connection(ip()).unwrap();
        assert!(t.open_connection(ip()).is_none());
    });
    let decisions = m::THROTTLE_DECISIONS_TOTAL;
    let decision = |dir, layer, action| {
        let labels = [
            ("direction", dir),
            ("layer", layer),
            ("action", action),
            ("enforced", "true"),
        ];
        got.counter(decisions, &labels)
    };
    assert_eq!(decision("write", "pubkey_bucket", "refuse"), 1);
    assert_eq!(decision("write", "controller", "delay"), 1);
    assert_eq!(decision("read", "connections_per_ip", "refuse"), 1);
    assert_eq!(
        got.counters(decisions).len(),
        3,
        "{:?}",
        got.counters(decisions)
    );
    let refusals = m::THROTTLE_REFUSALS_TOTAL;
    let refusal = |dir, layer, reason| {
        got.counter(
            refusals,
            &[("direction", dir), ("layer", layer), ("reason", reason)],
        )
    };
    assert_eq!(refusal("write", "pubkey_bucket", "rate"), 1);
    assert_eq!(refusal("connect", "connections_per_ip", "cap"), 1);
    assert_eq!(
        got.counters(refusals).len(),
        2,
        "{:?}",
        got.counters(refusals)
    );
    let delays = got.histogram(m::THROTTLE_DELAY_APPLIED_SECONDS, &[("direction", "write")]);
    assert_eq!(delays, [0.25]);
}

#[test]
fn a_shadow_decision_is_counted_not_applied() {
    let mut cfg = ThrottleConfig {
        mode: sluice_throttle::Mode::Shadow,
        ..ThrottleConfig::default()
    };
    cfg.clients.events_per_pubkey = two_only();
    let t = Limiter::new(cfg);
    let ((), got) = record(|| assert_eq!(authors(&t, &[1; 32], 1, 3), [true; 3]));
    let labels = [
        ("direction", "write"),
        ("layer", "pubkey_bucket"),
        ("action", "refuse"),
        ("enforced", "false"),
    ];
    assert_eq!(got.counter(m::THROTTLE_DECISIONS_TOTAL, &labels), 1);
    assert!(got.counters(m::THROTTLE_REFUSALS_TOTAL).is_empty());
}

#[test]
fn the_mode_gauge_says_which_mode_is_in_force() {
    let modes = |got: &test_metrics::Recorded| {
        ["enforce", "shadow", "off"].map(|mode| got.gauge(m::THROTTLE_MODE, &[("mode", mode)]))
    };
    let (t, got) = record(|| Limiter::new(ThrottleConfig::default()));
    assert_eq!(modes(&got), [Some(1.0), Some(0.0), Some(0.0)]);
    let cfg = ThrottleConfig {
        mode: sluice_throttle::Mode::Off,
        ..ThrottleConfig::default()
    };
    let (reloaded, got) = record(|| t.reload(cfg));
    reloaded.unwrap();
    assert_eq!(modes(&got), [Some(0.0), Some(0.0), Some(1.0)]);
}

#[test]
fn the_clock_counts_from_the_throttles_start() {
    let before = Instant::now();
    let t = Limiter::new(ThrottleConfig::default());
    let built = Instant::now();
    // The monotonic clock moves on (no assertion races it).
    while built.elapsed() < Duration::from_millis(3) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let now = t.now_ns();
    assert!(now >= 3_000_000, "{now}");
    assert!(now <= before.elapsed().as_nanos() as u64, "{now}");
}

#[test]
fn the_config_is_the_section_last_applied() {
    let mut cfg = ThrottleConfig {
        tick_ms: 250,
        ..ThrottleConfig::default()
    };
    cfg.clients.max_connections_per_ip = 7;
    let t = Limiter::new(cfg.clone());
    assert_eq!(t.config(), cfg);
    cfg.clients.kinds = vec![reactions()];
    cfg.mode = sluice_throttle::Mode::Shadow;
    t.reload(cfg.clone()).unwrap();
    assert_eq!(t.config(), cfg);
    assert_eq!(t.with_config(|c| c.tick_ms), 250);
}

#[test]
fn bucket_stats_name_each_map_and_count_its_checks() {
    let mut cfg = ThrottleConfig::default();
    cfg.clients.max_tracked_keys = 1000;
    cfg.clients.events_per_ip = two_only();
    let t = Limiter::new(cfg);
    let who = t.principal(ip(), &[]);
    let mut pacer = t.pacer();
    for _ in 0..3 {
        t.admit(Op::Event, &who, &mut pacer);
    }
    for _ in 0..4 {
        t.admit(Op::Request, &who, &mut pacer);
    }
    assert_eq!(authors(&t, &[1; 32], 1, 1), [true]);
    let mut budget = t.connection_read_budget();
    assert!(
        t.admit_query(&who, &mut budget, 5, |_| Ok::<_, RateLimited>(()))
            .is_ok()
    );
    let stats = t.bucket_stats();
    let names = stats.map(|(name, _)| name);
    assert_eq!(
        names,
        [
            "events_per_ip",
            "events_per_pubkey",
            "reqs_per_ip",
            "read_cost_per_ip"
        ]
    );
    let counts = stats.map(|(_, s)| (s.keys, s.max_keys, s.allowed_total, s.refused_total));
    assert_eq!(
        counts,
        [
            (1, 1000, 2, 1),
            (1, 1000, 1, 0),
            (1, 1000, 4, 0),
            (1, 1000, 1, 0)
        ]
    );
}

#[test]
fn the_read_budget_rate_per_ip_follows_the_config_and_the_controller() {
    let mut cfg = ThrottleConfig::default();
    cfg.clients.read_cost_per_ip.rate_per_s = 1234.5;
    cfg.clients.min_rate_fraction = 0.1;
    let t = Limiter::new(cfg.clone());
    assert_eq!(t.read_cost_rate_per_ip(), 1234.5);
    let mut state = *Governor::new(cfg.clone()).unwrap().state();
    state.read.pid.output = 0.5;
    t.publish(&state);
    let want = sluice_throttle::scaled_rate(1234.5, 0.5, 0.1);
    assert!(want < 1234.5, "{want}");
    assert_eq!(t.read_cost_rate_per_ip(), want);
}

#[test]
fn a_class_budget_caps_every_address_together_and_its_counts_reach_the_metrics() {
    use sluice_throttle::budgets::{AuthorClass, BudgetConfig, Counted};
    let anon = BudgetConfig {
        name: "anon".into(),
        parent: None,
        class: Some("anonymous".into()),
        rate_per_s: 0.01,
        burst: Some(3.0),
        ceil_per_s: None,
        counts: vec![Counted::Events],
    };
    let mut cfg = ThrottleConfig {
        budgets: vec![anon.clone()],
        ..ThrottleConfig::default()
    };
    let t = Limiter::new(cfg.clone());
    let event = |ip: &str, pubkeys: &[[u8; 32]]| {
        let who = t.principal(ip.parse().unwrap(), pubkeys);
        refused_by(&t.admit_event(&who, AuthorClass::None, &mut t.pacer()))
    };
    // Three addresses, one EVENT each: the budget's burst; a fourth
    // address is refused by the budget, an authenticated client is not.
    for i in 1..=3 {
        assert_eq!(event(&format!("192.0.2.{i}"), &[]), None);
    }
    assert_eq!(event("192.0.2.4", &[]), Some(Layer::Budget));
    assert_eq!(event("192.0.2.5", &[[5; 32]]), None);
    // A reload that leaves the budget alone keeps its state and counts.
    cfg.clients.polite_ops_per_s = 6.0;
    t.reload(cfg.clone()).unwrap();
    assert_eq!(event("192.0.2.6", &[]), Some(Layer::Budget));
    let mut state = *Governor::new(cfg.clone()).unwrap().state();
    state.write.verdict = Verdict::Allow;
    let ((), got) = record(|| t.publish(&state));
    let anon_label = [("budget", "anon")];
    let counter = |name| got.counter(name, &anon_label);
    assert_eq!(counter(m::THROTTLE_BUDGET_ADMITTED_TOTAL), 3);
    assert_eq!(counter(m::THROTTLE_BUDGET_REFUSED_TOTAL), 2);
    assert_eq!(counter(m::THROTTLE_BUDGET_BORROWED_TOTAL), 0);
    let rate = [("budget", "anon"), ("limit", "rate")];
    assert_eq!(
        got.gauge(m::THROTTLE_BUDGET_OPERATIONS_PER_SECOND, &rate),
        Some(0.01)
    );
    // The outsiders' budget from [trust] is a node too.
    let outsiders = [("budget", "outsiders"), ("limit", "rate")];
    assert_eq!(
        got.gauge(m::THROTTLE_BUDGET_OPERATIONS_PER_SECOND, &outsiders),
        Some(OUTSIDER_RATE)
    );
    // A section whose children outgrow their parent is refused, naming
    // the keys; nothing changes.
    let relay = BudgetConfig {
        name: "relay".into(),
        class: None,
        rate_per_s: 0.005,
        burst: Some(3.0),
        ..anon
    };
    cfg.budgets.insert(0, relay);
    let err = t.reload(cfg).unwrap_err();
    assert!(
        err.starts_with("throttle.budgets[1].rate_per_s = 0.01 is invalid"),
        "{err}"
    );
    assert!(err.contains("throttle.budgets[0].rate_per_s"), "{err}");
    assert_eq!(t.budget_stats().len(), 2);
}

#[test]
fn the_outsiders_default_rate_is_trusts() {
    assert_eq!(
        OUTSIDER_RATE,
        sluice_throttle::TrustConfig::default().outsider_events_per_s
    );
}

#[test]
fn a_lease_runs_the_shared_maps_at_their_share_through_the_controller_ticks() {
    let mut cfg = ThrottleConfig::default();
    cfg.clients.events_per_ip.rate_per_s = 30.0;
    cfg.clients.reqs_per_ip.rate_per_s = 60.0;
    cfg.clients.events_per_pubkey.rate_per_s = 90.0;
    cfg.clients.read_cost_per_ip.rate_per_s = 1200.0;
    cfg.clients.min_rate_fraction = 0.1;
    let t = Limiter::new(cfg.clone());
    let rates = |t: &Limiter| {
        [
            t.events_ip.lock().rate_per_s(),
            t.reqs_ip.lock().rate_per_s(),
            t.events_pubkey.lock().rate_per_s(),
            t.read_cost_ip.lock().rate_per_s(),
        ]
    };
    let close = |a: [f64; 4], b: [f64; 4]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
    // At once, before any tick: a third of each shared map; the read
    // budget (not shared) untouched.
    t.set_lease_share(1.0 / 3.0);
    assert_eq!(t.lease_share(), 1.0 / 3.0);
    assert!(
        close(rates(&t), [10.0, 20.0, 30.0, 1200.0]),
        "{:?}",
        rates(&t)
    );
    // A controller tick keeps the share over its own scaling.
    let mut state = *Governor::new(cfg.clone()).unwrap().state();
    state.write.pid.output = 0.5;
    t.publish(&state);
    let half = |r: f64| sluice_throttle::scaled_rate(r, 0.5, 0.1);
    assert!(
        close(
            rates(&t),
            [half(30.0) / 3.0, 20.0, half(90.0) / 3.0, 1200.0]
        ),
        "{:?}",
        rates(&t)
    );
    // The tier maps too (events and requests, not read cost).
    for b in t.tiers.load().buckets.iter() {
        let want = sluice_throttle::admission::Rates::after(&cfg.clients, 0.5, 0.0);
        let got = b.map(Quota::Events).lock().rate_per_s();
        assert!((got - want.tier(Quota::Events, b.multiplier) / 3.0).abs() < 1e-9);
        let got = b.map(Quota::ReadCost).lock().rate_per_s();
        assert!((got - want.tier(Quota::ReadCost, b.multiplier)).abs() < 1e-9);
    }
    // Back to the full rates, at once; nonsense shares are clamped.
    t.set_lease_share(1.0);
    assert!(close(rates(&t), [half(30.0), 60.0, half(90.0), 1200.0]));
    t.set_lease_share(f64::NAN);
    assert_eq!(t.lease_share(), 1.0);
    t.set_lease_share(0.0);
    assert_eq!(t.lease_share(), 0.001);
}
