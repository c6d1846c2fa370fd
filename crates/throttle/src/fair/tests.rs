use super::bookkeeping::SPARE_QUEUES;
use super::*;
use crate::config::QuerySlots;

const MS: u64 = 1_000_000;
/// An author or id lookup's estimate (base, a few rows and bytes).
const CHEAP: u64 = 27;
/// A scan of 5,000 events' estimate.
const SCAN: u64 = 8429;

fn cfg(slots: u32) -> QueriesConfig {
    QueriesConfig {
        slots: QuerySlots::Count(slots),
        ..QueriesConfig::default()
    }
}

#[test]
fn runs_at_once_when_idle_and_goes_idle_after() {
    let mut q = FairQueue::new(cfg(2)).unwrap();
    let a = q.submit("a", 1, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    assert_eq!(q.dispatch_next(), None);
    assert_eq!(
        q.step_done(a, 10, MS, AfterStep::Finished),
        StepFate::Removed
    );
    q.check_invariants();
    assert!(q.is_idle());
}

#[test]
fn a_heavier_tier_keeps_the_headroom_a_lighter_burst_cannot_take() {
    // Weight-1 clients fill the window to its bound; a weight-2 client
    // that already has a query open (no new-flow headroom of its own)
    // is still admitted, and a weight-1 client in the same position is
    // not (no priority inversion: docs/design.md#backpressure).
    let mut q = FairQueue::new(QueriesConfig {
        max_open_units: 10 * SCAN,
        max_open_units_per_client: 4 * SCAN,
        deadline_ms: 1_000_000,
        ..QueriesConfig::default()
    })
    .unwrap();
    q.submit_weighted("trusted", 1, CHEAP, 2, 0, false).unwrap();
    q.submit_weighted("anon-x", 1, CHEAP, 1, 0, false).unwrap();
    let mut burst = 0;
    let mut refused = false;
    for c in 0..100 {
        let name: &'static str = Box::leak(format!("flood{c}").into_boxed_str());
        match q.submit_weighted(name, 2, 3 * SCAN, 1, 0, false) {
            Ok(_) => burst += 1,
            Err(_) => {
                refused = true;
                break;
            }
        }
    }
    assert!(refused, "the burst is refused at the bound");
    assert!(burst >= 3, "the burst filled the window ({burst})");
    let anon = q.submit_weighted("anon-x", 1, SCAN, 1, 0, false);
    assert_eq!(anon.unwrap_err().cause, Cause::QueueFull);
    q.submit_weighted("trusted", 1, SCAN, 2, 0, false)
        .expect("the heavier tier is admitted into the headroom");
    q.check_invariants();
}

#[test]
fn a_new_flow_overtakes_a_busy_client() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let heavy: Vec<_> = (0..8)
        .map(|_| q.submit("heavy", 1, CHEAP, 0).unwrap())
        .collect();
    let first = q.dispatch_next().unwrap();
    assert_eq!(first, heavy[0]);
    let polite = q.submit("polite", 2, CHEAP, 0).unwrap();
    q.step_done(first, 1000, MS, AfterStep::Continue);
    assert_eq!(q.dispatch_next(), Some(polite), "the new flow goes first");
    q.check_invariants();
}

#[test]
fn clients_share_steps_by_cost_not_by_request() {
    // Client a's steps cost 1000 units, b's 100: b gets about ten steps
    // for each of a's.
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        quantum_units: 100,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a = q.submit("a", 1, CHEAP, 0).unwrap();
    let b = q.submit("b", 2, CHEAP, 0).unwrap();
    let (mut na, mut nb) = (0, 0);
    for _ in 0..2200 {
        let id = q.dispatch_next().unwrap();
        let cost = if id == a {
            na += 1;
            1000
        } else {
            nb += 1;
            100
        };
        q.step_done(id, cost, MS, AfterStep::Continue);
    }
    let _ = b;
    let ratio = nb as f64 / na as f64;
    assert!((8.0..=12.0).contains(&ratio), "b/a steps {nb}/{na}");
    q.check_invariants();
}

#[test]
fn one_client_takes_one_slot_while_others_wait() {
    let mut q = FairQueue::new(cfg(4)).unwrap();
    for _ in 0..8 {
        q.submit("a", 1, CHEAP, 0).unwrap();
    }
    // Alone, it may use every slot.
    let got: Vec<_> = std::iter::from_fn(|| q.dispatch_next()).take(5).collect();
    assert_eq!(got.len(), 4);
    for id in got {
        q.step_done(id, 10, MS, AfterStep::Continue);
    }
    for _ in 0..8 {
        q.submit("b", 2, CHEAP, 0).unwrap();
    }
    let got: Vec<_> = std::iter::from_fn(|| q.dispatch_next()).take(5).collect();
    assert_eq!(got.len(), 4, "no slot idles");
    let a_running = q.clients.get("a").unwrap().load.running;
    let b_running = q.clients.get("b").unwrap().load.running;
    assert_eq!(a_running + b_running, 4);
    assert!(a_running >= 1 && b_running >= 1, "{a_running} {b_running}");
    q.check_invariants();
}

/// Runs one step of `units` (rows and bytes) taking `step_ns`, many
/// times, so the measured time per unit settles: a step costs its
/// units plus the base.
fn teach(q: &mut FairQueue<&'static str>, units: u64, step_ns: u64) {
    let id = q.submit("teacher", 99, units, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(id));
    for _ in 0..200 {
        q.step_done(id, units, step_ns, AfterStep::Continue);
        assert_eq!(q.dispatch_next(), Some(id));
    }
    q.step_done(id, units, step_ns, AfterStep::Finished);
    assert!(q.is_idle());
}

/// How many queries of `units` one client gets admitted before the
/// first refusal, and that refusal.
fn admitted_until_refused(
    q: &mut FairQueue<&'static str>,
    client: &'static str,
    units: u64,
) -> (usize, RateLimited) {
    for i in 0..1_000_000 {
        if let Err(r) = q.submit(client, 1, units, 0) {
            return (i, r);
        }
    }
    panic!("never refused");
}

/// The bounds of a queue that only the deadline limits.
fn deadline_only(slots: u32, deadline_ms: u64) -> QueriesConfig {
    QueriesConfig {
        slots: QuerySlots::Count(slots),
        deadline_ms,
        max_open_units: 1_000_000_000_000,
        max_open_units_per_client: 1_000_000_000_000,
        max_queued: 1_000_000,
        max_queued_per_client: 100_000,
        ..QueriesConfig::default()
    }
}

/// The wait is the cost ahead times the time per unit: at 1 us a unit
/// and a 100 ms deadline on one slot, a client alone may queue about
/// 100,000 units of next steps: thousands of cheap lookups; a scan's
/// next step is a full step (766 units), so far fewer scans.
#[test]
fn refuses_what_would_wait_past_the_deadline_by_cost_ahead() {
    let cfg = deadline_only(1, 100);
    let full_step = cfg.step_rows + cfg.step_bytes / cfg.cost.bytes_per_unit + 10;
    let mut q = FairQueue::new(cfg).unwrap();
    teach(&mut q, 990, MS);
    assert_eq!(q.stats().unit_ns, 1000, "{:?}", q.stats());

    let (cheap, r) = admitted_until_refused(&mut q, "a", CHEAP);
    assert_eq!(r.cause, Cause::Deadline);
    assert!(r.retry_after >= Duration::from_millis(100));
    let expect = (100 * MS / 1000 / CHEAP) as usize;
    assert!(
        (expect..=expect + 2).contains(&cheap),
        "{cheap} cheap admitted"
    );

    // Beside a's queue, b's steps ahead are matched by as many of a's
    // (the rotation shares by cost): half as many scans fit.
    let (scans, r) = admitted_until_refused(&mut q, "b", SCAN);
    assert_eq!(r.cause, Cause::Deadline);
    let expect = (100 * MS / 1000 / (2 * full_step)) as usize;
    assert!(
        (expect - 1..=expect + 1).contains(&scans),
        "{scans} scans admitted"
    );

    // A client with nothing open is a new flow: only the first steps
    // of other new flows are ahead of it.
    assert!(q.submit("c", 3, SCAN, 0).is_ok());
    q.check_invariants();
}

/// Another client's pile counts for its turns in the rotation, not for
/// all of its cost: a client with a query open (not a new flow) is
/// admitted beside a pile that would take seconds.
#[test]
fn another_clients_pile_counts_for_its_turns_only() {
    let mut q = FairQueue::new(deadline_only(1, 100)).unwrap();
    teach(&mut q, 990, MS);
    // c has a query open, parked: it is not a new flow.
    let parked = q.submit("c", 3, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(parked));
    q.step_done(parked, 5, 15_000, AfterStep::Park);
    for _ in 0..100 {
        q.submit("pile", 1, SCAN, 0).unwrap();
    }
    let queued = q.stats().queued_units;
    assert!(queued >= 100 * SCAN, "{queued} units queued: 0.8 s of work");
    let wait = q.estimated_wait(&"c");
    assert!(wait <= Duration::from_millis(2), "{wait:?}");
    assert!(q.submit("c", 3, CHEAP, 0).is_ok());
    q.check_invariants();
}

/// Thousands of cheap lookups from one client arriving together are
/// admitted with the default bounds (a count of 64 waiting per client
/// used to refuse them); a pile of scans from one client stops at its
/// cost bound.
#[test]
fn many_cheap_queries_fit_where_a_pile_of_scans_does_not() {
    let cfg = QueriesConfig::default();
    let per_client = cfg.max_open_units_per_client;
    let mut q = FairQueue::new(cfg).unwrap();
    for i in 0..8000 {
        assert!(q.submit("one-ip", 1, CHEAP, 0).is_ok(), "cheap query {i}");
    }
    q.check_invariants();
    let (scans, r) = admitted_until_refused(&mut q, "scanner", SCAN);
    assert_eq!(r.cause, Cause::ClientQueueFull);
    assert_eq!(scans as u64, per_client.div_ceil(SCAN), "{scans} scans");
    assert!(q.stats().open_units >= 8000 * CHEAP + per_client);
    // Its cheap query is refused too: the bound is on what it has open.
    assert_eq!(
        q.submit("scanner", 2, CHEAP, 0).unwrap_err().cause,
        Cause::ClientQueueFull
    );
    q.check_invariants();
}

/// One query alone is admitted whatever its estimate: the client's
/// bound refuses only what comes beside work already open.
#[test]
fn a_query_alone_is_admitted_whatever_its_cost() {
    let mut q = FairQueue::new(QueriesConfig {
        max_open_units_per_client: 1000,
        ..QueriesConfig::default()
    })
    .unwrap();
    let big = q.submit("a", 1, 1_000_000, 0).unwrap();
    assert_eq!(
        q.submit("a", 1, CHEAP, 0).unwrap_err().cause,
        Cause::ClientQueueFull
    );
    assert!(q.cancel(big));
    assert!(q.submit("a", 1, CHEAP, 0).is_ok(), "its units came back");
    q.check_invariants();
}

#[test]
fn queued_work_expires_at_its_deadline() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        deadline_ms: 50,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a = q.submit("a", 1, CHEAP, 0).unwrap();
    let b = q.submit("a", 1, CHEAP, 10 * MS).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    assert!(q.expire(55 * MS).is_empty(), "a started; b is 45 ms old");
    assert_eq!(q.expire(60 * MS), vec![b]);
    q.step_done(a, 1, MS, AfterStep::Finished);
    assert!(q.is_idle());
    q.check_invariants();
}

#[test]
fn parked_queries_hold_no_slot_and_wake_on_unpark() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a = q.submit("a", 7, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    assert_eq!(q.step_done(a, 10, MS, AfterStep::Park), StepFate::Parked);
    let b = q.submit("b", 8, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(b));
    q.unpark(7);
    assert_eq!(q.stats().queued, 1);
    q.check_invariants();
    q.step_done(b, 10, MS, AfterStep::Finished);
    assert_eq!(q.dispatch_next(), Some(a));
}

#[test]
fn the_queue_bound_keeps_room_for_new_flows() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        max_queued: 4,
        max_queued_per_client: 100,
        deadline_ms: 3_600_000,
        ..QueriesConfig::default()
    })
    .unwrap();
    for _ in 0..4 {
        q.submit("a", 1, CHEAP, 0).unwrap();
    }
    assert_eq!(
        q.submit("a", 1, CHEAP, 0).unwrap_err().cause,
        Cause::QueueFull
    );
    assert!(
        q.submit("b", 2, CHEAP, 0).is_ok(),
        "a new flow uses the reserve"
    );
    q.check_invariants();
}

/// The relay-wide cost bound refuses a flood's next query, and new
/// flows still have as much again in reserve.
#[test]
fn the_cost_bound_keeps_room_for_new_flows() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        max_open_units: 3 * SCAN,
        deadline_ms: 3_600_000,
        ..QueriesConfig::default()
    })
    .unwrap();
    for _ in 0..3 {
        q.submit("flood", 1, SCAN, 0).unwrap();
    }
    let running = q.dispatch_next().unwrap();
    assert_eq!(
        q.submit("flood", 1, CHEAP, 0).unwrap_err().cause,
        Cause::QueueFull
    );
    for polite in ["b", "c", "d"] {
        assert!(
            q.submit(polite, 2, SCAN, 0).is_ok(),
            "{polite} uses the reserve"
        );
    }
    assert_eq!(
        q.submit("e", 3, CHEAP, 0).unwrap_err().cause,
        Cause::QueueFull,
        "the reserve is bounded too"
    );
    // The polite clients' first steps go before the flood's next.
    assert_eq!(q.stats().open_units, 6 * SCAN);
    q.step_done(running, 700, MS, AfterStep::Continue);
    let next = q.dispatch_next().unwrap();
    assert_eq!(q.jobs[&next].client, "b");
    q.check_invariants();
}

#[test]
fn cancel_in_every_state_leaves_nothing_behind() {
    let mut q = FairQueue::new(cfg(2)).unwrap();
    let queued = q.submit("a", 1, CHEAP, 0).unwrap();
    let running = q.submit("b", 2, CHEAP, 0).unwrap();
    let parked = q.submit("c", 3, CHEAP, 0).unwrap();
    // b and c run (new flows go first, in order a, b, c: a runs too).
    let r1 = q.dispatch_next().unwrap();
    let r2 = q.dispatch_next().unwrap();
    assert_eq!((r1, r2), (queued, running));
    q.step_done(r1, 1, MS, AfterStep::Continue);
    let r3 = q.dispatch_next().unwrap();
    assert_eq!(r3, parked);
    q.step_done(r3, 1, MS, AfterStep::Park);
    assert!(q.cancel(queued));
    assert!(q.cancel(parked));
    assert!(!q.cancel(running), "leaves when its step reports");
    q.check_invariants();
    assert_eq!(
        q.step_done(running, 1, MS, AfterStep::Continue),
        StepFate::Removed
    );
    assert!(q.is_idle());
    q.check_invariants();
    assert!(!q.cancel(running), "unknown ids are ignored");
}

/// Random operations in any order (submits of either weight, with and
/// without the deadline, dispatches, steps ending every way, unparks,
/// cancels of queries in any state or already gone, expiries), then
/// every query cancelled or finished: the scheduler is idle, and its
/// sums, queues, lists and parked index add up after every operation.
#[test]
fn random_operations_keep_counts_true() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for round in 0..50 {
        let mut q = FairQueue::new(QueriesConfig {
            slots: QuerySlots::Count(1 + (round % 4)),
            max_queued: 16,
            max_queued_per_client: 4,
            max_open_units: 40_000,
            max_open_units_per_client: 15_000,
            deadline_ms: 1000,
            ..QueriesConfig::default()
        })
        .unwrap();
        let mut open: Vec<JobId> = Vec::new();
        let mut running: Vec<JobId> = Vec::new();
        let mut now = 0;
        for _ in 0..2000 {
            now += next(3) * MS;
            match next(7) {
                0 | 1 => {
                    let units = 1 + next(3) * next(10_000);
                    let (client, sink) = (next(5) as u8, next(5));
                    let (weight, deadline) = (1 + next(2) as u32 * 2, next(4) > 0);
                    let submitted = q.submit_weighted(client, sink, units, weight, now, deadline);
                    if let Ok(id) = submitted {
                        open.push(id);
                    }
                }
                2 => {
                    if let Some(id) = q.dispatch_next() {
                        running.push(id);
                    }
                }
                3 if !running.is_empty() => {
                    let id = running.swap_remove(next(running.len() as u64) as usize);
                    let after = match next(3) {
                        0 => AfterStep::Continue,
                        1 => AfterStep::Park,
                        _ => AfterStep::Finished,
                    };
                    q.step_done(id, next(2000), next(3) * MS, after);
                }
                4 => q.unpark(next(5)),
                5 if !open.is_empty() => {
                    let id = open.swap_remove(next(open.len() as u64) as usize);
                    q.cancel(id);
                }
                _ => {
                    q.expire(now);
                }
            }
            q.check_invariants();
        }
        for id in open {
            q.cancel(id);
        }
        for id in running {
            q.step_done(id, 1, MS, AfterStep::Continue);
        }
        q.check_invariants();
        assert!(q.is_idle(), "round {round}: {:?}", q.stats());
    }
}

#[test]
fn set_config_applies_a_valid_config_and_keeps_the_old_one_on_error() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a = q.submit("a", 1, CHEAP, 0).unwrap();
    let b = q.submit("b", 2, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    assert_eq!(q.dispatch_next(), None, "one slot");
    q.set_config(cfg(2)).unwrap();
    assert_eq!(q.slots(), 2);
    assert_eq!(q.dispatch_next(), Some(b), "the second slot is there");
    assert!(q.set_config(cfg(0)).is_err(), "0 slots is out of range");
    assert_eq!(q.slots(), 2, "the old config stays");
    q.check_invariants();
}

/// At 1 us a unit (the initial estimate) on one slot and a 1 ms
/// deadline, the new flows' first steps ahead may add up to 1,000
/// units: a wait of exactly the deadline is admitted, one past it is
/// refused, and the counters say so.
#[test]
fn a_wait_of_exactly_the_deadline_is_admitted_and_one_past_it_refused() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        deadline_ms: 1,
        ..QueriesConfig::default()
    })
    .unwrap();
    q.submit("a", 1, 500, 0).unwrap();
    q.submit("b", 2, 500, 0).unwrap();
    assert_eq!(q.estimated_wait(&"c"), Duration::from_millis(1));
    q.submit("c", 3, 500, 0)
        .expect("a wait of the deadline itself");
    assert_eq!(q.estimated_wait(&"d"), Duration::from_micros(1500));
    let r = q.submit("d", 4, 500, 0).unwrap_err();
    assert_eq!(r.cause, Cause::Deadline);
    assert_eq!(r.retry_after, Duration::from_micros(1500));
    let stats = q.stats();
    assert_eq!((stats.admitted_total, stats.refused_total), (3, 1));
    q.check_invariants();
}

/// A new flow waits for the first steps of the new flows before it,
/// at the time per unit (1 us before any step), over the slots; plus
/// half a step (1 ms before any step) when every slot is busy.
#[test]
fn a_new_flow_waits_for_the_first_steps_ahead_over_the_slots() {
    let mut q = FairQueue::new(cfg(2)).unwrap();
    assert_eq!(q.estimated_wait(&"c"), Duration::ZERO);
    q.submit("a", 1, 300, 0).unwrap();
    q.submit("b", 2, 500, 0).unwrap();
    // 800 units at 1 us, over 2 slots.
    assert_eq!(q.estimated_wait(&"c"), Duration::from_micros(400));
    q.dispatch_next().unwrap();
    assert_eq!(q.estimated_wait(&"c"), Duration::from_micros(250));
    q.dispatch_next().unwrap();
    // Nothing ahead, every slot busy: half a step.
    assert_eq!(q.estimated_wait(&"c"), Duration::from_micros(500));
    q.check_invariants();
}

/// A client whose query has not had its first step yet (it is still
/// a new flow) waits for that step once, not also as a new flow's.
#[test]
fn a_client_waiting_for_its_first_step_counts_it_once() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    q.submit("a", 1, 100, 0).unwrap();
    // Its own first step only: 100 units at 1 us.
    assert_eq!(q.estimated_wait(&"a"), Duration::from_micros(100));
    q.submit("b", 2, 200, 0).unwrap();
    // b's first step (200), its own (100), and b's turn meanwhile
    // (at most what b has queued, 200).
    assert_eq!(q.estimated_wait(&"a"), Duration::from_micros(500));
    q.check_invariants();
}

/// The step time and the time per unit are moving averages (weight 0.1
/// for the new sample) of the steps that ran; a step that did not run
/// (0 ns) changes neither, nor what is left of its query.
#[test]
fn a_step_that_ran_updates_the_averages_and_what_is_left() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a = q.submit("a", 1, 10_000, 0).unwrap();
    assert_eq!(q.stats().queued_units, 10_000);
    assert_eq!((q.stats().step_ns, q.stats().unit_ns), (1_000_000, 1000));
    assert_eq!(q.dispatch_next(), Some(a));
    // 990 units and the base of 10: 1000 units in 2 ms, 2 us a unit.
    q.step_done(a, 990, 2 * MS, AfterStep::Continue);
    let stats = q.stats();
    assert_eq!((stats.step_ns, stats.unit_ns), (1_100_000, 1100));
    assert_eq!(stats.queued_units, 9000, "10,000 less the 1000 spent");
    assert_eq!(q.dispatch_next(), Some(a));
    q.step_done(a, 990, 0, AfterStep::Continue);
    let stats = q.stats();
    assert_eq!((stats.step_ns, stats.unit_ns), (1_100_000, 1100));
    assert_eq!(stats.queued_units, 9000, "a step that did not run");
    q.check_invariants();
}

#[test]
fn a_query_that_had_its_first_step_never_expires() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        deadline_ms: 50,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a = q.submit("a", 1, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    q.step_done(a, 1, MS, AfterStep::Continue);
    assert!(q.expire(100 * MS).is_empty(), "queued again, but started");
    assert_eq!(q.stats().queued, 1);
    assert_eq!(q.stats().expired_total, 0);
    q.check_invariants();
}

/// Sizes of a scheduler with queries in every state: a and c each
/// have one running and one queued, b one parked.
#[test]
fn stats_report_the_queries_in_each_state() {
    let mut q = FairQueue::new(cfg(2)).unwrap();
    let a1 = q.submit("a", 1, 100, 0).unwrap();
    q.submit("a", 1, 200, 0).unwrap();
    let b1 = q.submit("b", 2, 300, 0).unwrap();
    let c1 = q.submit("c", 3, 400, 0).unwrap();
    q.submit("c", 3, 500, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a1));
    assert_eq!(q.dispatch_next(), Some(b1));
    assert_eq!(q.step_done(b1, 0, 0, AfterStep::Park), StepFate::Parked);
    assert_eq!(q.dispatch_next(), Some(c1));
    assert_eq!(
        q.stats(),
        FairStats {
            open: 5,
            running: 2,
            queued: 2,
            parked: 1,
            clients: 3,
            clients_waiting: 2,
            open_units: 1500,
            queued_units: 700,
            step_ns: 1_000_000,
            unit_ns: 1000,
            admitted_total: 5,
            refused_total: 0,
            expired_total: 0,
            cancelled_total: 0,
            finished_total: 0,
            steps_total: 3,
            new_flow_steps_total: 3,
        }
    );
    q.check_invariants();
}

/// Every way a query leaves is counted once: cancelled while queued,
/// parked or running (when its step reports), finished, expired.
#[test]
fn stats_count_each_way_a_query_leaves() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(2),
        deadline_ms: 50,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a1 = q.submit("a", 1, CHEAP, 0).unwrap();
    let a2 = q.submit("a", 1, CHEAP, 0).unwrap();
    let b1 = q.submit("b", 2, CHEAP, 0).unwrap();
    let b2 = q.submit("b", 2, CHEAP, 0).unwrap();
    let c1 = q.submit("c", 3, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a1));
    assert_eq!(q.dispatch_next(), Some(b1));
    assert!(!q.cancel(a1), "running: leaves when its step reports");
    assert_eq!(q.stats().cancelled_total, 0);
    assert_eq!(
        q.step_done(a1, 1, MS, AfterStep::Continue),
        StepFate::Removed
    );
    assert_eq!(q.stats().cancelled_total, 1);
    assert!(q.cancel(a2), "queued");
    assert_eq!(q.stats().cancelled_total, 2);
    assert_eq!(
        q.step_done(b1, 1, MS, AfterStep::Finished),
        StepFate::Removed
    );
    assert_eq!(q.stats().finished_total, 1);
    assert_eq!(q.dispatch_next(), Some(c1));
    assert_eq!(q.step_done(c1, 1, MS, AfterStep::Park), StepFate::Parked);
    assert!(q.cancel(c1), "parked");
    assert_eq!(q.expire(50 * MS), vec![b2]);
    let stats = q.stats();
    assert_eq!(
        (
            stats.cancelled_total,
            stats.finished_total,
            stats.expired_total,
            stats.steps_total,
            stats.new_flow_steps_total,
        ),
        (3, 1, 1, 3, 3)
    );
    assert!(q.is_idle());
    q.check_invariants();
}

/// A client that left and came back is a new entry: the stale place
/// of its earlier entry in the new flows gives it no turn.
#[test]
fn a_client_that_came_back_takes_no_new_flow_turn_from_its_last_visit() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a1 = q.submit("a", 1, CHEAP, 0).unwrap();
    assert!(q.cancel(a1));
    let b1 = q.submit("b", 2, CHEAP, 0).unwrap();
    let a2 = q.submit("a", 1, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(b1));
    q.step_done(b1, 1, MS, AfterStep::Finished);
    assert_eq!(q.dispatch_next(), Some(a2));
    q.check_invariants();
}

/// The same in the rotation: a's entry from before it left is skipped,
/// b's turn comes first.
#[test]
fn a_client_that_came_back_takes_no_turn_from_its_last_visit() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a1 = q.submit("a", 1, CHEAP, 0).unwrap();
    let a2 = q.submit("a", 1, CHEAP, 0).unwrap();
    let b1 = q.submit("b", 2, CHEAP, 0).unwrap();
    let b2 = q.submit("b", 2, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a1));
    q.step_done(a1, 0, 0, AfterStep::Continue);
    assert_eq!(q.dispatch_next(), Some(b1));
    q.step_done(b1, 0, 0, AfterStep::Continue);
    // Both take turns; a leaves and comes back with two queries.
    assert!(q.cancel(a1) && q.cancel(a2));
    let a3 = q.submit("a", 1, CHEAP, 0).unwrap();
    q.submit("a", 1, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a3), "a new flow again");
    q.step_done(a3, 0, 0, AfterStep::Continue);
    assert_eq!(q.dispatch_next(), Some(b2));
    q.check_invariants();
}

/// Two clients, each with two queries queued and none running, taking
/// turns in the order a, b, with deficits 0. `weights` are a's and
/// b's; the quantum is 100 units.
fn two_in_rotation(weights: (u32, u32), slots: u32) -> (FairQueue<&'static str>, [JobId; 4]) {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(slots),
        quantum_units: 100,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a1 = q
        .submit_weighted("a", 1, CHEAP, weights.0, 0, false)
        .unwrap();
    let a2 = q
        .submit_weighted("a", 1, CHEAP, weights.0, 0, false)
        .unwrap();
    let b1 = q
        .submit_weighted("b", 2, CHEAP, weights.1, 0, false)
        .unwrap();
    let b2 = q
        .submit_weighted("b", 2, CHEAP, weights.1, 0, false)
        .unwrap();
    assert_eq!(q.dispatch_next(), Some(a1));
    q.step_done(a1, 0, 0, AfterStep::Continue);
    assert_eq!(q.dispatch_next(), Some(b1));
    q.step_done(b1, 0, 0, AfterStep::Continue);
    assert_eq!(q.old_flows, [("a", 1), ("b", 2)]);
    (q, [a1, a2, b1, b2])
}

fn deficits(q: &FairQueue<&'static str>) -> (i64, i64) {
    (q.clients["a"].deficit, q.clients["b"].deficit)
}

/// Every client in debt after a turn: all are topped up by the rounds
/// of its quantum (100 for a, 3 × 100 for b) the nearest needs, here
/// 3 for b (from -700), and the turn goes on; a (-350 + 3 × 100 + 100)
/// comes first.
#[test]
fn clients_all_in_debt_are_topped_up_by_the_rounds_the_nearest_needs() {
    let (mut q, [_, a2, _, _]) = two_in_rotation((1, 3), 1);
    q.clients.get_mut("a").unwrap().deficit = -450;
    q.clients.get_mut("b").unwrap().deficit = -1000;
    assert_eq!(q.dispatch_next(), Some(a2));
    // b: -1000 + 300 (its turn) + 900 (3 rounds), within its quantum.
    assert_eq!(deficits(&q), (50, 200));
    q.check_invariants();
}

/// Alone and deep in debt (a step cost 3.5 quanta of twice the
/// weight), a client is still served at once: no worker idles beside
/// runnable work, and it starts its next turn with a full quantum.
#[test]
fn a_client_alone_in_debt_is_served_at_once() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        quantum_units: 100,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a = q.submit_weighted("a", 1, SCAN, 2, 0, false).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    q.step_done(a, 700, MS, AfterStep::Continue);
    assert_eq!(q.clients["a"].deficit, -700);
    assert_eq!(q.dispatch_next(), Some(a));
    assert_eq!(q.clients["a"].deficit, 200);
    // Its next step costs 1200, exactly 6 of its quanta.
    q.step_done(a, 1200, MS, AfterStep::Continue);
    assert_eq!(q.clients["a"].deficit, -1000);
    assert_eq!(q.dispatch_next(), Some(a));
    assert_eq!(q.clients["a"].deficit, 200);
    q.check_invariants();
}

/// The top-up skips a client at its running cap (it cannot take the
/// turn): its debt stays as it was.
#[test]
fn the_top_up_skips_a_client_at_its_running_cap() {
    let (mut q, [_, a2, _, b2]) = two_in_rotation((1, 1), 4);
    assert_eq!(q.dispatch_next(), Some(a2));
    q.clients.get_mut("a").unwrap().deficit = -1000;
    q.clients.get_mut("b").unwrap().deficit = -150;
    assert_eq!(q.dispatch_next(), Some(b2));
    assert_eq!(deficits(&q), (-1000, 100));
    q.check_invariants();
}

/// While another client waits, a client runs at most
/// `max_running_per_client` steps even when its deficit would give it
/// the turn: b, deep in debt, gets the second slot.
#[test]
fn a_client_at_its_running_cap_leaves_the_next_slot_to_another() {
    let (mut q, [_, a2, _, b2]) = two_in_rotation((1, 1), 2);
    q.clients.get_mut("b").unwrap().deficit = -1000;
    assert_eq!(q.dispatch_next(), Some(a2));
    assert_eq!(q.dispatch_next(), Some(b2));
    q.check_invariants();
}

/// Steps of 300 units and a quantum of 100: a client of weight 3 gets
/// a full step on each of its turns, one of weight 1 a step every
/// third turn, so 3 steps for 1 once both take turns.
#[test]
fn a_client_of_weight_three_gets_three_steps_for_one() {
    let mut q = FairQueue::new(QueriesConfig {
        slots: QuerySlots::Count(1),
        quantum_units: 100,
        ..QueriesConfig::default()
    })
    .unwrap();
    let a = q.submit_weighted("a", 1, SCAN, 1, 0, false).unwrap();
    q.submit_weighted("b", 2, SCAN, 3, 0, false).unwrap();
    let mut order = String::new();
    for _ in 0..403 {
        let id = q.dispatch_next().unwrap();
        order.push(if id == a { 'a' } else { 'b' });
        q.step_done(id, 300, 0, AfterStep::Continue);
    }
    // The two new flows, b's turn while a is in debt, then a's turn
    // every fourth step.
    assert_eq!(&order[..11], "abbabbbabbb");
    assert_eq!(order[3..].matches('a').count(), 100);
    assert_eq!(order[3..].matches('b').count(), 300);
    q.check_invariants();
}

/// Clients that leave give their emptied queue back for reuse, at
/// most `SPARE_QUEUES` of them.
#[test]
fn at_most_the_spare_queues_are_kept() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let ids: Vec<_> = (0..SPARE_QUEUES as u64 + 6)
        .map(|c| q.submit(c, c, CHEAP, 0).unwrap())
        .collect();
    for id in ids {
        assert!(q.cancel(id));
    }
    assert!(q.is_idle());
    assert_eq!(q.spare_queues.len(), SPARE_QUEUES);
}

/// What the scheduler's tables and queues hold room for.
fn room_of<K: Hash + Eq + Clone>(q: &FairQueue<K>) -> [usize; 5] {
    [
        q.jobs.capacity(),
        q.clients.capacity(),
        q.unstarted.capacity(),
        q.new_flows.capacity(),
        q.old_flows.capacity(),
    ]
}

/// A crowd of queries, each from a client of its own, some run to
/// their end, the rest cancelled or expired: the table of queries
/// shrinks as they go, and once all are gone every table and queue
/// has given back the room the crowd grew it to (the queues skipped
/// lazily hold stale entries until then).
#[test]
fn a_crowd_gone_leaves_no_room_behind() {
    let mut q = FairQueue::new(cfg(2)).unwrap();
    let ids: Vec<_> = (0..2000u64)
        .map(|c| q.submit(c, c, CHEAP, 0).unwrap())
        .collect();
    assert!(
        room_of(&q)[..4].iter().all(|r| *r >= 2000),
        "{:?}",
        room_of(&q)
    );
    // Two run, one is left queued behind the others for a while.
    let a = q.dispatch_next().unwrap();
    let b = q.dispatch_next().unwrap();
    assert_eq!(
        q.step_done(a, 1, MS, AfterStep::Finished),
        StepFate::Removed
    );
    assert_eq!(q.step_done(b, 1, MS, AfterStep::Continue), StepFate::Queued);
    for id in &ids[2..1999] {
        assert!(q.cancel(*id));
    }
    q.check_invariants();
    // Two still open: the table of queries has shrunk with the crowd.
    assert!(room_of(&q)[0] <= KEEP_ROOM, "{:?}", room_of(&q));
    let last = ids[1999];
    assert_eq!(q.expire(u64::MAX), vec![last]);
    let b = q.dispatch_next().unwrap();
    assert_eq!(
        q.step_done(b, 1, MS, AfterStep::Finished),
        StepFate::Removed
    );
    assert!(q.is_idle());
    assert!(
        room_of(&q).iter().all(|r| *r <= KEEP_ROOM),
        "{:?}",
        room_of(&q)
    );
    q.check_invariants();
}

const KEEP_ROOM: usize = crate::room::KEEP;

/// A change that keeps a queued query queued (here only what is left
/// of it) keeps its place in its client's queue.
#[test]
fn an_update_of_a_queued_query_keeps_it_queued() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a1 = q.submit("a", 1, 100, 0).unwrap();
    let a2 = q.submit("a", 1, 100, 0).unwrap();
    assert_eq!(
        q.update(a1, |job, _| job.remaining = 5),
        Some(State::Queued)
    );
    assert_eq!(q.clients["a"].queue, [a1, a2]);
    assert_eq!(q.stats().queued_units, 105);
    q.check_invariants();
}

/// A change that keeps a parked query parked keeps it in the parked
/// index; putting it back in the queue takes it out.
#[test]
fn an_update_of_a_parked_query_keeps_the_parked_index_true() {
    let mut q = FairQueue::new(cfg(1)).unwrap();
    let a = q.submit("a", 7, 1000, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    q.step_done(a, 0, 0, AfterStep::Park);
    assert_eq!(q.update(a, |job, _| job.remaining = 5), Some(State::Parked));
    assert_eq!(q.parked_by_sink[&7], [a]);
    q.check_invariants();
    q.requeue(a);
    assert!(q.parked_by_sink.is_empty());
    assert_eq!(q.stats().queued_units, 5);
    q.check_invariants();
}

/// A job with no client, in a scheduler otherwise idle.
fn stray_job() -> Job<&'static str> {
    Job {
        client: "a",
        sink: 1,
        state: State::Queued,
        started: false,
        cancelled: false,
        units: 1,
        remaining: 1,
        next_step: 1,
    }
}

/// `is_idle` tells any leftover: a job, a client, a parked index
/// entry, new flow units or a sum, each alone.
#[test]
fn is_idle_tells_each_leftover_alone() {
    let idle = FairQueue::new(cfg(1)).unwrap();
    assert!(idle.is_idle());
    let mut q = idle.clone();
    q.jobs.insert(1, stray_job());
    assert!(!q.is_idle(), "a job");
    let mut q = idle.clone();
    q.submit("a", 1, CHEAP, 0).unwrap();
    q.clients.get_mut("a").unwrap().load = Load::default();
    q.jobs.clear();
    q.load = Load::default();
    q.new_flow_units = 0;
    assert!(!q.is_idle(), "a client");
    let mut q = idle.clone();
    q.parked_by_sink.insert(1, vec![1]);
    assert!(!q.is_idle(), "a parked entry");
    let mut q = idle.clone();
    q.new_flow_units = 1;
    assert!(!q.is_idle(), "new flow units");
    let mut q = idle.clone();
    q.load.open_units = 1;
    assert!(!q.is_idle(), "a sum");
}

/// A scheduler with a query in each state, for the invariant checks.
fn busy() -> FairQueue<&'static str> {
    let mut q = FairQueue::new(cfg(2)).unwrap();
    let a = q.submit("a", 1, CHEAP, 0).unwrap();
    let b = q.submit("b", 2, CHEAP, 0).unwrap();
    q.submit("c", 3, CHEAP, 0).unwrap();
    assert_eq!(q.dispatch_next(), Some(a));
    assert_eq!(q.dispatch_next(), Some(b));
    q.step_done(b, 1, MS, AfterStep::Park);
    q.check_invariants();
    q
}

#[test]
#[should_panic(expected = "relay-wide sums")]
fn check_invariants_tells_a_wrong_sum() {
    let mut q = busy();
    q.load.queued_units += 1;
    q.check_invariants();
}

#[test]
#[should_panic(expected = "parked index")]
fn check_invariants_tells_a_parked_query_missing_from_the_index() {
    let mut q = busy();
    q.parked_by_sink.clear();
    q.check_invariants();
}

#[test]
#[should_panic(expected = "client queue holds its queued queries")]
fn check_invariants_tells_a_queued_query_missing_from_its_queue() {
    let mut q = busy();
    q.clients.get_mut("c").unwrap().queue.clear();
    q.check_invariants();
}

#[test]
#[should_panic(expected = "job without client")]
fn check_invariants_tells_a_job_without_its_client() {
    let mut q = busy();
    q.jobs.insert(
        100,
        Job {
            client: "stray",
            ..stray_job()
        },
    );
    q.check_invariants();
}
