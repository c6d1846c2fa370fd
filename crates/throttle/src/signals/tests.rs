use super::*;

#[test]
fn idle_store_is_zero_load() {
    let raw = LoadSignals {
        writer_wait_secs: 0.0,
        commit_latency_secs: 0.002,
        commit_baseline_secs: 0.002,
        writer_queue_fill: 0.0,
        map_fill: 0.3,
        reader_slots_fill: 0.0,
        read_latency_secs: 0.0,
    };
    let n = NormalizedSignals::from_raw(&raw, &SignalTargets::default());
    assert_eq!(n, NormalizedSignals::default());
    assert_eq!(n.load_level(), 0.0);
}

#[test]
fn each_signal_reaches_one_at_its_limit() {
    let t = SignalTargets::default();
    let raw = LoadSignals {
        writer_wait_secs: 0.1,
        commit_latency_secs: 0.008,
        commit_baseline_secs: 0.002,
        writer_queue_fill: 1.0,
        map_fill: 0.95,
        reader_slots_fill: 1.0,
        read_latency_secs: 0.1,
    };
    let n = NormalizedSignals::from_raw(&raw, &t);
    for (name, v) in n.named() {
        assert!((v - 1.0).abs() < 1e-9, "{name} = {v}");
    }
}

/// The named list is every field, under its field's name.
#[test]
fn named_lists_every_signal() {
    let n = NormalizedSignals {
        writer_wait: 1.0,
        commit: 2.0,
        writer_queue: 3.0,
        map: 4.0,
        readers: 5.0,
        read_latency: 6.0,
    };
    let json = serde_json::to_value(n).unwrap();
    let fields = json.as_object().unwrap();
    assert_eq!(fields.len(), n.named().len());
    for (name, v) in n.named() {
        assert_eq!(fields[name], v, "{name}");
    }
    assert_eq!(n.load_level(), 6.0);
}

#[test]
fn load_level_is_the_bottleneck() {
    let raw = LoadSignals {
        writer_wait_secs: 0.3,
        read_latency_secs: 0.05,
        ..LoadSignals::default()
    };
    let n = NormalizedSignals::from_raw(&raw, &SignalTargets::default());
    assert!((n.load_level() - 3.0).abs() < 1e-9);
}

#[test]
fn tiny_baselines_use_the_floor() {
    let raw = LoadSignals {
        commit_latency_secs: 0.0005,
        commit_baseline_secs: 0.00001,
        ..LoadSignals::default()
    };
    let n = NormalizedSignals::from_raw(&raw, &SignalTargets::default());
    // 0.5 ms against a 1 ms floor: below baseline, no load.
    assert_eq!(n.commit, 0.0);
}

#[test]
fn garbage_inputs_fail_open_and_stay_finite() {
    let raw = LoadSignals {
        writer_wait_secs: f64::NAN,
        commit_latency_secs: f64::INFINITY,
        commit_baseline_secs: 0.0,
        writer_queue_fill: -3.0,
        map_fill: f64::NAN,
        reader_slots_fill: 7.0,
        read_latency_secs: f64::NEG_INFINITY,
    };
    let n = NormalizedSignals::from_raw(&raw, &SignalTargets::default());
    assert_eq!(n.writer_wait, 0.0);
    assert_eq!(n.commit, MAX_SIGNAL);
    assert_eq!(n.writer_queue, 0.0);
    assert_eq!(n.map, 0.0);
    assert_eq!(n.readers, 7.0);
    assert_eq!(n.read_latency, 0.0);
    assert!(n.load_level().is_finite());
}

#[test]
fn memory_pressure_and_process_variable() {
    let gib = 1u64 << 30;
    assert!((memory_pressure(gib / 2, gib) - 0.5).abs() < 1e-12);
    assert_eq!(memory_pressure(1, 0), MAX_SIGNAL);
    assert_eq!(memory_pressure(u64::MAX, 1), MAX_SIGNAL);
    let pv = process_variable(0.5, 1.0, 0.7, 0.3);
    assert!((pv - 0.65).abs() < 1e-12);
    assert_eq!(process_variable(f64::NAN, f64::NAN, 0.7, 0.3), 0.0);
}

#[test]
fn invalid_targets_are_rejected() {
    let t = SignalTargets {
        map_fill_low: 0.99,
        ..SignalTargets::default()
    };
    assert_eq!(t.validate().unwrap_err().key, "map_fill_low");
    let t = SignalTargets {
        commit_slowdown_at_full: 1.0,
        ..SignalTargets::default()
    };
    assert_eq!(t.validate().unwrap_err().key, "commit_slowdown_at_full");
}

#[test]
fn the_low_map_fill_must_stay_below_the_full_one() {
    let mut t = SignalTargets::default();
    t.map_fill_low = t.map_fill_full;
    assert_eq!(t.validate().unwrap_err().key, "map_fill_low");
    t.map_fill_low = t.map_fill_full - 0.01;
    t.validate().unwrap();
}
