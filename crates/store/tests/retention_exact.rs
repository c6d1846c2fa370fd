//! Retention in the store, exactly: which events an age rule, a count rule
//! or a size horizon refuses at write time (at each boundary), what a scan
//! picks and in which order, what a removal step removes, where it resumes
//! and which horizon it leaves, and the bytes the size target measures.
//! Every time is an explicit `now`; the step time limits are either zero
//! (a step stops at its first check, after 7 removals) or unbounded.

use std::collections::HashSet;
use std::time::Duration;

use sluice_proto::Event;
use sluice_store::{
    Picked, Retention, Rule, Scan, Scope, Store, StoreError, WriteOutcome, WriteRules,
    is_replaceable,
};

use crate::support;

use support::{open, open_at};

const NOW: u64 = 1_700_000_000;

fn pk(key: u8) -> [u8; 32] {
    sluice_proto::event::public_key_of(&[key; 32])
}

/// An event of author `key`; `content` keeps ids apart.
fn ev(key: u8, created_at: u64, kind: u16, content: &str) -> Event {
    Event::sign(&[key; 32], created_at, kind, vec![], content)
}

/// Writes `e` without rules and returns its serial.
fn put(store: &Store, e: &Event) -> u64 {
    match store.write_batch([e], NOW).unwrap()[0] {
        WriteOutcome::Stored { serial, .. } => serial,
        other => panic!("not stored: {other:?}"),
    }
}

fn rule(kinds: &[u16], max_age_secs: Option<u64>, keep_per_author: Option<u64>) -> Rule {
    Rule {
        kinds: kinds.to_vec(),
        max_age_secs,
        keep_per_author,
    }
}

fn rules(rules: Vec<Rule>, exempt: &[[u8; 32]], size_target: bool) -> WriteRules {
    WriteRules {
        retention: Retention {
            rules,
            exempt: exempt.iter().copied().collect(),
            size_target,
        },
        relay_urls: Vec::new(),
    }
}

/// Whether `rules` store `e` (true) or refuse it as outside retention
/// (false); any other outcome fails the test.
fn stores(store: &Store, rules: &WriteRules, e: &Event) -> bool {
    match store.write_batch_ruled([e], NOW, rules).unwrap()[0] {
        WriteOutcome::Stored { .. } => true,
        WriteOutcome::OutsideRetention => false,
        other => panic!("unexpected outcome {other:?}"),
    }
}

fn present(store: &Store, events: &[&Event]) -> Vec<bool> {
    store.contains_ids(events.iter().map(|e| &e.id)).unwrap()
}

fn scan<'a>(scope: &'a Scope, exempt: &'a HashSet<[u8; 32]>) -> Scan<'a> {
    Scan {
        scope,
        before: u64::MAX,
        after: None,
        replaceable: false,
        exempt,
        max_pick: 1000,
        max_examine: 1000,
        max_time: Duration::MAX,
    }
}

fn raw_len(events: &[&Event]) -> u64 {
    events.iter().map(|e| e.raw().len() as u64).sum()
}

#[test]
fn replaceable_means_the_replaceable_and_addressable_kinds() {
    for k in [0, 3, 10000, 10002, 19999, 30000, 30023, 39999] {
        assert!(is_replaceable(k), "kind {k}");
    }
    for k in [1, 2, 4, 5, 7, 62, 1059, 9999, 20000, 29999, 40000] {
        assert!(!is_replaceable(k), "kind {k}");
    }
}

#[test]
fn an_age_rule_ages_its_kinds_or_every_non_replaceable_kind() {
    let every = rule(&[], Some(100), None);
    assert!(every.ages(1));
    assert!(every.ages(7));
    assert!(!every.ages(0));
    assert!(!every.ages(30023));
    let named = rule(&[1, 0], Some(100), None);
    assert!(named.ages(1));
    assert!(
        named.ages(0),
        "an age rule naming a replaceable kind ages it"
    );
    assert!(!named.ages(7));
    // A count rule ages nothing.
    assert!(!rule(&[], None, Some(3)).ages(1));
    assert!(!rule(&[], None, Some(3)).ages(0));
    assert!(!rule(&[1], None, Some(3)).ages(1));
}

#[test]
fn a_count_rule_counts_its_non_replaceable_kinds() {
    let every = rule(&[], None, Some(2));
    assert!(every.counts(1));
    assert!(every.counts(7));
    assert!(!every.counts(0));
    assert!(!every.counts(10002));
    let named = rule(&[1, 0], None, Some(2));
    assert!(named.counts(1));
    assert!(!named.counts(0), "replaceable kinds are never counted");
    assert!(!named.counts(7));
    // An age rule counts nothing.
    assert!(!rule(&[], Some(100), None).counts(1));
    assert!(!rule(&[1], Some(100), None).counts(1));
}

#[test]
fn the_age_cutoff_is_now_minus_the_age_saturating() {
    assert_eq!(rule(&[], Some(100), None).age_cutoff(1000), Some(900));
    assert_eq!(rule(&[], Some(1000), None).age_cutoff(1000), Some(0));
    assert_eq!(rule(&[], Some(5000), None).age_cutoff(1000), Some(0));
    assert_eq!(rule(&[], None, Some(1)).age_cutoff(1000), None);
}

#[test]
fn an_age_rule_refuses_events_strictly_older_than_its_cutoff() {
    let (_d, s) = open();
    let exempt = pk(9);
    let r = rules(vec![rule(&[], Some(100), None)], &[exempt], false);
    assert!(!stores(&s, &r, &ev(1, NOW - 101, 1, "")));
    assert!(!stores(&s, &r, &ev(1, NOW - 5000, 7, "")));
    assert!(stores(&s, &r, &ev(1, NOW - 100, 1, "")));
    assert!(stores(&s, &r, &ev(1, NOW - 99, 1, "")));
    assert!(stores(&s, &r, &ev(1, NOW, 1, "")));
    // Never refused: deletions, requests to vanish, exempt authors, and
    // replaceable events under a rule that does not name their kind.
    assert!(stores(&s, &r, &ev(1, NOW - 5000, 5, "")));
    assert!(stores(&s, &r, &ev(1, NOW - 5000, 62, "")));
    assert!(stores(&s, &r, &ev(9, NOW - 5000, 1, "")));
    assert!(stores(&s, &r, &ev(1, NOW - 5000, 0, "")));
    // A rule naming kinds ages those only, replaceable ones included.
    let named = rules(vec![rule(&[0, 7], Some(100), None)], &[], false);
    assert!(!stores(&s, &named, &ev(2, NOW - 101, 0, "")));
    assert!(!stores(&s, &named, &ev(2, NOW - 101, 7, "")));
    assert!(stores(&s, &named, &ev(2, NOW - 101, 1, "")));
    assert!(stores(&s, &named, &ev(2, NOW - 100, 7, "")));
}

#[test]
fn a_count_rule_over_every_kind_refuses_beyond_the_newest_non_replaceable() {
    let (_d, s) = open();
    for (t, kind) in [(100, 1), (200, 1), (250, 7), (300, 0), (400, 10002)] {
        put(&s, &ev(1, t, kind, ""));
    }
    let keep2 = rules(vec![rule(&[], None, Some(2))], &[], false);
    // 200 and 250 are newer (300 and 400 are replaceable: not counted).
    assert!(!stores(&s, &keep2, &ev(1, 150, 1, "a")));
    assert!(!stores(&s, &keep2, &ev(1, 10, 7, "a")));
    // Another author has nothing stored.
    assert!(stores(&s, &keep2, &ev(2, 10, 1, "a")));
    let keep3 = rules(vec![rule(&[], None, Some(3))], &[], false);
    assert!(stores(&s, &keep3, &ev(1, 150, 1, "b")));
    // Now 150, 200, 250 are newer than 120: three.
    assert!(!stores(&s, &keep3, &ev(1, 120, 1, "b")));
    let keep1 = rules(vec![rule(&[], None, Some(1))], &[], false);
    // Only replaceable events are newer than 260.
    assert!(stores(&s, &keep1, &ev(1, 260, 1, "c")));
    assert!(!stores(&s, &keep1, &ev(1, 255, 1, "c")));
    // Replaceable events are never refused by a count.
    let keep0 = rules(vec![rule(&[], None, Some(0))], &[], false);
    assert!(!stores(&s, &keep0, &ev(4, 1, 1, "")));
    assert!(stores(&s, &keep0, &ev(4, 1, 0, "")));
    assert!(stores(&s, &keep0, &ev(4, 1, 30023, "")));
}

#[test]
fn a_count_rule_naming_kinds_counts_those_kinds_together() {
    let (_d, s) = open();
    for (t, kind) in [(100, 1), (200, 1), (210, 1), (250, 7), (300, 0), (400, 9)] {
        put(&s, &ev(1, t, kind, ""));
    }
    // Kind 0 is named but replaceable: ignored. Kinds 7 and 9 not named.
    let r = rules(vec![rule(&[1, 0], None, Some(2))], &[], false);
    assert!(!stores(&s, &r, &ev(1, 150, 1, "a")));
    assert!(stores(&s, &r, &ev(1, 205, 1, "a")));
    assert!(stores(&s, &r, &ev(1, 1, 7, "a")));
    // Kinds 1 and 7 together: 210 and 250 are newer than 209.
    let r = rules(vec![rule(&[7, 1], None, Some(2))], &[], false);
    assert!(!stores(&s, &r, &ev(1, 209, 1, "b")));
    assert!(!stores(&s, &r, &ev(1, 209, 7, "b")));
    assert!(stores(&s, &r, &ev(1, 211, 7, "b")));
    // Keeping 0 refuses every event of the named kinds, none other.
    let r = rules(vec![rule(&[1], None, Some(0))], &[], false);
    assert!(!stores(&s, &r, &ev(3, NOW, 1, "c")));
    assert!(stores(&s, &r, &ev(3, NOW, 7, "c")));
    // Kind 1 at 100, 200, 205, 210 are newer than 2: a keep of 4 refuses
    // it, a keep of 5 does not.
    let r = rules(vec![rule(&[1], None, Some(4))], &[], false);
    assert!(!stores(&s, &r, &ev(1, 2, 1, "d")));
    let r = rules(vec![rule(&[1], None, Some(5))], &[], false);
    assert!(stores(&s, &r, &ev(1, 2, 1, "d")));
}

#[test]
fn a_size_horizon_over_every_kind_refuses_older_non_replaceable_events() {
    let (_d, s) = open();
    let old: Vec<Event> = [100, 200, 300].iter().map(|&t| ev(1, t, 1, "")).collect();
    for e in &old {
        put(&s, e);
    }
    let all = Scope::All;
    let none = HashSet::new();
    let p = s
        .prune_oldest(
            &Scan {
                max_pick: 2,
                ..scan(&all, &none)
            },
            true,
        )
        .unwrap();
    assert_eq!(p.removed, 2);
    assert_eq!(s.size_horizons().unwrap(), vec![(Scope::All, 200)]);
    assert_eq!(
        present(&s, &[&old[0], &old[1], &old[2]]),
        [false, false, true]
    );

    let sized = rules(vec![], &[], true);
    assert!(!stores(&s, &sized, &ev(2, 199, 1, "")));
    assert!(!stores(&s, &sized, &ev(2, 10, 7, "")));
    assert!(stores(&s, &sized, &ev(2, 200, 1, "")));
    assert!(stores(&s, &sized, &ev(2, 201, 1, "")));
    // Never refused by size: replaceable events, deletions, exempt authors.
    assert!(stores(&s, &sized, &ev(2, 10, 0, "")));
    assert!(stores(&s, &sized, &ev(2, 10, 30023, "")));
    assert!(stores(&s, &sized, &ev(2, 10, 5, "")));
    assert!(stores(
        &s,
        &rules(vec![], &[pk(3)], true),
        &ev(3, 10, 1, "")
    ));
    // Without a size target the horizon refuses nothing.
    assert!(stores(&s, &rules(vec![], &[], false), &ev(2, 150, 1, "")));
}

#[test]
fn a_size_horizon_of_some_kinds_refuses_only_while_an_age_rule_names_them() {
    let (_d, s) = open();
    let ones = [ev(1, 100, 1, ""), ev(1, 200, 1, "")];
    let seven = ev(1, 150, 7, "");
    for e in ones.iter().chain([&seven]) {
        put(&s, e);
    }
    let kinds = Scope::of_kinds(&[1]);
    let none = HashSet::new();
    let p = s.prune_oldest(&scan(&kinds, &none), true).unwrap();
    assert_eq!(p.removed, 2);
    assert_eq!(
        present(&s, &[&ones[0], &ones[1], &seven]),
        [false, false, true]
    );
    assert_eq!(
        s.size_horizons().unwrap(),
        vec![(Scope::Kinds(vec![1]), 200)]
    );

    // An age rule naming kind 1 (too long to refuse by age): the horizon
    // refuses older kind-1 events, not other kinds.
    let aged = rules(vec![rule(&[1], Some(NOW), None)], &[], true);
    assert!(!stores(&s, &aged, &ev(2, 150, 1, "")));
    assert!(stores(&s, &aged, &ev(2, 150, 7, "")));
    assert!(stores(&s, &aged, &ev(2, 200, 1, "")));
    // Left by rules since changed, it refuses nothing: no rule, a count
    // rule of kind 1, an age rule of other kinds or of every kind.
    for changed in [
        vec![],
        vec![rule(&[1], None, Some(1000))],
        vec![rule(&[7], Some(NOW), None)],
        vec![rule(&[1, 7], Some(NOW), None)],
        vec![rule(&[], Some(NOW), None)],
    ] {
        let r = rules(changed.clone(), &[], true);
        assert!(
            stores(&s, &r, &ev(3, 150, 1, &format!("{changed:?}"))),
            "{changed:?}"
        );
    }
}

#[test]
fn horizons_are_listed_per_scope_and_only_ever_rise() {
    let (_d, s) = open();
    let none = HashSet::new();
    let (all, kinds) = (Scope::All, Scope::of_kinds(&[7, 1, 7]));
    assert_eq!(kinds, Scope::Kinds(vec![1, 7]));
    assert_eq!(s.size_horizons().unwrap(), vec![]);
    for (t, kind) in [(10, 1), (20, 7), (30, 9), (40, 1)] {
        put(&s, &ev(1, t, kind, ""));
    }
    // Without `horizon`, no horizon is left.
    let p = s
        .prune_oldest(
            &Scan {
                max_pick: 1,
                ..scan(&all, &none)
            },
            false,
        )
        .unwrap();
    assert_eq!(p.removed, 1);
    assert_eq!(s.size_horizons().unwrap(), vec![]);
    // Kinds 1 and 7: 20 and 40 go (30 is kind 9).
    let p = s.prune_oldest(&scan(&kinds, &none), true).unwrap();
    assert_eq!(p.removed, 2);
    assert_eq!(s.size_horizons().unwrap(), vec![(kinds.clone(), 40)]);
    // Every kind: 30 goes.
    s.prune_oldest(&scan(&all, &none), true).unwrap();
    assert_eq!(
        s.size_horizons().unwrap(),
        vec![(Scope::All, 30), (kinds.clone(), 40)]
    );
    // Removing an older event later leaves the horizon where it was.
    put(&s, &ev(1, 5, 1, ""));
    assert_eq!(s.prune_oldest(&scan(&all, &none), true).unwrap().removed, 1);
    // Removing nothing leaves it too.
    assert_eq!(s.prune_oldest(&scan(&all, &none), true).unwrap().removed, 0);
    assert_eq!(
        s.size_horizons().unwrap(),
        vec![(Scope::All, 30), (kinds.clone(), 40)]
    );
    put(&s, &ev(1, 50, 7, ""));
    s.prune_oldest(&scan(&kinds, &none), true).unwrap();
    assert_eq!(
        s.size_horizons().unwrap(),
        vec![(Scope::All, 30), (kinds, 50)]
    );
}

#[test]
fn removing_only_events_of_created_at_zero_leaves_no_horizon() {
    // A horizon of 0 would refuse nothing: none is recorded.
    let (_d, s) = open();
    let none = HashSet::new();
    let all = Scope::All;
    put(&s, &ev(1, 0, 1, ""));
    assert_eq!(s.prune_oldest(&scan(&all, &none), true).unwrap().removed, 1);
    assert_eq!(s.size_horizons().unwrap(), vec![]);
}

#[test]
fn a_damaged_horizon_fails_only_a_step_that_would_raise_it() {
    let (d, s) = open();
    let e = [ev(1, 10, 1, ""), ev(1, 20, 1, "")];
    for x in &e {
        put(&s, x);
    }
    s.close();
    // A horizon key whose kinds do not parse is not a horizon.
    support::raw_put(
        d.path(),
        "meta",
        b"retention_horizon:1,x",
        &5u64.to_be_bytes(),
    );
    let s = open_at(d.path());
    assert_eq!(s.size_horizons().unwrap(), vec![]);
    s.close();
    // A horizon value that is not 8 bytes.
    support::raw_put(d.path(), "meta", b"retention_horizon:*", b"bad");
    let s = open_at(d.path());
    assert!(matches!(
        s.size_horizons(),
        Err(StoreError::Corrupt { table: "meta", .. })
    ));
    let all = Scope::All;
    let none = HashSet::new();
    let one = Scan {
        max_pick: 1,
        ..scan(&all, &none)
    };
    // A step that removes nothing does not read the horizon.
    let p = s
        .prune_oldest(
            &Scan {
                before: 10,
                ..one.clone()
            },
            true,
        )
        .unwrap();
    assert_eq!((p.removed, p.examined, p.next), (0, 0, None));
    // One that removes fails, and removes nothing.
    assert!(matches!(
        s.prune_oldest(&one, true),
        Err(StoreError::Corrupt { table: "meta", .. })
    ));
    assert_eq!(present(&s, &[&e[0], &e[1]]), [true, true]);
    // Without raising the horizon, it removes.
    assert_eq!(s.prune_oldest(&one, false).unwrap().removed, 1);
    assert_eq!(present(&s, &[&e[0], &e[1]]), [false, true]);
}

/// Author 1's kind-1 events at 10..=50 (serials 1..=5), a replaceable one
/// at 25 (serial 6) and an exempt author's event at 35 (serial 7).
fn mixed(s: &Store) -> Vec<Event> {
    let events = vec![
        ev(1, 10, 1, ""),
        ev(1, 20, 1, ""),
        ev(1, 30, 1, ""),
        ev(1, 40, 1, ""),
        ev(1, 50, 1, ""),
        ev(1, 25, 0, ""),
        ev(2, 35, 1, ""),
    ];
    for (i, e) in events.iter().enumerate() {
        assert_eq!(put(s, e), i as u64 + 1);
    }
    events
}

#[test]
fn a_scan_picks_the_oldest_skipping_exempt_authors_and_current_replaceables() {
    let (_d, s) = open();
    let e = mixed(&s);
    let all = Scope::All;
    let exempt: HashSet<[u8; 32]> = [pk(2)].into();
    let p = s.pick_oldest(&scan(&all, &exempt)).unwrap();
    assert_eq!(
        p,
        Picked {
            serials: vec![1, 2, 3, 4, 5],
            keys: vec![(10, 1), (20, 2), (30, 3), (40, 4), (50, 5)],
            bytes: raw_len(&[&e[0], &e[1], &e[2], &e[3], &e[4]]),
            newest: 50,
            examined: 7,
            next: None,
        }
    );
    // With `replaceable`, the current version goes too; without exempt
    // authors, theirs too.
    let p = s
        .pick_oldest(&Scan {
            replaceable: true,
            ..scan(&all, &HashSet::new())
        })
        .unwrap();
    assert_eq!(p.serials, vec![1, 2, 6, 3, 7, 4, 5]);
    assert_eq!(p.bytes, raw_len(&e.iter().collect::<Vec<_>>()));
    assert_eq!((p.examined, p.newest, p.next), (7, 50, None));
    // Picking removes nothing.
    assert_eq!(s.stats().unwrap().events, 7);
}

#[test]
fn a_scan_stops_at_max_pick_and_max_examine_and_resumes_after() {
    let (_d, s) = open();
    let e = mixed(&s);
    let all = Scope::All;
    let exempt: HashSet<[u8; 32]> = [pk(2)].into();
    let p = s
        .pick_oldest(&Scan {
            max_pick: 2,
            ..scan(&all, &exempt)
        })
        .unwrap();
    assert_eq!(
        p,
        Picked {
            serials: vec![1, 2],
            keys: vec![(10, 1), (20, 2)],
            bytes: raw_len(&[&e[0], &e[1]]),
            newest: 20,
            examined: 2,
            next: Some((20, 2)),
        }
    );
    // Three entries at a time: 10, 20, 25 (skipped); 30, 35 (skipped),
    // 40; 50 and the end.
    let step = |after| {
        s.pick_oldest(&Scan {
            max_examine: 3,
            after,
            ..scan(&all, &exempt)
        })
        .unwrap()
    };
    let p = step(None);
    assert_eq!(
        (p.serials, p.examined, p.next),
        (vec![1, 2], 3, Some((25, 6)))
    );
    let p = step(Some((25, 6)));
    assert_eq!(
        (p.serials, p.examined, p.next),
        (vec![3, 4], 3, Some((40, 4)))
    );
    assert_eq!(p.keys, vec![(30, 3), (40, 4)]);
    let p = step(Some((40, 4)));
    assert_eq!((p.serials, p.examined, p.next), (vec![5], 1, None));
    // An exact fit reaches the end of the index only on the next walk.
    let p = s
        .pick_oldest(&Scan {
            max_examine: 7,
            ..scan(&all, &exempt)
        })
        .unwrap();
    assert_eq!((p.serials.len(), p.examined, p.next), (5, 7, Some((50, 5))));
    // Nothing examined, nothing after.
    let p = step(Some((50, 5)));
    assert_eq!(p, Picked::default());
    // A max_examine of 0 examines one.
    let p = s
        .pick_oldest(&Scan {
            max_examine: 0,
            ..scan(&all, &exempt)
        })
        .unwrap();
    assert_eq!((p.serials, p.examined, p.next), (vec![1], 1, Some((10, 1))));
}

#[test]
fn a_scan_with_before_picks_only_older_events() {
    let (_d, s) = open();
    mixed(&s);
    let all = Scope::All;
    let exempt: HashSet<[u8; 32]> = [pk(2)].into();
    let p = s
        .pick_oldest(&Scan {
            before: 30,
            ..scan(&all, &exempt)
        })
        .unwrap();
    assert_eq!((p.serials, p.examined, p.next), (vec![1, 2], 3, None));
    let p = s
        .pick_oldest(&Scan {
            before: 31,
            ..scan(&all, &exempt)
        })
        .unwrap();
    assert_eq!((p.serials, p.newest, p.next), (vec![1, 2, 3], 30, None));
    let p = s
        .pick_oldest(&Scan {
            before: 10,
            ..scan(&all, &exempt)
        })
        .unwrap();
    assert_eq!(p, Picked::default());
}

#[test]
fn a_scan_of_kinds_merges_them_by_time_up_to_the_first_source_cut_short() {
    let (_d, s) = open();
    // Serials: kind 1 at 10, 30, 50 (1, 2, 3); kind 7 at 20, 40 (4, 5);
    // kind 9 at 15 (6).
    for (t, kind) in [(10, 1), (30, 1), (50, 1), (20, 7), (40, 7), (15, 9)] {
        put(&s, &ev(1, t, kind, ""));
    }
    let kinds = Scope::of_kinds(&[1, 7]);
    let none = HashSet::new();
    let p = s.pick_oldest(&scan(&kinds, &none)).unwrap();
    assert_eq!(p.keys, vec![(10, 1), (20, 4), (30, 2), (40, 5), (50, 3)]);
    assert_eq!((p.examined, p.newest, p.next), (5, 50, None));
    // Two per kind: kind 1 gives 10, 30 and kind 7 20, 40; past 30 kind 1
    // may have more, so the walk stops there.
    let step = |after| {
        s.pick_oldest(&Scan {
            max_examine: 2,
            after,
            ..scan(&kinds, &none)
        })
        .unwrap()
    };
    let p = step(None);
    assert_eq!(
        (p.serials, p.examined, p.next),
        (vec![1, 4], 2, Some((20, 4)))
    );
    let p = step(Some((20, 4)));
    assert_eq!(
        (p.serials, p.examined, p.next),
        (vec![2, 5], 2, Some((40, 5)))
    );
    let p = step(Some((40, 5)));
    assert_eq!((p.serials, p.examined, p.next), (vec![3], 1, None));
    // Kind 1 cut short at 30, kind 9 (one entry) not: 10, 15, 30 merged,
    // two examined.
    let p = s
        .pick_oldest(&Scan {
            max_examine: 2,
            ..scan(&Scope::of_kinds(&[1, 9]), &none)
        })
        .unwrap();
    assert_eq!(p.keys, vec![(10, 1), (15, 6)]);
    assert_eq!(p.next, Some((15, 6)));
    let only7 = Scope::of_kinds(&[7]);
    let p = s
        .pick_oldest(&Scan {
            max_examine: 1,
            ..scan(&only7, &none)
        })
        .unwrap();
    assert_eq!((p.serials, p.next), (vec![4], Some((20, 4))));
}

#[test]
fn a_removal_step_removes_what_it_picks_and_raises_the_horizon() {
    let (_d, s) = open();
    let e: Vec<Event> = (1..=12).map(|i| ev(1, i * 10, 1, "")).collect();
    for x in &e {
        put(&s, x);
    }
    let refs: Vec<&Event> = e.iter().collect();
    let all = Scope::All;
    let none = HashSet::new();
    let p = s
        .prune_oldest(
            &Scan {
                max_pick: 4,
                ..scan(&all, &none)
            },
            true,
        )
        .unwrap();
    assert_eq!(p.removed, 4);
    assert_eq!(p.bytes, raw_len(&refs[..4]));
    assert_eq!(p.examined, 4);
    assert_eq!(p.next, Some((40, 4)));
    assert_eq!(s.size_horizons().unwrap(), vec![(Scope::All, 40)]);
    assert_eq!(
        present(&s, &refs),
        [[false; 4].as_slice(), &[true; 8]].concat()
    );
    // Unbounded time: all the rest (more than 7), in one step.
    let p = s
        .prune_oldest(
            &Scan {
                after: Some((40, 4)),
                ..scan(&all, &none)
            },
            true,
        )
        .unwrap();
    assert_eq!((p.removed, p.examined, p.next), (8, 8, None));
    assert_eq!(p.bytes, raw_len(&refs[4..]));
    assert_eq!(s.stats().unwrap().events, 0);
    assert_eq!(s.size_horizons().unwrap(), vec![(Scope::All, 120)]);
}

#[test]
fn a_removal_step_out_of_time_stops_after_seven_and_resumes_at_the_eighth() {
    let (_d, s) = open();
    let e: Vec<Event> = (1..=12).map(|i| ev(1, i * 10, 1, "")).collect();
    for x in &e {
        put(&s, x);
    }
    let refs: Vec<&Event> = e.iter().collect();
    let all = Scope::All;
    let none = HashSet::new();
    let hurried = Scan {
        max_time: Duration::ZERO,
        ..scan(&all, &none)
    };
    let p = s.prune_oldest(&hurried, true).unwrap();
    assert_eq!((p.removed, p.examined), (7, 12));
    // Just before the eighth (80, serial 8).
    assert_eq!(p.next, Some((80, 7)));
    assert_eq!(s.size_horizons().unwrap(), vec![(Scope::All, 70)]);
    assert_eq!(
        present(&s, &refs),
        [[false; 7].as_slice(), &[true; 5]].concat()
    );
    let p = s
        .prune_oldest(
            &Scan {
                after: p.next,
                ..hurried
            },
            true,
        )
        .unwrap();
    assert_eq!((p.removed, p.examined, p.next), (5, 5, None));
    assert_eq!(s.stats().unwrap().events, 0);
    assert_eq!(s.size_horizons().unwrap(), vec![(Scope::All, 120)]);
}

#[test]
fn an_evicting_batch_writes_then_removes_the_oldest_in_one_transaction() {
    let (_d, s) = open();
    let old: Vec<Event> = (1..=3).map(|i| ev(1, i * 10, 1, "")).collect();
    for x in &old {
        put(&s, x);
    }
    let all = Scope::All;
    let none = HashSet::new();
    let new = ev(2, 100, 1, "");
    let (out, p) = s
        .write_batch_evicting(
            [&new],
            NOW,
            &rules(vec![], &[], true),
            &Scan {
                max_pick: 2,
                ..scan(&all, &none)
            },
        )
        .unwrap();
    assert!(matches!(out[..], [WriteOutcome::Stored { serial: 4, .. }]));
    assert_eq!((p.removed, p.next), (2, Some((20, 2))));
    assert_eq!(
        present(&s, &[&old[0], &old[1], &old[2], &new]),
        [false, false, true, true]
    );
    assert_eq!(s.size_horizons().unwrap(), vec![(Scope::All, 20)]);
}

/// Author 1: kind 1 at 10, 20, 30, 40 (serials 1-4), kind 7 at 25 (5),
/// kind 0 at 50 (6), kind 30023 at 45 (7); author 2: kind 1 at 5 (8).
fn authored(s: &Store) {
    for (i, (key, t, kind)) in [
        (1, 10, 1),
        (1, 20, 1),
        (1, 30, 1),
        (1, 40, 1),
        (1, 25, 7),
        (1, 50, 0),
        (1, 45, 30023),
        (2, 5, 1),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(put(s, &ev(key, t, kind, "")), i as u64 + 1);
    }
}

#[test]
fn the_excess_of_an_author_is_beyond_their_newest_non_replaceable() {
    let (_d, s) = open();
    authored(&s);
    let a = pk(1);
    // Every kind: 40, 30 stay; 25, 20, 10 go (newest first).
    assert_eq!(
        s.pick_author_excess(&a, &[], 2, 10).unwrap(),
        (vec![5, 2, 1], false)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[], 2, 2).unwrap(),
        (vec![5, 2], true)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[], 2, 3).unwrap(),
        (vec![5, 2, 1], false)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[], 5, 10).unwrap(),
        (vec![], false)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[], 0, 1).unwrap(),
        (vec![4], true)
    );
    // Named kinds (kind 0 named but replaceable).
    assert_eq!(
        s.pick_author_excess(&a, &[1, 0], 1, 10).unwrap(),
        (vec![3, 2, 1], false)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[1, 0], 1, 3).unwrap(),
        (vec![3, 2, 1], false)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[7, 1], 1, 2).unwrap(),
        (vec![3, 5], true)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[7], 0, 5).unwrap(),
        (vec![5], false)
    );
    assert_eq!(
        s.pick_author_excess(&a, &[0, 30023], 0, 5).unwrap(),
        (vec![], false)
    );
    assert_eq!(
        s.pick_author_excess(&pk(2), &[], 1, 5).unwrap(),
        (vec![], false)
    );
    assert_eq!(
        s.pick_author_excess(&pk(2), &[], 0, 5).unwrap(),
        (vec![8], false)
    );
    // Picking removes nothing.
    assert_eq!(s.stats().unwrap().events, 8);
}

#[test]
fn removing_an_authors_excess_keeps_their_newest() {
    let (_d, s) = open();
    authored(&s);
    let a = pk(1);
    assert_eq!(
        s.prune_author_excess(&a, &[], 2, 2, Duration::MAX).unwrap(),
        (2, true)
    );
    assert_eq!(
        s.prune_author_excess(&a, &[], 2, 2, Duration::MAX).unwrap(),
        (1, false)
    );
    assert_eq!(
        s.prune_author_excess(&a, &[], 2, 2, Duration::MAX).unwrap(),
        (0, false)
    );
    // Left: 30, 40 and the replaceable ones of author 1, author 2's.
    let left = s.pick_author_excess(&a, &[], 0, 100).unwrap();
    assert_eq!(left, (vec![4, 3], false));
    assert_eq!(s.stats().unwrap().events, 5);
}

#[test]
fn an_excess_removal_out_of_time_stops_after_seven() {
    let (_d, s) = open();
    let e: Vec<Event> = (1..=12).map(|i| ev(1, i * 10, 1, "")).collect();
    for x in &e {
        put(&s, x);
    }
    let refs: Vec<&Event> = e.iter().collect();
    let a = pk(1);
    // Keep 2: 10 go, newest first; out of time after 7 (120..=30 stay).
    assert_eq!(
        s.prune_author_excess(&a, &[1], 2, 100, Duration::ZERO)
            .unwrap(),
        (7, true)
    );
    assert_eq!(
        present(&s, &refs),
        [[true; 3].as_slice(), &[false; 7], &[true; 2]].concat()
    );
    assert_eq!(
        s.prune_author_excess(&a, &[], 2, 100, Duration::MAX)
            .unwrap(),
        (3, false)
    );
    assert_eq!(
        present(&s, &refs),
        [[false; 10].as_slice(), &[true; 2]].concat()
    );
    // Unbounded time removes more than 7 in one step.
    let (_d2, s2) = open();
    for x in &e {
        put(&s2, x);
    }
    assert_eq!(
        s2.prune_author_excess(&a, &[], 1, 100, Duration::MAX)
            .unwrap(),
        (11, false)
    );
}

#[test]
fn authors_are_listed_in_key_order_a_page_at_a_time() {
    let (_d, s) = open();
    for key in [1, 2, 3] {
        put(&s, &ev(key, 10, 1, ""));
        put(&s, &ev(key, 20, 1, ""));
    }
    let mut want = vec![pk(1), pk(2), pk(3)];
    want.sort();
    assert_eq!(s.authors_after(None, 10).unwrap(), want);
    assert_eq!(s.authors_after(None, 2).unwrap(), want[..2]);
    assert_eq!(s.authors_after(Some(&want[1]), 2).unwrap(), want[2..]);
    assert_eq!(s.authors_after(Some(&want[0]), 1).unwrap(), want[1..2]);
    assert!(s.authors_after(Some(&want[2]), 2).unwrap().is_empty());
    assert!(s.authors_after(None, 0).unwrap().is_empty());
}

/// The bytes a compacted copy of the store takes: exactly its pages that
/// hold data.
fn compacted(s: &Store) -> u64 {
    let out = tempfile::tempdir().unwrap();
    s.compact_to(&out.path().join("copy")).unwrap()
}

#[test]
fn used_bytes_are_the_pages_a_compacted_copy_keeps() {
    let (_d, s) = open();
    assert_eq!(s.used_bytes().unwrap(), compacted(&s));
    // Branch pages (many events) and overflow pages (a large one), in
    // several tables (tags, expirations, addresses).
    let mut events: Vec<Event> = (0..600u64)
        .map(|i| {
            Event::sign(
                &[1; 32],
                NOW - 1000 + i,
                1,
                vec![
                    vec!["t".into(), format!("tag{}", i % 7)],
                    vec!["expiration".into(), (NOW + 10_000 + i).to_string()],
                ],
                &"x".repeat(200),
            )
        })
        .collect();
    events.push(ev(1, NOW, 1, &"y".repeat(20_000)));
    events.push(ev(1, NOW, 0, "profile"));
    s.write_batch(events.iter(), NOW).unwrap();
    let used = s.used_bytes().unwrap();
    assert_eq!(used, compacted(&s));
    assert_eq!(s.stats().unwrap().used_bytes, used);
    assert!(used <= s.stats().unwrap().file_bytes);
    // After removals the file keeps its free pages; used bytes do not.
    let all = Scope::All;
    let none = HashSet::new();
    s.prune_oldest(
        &Scan {
            max_pick: 500,
            ..scan(&all, &none)
        },
        false,
    )
    .unwrap();
    let after = s.used_bytes().unwrap();
    assert_eq!(after, compacted(&s));
    assert!(after < used);
}
