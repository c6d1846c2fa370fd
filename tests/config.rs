//! Black-box tests of configuration: the real binary's `config check` (and
//! `serve`) with a bad value set through the environment must fail with a
//! message naming the key exactly as the operator wrote it
//! (`SLUICE_THROTTLE__READ__KP` is `throttle.read.kp`), and no other key;
//! a SIGHUP reload of `throttle.clients.trusted_proxies` (read by the
//! server from the engine's section) applies to the next connection.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::{BIN, Client, Relay};

/// Runs `sluice <args>` with only `env` set; returns (success, stderr).
fn run(args: &[&str], env: (&str, &str)) -> (bool, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(args)
        .current_dir(tmp.path())
        .env_clear()
        .env(env.0, env.1)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_bad_value_is_reported_under_the_key_the_operator_wrote() {
    // (variable, value, the key the message must name, keys it must not name)
    let cases: &[(&str, &str, &str, &[&str])] = &[
        (
            "SLUICE_THROTTLE__READ__KP",
            "-1",
            "throttle.read.kp",
            &["governor", "throttle.write"],
        ),
        (
            "SLUICE_THROTTLE__WRITE__MAX_DELAY_MS",
            "0",
            "throttle.write.max_delay_ms",
            &["governor", "throttle.read"],
        ),
        (
            "SLUICE_THROTTLE__TARGET_MEMORY_MB",
            "0",
            "throttle.target_memory_mb",
            &["governor"],
        ),
        (
            "SLUICE_THROTTLE__EMERGENCY__EXIT_PRESSURE",
            "2",
            "throttle.emergency.exit_pressure",
            &["governor"],
        ),
        (
            "SLUICE_THROTTLE__SIGNALS__MAP_FILL_FULL",
            "0",
            "throttle.signals.map_fill_full",
            &["governor"],
        ),
        (
            "SLUICE_THROTTLE__QUERIES__SLOTS",
            "0",
            "throttle.queries.slots",
            &[],
        ),
        (
            "SLUICE_THROTTLE__QUERIES__STEP_BYTES",
            "0",
            "throttle.queries.step_bytes",
            &["step_rows"],
        ),
        (
            "SLUICE_THROTTLE__QUERIES__COST__BYTES_PER_UNIT",
            "0",
            "throttle.queries.cost.bytes_per_unit",
            &[],
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__BURST_RATIO",
            "0.5",
            "throttle.clients.events_per_ip.burst_ratio",
            &[],
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__READ_COST_PER_CONNECTION__WINDOW_MS",
            "0",
            "throttle.clients.read_cost_per_connection.window_ms",
            &[],
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__MAX_TRACKED_KEYS",
            "0",
            "throttle.clients.max_tracked_keys",
            &["max_connections_per_ip"],
        ),
        // Above what a keyed bucket map can hold: once accepted here and
        // then refused (or a panic) where the maps are built.
        (
            "SLUICE_THROTTLE__CLIENTS__MAX_TRACKED_KEYS",
            "20000000",
            "throttle.clients.max_tracked_keys",
            &["max_keys"],
        ),
        (
            "SLUICE_THROTTLE__CLIENTS__TRUSTED_PROXIES",
            "[\"10.0.0.0/40\"]",
            "throttle.clients.trusted_proxies",
            &[],
        ),
        (
            "SLUICE_ENGINE__MAX_COUNT_ROWS",
            "0",
            "engine.max_count_rows",
            &["max_scan_rows"],
        ),
        (
            "SLUICE_LIMITS__DEFAULT_LIMIT",
            "9000",
            "limits.default_limit",
            &[],
        ),
        ("SLUICE_STORE__MAX_READERS", "0", "store.max_readers", &[]),
        (
            "SLUICE_SERVER__HANDSHAKE_QUEUE_WAIT_MS",
            "0",
            "server.handshake_queue_wait_ms",
            &["handshake_queue_per_ip", "handshake_timeout_ms"],
        ),
        (
            "SLUICE_SERVER__HANDSHAKE_QUEUE_PER_IP",
            "300",
            "server.handshake_queue_per_ip",
            &["handshake_queue_wait_ms"],
        ),
        (
            "SLUICE_SERVER__LANDING_PAGE",
            "/nonexistent/landing.html",
            "server.landing_page",
            &["public_status"],
        ),
        (
            "SLUICE_SERVER__PUBLIC_STATUS",
            "sometimes",
            "server.public_status",
            &["landing_page"],
        ),
        (
            "SLUICE_RELAY__ICON",
            "javascript:alert(1)",
            "relay.icon",
            &["relay.pubkey"],
        ),
    ];
    for &(var, value, key, not) in cases {
        let (ok, err) = run(&["config", "check"], (var, value));
        assert!(!ok, "{var}={value} was accepted");
        assert!(
            err.contains(key),
            "{var}={value}: the error does not name {key}: {err}"
        );
        for other in not {
            assert!(
                !err.contains(other),
                "{var}={value}: the error names {other}: {err}"
            );
        }
    }
}

#[test]
fn a_mirror_entry_s_bad_or_unknown_key_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let check = |toml: &str| {
        let file = tmp.path().join("sluice.toml");
        std::fs::write(&file, toml).unwrap();
        let out = Command::new(BIN)
            .args(["config", "check", "--config"])
            .arg(&file)
            .current_dir(tmp.path())
            .env_clear()
            .output()
            .unwrap();
        assert!(!out.status.success(), "{toml} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let ok = "[[mirror]]\nurl = \"wss://relay.example\"\n";
    // (the second entry's extra line, what the error must name)
    let cases = [
        ("queue = 5", "mirror.1.queue"),
        ("direction = \"sideways\"", "mirror.1.direction"),
        ("filter = { kinds = \"x\" }", "mirror[1].filter"),
        ("queue_events = 0", "mirror[1].queue_events"),
        ("ca_file = \"missing.pem\"", "mirror[1].ca_file"),
        ("reconnect_max_ms = 10", "mirror[1].reconnect_max_ms"),
    ];
    for (line, key) in cases {
        let err = check(&format!("{ok}{ok}{line}\n"));
        assert!(
            err.contains(key),
            "{line}: the error does not name {key}: {err}"
        );
        assert!(
            !err.contains("mirror[0]") && !err.contains("mirror.0"),
            "{err}"
        );
    }
    let err = check("[[mirror]]\nurl = \"https://relay.example\"\n");
    assert!(err.contains("mirror[0].url"), "{err}");
}

#[test]
fn serve_names_the_key_too() {
    let (ok, err) = run(&["serve"], ("SLUICE_THROTTLE__READ__KP", "-1"));
    assert!(!ok);
    assert!(err.contains("throttle.read.kp"), "{err}");
    assert!(!err.contains("governor"), "{err}");
}

#[tokio::test]
async fn a_reloaded_trusted_proxies_list_applies_to_the_next_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("sluice.toml");
    let clients = "[throttle.clients]\nmax_connections_per_ip = 1\n";
    std::fs::write(&file, clients).unwrap();
    let relay = Relay::start_with_config(&file, &[]);
    let url = relay.url();
    let via = |xff: &'static str| {
        let url = url.clone();
        async move {
            Client::try_connect_with(&url, Some("127.0.0.21"), &[("x-forwarded-for", xff)]).await
        }
    };
    // Not trusted yet: the peer's address counts, and it is at its cap.
    let _first = via("203.0.113.1").await.expect("first connection");
    assert_eq!(via("203.0.113.2").await.err(), Some(429));

    std::fs::write(
        &file,
        format!("{clients}trusted_proxies = [\"127.0.0.21\"]\n"),
    )
    .unwrap();
    relay.signal("HUP");
    let mut applied = false;
    for _ in 0..500 {
        let cfg = relay.get_json("/api/throttle").await;
        if cfg["config"]["clients"]["trusted_proxies"][0] == "127.0.0.21" {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(applied, "the reload was not applied: {}", relay.log_text());
    // Trusted now: each forwarded client has its own cap.
    let _second = via("203.0.113.2").await.expect("a second forwarded client");
    assert_eq!(via("203.0.113.2").await.err(), Some(429));
}
