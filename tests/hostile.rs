//! Black-box tests of what an attacker can send: unsigned data riding along
//! with a signed event, nesting meant to exhaust a parser, and filters whose
//! JSON the parser refuses, each answered with the right NIP-01 message and
//! nothing of it stored or served.

#[path = "support/mod.rs"]
mod support;

use serde_json::json;
use support::*;

/// A signed event's text with `extra` spliced in as its first field.
fn with_extra(e: &sluice_proto::Event, extra: &str) -> String {
    format!("{{{extra},{}", &e.raw()[1..])
}

#[tokio::test]
async fn unsigned_fields_are_neither_stored_nor_served() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now(), 1, &[], "short");
    // 120 KB of unsigned data beside a 5-byte content.
    let junk = format!(r#""junk":"{}""#, "j".repeat(120_000));
    c.send_text(&format!(r#"["EVENT",{}]"#, with_extra(&e, &junk)))
        .await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(ok, "{msg}");
    let got = c.req("s", &[json!({"ids": [e.id_hex()]})]).await;
    assert_eq!(got.len(), 1);
    assert!(!got[0].contains("junk"), "served with the unsigned field");
    assert!(got[0].len() < 1_000, "served {} bytes", got[0].len());
    let served = sluice_proto::Event::parse(&got[0]).unwrap();
    served.verify().unwrap();
    // The clean copy, sent later, is a duplicate of what is stored.
    let (ok, msg) = c.publish(&e).await;
    assert!(ok && msg.starts_with("duplicate:"), "{msg}");
}

#[tokio::test]
async fn deep_nesting_is_refused_with_the_right_answer() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    let e = ev(1, now(), 1, &[], "x");
    let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    c.send_text(&format!(
        r#"["EVENT",{}]"#,
        with_extra(&e, &format!(r#""junk":{deep}"#))
    ))
    .await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(
        !ok && msg.starts_with("invalid:") && msg.contains("nests deeper"),
        "{msg}"
    );
    // Not stored.
    assert!(c.req("s", &[json!({"ids": [e.id_hex()]})]).await.is_empty());

    // A deep filter: CLOSED for its subscription.
    c.send_text(&format!(r##"["REQ","d",{{"#t":[{deep}]}}]"##))
        .await;
    let m = c.expect("CLOSED").await;
    assert_eq!(m[1], "d");
    let text = m[2].as_str().unwrap();
    assert!(
        text.starts_with("invalid:") && text.contains("nests deeper"),
        "{m}"
    );
    // Anything else that deep: a NOTICE, and the connection goes on.
    c.send_text(&format!(r#"["HELLO",{deep}]"#)).await;
    c.expect("NOTICE").await;
    c.send_text(&format!(r#"["CLOSE",{deep}]"#)).await;
    c.expect("NOTICE").await;
    assert!(c.publish(&e).await.0);
}

#[tokio::test]
async fn a_filter_the_parser_refuses_is_named_for_what_it_is() {
    let relay = Relay::start();
    let mut c = relay.client().await;
    c.send_text(r#"["REQ","big",{"limit":1e400}]"#).await;
    let m = c.expect("CLOSED").await;
    let text = m[2].as_str().unwrap();
    assert!(text.starts_with("invalid:"), "{m}");
    assert!(!text.contains("must be a JSON object"), "{m}");
    assert!(text.contains("number out of range"), "{m}");
}
