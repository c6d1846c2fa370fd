use super::*;

const S: u64 = 1_000_000_000;

fn adaptive() -> PowConfig {
    PowConfig {
        min_difficulty: 4,
        adaptive: true,
        max_difficulty: 7,
        ..PowConfig::default()
    }
}

#[test]
fn the_difficulty_climbs_a_bit_a_second_under_pressure_up_to_the_max_then_falls_back_slowly() {
    let cfg = adaptive();
    let mut c = PowController::new();
    let mut t = 10 * S;
    assert_eq!(c.tick(&cfg, 0.0, 0.0, t), 0);
    // Pressed by outsiders asking twice their budget: one bit per second.
    for want in [1, 1, 2, 2, 3, 3, 3, 3] {
        assert_eq!(c.tick(&cfg, 0.0, 2.0, t), want.min(3));
        t += S / 2;
    }
    assert_eq!(required(&cfg, 1, c.extra()), 7, "capped at max_difficulty");
    // In between: held.
    t += 60 * S;
    assert_eq!(c.tick(&cfg, 0.5, 0.0, t), 3);
    // Calm: one bit per 10 s.
    assert_eq!(c.tick(&cfg, 0.0, 0.1, t), 2);
    assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 9 * S), 2);
    assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 10 * S), 1);
    assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 20 * S), 0);
    assert_eq!(c.tick(&cfg, 0.0, 0.1, t + 30 * S), 0);
    assert_eq!(required(&cfg, 1, c.extra()), 4, "back to the floor");
    // Write pressure alone raises it too.
    assert_eq!(c.tick(&cfg, 0.9, 0.0, t + 40 * S), 1);
}

#[test]
fn static_floors_by_kind_and_no_adaptation_unless_asked() {
    let cfg = PowConfig {
        min_difficulty: 8,
        kinds: [("7".to_string(), 0), ("30023".to_string(), 12)].into(),
        ..PowConfig::default()
    };
    cfg.validate().unwrap();
    assert_eq!(cfg.floor(1), 8);
    assert_eq!(cfg.floor(7), 0);
    assert_eq!(cfg.floor(30023), 12);
    assert_eq!(cfg.highest_floor(), 12);
    let mut c = PowController::new();
    assert_eq!(c.tick(&cfg, 1.0, 10.0, 100 * S), 0);
    assert_eq!(required(&cfg, 1, 0), 8);
    // A kind with its own floor still gets the adaptive bits, within max.
    assert_eq!(required(&adaptive(), 7, 2), 6);
}

#[test]
fn bad_values_are_refused_by_key() {
    let key = |c: PowConfig| c.validate().unwrap_err().key;
    assert_eq!(
        key(PowConfig {
            min_difficulty: 65,
            ..PowConfig::default()
        }),
        "pow.min_difficulty"
    );
    assert_eq!(
        key(PowConfig {
            min_difficulty: 30,
            max_difficulty: 20,
            ..PowConfig::default()
        }),
        "pow.max_difficulty"
    );
    assert_eq!(
        key(PowConfig {
            kinds: [("seven".to_string(), 1)].into(),
            ..PowConfig::default()
        }),
        "pow.kinds.seven"
    );
    assert_eq!(
        key(PowConfig {
            raise_above: 0.1,
            ..PowConfig::default()
        }),
        "pow.raise_above"
    );
}

#[test]
fn at_the_ceiling_the_first_bit_down_waits_from_reaching_it_and_the_lower_bound_holds() {
    let cfg = adaptive();
    let mut c = PowController::new();
    let mut t = 10 * S;
    for _ in 0..3 {
        c.tick(&cfg, 1.0, 0.0, t);
        t += S;
    }
    assert_eq!(c.extra(), 3, "the ceiling (7 - 4)");
    // Pressed at the ceiling for a minute: nothing more to raise.
    for _ in 0..60 {
        assert_eq!(c.tick(&cfg, 1.0, 0.0, t), 3);
        t += S;
    }
    // Calm: the first bit comes off at once (10 s since the last change).
    assert_eq!(c.tick(&cfg, 0.0, 0.0, t), 2);
    // Pressure at `lower_below` exactly is not calm.
    let mut c = PowController::new();
    c.tick(&cfg, 1.0, 0.0, 10 * S);
    assert_eq!(c.tick(&cfg, cfg.lower_below, 0.0, 100 * S), 1);
    assert_eq!(c.tick(&cfg, cfg.lower_below - 0.01, 0.0, 100 * S), 0);
}
