//! Retention, NIP-62 and a full disk, black-box: the real binary over real
//! WebSockets on a real store. Events older than "now" are put in the store
//! with `sluice import` (no rules) before the relay starts with rules, so
//! nothing here waits for the clock to age an event. Waits are bounded
//! polls for a state, never a sleep then a rate.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_proto::Event;
use support::{Relay, ev, eventually, import_events, now, pubkey_hex, tmpfs};

const DAY: u64 = 86_400;

/// The ids a REQ for `filter` returns (limit 5000).
async fn ids(relay: &Relay, mut filter: serde_json::Value) -> Vec<String> {
    filter["limit"] = json!(5000);
    let mut c = relay.client().await;
    let got = c.req_ids("q", &[filter]).await;
    c.close().await;
    got
}

/// Waits until `sluice_retention_deleted_total{rule}` is `n` (the counter
/// moves just after the commit a reader may already see).
async fn deleted_reaches(relay: &Relay, rule: &str, n: f64) {
    let label = format!("rule=\"{rule}\"");
    let mut last = 0.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        last = relay
            .metric("sluice_retention_deleted_total", &[&label])
            .await;
        if last == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sluice_retention_deleted_total{{{label}}} is {last}, not {n}");
}

fn id_set(events: &[&Event]) -> Vec<String> {
    let mut v: Vec<String> = events.iter().map(|e| e.id_hex()).collect();
    v.sort();
    v
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// A store directory inside `tmp`, filled with `events` by `sluice import`.
fn store_with(tmp: &Path, events: &[Event]) -> std::path::PathBuf {
    let dir = tmp.join("store");
    import_events(&dir, events);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_age_rule_removes_old_events_of_its_kinds_only_and_refuses_them_again() {
    let t = now();
    let old_reaction = ev(1, t - 40 * DAY, 7, &[], "+");
    let new_reaction = ev(1, t - DAY, 7, &[], "+");
    let old_note = ev(
        1,
        t - 40 * DAY,
        1,
        &[],
        "an old note stays: no rule for kind 1",
    );
    let exempt_reaction = ev(2, t - 40 * DAY, 7, &[], "exempt author");
    let admin_reaction = ev(3, t - 40 * DAY, 7, &[], "admins are exempt");
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(
        tmp.path(),
        &[
            old_reaction.clone(),
            new_reaction.clone(),
            old_note.clone(),
            exempt_reaction.clone(),
            admin_reaction.clone(),
        ],
    );
    let toml = format!(
        r#"
[retention]
exempt_pubkeys = ["{}"]
interval_secs = 1
[[retention.rules]]
kinds = [7]
max_age_secs = {}
[policy]
admin_pubkeys = ["{}"]
"#,
        pubkey_hex(2),
        30 * DAY,
        pubkey_hex(3)
    );
    let relay = Relay::start_in_with_toml(&dir, &toml, &[]);
    let kept = id_set(&[&new_reaction, &old_note, &exempt_reaction, &admin_reaction]);
    eventually("the old reaction is removed", || async {
        sorted(ids(&relay, json!({})).await) == kept
    })
    .await;
    deleted_reaches(&relay, "0", 1.0).await;
    // Offered again, it is refused: retention would remove it at once.
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&old_reaction).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    // A fresh one is stored; an old note (no rule) too.
    let (ok, msg) = c.publish(&ev(1, t, 7, &[], "+")).await;
    assert!(ok, "{msg}");
    let (ok, msg) = c
        .publish(&ev(1, t - 50 * DAY, 1, &[], "old notes are kept"))
        .await;
    assert!(ok, "{msg}");
    // NIP-11 says what is kept.
    let (_, _, body) = support::http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["retention"],
        json!([{"kinds": [7], "time": 30 * DAY}]),
        "{doc}"
    );
    assert!(
        doc["supported_nips"]
            .as_array()
            .unwrap()
            .contains(&json!(62))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaceable_events_go_only_by_an_age_rule_naming_their_kind() {
    let t = now();
    let old_profile = ev(1, t - 400 * DAY, 0, &[], "{\"name\":\"old\"}");
    let old_list = ev(1, t - 400 * DAY, 10002, &[], "");
    let old_note = ev(1, t - 400 * DAY, 1, &[], "old note");
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(
        tmp.path(),
        &[old_profile.clone(), old_list.clone(), old_note.clone()],
    );
    // Every kind after a year; kind 10002 after 300 days, named.
    let toml = format!(
        r#"
[retention]
interval_secs = 1
[[retention.rules]]
max_age_secs = {}
[[retention.rules]]
kinds = [10002]
max_age_secs = {}
"#,
        365 * DAY,
        300 * DAY
    );
    let relay = Relay::start_in_with_toml(&dir, &toml, &[]);
    let kept = id_set(&[&old_profile]);
    eventually("the old note and the named list are removed", || async {
        sorted(ids(&relay, json!({})).await) == kept
    })
    .await;
    deleted_reaches(&relay, "0", 1.0).await;
    deleted_reaches(&relay, "1", 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_per_author_keeps_each_authors_newest_and_refuses_older_ones() {
    let t = now();
    let mut events = Vec::new();
    // Author 1: 30 notes and 3 reactions; author 2: 5 notes.
    for i in 0..30u64 {
        events.push(ev(1, t - 1000 + i, 1, &[], &format!("note {i}")));
    }
    for i in 0..3u64 {
        events.push(ev(1, t - 2000 + i, 7, &[], "+"));
    }
    for i in 0..5u64 {
        events.push(ev(2, t - 1000 + i, 1, &[], &format!("other {i}")));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(tmp.path(), &events);
    let toml = r#"
[[retention.rules]]
kinds = [1]
keep_per_author = 10
"#;
    let relay = Relay::start_in_with_toml(&dir, toml, &[]);
    let newest: Vec<&Event> = events[20..30].iter().collect();
    eventually("author 1 keeps only its 10 newest notes", || async {
        sorted(ids(&relay, json!({"authors": [pubkey_hex(1)], "kinds": [1]})).await)
            == id_set(&newest)
    })
    .await;
    // Other kinds and other authors are untouched.
    assert_eq!(
        ids(&relay, json!({"authors": [pubkey_hex(1)], "kinds": [7]}))
            .await
            .len(),
        3
    );
    assert_eq!(
        ids(&relay, json!({"authors": [pubkey_hex(2)]})).await.len(),
        5
    );
    deleted_reaches(&relay, "0", 20.0).await;
    let mut c = relay.client().await;
    // Older than the 10 kept: refused.
    let (ok, msg) = c.publish(&ev(1, t - 5000, 1, &[], "too old")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    // A new one is stored and the oldest kept one goes.
    let fresh = ev(1, t, 1, &[], "fresh");
    let (ok, msg) = c.publish(&fresh).await;
    assert!(ok, "{msg}");
    let mut expected: Vec<&Event> = events[21..30].iter().collect();
    expected.push(&fresh);
    eventually("the oldest kept note makes room", || async {
        sorted(ids(&relay, json!({"authors": [pubkey_hex(1)], "kinds": [1]})).await)
            == id_set(&expected)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_size_target_removes_the_oldest_first_keeps_exempt_authors_and_the_newest() {
    let t = now();
    let filler = "x".repeat(1500);
    let mut events = Vec::new();
    // 4,000 events of about 1.8 KB over 4,000 minutes: ~14 MB of store.
    for i in 0..4000u64 {
        let author = 10 + (i % 50) as u8;
        events.push(ev(
            author,
            t - 4000 * 60 + i * 60,
            1,
            &[],
            &format!("{i} {filler}"),
        ));
    }
    // The exempt author's oldest events.
    let exempt: Vec<Event> = (0..20u64)
        .map(|i| ev(2, t - 5000 * 60 + i, 1, &[], &format!("exempt {i}")))
        .collect();
    events.extend(exempt.iter().cloned());
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(tmp.path(), &events);
    let toml = format!(
        r#"
[retention]
max_store_mb = 4
low_watermark = 0.8
exempt_pubkeys = ["{}"]
"#,
        pubkey_hex(2)
    );
    let relay = Relay::start_in_with_toml(&dir, &toml, &[]);
    let target = 4.0 * 1048576.0;
    eventually("the store is under the target", || async {
        let used = relay.metric("sluice_store_used_bytes", &[]).await;
        used > 0.0 && used <= target
    })
    .await;
    let removed = relay
        .metric("sluice_retention_deleted_total", &["rule=\"size\""])
        .await;
    assert!(removed > 1000.0, "removed {removed}");
    // The newest 500 are all there, and every exempt event.
    let newest: Vec<&Event> = events[3500..4000].iter().collect();
    let got = ids(&relay, json!({"since": t - 500 * 60})).await;
    assert_eq!(sorted(got), id_set(&newest));
    let exempt_refs: Vec<&Event> = exempt.iter().collect();
    assert_eq!(
        sorted(ids(&relay, json!({"authors": [pubkey_hex(2)]})).await),
        id_set(&exempt_refs)
    );
    // The oldest non-exempt one is gone, and offered again it is refused.
    let oldest = &events[0];
    assert!(
        ids(&relay, json!({"ids": [oldest.id_hex()]}))
            .await
            .is_empty()
    );
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(oldest).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, msg) = c.publish(&ev(11, t, 1, &[], "new")).await;
    assert!(ok, "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_added_by_sighup_is_applied() {
    let t = now();
    let old = ev(1, t - 10 * DAY, 7, &[], "+");
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(tmp.path(), std::slice::from_ref(&old));
    let mut relay = Relay::start_in_with_toml(&dir, "", &[]);
    assert_eq!(ids(&relay, json!({})).await.len(), 1);
    std::fs::write(
        dir.with_extension("toml"),
        format!("[[retention.rules]]\nkinds = [7]\nmax_age_secs = {}\n", DAY),
    )
    .unwrap();
    relay.signal("HUP");
    eventually("the reloaded rule removes the old reaction", || async {
        ids(&relay, json!({})).await.is_empty()
    })
    .await;
    eventually("the reload is logged", || async {
        relay.log_text().contains("SIGHUP: settings reloaded")
    })
    .await;
    relay.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nip62_removes_the_authors_events_and_gift_wraps_and_refuses_them_again() {
    let t = now();
    let relay = Relay::start();
    let mut c = relay.client().await;
    let notes: Vec<Event> = (0..5u64)
        .map(|i| ev(1, t - 100 + i, 1, &[], &format!("note {i}")))
        .collect();
    for n in &notes {
        assert!(c.publish(n).await.0);
    }
    let profile = ev(1, t - 50, 0, &[], "{}");
    assert!(c.publish(&profile).await.0);
    let wrap = ev(2, t - 60, 1059, &[&["p", &pubkey_hex(1)]], "sealed");
    assert!(c.publish(&wrap).await.0);
    let bystander = ev(2, t - 60, 1, &[&["p", &pubkey_hex(1)]], "a reply stays");
    assert!(c.publish(&bystander).await.0);
    // A request naming another relay is refused and changes nothing.
    let elsewhere = ev(1, t - 10, 62, &[&["relay", "wss://other.example.com"]], "");
    let (ok, msg) = c.publish(&elsewhere).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    assert_eq!(
        ids(&relay, json!({"authors": [pubkey_hex(1)]})).await.len(),
        6
    );
    // Naming this relay: everything of the author up to it goes.
    let vanish = ev(1, t - 10, 62, &[&["relay", &relay.url()]], "");
    let (ok, msg) = c.publish(&vanish).await;
    assert!(ok, "{msg}");
    assert_eq!(
        ids(&relay, json!({"authors": [pubkey_hex(1)]})).await,
        vec![vanish.id_hex()]
    );
    assert!(
        ids(&relay, json!({"ids": [wrap.id_hex()]}))
            .await
            .is_empty()
    );
    assert_eq!(
        ids(&relay, json!({"ids": [bystander.id_hex()]})).await,
        vec![bystander.id_hex()]
    );
    // Offered again (a sync, a client that kept them): refused.
    let (ok, msg) = c.publish(&notes[0]).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, msg) = c.publish(&wrap).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    // After the request, the author may write again.
    let (ok, msg) = c.publish(&ev(1, t, 1, &[], "back")).await;
    assert!(ok, "{msg}");
    assert!(relay.metric("sluice_events_vanished_total", &[]).await >= 6.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_events_with_error_keeps_reads_and_resumes_when_space_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = tmp.path().join("fs");
    let Some(_mount) = tmpfs(&fs, 24) else {
        return;
    };
    let dir = fs.join("store");
    // No floor: the disk itself fills (ENOSPC from LMDB's writes).
    let relay = Relay::start_in(
        &dir,
        &[
            ("SLUICE_STORE__MIN_FREE_DISK_MB", "0"),
            ("SLUICE_THROTTLE__MODE", "off"),
        ],
    );
    let ballast = fs.join("ballast");
    let t = now();
    let mut c = relay.client().await;
    let first = ev(1, t, 1, &[], "stored before the disk filled");
    assert!(c.publish(&first).await.0);
    // Leave about 1 MiB.
    let free = free_bytes(&fs);
    std::fs::write(&ballast, vec![0u8; (free - (1 << 20)) as usize]).unwrap();
    let big = "y".repeat(60_000);
    let mut accepted = vec![first.clone()];
    let mut refused = None;
    for i in 0..200u64 {
        let e = ev(1, t, 1, &[], &format!("{i} {big}"));
        let (ok, msg) = c.publish(&e).await;
        if ok {
            accepted.push(e);
        } else {
            refused = Some(msg);
            break;
        }
    }
    let msg = refused.expect("the disk never filled");
    assert!(
        msg.starts_with("error: disk is full"),
        "{msg}\n{}",
        relay.log_text()
    );
    // Reads go on, and every accepted event is intact.
    let got = ids(&relay, json!({"authors": [pubkey_hex(1)]})).await;
    let acc: Vec<&Event> = accepted.iter().collect();
    assert_eq!(sorted(got), id_set(&acc));
    // Space returns: writes resume by themselves.
    std::fs::remove_file(&ballast).unwrap();
    let after = ev(1, t + 1, 1, &[], "after the disk had room again");
    let (ok, msg) = c.publish(&after).await;
    assert!(ok, "{msg}");
    assert!(
        relay
            .metric("sluice_writer_errors_total", &["reason=\"disk_full\""])
            .await
            >= 1.0
    );
    drop(c);
    drop(relay);

    // With a floor: refused before the disk is full, the same way.
    let relay = Relay::start_in(
        &dir,
        &[
            ("SLUICE_STORE__MIN_FREE_DISK_MB", "8"),
            ("SLUICE_THROTTLE__MODE", "off"),
        ],
    );
    let free = free_bytes(&fs);
    std::fs::write(&ballast, vec![0u8; (free - (4 << 20)) as usize]).unwrap();
    let mut c = relay.client().await;
    // The monitor sees the floor within a few ticks: retry until refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0u64;
    let last = loop {
        n += 1;
        let (ok, msg) = c
            .publish(&ev(1, t + 2, 1, &[], &format!("probe {n}")))
            .await;
        if !ok {
            break msg;
        }
        assert!(Instant::now() < deadline, "never refused under the floor");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(last.starts_with("error: disk is full"), "{last}");
    assert!(last.contains("min_free_disk_mb"), "{last}");
    assert!(relay.metric("sluice_store_disk_free_bytes", &[]).await > 0.0);
    std::fs::remove_file(&ballast).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        n += 1;
        if c.publish(&ev(1, t + 3, 1, &[], &format!("resumed {n}")))
            .await
            .0
        {
            break;
        }
        assert!(Instant::now() < deadline, "writes never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing stored was lost.
    let got = ids(&relay, json!({"ids": [first.id_hex(), after.id_hex()]})).await;
    assert_eq!(got.len(), 2);
}

fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Runs the `sluice` binary with `args` and a clean environment plus `env`:
/// (success, stdout, stderr).
fn sluice(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = std::process::Command::new(support::BIN)
        .args(args)
        .env_clear()
        // The floor `support::sluice_on` sets: a nearly full CI disk clears it.
        .env("SLUICE_STORE__MIN_FREE_DISK_MB", "64")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_by_filter_through_a_running_relay_and_on_a_stopped_store() {
    let t = now();
    let admin_key = sluice_proto::hex32::encode(&support::key(9));
    let admins = format!("[\"{}\"]", pubkey_hex(9));
    let mut relay = Relay::start_with(&[("SLUICE_POLICY__ADMIN_PUBKEYS", &admins)]);
    let mut c = relay.client().await;
    for i in 0..8u64 {
        assert!(
            c.publish(&ev(1, t - 100 + i, 1, &[], &format!("n{i}")))
                .await
                .0
        );
    }
    for i in 0..4u64 {
        assert!(c.publish(&ev(2, t - 100 + i, 7, &[], "+")).await.0);
    }
    drop(c);
    let url = relay.http("/");
    let online = |extra: &[&str]| {
        let mut args = vec!["delete", "--url", &url];
        args.extend_from_slice(extra);
        sluice(&args, &[("SLUICE_ADMIN_KEY", &admin_key)])
    };
    let (ok, out, err) = online(&["--filter", r#"{"kinds":[7]}"#, "--dry-run"]);
    assert!(ok, "{err}");
    assert!(out.contains("4 events match"), "{out}");
    assert_eq!(ids(&relay, json!({"kinds": [7]})).await.len(), 4);
    let (ok, out, err) = online(&["--filter", r#"{"kinds":[7]}"#]);
    assert!(ok, "{err}");
    assert!(out.contains("4 events removed"), "{out}");
    assert!(ids(&relay, json!({"kinds": [7]})).await.is_empty());
    assert_eq!(ids(&relay, json!({"kinds": [1]})).await.len(), 8);
    // A bad filter is refused with its reason; nothing changes.
    let (ok, _, err) = online(&["--filter", r#"{"kinds":"x"}"#]);
    assert!(!ok && err.contains("filter"), "{err}");
    // Without an admin's key: refused.
    let (ok, _, err) = sluice(
        &["delete", "--url", &url, "--filter", "{}"],
        &[(
            "SLUICE_ADMIN_KEY",
            &sluice_proto::hex32::encode(&support::key(8)),
        )],
    );
    assert!(!ok, "{err}");
    assert_eq!(ids(&relay, json!({})).await.len(), 8);
    let dir = relay.dir.clone();
    let _keep = relay.keep_dir();
    relay.stop();
    // On the stopped store: the 3 newest notes.
    let store = dir.to_str().unwrap();
    let (ok, out, err) = sluice(
        &[
            "delete",
            "--store",
            "--filter",
            r#"{"kinds":[1],"limit":3}"#,
        ],
        &[
            ("SLUICE_STORE__PATH", store),
            ("SLUICE_STORE__MAP_SIZE_MB", "512"),
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("3 events removed"), "{out}");
    let relay = Relay::start_in(&dir, &[]);
    let left = ids(&relay, json!({"kinds": [1]})).await;
    assert_eq!(left.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_dry_run_says_what_each_rule_would_remove_and_removes_nothing() {
    let t = now();
    let mut events = vec![
        ev(1, t - 40 * DAY, 7, &[], "+"),
        ev(1, t - 41 * DAY, 7, &[], "+"),
        ev(1, t - DAY, 7, &[], "+"),
    ];
    for i in 0..6u64 {
        events.push(ev(2, t - 1000 + i, 1, &[], &format!("n{i}")));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(tmp.path(), &events);
    let conf = tmp.path().join("sluice.toml");
    std::fs::write(
        &conf,
        format!(
            "[[retention.rules]]\nkinds = [7]\nmax_age_secs = {}\n[[retention.rules]]\nkinds = [1]\nkeep_per_author = 4\n",
            30 * DAY
        ),
    )
    .unwrap();
    let (ok, out, err) = sluice(
        &["retention", "--dry-run", "--config", conf.to_str().unwrap()],
        &[
            ("SLUICE_STORE__PATH", dir.to_str().unwrap()),
            ("SLUICE_STORE__MAP_SIZE_MB", "512"),
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("rule 0 (kinds [7]): would remove 2 older than"),
        "{out}"
    );
    assert!(
        out.contains("rule 1 (kinds [1]): would remove 2 beyond the newest 4 per author"),
        "{out}"
    );
    // Nothing was removed.
    let relay = Relay::start_in(&dir, &[]);
    assert_eq!(ids(&relay, json!({})).await.len(), events.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_size_eviction_leaves_a_consistent_store() {
    let t = now();
    let filler = "z".repeat(1500);
    let events: Vec<Event> = (0..4000u64)
        .map(|i| {
            ev(
                10 + (i % 40) as u8,
                t - 4000 * 60 + i * 60,
                1,
                &[&["t", &format!("tag{}", i % 7)]],
                &format!("{i} {filler}"),
            )
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with(tmp.path(), &events);
    let toml = "[retention]\nmax_store_mb = 3\nstep_events = 50\n";
    let mut relay = Relay::start_in_with_toml(&dir, toml, &[]);
    // Writes go on while eviction runs; each OK true is durable.
    let mut c = relay.client().await;
    let mut acked = Vec::new();
    eventually("eviction has started", || async {
        relay
            .metric("sluice_retention_deleted_total", &["rule=\"size\""])
            .await
            > 0.0
    })
    .await;
    for i in 0..20u64 {
        let e = ev(1, t + i, 1, &[], &format!("during eviction {i}"));
        if c.publish(&e).await.0 {
            acked.push(e);
        }
    }
    relay.signal("KILL");
    relay.wait_stopped();
    drop(c);
    // Without retention: what is there is whole.
    let relay = Relay::start_in(&dir, &[]);
    let all = sorted(ids(&relay, json!({})).await);
    assert!(
        all.len() < events.len() + acked.len(),
        "eviction removed nothing"
    );
    // Every index answers the same set: by author, by tag, by kind, by id.
    let authors: Vec<String> = (10..50u8).map(pubkey_hex).chain([pubkey_hex(1)]).collect();
    assert_eq!(sorted(ids(&relay, json!({"authors": authors})).await), all);
    assert_eq!(sorted(ids(&relay, json!({"kinds": [1]})).await), all);
    let mut by_tag = Vec::new();
    for k in 0..7 {
        by_tag.extend(ids(&relay, json!({"#t": [format!("tag{k}")]})).await);
    }
    by_tag.extend(ids(&relay, json!({"authors": [pubkey_hex(1)]})).await);
    assert_eq!(sorted(by_tag), all);
    // Every acknowledged event survived, and so did the newest imported.
    let acked_refs: Vec<&Event> = acked.iter().collect();
    assert_eq!(
        sorted(ids(&relay, json!({"authors": [pubkey_hex(1)]})).await),
        id_set(&acked_refs)
    );
    let newest = &events[events.len() - 1];
    assert_eq!(
        ids(&relay, json!({"ids": [newest.id_hex()]})).await.len(),
        1
    );
}
