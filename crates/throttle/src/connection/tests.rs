use std::time::Duration;

use super::*;
use crate::refusal::Cause;

const MS: u64 = 1_000_000;

fn delay() -> Verdict {
    Verdict::Delay(Duration::from_millis(100))
}

fn refuse(cause: Cause) -> Verdict {
    Verdict::refuse(cause, Duration::from_secs(1))
}

/// Runs `n` operations one `gap_ns` apart; returns the decisions.
fn run(
    adm: &mut ConnPacer,
    dir: Direction,
    mode: Mode,
    published: Verdict,
    n: u64,
    gap_ns: u64,
) -> Vec<Decision> {
    (1..=n)
        .map(|i| adm.check(dir, mode, published, 5.0, i * gap_ns))
        .collect()
}

#[test]
fn client_keys_group_an_ipv6_64_and_unmap_ipv4() {
    let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
    let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
    let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
    assert_eq!(client_key(a), client_key(b));
    assert_ne!(client_key(a), client_key(c));
    assert_eq!(client_key(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
    let v4: IpAddr = "192.0.2.7".parse().unwrap();
    assert_eq!(client_key(v4), v4);
    let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
    assert_eq!(client_key(mapped), v4);
}

#[test]
fn a_polite_connection_passes_everything_but_emergency() {
    // One operation a second: under the polite rate of 5/s.
    let slow = 1000 * MS;
    for published in [delay(), refuse(Cause::OverCap)] {
        let mut adm = ConnPacer::new(1);
        let d = run(
            &mut adm,
            Direction::Write,
            Mode::Enforce,
            published,
            20,
            slow,
        );
        assert!(d.iter().all(|d| d.action() == Verdict::Allow), "{d:?}");
    }
    let mut adm = ConnPacer::new(1);
    let emergency = refuse(Cause::Emergency);
    let d = run(
        &mut adm,
        Direction::Write,
        Mode::Enforce,
        emergency,
        20,
        slow,
    );
    assert!(d.iter().all(|d| d.action() == emergency));
}

#[test]
fn a_busy_connection_is_delayed_in_batches_and_refused_every_time() {
    // 1000 operations a second: far over the polite rate.
    let fast = MS;
    let mut adm = ConnPacer::new(4);
    let d = run(
        &mut adm,
        Direction::Write,
        Mode::Enforce,
        delay(),
        100,
        fast,
    );
    // The meter passes the polite rate within a few operations; from
    // then on every fourth operation is delayed: of operations 11-100,
    // 12, 16, ..., 100.
    let delayed: Vec<usize> = (10..100).filter(|&i| d[i].action() == delay()).collect();
    assert_eq!(delayed, (11..100).step_by(4).collect::<Vec<_>>(), "{d:?}");
    let over = refuse(Cause::OverCap);
    let d = run(&mut adm, Direction::Write, Mode::Enforce, over, 100, fast);
    assert!(d[10..].iter().all(|d| d.action() == over));
}

#[test]
fn reads_are_refused_but_never_delayed() {
    let mut adm = ConnPacer::new(1);
    let d = run(&mut adm, Direction::Read, Mode::Enforce, delay(), 100, MS);
    assert!(d.iter().all(|d| d.verdict == Verdict::Allow));
    let over = refuse(Cause::OverCap);
    let d = run(&mut adm, Direction::Read, Mode::Enforce, over, 100, MS);
    assert!(d[10..].iter().all(|d| d.action() == over));
}

#[test]
fn shadow_decides_the_same_and_applies_nothing() {
    let over = refuse(Cause::OverCap);
    let mut enforce = ConnPacer::new(1);
    let mut shadow = ConnPacer::new(1);
    let e = run(&mut enforce, Direction::Write, Mode::Enforce, over, 50, MS);
    let s = run(&mut shadow, Direction::Write, Mode::Shadow, over, 50, MS);
    for (e, s) in e.iter().zip(&s) {
        assert_eq!(e.verdict, s.verdict);
        assert!(e.enforced && !s.enforced);
        assert_eq!(s.action(), Verdict::Allow);
    }
}

#[test]
fn a_connection_at_exactly_the_polite_rate_is_not_polite() {
    // The first operation's rate is exactly 1/s: polite means below.
    let over = refuse(Cause::OverCap);
    let mut adm = ConnPacer::new(1);
    let d = adm.check(Direction::Write, Mode::Enforce, over, 1.0, MS);
    assert_eq!(d.action(), over);
    let mut adm = ConnPacer::new(1);
    let d = adm.check(Direction::Write, Mode::Enforce, over, 1.0 + 1e-9, MS);
    assert_eq!(d.action(), Verdict::Allow);
}
