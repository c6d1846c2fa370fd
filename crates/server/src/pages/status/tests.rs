use super::*;

/// Records what a relay would through a [`Tap`] over a recorder that
/// keeps nothing, so a [`Reading`] of `series` comes from the tap's
/// cells alone, never from a rendering of `/metrics`.
fn record(series: &Arc<Series>, f: impl FnOnce()) {
    metrics::with_local_recorder(&Tap::new(metrics::NoopRecorder, series.clone()), f);
}

/// The figures of a small relay, `regular` EVENTs of the regular kinds.
fn relay(series: &Arc<Series>, regular: u64) {
    record(series, || {
        metrics::counter!(sm::EVENTS_RECEIVED_TOTAL, "kind_class" => "regular").increment(regular);
        metrics::counter!(sm::EVENTS_RECEIVED_TOTAL, "kind_class" => "ephemeral").increment(2);
        metrics::counter!(sm::LIVE_DELIVERIES_TOTAL).increment(5);
        metrics::counter!(em::QUERY_EVENTS_TOTAL).increment(7);
        metrics::counter!(em::QUERY_ADMITTED_TOTAL).absolute(3);
        metrics::gauge!(sm::CONNECTIONS_OPEN).set(4.0);
        metrics::counter!(em::THROTTLE_REFUSALS_TOTAL, "direction" => "write", "layer" => "ip_bucket", "reason" => "rate").increment(6);
        metrics::counter!(em::THROTTLE_REFUSALS_TOTAL, "direction" => "read", "layer" => "ip_bucket", "reason" => "rate").increment(1);
        metrics::counter!(em::THROTTLE_REFUSALS_TOTAL, "direction" => "write", "layer" => "controller", "reason" => "emergency").increment(2);
        metrics::counter!(em::WRITER_QUEUE_FULL_TOTAL).increment(1);
        metrics::gauge!(em::STORE_USED_BYTES).set(1048576.0);
        metrics::gauge!(em::RETENTION_TARGET_BYTES).set(2097152.0);
        metrics::gauge!(em::STORE_DISK_TOTAL_BYTES).set(1e9);
        // A label naming a client, on a series the status keeps and on
        // one it does not: summed away, or not kept.
        metrics::counter!(sm::EVENTS_ACCEPTED_TOTAL, "ip" => "203.0.113.9").increment(9);
        metrics::counter!(sm::CONNECTIONS_OPENED_TOTAL, "ip" => "203.0.113.9").increment(99);
    });
}

/// The first recording of [`relay`], read.
fn reading(at: Instant) -> Reading {
    let series = Arc::new(Series::default());
    relay(&series, 10);
    Reading::read(&series, at)
}

#[test]
fn a_reading_comes_from_the_taps_cells_summed_by_layer() {
    let r = reading(Instant::now());
    assert_eq!(r.events_in, 12.0);
    assert_eq!(r.events_accepted, 9.0);
    assert_eq!(r.events_out, 12.0);
    assert_eq!(r.queries, 3.0);
    assert_eq!(r.connections, 4.0);
    let ip = Layer::ALL
        .iter()
        .position(|l| *l == Layer::IpBucket)
        .unwrap();
    let ctl = Layer::ALL
        .iter()
        .position(|l| *l == Layer::Controller)
        .unwrap();
    assert_eq!(r.refusals[ip], 7.0);
    assert_eq!(r.refusals[ctl], 2.0);
    assert_eq!(r.refusals[Layer::ALL.len()], 1.0);
    assert_eq!(r.store.used_bytes, 1048576.0);
    assert_eq!(r.store.retention_target_bytes, 2097152.0);
    assert_eq!(r.store.disk_total_bytes, 1e9);
    assert_eq!(r.store.events, 0.0, "never recorded");
}

#[test]
fn rates_come_from_two_readings_and_the_ring_is_bounded() {
    let board = Board::default();
    let t0 = Instant::now();
    let extra = |t| Extra {
        unix_now: t,
        mode: "enforce",
        target_memory_bytes: 1 << 30,
    };
    let series = Arc::new(Series::default());
    relay(&series, 10);
    board.record(Reading::read(&series, t0), None, extra(0));
    assert!(board.document().now.is_none(), "one reading has no rate");
    // 20 more regular EVENTs, and nothing else moves.
    record(&series, || {
        metrics::counter!(sm::EVENTS_RECEIVED_TOTAL, "kind_class" => "regular").increment(20);
        metrics::counter!(em::QUERY_ADMITTED_TOTAL).absolute(3);
        metrics::gauge!(sm::CONNECTIONS_OPEN).set(4.0);
    });
    board.record(
        Reading::read(&series, t0 + Duration::from_secs(2)),
        None,
        extra(2),
    );
    let doc = board.document();
    let now = doc.now.unwrap();
    assert_eq!(now.sample.events_in, 10.0);
    assert_eq!(now.sample.events_out, 0.0);
    assert_eq!(now.sample.queries, 0.0);
    assert_eq!(now.sample.connections, 4.0);
    assert_eq!(now.refusals_by_layer["ip_bucket"].total, 7.0);
    assert_eq!(now.refusals_by_layer[WRITER_QUEUE].per_s, 0.0);
    assert_eq!(doc.history.len(), 1);
    for i in 0..(HISTORY as u64 + 10) {
        board.record(
            Reading::read(&series, t0 + Duration::from_secs(3 + i)),
            None,
            extra(3 + i),
        );
    }
    let doc = board.document();
    assert_eq!(doc.history.len(), HISTORY);
    assert_eq!(doc.history.last().unwrap().t, HISTORY as u64 + 12);
    let json = serde_json::to_string(&doc).unwrap();
    assert!(!json.contains("203.0.113.9"), "{json}");
}

#[test]
fn the_page_holds_the_numbers_and_every_slot_is_filled() {
    let board = Board::default();
    let t0 = Instant::now();
    let extra = Extra {
        unix_now: 1,
        mode: "enforce",
        target_memory_bytes: 1 << 30,
    };
    board.record(Reading::read(&Series::default(), t0), None, extra);
    board.record(reading(t0 + Duration::from_secs(1)), None, extra);
    let p = page(&board.document(), "<relay>");
    assert!(!p.contains("{{"), "{p}");
    assert!(p.contains("&lt;relay&gt;"));
    assert!(
        p.contains(r#"data-field="events_in" data-format="rate">12<"#),
        "{p}"
    );
    assert!(p.contains("ip bucket"));
}

#[test]
fn points_put_the_newest_sample_at_the_right_edge() {
    assert_eq!(points(&[0.0, 2.0], 2.0), "598.0,150.0 600.0,0.0");
    assert_eq!(points(&[], 1.0), "");
}
