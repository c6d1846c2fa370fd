use super::*;

fn page(relay: RelayInfoConfig, auth: AuthConfig) -> String {
    let rules = AccessRules::default();
    render(&Facts {
        relay: &relay,
        limits: &LimitsConfig::default(),
        auth: &auth,
        rules: &rules,
        throttle: &ThrottleConfig::default(),
        retention_target_bytes: 0,
        retention_rules: &[serde_json::json!({"kinds": [7], "time": 2_592_000})],
        pow_difficulty: 0,
        url: "wss://relay.example".into(),
        status_link: false,
        search: true,
    })
}

#[test]
fn operator_text_is_escaped_everywhere() {
    let relay = RelayInfoConfig {
        name: "<script>alert(1)</script>".into(),
        description: "\"><img src=x onerror=alert(1)>".into(),
        contact: "<b>me</b>".into(),
        icon: "https://x.example/\"onload=\"alert(1)".into(),
        ..RelayInfoConfig::default()
    };
    let p = page(relay, AuthConfig::default());
    assert!(!p.contains("<script>alert"), "{p}");
    assert!(!p.contains("<img src=x"), "{p}");
    assert!(!p.contains("<b>me"), "{p}");
    assert!(!p.contains("\"onload="), "{p}");
    assert!(p.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!p.contains("{{"), "every slot filled");
}

#[test]
fn only_mail_and_web_contacts_become_links() {
    for (contact, link) in [
        ("javascript:alert(1)", None),
        ("data:text/html,x", None),
        ("me@relay.example", Some("mailto:me@relay.example")),
        (
            "https://relay.example/about",
            Some("https://relay.example/about"),
        ),
    ] {
        let relay = RelayInfoConfig {
            contact: contact.into(),
            ..RelayInfoConfig::default()
        };
        let p = page(relay, AuthConfig::default());
        match link {
            Some(href) => assert!(p.contains(&format!(r#"<a href="{href}">"#)), "{p}"),
            None => {
                assert!(!p.contains(&format!(r#"href="{contact}""#)), "{p}");
                assert!(p.contains(&format!("<dd>{contact}</dd>")), "{p}");
            }
        }
    }
}

#[test]
fn a_value_is_not_read_again_for_slots() {
    let relay = RelayInfoConfig {
        name: "{{description}}".into(),
        description: "plain".into(),
        ..RelayInfoConfig::default()
    };
    let p = page(relay, AuthConfig::default());
    assert!(
        p.contains(r#"<h1 id="relay-name">{{description}}</h1>"#),
        "{p}"
    );
}

#[test]
fn the_page_names_the_nips_keys_and_rules() {
    let relay = RelayInfoConfig {
        pubkey: "3bf0c63fcb93463407af97a5e5ee64fa883d107ef9e558472c4eb9aaaefa459d".into(),
        contact: "admin@relay.example".into(),
        ..RelayInfoConfig::default()
    };
    let p = page(relay, AuthConfig::default());
    assert!(p.contains("npub180cvv07tjdrrgpa0j7j7tmnyl2yr6yr7l8j4s3evf6u64th6gkwsyjh6w6"));
    assert!(p.contains(r#"href="mailto:admin@relay.example""#));
    assert!(p.contains(&format!(r#"href="{NIPS_URL}01.md""#)));
    assert!(p.contains(&format!(r#"href="{NIPS_URL}42.md""#)));
    assert!(p.contains("Authentication required to read DMs"));
    assert!(p.contains("Events of kinds 7 are kept 30 days."));
    assert!(p.contains("128 KiB"));
    let no_auth = AuthConfig {
        enabled: false,
        private_kinds: vec![],
        ..AuthConfig::default()
    };
    let p = page(RelayInfoConfig::default(), no_auth);
    assert!(!p.contains("42.md"));
    assert!(!p.contains("read DMs"));
}
