use std::collections::VecDeque;

use super::*;
use crate::{BucketConfig, TokenBucket};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// What a simulated upload saw.
#[derive(Debug)]
struct Run {
    /// Sends and `rate-limited` answers after the first 10 s.
    sends_late: u64,
    refused_late: u64,
    /// Admitted per second over the last 10 s.
    converged: f64,
    /// The pace every second.
    series: Vec<f64>,
}

/// Sluice's default EVENT bucket per address at `rate` (burst ratio 2,
/// a 2 s pool, 5 s banked), full at the start.
fn sluice_peer(rate: f64) -> BucketConfig {
    BucketConfig {
        rate_per_s: rate,
        burst_ratio: 2.0,
        window_ms: 2000,
        catch_up_ms: 5000,
    }
}

/// A plain bucket: `rate` per second, one second of burst, nothing banked
/// (the benchmark's strfry plugin).
fn strict_peer(rate: f64) -> BucketConfig {
    BucketConfig {
        rate_per_s: rate,
        burst_ratio: 1.0,
        window_ms: 1000,
        catch_up_ms: 0,
    }
}

/// An upload with an endless backlog for `secs` against a peer bucket,
/// answers `rtt_ns` after each send, at most `window` awaiting.
fn simulate(cfg: PaceConfig, peer: BucketConfig, rtt_ns: u64, window: usize, secs: u64) -> Run {
    simulate_with(cfg, peer, (rtt_ns, window, secs), 0..0)
}

/// [`simulate`], the sends numbered in `spurious` refused whatever the
/// bucket holds (the peer's passing trouble: a full writer queue).
fn simulate_with(
    cfg: PaceConfig,
    peer: BucketConfig,
    (rtt_ns, window, secs): (u64, usize, u64),
    spurious: std::ops::Range<u64>,
) -> Run {
    let mut n = 0;
    let mut pace = SendPace::new(cfg, 0);
    let mut bucket = TokenBucket::new(peer, 0).unwrap();
    // (answer time, sent time, admitted)
    let mut answers: VecDeque<(u64, u64, bool)> = VecDeque::new();
    let (mut sends_late, mut refused_late) = (0, 0);
    let mut admitted_last_10s = 0u64;
    let mut series = Vec::new();
    let mut now = 0;
    let end = secs * S;
    while now < end {
        let send_at = if answers.len() < window {
            now + pace.wait_ns(now)
        } else {
            u64::MAX
        };
        let answer_at = answers.front().map_or(u64::MAX, |a| a.0);
        now = send_at.min(answer_at);
        while series.len() as u64 <= now / S {
            series.push(pace.rate_per_s(now));
        }
        if answer_at <= send_at {
            let (_, sent, ok) = answers.pop_front().unwrap();
            if ok {
                pace.admitted(now);
                if now >= end - 10 * S {
                    admitted_last_10s += 1;
                }
            } else {
                pace.rate_limited(now, sent);
                if sent >= 10 * S {
                    refused_late += 1;
                }
            }
        } else {
            pace.sent(now);
            if now >= 10 * S {
                sends_late += 1;
            }
            let ok = bucket.try_take(now, 1).is_ok() && !spurious.contains(&n);
            n += 1;
            answers.push_back((now + rtt_ns, now, ok));
        }
    }
    Run {
        sends_late,
        refused_late,
        converged: admitted_last_10s as f64 / 10.0,
        series,
    }
}

/// The defaults, measured: against a peer limiting at 5, 20, 300 or
/// 2,000 EVENTs/s, with Sluice's bucket (a large burst and bank) or a plain
/// one, answers after 2 or 30 ms: after the first 10 s at most 5% of sends
/// are answered `rate-limited`, and over the last 10 s of two minutes the
/// peer admits within 20% of its limit (within 10%, in fact: the cut lands
/// under the admitted rate, not at half the rate).
#[test]
fn the_defaults_converge_near_any_peer_s_limit_with_few_refusals() {
    for rate in [5.0, 20.0, 300.0, 2000.0] {
        for (shape, peer) in [("sluice", sluice_peer(rate)), ("plain", strict_peer(rate))] {
            for rtt in [2 * MS, 30 * MS] {
                let r = simulate(PaceConfig::default(), peer, rtt, 64, 120);
                let share = r.refused_late as f64 / r.sends_late.max(1) as f64;
                let seen = format!(
                    "{shape} peer at {rate}/s, rtt {} ms: {:.2}% refused, converged at {:.1}/s; \
                     pace per second {:?}",
                    rtt / MS,
                    share * 100.0,
                    r.converged,
                    r.series
                );
                assert!(share <= 0.05, "{seen}");
                // 64 awaiting over 30 ms caps the sender itself near 2,133/s.
                let cap = rate.min(64.0 * S as f64 / rtt as f64);
                assert!((r.converged - cap).abs() <= 0.1 * cap, "{seen}");
            }
        }
    }
}

/// A few refusals early on that were not about our rate (the peer's
/// writer busy for a moment) cut the pace far under a fast peer's limit:
/// it climbs back to the limit within seconds, not minutes.
#[test]
fn a_pace_cut_far_under_the_limit_climbs_back_quickly() {
    let peer = sluice_peer(2000.0);
    for at in [30, 100, 300] {
        let r = simulate_with(PaceConfig::default(), peer, (2 * MS, 64, 60), at..at + 5);
        let seen = format!("refused at send {at}: pace per second {:?}", r.series);
        assert!((r.converged - 2000.0).abs() <= 200.0, "{seen}");
        // Back over half the limit within 20 s of the start.
        assert!(r.series[20] >= 1000.0, "{seen}");
    }
}

/// With `decrease = 0.5` a pure sawtooth from half the limit to the limit
/// would average 75% of it; the estimate keeps the cuts just under the
/// admitted rate, so the peer admits nearly its whole limit.
#[test]
fn the_estimate_keeps_a_halving_decrease_near_the_limit() {
    let halving = PaceConfig {
        decrease: 0.5,
        ..PaceConfig::default()
    };
    let with = simulate(halving, strict_peer(20.0), 2 * MS, 64, 120);
    assert!(with.converged >= 19.0, "{with:?}");
    // The arithmetic of a pure halving sawtooth from L/2 to L.
    let pure_mean = (0.5 + 1.0) / 2.0;
    assert!(with.converged / 20.0 > pure_mean + 0.15);
}

#[test]
fn the_leaky_bucket_spaces_sends_and_keeps_only_its_slack() {
    // 10/s: one send per 100 ms, never two at once.
    let cfg = PaceConfig {
        start_rate_per_s: 10.0,
        max_rate_per_s: 10.0,
        decrease: 0.5,
    };
    let mut p = SendPace::new(cfg, 0);
    assert_eq!(p.wait_ns(0), 0);
    p.sent(0);
    assert_eq!(p.wait_ns(0), 100 * MS);
    assert_eq!(p.wait_ns(60 * MS), 40 * MS);
    p.sent(100 * MS);
    assert_eq!(p.wait_ns(150 * MS), 50 * MS);
    // Idle for a second: one send goes at once, then the spacing again
    // (the slack, 20 ms, is less than one interval here).
    p.sent(1200 * MS);
    assert_eq!(p.wait_ns(1200 * MS), 100 * MS - SLACK_NS);
    // 2,000/s after an idle spell: the slack's 40 sends back to back, not
    // the whole idle second's 2,000.
    let fast = PaceConfig {
        start_rate_per_s: 2000.0,
        max_rate_per_s: 2000.0,
        decrease: 0.5,
    };
    let mut p = SendPace::new(fast, 0);
    let now = 5 * S;
    let mut burst = 0;
    while p.wait_ns(now) == 0 {
        p.sent(now);
        burst += 1;
        assert!(burst < 1000, "no bound");
    }
    assert_eq!(burst, 41, "the slack plus one");
    // The envelope over any interval: rate x time + slack + 1.
    let mut sent = 0u64;
    let mut t = now;
    while t < now + S {
        t += p.wait_ns(t);
        p.sent(t);
        sent += 1;
    }
    assert!(sent <= 2000 + 41 + 1, "{sent}");
    assert!(sent >= 1999, "{sent}");
}

/// Sends `n` at the pace from `from`, returning when the last went.
fn send_paced(p: &mut SendPace, from: u64, n: u64) -> u64 {
    let mut t = from;
    for _ in 0..n {
        t += p.wait_ns(t);
        p.sent(t);
    }
    t
}

#[test]
fn slow_start_doubles_per_paced_interval_up_to_the_maximum() {
    let cfg = PaceConfig {
        start_rate_per_s: 10.0,
        max_rate_per_s: 50.0,
        decrease: 0.5,
    };
    let mut p = SendPace::new(cfg, 0);
    assert!(p.in_slow_start());
    // Paced through the first interval: 10 → 20.
    send_paced(&mut p, 0, 5);
    assert_eq!(p.rate_per_s(INTERVAL_NS), 20.0);
    send_paced(&mut p, INTERVAL_NS, 10);
    assert_eq!(p.rate_per_s(2 * INTERVAL_NS), 40.0);
    send_paced(&mut p, 2 * INTERVAL_NS, 20);
    assert_eq!(p.rate_per_s(3 * INTERVAL_NS), 50.0, "capped");
    // An interval with little sent (no backlog) raises nothing, nor do
    // idle ones.
    p.sent(3 * INTERVAL_NS + 1);
    assert_eq!(p.rate_per_s(10 * INTERVAL_NS), 50.0);
    let mut idle = SendPace::new(cfg, 0);
    idle.sent(0);
    assert_eq!(idle.rate_per_s(40 * INTERVAL_NS), 10.0);
}

#[test]
fn a_cut_lands_under_the_admitted_rate_once_per_signal_then_steps_up() {
    let cfg = PaceConfig {
        start_rate_per_s: 40.0,
        max_rate_per_s: 1000.0,
        decrease: 0.5,
    };
    let mut p = SendPace::new(cfg, 0);
    // Two seconds at 40/s, of which the peer admitted 30/s.
    let mut t = 0;
    for i in 0..80u64 {
        t = i * 25 * MS;
        if i % 4 != 0 {
            p.admitted(t);
        }
    }
    assert!((p.admitted_per_s(t) - 30.0).abs() < 1.0);
    // Slow start would have doubled, but nothing was sent: still 40.
    assert_eq!(p.rate_per_s(t), 40.0);
    let sent_before = t - 10 * MS;
    assert!(p.rate_limited(t, sent_before));
    // max(0.5 × 40, 0.95 × 30) = 28.5 (30 admitted over 2 s, the slot in
    // progress included: within a slot of it).
    let after = p.rate_per_s(t);
    assert!((after - 28.5).abs() < 1.0, "{after}");
    assert!(!p.in_slow_start());
    assert_eq!(p.cuts(), 1);
    // Answers to events sent before the cut do not cut again.
    assert!(!p.rate_limited(t + MS, sent_before));
    assert_eq!(p.rate_per_s(t + MS), after);
    // The next send waits a whole interval at the new rate.
    let gap = (S as f64 / after) as u64;
    assert!(p.wait_ns(t + MS) + MS >= gap - 1);
    // Paced intervals then add 2% of the cut rate each.
    let mut now = p.wait_ns(t + MS) + t + MS;
    let start = now;
    while now < start + 3 * INTERVAL_NS + INTERVAL_NS / 2 {
        p.sent(now);
        now += p.wait_ns(now).max(1);
    }
    let raised = p.rate_per_s(now);
    assert!(
        raised > after + 2.0 * after * ADD_FRACTION - 1e-9,
        "{raised}"
    );
    assert!(
        raised < after + 4.0 * after * ADD_FRACTION + 1e-9,
        "{raised}"
    );
    // An event sent after the cut and refused cuts again; with nothing
    // admitted since, by the decrease factor's floor.
    let before = p.rate_per_s(now + 3 * S);
    assert!(p.rate_limited(now + 3 * S, now));
    let floor = p.rate_per_s(now + 3 * S);
    assert!((floor - before * 0.5).abs() < 1e-6, "{floor} {before}");
}

#[test]
fn a_rate_notice_cuts_at_most_once_per_hold() {
    let mut p = SendPace::new(PaceConfig::default(), 0);
    assert!(p.rate_notice(S));
    let r = p.rate_per_s(S);
    assert_eq!(r, 5.0, "halved: nothing admitted");
    assert!(!p.rate_notice(S + NOTICE_HOLD_NS - 1));
    assert!(p.rate_notice(S + NOTICE_HOLD_NS));
    // Never below the least rate, whatever the cuts.
    let mut t = 3 * S;
    for _ in 0..100 {
        p.rate_notice(t);
        t += NOTICE_HOLD_NS;
    }
    assert_eq!(p.rate_per_s(t), MIN_RATE_PER_S);
}

#[test]
fn time_going_backwards_changes_nothing() {
    let mut p = SendPace::new(PaceConfig::default(), 10 * S);
    p.sent(10 * S);
    let wait = p.wait_ns(10 * S);
    assert_eq!(p.wait_ns(S), wait + 9 * S);
    assert_eq!(p.rate_per_s(S), 10.0);
    let mut w = Window::new(100 * MS, 10);
    w.add(5 * S, 3);
    w.add(S, 2);
    assert_eq!(w.sum(5 * S), 5, "an early time counts in the newest slot");
}

#[test]
fn a_window_slides_slot_by_slot_and_its_rate_is_not_diluted_at_the_start() {
    let mut w = Window::new(100 * MS, 10);
    assert_eq!(w.span_ns(), S);
    w.add(0, 4);
    w.add(150 * MS, 6);
    assert_eq!(w.sum(900 * MS), 10);
    // At 1.0 s the slot of 0 ms is out; at 1.1 s the second too.
    assert_eq!(w.sum(S), 6);
    assert_eq!(w.sum(1100 * MS), 0);
    // Ten in the first 200 ms: 50/s, not 10/s.
    let mut w = Window::new(100 * MS, 10);
    w.add(0, 5);
    w.add(100 * MS, 5);
    assert_eq!(w.rate_per_s(200 * MS, 0), 50.0);
    assert_eq!(w.rate_per_s(10 * S, 0), 0.0);
    // A long gap clears every slot.
    w.add(10 * S, 1);
    assert_eq!(w.sum(10 * S), 1);
}

#[test]
fn the_retry_budget_is_a_fraction_of_first_sends_with_a_floor_per_window() {
    let mut b = RetryBudget::new(0.2, 3, 10 * S);
    // Nothing sent yet: the floor.
    assert_eq!(b.allowed(0), 3);
    for _ in 0..3 {
        assert!(b.try_retry(0));
    }
    assert!(!b.try_retry(0), "spent");
    assert_eq!(b.wait_ns(0), S, "the window slides in a second");
    assert_eq!(b.wait_ns(400 * MS), 600 * MS);
    // 50 first sends: 10 retries in the window, 3 already taken.
    for i in 0..50 {
        b.first_sent(i * 10 * MS);
    }
    assert_eq!(b.left(500 * MS), 7);
    // Once the window has slid past the retries and the first sends, the
    // floor is back.
    assert_eq!(b.left(9 * S), 7);
    assert_eq!(b.left(10 * S), 3, "the first second is out of the window");
    // However many were refused, retries in any window stay within the
    // budget: 1,000 first sends and as many retries asked, over 60 s.
    let mut b = RetryBudget::default();
    let (mut t, mut retried) = (0, Vec::new());
    while t < 60 * S {
        b.first_sent(t);
        if b.try_retry(t) {
            retried.push(t);
        }
        t += 60 * MS;
    }
    for start in (0..50).map(|s| s * S) {
        let firsts = (10 * S / (60 * MS)) as f64;
        let in_window = retried
            .iter()
            .filter(|&&r| r >= start && r < start + 9 * S)
            .count();
        assert!(
            in_window as f64 <= (firsts * RETRY_RATIO).max(RETRY_FLOOR as f64) + 1.0,
            "{in_window} retries in the 9 s from {start}"
        );
    }
}

#[test]
fn a_bad_setting_is_named() {
    let bad = |f: fn(&mut PaceConfig)| {
        let mut c = PaceConfig::default();
        f(&mut c);
        c.validate().unwrap_err().key
    };
    assert!(PaceConfig::default().validate().is_ok());
    assert_eq!(bad(|c| c.start_rate_per_s = 0.0), "start_rate_per_s");
    assert_eq!(bad(|c| c.max_rate_per_s = 5.0), "max_rate_per_s");
    assert_eq!(bad(|c| c.decrease = 1.0), "decrease");
    assert_eq!(bad(|c| c.decrease = f64::NAN), "decrease");
    // Clamped when not validated: a pace still works.
    let mut p = SendPace::new(
        PaceConfig {
            start_rate_per_s: f64::INFINITY,
            max_rate_per_s: -1.0,
            decrease: 7.0,
        },
        0,
    );
    assert_eq!(p.rate_per_s(0), MIN_RATE_PER_S);
}

#[test]
fn a_full_window_s_rate_is_over_its_full_slots_and_now_s_part() {
    // Ten slots of 100 ms, running for longer than its span: the rate is
    // over the nine full slots before now's and now's part so far.
    let mut w = Window::new(100 * MS, 10);
    w.add(9 * S + 500 * MS, 90);
    assert_eq!(w.rate_per_s(10 * S, 0), 100.0, "90 over 0.9 s");
    w.add(10 * S + 50 * MS, 5);
    assert_eq!(w.rate_per_s(10 * S + 50 * MS, 0), 100.0, "95 over 0.95 s");
}

#[test]
fn a_cut_takes_at_least_2_percent_off_whatever_the_peer_admitted() {
    let cfg = PaceConfig {
        start_rate_per_s: 100.0,
        max_rate_per_s: 1000.0,
        decrease: 0.5,
    };
    let mut p = SendPace::new(cfg, 0);
    // The peer admitted 200/s over the first second (more than the pace:
    // a backlog of earlier sends answered).
    for i in 0..200 {
        p.admitted(i * 5 * MS);
    }
    assert_eq!(p.admitted_per_s(S), 200.0);
    assert!(p.rate_limited(S, S - MS));
    // min(0.95 × 200, 0.98 × 100) = 98, above the floor of 50.
    assert_eq!(p.rate_per_s(S), 100.0 * LEAST_CUT);
    assert_eq!(p.cuts(), 1);
}

#[test]
fn after_a_cut_to_the_least_rate_a_paced_interval_adds_its_least_step() {
    let cfg = PaceConfig {
        start_rate_per_s: MIN_RATE_PER_S,
        max_rate_per_s: 10.0,
        decrease: 0.5,
    };
    let mut p = SendPace::new(cfg, 0);
    // Nothing admitted: the cut lands on the least rate, whose step is
    // 2% of it.
    assert!(p.rate_limited(0, 0));
    assert_eq!(p.rate_per_s(0), MIN_RATE_PER_S);
    // The interval of the cut raises nothing; the next, with a send (all
    // that 0.1/s allows), adds the step.
    assert_eq!(p.rate_per_s(INTERVAL_NS), MIN_RATE_PER_S);
    p.sent(INTERVAL_NS + 100 * MS);
    assert_eq!(
        p.rate_per_s(2 * INTERVAL_NS),
        MIN_RATE_PER_S + MIN_RATE_PER_S * ADD_FRACTION
    );
}

#[test]
fn an_event_sent_at_the_instant_of_the_cut_is_after_it_and_cuts_again() {
    let mut p = SendPace::new(PaceConfig::default(), 0);
    let cut = S;
    assert!(p.rate_limited(cut, cut - MS));
    assert_eq!(p.cuts(), 1);
    // Sent a nanosecond before the cut: answered already.
    assert!(!p.rate_limited(cut + 10 * MS, cut - 1));
    assert_eq!(p.cuts(), 1);
    // Sent at the cut's instant: a new signal.
    assert!(p.rate_limited(cut + 20 * MS, cut));
    assert_eq!(p.cuts(), 2);
    assert_eq!(p.rate_per_s(cut + 20 * MS), 2.5, "10 halved twice");
}
