//! Deterministic: the time is an argument (nanoseconds), as in the
//! bucket's tests; floods are one offer per class every millisecond.

use std::time::Duration;

use super::*;
use crate::tiers::ListedTier;

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000 * MS;

fn budget(
    name: &str,
    parent: Option<&str>,
    class: Option<&str>,
    (rate, burst, ceil): (f64, f64, f64),
) -> BudgetConfig {
    BudgetConfig {
        name: name.into(),
        parent: parent.map(str::to_owned),
        class: class.map(str::to_owned),
        rate_per_s: rate,
        burst: Some(burst),
        ceil_per_s: Some(ceil),
        counts: vec![Counted::Events],
    }
}

fn tree(budgets: &[BudgetConfig]) -> BudgetTree {
    BudgetTree::new(budgets, &TiersConfig::default(), 50.0, 0).unwrap()
}

/// The entry of a connection's EVENT of tier `tier`.
fn conn(t: &BudgetTree, tier: u8) -> (NodeId, Counted) {
    let charge = Charge::Connection {
        counted: Counted::Events,
        tier,
        author: AuthorClass::None,
    };
    t.routing().node(charge).unwrap()
}

fn stats(t: &BudgetTree, name: &str, now: u64) -> BudgetStats {
    t.stats(now).find(|s| s.name == name).unwrap()
}

/// One offer per entry every `step` in `[from, until)`; the admit times
/// of each.
fn flood(
    t: &mut BudgetTree,
    entries: &[(NodeId, Counted)],
    (from, until, step): (u64, u64, u64),
) -> Vec<Vec<u64>> {
    let mut admits = vec![Vec::new(); entries.len()];
    let mut now = from;
    while now < until {
        for (i, (node, counted)) in entries.iter().enumerate() {
            if t.admit(*node, *counted, 1, now).is_ok() {
                admits[i].push(now);
            }
        }
        now += step;
    }
    admits
}

/// The most admits in any closed window of `w` ns (times sorted).
fn most_in_window(times: &[u64], w: u64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] > w {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

fn merged(parts: &[&Vec<u64>]) -> Vec<u64> {
    let mut all: Vec<u64> = parts.iter().flat_map(|v| v.iter().copied()).collect();
    all.sort_unstable();
    all
}

#[test]
fn a_class_admits_its_rate_plus_its_burst_over_any_window() {
    let mut t = tree(&[budget(
        "anon",
        None,
        Some("anonymous"),
        (100.0, 100.0, 100.0),
    )]);
    let anon = conn(&t, 0);
    // 1,000 offered a second for 10 s.
    let admits = flood(&mut t, &[anon], (0, 10 * SECOND, MS)).remove(0);
    assert!((1000..=1100).contains(&admits.len()), "{}", admits.len());
    for w in [10 * MS, 100 * MS, SECOND, 5 * SECOND] {
        let bound = 100.0 * w as f64 / 1e9 + 100.0;
        assert!(most_in_window(&admits, w) as f64 <= bound, "window {w}");
    }
    let s = stats(&t, "anon", 10 * SECOND);
    assert_eq!(s.admitted, admits.len() as u64);
    assert_eq!(s.refused, 10_000 - s.admitted);
    assert_eq!(s.borrowed, 0);
    // Other tiers have no budget: nothing to charge.
    let authed = Charge::Connection {
        counted: Counted::Events,
        tier: 1,
        author: AuthorClass::None,
    };
    assert_eq!(t.routing().node(authed), None);
}

#[test]
fn children_s_admits_stay_within_the_parent_s_over_each_window_plus_the_drift() {
    // The relay at 200/s; anonymous guaranteed 50 and borrowing up to 200,
    // authenticated guaranteed 150. Both flood, then only anonymous, then
    // both again.
    let budgets = [
        budget("relay", None, None, (200.0, 200.0, 200.0)),
        budget("anon", None, Some("anonymous"), (50.0, 50.0, 200.0)),
        budget(
            "authed",
            Some("relay"),
            Some("authenticated"),
            (150.0, 150.0, 150.0),
        ),
    ];
    let mut t = tree(&budgets);
    let (anon, authed) = (conn(&t, 0), conn(&t, 1));
    let mut a = flood(&mut t, &[anon, authed], (0, 5 * SECOND, MS));
    let alone = flood(&mut t, &[anon], (5 * SECOND, 10 * SECOND, MS)).remove(0);
    let again = flood(&mut t, &[anon, authed], (10 * SECOND, 15 * SECOND, MS));
    a[0].extend(alone);
    a[0].extend(&again[0]);
    a[1].extend(&again[1]);
    let children = merged(&[&a[0], &a[1]]);
    // S77-6: every child's admit is the parent's, and the parent admits
    // at most rate × Δt + burst + the drift (its children's bursts, what
    // guaranteed admits may charge on credit after a child borrowed).
    let (root, anon_s, authed_s) = (
        stats(&t, "relay", 15 * SECOND),
        stats(&t, "anon", 15 * SECOND),
        stats(&t, "authed", 15 * SECOND),
    );
    assert_eq!(root.admitted, anon_s.admitted + authed_s.admitted);
    assert_eq!(root.admitted, children.len() as u64);
    let drift = 50.0 + 150.0;
    for w in [10 * MS, 100 * MS, SECOND, 5 * SECOND, 15 * SECOND] {
        let secs = w as f64 / 1e9;
        let most = most_in_window(&children, w) as f64;
        assert!(most <= 200.0 * secs + 200.0 + drift, "window {w}: {most}");
        // Each child within its own ceiling.
        assert!(most_in_window(&a[0], w) as f64 <= 200.0 * secs + 50.0);
        assert!(most_in_window(&a[1], w) as f64 <= 150.0 * secs + 150.0);
    }
    // The guarantee holds while the other borrows: authenticated got its
    // 150/s in both busy phases, anonymous borrowed the rest.
    let count =
        |v: &[u64], from: u64, to: u64| v.iter().filter(|t| (from..to).contains(*t)).count();
    assert!(
        count(&a[1], 0, 5 * SECOND) >= 750,
        "{}",
        count(&a[1], 0, 5 * SECOND)
    );
    assert!(count(&a[1], 10 * SECOND, 15 * SECOND) >= 750);
    let anon_alone = count(&a[0], 5 * SECOND, 10 * SECOND);
    assert!((950..=1050).contains(&anon_alone), "{anon_alone}");
    assert!(anon_s.borrowed > 0);
}

#[test]
fn borrowing_stops_at_the_ceiling_and_without_a_ceiling_there_is_none() {
    // Under the unlimited root: a ceiling is the limit of what it borrows.
    let mut t = tree(&[
        budget("anon", None, Some("anonymous"), (100.0, 100.0, 300.0)),
        budget("authed", None, Some("authenticated"), (100.0, 100.0, 100.0)),
    ]);
    let (anon, authed) = (conn(&t, 0), conn(&t, 1));
    let a = flood(&mut t, &[anon, authed], (0, 10 * SECOND, MS));
    assert!((3000..=3100).contains(&a[0].len()), "{}", a[0].len());
    assert!((1000..=1100).contains(&a[1].len()), "{}", a[1].len());
    for w in [100 * MS, SECOND] {
        let secs = w as f64 / 1e9;
        assert!(most_in_window(&a[0], w) as f64 <= 300.0 * secs + 100.0);
        assert!(most_in_window(&a[1], w) as f64 <= 100.0 * secs + 100.0);
    }
    let s = stats(&t, "anon", 10 * SECOND);
    assert!(s.borrowed >= 1900, "{s:?}");
    assert_eq!(stats(&t, "authed", 10 * SECOND).borrowed, 0);
}

#[test]
fn a_refusal_higher_up_takes_nothing_below() {
    // relay 10/s; group g guaranteed 2, borrowing to 10, holding anonymous
    // (2, borrowing to 10); authenticated guaranteed 8.
    let budgets = [
        budget("relay", None, None, (10.0, 10.0, 10.0)),
        budget("g", None, None, (2.0, 5.0, 10.0)),
        budget("anon", Some("g"), Some("anonymous"), (2.0, 5.0, 10.0)),
        budget("authed", None, Some("authenticated"), (8.0, 5.0, 8.0)),
    ];
    let mut t = tree(&budgets);
    let (anon, authed) = (conn(&t, 0), conn(&t, 1));
    for _ in 0..5 {
        t.admit(anon.0, anon.1, 1, 0).unwrap();
        t.admit(authed.0, authed.1, 1, 0).unwrap();
    }
    assert_eq!(stats(&t, "relay", 0).tokens, 0.0);
    // 125 ms on: authenticated has one token of its own and takes the
    // relay's last one (1.25 → 0.25).
    let now = 125 * MS;
    t.admit(authed.0, authed.1, 1, now).unwrap();
    let before: Vec<BudgetStats> = t.stats(now).collect();
    // Anonymous and g could borrow (1.25 under their ceilings), but the
    // relay cannot lend: refused there, naming it, and nothing below moved.
    let r = t.admit(anon.0, anon.1, 1, now).unwrap_err();
    assert_eq!(r.message, "too many events for the \"relay\" budget");
    assert!(!r.outsiders);
    assert_eq!(r.retry_after, Duration::from_millis(75));
    let after: Vec<BudgetStats> = t.stats(now).collect();
    for (b, a) in before.iter().zip(&after) {
        let refused = b.refused + u64::from(b.name == "relay");
        assert_eq!(
            (a.tokens, a.ceil_tokens, a.admitted, a.refused),
            (b.tokens, b.ceil_tokens, b.admitted, refused),
            "{}",
            a.name
        );
    }
    // 75 ms later the relay lends: anonymous borrows through g.
    t.admit(anon.0, anon.1, 1, 200 * MS).unwrap();
    assert_eq!(stats(&t, "anon", 200 * MS).borrowed, 1);
    assert_eq!(stats(&t, "g", 200 * MS).borrowed, 1);
    assert_eq!(stats(&t, "relay", 200 * MS).borrowed, 0);
}

#[test]
fn a_guaranteed_admit_is_charged_to_the_parent_on_credit() {
    // Anonymous borrows every token the relay has idle; authenticated,
    // flooding beside it, still gets all of its guarantee: the relay is
    // charged for it without a say, into debt by at most its children's
    // bursts, and lends nothing while in debt.
    let budgets = [
        budget("relay", None, None, (10.0, 10.0, 10.0)),
        budget("anon", None, Some("anonymous"), (2.0, 2.0, 10.0)),
        budget("authed", None, Some("authenticated"), (8.0, 8.0, 8.0)),
    ];
    let mut t = tree(&budgets);
    let (anon, authed) = (conn(&t, 0), conn(&t, 1));
    let (mut got, mut lowest) = ([0u64; 2], f64::MAX);
    let mut now = 0;
    while now < 5 * SECOND {
        for (i, (n, c)) in [anon, authed].into_iter().enumerate() {
            got[i] += u64::from(t.admit(n, c, 1, now).is_ok());
        }
        lowest = lowest.min(stats(&t, "relay", now).tokens);
        now += MS;
    }
    // Authenticated alone would have had 8 + 8 × 5 = 48 (one less for the
    // last offer falling just before its token).
    assert!(got[1] >= 47, "{got:?}");
    assert!(
        got[0] >= 2 + 2 * 5 - 1 && got[0] + got[1] <= 10 + 10 * 5 + 10,
        "{got:?}"
    );
    assert!((-10.0..0.0).contains(&lowest), "{lowest}");
    assert!(stats(&t, "anon", now).borrowed > 0);
}

#[test]
fn classes_are_charged_once_at_the_step_their_rule_names() {
    let tiers = TiersConfig {
        listed: vec![ListedTier {
            name: "paid".into(),
            weight: 1,
            rate_multiplier: 1.0,
            pubkeys: Vec::new(),
        }],
        ..TiersConfig::default()
    };
    let mut requests = budget("relay", None, None, (1000.0, 1000.0, 1000.0));
    requests.counts = vec![Counted::Events, Counted::Requests];
    let budgets = [
        requests,
        budget("anon", None, Some("anonymous"), (100.0, 100.0, 100.0)),
        budget("paid", None, Some("tier:paid"), (100.0, 100.0, 100.0)),
        budget("friends", None, Some("distance:1"), (100.0, 100.0, 100.0)),
        budget("strangers", None, Some("outsiders"), (10.0, 10.0, 10.0)),
    ];
    let t = BudgetTree::new(&budgets, &tiers, 50.0, 0).unwrap();
    let r = t.routing();
    let id = |name| Some(t.id(name).unwrap());
    let at = |counted, tier, author| {
        r.node(Charge::Connection {
            counted,
            tier,
            author,
        })
        .map(|(n, _)| n)
    };
    let (events, reqs, none) = (Counted::Events, Counted::Requests, AuthorClass::None);
    assert_eq!(r.node(Charge::Outsider).map(|(n, _)| n), id("strangers"));
    assert_eq!(r.node(Charge::Signed(1)).map(|(n, _)| n), id("friends"));
    assert_eq!(r.node(Charge::Signed(2)), None);
    assert_eq!(at(events, 0, none), id("anon"));
    assert_eq!(at(events, 2, none), id("paid"));
    // Authenticated has no budget: the relay alone.
    assert_eq!(at(events, 1, none), id("relay"));
    // An author's class takes its EVENT: the connection's charges nothing.
    assert_eq!(at(events, 0, AuthorClass::Outsider), None);
    assert_eq!(at(events, 0, AuthorClass::Distance(1)), None);
    assert_eq!(at(events, 0, AuthorClass::Distance(2)), id("anon"));
    // Requests: anonymous counts none, the relay does.
    assert_eq!(at(reqs, 0, none), id("relay"));
    assert_eq!(at(reqs, 0, AuthorClass::Outsider), id("relay"));
    // Without any budget only the outsiders' exists (from [trust]).
    let t = tree(&[]);
    assert_eq!(t.routing().node(Charge::Outsider), Some((0, events)));
    assert_eq!(at_none(&t), None);
}

fn at_none(t: &BudgetTree) -> Option<(NodeId, Counted)> {
    t.routing().node(Charge::Connection {
        counted: Counted::Events,
        tier: 0,
        author: AuthorClass::None,
    })
}

#[test]
fn the_outsiders_budget_from_trust_starts_full_at_each_rate_and_names_itself() {
    let mut t = tree(&[]);
    let (n, c) = t.routing().node(Charge::Outsider).unwrap();
    // 50 a second, a second's worth at once.
    assert_eq!((0..60).filter(|_| t.admit(n, c, 1, 0).is_ok()).count(), 50);
    t.set_outsider_rate(0.001, 0);
    assert_eq!((0..5).filter(|_| t.admit(n, c, 1, 0).is_ok()).count(), 2);
    let r = t.admit(n, c, 1, 0).unwrap_err();
    assert!(r.outsiders);
    assert_eq!(r.message, tree::OUTSIDER_TEXT);
    let s = stats(&t, OUTSIDERS, 0);
    assert_eq!((s.admitted, s.refused, s.rate_per_s), (52, 14, 0.001));
    // A written outsiders budget is not changed by [trust].
    let mut t = tree(&[budget("o", None, Some("outsiders"), (1.0, 1.0, 1.0))]);
    t.set_outsider_rate(1000.0, 0);
    assert_eq!(stats(&t, "o", 0).rate_per_s, 1.0);
}

#[test]
fn a_reload_keeps_the_counts_and_the_tokens_of_unchanged_budgets() {
    let a = budget("anon", None, Some("anonymous"), (10.0, 10.0, 10.0));
    let b = budget("authed", None, Some("authenticated"), (10.0, 10.0, 10.0));
    let mut old = tree(&[a.clone(), b.clone()]);
    for tier in [0, 1] {
        let (n, c) = conn(&old, tier);
        for _ in 0..4 {
            old.admit(n, c, 1, 0).unwrap();
        }
    }
    let faster = BudgetConfig {
        rate_per_s: 20.0,
        ceil_per_s: Some(20.0),
        ..b
    };
    let mut new = tree(&[a, faster]);
    new.carry(&old);
    let (anon, authed) = (stats(&new, "anon", 0), stats(&new, "authed", 0));
    assert_eq!((anon.admitted, anon.tokens), (4, 6.0));
    assert_eq!((authed.admitted, authed.tokens), (4, 10.0));
}

/// The error of `budgets` under `[throttle]`.
fn error(budgets: &[BudgetConfig]) -> ConfigError {
    validate(budgets, &TiersConfig::default())
        .unwrap_err()
        .within("throttle")
}

#[test]
fn children_guaranteeing_more_than_their_parent_are_refused_naming_every_key() {
    let e = error(&[
        budget("relay", None, None, (200.0, 400.0, 200.0)),
        budget("anon", None, Some("anonymous"), (150.0, 150.0, 150.0)),
        budget(
            "authed",
            Some("relay"),
            Some("authenticated"),
            (150.0, 150.0, 150.0),
        ),
    ]);
    assert_eq!(e.key, "throttle.budgets[2].rate_per_s");
    assert_eq!(
        e.to_string(),
        "throttle.budgets[2].rate_per_s = 150 is invalid: must be within its parent's: the \
         children of \"relay\" guarantee 300/s (throttle.budgets[1].rate_per_s + \
         throttle.budgets[2].rate_per_s) > its 200/s (throttle.budgets[0].rate_per_s)"
    );
    // Bursts too (P77-3), under any parent.
    let e = error(&[
        budget("g", None, None, (100.0, 100.0, 100.0)),
        budget("anon", Some("g"), Some("anonymous"), (50.0, 80.0, 50.0)),
        budget(
            "authed",
            Some("g"),
            Some("authenticated"),
            (50.0, 80.0, 50.0),
        ),
    ]);
    assert_eq!(e.key, "throttle.budgets[2].burst");
    assert!(e.to_string().contains("guarantee 160 ("), "{e}");
    // Under the unlimited root, anything goes.
    validate(
        &[budget("anon", None, Some("anonymous"), (1e6, 1e6, 1e6))],
        &TiersConfig::default(),
    )
    .unwrap();
}

#[test]
fn parents_names_classes_and_numbers_are_checked() {
    let anon = |name: &str, parent: Option<&str>| budget(name, parent, None, (1.0, 1.0, 1.0));
    let cases: Vec<(Vec<BudgetConfig>, &str, &str)> = vec![
        (
            vec![anon("a", Some("nobody"))],
            "budgets[0].parent",
            "no budget is named \"nobody\"",
        ),
        (
            vec![anon("a", Some("b")), anon("b", Some("a"))],
            "budgets[0].parent",
            "this one loops: a -> b -> a",
        ),
        (
            vec![anon("a", Some("a"))],
            "budgets[0].parent",
            "loops: a -> a",
        ),
        (
            vec![anon("a", None), anon("a", None)],
            "budgets[1].name",
            "is budgets[0]'s",
        ),
        (
            vec![anon("A-b", None)],
            "budgets[0].name",
            "1-32 characters",
        ),
        (
            vec![anon("relay", Some("x"))],
            "budgets[0].name",
            "the root's name",
        ),
        (
            vec![anon("outsiders", None)],
            "budgets[0].name",
            "class = \"outsiders\"",
        ),
        (
            vec![budget("a", None, Some("tier:gold"), (1.0, 1.0, 1.0))],
            "budgets[0].class",
            "tier:NAME",
        ),
        (
            vec![budget("a", None, Some("distance:5"), (1.0, 1.0, 1.0))],
            "budgets[0].class",
            "distance:0..4",
        ),
        (
            vec![
                budget("a", None, Some("anonymous"), (1.0, 1.0, 1.0)),
                budget("b", None, Some("anonymous"), (1.0, 1.0, 1.0)),
            ],
            "budgets[1].class",
            "is budgets[0]'s",
        ),
        (
            vec![budget("a", None, None, (2.0, 2.0, 1.0))],
            "budgets[0].ceil_per_s",
            "rate_per_s..=1e9",
        ),
        (
            vec![budget("a", None, None, (0.0, 1.0, 1.0))],
            "budgets[0].rate_per_s",
            "0.001",
        ),
        (
            vec![budget("a", None, None, (1.0, 0.5, 1.0))],
            "budgets[0].burst",
            "1..=1e9",
        ),
        (
            vec![budget("relay", None, None, (1.0, 1.0, 2.0))],
            "budgets[0].ceil_per_s",
            "no parent",
        ),
        (
            vec![
                budget("g", None, None, (5.0, 5.0, 5.0)),
                budget("a", Some("g"), None, (1.0, 1.0, 6.0)),
            ],
            "budgets[1].ceil_per_s",
            "at most its parent \"g\"'s ceiling, 5/s",
        ),
    ];
    for (budgets, key, says) in cases {
        let e = error(&budgets);
        assert_eq!(e.key, format!("throttle.{key}"), "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    // Counts: a child counts only what its parent does; an author's class
    // only EVENTs; something, once.
    let mut g = budget("g", None, None, (5.0, 5.0, 5.0));
    let mut a = budget("a", Some("g"), None, (1.0, 1.0, 1.0));
    a.counts = vec![Counted::Requests];
    assert_eq!(
        error(&[g.clone(), a.clone()]).key,
        "throttle.budgets[1].counts"
    );
    g.counts = vec![Counted::Events, Counted::Requests];
    validate(&[g.clone(), a.clone()], &TiersConfig::default()).unwrap();
    a.counts = vec![];
    assert_eq!(error(&[g, a]).key, "throttle.budgets[1].counts");
    let mut d = budget("d", None, Some("distance:1"), (1.0, 1.0, 1.0));
    d.counts = vec![Counted::Events, Counted::Requests];
    assert_eq!(error(&[d]).key, "throttle.budgets[0].counts");
    let many: Vec<BudgetConfig> = (0..65).map(|i| anon(&format!("b{i}"), None)).collect();
    assert_eq!(error(&many).key, "throttle.budgets");
}

#[test]
fn the_outsiders_budget_from_trust_must_fit_under_a_written_root() {
    let root = budget("relay", None, None, (200.0, 200.0, 200.0));
    let anon = budget("anon", None, Some("anonymous"), (150.0, 150.0, 150.0));
    check_outsiders(&[root.clone(), anon.clone()], 50.0).unwrap();
    let e = check_outsiders(&[root.clone(), anon.clone()], 60.0)
        .unwrap_err()
        .within("trust");
    assert_eq!(e.key, "trust.outsider_events_per_s");
    assert!(e.to_string().contains("guarantee 210/s"), "{e}");
    // A written outsiders budget takes its place; without a root, no limit.
    let own = budget("o", None, Some("outsiders"), (50.0, 50.0, 50.0));
    check_outsiders(&[root, anon.clone(), own], 1e6).unwrap();
    check_outsiders(&[anon], 1e6).unwrap();
}

#[test]
fn an_author_s_class_is_the_distance_or_an_unmined_limited_outsider() {
    let trusted = WriteStanding::Trusted {
        distance: 2,
        tier: None,
    };
    assert_eq!(AuthorClass::of(&trusted, 0), AuthorClass::Distance(2));
    let rule = |writes| {
        WriteStanding::Outsider(crate::trust::OutsiderRule {
            writes,
            floor: 0,
            current: 8,
            adaptive: true,
        })
    };
    // Limited: the outsiders' budget, unless it carries the work asked.
    let limited = rule(OutsiderWrites::Limited);
    assert_eq!(AuthorClass::of(&limited, 7), AuthorClass::Outsider);
    assert_eq!(AuthorClass::of(&limited, 8), AuthorClass::None);
    // Any other rule: the connection's class decides, mined or not.
    for writes in [
        OutsiderWrites::Allow,
        OutsiderWrites::Pow,
        OutsiderWrites::Deny,
    ] {
        for difficulty in [0, 8] {
            let of = AuthorClass::of(&rule(writes), difficulty);
            assert_eq!(of, AuthorClass::None, "{writes:?} {difficulty}");
        }
    }
}

#[test]
fn an_entry_without_counts_counts_events() {
    let b: BudgetConfig =
        serde_json::from_str(r#"{"name": "anon", "class": "anonymous", "rate_per_s": 5}"#).unwrap();
    assert_eq!(b.counts, [Counted::Events]);
    assert_eq!((b.burst(), b.ceil()), (5.0, 5.0));
}

#[test]
fn a_tier_s_budget_may_count_requests_too_and_names_take_digits_and_underscores() {
    let mut b = budget("anon_1", None, Some("anonymous"), (1.0, 1.0, 1.0));
    b.counts = vec![Counted::Events, Counted::Requests];
    validate(&[b], &TiersConfig::default()).unwrap();
    // 64 budgets are allowed (65 are not: above).
    let anon = |i: usize| budget(&format!("b{i}"), None, None, (1.0, 1.0, 1.0));
    let most: Vec<BudgetConfig> = (0..MAX_BUDGETS).map(anon).collect();
    validate(&most, &TiersConfig::default()).unwrap();
}

#[test]
fn children_s_rates_sum_up_to_their_parent_s_and_the_error_names_the_last_child_s_value() {
    let g = |rate, burst| budget("g", None, None, (rate, burst, rate));
    let a = budget("a", Some("g"), Some("anonymous"), (40.0, 7.0, 40.0));
    let b = |rate, burst| budget("b", Some("g"), Some("authenticated"), (rate, burst, rate));
    let tiers = TiersConfig::default();
    // Exactly the parent's rate and burst: 40 + 60 = 100, 7 + 13 = 20.
    validate(&[g(100.0, 20.0), a.clone(), b(60.0, 13.0)], &tiers).unwrap();
    // Half an operation a second above.
    let e = error(&[g(100.0, 200.0), a.clone(), b(60.5, 8.0)]);
    assert_eq!(
        (e.key.as_str(), e.value),
        ("throttle.budgets[2].rate_per_s", 60.5)
    );
    assert_eq!(
        e.to_string(),
        "throttle.budgets[2].rate_per_s = 60.5 is invalid: must be within its parent's: the \
         children of \"g\" guarantee 100.5/s (throttle.budgets[1].rate_per_s + \
         throttle.budgets[2].rate_per_s) > its 100/s (throttle.budgets[0].rate_per_s)"
    );
    // Half an operation of burst above.
    let e = error(&[g(100.0, 20.0), a.clone(), b(60.0, 13.5)]);
    assert_eq!(
        (e.key.as_str(), e.value),
        ("throttle.budgets[2].burst", 13.5)
    );
    assert_eq!(
        e.to_string(),
        "throttle.budgets[2].burst = 13.5 is invalid: must be within its parent's: the \
         children of \"g\" guarantee 20.5 (throttle.budgets[1].burst + \
         throttle.budgets[2].burst) > its 20 (throttle.budgets[0].burst)"
    );
    // The tolerance for rounding is a billionth of the parent's, and
    // reaching it is still within.
    let g = budget("g", None, None, (100.0, 200.0, 200.0));
    let at = 100.0 * (1.0 + 1e-9);
    let one = budget("a", Some("g"), Some("anonymous"), (at, 1.0, at));
    validate(&[g.clone(), one], &tiers).unwrap();
    let above = 100.0 * (1.0 + 2e-9);
    let one = budget("a", Some("g"), Some("anonymous"), (above, 1.0, above));
    assert_eq!(error(&[g, one]).key, "throttle.budgets[1].rate_per_s");
}

#[test]
fn a_tier_index_beyond_the_last_listed_and_a_distance_beyond_4_enter_nowhere() {
    let budgets = [
        budget("relay", None, None, (100.0, 100.0, 100.0)),
        budget("far", None, Some("distance:4"), (10.0, 10.0, 10.0)),
    ];
    let t = tree(&budgets);
    let at = |tier| conn_at(&t, tier).map(|(n, _)| n);
    assert_eq!(at(MAX_TIERS as u8 - 1), t.id("relay"));
    assert_eq!(at(MAX_TIERS as u8), None);
    assert_eq!(MAX_TIERS, 16);
    let signed = |d| t.routing().node(Charge::Signed(d)).map(|(n, _)| n);
    assert_eq!(signed(MAX_DISTANCE), t.id("far"));
    assert_eq!(signed(MAX_DISTANCE + 1), None);
}

fn conn_at(t: &BudgetTree, tier: u8) -> Option<(NodeId, Counted)> {
    t.routing().node(Charge::Connection {
        counted: Counted::Events,
        tier,
        author: AuthorClass::None,
    })
}

#[test]
fn a_reload_gives_each_budget_its_own_counts_by_name() {
    let a = budget("anon", None, Some("anonymous"), (10.0, 10.0, 10.0));
    let b = budget("authed", None, Some("authenticated"), (10.0, 10.0, 10.0));
    let mut old = tree(&[a.clone(), b.clone()]);
    for (tier, n) in [(0, 1), (1, 3)] {
        let (node, c) = conn(&old, tier);
        for _ in 0..n {
            old.admit(node, c, 1, 0).unwrap();
        }
    }
    // The same budgets, written the other way round.
    let mut new = tree(&[b, a]);
    new.carry(&old);
    let (anon, authed) = (stats(&new, "anon", 0), stats(&new, "authed", 0));
    assert_eq!((anon.admitted, anon.tokens), (1, 9.0));
    assert_eq!((authed.admitted, authed.tokens), (3, 7.0));
}

#[test]
fn the_outsiders_budget_from_trust_fits_the_root_s_rate_and_burst_to_a_billionth() {
    let root = |rate, burst| budget("relay", None, None, (rate, burst, rate));
    // A child naming the root as its parent counts as much as one that
    // names none: 150 + 60 > 200.
    let named = budget(
        "anon",
        Some("relay"),
        Some("anonymous"),
        (150.0, 150.0, 150.0),
    );
    let e = check_outsiders(&[root(200.0, 400.0), named.clone()], 60.0).unwrap_err();
    assert_eq!((e.key.as_str(), e.value), ("outsider_events_per_s", 60.0));
    assert!(e.to_string().contains("guarantee 210/s (burst 210)"), "{e}");
    check_outsiders(&[root(200.0, 400.0), named], 50.0).unwrap();
    // The rate alone: at the root's rate and its billionth, within; half
    // an operation a second above, not.
    let at = 200.0 * (1.0 + 1e-9);
    check_outsiders(&[root(200.0, 400.0)], 200.0).unwrap();
    check_outsiders(&[root(200.0, 400.0)], at).unwrap();
    let e = check_outsiders(&[root(200.0, 400.0)], 200.5).unwrap_err();
    assert!(
        e.to_string()
            .contains("guarantee 200.5/s (burst 200.5) > its 200/s (burst 400)"),
        "{e}"
    );
    // The burst alone: 150 + 10 fits a burst of 160 exactly; 150 + 10.5
    // does not.
    let anon = budget("anon", None, Some("anonymous"), (100.0, 150.0, 100.0));
    check_outsiders(&[root(1000.0, 160.0), anon.clone()], 10.0).unwrap();
    let e = check_outsiders(&[root(1000.0, 160.0), anon], 10.5).unwrap_err();
    assert_eq!((e.key.as_str(), e.value), ("outsider_events_per_s", 10.5));
    assert!(
        e.to_string()
            .contains("guarantee 110.5/s (burst 160.5) > its 1000/s (burst 160)"),
        "{e}"
    );
    // Its burst at the root's and its billionth, within.
    let at = 160.0 * (1.0 + 1e-9);
    check_outsiders(&[root(1000.0, 160.0)], at).unwrap();
    assert!(check_outsiders(&[root(1000.0, 160.0)], 160.5).is_err());
}
