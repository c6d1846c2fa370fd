//! Black-box tests of the operator's policy: `[policy]` rules answered with
//! their NIP-01 prefixes, the NIP-86 management API (NIP-98 auth, changes
//! applied at once, durable across a restart), and `sluice admin`.

use crate::support;

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
        let out = sluice_on(&store)
            .args(["admin", "--store"])
            .args(args)
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

/// A NIP-86 call signed by `signer` (or unsigned): (HTTP status, answer).
async fn rpc(relay: &Relay, signer: Option<u8>, method: &str, params: Value) -> (u16, Value) {
    let body = json!({"method": method, "params": params}).to_string();
    let auth = signer.map(|n| nip98(n, &relay.http("/"), "POST", &body));
    rpc_raw(&relay.addr, &body, auth).await
}

/// An admin's call that must succeed; its `result`.
async fn admin_ok(relay: &Relay, method: &str, params: Value) -> Value {
    let (status, v) = rpc(relay, Some(ADMIN), method, params).await;
    assert_eq!(status, 200, "{method}: {v}");
    assert!(v["error"].is_null(), "{method}: {v}");
    v["result"].clone()
}

#[tokio::test]
async fn every_nip86_method_has_its_effect_for_an_admin_and_none_for_anyone_else() {
    let (k, v) = admin_env();
    let relay = Relay::start_with(&[(k.as_str(), v.as_str())]);
    let methods: std::collections::BTreeSet<String> =
        serde_json::from_value(admin_ok(&relay, "supportedmethods", json!([])).await).unwrap();
    let mut tested = std::collections::BTreeSet::new();
    let mut done = |m: &str| {
        assert!(methods.contains(m), "{m} is not in supportedmethods");
        tested.insert(m.to_string());
    };
    done("supportedmethods");
    // Nobody else may call any method: unsigned, or signed by a non-admin.
    for m in &methods {
        for signer in [None, Some(4)] {
            let (status, v) = rpc(&relay, signer, m, json!([])).await;
            assert_eq!(status, 401, "{m} by {signer:?}: {v}");
        }
    }
    let mut c = relay.client().await;
    let t = now();

    // banpubkey, listbannedpubkeys, unbanpubkey.
    admin_ok(&relay, "banpubkey", json!([pubkey_hex(5), "spam"])).await;
    let (ok, msg) = c.publish(&ev(5, t, 1, &[], "banned")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let list = admin_ok(&relay, "listbannedpubkeys", json!([])).await;
    assert_eq!(list, json!([{"pubkey": pubkey_hex(5), "reason": "spam"}]));
    admin_ok(&relay, "unbanpubkey", json!([pubkey_hex(5)])).await;
    assert!(c.publish(&ev(5, t, 1, &[], "unbanned")).await.0);
    assert_eq!(
        admin_ok(&relay, "listbannedpubkeys", json!([])).await,
        json!([])
    );
    ["banpubkey", "listbannedpubkeys", "unbanpubkey"]
        .into_iter()
        .for_each(&mut done);

    // banevent removes the stored event and refuses it; allowevent takes it back.
    let e = ev(8, t, 1, &[], "to be banned");
    assert!(c.publish(&e).await.0);
    admin_ok(&relay, "banevent", json!([e.id_hex(), "illegal"])).await;
    assert!(
        c.req_ids("b", &[json!({"ids": [e.id_hex()]})])
            .await
            .is_empty()
    );
    let (ok, msg) = c.publish(&e).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    let list = admin_ok(&relay, "listbannedevents", json!([])).await;
    assert_eq!(list, json!([{"id": e.id_hex(), "reason": "illegal"}]));
    admin_ok(&relay, "allowevent", json!([e.id_hex()])).await;
    assert_eq!(
        admin_ok(&relay, "listbannedevents", json!([])).await,
        json!([])
    );
    assert!(c.publish(&e).await.0);
    assert_eq!(
        c.req_ids("b2", &[json!({"ids": [e.id_hex()]})]).await.len(),
        1
    );
    ["banevent", "listbannedevents", "allowevent"]
        .into_iter()
        .for_each(&mut done);

    // blockip refuses the address's upgrades; unblockip lets it in again.
    admin_ok(&relay, "blockip", json!(["127.0.0.3", "abuse"])).await;
    let refused = Client::try_connect_with(&relay.url(), Some("127.0.0.3"), &[]).await;
    assert_eq!(refused.err(), Some(403));
    let list = admin_ok(&relay, "listblockedips", json!([])).await;
    assert_eq!(list, json!([{"ip": "127.0.0.3", "reason": "abuse"}]));
    admin_ok(&relay, "unblockip", json!(["127.0.0.3"])).await;
    assert_eq!(
        admin_ok(&relay, "listblockedips", json!([])).await,
        json!([])
    );
    let mut c3 = Client::connect_from(&relay.url(), "127.0.0.3").await;
    assert!(c3.publish(&ev(3, t, 1, &[], "let in again")).await.0);
    ["blockip", "listblockedips", "unblockip"]
        .into_iter()
        .for_each(&mut done);

    // changerelayname, changerelaydescription: NIP-11 shows them.
    admin_ok(&relay, "changerelayname", json!(["a new name"])).await;
    admin_ok(
        &relay,
        "changerelaydescription",
        json!(["a new description"]),
    )
    .await;
    let (_, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["name"], "a new name");
    assert_eq!(doc["description"], "a new description");
    ["changerelayname", "changerelaydescription"]
        .into_iter()
        .for_each(&mut done);

    // purgepubkey removes every stored event of a pubkey.
    for i in 0..3 {
        assert!(
            c.publish(&ev(10, t - i, 1, &[], &format!("purge {i}")))
                .await
                .0
        );
    }
    assert_eq!(
        admin_ok(&relay, "purgepubkey", json!([pubkey_hex(10)])).await,
        3
    );
    let authors = json!({"authors": [pubkey_hex(10)]});
    assert!(
        c.req_ids("p", std::slice::from_ref(&authors))
            .await
            .is_empty()
    );
    done("purgepubkey");

    // deletefilter: a dry run counts, the real one removes.
    for i in 0..2 {
        assert!(
            c.publish(&ev(11, t - i, 1, &[], &format!("filtered {i}")))
                .await
                .0
        );
    }
    let f = json!({"authors": [pubkey_hex(11)]});
    assert_eq!(
        admin_ok(&relay, "deletefilter", json!([f, "dry-run"])).await,
        2
    );
    assert_eq!(c.req_ids("d1", std::slice::from_ref(&f)).await.len(), 2);
    assert_eq!(admin_ok(&relay, "deletefilter", json!([f])).await, 2);
    assert!(c.req_ids("d2", std::slice::from_ref(&f)).await.is_empty());
    done("deletefilter");

    // disallowkind, allowkind, listallowedkinds (last: an allow list
    // refuses every other kind).
    admin_ok(&relay, "disallowkind", json!([7])).await;
    let (ok, msg) = c.publish(&ev(1, t, 7, &[], "+")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    assert!(c.publish(&ev(1, t, 1, &[], "kind 1 still")).await.0);
    admin_ok(&relay, "allowkind", json!([7])).await;
    assert_eq!(
        admin_ok(&relay, "listallowedkinds", json!([])).await,
        json!([7])
    );
    assert!(c.publish(&ev(1, t + 1, 7, &[], "+")).await.0);
    let (ok, msg) = c.publish(&ev(1, t + 1, 1, &[], "not on the list")).await;
    assert!(!ok && msg.starts_with("blocked:"), "{msg}");
    ["disallowkind", "allowkind", "listallowedkinds"]
        .into_iter()
        .for_each(&mut done);

    // allowpubkey, listallowedpubkeys, disallowpubkey: on a members-only
    // relay, a listed pubkey may publish.
    let toml = format!(
        "[policy]\nmembers_only = true\nadmin_pubkeys = [\"{}\"]\n",
        pubkey_hex(ADMIN)
    );
    let members = Relay::start_with_toml(&toml, &[]);
    let mut m = members.client().await;
    let (ok, msg) = m.publish(&ev(6, t, 1, &[], "not yet a member")).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");
    admin_ok(&members, "allowpubkey", json!([pubkey_hex(6), "friend"])).await;
    assert!(m.publish(&ev(6, t, 1, &[], "a member now")).await.0);
    let list = admin_ok(&members, "listallowedpubkeys", json!([])).await;
    assert_eq!(list, json!([{"pubkey": pubkey_hex(6), "reason": "friend"}]));
    admin_ok(&members, "disallowpubkey", json!([pubkey_hex(6)])).await;
    let (ok, msg) = m.publish(&ev(6, t + 1, 1, &[], "no longer")).await;
    assert!(!ok && msg.starts_with("auth-required:"), "{msg}");
    assert_eq!(
        admin_ok(&members, "listallowedpubkeys", json!([])).await,
        json!([])
    );
    ["allowpubkey", "listallowedpubkeys", "disallowpubkey"]
        .into_iter()
        .for_each(&mut done);

    // Every method the relay offers was exercised above.
    assert_eq!(tested, methods);
}

#[tokio::test]
async fn a_plugin_that_dies_fails_closed_or_open_as_configured_and_decides_again_once_restarted() {
    const DOWN: &str = "blocked: the write policy did not answer";
    let t = now();
    for fail_open in [false, true] {
        // A backoff far longer than the test: while it runs the program is
        // down, whatever the machine's speed.
        let relay = start_with_plugin(&plugin_env(
            "dies_on_die.py",
            &[
                (
                    "SLUICE_POLICY__PLUGIN__FAIL_OPEN",
                    if fail_open { "true" } else { "false" },
                ),
                ("SLUICE_POLICY__PLUGIN__RESTART_BACKOFF_MS", "600000"),
            ],
        ));
        let mut c = relay.client().await;
        let hello = ev(1, t, 1, &[], "hello");
        assert!(c.publish(&hello).await.0);
        let (ok, msg) = c.publish(&ev(1, t, 1, &[], "spam")).await;
        assert!(!ok && msg == "blocked: no spam here", "{msg}");
        // The program exits on this one without an answer, then is down.
        let die = ev(1, t + 1, 1, &[], "die");
        let during = ev(1, t + 2, 1, &[], "spam while it is down");
        let mut stored = vec![hello.id_hex()];
        for e in [&die, &during] {
            let (ok, msg) = c.publish(e).await;
            if fail_open {
                assert!(ok, "{msg}");
                stored.push(e.id_hex());
            } else {
                assert!(!ok && msg == DOWN, "{msg}");
            }
        }
        let mut got = c.req_ids("s", &[json!({"authors": [pubkey_hex(1)]})]).await;
        got.sort();
        stored.sort();
        assert_eq!(got, stored, "fail_open {fail_open}");
        assert_eq!(
            relay
                .metric("sluice_plugin_events_total", &["result=\"unavailable\""])
                .await,
            2.0
        );
        assert_eq!(
            relay
                .metric("sluice_plugin_events_total", &["result=\"accept\""])
                .await,
            1.0
        );
        assert_eq!(relay.metric("sluice_plugin_in_flight", &[]).await, 0.0);
    }

    // Restarted after a short backoff: the new program decides again (its
    // own verdict, not the failure answer), which the restart counter
    // alone would not show.
    let relay = start_with_plugin(&plugin_env(
        "dies_on_die.py",
        &[("SLUICE_POLICY__PLUGIN__RESTART_BACKOFF_MS", "100")],
    ));
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(2, t, 1, &[], "die")).await;
    assert!(!ok && msg == DOWN, "{msg}");
    let deadline = std::time::Instant::now() + ANSWER_TIMEOUT;
    let mut n = 0;
    loop {
        n += 1;
        let (ok, msg) = c.publish(&ev(2, t, 1, &[], &format!("spam {n}"))).await;
        assert!(!ok, "{msg}");
        if msg == "blocked: no spam here" {
            break;
        }
        assert_eq!(msg, DOWN);
        assert!(
            std::time::Instant::now() < deadline,
            "the plugin never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(c.publish(&ev(2, t, 1, &[], "welcome back")).await.0);
    assert!(relay.metric("sluice_plugin_restarts_total", &[]).await >= 1.0);
    assert_eq!(relay.metric("sluice_plugin_in_flight", &[]).await, 0.0);
}
