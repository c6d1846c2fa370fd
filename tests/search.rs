//! NIP-50 search end to end (issue 26): ranking and combination with the
//! other filter fields, live delivery, events that leave the store leaving
//! the results, a kill -9 while indexing, import and `sluice reindex`
//! agreeing, and a pile of expensive searches beside a polite reader.
//!
//! Nothing asserted depends on the machine's speed: the tests wait for the
//! indexer to reach a serial (`sluice_search_indexed_serial`) or for a
//! result to change, with a generous deadline as the failure bound.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_proto::Event;
use support::*;

const DEADLINE: Duration = Duration::from_secs(60);

/// Settings of every relay here: the index commits often, searched or
/// not.
fn fast_index() -> Vec<(&'static str, &'static str)> {
    vec![
        ("SLUICE_SEARCH__COMMIT_INTERVAL_MS", "50"),
        ("SLUICE_SEARCH__IDLE_COMMIT_INTERVAL_MS", "50"),
    ]
}

/// Waits until the index has committed every serial up to `serial`.
async fn wait_indexed(relay: &Relay, serial: u64) {
    let start = Instant::now();
    loop {
        let got = relay
            .metric_or_zero("sluice_search_indexed_serial", &[])
            .await;
        if got >= serial as f64 {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "index at serial {got}, waiting for {serial}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids a search REQ answers, in order.
async fn search(c: &mut Client, filter: Value) -> Vec<String> {
    c.req_ids("s", &[filter]).await
}

async fn count(c: &mut Client, filter: Value) -> u64 {
    c.send(json!(["COUNT", "n", filter])).await;
    let m = c.expect("COUNT").await;
    m[2]["count"].as_u64().unwrap()
}

/// Polls a search until its ids are `want`.
async fn wait_search(c: &mut Client, filter: Value, want: &[String]) {
    let start = Instant::now();
    loop {
        let got = search(c, filter.clone()).await;
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{filter}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_ranked_and_combine_with_the_other_fields() {
    let relay = Relay::start_with(&fast_index());
    let mut c = relay.client().await;
    let t0 = now() - 1000;
    // P and Q score the same (same words, same length): the newer first.
    // R holds the word once in a long text: less relevant, though newest.
    let p = ev(1, t0, 1, &[], "Bitcoin nostr");
    let q = ev(2, t0 + 100, 1, &[], "bitcoin, NOSTR!");
    let filler: String = (0..30).map(|i| format!(" filler{i}")).collect();
    let r = ev(1, t0 + 200, 1, &[], &format!("bitcoin{filler}"));
    let other = ev(3, t0 + 300, 1, &[], "nothing to see");
    // Not an indexed kind by default: never a search result.
    let reaction = ev(3, t0 + 400, 7, &[], "bitcoin");
    let profile = ev(
        4,
        t0,
        0,
        &[],
        r#"{"name":"satoshi","about":"Bitcoin tinkerer","website":"zebra"}"#,
    );
    let long = ev(
        5,
        t0,
        30023,
        &[
            &["d", "g"],
            &["title", "Gardening"],
            &["summary", "tomatoes"],
        ],
        "body",
    );
    let events = [&p, &q, &r, &other, &reaction, &profile, &long];
    for e in events {
        assert!(c.publish(e).await.0);
    }
    wait_indexed(&relay, events.len() as u64).await;

    let id = |e: &Event| e.id_hex();
    assert_eq!(
        search(&mut c, json!({"search": "bitcoin", "kinds": [1]})).await,
        [id(&q), id(&p), id(&r)]
    );
    // limit applies after ranking.
    assert_eq!(
        search(
            &mut c,
            json!({"search": "bitcoin", "kinds": [1], "limit": 2})
        )
        .await,
        [id(&q), id(&p)]
    );
    // Every word must be there.
    assert_eq!(
        search(&mut c, json!({"search": "nostr BITCOIN"})).await,
        [id(&q), id(&p)]
    );
    // Combined with authors, kinds and since.
    assert_eq!(
        search(
            &mut c,
            json!({"search": "bitcoin", "authors": [pubkey_hex(1)]})
        )
        .await,
        [id(&p), id(&r)]
    );
    assert_eq!(
        search(
            &mut c,
            json!({"search": "bitcoin", "since": t0 + 50, "kinds": [1]})
        )
        .await,
        [id(&q), id(&r)]
    );
    assert!(
        search(&mut c, json!({"search": "bitcoin", "kinds": [7]}))
            .await
            .is_empty()
    );
    // Profiles by name and about, long-form by title and summary; other
    // fields are not searched.
    assert_eq!(
        search(&mut c, json!({"search": "satoshi tinkerer"})).await,
        [id(&profile)]
    );
    assert!(search(&mut c, json!({"search": "zebra"})).await.is_empty());
    assert_eq!(
        search(&mut c, json!({"search": "gardening tomatoes"})).await,
        [id(&long)]
    );
    // Extensions: include:spam changes nothing, unknown ones are ignored.
    assert_eq!(
        search(
            &mut c,
            json!({"search": "bitcoin include:spam domain:x.com", "kinds": [1]})
        )
        .await,
        [id(&q), id(&p), id(&r)]
    );
    assert_eq!(count(&mut c, json!({"search": "bitcoin"})).await, 4);
    assert_eq!(
        count(&mut c, json!({"search": "nostr", "kinds": [1]})).await,
        2
    );

    // Live: a search subscription gets only what contains its words.
    let mut sub = relay.client().await;
    sub.send(json!(["REQ", "live", {"search": "lightning"}]))
        .await;
    assert!(sub.collect_until_eose("live").await.is_empty());
    let miss = ev(6, now(), 1, &[], "nothing relevant");
    let hit = ev(6, now(), 1, &[], "Lightning fast");
    assert!(c.publish(&miss).await.0);
    assert!(c.publish(&hit).await.0);
    let m = sub.expect("EVENT").await;
    assert_eq!(m[1], "live");
    assert_eq!(m[2]["id"], id(&hit), "only the matching event");

    // NIP-11 lists 50.
    let (_, _, doc) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: Value = serde_json::from_str(&doc).unwrap();
    let nips = doc["supported_nips"].as_array().unwrap();
    assert!(nips.contains(&json!(50)), "{doc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_req_or_count_mixing_search_and_plain_filters_answers_each_event_once() {
    let relay = Relay::start_with(&fast_index());
    let mut c = relay.client().await;
    let t0 = now() - 1000;
    // a and b match the search; a, c and d are author 1's (the plain
    // filter); e matches neither.
    let a = ev(1, t0, 1, &[], "bitcoin relay");
    let b = ev(2, t0 + 10, 1, &[], "bitcoin node");
    let cc = ev(1, t0 + 20, 1, &[], "plain words");
    let d = ev(1, t0 + 30, 1, &[], "more plain words");
    let e = ev(3, t0 + 40, 1, &[], "unrelated");
    for x in [&a, &b, &cc, &d, &e] {
        assert!(c.publish(x).await.0);
    }
    wait_indexed(&relay, 5).await;
    let id = |e: &Event| e.id_hex();
    let searched = json!({"search": "bitcoin"});
    let plain = json!({"authors": [pubkey_hex(1)]});
    // The search's results first (ranked: same words and length, newer
    // first), then the plain filter's newest first, a not sent again.
    assert_eq!(
        c.req_ids("m", &[searched.clone(), plain.clone()]).await,
        [id(&b), id(&a), id(&d), id(&cc)]
    );
    // A plain filter's limit still counts what the search sent: its
    // newest two are d and cc, so a is not among them anyway; with limit
    // 3 they are d, cc and a, and a has been sent already.
    let plain3 = json!({"authors": [pubkey_hex(1)], "limit": 3});
    assert_eq!(
        c.req_ids("m3", &[searched.clone(), plain3]).await,
        [id(&b), id(&a), id(&d), id(&cc)]
    );
    // COUNT: the union, exactly, and not marked approximate.
    c.send(json!(["COUNT", "n", searched, plain])).await;
    let m = c.expect("COUNT").await;
    assert_eq!(m[2]["count"], 4, "{m}");
    assert!(
        m[2].get("approximate").is_none_or(|v| v == false),
        "an exact count is not approximate: {m}"
    );
}

/// Chinese, Japanese and Korean text (no spaces between words) is found
/// by the characters and pairs it holds, stored and live alike.
/// While nobody searches, the index commits only every
/// `idle_commit_interval_ms` (an hour here); the first search after finds
/// what was just stored all the same, having waited for a commit, and so
/// does a COUNT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_after_a_quiet_spell_finds_what_was_just_stored() {
    let relay = Relay::start_with(&[
        ("SLUICE_SEARCH__COMMIT_INTERVAL_MS", "50"),
        ("SLUICE_SEARCH__IDLE_COMMIT_INTERVAL_MS", "3600000"),
    ]);
    let mut c = relay.client().await;
    let t0 = now() - 100;
    let first = ev(1, t0, 1, &[], "a quiet spell ends with a search");
    assert!(c.publish(&first).await.0);
    assert_eq!(
        relay
            .metric_or_zero("sluice_search_indexed_serial", &[])
            .await,
        0.0,
        "nobody searched: nothing committed"
    );
    assert_eq!(
        search(&mut c, json!({"search": "quiet spell"})).await,
        [first.id_hex()]
    );
    assert_eq!(
        relay
            .metric_or_zero(
                "sluice_search_fresh_waits_total",
                &["outcome=\"committed\""]
            )
            .await,
        1.0
    );
    // Searched lately: the index commits every 50 ms again, unasked.
    let second = ev(2, t0 + 1, 1, &[], "another spell");
    assert!(c.publish(&second).await.0);
    wait_indexed(&relay, 2).await;
    assert_eq!(count(&mut c, json!({"search": "spell"})).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cjk_text_is_found_by_the_characters_it_holds() {
    let relay = Relay::start_with(&fast_index());
    let mut c = relay.client().await;
    let t0 = now() - 1000;
    let tokyo = ev(1, t0, 1, &[], "東京都に住んでいます。ラーメンが好き");
    let cat = ev(2, t0 + 1, 1, &[], "黒猫が好き");
    let seoul = ev(3, t0 + 2, 1, &[], "서울에서 만나요");
    let zh = ev(4, t0 + 3, 1, &[], "我喜欢比特币和nostr");
    for e in [&tokyo, &cat, &seoul, &zh] {
        assert!(c.publish(e).await.0);
    }
    wait_indexed(&relay, 4).await;
    let id = |e: &Event| e.id_hex();
    assert_eq!(
        search(&mut c, json!({"search": "東京"})).await,
        [id(&tokyo)]
    );
    assert_eq!(
        search(&mut c, json!({"search": "ラーメン"})).await,
        [id(&tokyo)]
    );
    assert_eq!(search(&mut c, json!({"search": "猫"})).await, [id(&cat)]);
    let mut likes = search(&mut c, json!({"search": "好き"})).await;
    likes.sort();
    let mut want = vec![id(&tokyo), id(&cat)];
    want.sort();
    assert_eq!(likes, want);
    assert_eq!(
        search(&mut c, json!({"search": "서울"})).await,
        [id(&seoul)]
    );
    assert_eq!(
        search(&mut c, json!({"search": "比特币 NOSTR"})).await,
        [id(&zh)]
    );
    assert!(search(&mut c, json!({"search": "京東"})).await.is_empty());
    assert!(search(&mut c, json!({"search": "大阪"})).await.is_empty());
    assert_eq!(count(&mut c, json!({"search": "好き"})).await, 2);

    // Live: the same words decide.
    let mut sub = relay.client().await;
    sub.send(json!(["REQ", "live", {"search": "大阪"}])).await;
    assert!(sub.collect_until_eose("live").await.is_empty());
    let miss = ev(5, now(), 1, &[], "阪大に行く");
    let hit = ev(5, now(), 1, &[], "大阪に行く");
    assert!(c.publish(&miss).await.0);
    assert!(c.publish(&hit).await.0);
    let m = sub.expect("EVENT").await;
    assert_eq!(m[2]["id"], id(&hit), "only the matching event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_replaced_and_expired_events_leave_the_results() {
    // Expired events stay on disk for the whole test: only the check of
    // each hit hides them.
    let mut env = fast_index();
    env.push(("SLUICE_ENGINE__EXPIRY_PURGE_INTERVAL_MS", "3600000"));
    let relay = Relay::start_with(&env);
    let mut c = relay.client().await;
    let t = now() - 100;
    let deleted = ev(1, t, 1, &[], "walrus one");
    let kept = ev(1, t + 1, 1, &[], "walrus two");
    let profile = ev(2, t, 0, &[], r#"{"name":"walrus"}"#);
    let expiring = ev(
        3,
        t + 2,
        1,
        &[&["expiration", &(now() + 3).to_string()]],
        "walrus three",
    );
    for e in [&deleted, &kept, &profile, &expiring] {
        assert!(c.publish(e).await.0);
    }
    wait_indexed(&relay, 4).await;
    let all = search(&mut c, json!({"search": "walrus"})).await;
    assert!(all.contains(&kept.id_hex()) && all.contains(&deleted.id_hex()));
    assert!(all.contains(&profile.id_hex()));

    // NIP-09 deletion, and the profile replaced by one without the word.
    let deletion = ev(1, t + 10, 5, &[&["e", &deleted.id_hex()]], "");
    let newer = ev(2, t + 10, 0, &[], r#"{"name":"seal"}"#);
    assert!(c.publish(&deletion).await.0);
    assert!(c.publish(&newer).await.0);
    // Gone at once (the store's check), whatever the index holds.
    let now_found = search(&mut c, json!({"search": "walrus"})).await;
    assert!(!now_found.contains(&deleted.id_hex()), "{now_found:?}");
    assert!(!now_found.contains(&profile.id_hex()), "{now_found:?}");
    // Expiry (NIP-40): once past, never answered.
    wait_search(&mut c, json!({"search": "walrus"}), &[kept.id_hex()]).await;
    assert_eq!(count(&mut c, json!({"search": "walrus"})).await, 1);
    // The stale documents were found and are removed from the index.
    assert!(
        relay
            .metric("sluice_search_hits_dropped_total", &["reason=\"gone\""])
            .await
            >= 2.0
    );
    let start = Instant::now();
    while relay
        .metric_or_zero("sluice_search_removed_total", &[])
        .await
        < 2.0
    {
        assert!(start.elapsed() < DEADLINE, "stale documents not removed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        search(&mut c, json!({"search": "seal"})).await,
        [newer.id_hex()]
    );
}

/// Events every store of the tests below holds: each has the word
/// `common` and a word of its own.
fn corpus(n: usize) -> Vec<Event> {
    let base = now() - 100_000;
    (0..n)
        .map(|i| {
            let words = ["apple", "banana", "cherry", "damson"];
            let content = format!("common w{i} {} {}", words[i % 4], words[(i / 4) % 4]);
            ev(1 + (i % 20) as u8, base + i as u64, 1, &[], &content)
        })
        .collect()
}

fn run_sluice(args: &[&str], store: &std::path::Path, env: &[(&str, &str)]) -> String {
    let mut cmd = sluice_on(store);
    cmd.args(args).env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "sluice {args:?} failed: {text}");
    text
}

/// What a set of searches answers, for comparing stores.
async fn answers(relay: &Relay) -> Vec<Vec<String>> {
    let mut c = relay.client().await;
    let mut out = Vec::new();
    for f in [
        json!({"search": "apple", "limit": 50}),
        json!({"search": "banana cherry", "limit": 500}),
        json!({"search": "w7"}),
        json!({"search": "common damson", "authors": [pubkey_hex(3)], "limit": 500}),
    ] {
        out.push(search(&mut c, f).await);
    }
    out.push(vec![
        count(&mut c, json!({"search": "common"})).await.to_string(),
    ]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_indexing_ends_consistent_once_caught_up() {
    const N: usize = 6000;
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    // Imported without an index: the relay builds it at start.
    let events = corpus(N);
    let file = tmp.path().join("events.jsonl");
    let text: String = events.iter().map(|e| format!("{}\n", e.raw())).collect();
    std::fs::write(&file, text).unwrap();
    run_sluice(
        &["import", file.to_str().unwrap()],
        &store,
        &[("SLUICE_SEARCH__ENABLED", "false")],
    );
    // A writer during the catch-up, then kill -9 while indexing (or just
    // after: both must end consistent).
    let mut relay = Relay::start_in(&store, &fast_index());
    let mut c = relay.client().await;
    let deleted = &events[5];
    let deletion = ev(6, now(), 5, &[&["e", &deleted.id_hex()]], "");
    assert!(c.publish(&deletion).await.0);
    let extra = ev(9, now(), 1, &[], "common late arrival");
    assert!(c.publish(&extra).await.0);
    relay.signal("KILL");
    relay.wait_stopped();
    drop(c);

    let relay = Relay::start_in(&store, &fast_index());
    wait_indexed(&relay, (N + 2) as u64).await;
    let mut c = relay.client().await;
    // The index agrees with the store: the plain scan's count of events
    // holding the word (the store checks words itself without an index).
    let indexed = count(&mut c, json!({"search": "common"})).await;
    assert_eq!(indexed, N as u64, "N - 1 imported left, plus the late one");
    let late = search(&mut c, json!({"search": "late arrival"})).await;
    assert_eq!(late, [extra.id_hex()]);
    assert!(search(&mut c, json!({"search": "w5"})).await.is_empty());
    let unique = search(&mut c, json!({"search": "w4321"})).await;
    assert_eq!(unique, [events[4321].id_hex()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_and_reindex_give_the_same_results() {
    let events = corpus(3000);
    let tmp = tempfile::tempdir().unwrap();
    // Indexed while importing.
    let a = tmp.path().join("a");
    import_events(&a, &events);
    // Imported without an index, then `sluice reindex`.
    let b = tmp.path().join("b");
    let file = tmp.path().join("events.jsonl");
    let text: String = events.iter().map(|e| format!("{}\n", e.raw())).collect();
    std::fs::write(&file, text).unwrap();
    run_sluice(
        &["import", file.to_str().unwrap()],
        &b,
        &[("SLUICE_SEARCH__ENABLED", "false")],
    );
    let said = run_sluice(&["reindex"], &b, &[]);
    assert!(said.contains("reindexed 3000 stored events"), "{said}");

    let relay_a = Relay::start_in(&a, &fast_index());
    wait_indexed(&relay_a, 3000).await;
    let from_import = answers(&relay_a).await;
    drop(relay_a);
    let relay_b = Relay::start_in(&b, &fast_index());
    wait_indexed(&relay_b, 3000).await;
    let from_reindex = answers(&relay_b).await;
    assert_eq!(from_import, from_reindex);
    assert_eq!(from_import[0].len(), 50);
    assert_eq!(from_import[2], [events[7].id_hex()]);
    assert_eq!(from_import[4], ["3000"]);
    // A reindex of a store whose index is whole changes nothing either.
    drop(relay_b);
    run_sluice(&["reindex"], &a, &[]);
    let relay_a = Relay::start_in(&a, &fast_index());
    wait_indexed(&relay_a, 3000).await;
    assert_eq!(answers(&relay_a).await, from_import);
}

/// `sluice sync` indexes what it stores as it goes, as `import` does:
/// the index has caught up when it ends (`sluice reindex --status`, which
/// changes nothing), not only once a relay next starts on the store. An
/// index an older build wrote (its commit names no tokeniser version) is
/// reported by `--status` and rebuilt by the relay's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_indexes_what_it_stores_an_old_index_is_rebuilt_and_status_says_both() {
    const N: usize = 1500;
    let events = corpus(N);
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    import_events(&a, &events);
    let said = run_sluice(&["reindex", "--status"], &a, &[]);
    assert!(
        said.contains(&format!("covers serials up to {N};")) && said.contains("caught up"),
        "{said}"
    );
    // An index as an older build left it (the commit names no tokeniser
    // version): status says so, and the relay below rebuilds it.
    let meta = a.join("search").join("meta.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
    m["payload"] = json!(N.to_string());
    std::fs::write(&meta, m.to_string()).unwrap();
    let said = run_sluice(&["reindex", "--status"], &a, &[]);
    assert!(
        said.contains("split by an older build (version 1)"),
        "{said}"
    );
    // A store imported without an index has none, and status says so.
    let plain = tmp.path().join("plain");
    let file = tmp.path().join("events.jsonl");
    let text: String = events.iter().map(|e| format!("{}\n", e.raw())).collect();
    std::fs::write(&file, text).unwrap();
    run_sluice(
        &["import", file.to_str().unwrap()],
        &plain,
        &[("SLUICE_SEARCH__ENABLED", "false")],
    );
    let said = run_sluice(&["reindex", "--status"], &plain, &[]);
    assert!(said.contains("no search index"), "{said}");
    assert!(said.contains(&format!("last serial is {N}")), "{said}");

    let source = Relay::start_in(&a, &fast_index());
    wait_indexed(&source, N as u64).await;
    let expected = answers(&source).await;
    assert_eq!(expected[0].len(), 50, "the rebuilt index answers");
    eventually("the relay logs that it rebuilt the old index", || {
        let log = source.log_text();
        async move { log.contains("older version split them: rebuilding it") }
    })
    .await;
    let b = tmp.path().join("b");
    let url = source.url();
    let said = {
        let b = b.clone();
        tokio::task::spawn_blocking(move || {
            run_sluice(&["sync", &url, "--direction", "down"], &b, &[])
        })
        .await
        .unwrap()
    };
    assert!(said.contains(&format!("(stored {N},")), "{said}");
    let said = run_sluice(&["reindex", "--status"], &b, &[]);
    assert!(
        said.contains(&format!("covers serials up to {N};")) && said.contains("caught up"),
        "the sync's events indexed by the sync itself: {said}"
    );
    drop(source);
    let relay_b = Relay::start_in(&b, &fast_index());
    assert_eq!(answers(&relay_b).await, expected);
}

/// A REQ whose limit spans several ranking steps (at most 1,024 hits
/// each) and store checks (512 each) answers the exact ranking: the events
/// holding the word twice first, then every tie (same words, same length)
/// newest first, each once, none missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_search_is_ranked_exactly_across_its_steps() {
    const N: usize = 2600;
    let base = now() - 100_000;
    let fruits = ["apple", "banana", "cherry", "damson"];
    let events: Vec<Event> = (0..N)
        .map(|i| {
            // Every text is four words long; one in 500 says `common` twice.
            let content = if i % 500 == 0 {
                format!("common common w{i} {}", fruits[i % 4])
            } else {
                format!("common w{i} {} {}", fruits[i % 4], fruits[(i / 4) % 4])
            };
            ev(1 + (i % 20) as u8, base + i as u64, 1, &[], &content)
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    import_events(&store, &events);
    let relay = Relay::start_in(&store, &fast_index());
    wait_indexed(&relay, N as u64).await;
    let mut c = relay.client().await;

    let by_recency = |keep: &dyn Fn(usize) -> bool| -> Vec<String> {
        (0..N)
            .rev()
            .filter(|i| keep(*i))
            .map(|i| events[i].id_hex())
            .collect()
    };
    let mut want = by_recency(&|i| i % 500 == 0);
    want.extend(by_recency(&|i| i % 500 != 0));
    for limit in [2500usize, N] {
        let got = search(&mut c, json!({"search": "common", "limit": limit})).await;
        assert_eq!(got.len(), limit);
        assert!(got == want[..limit], "limit {limit}: not the exact ranking");
    }
    // Combined with authors: the same order, one author's events only.
    let author = pubkey_hex(3);
    let got = search(
        &mut c,
        json!({"search": "common", "authors": [author], "limit": N}),
    )
    .await;
    let theirs: std::collections::HashSet<String> = (0..N)
        .filter(|i| 1 + (i % 20) == 3)
        .map(|i| events[i].id_hex())
        .collect();
    let mine: Vec<String> = want
        .iter()
        .filter(|id| theirs.contains(*id))
        .cloned()
        .collect();
    assert_eq!(mine.len(), N / 20);
    assert_eq!(got, mine);
}

/// Settings of the flood: per-IP budgets wide open so only the query
/// window decides, and a deadline no machine reaches (as tests/req_burst.rs).
fn flood_limits() -> Vec<(&'static str, &'static str)> {
    vec![
        ("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "1000"),
        (
            "SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S",
            "1000000",
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_IP__RATE_PER_S",
            "1000000000",
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__RATE_PER_S",
            "1000000000",
        ),
        ("SLUICE_THROTTLE__QUERIES__DEADLINE_MS", "3600000"),
        ("SLUICE_SERVER__SEND_TIMEOUT_MS", "3600000"),
        ("SLUICE_SEARCH__COMMIT_INTERVAL_MS", "50"),
    ]
}

/// Searches of a word every event holds, with a large limit, from one
/// address that never reads its answers: the window weighs them by the
/// postings they walk, admits some and refuses the rest (`CLOSED
/// rate-limited:`), and a polite reader from another address is answered
/// meanwhile, searches included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pile_of_expensive_searches_is_refused_and_a_polite_reader_answered() {
    const PILE: usize = 20;
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let events: Vec<Event> = corpus(5000)
        .into_iter()
        .map(|e| {
            let padded = format!("{} {}", e.content, "x".repeat(600));
            ev(1 + (e.created_at % 20) as u8, e.created_at, 1, &[], &padded)
        })
        .collect();
    import_events(&store, &events);
    let relay = Relay::start_in(&store, &flood_limits());
    wait_indexed(&relay, 5000).await;

    let mut pile = Vec::with_capacity(PILE);
    for i in 0..PILE {
        let mut c = Client::connect_small_buffer(&relay.url(), "127.0.0.7", 4096).await;
        let filters: Vec<Value> = (0..10)
            .map(|k| json!({"search": "common", "limit": 5000, "until": now() - k}))
            .collect();
        let mut msg = vec![json!("REQ"), json!(format!("x{i}"))];
        msg.extend(filters);
        c.send(Value::Array(msg)).await;
        pile.push(c);
    }
    let (admitted, closed) = first_answers(&mut pile).await;
    assert!(admitted >= 1, "an expensive search alone is admitted");
    assert!(
        !closed.is_empty(),
        "all {PILE} expensive searches were admitted"
    );
    for m in &closed {
        assert!(
            m[2].as_str()
                .unwrap_or_default()
                .starts_with("rate-limited:"),
            "{m}"
        );
    }

    let mut polite = Client::connect_from(&relay.url(), "127.0.0.8").await;
    for i in 0..20 {
        let got = polite
            .req("p", &[json!({"authors": [pubkey_hex(1)], "limit": 5})])
            .await;
        assert_eq!(got.len(), 5);
        let found = polite
            .req("q", &[json!({"search": format!("w{}", i * 7), "limit": 5})])
            .await;
        assert_eq!(found.len(), 1);
    }
    drop(pile);
}
