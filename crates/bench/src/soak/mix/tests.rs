use super::*;

#[test]
fn sizes_parse_with_binary_suffixes() {
    assert_eq!(parse_size("1234").unwrap(), 1234);
    assert_eq!(parse_size("1K").unwrap(), 1024);
    assert_eq!(parse_size("50M").unwrap(), 50 << 20);
    assert_eq!(parse_size("50mb").unwrap(), 50 << 20);
    assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
    assert_eq!(parse_size("2T").unwrap(), 2 << 40);
    assert_eq!(parse_size(" 7 ").unwrap(), 7);
    for bad in ["", "G", "x1", "-1M", "1X", "1.2.3K", "NaN"] {
        assert!(parse_size(bad).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn counts_parse_with_decimal_suffixes() {
    assert_eq!(parse_count("500").unwrap(), 500);
    assert_eq!(parse_count("2k").unwrap(), 2000);
    assert_eq!(parse_count("1.5M").unwrap(), 1_500_000);
    assert_eq!(parse_count("1G").unwrap(), 1_000_000_000);
}

fn schedule() -> TimeSchedule {
    TimeSchedule {
        end: 1_800_000_000,
        span_secs: 180 * 86_400,
        jitter_secs: 6 * 3600,
        backfill: 0.1,
    }
}

#[test]
fn created_at_stays_in_the_span_and_below_its_point() {
    let s = schedule();
    let mut rng = Rng::new(5);
    for i in 0..=10_000u64 {
        let p = i as f64 / 10_000.0;
        let t = s.created_at(p, rng.unit(), rng.unit());
        assert!(t >= s.start() && t <= s.base(p), "{t} at {p}");
        assert!(s.base(p) - t <= s.span_secs);
    }
    assert_eq!(s.base(0.0), s.start());
    assert_eq!(s.base(1.0), s.end);
    assert_eq!(s.base(7.0), s.end);
    assert_eq!(s.base(f64::NAN), s.end);
    // Without backfill, an event is at most the jitter older than its point.
    assert_eq!(s.created_at(0.5, 0.5, 0.0), s.base(0.5));
    assert_eq!(s.created_at(0.5, 0.5, 0.5), s.base(0.5) - 3 * 3600);
    // Backfill reaches back towards the span's start.
    assert_eq!(s.created_at(0.5, 0.05, 0.0), s.base(0.5));
    assert_eq!(s.created_at(0.5, 0.05, 0.5), s.start() + s.span_secs / 4);
    // Near the start the jitter cannot go before the span.
    assert_eq!(s.created_at(0.0, 0.5, 0.99), s.start());
}

#[test]
fn created_at_mostly_increases_but_arrives_out_of_order() {
    let s = schedule();
    let mut rng = Rng::new(9);
    let n = 20_000;
    let times: Vec<u64> = (0..n)
        .map(|i| s.created_at(i as f64 / n as f64, rng.unit(), rng.unit()))
        .collect();
    let inversions = times.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(inversions > n / 10, "out of order: {inversions}");
    // The newest tenth of the events is generated in the last part of the run.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|i| std::cmp::Reverse(times[*i]));
    let late = order[..n / 10].iter().filter(|i| **i >= n * 8 / 10).count();
    assert_eq!(late, n / 10);
    // Means per quarter increase.
    let mean = |q: usize| {
        let part = &times[q * n / 4..(q + 1) * n / 4];
        part.iter().map(|t| *t as f64).sum::<f64>() / part.len() as f64
    };
    assert!(mean(0) < mean(1) && mean(1) < mean(2) && mean(2) < mean(3));
}

#[test]
fn budget_progress_takes_the_larger_fraction() {
    let b = Budget {
        events: Some(1000),
        bytes: Some(1 << 20),
    };
    assert_eq!(b.progress(500, 0.0), 0.5);
    assert_eq!(b.progress(100, (1 << 19) as f64), 0.5);
    assert_eq!(b.progress(5000, 0.0), 1.0);
    assert!(!b.reached(999, 100));
    assert!(b.reached(1000, 100));
    assert!(b.reached(1, 1 << 20));
    let only_bytes = Budget {
        events: None,
        bytes: Some(100),
    };
    assert_eq!(only_bytes.progress(1_000_000, 25.0), 0.25);
}

#[test]
fn mix_is_mostly_notes_with_exempt_authors_first() {
    let mut m = Mix::writers(3, 20, 2, schedule());
    let mut kinds = std::collections::BTreeMap::new();
    let (mut exempt, mut slots) = (0, 0);
    for i in 0..2000 {
        let (spec, meta) = m.spec(i as f64 / 2000.0);
        let ev = Event::sign(
            &spec.secret_key,
            spec.created_at,
            spec.kind,
            spec.tags.clone(),
            &spec.content,
        );
        if i % 50 == 0 {
            ev.verify().unwrap();
            let est = meta.bytes as f64;
            let real = ev.raw().len() as f64;
            assert!((est - real).abs() < real * 0.2 + 40.0, "{est} vs {real}");
        }
        m.remember(&ev);
        *kinds.entry(meta.kind).or_insert(0u32) += 1;
        exempt += u32::from(meta.exempt);
        slots += u32::from(meta.slot.is_some());
        assert_eq!(
            meta.slot.is_some(),
            matches!(meta.kind, 0 | 3 | 30023),
            "{meta:?}"
        );
    }
    assert!(kinds[&1] > 1100 && kinds[&7] > 350, "{kinds:?}");
    assert!(kinds[&0] > 20 && kinds[&3] > 20 && kinds[&30023] > 30);
    assert!((100..300).contains(&exempt), "exempt {exempt}");
    assert!(slots > 100);
    // The exempt keys are the first author keys whatever the author count.
    assert_eq!(exempt_pubkeys(3, 2), exempt_pubkeys(3, 20)[..2]);
}
