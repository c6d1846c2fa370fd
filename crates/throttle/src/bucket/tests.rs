use super::*;

/// Takes until refused, failing (not spinning) if it never is.
fn drain(mut take: impl FnMut() -> bool) {
    for _ in 0..1_000_000 {
        if !take() {
            return;
        }
    }
    panic!("never refused");
}

const MS: u64 = 1_000_000;

/// The pools in ms, for exact comparisons.
fn pools(b: &TokenBucket) -> (u64, u64, u64, u64) {
    let s = &b.state;
    (s.pool_ns, s.burst_ns, s.wait_ns, s.debt_ns)
}

#[test]
fn charge_debt_refund_refill_and_the_retry_hint_are_exact() {
    // 1 ms per operation, a 10 ms pool, a burst pool as large (burst
    // ratio 2) and 20 ms of banked catch-up.
    let cfg = BucketConfig {
        rate_per_s: 1000.0,
        burst_ratio: 2.0,
        window_ms: 10,
        catch_up_ms: 20,
    };
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    assert_eq!(b.rate_per_s(), 1000.0);
    assert_eq!(b.config(), &cfg);
    assert_eq!(pools(&b), (10 * MS, 10 * MS, 20 * MS, 0));
    // 25 operations charged: the pool, then the burst pool, then 5 of debt.
    b.settle(0, 25);
    assert_eq!(pools(&b), (0, 0, 20 * MS, 5 * MS));
    // Refused while in debt: the debt, then half a ms (the burst pool
    // refills at twice the rate while banked time lasts), plus 1 ns.
    assert_eq!(
        b.try_take(0, 1),
        Err(Duration::from_nanos(5 * MS + MS / 2 + 1))
    );
    // 3 ms later the debt is 2; a refund of 4 pays it and puts 2 in the pool.
    b.settle(3 * MS, -4);
    assert_eq!(pools(&b), (2 * MS, 0, 20 * MS, 0));
    // 3 ms more: 3 into the pool, 3 of banked time into the burst pool.
    b.refund(6 * MS, 0);
    assert_eq!(pools(&b), (5 * MS, 3 * MS, 17 * MS, 0));
    // 7 operations: 5 from the pool, 2 from the burst pool.
    assert_eq!(b.try_take(6 * MS, 7), Ok(()));
    assert_eq!(pools(&b), (0, MS, 17 * MS, 0));
    // 2 more are 1 short: half a ms at the doubled rate, plus 1 ns.
    assert_eq!(b.try_take(6 * MS, 2), Err(Duration::from_nanos(MS / 2 + 1)));
    assert_eq!(pools(&b), (0, MS, 17 * MS, 0), "a refusal takes nothing");
    // A long idle fills every pool; the bank is capped.
    b.refund(1000 * MS, 0);
    assert_eq!(pools(&b), (10 * MS, 10 * MS, 20 * MS, 0));
    assert!(b.is_full(1000 * MS));
}

#[test]
fn the_retry_hint_counts_the_burst_refill_only_while_banked_time_and_room_last() {
    // 1 ms per operation, a 60 ms pool, a 30 ms burst pool (ratio 1.5:
    // it refills at half the rate on top) and 12 ms banked.
    let cfg = BucketConfig {
        rate_per_s: 1000.0,
        burst_ratio: 1.5,
        window_ms: 60,
        catch_up_ms: 12,
    };
    let ns = Duration::from_nanos;
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    assert_eq!(b.try_take(0, 60), Ok(()));
    assert_eq!(b.try_take(0, 20), Ok(()));
    assert_eq!(pools(&b), (0, 10 * MS, 12 * MS, 0));
    // 30 ms short: at 1.5 per ms, 20 ms, the bank (12 ms, room 20 ms)
    // covering the extra 10 ms.
    assert_eq!(b.try_take(0, 40), Err(ns(20 * MS + 1)));
    // 25 ms in the burst pool, 5 ms of room: 35 ms short is 23.3 ms at
    // 1.5 per ms, but the burst refill stops after 5 ms of extra, so
    // 35 - 5 = 30 ms.
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    assert_eq!(b.try_take(0, 60), Ok(()));
    assert_eq!(b.try_take(0, 5), Ok(()));
    assert_eq!(pools(&b), (0, 25 * MS, 12 * MS, 0));
    assert_eq!(b.try_take(0, 60), Err(ns(30 * MS + 1)));
    // A half-full pool refills to its cap, not past it (a take of
    // nothing refills without clamping anything after).
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    assert_eq!(b.try_take(0, 30), Ok(()));
    assert_eq!(b.try_take(1000 * MS, 0), Ok(()));
    assert_eq!(pools(&b), (60 * MS, 30 * MS, 12 * MS, 0));
    // Emptied, then 4 ms: 4 into the pool, 2 (half the time) of banked
    // time into the burst pool.
    assert_eq!(b.try_take(1000 * MS, 60), Ok(()));
    assert_eq!(b.try_take(1000 * MS, 30), Ok(()));
    assert_eq!(b.try_take(1004 * MS, 0), Ok(()));
    assert_eq!(pools(&b), (4 * MS, 2 * MS, 10 * MS, 0));
    // 60 wanted, 6 held: 54 short; 36 ms at 1.5 per ms would need 18 of
    // extra, the bank has 10: 54 - 10 = 44 ms.
    assert_eq!(b.try_take(1004 * MS, 60), Err(ns(44 * MS + 1)));
    assert_eq!(Params::new(&cfg, 1000.0).rate_per_s(), 1000.0);
}

#[test]
fn a_settlement_of_nothing_keeps_a_debt_above_a_new_rates_cap() {
    // 10 per second (100 ms each) in a 1 ms window: the pool is two
    // operations, 200 ms, and so is the debt's cap (nothing banked).
    let cfg = BucketConfig {
        rate_per_s: 10.0,
        burst_ratio: 1.0,
        window_ms: 1,
        catch_up_ms: 0,
    };
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    b.charge(0, 10);
    assert_eq!(pools(&b), (0, 0, 0, 200 * MS));
    // At 1000 per second the pool, and the debt's cap, are 2 ms; the
    // debt is kept (time, not operations).
    b.set_rate(1000.0);
    // A delta of 0 refunds nothing: the debt stays whole, where a
    // charge of nothing would cut it to the new cap.
    b.settle(0, 0);
    assert_eq!(pools(&b), (0, 0, 0, 200 * MS));
    assert_eq!(b.try_take(0, 1), Err(Duration::from_nanos(201 * MS + 1)));
    // A charge settles it at the new cap.
    b.settle(0, 1);
    assert_eq!(pools(&b), (0, 0, 0, 2 * MS));
}

#[test]
fn debt_is_capped_at_the_pool_and_the_bank() {
    let cfg = BucketConfig {
        rate_per_s: 1000.0,
        burst_ratio: 1.0,
        window_ms: 10,
        catch_up_ms: 20,
    };
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    b.charge(0, 1000);
    assert_eq!(pools(&b), (0, 0, 20 * MS, 30 * MS));
    // Without a burst ratio nothing moves into the burst pool: the
    // refill after the debt goes to the pool and the bank only.
    b.refund(35 * MS, 0);
    assert_eq!(pools(&b), (5 * MS, 0, 20 * MS, 0));
}

const SEC: u64 = 1_000_000_000;

fn bucket(rate: f64, burst: f64, window_ms: u64, catch_up_ms: u64) -> TokenBucket {
    TokenBucket::new(
        BucketConfig {
            rate_per_s: rate,
            burst_ratio: burst,
            window_ms,
            catch_up_ms,
        },
        0,
    )
    .expect("valid")
}

/// Offers one operation every `gap_ns` from `start` to `end` and counts
/// the admitted ones.
fn offer(b: &mut TokenBucket, start: u64, end: u64, gap_ns: u64) -> u64 {
    let mut ok = 0;
    let mut t = start;
    while t < end {
        if b.try_take(t, 1).is_ok() {
            ok += 1;
        }
        t += gap_ns;
    }
    ok
}

#[test]
fn new_bucket_allows_window_plus_burst_at_once_then_refuses() {
    // 100/s, 1 s window: 100 ops in the pool, 50 in the burst pool.
    let mut b = bucket(100.0, 1.5, 1000, 2000);
    let mut ok = 0;
    while b.try_take(0, 1).is_ok() {
        ok += 1;
        assert!(ok <= 1000, "never refuses");
    }
    assert_eq!(ok, 150);
}

#[test]
fn sustained_rate_is_the_configured_rate() {
    // No burst: after the initial pool, exactly 100/s get through.
    let mut b = bucket(100.0, 1.0, 1000, 0);
    offer(&mut b, 0, 2 * SEC, 1_000_000); // drain the pool
    let ok = offer(&mut b, 2 * SEC, 12 * SEC, 1_000_000); // 1000/s offered
    assert!((999..=1001).contains(&ok), "{ok}");
}

#[test]
fn idle_client_catches_up_at_rate_times_burst_then_slows_to_rate() {
    // 100/s, catch-up 2x, 2 s banked: after idling, 200/s for about
    // 2 s (the banked time), then 100/s.
    let mut b = bucket(100.0, 2.0, 1000, 2000);
    offer(&mut b, 0, 3 * SEC, 1_000_000); // drain everything
    assert_eq!(b.state.wait_ns, 0, "bank spent");
    assert!(b.state.burst_ns < b.params.interval_ns);
    // Idle for 10 s: pool full, burst full, 2 s banked.
    let start = 13 * SEC;
    let first = offer(&mut b, start, start + SEC, 100_000); // 10k/s offered
    // Pool (100) + burst (100) + refill at 2x for 1 s (200).
    assert!((395..=405).contains(&first), "{first}");
    let second = offer(&mut b, start + SEC, start + 2 * SEC, 100_000);
    assert!((195..=205).contains(&second), "still catching up: {second}");
    offer(&mut b, start + 2 * SEC, start + 3 * SEC, 100_000);
    let later = offer(&mut b, start + 3 * SEC, start + 4 * SEC, 100_000);
    assert!((95..=105).contains(&later), "back to rate: {later}");
}

#[test]
fn long_run_average_never_exceeds_rate_plus_capacity() {
    let mut b = bucket(50.0, 3.0, 500, 5000);
    // Bursty offered load: 1000/s for 1 s, then idle 2 s, repeated.
    let mut ok = 0;
    for cycle in 0..20 {
        let t0 = cycle * 3 * SEC;
        ok += offer(&mut b, t0, t0 + SEC, 1_000_000);
    }
    let horizon_s = 60.0;
    let bound = 50.0 * horizon_s + 50.0 * (0.5 * 3.0 + 5.0);
    assert!((ok as f64) <= bound, "{ok} > {bound}");
    assert!(ok as f64 >= 50.0 * horizon_s * 0.9, "{ok}");
}

#[test]
fn retry_after_is_exact_enough() {
    let mut b = bucket(10.0, 1.0, 1000, 0);
    for _ in 0..10 {
        b.try_take(0, 1).unwrap();
    }
    let retry = b.try_take(0, 1).unwrap_err();
    assert!(
        retry >= Duration::from_millis(100) && retry <= Duration::from_micros(100_001),
        "{retry:?}"
    );
    let at = retry.as_nanos() as u64;
    assert!(b.try_take(at - 2, 1).is_err(), "too early");
    assert!(b.try_take(at, 1).is_ok(), "on time");
}

#[test]
fn retry_after_counts_the_catch_up_boost() {
    let mut b = bucket(10.0, 2.0, 1000, 1000);
    // Drain pool and burst while keeping the bank: take everything at t=0.
    drain(|| b.try_take(0, 1).is_ok());
    let retry = b.try_take(0, 1).unwrap_err();
    // Banked time refills the burst pool at 1x extra: twice as fast.
    assert!(retry <= Duration::from_millis(51), "{retry:?}");
    assert!(b.try_take(retry.as_nanos() as u64, 1).is_ok());
}

#[test]
fn a_refused_call_takes_nothing_and_cost_is_capped() {
    let mut b = bucket(10.0, 1.0, 1000, 0);
    assert!(b.try_take(0, 5).is_ok());
    assert!(b.try_take(0, 6).is_err());
    assert!(b.try_take(0, 5).is_ok());
    // An expensive op a full bucket cannot hold is charged as a full pool.
    assert!(b.try_take(SEC, 1000).is_ok());
    assert!(b.try_take(SEC, 1).is_err());
}

#[test]
fn set_rate_changes_the_cost_not_the_banked_time() {
    let mut b = bucket(100.0, 1.0, 1000, 0);
    offer(&mut b, 0, 2 * SEC, 1_000_000);
    b.set_rate(10.0);
    assert_eq!(b.rate_per_s(), 10.0);
    let ok = offer(&mut b, 2 * SEC, 12 * SEC, 1_000_000);
    assert!((99..=101).contains(&ok), "{ok}");
    b.set_rate(0.0);
    assert_eq!(b.rate_per_s(), MIN_RATE_PER_S);
    b.set_rate(f64::NAN);
    assert_eq!(b.rate_per_s(), MIN_RATE_PER_S);
}

#[test]
fn clock_going_backwards_refills_nothing() {
    let mut b = bucket(10.0, 1.0, 1000, 0);
    drain(|| b.try_take(5 * SEC, 1).is_ok());
    assert!(b.try_take(SEC, 1).is_err());
    assert!(b.try_take(5 * SEC, 1).is_err());
    assert!(b.try_take(5 * SEC + 100_000_001, 1).is_ok());
}

#[test]
fn full_again_after_idle() {
    let mut b = bucket(10.0, 1.5, 1000, 2000);
    assert!(b.is_full(0));
    b.try_take(0, 1).unwrap();
    assert!(!b.is_full(0));
    // One op from a full bucket: full again one interval later.
    assert!(b.is_full(100_000_000));
    drain(|| b.try_take(SEC, 1).is_ok());
    assert!(!b.is_full(SEC + SEC / 2));
    // Pool refills in 1 s, the burst pool from the bank, the bank is
    // topped up from the time after that.
    assert!(b.is_full(4 * SEC));
}

#[test]
fn scaled_rate_scales_and_floors() {
    assert_eq!(scaled_rate(100.0, 0.0, 0.1), 100.0);
    assert_eq!(scaled_rate(100.0, 0.25, 0.1), 75.0);
    assert_eq!(scaled_rate(100.0, 1.0, 0.1), 10.0);
    assert_eq!(scaled_rate(100.0, 7.0, 0.1), 10.0);
    assert_eq!(scaled_rate(100.0, f64::NAN, 0.1), 100.0);
    assert_eq!(scaled_rate(100.0, 1.0, 0.0), MIN_RATE_PER_S);
}

#[test]
fn invalid_configs_are_rejected() {
    let c = BucketConfig {
        rate_per_s: 0.0,
        ..BucketConfig::default()
    };
    assert_eq!(TokenBucket::new(c, 0).unwrap_err().key, "rate_per_s");
    let c = BucketConfig {
        burst_ratio: 0.5,
        ..BucketConfig::default()
    };
    assert_eq!(c.validate().unwrap_err().key, "burst_ratio");
}

#[test]
fn charged_debt_refuses_until_time_pays_it() {
    // 1000 units/s, 1 s window, no catch-up.
    let mut b = bucket(1000.0, 1.0, 1000, 0);
    assert!(b.try_take(0, 10).is_ok());
    // Settle a query that really cost 3000 units: 990 from the pool,
    // the rest (2010 units = 2.01 s) as debt, capped at one pool (1 s).
    b.charge(0, 3000);
    let wait = b.try_take(0, 1).unwrap_err();
    assert!(wait >= Duration::from_millis(1000), "{wait:?}");
    // Half a second later still in debt; after the debt, admitted.
    assert!(b.try_take(SEC / 2, 1).is_err());
    assert!(b.try_take(SEC + SEC / 100, 1).is_ok());
    // A refund pays debt first, then refills the pool up to its cap.
    b.charge(2 * SEC, 1500);
    b.refund(2 * SEC, 1500);
    assert!(b.try_take(2 * SEC, 1).is_ok());
    // A refund never fills the pool past its cap (1000 units).
    b.refund(2 * SEC, 1_000_000);
    assert!(b.try_take(2 * SEC, 1000).is_ok());
    assert!(b.try_take(2 * SEC, 1).is_err());
}

#[test]
fn a_bucket_resumed_from_its_pools_goes_on_where_it_was() {
    let cfg = BucketConfig {
        rate_per_s: 1000.0,
        burst_ratio: 1.0,
        window_ms: 10,
        catch_up_ms: 0,
    };
    let mut b = TokenBucket::new(cfg, 0).unwrap();
    b.try_take(0, 7).unwrap();
    let mut again = TokenBucket::resume(cfg, 1000.0, b.pools());
    assert_eq!(pools(&again), pools(&b));
    assert!(again.try_take(0, 3).is_ok());
    assert!(again.try_take(0, 1).is_err(), "10 taken of a 10 ms pool");
    // At another rate the same pools last longer.
    let slow = TokenBucket::resume(cfg, 100.0, b.pools());
    assert_eq!(slow.rate_per_s(), 100.0);
}
