use super::*;

#[test]
fn defaults_validate() {
    ThrottleConfig::default().validate().unwrap();
    let import = ThrottleConfig::import_default();
    assert_eq!(import.write.setpoint, 0.70);
    assert_eq!(import.read.setpoint, 0.85);
    import.validate().unwrap();
}

#[test]
fn either_weight_alone_is_enough() {
    for (memory, load) in [(0.0, 1.0), (1.0, 0.0), (0.5, 0.5)] {
        let c = ThrottleConfig {
            memory_weight: memory,
            load_weight: load,
            ..ThrottleConfig::default()
        };
        c.validate().unwrap();
    }
}

/// Every error names the key as the operator writes it in TOML.
#[test]
fn errors_name_the_whole_key() {
    let key = |f: &dyn Fn(&mut ThrottleConfig)| {
        let mut c = ThrottleConfig::default();
        f(&mut c);
        c.validate().unwrap_err().key
    };
    assert_eq!(key(&|c| c.read.kp = -1.0), "throttle.read.kp");
    assert_eq!(key(&|c| c.write.kp = -1.0), "throttle.write.kp");
    assert_eq!(key(&|c| c.tick_ms = 5), "throttle.tick_ms");
    assert_eq!(key(&|c| c.check_every_ops = 0), "throttle.check_every_ops");
    assert_eq!(
        key(&|c| c.target_memory_mb = 0),
        "throttle.target_memory_mb"
    );
    assert_eq!(
        key(&|c| {
            c.memory_weight = 0.0;
            c.load_weight = 0.0;
        }),
        "throttle.load_weight"
    );
    assert_eq!(
        key(&|c| c.signals.map_fill_full = 0.0),
        "throttle.signals.map_fill_full"
    );
    assert_eq!(
        key(&|c| c.emergency.exit_pressure = 2.0),
        "throttle.emergency.exit_pressure"
    );
    assert_eq!(
        key(&|c| c.clients.reqs_per_ip.rate_per_s = 0.0),
        "throttle.clients.reqs_per_ip.rate_per_s"
    );
    assert_eq!(
        key(&|c| c.clients.read_cost_per_connection.window_ms = 0),
        "throttle.clients.read_cost_per_connection.window_ms"
    );
    assert_eq!(
        key(&|c| c.clients.max_connections_per_ip = 0),
        "throttle.clients.max_connections_per_ip"
    );
    assert_eq!(
        key(&|c| c.clients.max_tracked_keys = MAX_KEYS_LIMIT + 1),
        "throttle.clients.max_tracked_keys"
    );
    assert_eq!(
        key(&|c| c.clients.min_rate_fraction = f64::NAN),
        "throttle.clients.min_rate_fraction"
    );
    assert_eq!(
        key(&|c| c.clients.polite_ops_per_s = -1.0),
        "throttle.clients.polite_ops_per_s"
    );
    assert_eq!(
        key(&|c| c.queries.slots = QuerySlots::Count(0)),
        "throttle.queries.slots"
    );
    assert_eq!(
        key(&|c| c.queries.max_open_units = 0),
        "throttle.queries.max_open_units"
    );
    assert_eq!(
        key(&|c| c.queries.max_open_units_per_client = 2_000_000_000_000),
        "throttle.queries.max_open_units_per_client"
    );
    assert_eq!(
        key(&|c| c.queries.step_bytes = 0),
        "throttle.queries.step_bytes"
    );
    assert_eq!(
        key(&|c| c.queries.cost.rows_per_key = 0),
        "throttle.queries.cost.rows_per_key"
    );
    assert_eq!(
        key(&|c| c.queries.chunks_per_connection = 65),
        "throttle.queries.chunks_per_connection"
    );
    assert_eq!(
        key(&|c| c.queries.cost.bytes_per_unit = 0),
        "throttle.queries.cost.bytes_per_unit"
    );
}

#[test]
fn round_trips_and_refuses_unknown_keys() {
    let c = serde_json::to_value(ThrottleConfig::default()).unwrap();
    assert_eq!(c["mode"], "enforce");
    assert_eq!(c["read"]["kp"], 0.3);
    assert_eq!(
        serde_json::from_value::<ThrottleConfig>(c.clone()).unwrap(),
        ThrottleConfig::default()
    );
    let mut extra = c.clone();
    extra["write"]["kq"] = serde_json::json!(1.0);
    assert!(serde_json::from_value::<ThrottleConfig>(extra).is_err());
    let mut extra = c;
    extra["governor"] = serde_json::json!({});
    assert!(serde_json::from_value::<ThrottleConfig>(extra).is_err());
    // Missing keys take their defaults.
    let partial: ThrottleConfig =
        serde_json::from_value(serde_json::json!({ "tick_ms": 50 })).unwrap();
    assert_eq!(partial.tick_ms, 50);
    assert_eq!(partial.queries, QueriesConfig::default());
}

#[test]
fn a_kind_class_without_bucket_shape_gets_the_defaults() {
    let k: KindLimit =
        serde_json::from_str(r#"{"name":"reactions","kinds":[7],"rate_per_s":1}"#).unwrap();
    assert_eq!(
        (k.burst_ratio, k.window_ms, k.catch_up_ms),
        (2.0, 2000, 5000)
    );
}

#[test]
fn kind_class_names_and_count_are_checked() {
    let class = |name: &str| KindLimit {
        name: name.into(),
        kinds: vec![7],
        rate_per_s: 1.0,
        burst_ratio: 2.0,
        window_ms: 2000,
        catch_up_ms: 5000,
    };
    let with = |kinds: Vec<KindLimit>| ClientsConfig {
        kinds,
        ..ClientsConfig::default()
    };
    for good in ["reactions", "re_actions", "r2", "_", "a_b"] {
        with(vec![class(good)]).validate().unwrap();
    }
    for bad in ["", "Reactions", "re-actions", "a b", &"x".repeat(33)] {
        let err = with(vec![class(bad)]).validate().unwrap_err();
        assert_eq!(err.key, "kinds[0].name", "{bad:?}");
    }
    let many = |n: usize| with((0..n).map(|i| class(&format!("c{i}"))).collect());
    many(MAX_KIND_CLASSES).validate().unwrap();
    assert_eq!(
        many(MAX_KIND_CLASSES + 1).validate().unwrap_err().key,
        "kinds"
    );
}

#[test]
fn slots_are_a_count_or_auto_one_per_core_at_least_two() {
    let parse = |v: serde_json::Value| serde_json::from_value::<QuerySlots>(v);
    assert_eq!(parse(serde_json::json!("auto")).unwrap(), QuerySlots::Auto);
    assert_eq!(parse(serde_json::json!(3)).unwrap(), QuerySlots::Count(3));
    // An environment variable's value arrives as a string.
    assert_eq!(parse(serde_json::json!("3")).unwrap(), QuerySlots::Count(3));
    assert!(parse(serde_json::json!("many")).is_err());
    assert!(parse(serde_json::json!(-1)).is_err());
    assert_eq!(serde_json::to_value(QuerySlots::Auto).unwrap(), "auto");
    assert_eq!(serde_json::to_value(QuerySlots::Count(5)).unwrap(), 5);
    assert_eq!(QuerySlots::Auto.count(1), 2);
    assert_eq!(QuerySlots::Auto.count(2), 2);
    assert_eq!(QuerySlots::Auto.count(16), 16);
    assert_eq!(QuerySlots::Count(7).count(16), 7);
    let mut q = QueriesConfig::default();
    assert_eq!(q.slots, QuerySlots::Auto);
    assert!(q.validate().is_ok());
    q.slots = QuerySlots::Count(1025);
    assert!(q.validate().is_err());
}
