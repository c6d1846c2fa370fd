//! Black-box tests of the operator's policy: `[policy]` rules answered with
//! their NIP-01 prefixes, the NIP-86 management API (NIP-98 auth, changes
//! applied at once, durable across a restart), and `sluice admin`.

#[path = "support/mod.rs"]
mod support;

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::*;

/// The admin's key number (its secret is `key(ADMIN)`).
const ADMIN: u8 = 9;

fn admin_env() -> (String, String) {
    (
        "SLUICE_POLICY__ADMIN_PUBKEYS".into(),
        format!("[\"{}\"]", pubkey_hex(ADMIN)),
    )
}

/// `sluice admin` against `relay`, signed with key `signer`: (success,
/// stdout, stderr).
fn admin(relay: &Relay, signer: u8, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(BIN)
        .arg("admin")
        .arg("--url")
        .arg(relay.http("/"))
        .args(args)
        .env_clear()
        .env(
            "SLUICE_ADMIN_KEY",
            sluice_proto::hex32::encode(&key(signer)),
        )
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// A raw NIP-86 POST with the given Authorization header value.
async fn rpc_raw(addr: &str, body: &str, authorization: Option<String>) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/nostr+json+rpc\r\n{auth}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A NIP-98 header for `body` signed by key `n`, with `url` and `method`.
fn nip98(n: u8, url: &str, method: &str, body: &str) -> String {
    let digest = sluice_proto::hex32::encode(&Sha256::digest(body));
    let e = ev(
        n,
        now(),
        27235,
        &[&["u", url], &["method", method], &["payload", &digest]],
        "",
    );
    format!(
        "Nostr {}",
        base64::engine::general_purpose::STANDARD.encode(e.raw())
    )
}

#[tokio::test]
async fn config_rules_answer_with_their_prefixes() {
    let toml = format!(
        r#"
[policy]
deny_pubkeys = ["{banned}"]
allow_pubkeys = ["{member}"]
deny_ips = ["127.0.0.9"]
allow_kinds = [0, 1, 4, 22242]
members_only = true
read_restricted = true
[policy.max_event_bytes_by_kind]
"0" = 600
"#,
        banned = pubkey_hex(2),
        member = pubkey_hex(3),
    );
    let relay = Relay::start_with_toml(&toml, &[]);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(2, now(), 1, &[], "banned")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, msg) = c.publish(&ev(3, now(), 7, &[], "kind 7")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, msg) = c.publish(&ev(3, now(), 0, &[], &"x".repeat(700))).await;
    assert!(!ok && msg.starts_with("invalid:"), "{msg}");
    // Members only: a stranger's event, nobody authenticated.
    let (ok, msg) = c.publish(&ev(1, now(), 1, &[], "stranger")).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");
    // A member's own event is taken.
    assert!(c.publish(&ev(3, now(), 1, &[], "member")).await.0);
    // Reads need an authenticated member.
    c.send(json!(["REQ", "r", {"kinds": [1]}])).await;
    let closed = c.expect("CLOSED").await;
    assert!(
        closed[2].as_str().unwrap().starts_with("auth-required:"),
        "{closed}"
    );
    // A blocked address cannot connect.
    let refused = Client::try_connect_with(&relay.url(), Some("127.0.0.9"), &[]).await;
    assert_eq!(refused.err(), Some(403));
    // NIP-11 says so.
    let (_, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["limitation"]["restricted_writes"], true);
    assert_eq!(doc["limitation"]["auth_required"], true);
}

#[tokio::test]
async fn management_changes_apply_at_once_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (k, v) = admin_env();
    let env = [(k.as_str(), v.as_str())];
    let mut relay = Relay::start_in(&store, &env);
    let mut c = relay.client().await;
    let victim = ev(5, now(), 1, &[], "before the ban");
    assert!(c.publish(&victim).await.0);

    // Bad authorisations: none, another key, a payload for another body.
    let body = json!({"method": "listbannedpubkeys", "params": []}).to_string();
    let (status, _) = rpc_raw(&relay.addr, &body, None).await;
    assert_eq!(status, 401);
    let url = relay.http("/");
    let (status, v) = rpc_raw(&relay.addr, &body, Some(nip98(4, &url, "POST", &body))).await;
    assert_eq!(status, 401, "{v}");
    let (status, _) = rpc_raw(&relay.addr, &body, Some(nip98(ADMIN, &url, "POST", "{}"))).await;
    assert_eq!(status, 401);
    let (status, _) = rpc_raw(&relay.addr, &body, Some(nip98(ADMIN, &url, "GET", &body))).await;
    assert_eq!(status, 401);
    let (status, v) = rpc_raw(&relay.addr, &body, Some(nip98(ADMIN, &url, "POST", &body))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], json!([]));

    // Through the CLI: ban, then the next EVENT is refused.
    let (ok, out, err) = admin(&relay, ADMIN, &["banpubkey", &pubkey_hex(5), "spam"]);
    assert!(ok, "{out} {err}");
    let (ok, msg) = c.publish(&ev(5, now(), 1, &[], "after the ban")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, _, err) = admin(&relay, 4, &["banpubkey", &pubkey_hex(6)]);
    assert!(!ok && err.contains("401"), "{err}");
    // A key that is not a secp256k1 secret key is an error, not a panic.
    for bad in ["0".repeat(64), "f".repeat(64)] {
        let out = std::process::Command::new(BIN)
            .args([
                "admin",
                "--url",
                &relay.http("/"),
                "banpubkey",
                &pubkey_hex(6),
            ])
            .env_clear()
            .env("SLUICE_ADMIN_KEY", &bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("not a secp256k1 secret key"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (ok, out, _) = admin(&relay, ADMIN, &["changerelayname", "renamed"]);
    assert!(ok, "{out}");
    let (_, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["name"], "renamed");
    let (ok, out, _) = admin(&relay, ADMIN, &["disallowkind", "7"]);
    assert!(ok, "{out}");
    let (ok, msg) = c.publish(&ev(1, now(), 7, &[], "reaction")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    assert!(
        relay
            .metric("sluice_nip86_requests_total", &["result=\"unauthorized\""])
            .await
            >= 5.0
    );
    drop(c);

    // After a restart: still banned, still renamed; then the purge.
    relay.stop();
    let relay = Relay::start_in(&store, &env);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(5, now(), 1, &[], "after the restart")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let (ok, out, _) = admin(&relay, ADMIN, &["listbannedpubkeys"]);
    assert!(
        ok && out.contains(&pubkey_hex(5)) && out.contains("spam"),
        "{out}"
    );
    let (_, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["name"],
        "renamed"
    );
    assert_eq!(
        c.req_ids("v", &[json!({"authors": [pubkey_hex(5)]})]).await,
        vec![victim.id_hex()]
    );
    let (ok, out, _) = admin(&relay, ADMIN, &["purgepubkey", &pubkey_hex(5)]);
    assert!(ok && out.trim() == "1", "{out}");
    assert!(
        c.req_ids("v2", &[json!({"authors": [pubkey_hex(5)]})])
            .await
            .is_empty()
    );
}

fn plugin_env(script: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let path = format!(
        "{}/../../tests/fixtures/plugins/{script}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut env = vec![
        ("SLUICE_POLICY__PLUGIN__COMMAND".to_string(), path),
        // Python and sh from the PATH of the test run.
        (
            "PATH".to_string(),
            std::env::var("PATH").unwrap_or_default(),
        ),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

fn start_with_plugin(env: &[(String, String)]) -> Relay {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Relay::start_with(&env)
}

#[tokio::test]
async fn a_strfry_plugin_decides_each_event() {
    let relay = start_with_plugin(&plugin_env("by_content.py", &[]));
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(1, now(), 1, &[], "buy spam")).await;
    assert!(!ok, "{msg}");
    assert_eq!(
        msg, "blocked: no spam here",
        "the plugin's prefix is kept, not doubled"
    );
    let shadow = ev(1, now(), 1, &[], "shadow me");
    let (ok, msg) = c.publish(&shadow).await;
    assert!(ok, "{msg}");
    let kept = ev(1, now(), 1, &[], "hello");
    assert!(c.publish(&kept).await.0);
    // Shadow-rejected: OK true, but not stored.
    let ids = c.req_ids("q", &[json!({"authors": [pubkey_hex(1)]})]).await;
    assert_eq!(ids, vec![kept.id_hex()]);
    // The plugin sees who is authenticated.
    let (ok, _) = c.publish(&ev(2, now(), 1, &[], "authed?")).await;
    assert!(!ok);
    let challenge = c.challenge().await;
    let auth = ev(
        2,
        now(),
        22242,
        &[&["relay", &relay.url()], &["challenge", &challenge]],
        "",
    );
    c.send_text(&format!("[\"AUTH\",{}]", auth.raw())).await;
    assert!(c.expect_ok(&auth.id_hex()).await.0);
    assert!(c.publish(&ev(2, now(), 1, &[], "authed? yes")).await.0);
    assert_eq!(
        relay
            .metric("sluice_plugin_events_total", &["result=\"reject\""])
            .await,
        2.0
    );
    assert_eq!(relay.metric("sluice_plugin_in_flight", &[]).await, 0.0);
}

#[tokio::test]
async fn a_silent_plugin_times_out_and_a_dying_one_is_restarted() {
    // Fail closed (the default): no answer in time is a rejection.
    let relay = start_with_plugin(&plugin_env(
        "silent.sh",
        &[("SLUICE_POLICY__PLUGIN__TIMEOUT_MS", "200")],
    ));
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(1, now(), 1, &[], "anyone?")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    assert_eq!(
        relay
            .metric("sluice_plugin_events_total", &["result=\"timeout\""])
            .await,
        1.0
    );
    assert_eq!(relay.metric("sluice_plugin_in_flight", &[]).await, 0.0);
    drop(c);

    // Fail open, and a program that dies on each request: every EVENT is
    // answered (accepted), and the program is restarted.
    let relay = start_with_plugin(&plugin_env(
        "exits.sh",
        &[
            ("SLUICE_POLICY__PLUGIN__FAIL_OPEN", "true"),
            ("SLUICE_POLICY__PLUGIN__RESTART_BACKOFF_MS", "50"),
        ],
    ));
    let mut c = relay.client().await;
    for i in 0..3 {
        let (ok, msg) = c.publish(&ev(1, now(), 1, &[], &format!("n{i}"))).await;
        assert!(ok, "{msg}");
    }
    assert!(relay.metric("sluice_plugin_restarts_total", &[]).await >= 1.0);
}

#[tokio::test]
async fn sluice_admin_store_changes_a_stopped_relays_policy() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut relay = Relay::start_in(&store, &[]);
    let mut c = relay.client().await;
    assert!(c.publish(&ev(5, now(), 1, &[], "before")).await.0);
    drop(c);
    relay.stop();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .args(["admin", "--store"])
            .args(args)
            .env_clear()
            .env("SLUICE_STORE__PATH", &store)
            .env("SLUICE_STORE__MAP_SIZE_MB", "512")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    run(&["banpubkey", &pubkey_hex(5), "offline"]);
    assert_eq!(run(&["purgepubkey", &pubkey_hex(5)]).trim(), "1");
    assert!(run(&["listbannedpubkeys"]).contains("offline"));
    let relay = Relay::start_in(&store, &[]);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(5, now(), 1, &[], "after")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    assert!(
        c.req_ids("q", &[json!({"authors": [pubkey_hex(5)]})])
            .await
            .is_empty()
    );
}
