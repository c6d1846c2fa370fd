use super::*;

#[test]
fn relay_figures_sum_labels_and_leave_missing_series_out() {
    let page = "# TYPE sluice_store_used_bytes gauge\nsluice_store_used_bytes 1000\n\
                sluice_retention_deleted_total{rule=\"size\"} 7\n\
                sluice_retention_deleted_total{rule=\"age\"} 3\n\
                sluice_retention_step_seconds_sum 1.5\nsluice_store_events 12\n";
    let f = relay_figures(page);
    assert_eq!(f.store_used_bytes, Some(1000.0));
    assert_eq!(f.store_file_bytes, None);
    assert_eq!(f.retention_deleted_total, Some(10.0));
    assert_eq!(f.retention_seconds_total, Some(1.5));
    assert_eq!(f.store_events, Some(12.0));
    assert_eq!(
        relay_figures("strfry has no metrics"),
        RelayFigures::default()
    );
}

#[test]
fn refusals_split_by_prefix() {
    let mut p = PrefixCounts::default();
    for m in [
        "rate-limited: x",
        "rate-limited: y",
        "error: disk",
        "blocked: no",
        "invalid: bad",
        "whatever",
    ] {
        p.add(m);
    }
    assert_eq!(refusal_split(&p), (2, 1, 1, 2));
}

fn sample(t: f64, deleted: Option<f64>, secs: Option<f64>, used: Option<f64>) -> SoakSample {
    SoakSample {
        t,
        relay: RelayFigures {
            store_used_bytes: used,
            retention_deleted_total: deleted,
            retention_seconds_total: secs,
            ..RelayFigures::default()
        },
        ..SoakSample::default()
    }
}

#[test]
fn rates_come_from_consecutive_samples() {
    assert_eq!(counter_rate((0.0, Some(1.0)), (2.0, Some(5.0))), Some(2.0));
    assert_eq!(counter_rate((0.0, None), (2.0, Some(5.0))), None);
    assert_eq!(counter_rate((0.0, Some(9.0)), (2.0, Some(5.0))), None);
    assert_eq!(counter_rate((2.0, Some(1.0)), (2.0, Some(5.0))), None);
    let mut s = vec![
        sample(0.0, Some(0.0), Some(0.0), None),
        sample(1.0, Some(100.0), Some(0.25), None),
        sample(2.0, None, None, None),
        sample(3.0, Some(400.0), Some(1.0), None),
        sample(4.0, Some(400.0), Some(1.0), None),
    ];
    derive_rates(&mut s);
    let d: Vec<Option<f64>> = s.iter().map(|x| x.deletions_per_sec).collect();
    assert_eq!(d, vec![None, Some(100.0), None, None, Some(0.0)]);
    assert_eq!(s[1].retention_share, Some(0.25));
    let st = sample_stats(&s);
    assert_eq!(st.deleted_during_run, Some(400.0));
    assert_eq!(st.retention_share, Some(0.25));
    assert_eq!(st.retention_share_max_sample, Some(0.25));
    assert_eq!(st.deletions_per_sec_median, Some(0.0));
}

#[test]
fn medians_use_the_nearest_rank_and_skip_missing_values() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0]), Some(3.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.0));
    assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
    assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    let m = min_med_max(&[9.0, 1.0, 5.0, 7.0, 3.0]).unwrap();
    assert_eq!((m.min, m.median, m.max, m.count), (1.0, 5.0, 9.0, 5));
}

#[test]
fn store_size_is_summarised_over_the_second_half() {
    let s: Vec<SoakSample> = (0..=10)
        .map(|i| {
            let used = if i == 3 {
                None
            } else {
                Some(f64::from(i) * 10.0)
            };
            sample(f64::from(i), None, None, used)
        })
        .collect();
    assert_eq!(second_half(&s).first().unwrap().t, 5.0);
    let st = sample_stats(&s);
    let m = st.store_used_second_half.unwrap();
    assert_eq!((m.min, m.median, m.max, m.count), (50.0, 70.0, 100.0, 6));
    assert_eq!(st.store_file_second_half, None);
    assert_eq!(st.deletions_per_sec_median, None);
    assert_eq!(st.retention_share, None);
    assert!(second_half(&[]).is_empty());
}

#[test]
fn worst_polite_sample_and_lowest_acceptance() {
    let mut a = sample(1.0, None, None, None);
    a.polite_p99_ms = Some(5.0);
    (a.accepted, a.refused) = (9, 1);
    let mut b = sample(2.0, None, None, None);
    b.polite_p99_ms = Some(50.0);
    (b.accepted, b.timeouts) = (1, 1);
    let c = sample(3.0, None, None, None);
    let st = sample_stats(&[a.clone(), b, c.clone()]);
    assert_eq!(st.polite_worst_p99_ms, Some(50.0));
    assert_eq!(st.polite_worst_p99_at_secs, Some(2.0));
    assert_eq!(st.acceptance_min_sample, Some(0.5));
    assert_eq!(a.acceptance(), Some(0.9));
    assert_eq!(c.acceptance(), None);
}
