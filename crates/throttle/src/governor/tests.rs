use super::*;

const TICK_NS: u64 = 100_000_000;
const MIB: u64 = 1 << 20;

#[test]
fn quiet_relay_allows_everything() {
    let mut g = Governor::new(ThrottleConfig::default()).unwrap();
    assert_eq!(g.verdict(Direction::Write), Verdict::Allow);
    for k in 0..100 {
        let s = g.tick(300 * MIB, &LoadSignals::default(), k * TICK_NS);
        assert!(s.process_variable < 0.3);
        assert_eq!(s.write.verdict, Verdict::Allow);
        assert_eq!(s.read.verdict, Verdict::Allow);
    }
    assert_eq!(g.state().ticks, 100);
}

#[test]
fn process_variable_uses_weights_and_the_bottleneck() {
    let mut g = Governor::new(ThrottleConfig::default()).unwrap();
    let signals = LoadSignals {
        writer_wait_secs: 0.2,
        read_latency_secs: 0.05,
        ..LoadSignals::default()
    };
    let s = g.tick(512 * MIB, &signals, 0);
    assert!((s.memory_pressure - 0.5).abs() < 1e-12);
    assert!((s.load_level - 2.0).abs() < 1e-12);
    assert!((s.process_variable - (0.35 + 0.6)).abs() < 1e-12);
    // 0.95 > 0.85: both controllers delay, writes by more (higher Kp
    // and a longer scale).
    assert!(s.write.delay_ns > s.read.delay_ns && s.read.delay_ns > 0);
    assert!(matches!(s.write.verdict, Verdict::Delay(_)));
}

#[test]
fn emergency_refuses_both_directions_and_clears() {
    let mut g = Governor::new(ThrottleConfig::default()).unwrap();
    let s = g.tick(1100 * MIB, &LoadSignals::default(), 0);
    assert!(s.emergency);
    for v in [s.write.verdict, s.read.verdict] {
        assert!(v.is_emergency(), "{v:?}");
    }
    let s = g.tick(950 * MIB, &LoadSignals::default(), TICK_NS);
    assert!(s.emergency, "hysteresis: 0.93 is above exit 0.9");
    let s = g.tick(800 * MIB, &LoadSignals::default(), 2 * TICK_NS);
    assert!(!s.emergency);
    assert!(!s.write.verdict.is_refuse());
    assert_eq!(s.emergency_entered_total, 1);
}

#[test]
fn reload_applies_and_bad_reload_changes_nothing() {
    let mut g = Governor::new(ThrottleConfig::default()).unwrap();
    let c = ThrottleConfig {
        target_memory_mb: 2048,
        ..ThrottleConfig::default()
    };
    g.set_config(c.clone()).unwrap();
    let s = g.tick(1024 * MIB, &LoadSignals::default(), 0);
    assert!((s.memory_pressure - 0.5).abs() < 1e-12);
    let mut bad = c.clone();
    bad.read.derivative_alpha = 2.0;
    assert!(g.set_config(bad).is_err());
    assert_eq!(g.config().read.derivative_alpha, 0.3);
    let mut bad = c;
    bad.memory_weight = 0.0;
    bad.load_weight = 0.0;
    assert!(Governor::new(bad).is_err());
}

#[test]
fn state_serializes_to_flat_json() {
    let mut g = Governor::new(ThrottleConfig::default()).unwrap();
    let s = *g.tick(2000 * MIB, &LoadSignals::default(), 7);
    let json = serde_json::to_value(s).unwrap();
    assert_eq!(json["now_ns"], 7);
    assert_eq!(json["emergency"], true);
    assert_eq!(
        json["write"]["verdict"]["refuse"]["retry_after_ns"],
        5_000_000_000u64
    );
    assert_eq!(json["write"]["verdict"]["refuse"]["reason"], "emergency");
    let back: GovernorState = serde_json::from_value(json).unwrap();
    assert_eq!((back.write.verdict, back.ticks), (s.write.verdict, s.ticks));
    let delay = serde_json::to_value(Verdict::Delay(std::time::Duration::from_millis(3)));
    assert_eq!(delay.unwrap(), serde_json::json!({ "delay_ns": 3_000_000 }));
    assert_eq!(serde_json::to_value(Verdict::Allow).unwrap(), "allow");
}

#[test]
fn the_config_reads_back_and_a_reset_makes_the_next_tick_a_first() {
    let mut g = Governor::new(ThrottleConfig::default()).unwrap();
    let c = ThrottleConfig {
        target_memory_mb: 2048,
        ..ThrottleConfig::default()
    };
    g.set_config(c.clone()).unwrap();
    assert_eq!(g.config(), &c);
    let hot = LoadSignals {
        writer_wait_secs: 0.2,
        ..LoadSignals::default()
    };
    g.tick(0, &hot, 0);
    let s = *g.tick(0, &hot, TICK_NS);
    assert!(s.write.pid.integral != 0.0 && s.read.pid.integral != 0.0);
    g.reset();
    let s = *g.tick(0, &hot, 2 * TICK_NS);
    assert_eq!(s.write.pid.integral, 0.0, "no step since the reset");
    assert_eq!(s.read.pid.integral, 0.0);
    assert_eq!(s.write.pid.d, 0.0);
}
