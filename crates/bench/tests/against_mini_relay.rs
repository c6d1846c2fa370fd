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
