use super::*;

fn state(raw: f64, config: &PidConfig) -> PidState {
    PidState {
        raw_output: raw,
        output: raw.clamp(config.output_min, config.output_max),
        ..PidState::default()
    }
}

#[test]
fn verdict_from_controller() {
    let c = PidConfig::write_default();
    assert_eq!(
        Verdict::from_controller(&state(0.0, &c), &c, None),
        Verdict::Allow
    );
    assert_eq!(
        Verdict::from_controller(&state(-0.3, &c), &c, None),
        Verdict::Allow
    );
    assert_eq!(
        Verdict::from_controller(&state(0.25, &c), &c, None),
        Verdict::Delay(Duration::from_millis(250))
    );
    assert_eq!(
        Verdict::from_controller(&state(1.0, &c), &c, None),
        Verdict::Delay(Duration::from_secs(1)),
        "exactly the cap is still a delay"
    );
    assert_eq!(
        Verdict::from_controller(&state(1.5, &c), &c, None),
        Verdict::refuse(Cause::OverCap, Duration::from_millis(1500))
    );
    assert_eq!(
        Verdict::from_controller(&state(0.0, &c), &c, Some(Duration::from_secs(5))),
        Verdict::refuse(Cause::Emergency, Duration::from_secs(5))
    );
}

#[test]
fn a_lower_output_max_is_a_lower_cap() {
    let mut c = PidConfig::read_default();
    c.output_max = 0.5;
    // 200 ms scale, cap 100 ms: asking for 120 ms refuses.
    let v = Verdict::from_controller(&state(0.6, &c), &c, None);
    assert!(v.is_refuse(), "{v:?}");
    let v = Verdict::from_controller(&state(0.5, &c), &c, None);
    assert_eq!(v, Verdict::Delay(Duration::from_millis(100)));
}

#[test]
fn bits_round_trip() {
    let cases = [
        Verdict::Allow,
        Verdict::Delay(Duration::from_nanos(1)),
        Verdict::Delay(Duration::from_millis(734)),
        Verdict::refuse(Cause::Emergency, Duration::from_secs(5)),
        Verdict::refuse(Cause::OverCap, Duration::from_millis(1500)),
    ];
    for v in cases {
        assert_eq!(Verdict::from_bits(v.to_bits()), v);
    }
    let huge = Verdict::Delay(Duration::from_secs(u64::MAX));
    assert_eq!(
        Verdict::from_bits(huge.to_bits()),
        Verdict::Delay(Duration::from_nanos(NS_MASK))
    );
}

#[test]
fn delays_are_batched_refusals_are_not() {
    let delay = Verdict::Delay(Duration::from_millis(100));
    let mut a = DelayBatcher::new(10);
    let delayed = (0..100)
        .filter(|_| a.check(Mode::Enforce, delay).action() != Verdict::Allow)
        .count();
    assert_eq!(delayed, 10);
    let refuse = Verdict::refuse(Cause::OverCap, Duration::from_secs(1));
    let refused = (0..100)
        .filter(|_| a.check(Mode::Enforce, refuse).action().is_refuse())
        .count();
    assert_eq!(refused, 100);
}

#[test]
fn shadow_reports_but_allows_and_off_reports_nothing() {
    let refuse = Verdict::refuse(Cause::Emergency, Duration::from_secs(1));
    let mut a = DelayBatcher::new(1);
    let d = a.check(Mode::Shadow, refuse);
    assert_eq!(d.verdict, refuse);
    assert!(!d.enforced);
    assert_eq!(d.action(), Verdict::Allow);
    let d = a.check(Mode::Off, refuse);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.action(), Verdict::Allow);
    let d = a.check(Mode::Enforce, refuse);
    assert_eq!(d.action(), refuse);
}

#[test]
fn mode_names_and_bytes() {
    for m in [Mode::Enforce, Mode::Shadow, Mode::Off] {
        assert_eq!(Mode::from_u8(m as u8), m);
    }
    assert_eq!(Mode::from_u8(200), Mode::Enforce);
    assert_eq!(Mode::Shadow.as_str(), "shadow");
    assert_eq!(Mode::default(), Mode::Enforce);
}

#[test]
fn verdicts_serialize_with_the_delay_in_nanoseconds_and_back() {
    let d = Verdict::Delay(Duration::from_millis(250));
    let json = serde_json::to_string(&d).unwrap();
    assert_eq!(json, r#"{"delay_ns":250000000}"#);
    assert_eq!(serde_json::from_str::<Verdict>(&json).unwrap(), d);
    let allow = serde_json::to_string(&Verdict::Allow).unwrap();
    assert_eq!(
        serde_json::from_str::<Verdict>(&allow).unwrap(),
        Verdict::Allow
    );
}
