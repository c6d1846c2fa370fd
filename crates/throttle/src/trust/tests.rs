use super::*;

fn pk(n: u8) -> [u8; 32] {
    [n; 32]
}

fn graph(seeds: &[u8], max_distance: u8, max_pubkeys: usize) -> TrustGraph {
    TrustGraph::new(&TrustConfig {
        seed_pubkeys: seeds.iter().map(|n| hex(&pk(*n))).collect(),
        max_distance,
        max_pubkeys,
        ..TrustConfig::default()
    })
}

fn hex(b: &[u8; 32]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn follow(g: &mut TrustGraph, author: u8, at: u64, follows: &[u8]) -> bool {
    let f: Vec<[u8; 32]> = follows.iter().map(|n| pk(*n)).collect();
    let changed = g.offer(pk(author), at, &f);
    if changed {
        g.recompute();
    }
    changed
}

#[test]
fn distances_come_from_the_seeds_follow_lists_up_to_max_distance() {
    let mut g = graph(&[1], 2, 100);
    assert_eq!(g.distance(&pk(1)), Some(0));
    assert_eq!(g.missing_lists(), vec![pk(1)]);
    assert!(follow(&mut g, 1, 10, &[2, 3]));
    assert_eq!(g.distance(&pk(2)), Some(1));
    assert_eq!(g.missing_lists(), vec![pk(2), pk(3)]);
    assert!(follow(&mut g, 2, 10, &[4, 1]));
    assert_eq!(g.distance(&pk(4)), Some(2));
    assert_eq!(g.distance(&pk(1)), Some(0), "a seed stays a seed");
    // Distance 2 is the edge: its list does not count.
    assert!(!follow(&mut g, 4, 10, &[5]));
    assert_eq!(g.distance(&pk(5)), None);
    assert_eq!(
        g.explain(&pk(4)),
        Explanation::Followed {
            path: vec![pk(1), pk(2), pk(4)]
        }
    );
    assert_eq!(g.explain(&pk(1)), Explanation::Seed);
    assert_eq!(g.explain(&pk(5)), Explanation::Outside { truncated: false });
}

#[test]
fn an_unfollow_removes_what_only_it_reached_and_an_older_list_is_ignored() {
    let mut g = graph(&[1], 2, 100);
    follow(&mut g, 1, 10, &[2, 3]);
    follow(&mut g, 2, 10, &[4]);
    follow(&mut g, 3, 10, &[4, 5]);
    assert_eq!(g.distance(&pk(5)), Some(2));
    // 1 unfollows 3: 5 was reached only through 3; 4 still through 2.
    assert!(follow(&mut g, 1, 20, &[2]));
    assert_eq!(g.distance(&pk(3)), None);
    assert_eq!(g.distance(&pk(5)), None);
    assert_eq!(g.distance(&pk(4)), Some(2));
    assert_eq!(
        g.lists().0,
        2,
        "3's list no longer counts, so it is dropped"
    );
    // A replayed older list changes nothing.
    assert!(!follow(&mut g, 1, 15, &[2, 3]));
    assert_eq!(g.distance(&pk(3)), None);
    // 3 followed again: its list must be read again.
    assert!(follow(&mut g, 1, 30, &[2, 3]));
    assert_eq!(g.missing_lists(), vec![pk(3)]);
    g.no_list(pk(3));
    assert!(g.missing_lists().is_empty());
}

#[test]
fn the_cap_keeps_the_nearest_and_says_it_stopped() {
    let mut g = graph(&[1], 2, 4);
    follow(&mut g, 1, 10, &[2, 3]);
    follow(&mut g, 2, 10, &[10, 11, 12, 13]);
    assert_eq!(g.len(), 4);
    assert!(g.truncated());
    assert_eq!(g.distance(&pk(10)), Some(2));
    assert_eq!(g.distance(&pk(11)), None);
    assert_eq!(g.explain(&pk(13)), Explanation::Outside { truncated: true });
}

#[test]
fn the_result_does_not_depend_on_the_order_lists_arrived_in() {
    let lists: [(u8, &[u8]); 3] = [(1, &[2, 3]), (3, &[4]), (2, &[4, 5])];
    let mut a = graph(&[1], 2, 100);
    for (author, f) in lists {
        follow(&mut a, author, 10, f);
    }
    let mut b = graph(&[1], 2, 100);
    for (author, f) in lists.iter().rev() {
        // In reverse, 3's and 2's lists arrive before they count.
        follow(&mut b, *author, 10, f);
    }
    for (author, f) in lists {
        follow(&mut b, author, 10, f);
    }
    assert_eq!(a.distances(), b.distances());
    assert_eq!(a.explain(&pk(4)), b.explain(&pk(4)));
    assert_eq!(
        a.explain(&pk(4)),
        Explanation::Followed {
            path: vec![pk(1), pk(2), pk(4)]
        },
        "the lowest parent wins a tie"
    );
}

#[test]
fn before_the_signature_deny_refuses_and_an_outsider_must_carry_the_work_asked() {
    let rule = |writes, floor, current| {
        WriteStanding::Outsider(OutsiderRule {
            writes,
            floor,
            current,
            adaptive: current > floor,
        })
    };
    let trusted = WriteStanding::Trusted {
        distance: 2,
        tier: None,
    };
    assert_eq!(before_signature(&trusted, 0), Ok(()));
    assert_eq!(
        before_signature(&rule(OutsiderWrites::Deny, 0, 0), 64),
        Err(TrustRefusal::NotTrusted)
    );
    for writes in [OutsiderWrites::Allow, OutsiderWrites::Pow] {
        assert_eq!(
            before_signature(&rule(writes, 8, 12), 11),
            Err(TrustRefusal::Pow { required: 12 })
        );
        assert_eq!(before_signature(&rule(writes, 8, 12), 12), Ok(()));
        assert_eq!(before_signature(&rule(writes, 0, 0), 0), Ok(()));
    }
    // Limited: only the floor before the signature (the budget after).
    assert_eq!(
        before_signature(&rule(OutsiderWrites::Limited, 8, 12), 7),
        Err(TrustRefusal::Pow { required: 8 })
    );
    assert_eq!(
        before_signature(&rule(OutsiderWrites::Limited, 8, 12), 8),
        Ok(())
    );
}

#[test]
fn a_config_naming_an_unknown_tier_or_a_bad_seed_is_refused_by_key() {
    let tiers = TiersConfig::default();
    let bad_tier = TrustConfig {
        distance_tiers: DistanceTiers::List(vec!["friends".into()]),
        ..TrustConfig::default()
    };
    assert_eq!(
        bad_tier.validate(&tiers).unwrap_err().key,
        "trust.distance_tiers.1"
    );
    let ok = TrustConfig {
        distance_tiers: DistanceTiers::List(vec!["authenticated".into()]),
        ..TrustConfig::default()
    };
    ok.validate(&tiers).unwrap();
    assert_eq!(ok.distance_tiers.name(0), Some("authenticated"));
    assert_eq!(ok.distance_tiers.name(2), None);
    let bad_seed = TrustConfig {
        seed_pubkeys: vec!["xyz".into()],
        ..TrustConfig::default()
    };
    assert_eq!(
        bad_seed.validate(&tiers).unwrap_err().key,
        "trust.seed_pubkeys[0]"
    );
    let far = TrustConfig {
        max_distance: 5,
        ..TrustConfig::default()
    };
    assert_eq!(far.validate(&tiers).unwrap_err().key, "trust.max_distance");
}

#[test]
fn each_outsider_rule_is_named_as_the_config_spells_it() {
    for w in [
        OutsiderWrites::Allow,
        OutsiderWrites::Pow,
        OutsiderWrites::Limited,
        OutsiderWrites::Deny,
    ] {
        let spelled = serde_json::to_value(w).unwrap();
        assert_eq!(spelled.as_str(), Some(w.as_str()));
    }
    assert_eq!(OutsiderWrites::Limited.as_str(), "limited");
}

#[test]
fn a_distance_may_name_a_listed_tier() {
    let tiers = TiersConfig {
        listed: vec![crate::tiers::ListedTier {
            name: "friends".into(),
            weight: 4,
            rate_multiplier: 2.0,
            pubkeys: Vec::new(),
        }],
        ..TiersConfig::default()
    };
    let c = TrustConfig {
        distance_tiers: DistanceTiers::List(vec!["friends".into(), "nobody".into()]),
        ..TrustConfig::default()
    };
    assert_eq!(
        c.validate(&tiers).unwrap_err().key,
        "trust.distance_tiers.2"
    );
    let c = TrustConfig {
        distance_tiers: DistanceTiers::List(vec!["friends".into(), "authenticated".into()]),
        ..TrustConfig::default()
    };
    c.validate(&tiers).unwrap();
}

#[test]
fn the_seeds_decode_and_a_web_is_on_only_with_seeds() {
    let none = TrustConfig::default();
    assert!(!none.enabled());
    assert!(none.seeds().is_empty());
    assert!(TrustGraph::new(&none).is_empty());
    let c = TrustConfig {
        seed_pubkeys: vec![hex(&pk(7)), hex(&pk(3))],
        ..TrustConfig::default()
    };
    assert!(c.enabled());
    assert_eq!(c.seeds(), vec![pk(7), pk(3)]);
    let g = TrustGraph::new(&c);
    assert!(!g.is_empty());
    assert!(!g.truncated());
    assert_eq!(g.distances(), HashMap::from([(pk(7), 0), (pk(3), 0)]));
}

#[test]
fn mined_needs_adaptive_work_asked_and_carried() {
    let rule = |current, adaptive| OutsiderRule {
        writes: OutsiderWrites::Limited,
        floor: 0,
        current,
        adaptive,
    };
    assert!(!rule(0, true).mined(0), "nothing asked: nothing mined");
    assert!(!rule(0, true).mined(30));
    assert!(rule(8, true).mined(8));
    assert!(!rule(8, true).mined(7));
    assert!(!rule(8, false).mined(30));
}

#[test]
fn a_list_whose_author_moves_to_the_edge_stops_counting_at_once() {
    let mut g = graph(&[1], 2, 100);
    follow(&mut g, 1, 10, &[2, 4]);
    follow(&mut g, 2, 10, &[4]);
    follow(&mut g, 4, 10, &[5]);
    assert_eq!(g.distance(&pk(5)), Some(2));
    assert_eq!(g.lists().0, 3);
    // 1 unfollows 4: 4 is now at the edge (through 2), and its list
    // no longer reaches anyone.
    follow(&mut g, 1, 20, &[2]);
    assert_eq!(g.distance(&pk(4)), Some(2));
    assert_eq!(g.distance(&pk(5)), None);
    assert_eq!(g.lists(), (2, 2), "4's list is dropped");
    assert_eq!(
        g.distances(),
        HashMap::from([(pk(1), 0), (pk(2), 1), (pk(4), 2)])
    );
}
