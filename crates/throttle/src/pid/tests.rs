use super::*;

const TICK_NS: u64 = 100_000_000;

fn pid(config: PidConfig) -> Pid {
    Pid::new(config).expect("valid config")
}

#[test]
fn defaults_match_the_seed() {
    let w = PidConfig::write_default();
    assert_eq!(
        (w.kp, w.ki, w.kd, w.derivative_alpha),
        (0.5, 0.1, 0.05, 0.2)
    );
    assert_eq!((w.setpoint, w.max_delay_ms), (0.85, 1000));
    let r = PidConfig::read_default();
    assert_eq!(
        (r.kp, r.ki, r.kd, r.derivative_alpha),
        (0.3, 0.05, 0.02, 0.3)
    );
    assert_eq!((r.setpoint, r.max_delay_ms), (0.85, 200));
    let i = PidConfig::import_default();
    assert_eq!((i.setpoint, i.ki, i.kp), (0.70, 0.15, 0.5));
    for c in [w, r, i] {
        c.validate().expect("defaults validate");
    }
}

#[test]
fn invalid_configs_are_rejected_with_the_field_name() {
    let mut c = PidConfig::write_default();
    c.derivative_alpha = 0.0;
    assert_eq!(c.validate().unwrap_err().key, "derivative_alpha");
    let mut c = PidConfig::write_default();
    c.output_max = 1.5;
    assert_eq!(Pid::new(c).unwrap_err().key, "output_max");
    let mut c = PidConfig::write_default();
    c.kp = f64::NAN;
    assert_eq!(c.validate().unwrap_err().key, "kp");
    let mut c = PidConfig::write_default();
    c.max_delay_ms = 0;
    assert_eq!(c.validate().unwrap_err().key, "max_delay_ms");
}

#[test]
fn first_update_is_proportional_only() {
    let mut p = pid(PidConfig::write_default());
    let out = p.update(1.05, 0);
    assert!((out - 0.5 * 0.2).abs() < 1e-12, "{out}");
    assert_eq!(p.state().d, 0.0);
    assert_eq!(p.state().integral, 0.0);
}

#[test]
fn below_setpoint_output_is_zero() {
    let mut p = pid(PidConfig::write_default());
    for k in 0..200 {
        assert_eq!(p.update(0.6, k * TICK_NS), 0.0);
    }
    assert_eq!(p.delay(), Duration::ZERO);
    // The negative integral is bounded by integral_min.
    assert!(p.state().integral >= -0.5);
}

#[test]
fn integral_accumulates_error_seconds_and_is_clamped() {
    let mut c = PidConfig::write_default();
    c.kp = 0.0;
    c.kd = 0.0;
    let mut p = pid(c);
    p.update(0.95, 0);
    p.update(0.95, TICK_NS);
    // error 0.1 for 0.1 s.
    assert!((p.state().integral - 0.01).abs() < 1e-12);
    for k in 2..10_000 {
        p.update(0.95, k * TICK_NS);
    }
    assert!((p.state().integral - 2.0).abs() < 1e-12);
    assert!((p.output() - 0.2).abs() < 1e-12);
}

#[test]
fn saturation_does_not_wind_up_the_integral() {
    let mut p = pid(PidConfig::write_default());
    for k in 0..1000 {
        p.update(5.0, k * TICK_NS);
    }
    assert_eq!(p.output(), 1.0);
    assert!(p.state().raw_output > 1.0);
    // P alone saturates, so nothing was integrated.
    assert!(p.state().integral.abs() < 1e-9, "{}", p.state().integral);
}

#[test]
fn time_that_does_not_advance_integrates_nothing() {
    let mut p = pid(PidConfig::write_default());
    p.update(0.95, 5 * TICK_NS);
    p.update(0.95, 5 * TICK_NS);
    p.update(0.95, 4 * TICK_NS);
    assert_eq!(p.state().integral, 0.0);
}

#[test]
fn a_long_gap_counts_as_max_dt() {
    let mut c = PidConfig::write_default();
    c.integral_max = 1e6;
    let mut p = pid(c);
    p.update(1.85, 0);
    p.update(1.85, 3600 * 1_000_000_000);
    assert!((p.state().integral - 5.0).abs() < 1e-9);
}

#[test]
fn garbage_process_variables_are_clamped() {
    let mut p = pid(PidConfig::write_default());
    p.update(f64::NAN, 0);
    assert_eq!(p.state().process_variable, 0.0);
    p.update(f64::INFINITY, TICK_NS);
    assert_eq!(p.state().process_variable, MAX_PROCESS_VARIABLE);
    assert!(p.output().is_finite());
}

#[test]
fn reset_clears_state() {
    let mut p = pid(PidConfig::write_default());
    for k in 0..50 {
        p.update(1.0, k * TICK_NS);
    }
    assert!(p.output() > 0.0);
    p.reset();
    assert_eq!(*p.state(), PidState::default());
    // First update again: P only.
    p.update(0.95, 0);
    assert!((p.output() - 0.05).abs() < 1e-12);
}

#[test]
fn delay_maps_output_onto_max_delay() {
    let c = PidConfig::read_default();
    assert_eq!(c.delay_for(0.5), Duration::from_millis(100));
    assert_eq!(c.delay_for(2.0), Duration::from_millis(200));
    assert_eq!(c.delay_for(-1.0), Duration::ZERO);
    assert_eq!(c.delay_for(f64::NAN), Duration::ZERO);
}

#[test]
fn set_config_narrows_the_integral() {
    let mut c = PidConfig::write_default();
    c.kp = 0.0;
    let mut p = pid(c);
    for k in 0..1000 {
        p.update(1.0, k * TICK_NS);
    }
    assert!(p.state().integral > 1.0);
    c.integral_max = 0.5;
    p.set_config(c).unwrap();
    p.update(1.0, 1000 * TICK_NS);
    assert!(p.state().integral <= 0.5);
    let mut bad = c;
    bad.setpoint = -1.0;
    assert!(p.set_config(bad).is_err());
    assert_eq!(p.config().setpoint, c.setpoint);
}

#[test]
fn a_sample_at_the_same_time_keeps_the_derivative() {
    let mut c = PidConfig::write_default();
    c.derivative_alpha = 1.0;
    let mut p = pid(c);
    p.update(0.85, 0);
    p.update(0.95, TICK_NS);
    let (d, filtered) = (p.state().d, p.state().filtered_error);
    assert!((d - 0.05 * 0.1 / 0.1).abs() < 1e-9, "{d}");
    // Same instant, another value: no step to differentiate over.
    let out = p.update(1.25, TICK_NS);
    assert!(out.is_finite());
    assert_eq!(p.state().d, d);
    assert_eq!(p.state().filtered_error, filtered);
}

#[test]
fn the_integral_stops_where_the_output_reaches_its_max_counting_the_derivative() {
    let c = PidConfig {
        kp: 0.1,
        ki: 1.0,
        kd: 0.1,
        setpoint: 0.5,
        derivative_alpha: 1.0,
        integral_min: -1.0,
        integral_max: 10.0,
        output_min: 0.0,
        output_max: 1.0,
        max_delay_ms: 1000,
    };
    let mut p = pid(c);
    p.update(0.5, 0);
    p.update(2.5, 1_000_000_000);
    // p = 0.2, d = 0.1 * 2 / 1 = 0.2: the integral may reach
    // (1 - 0.2 - 0.2) / 1 = 0.6, not the 2 error-seconds seen.
    let s = p.state();
    assert!((s.p - 0.2).abs() < 1e-12 && (s.d - 0.2).abs() < 1e-12);
    assert!((s.integral - 0.6).abs() < 1e-12, "{}", s.integral);
    assert!((p.output() - 1.0).abs() < 1e-12);
}

#[test]
fn with_no_integral_gain_the_integral_still_counts_error_seconds() {
    // P alone saturates; with ki = 0 the integral changes no output,
    // and it is the plain error-seconds shown on /metrics.
    let mut c = PidConfig::write_default();
    c.ki = 0.0;
    c.kd = 0.0;
    let mut p = pid(c);
    p.update(3.85, 0);
    p.update(3.85, TICK_NS);
    assert_eq!(p.output(), 1.0);
    assert!(
        (p.state().integral - 0.3).abs() < 1e-12,
        "{}",
        p.state().integral
    );
}
