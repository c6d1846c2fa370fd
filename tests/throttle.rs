//! Black-box tests of adaptive throttling: per-client limits, modes,
//! emergency mode, the status endpoint and SIGHUP reload, against the real
//! binary over real WebSockets. Clients on different loopback addresses
//! (127.0.0.2, 127.0.0.3, ...) are different clients to the relay.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::*;

/// Floods from one address with pipelined EVENTs until `stop`, counting
/// answers by prefix. Returns (accepted, rate_limited).
async fn flood(url: String, source: &'static str, actor: u8, n: u64) -> (u64, u64) {
    let mut c = Client::connect_from(&url, source).await;
    let base = now() - 5000;
    let mut sent = 0u64;
    let (mut ok, mut limited) = (0u64, 0u64);
    while sent < n {
        for _ in 0..50 {
            c.send_event(&ev(actor, base + sent, 1, &[], &format!("flood {sent}")))
                .await;
            sent += 1;
        }
        for _ in 0..50 {
            let m = c.expect("OK").await;
            if m[2] == true {
                ok += 1;
            } else if m[3].as_str().unwrap().starts_with("rate-limited:") {
                limited += 1;
            }
        }
    }
    (ok, limited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooder_is_rate_limited_while_a_polite_client_gets_every_ok() {
    let relay = Relay::start();
    let flooder = tokio::spawn(flood(relay.url(), "127.0.0.2", 2, 1000));
    // Polite at any machine speed: at least 400 ms between EVENTs is at
    // most 2.5 a second, half of `polite_ops_per_s` (5).
    let mut polite = Client::connect_from(&relay.url(), "127.0.0.3").await;
    for i in 0..10 {
        let e = ev(3, now() - 100 + i, 1, &[], &format!("polite {i}"));
        let (ok, msg) = polite.publish(&e).await;
        assert!(ok, "polite event {i} refused: {msg}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let (ok, limited) = flooder.await.unwrap();
    assert!(
        limited > 0,
        "flooder was never rate-limited ({ok} accepted)"
    );
    assert!(ok > 0, "flooder got nothing through");
    // Every refusal counted, by its address's bucket (and its author's).
    let refused = relay
        .metric("sluice_throttle_refusals_total", &["direction=\"write\""])
        .await;
    assert!(
        refused >= limited as f64,
        "refusals not counted: {refused} < {limited}"
    );
    let by_address = relay
        .metric(
            "sluice_throttle_refusals_total",
            &["direction=\"write\"", "layer=\"ip_bucket\""],
        )
        .await;
    assert!(by_address > 0.0, "the address's bucket refused nothing");
}

#[tokio::test]
async fn one_author_is_limited_across_addresses() {
    let relay = Relay::start_with(&[(
        "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_PUBKEY__RATE_PER_S",
        "2",
    )]);
    let mut limited = 0;
    for (i, src) in ["127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"]
        .iter()
        .enumerate()
    {
        let mut c = Client::connect_from(&relay.url(), src).await;
        for j in 0..5 {
            let (ok, msg) = c
                .publish(&ev(4, now() - 100, 1, &[], &format!("{i}/{j}")))
                .await;
            if !ok {
                assert!(msg.starts_with("rate-limited:"), "{msg}");
                limited += 1;
            }
        }
    }
    assert!(limited > 0);
}

#[tokio::test]
async fn req_flood_gets_closed_rate_limited() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__CLIENTS__REQS_PER_IP__RATE_PER_S", "2"),
        ("SLUICE_LIMITS__MAX_SUBSCRIPTIONS", "100"),
    ]);
    let mut c = Client::connect_from(&relay.url(), "127.0.0.8").await;
    for i in 0..40 {
        c.send(json!(["REQ", format!("s{i}"), {"kinds":[1]}])).await;
    }
    // Every REQ ends in exactly one EOSE or CLOSED.
    let (mut eose, mut closed) = (0, 0);
    while eose + closed < 40 {
        let m = c.recv().await;
        if m[0] == "CLOSED" {
            assert!(m[2].as_str().unwrap().starts_with("rate-limited:"), "{m}");
            closed += 1;
        } else if m[0] == "EOSE" {
            eose += 1;
        }
    }
    assert!(closed > 0 && eose > 0, "eose {eose}, closed {closed}");
}

#[tokio::test]
async fn connections_per_ip_are_capped() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "2")]);
    let _a = Client::connect_from(&relay.url(), "127.0.0.9").await;
    let b = Client::connect_from(&relay.url(), "127.0.0.9").await;
    let third = Client::try_connect_with(&relay.url(), Some("127.0.0.9"), &[]).await;
    assert_eq!(third.err(), Some(429));
    // Another address is unaffected; a closed connection frees its place.
    let _other = Client::connect_from(&relay.url(), "127.0.0.10").await;
    b.close().await;
    let mut freed = false;
    for _ in 0..100 {
        if Client::try_connect_with(&relay.url(), Some("127.0.0.9"), &[])
            .await
            .is_ok()
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed);
}

#[tokio::test]
async fn forwarded_for_is_believed_only_from_a_trusted_proxy() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "1"),
        (
            "SLUICE_THROTTLE__CLIENTS__TRUSTED_PROXIES",
            "[\"127.0.0.11\"]",
        ),
    ]);
    let url = relay.url();
    let via = |xff: &'static str| {
        let url = url.clone();
        async move {
            Client::try_connect_with(&url, Some("127.0.0.11"), &[("x-forwarded-for", xff)]).await
        }
    };
    let _a = via("203.0.113.1").await.expect("first client via proxy");
    assert_eq!(via("203.0.113.1").await.err(), Some(429));
    let _b = via("203.0.113.2").await.expect("second client via proxy");
    // From an untrusted peer the header is ignored: the peer address counts.
    let _c = Client::try_connect_with(
        &url,
        Some("127.0.0.12"),
        &[("x-forwarded-for", "203.0.113.3")],
    )
    .await
    .unwrap();
    let d = Client::try_connect_with(
        &url,
        Some("127.0.0.12"),
        &[("x-forwarded-for", "203.0.113.4")],
    )
    .await;
    assert_eq!(d.err(), Some(429));
}

/// A chain of proxies: the inner one listens dual-stack and writes its
/// IPv4 peer (the outer proxy) as `::ffff:127.0.0.30`. That hop is a
/// trusted proxy like `127.0.0.30`, so the client is the hop left of it.
#[tokio::test]
async fn a_trusted_hop_written_ipv4_mapped_is_skipped_like_its_ipv4_address() {
    let relay = Relay::start_with(&[
        ("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "1"),
        (
            "SLUICE_THROTTLE__CLIENTS__TRUSTED_PROXIES",
            "[\"127.0.0.0/8\"]",
        ),
    ]);
    let url = relay.url();
    let via = |xff: &'static str| {
        let url = url.clone();
        async move {
            Client::try_connect_with(&url, Some("127.0.0.15"), &[("x-forwarded-for", xff)]).await
        }
    };
    let _a = via("198.51.100.1, ::ffff:127.0.0.30")
        .await
        .expect("first client behind the proxies");
    let _b = via("198.51.100.2, ::ffff:127.0.0.30")
        .await
        .expect("another client behind the same proxies is another address");
    assert_eq!(
        via("198.51.100.1, ::ffff:127.0.0.30").await.err(),
        Some(429),
        "the first client again: its cap"
    );
}

/// Whether a socket bound to `[::]` takes IPv4 connections and shows their
/// peers as `::ffff:a.b.c.d`; `Err` says why not (IPv6 disabled in the
/// kernel, or `[::]` bound to IPv6 only).
fn dual_stack() -> Result<(), String> {
    let disabled = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .is_ok_and(|v| v.trim() == "1");
    if disabled {
        return Err("the kernel has IPv6 disabled (net.ipv6.conf.all.disable_ipv6 = 1)".into());
    }
    let listener = std::net::TcpListener::bind("[::]:0")
        .map_err(|e| format!("cannot listen on [::]:0: {e}"))?;
    let port = listener.local_addr().unwrap().port();
    let _client = std::net::TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("[::]:{port} takes no IPv4 connection (net.ipv6.bindv6only?): {e}"))?;
    let (_conn, peer) = listener.accept().unwrap();
    match peer.ip() {
        std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Ok(()),
        other => Err(format!("an IPv4 peer of [::] shows as {other}")),
    }
}

/// On a dual-stack listener an IPv4 proxy's peer address is
/// `::ffff:127.0.0.16`: the relay makes it `127.0.0.16` at accept, so the
/// proxy is in `trusted_proxies = ["127.0.0.0/8"]` and its X-Forwarded-For
/// is believed (each client behind it has its own per-address cap).
/// Skipped where the kernel gives no dual-stack socket, unless
/// `IPV6_TESTS_REQUIRE` is set.
#[tokio::test]
async fn a_proxy_reaching_a_dual_stack_listener_over_ipv4_is_trusted_by_its_ipv4_block() {
    if let Err(why) = dual_stack() {
        assert!(
            std::env::var_os("IPV6_TESTS_REQUIRE").is_none(),
            "IPV6_TESTS_REQUIRE is set but {why}"
        );
        eprintln!("SKIPPED: no dual-stack listener: {why}");
        return;
    }
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__LISTEN", "[::]:0"),
        ("SLUICE_THROTTLE__CLIENTS__MAX_CONNECTIONS_PER_IP", "1"),
        (
            "SLUICE_THROTTLE__CLIENTS__TRUSTED_PROXIES",
            "[\"127.0.0.0/8\"]",
        ),
    ]);
    let listening: std::net::SocketAddr = relay.addr.parse().unwrap();
    assert!(listening.is_ipv6(), "{listening}");
    // An IPv4 client of the IPv6 socket: the kernel shows it mapped.
    let url = format!("ws://127.0.0.1:{}", listening.port());
    let via = |xff: &'static str| {
        let url = url.clone();
        async move {
            Client::try_connect_with(&url, Some("127.0.0.16"), &[("x-forwarded-for", xff)]).await
        }
    };
    let _a = via("203.0.113.5").await.expect("first client via proxy");
    let _b = via("203.0.113.6")
        .await
        .expect("the header is believed: another client, not the proxy's address again");
    assert_eq!(via("203.0.113.5").await.err(), Some(429));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_decisions_but_applies_none() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__MODE", "shadow")]);
    let (ok, limited) = flood(relay.url(), "127.0.0.13", 13, 300).await;
    assert_eq!(limited, 0);
    assert_eq!(ok, 300);
    let shadowed = relay
        .metric(
            "sluice_throttle_decisions_total",
            &["enforced=\"false\"", "action=\"refuse\""],
        )
        .await;
    assert!(shadowed > 0.0, "shadow decisions not counted");
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "shadow");
}

#[tokio::test]
async fn off_mode_applies_no_client_limits() {
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__MODE", "off")]);
    let (ok, limited) = flood(relay.url(), "127.0.0.14", 14, 300).await;
    assert_eq!((ok, limited), (300, 0));
}

#[tokio::test]
async fn emergency_mode_refuses_events_and_reqs_with_rate_limited() {
    // A 1 MiB memory target: the process is always above it.
    let relay = Relay::start_with(&[("SLUICE_THROTTLE__TARGET_MEMORY_MB", "1")]);
    let mut emergency = false;
    for _ in 0..200 {
        if relay.get_json("/api/throttle").await["state"]["emergency"] == true {
            emergency = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(emergency, "emergency mode never engaged");
    assert_eq!(relay.metric("sluice_throttle_emergency", &[]).await, 1.0);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(1, now(), 1, &[], "x")).await;
    assert!(
        !ok && msg.starts_with("rate-limited:") && msg.contains("retry in"),
        "{msg}"
    );
    c.send(json!(["REQ", "s", {"kinds":[1]}])).await;
    let m = c.expect("CLOSED").await;
    assert!(m[2].as_str().unwrap().starts_with("rate-limited:"), "{m}");
}

#[tokio::test]
async fn throttle_status_endpoint_reports_the_controller() {
    let relay = Relay::start();
    let mut doc = relay.get_json("/api/throttle").await;
    for _ in 0..200 {
        if !doc["state"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        doc = relay.get_json("/api/throttle").await;
    }
    assert_eq!(doc["mode"], "enforce");
    let state = &doc["state"];
    for key in [
        "memory_pressure",
        "load_level",
        "process_variable",
        "emergency",
    ] {
        assert!(!state[key].is_null(), "state.{key} missing: {state}");
    }
    assert!(state["write"]["pid"]["p"].is_number(), "{state}");
    assert!(doc["queries"]["open"].is_u64(), "{doc}");
    assert!(doc["read_budget_units_per_second"].is_number(), "{doc}");
    assert!(
        doc["buckets"]["events_per_ip"]["max_keys"].is_u64(),
        "{doc}"
    );
    for name in [
        "sluice_throttle_process_variable_ratio",
        "sluice_throttle_memory_pressure_ratio",
        "sluice_throttle_output_ratio",
        "sluice_query_window_in_flight",
        "sluice_query_open",
        "sluice_query_read_budget_units_per_second",
    ] {
        let (_, _, body) = http_get(&relay.addr, "/metrics", None).await;
        assert!(body.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn sighup_reloads_throttle_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("sluice.toml");
    std::fs::write(&file, "[throttle]\nmode = \"enforce\"\n").unwrap();
    let relay = Relay::start_with_config(&file, &[]);
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "enforce");
    std::fs::write(&file, "[throttle]\nmode = \"shadow\"\n").unwrap();
    relay.signal("HUP");
    let mut mode = String::new();
    for _ in 0..200 {
        mode = relay.get_json("/api/throttle").await["mode"]
            .as_str()
            .unwrap()
            .to_string();
        if mode == "shadow" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mode, "shadow");
    // An invalid file is refused and the running settings stay.
    std::fs::write(&file, "[throttle]\nmode = \"sideways\"\n").unwrap();
    relay.signal("HUP");
    for _ in 0..200 {
        if relay.log_text().contains("reload refused") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(relay.log_text().contains("reload refused"));
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "shadow");
    // All or nothing: a valid mode beside an invalid scheduler value is
    // refused as a whole, and the mode stays.
    std::fs::write(
        &file,
        "[throttle]\nmode = \"enforce\"\n[throttle.queries]\nslots = 0\n",
    )
    .unwrap();
    relay.signal("HUP");
    for _ in 0..200 {
        if relay
            .metric_or_zero("sluice_config_reloads_total", &["result=\"refused\""])
            .await
            >= 2.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "shadow");
    assert_eq!(
        relay
            .metric("sluice_config_reloads_total", &["result=\"refused\""])
            .await,
        2.0
    );
    assert_eq!(
        relay
            .metric("sluice_config_reloads_total", &["result=\"applied\""])
            .await,
        1.0
    );
}
