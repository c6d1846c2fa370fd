//! The pages a browser reads, over plain HTTP (the browser itself drives
//! them in `tests/browser.rs`): `/` by what the client asks for (HTML,
//! NIP-11, a WebSocket), the Content-Security-Policy, `server.landing_page`
//! as a file and off, and who may read `/status` and `/status.json`, which
//! name no address and no pubkey.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Relay, ev, http_get, http_get_with, now, pubkey_hex};

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test]
async fn the_relay_url_answers_a_browser_a_client_and_a_websocket() {
    let relay = Relay::start_with(&[
        ("SLUICE_RELAY__NAME", "Test <relay> & co"),
        ("SLUICE_RELAY__PUBKEY", &pubkey_hex(1)),
        ("SLUICE_RELAY__ICON", "https://img.example/icon.png"),
    ]);
    // A browser: the page, escaped, under a strict policy.
    let (status, head, body) = http_get(&relay.addr, "/", Some(BROWSER_ACCEPT)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        header(&head, "content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = header(&head, "content-security-policy").expect("a CSP header");
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(csp.contains("img-src 'self' https://img.example;"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    assert!(body.contains("Test &lt;relay&gt; &amp; co"), "{body}");
    assert!(!body.contains("<relay>"));
    assert!(body.contains("https://github.com/nostr-protocol/nips/blob/master/01.md"));
    assert!(body.contains("npub1"), "the operator's key as npub");
    assert!(
        body.contains(&format!("ws://{}", relay.addr)),
        "how to connect"
    );
    // Nothing from elsewhere but the icon, nothing inline.
    assert!(!body.contains("<style"), "no inline style");
    assert!(!body.contains(" style="), "no style attribute");
    assert_eq!(body.matches("<script").count(), 1);
    assert!(body.contains(r#"<script src="/assets/page.js" defer></script>"#));
    // The assets it names.
    for (path, kind) in [
        ("/assets/sluice.css", "text/css; charset=utf-8"),
        ("/assets/page.js", "text/javascript; charset=utf-8"),
        ("/assets/status.js", "text/javascript; charset=utf-8"),
    ] {
        let (status, head, _) = http_get(&relay.addr, path, None).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(header(&head, "content-type"), Some(kind), "{path}");
    }
    assert_eq!(http_get(&relay.addr, "/assets/other.js", None).await.0, 404);
    // A Nostr client: NIP-11.
    let (status, head, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    assert_eq!(status, 200);
    assert_eq!(
        header(&head, "content-type"),
        Some("application/nostr+json")
    );
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["name"], "Test <relay> & co");
    // Anything else: the line of text, as before.
    let (status, _, body) = http_get(&relay.addr, "/", None).await;
    assert_eq!(status, 200);
    assert!(body.starts_with("This is a Nostr relay"), "{body}");
    // A WebSocket on the same URL.
    let mut c = relay.client().await;
    assert!(c.publish(&ev(2, now(), 1, &[], "hello")).await.0);
}

#[tokio::test]
async fn an_operator_page_replaces_the_builtin_one_or_none_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("landing.html");
    let mine = "<!doctype html><title>Mine</title><p style=\"color:red\">Welcome</p>\n";
    std::fs::write(&file, mine).unwrap();
    let relay = Relay::start_with(&[("SLUICE_SERVER__LANDING_PAGE", file.to_str().unwrap())]);
    let (status, head, body) = http_get(&relay.addr, "/", Some(BROWSER_ACCEPT)).await;
    assert_eq!(status, 200);
    assert_eq!(body, mine);
    let csp = header(&head, "content-security-policy").expect("a CSP header");
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(!csp.contains("script-src"), "no script runs: {csp}");
    // Read at start: changing the file changes nothing until a restart.
    std::fs::write(&file, "changed").unwrap();
    assert_eq!(
        http_get(&relay.addr, "/", Some(BROWSER_ACCEPT)).await.2,
        mine
    );
    drop(relay);

    let relay = Relay::start_with(&[("SLUICE_SERVER__LANDING_PAGE", "off")]);
    let (status, head, body) = http_get(&relay.addr, "/", Some(BROWSER_ACCEPT)).await;
    assert_eq!(status, 200);
    assert!(body.starts_with("This is a Nostr relay"), "{body}");
    assert_eq!(
        header(&head, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    let mut c = relay.client().await;
    assert!(c.publish(&ev(2, now(), 1, &[], "hello")).await.0);
}

#[tokio::test]
async fn the_status_is_for_operators_unless_public_and_names_nobody() {
    let relay = Relay::start_with(&[("SLUICE_METRICS__ALLOW_FROM", r#"["127.0.0.1/32"]"#)]);
    for path in ["/status", "/status.json"] {
        let (status, _, body) = http_get_with(&relay.addr, path, Some("127.0.0.6"), &[]).await;
        assert_eq!(status, 403, "{path}: {body}");
        for proxy in ["X-Forwarded-For", "X-Real-IP", "Forwarded"] {
            let (status, _, _) = http_get_with(
                &relay.addr,
                path,
                Some("127.0.0.1"),
                &[(proxy, "203.0.113.9")],
            )
            .await;
            assert_eq!(status, 403, "{path} through a proxy ({proxy})");
        }
        let (status, _, _) = http_get_with(&relay.addr, path, Some("127.0.0.1"), &[]).await;
        assert_eq!(status, 200, "{path} for an operator");
    }
    assert_eq!(
        relay
            .metric("sluice_operator_requests_refused_total", &[])
            .await,
        8.0
    );
    // The landing page links to it only for those who may open it.
    let link = r#"<a href="/status">"#;
    let html = |source| http_get_with(&relay.addr, "/", Some(source), &[("Accept", "text/html")]);
    assert!(html("127.0.0.1").await.2.contains(link));
    assert!(!html("127.0.0.6").await.2.contains(link));
    drop(relay);

    let relay = Relay::start_with(&[
        ("SLUICE_METRICS__ALLOW_FROM", r#"["127.0.0.1/32"]"#),
        ("SLUICE_SERVER__PUBLIC_STATUS", "true"),
    ]);
    let (status, head, body) = http_get_with(
        &relay.addr,
        "/status",
        Some("127.0.0.6"),
        &[("X-Forwarded-For", "203.0.113.9")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(header(&head, "content-security-policy").is_some());
    assert!(body.contains(r#"<svg id="traffic""#), "{body}");
    // A client authenticates and publishes from 127.0.0.6; the status
    // counts it and names neither its address nor its key.
    let mut c = support::Client::connect_from(&relay.url(), "127.0.0.6").await;
    let author = pubkey_hex(3);
    let deadline = Instant::now() + Duration::from_secs(30);
    let doc = loop {
        assert!(c.publish(&ev(3, now(), 1, &[], "counted")).await.0);
        let (status, _, body) =
            http_get_with(&relay.addr, "/status.json", Some("127.0.0.6"), &[]).await;
        assert_eq!(status, 200);
        let doc: Value = serde_json::from_str(&body).unwrap();
        let seen = doc["history"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["events_in"].as_f64() > Some(0.0));
        if seen && doc["now"]["connections"] == json!(1.0) {
            for needle in ["127.0.0", "203.0.113", author.as_str(), "npub1"] {
                assert!(!body.contains(needle), "{needle} in {body}");
            }
            break doc;
        }
        assert!(Instant::now() < deadline, "no events counted: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let now = &doc["now"];
    for key in [
        "events_out",
        "queries",
        "write",
        "read",
        "emergency",
        "refusals_by_layer",
        "store",
        "memory",
    ] {
        assert!(!now[key].is_null(), "{key} missing: {now}");
    }
    assert!(now["refusals_by_layer"]["ip_bucket"]["total"].is_number());
    assert!(
        now["store"]["disk_total_bytes"].as_f64() > Some(0.0),
        "{now}"
    );
}
