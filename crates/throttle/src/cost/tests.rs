use super::*;

/// A search costs the postings its words touch and the hits it
/// returns: a rare word is cheap, a common one dear.
#[test]
fn searches_cost_their_postings() {
    let c = CostConfig::default();
    let search = |postings| {
        c.estimate_req(
            &[FilterShape::Search {
                postings,
                limit: Some(20),
            }],
            200_000,
        )
    };
    assert!(search(3) < 60, "{}", search(3));
    assert!(search(100_000) > 100_000, "{}", search(100_000));
    let count = c.estimate_count(
        &[FilterShape::Search {
            postings: 50_000,
            limit: None,
        }],
        2_000_000,
    );
    assert!(count > 100_000, "{count}");
}

#[test]
fn lookups_are_cheap_and_big_scans_dear() {
    let c = CostConfig::default();
    let by_id = c.estimate_req(&[FilterShape::Ids { ids: 3 }], 200_000);
    let author5 = c.estimate_req(
        &[FilterShape::Scan {
            prefixes: 1,
            limit: Some(5),
            keyed: true,
            post_filter: false,
        }],
        200_000,
    );
    let everything = c.estimate_req(
        &[FilterShape::Scan {
            prefixes: 1,
            limit: Some(5000),
            keyed: false,
            post_filter: false,
        }],
        200_000,
    );
    let unlimited_post = c.estimate_req(
        &[FilterShape::Scan {
            prefixes: 1,
            limit: None,
            keyed: false,
            post_filter: true,
        }],
        200_000,
    );
    assert!(by_id < 20, "{by_id}");
    assert!(author5 < 20, "{author5}");
    assert!(everything > 5000, "{everything}");
    assert!(unlimited_post > 200_000, "{unlimited_post}");
    assert!(unlimited_post < 400_000, "bounded by the scan budget");
    assert_eq!(c.estimate_req(&[FilterShape::Empty], 100), c.base_units);
}

/// A lookup of a few keys (authors, tag values) is cheap whatever its
/// limit; a walk of a whole index or a kind costs what its limit allows.
#[test]
fn key_lookups_cost_rows_per_key_unless_their_limit_is_lower() {
    let c = CostConfig::default();
    let scan = |prefixes, limit, keyed| {
        c.estimate_req(
            &[FilterShape::Scan {
                prefixes,
                limit: Some(limit),
                keyed,
                post_filter: false,
            }],
            200_000,
        )
    };
    let one_author = scan(1, 500, true);
    assert_eq!(one_author, c.actual(10 + 1, 10 * 700));
    assert_eq!(scan(1, 3, true), c.actual(3 + 1, 3 * 700), "its limit");
    assert_eq!(scan(200, 500, true), scan(200, 500, false), "many keys");
    let kind = scan(1, 500, false);
    assert!(kind > 20 * one_author, "{kind} vs {one_author}");
}

#[test]
fn actual_counts_rows_and_bytes() {
    let c = CostConfig::default();
    assert_eq!(c.actual(100, 10 * 1024), 10 + 100 + 10);
    assert_eq!(c.step(100, 10 * 1024), 110);
    assert!(c.estimate_count(&[FilterShape::Ids { ids: 2 }], 500) <= 10 + 502);
}

#[test]
fn many_full_scans_are_capped_at_the_scan_limit_plus_a_margin_per_filter() {
    let c = CostConfig::default();
    let full = FilterShape::Scan {
        prefixes: 1,
        limit: None,
        keyed: false,
        post_filter: false,
    };
    // Each filter reads 10,001 rows (the limit and a seek); three of
    // them are capped at 10,000 + 3 * 4096 rows.
    let cost = c.estimate_req(&[full, full, full], 10_000);
    assert_eq!(
        cost,
        c.actual(10_000 + 3 * 4096, 30_000 * c.estimated_event_bytes)
    );
    // One is under its cap.
    assert_eq!(
        c.estimate_req(&[full], 10_000),
        c.actual(10_001, 10_000 * c.estimated_event_bytes)
    );
}

#[test]
fn a_count_costs_its_estimate_plus_a_seek_per_id_and_prefix() {
    let c = CostConfig::default();
    let shapes = [
        FilterShape::Ids { ids: 3 },
        FilterShape::Scan {
            prefixes: 2,
            limit: None,
            keyed: true,
            post_filter: false,
        },
        FilterShape::Empty,
    ];
    let big = c.count_estimate_rows + 1_000;
    assert_eq!(
        c.estimate_count(&shapes, big),
        c.actual(c.count_estimate_rows + 5, 0)
    );
    // The per-query row limit caps the estimate.
    assert_eq!(c.estimate_count(&shapes, 7), c.actual(7 + 5, 0));
    assert!(c.estimate_count(&shapes, 7) > c.base_units);
}
