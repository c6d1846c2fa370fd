//! Black-box tests of the `sluice-bench` binary against the in-test relay:
//! gen, then publish, then query, checking the JSON reports (counts only,
//! never timings).

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluice-bench {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn gen_events(dir: &Path, count: u64) -> String {
    let events = dir.join("events.jsonl");
    let events_s = events.to_str().unwrap().to_owned();
    bench(&[
        "gen",
        "--count",
        &count.to_string(),
        "--seed",
        "5",
        "--authors",
        "40",
        "--out",
        &events_s,
    ]);
    events_s
}

/// Runs the blocking CLI calls off the runtime that serves the relay.
async fn bench_async(args: Vec<String>) {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        bench(&refs);
    })
    .await
    .unwrap();
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_then_query_against_a_real_websocket_relay() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let events = gen_events(dir.path(), 600);
    let pub_json = dir.path().join("publish.json");
    let pub_json_s = pub_json.to_str().unwrap();
    bench_async(strings(&[
        "publish",
        &url,
        "--events",
        &events,
        "--connections",
        "4",
        "--window",
        "4",
        "--json",
        pub_json_s,
    ]))
    .await;
    let p = read_json(&pub_json);
    assert_eq!(p["results"]["accepted"], 600);
    assert_eq!(p["results"]["refused"], 0);
    assert_eq!(p["results"]["accepted_latency"]["count"], 600);

    // Open loop again: every event is now a duplicate, still accepted.
    bench_async(strings(&[
        "publish", &url, "--events", &events, "--rate", "2000", "--limit", "200", "--json",
        pub_json_s,
    ]))
    .await;
    let p = read_json(&pub_json);
    assert_eq!(p["mode"], "open-loop");
    assert_eq!(p["results"]["accepted"], 200);
    assert_eq!(p["results"]["accepted_prefixes"]["duplicate"], 200);

    let q_json = dir.path().join("query.json");
    bench_async(strings(&[
        "query",
        &url,
        "--events",
        &events,
        "--queries",
        "120",
        "--connections",
        "3",
        "--json",
        q_json.to_str().unwrap(),
    ]))
    .await;
    let q = read_json(&q_json);
    assert_eq!(q["total"]["queries"], 120);
    assert_eq!(q["total"]["timeouts"], 0);
    assert!(q["total"]["events_returned"].as_u64().unwrap() > 120);
    assert!(q["by_type"].as_object().unwrap().len() >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_delivers_every_event_to_every_subscriber() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("fanout.json");
    bench_async(strings(&[
        "fanout",
        &url,
        "--subscribers",
        "5",
        "--publishers",
        "2",
        "--rate",
        "100",
        "--duration-secs",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]))
    .await;
    let f = read_json(&json);
    assert_eq!(f["subscribers_ready"], 5);
    assert_eq!(f["publish"]["accepted"], 100);
    assert_eq!(f["expected_deliveries"], 500);
    assert_eq!(f["deliveries"], 500);
    assert_eq!(f["delivery_latency"]["count"], 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audience_answers_every_idle_req_and_measures_the_relay() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("audience.json");
    // The mini relay runs in this process: its CPU and memory are ours.
    let pid = std::process::id().to_string();
    bench_async(strings(&[
        "audience",
        &url,
        "--idle",
        "30",
        "--reqs-per-idle",
        "4",
        "--source-addrs",
        "3",
        "--rate",
        "100",
        "--duration-secs",
        "1",
        "--settle-secs",
        "0.1",
        "--relay-pid",
        &pid,
        "--json",
        json.to_str().unwrap(),
    ]))
    .await;
    let a = read_json(&json);
    assert_eq!(a["run"]["command"], "audience");
    let idle = &a["idle"];
    assert_eq!(idle["opened"], 30);
    assert_eq!(idle["reqs_sent"], 120);
    assert_eq!(idle["eose"], 120);
    assert_eq!(idle["closed"], 0);
    assert_eq!(idle["unanswered"], 0);
    assert_eq!(idle["dropped"], 0);
    assert_eq!(idle["events"], 0);
    assert_eq!(
        a["source_addrs"],
        serde_json::json!(["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    );
    let w = &a["watcher"];
    assert_eq!(w["subscribers_ready"], 1);
    assert_eq!(w["publish"]["accepted"], 100);
    assert_eq!(w["deliveries"], 100);
    assert_eq!(w["delivery_latency"]["count"], 100);
    assert!(a["relay_cpu_ms_per_event"].as_f64().unwrap() >= 0.0);
    assert!(a["relay_rss_bytes_end"].as_u64().unwrap() > 0);
    let fd = &a["fd_limit"];
    assert!(fd["soft"].as_u64().unwrap() >= fd["soft_before"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_opens_and_reads_process_memory() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("connections.json");
    let pid = std::process::id().to_string();
    bench_async(strings(&[
        "connections",
        &url,
        "--count",
        "40",
        "--subscribe",
        "--pid",
        &pid,
        "--settle-secs",
        "0.2",
        "--json",
        json.to_str().unwrap(),
    ]))
    .await;
    let c = read_json(&json);
    assert_eq!(c["opened"], 40);
    assert!(c["with_connections"]["rss_bytes"].as_f64().unwrap() > 0.0);
    assert!(c["rss_bytes_per_connection"].is_number());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_reports_every_phase_and_plots() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("overload.json");
    let json_s = json.to_str().unwrap();
    bench_async(strings(&[
        "overload",
        &url,
        "--capacity",
        "200",
        "--phases",
        "0.5,1",
        "--phase-secs",
        "1",
        "--polite-clients",
        "2",
        "--polite-rate",
        "5",
        "--abusive-clients",
        "2",
        "--no-metrics",
        "--json",
        json_s,
    ]))
    .await;
    let o = read_json(&json);
    let phases = o["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases[0]["abusive"]["offered"], 100);
    assert_eq!(phases[1]["abusive"]["offered"], 200);
    for p in phases {
        assert_eq!(p["polite"]["offered"], 10);
        assert_eq!(p["polite"]["accepted"], 10);
        assert_eq!(p["abusive"]["accepted"], p["abusive"]["offered"]);
    }
    assert_eq!(o["timeline"]["polite"].as_array().unwrap().len(), 2);
    let svg = dir.path().join("overload.svg");
    bench_async(strings(&["plot", json_s, "--out", svg.to_str().unwrap()])).await;
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readflood_reports_every_phase_and_class_and_plots() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("readflood.json");
    let json_s = json.to_str().unwrap();
    // The abusers run in a child process (the default): this also checks the re-exec.
    bench_async(strings(&[
        "readflood",
        &url,
        "--before-secs",
        "1",
        "--flood-secs",
        "2",
        "--after-secs",
        "1",
        "--settle-secs",
        "0.1",
        "--polite-clients",
        "2",
        "--polite-req-rate",
        "5",
        "--polite-event-rate",
        "2",
        "--abusive-addrs",
        "2",
        "--abusive-subs",
        "2",
        "--abusive-limit",
        "50",
        "--no-metrics",
        "--json",
        json_s,
    ]))
    .await;
    let r = read_json(&json);
    assert_eq!(r["run"]["command"], "readflood");
    assert_eq!(r["distinct_source_ips"], true);
    let phases = r["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["before", "flood", "after"]);
    // 2 clients x 5 REQ/s and 2 EVENT/s, on a schedule: exact counts per phase.
    for (p, secs) in phases.iter().zip([1, 2, 1]) {
        let reads = &p["polite_reads"];
        assert_eq!(reads["sent"], 10 * secs, "{}", p["name"]);
        assert_eq!(reads["eose"], reads["sent"]);
        assert_eq!(reads["success_ratio"], 1.0);
        assert_eq!(reads["timeouts"], 0);
        assert_eq!(reads["time_to_eose"]["count"], 10 * secs);
        let writes = &p["polite_writes"];
        assert_eq!(writes["sent"], 4 * secs);
        assert_eq!(writes["accepted"], 4 * secs);
    }
    // Abusers only during the flood; the mini relay answers every REQ.
    assert_eq!(phases[0]["abusive_reads"]["sent"], 0);
    assert_eq!(phases[2]["abusive_reads"]["sent"], 0);
    let flood = &phases[1]["abusive_reads"];
    let sent = flood["sent"].as_u64().unwrap();
    let eose = flood["eose"].as_u64().unwrap();
    assert!(eose > 4, "abusive EOSE {eose}");
    assert_eq!(flood["closed"], 0);
    assert_eq!(flood["timeouts"], 0);
    // Every REQ sent was answered or still open when the flood ended (at most 4).
    assert_eq!(sent, eose + flood["unanswered_at_end"].as_u64().unwrap());
    assert!(flood["events"].as_u64().unwrap() > 0);
    assert!(flood["bytes"].as_u64().unwrap() > flood["events"].as_u64().unwrap());
    assert_eq!(r["abusive"]["connections"], 2);
    assert_eq!(r["abusive"]["separate_process"], true);
    assert_ne!(r["abusive"]["pid"], std::process::id());
    assert_eq!(r["abusive"]["source_ips"][1], "127.0.0.11");
    assert_eq!(r["abusive"]["reconnects"], 0);
    assert_eq!(r["after_flood"]["probe"]["outcome"], "eose");
    assert_eq!(r["after_flood"]["probe"]["events"], 5);
    let tl = &r["timeline"];
    assert_eq!(tl["polite_reads"].as_array().unwrap().len(), 4);
    assert_eq!(tl["abusive_reads"][0]["sent"], 0);
    assert!(tl["abusive_reads"][1]["eose"].as_u64().unwrap() > 0);
    let svg = dir.path().join("readflood.svg");
    bench_async(strings(&["plot", json_s, "--out", svg.to_str().unwrap()])).await;
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("abusive REQs per second"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_ingests_checks_what_is_stored_and_plots() {
    let url = support::start().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let json_s = json.to_str().unwrap();
    let exempt = bench(&[
        "soak",
        "--print-exempt",
        "--exempt-authors",
        "2",
        "--seed",
        "7",
    ]);
    let exempt = String::from_utf8(exempt.stdout).unwrap();
    // The mini relay has no /metrics: its series are absent, not zero.
    bench_async(strings(&[
        "soak",
        "--url",
        &url,
        "--events",
        "600",
        "--authors",
        "20",
        "--exempt-authors",
        "2",
        "--writers",
        "2",
        "--window",
        "4",
        "--polite",
        "1",
        "--polite-interval-ms",
        "50",
        "--sample-ms",
        "100",
        "--check-newest",
        "150",
        "--target-mb",
        "0.1",
        "--seed",
        "7",
        "--out",
        json_s,
    ]))
    .await;
    let r = read_json(&json);
    assert_eq!(r["run"]["command"], "soak");
    let keys: Vec<&str> = r["exempt_pubkeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2);
    assert!(keys.iter().all(|k| exempt.contains(k)), "{exempt}");
    let s = &r["summary"];
    // 600 from the writers plus what the polite client sent meanwhile.
    assert_eq!(r["writers"]["offered"], 600);
    assert_eq!(r["writers"]["accepted"], 600);
    assert_eq!(s["accepted_events"], s["offered_events"]);
    assert_eq!(s["polite_accepted"], s["polite_offered"]);
    assert_eq!(s["error_answers"], 0);
    assert!(s["accepted_bytes"].as_u64().unwrap() > 600 * 300);
    let kinds = r["accepted_kinds"].as_object().unwrap();
    assert!(kinds["1"].as_u64().unwrap() > kinds["7"].as_u64().unwrap());
    // The mini relay keeps everything, so both checks find every event.
    let newest = &r["checks"]["newest"];
    assert_eq!(newest["found"], newest["expected"]);
    assert_eq!(
        newest["expected"].as_u64().unwrap() + newest["superseded"].as_u64().unwrap(),
        150
    );
    let exempt_check = &r["checks"]["exempt"];
    assert!(exempt_check["expected"].as_u64().unwrap() > 0);
    assert_eq!(exempt_check["found"], exempt_check["expected"]);
    assert_eq!(exempt_check["missing"], 0);
    assert_eq!(r["verdict"]["pass"], true);
    let samples = r["samples"].as_array().unwrap();
    assert!(!samples.is_empty());
    assert!(samples.iter().all(|p| p["store_used_bytes"].is_null()));
    let accepted: u64 = samples
        .iter()
        .map(|p| p["accepted"].as_u64().unwrap())
        .sum();
    assert_eq!(accepted, s["accepted_events"].as_u64().unwrap());
    assert!(r["metrics"]["failures"].as_u64().unwrap() > 0);
    let svg = dir.path().join("soak.svg");
    bench_async(strings(&["plot", json_s, "--out", svg.to_str().unwrap()])).await;
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("relay store size") && text.contains("polite OK latency"));
}
