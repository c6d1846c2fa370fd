use super::*;
use serde_json::json;

/// xorshift64*: a seeded, dependency-free source for the property test.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn hex(b: u8) -> String {
    format!("{b:02x}").repeat(32)
}

/// An event with the given fields (not signed: the hub never verifies).
fn event(rng: &mut Rng, serial: u64) -> Arc<LiveEvent> {
    let mut tags = Vec::new();
    for _ in 0..rng.below(4) {
        let letter = rng.pick(&["e", "p", "t", "d", "title"]);
        let value = match letter {
            "e" | "p" => hex(rng.pick(&[1, 2, 3, 4])),
            _ => rng.pick(&["nostr", "rust", "x"]).to_owned(),
        };
        tags.push(json!([letter, value]));
    }
    let raw = json!({
        "id": hex(serial as u8),
        "pubkey": hex(rng.pick(&[1, 2, 3, 4, 5])),
        "created_at": 1000 + rng.below(100),
        "kind": rng.pick(&[0, 1, 3, 7, 30023]),
        "tags": tags,
        "content": "",
        "sig": "00".repeat(64),
    })
    .to_string();
    Arc::new(LiveEvent::new(
        Some(serial),
        Arc::new(Event::parse(&raw).unwrap()),
    ))
}

/// A filter on a few random fields (possibly none).
fn filter(rng: &mut Rng) -> Filter {
    let mut f = serde_json::Map::new();
    if rng.chance(20) {
        let ids: Vec<String> = (0..1 + rng.below(3))
            .map(|_| hex(rng.below(60) as u8))
            .collect();
        f.insert("ids".into(), json!(ids));
    }
    if rng.chance(35) {
        let authors: Vec<String> = (0..1 + rng.below(2))
            .map(|_| hex(rng.pick(&[1, 2, 3, 4, 5, 9])))
            .collect();
        f.insert("authors".into(), json!(authors));
    }
    if rng.chance(35) {
        let kinds: Vec<u16> = (0..1 + rng.below(2))
            .map(|_| rng.pick(&[0, 1, 3, 7, 30023, 4]))
            .collect();
        f.insert("kinds".into(), json!(kinds));
    }
    if rng.chance(30) {
        f.insert("#p".into(), json!([hex(rng.pick(&[1, 2, 3, 4, 7]))]));
    }
    if rng.chance(20) {
        f.insert("#t".into(), json!([rng.pick(&["nostr", "rust", "zig"])]));
    }
    if rng.chance(15) {
        f.insert("since".into(), json!(1000 + rng.below(100)));
    }
    if rng.chance(5) {
        f.insert("kinds".into(), json!([]));
    }
    Filter::from_value(&serde_json::Value::Object(f)).unwrap()
}

/// Every connection's queued deliveries, in order.
fn drain(conns: &mut [LiveConn]) -> Vec<Vec<LiveDelivery>> {
    conns
        .iter_mut()
        .map(|c| std::iter::from_fn(|| c.try_recv()).collect())
        .collect()
}

#[test]
fn deliveries_equal_a_naive_matcher_with_no_gap_or_repeat() {
    deliveries_equal_a_naive_matcher(filter);
}

#[test]
fn deliveries_equal_a_naive_matcher_with_searches_and_empty_tags() {
    deliveries_equal_a_naive_matcher(any_filter);
}

/// Opens and closes subscriptions of filters from `make` on a few
/// connections, publishing an event between, and checks every delivery.
fn deliveries_equal_a_naive_matcher(make: fn(&mut Rng) -> Filter) {
    for seed in 1..40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let hub = LiveHub::new(100_000, usize::MAX);
        let mut conns: Vec<LiveConn> = (0..6).map(|_| hub.connect()).collect();
        // (connection, guard, filters) for every open subscription.
        let mut subs: Vec<(usize, LiveSub, Vec<Filter>)> = Vec::new();
        for serial in 1..200u64 {
            // Open or close a subscription now and then.
            if rng.chance(30) {
                let c = rng.below(conns.len() as u64) as usize;
                let filters: Vec<Filter> = (0..1 + rng.below(3)).map(|_| make(&mut rng)).collect();
                let guard = conns[c].subscribe(filters.clone());
                subs.push((c, guard, filters));
            }
            if rng.chance(10) && !subs.is_empty() {
                let i = rng.below(subs.len() as u64) as usize;
                subs.swap_remove(i);
            }
            let ev = event(&mut rng, serial);
            hub.publish(std::slice::from_ref(&ev));
            // The naive answer: every open subscription whose filters match.
            let mut want: Vec<Vec<SubHandle>> = vec![Vec::new(); conns.len()];
            for (c, guard, filters) in &subs {
                if filters.iter().any(|f| f.matches(&ev.event)) {
                    want[*c].push(guard.handle());
                }
            }
            let got = drain(&mut conns);
            for (c, deliveries) in got.into_iter().enumerate() {
                let mut handles: Vec<SubHandle> = Vec::new();
                assert!(
                    deliveries.len() <= 1,
                    "one delivery per connection per event"
                );
                for d in deliveries {
                    assert_eq!(d.event.serial, Some(serial));
                    handles.extend(d.subs);
                }
                handles.sort_unstable();
                want[c].sort_unstable();
                assert_eq!(
                    handles, want[c],
                    "seed {seed}, event {serial}, connection {c}"
                );
            }
        }
        drop(subs);
        assert_eq!(hub.subscriptions(), 0);
        drop(conns);
        let ix = hub.read();
        assert!(ix.conns.is_empty() && ix.ids.is_empty() && ix.authors.is_empty());
        assert!(ix.tags.is_empty() && ix.kinds.is_empty() && ix.unindexed.is_empty());
        assert!(ix.subs.is_empty() && ix.searches.is_empty());
    }
}

#[test]
fn a_closed_subscription_gets_nothing_more_and_others_keep_theirs() {
    let mut rng = Rng(7);
    let hub = LiveHub::new(16, usize::MAX);
    let mut conn = hub.connect();
    let all = Filter::from_value(&json!({})).unwrap();
    let first = conn.subscribe(vec![all.clone()]);
    let second = conn.subscribe(vec![all]);
    hub.publish(&[event(&mut rng, 1)]);
    let d = conn.try_recv().unwrap();
    assert_eq!(d.subs, vec![first.handle(), second.handle()]);
    drop(first);
    hub.publish(&[event(&mut rng, 2)]);
    assert_eq!(conn.try_recv().unwrap().subs, vec![second.handle()]);
    drop(second);
    hub.publish(&[event(&mut rng, 3)]);
    assert!(conn.try_recv().is_none());
}

#[test]
fn a_connection_that_matches_nothing_is_never_queued_to() {
    let mut rng = Rng(3);
    let hub = LiveHub::new(1, usize::MAX);
    let mut idle = hub.connect();
    let nobody = Filter::from_value(&json!({"authors": [hex(0xee)]})).unwrap();
    let _idle_sub = idle.subscribe(vec![nobody]);
    for serial in 1..100 {
        hub.publish(&[event(&mut rng, serial)]);
    }
    assert!(idle.try_recv().is_none());
    assert!(!idle.lagged(), "a queue of one never fills with no match");
}

#[tokio::test]
async fn a_full_queue_lags_only_its_connection() {
    let mut rng = Rng(5);
    let hub = LiveHub::new(2, usize::MAX);
    let all = Filter::from_value(&json!({})).unwrap();
    let (mut slow, mut fast) = (hub.connect(), hub.connect());
    let _s = slow.subscribe(vec![all.clone()]);
    let _f = fast.subscribe(vec![all]);
    for serial in 1..=3 {
        hub.publish(&[event(&mut rng, serial)]);
        // The fast one reads as it goes.
        assert_eq!(fast.recv().await.unwrap().event.serial, Some(serial));
    }
    assert!(slow.lagged());
    assert_eq!(slow.recv().await.unwrap_err(), LiveEnd::Lagged);
    assert!(!fast.lagged());
}

#[tokio::test]
async fn a_stop_ends_every_waiting_receiver_and_any_opened_later() {
    let hub = LiveHub::new(4, usize::MAX);
    let all = Filter::from_value(&json!({})).unwrap();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let mut conn = hub.connect();
        let sub = conn.subscribe(vec![all.clone()]);
        waiting.push(tokio::spawn(async move {
            let _sub = sub;
            conn.recv().await.map(|_| ())
        }));
    }
    // Each waits on an empty queue until the stop.
    tokio::task::yield_now().await;
    assert!(waiting.iter().all(|w| !w.is_finished()));
    hub.stop();
    for w in waiting {
        assert_eq!(w.await.unwrap(), Err(LiveEnd::Stopped));
    }
    let mut late = hub.connect();
    assert!(late.stopping());
    assert_eq!(late.recv().await.unwrap_err(), LiveEnd::Stopped);
    drop(late);
    assert!(hub.read().conns.is_empty(), "each ended receiver left");
}

#[test]
fn the_byte_bound_lags_a_connection_before_the_count_bound() {
    let mut rng = Rng(9);
    let first = event(&mut rng, 1);
    let len = first.event.raw().len();
    // Room for two events' bytes, and many more in count.
    let hub = LiveHub::new(1000, 2 * len + len / 2);
    let mut conn = hub.connect();
    let _s = conn.subscribe(vec![Filter::from_value(&json!({})).unwrap()]);
    hub.publish(&[first.clone(), first.clone()]);
    assert!(!conn.lagged());
    hub.publish(std::slice::from_ref(&first));
    assert!(conn.lagged());
    // Taking a delivery gives its bytes back.
    assert!(conn.try_recv().is_some());
    assert_eq!(conn.shared.queued_bytes.load(Ordering::Acquire), len);
}

/// A filter on any fields, `until` and `search` among them, with tags of
/// several values or none.
fn any_filter(rng: &mut Rng) -> Filter {
    let mut f = serde_json::Map::new();
    let hexes = |rng: &mut Rng, from: &[u8]| -> Vec<String> {
        (0..rng.below(4)).map(|_| hex(rng.pick(from))).collect()
    };
    if rng.chance(20) {
        f.insert("ids".into(), json!(hexes(rng, &[1, 2, 3, 9])));
    }
    if rng.chance(30) {
        f.insert("authors".into(), json!(hexes(rng, &[1, 2, 3, 4, 5, 9])));
    }
    if rng.chance(30) {
        let kinds: Vec<u16> = (0..rng.below(4))
            .map(|_| rng.pick(&[0, 1, 3, 7, 30023, 4]))
            .collect();
        f.insert("kinds".into(), json!(kinds));
    }
    for (letter, from) in [
        ("#t", &["nostr", "rust", "x", "zig", ""][..]),
        ("#d", &["x", "rust"][..]),
    ] {
        if rng.chance(25) {
            let values: Vec<&str> = (0..rng.below(4)).map(|_| rng.pick(from)).collect();
            f.insert(letter.into(), json!(values));
        }
    }
    if rng.chance(20) {
        f.insert("#p".into(), json!(hexes(rng, &[1, 2, 3, 4, 7])));
    }
    if rng.chance(20) {
        f.insert("since".into(), json!(1000 + rng.below(100)));
    }
    if rng.chance(20) {
        f.insert("until".into(), json!(1000 + rng.below(100)));
    }
    if rng.chance(10) {
        f.insert(
            "search".into(),
            json!(rng.pick(&["hello", "", "nostr rust"])),
        );
    }
    Filter::from_value(&serde_json::Value::Object(f)).unwrap()
}

#[test]
fn a_packed_filter_matches_as_its_filter() {
    let (mut matched, mut checked) = (0, 0);
    for seed in 1..300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let filters: Vec<Filter> = (0..1 + rng.below(3))
            .map(|_| any_filter(&mut rng))
            .collect();
        for width in [2, 4, 8] {
            let (packed, searches) = super::packed::Packed::pack_as(&filters, width);
            assert_eq!(packed.filters().count(), filters.len());
            for serial in 1..40u64 {
                let ev = event(&mut rng, serial);
                for (i, (f, v)) in filters.iter().zip(packed.filters()).enumerate() {
                    let search = searches.as_ref().and_then(|s| s[i].as_deref());
                    assert_eq!(v.search, f.search.is_some());
                    let got = v.matches(&ev.event) && search.is_none_or(|s| s.matches(&ev.event));
                    assert_eq!(got, f.matches(&ev.event), "seed {seed}, filter {f:?}");
                    matched += usize::from(got);
                    checked += 1;
                    assert_eq!(v.is_empty_match(), f.is_empty_match(), "{f:?}");
                }
            }
        }
    }
    assert!(
        matched > checked / 50 && matched < checked / 2,
        "{matched} of {checked}"
    );
}

#[test]
fn a_packing_takes_the_narrowest_integers_that_hold_it() {
    use super::packed::Packed;
    let small = Filter::from_value(&json!({"kinds": [1], "#t": ["sluice-bench-idle"]})).unwrap();
    let (packed, searches) = Packed::pack(&[small]);
    assert_eq!(packed.width(), 2);
    assert!(searches.is_none());
    let long = "x".repeat(70_000);
    let large = Filter::from_value(&json!({"#t": ["a", long]})).unwrap();
    let (packed, _) = Packed::pack(std::slice::from_ref(&large));
    assert_eq!(packed.width(), 4);
    let view = packed.filters().next().unwrap();
    let tag = view.tags.clone().next().unwrap();
    assert_eq!(tag.values().collect::<Vec<_>>(), ["a", long.as_str()]);
    assert!(!view.is_empty_match() && large.kinds.is_none());
}
