use super::*;
use sluice_proto::{Event, Reason, hex32};
use std::net::IpAddr;

fn ev(sk: u8, kind: u16, content: &str) -> Event {
    Event::sign(&[sk; 32], 1, kind, vec![], content)
}

fn pk(sk: u8) -> [u8; 32] {
    sluice_proto::event::public_key_of(&[sk; 32])
}

#[test]
fn a_reload_replaces_the_config_and_keeps_runtime_entries_and_the_running_plugin() {
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let p = Access::default();
    let running = crate::access::PluginConfig {
        command: "/bin/cat".into(),
        ..Default::default()
    };
    p.load(
        PolicyConfig {
            plugin: running.clone(),
            admin_pubkeys: vec![hex32::encode(&pk(5))],
            ..PolicyConfig::default()
        },
        vec![("deny_kind:3".into(), String::new())],
    );
    p.set("deny_kind:4".into(), Some(String::new()));
    let denied = |p: &Access, kind| p.rules().check_event(&ev(1, kind, "x"), ip, &[]).is_err();
    assert!(!denied(&p, 7));
    let changed = p.reload(PolicyConfig {
        deny_kinds: vec![7],
        admin_pubkeys: vec![hex32::encode(&pk(6))],
        ..PolicyConfig::default()
    });
    assert!(changed, "the plugin's settings changed");
    assert!(denied(&p, 7), "the new config applies");
    assert!(denied(&p, 3) && denied(&p, 4), "runtime entries stay");
    assert!(!denied(&p, 1));
    assert!(p.is_admin(&pk(6)) && !p.is_admin(&pk(5)));
    assert_eq!(p.inner.read().cfg.plugin, running);
    // The same plugin settings again: nothing to restart.
    assert!(!p.reload(PolicyConfig {
        plugin: running,
        ..PolicyConfig::default()
    }));
    assert!(!denied(&p, 7));
}

#[test]
fn each_rule_refuses_with_its_prefix_in_order() {
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let cfg = PolicyConfig {
        deny_pubkeys: vec![hex32::encode(&pk(2))],
        allow_pubkeys: vec![hex32::encode(&pk(3))],
        deny_ips: vec!["192.168.0.0/16".into()],
        allow_kinds: vec![0, 1, 3],
        max_event_bytes_by_kind: [("0".to_string(), 400)].into(),
        ..PolicyConfig::default()
    };
    cfg.validate().unwrap();
    let runtime = vec![
        (
            format!("ban_event:{}", ev(1, 1, "bad").id_hex()),
            "spam".into(),
        ),
        ("deny_kind:3".into(), String::new()),
    ];
    let r = AccessRules::build(&cfg, &runtime);
    let deny =
        |e: &Event, authed: &[[u8; 32]]| r.check_event(e, ip, authed).err().map(|d| d.reason);
    assert_eq!(deny(&ev(1, 1, "ok"), &[]), None);
    assert_eq!(
        r.check_event(&ev(1, 1, "ok"), "192.168.4.4".parse().unwrap(), &[])
            .unwrap_err()
            .reason,
        Reason::Blocked
    );
    assert_eq!(deny(&ev(1, 1, "bad"), &[]), Some(Reason::Blocked));
    assert_eq!(deny(&ev(2, 1, "x"), &[]), Some(Reason::Blocked));
    assert_eq!(
        deny(&ev(1, 1, "x"), &[pk(2)]),
        Some(Reason::Blocked),
        "banned session"
    );
    assert_eq!(
        deny(&ev(1, 7, "x"), &[]),
        Some(Reason::Blocked),
        "not allowed"
    );
    assert_eq!(
        deny(&ev(1, 3, "x"), &[]),
        Some(Reason::Blocked),
        "denied at runtime"
    );
    assert_eq!(
        deny(&ev(1, 0, &"x".repeat(300)), &[]),
        Some(Reason::Invalid)
    );

    let members = AccessRules::build(
        &PolicyConfig {
            members_only: true,
            read_restricted: true,
            ..cfg.clone()
        },
        &[],
    );
    let m =
        |e: &Event, authed: &[[u8; 32]]| members.check_event(e, ip, authed).err().map(|d| d.reason);
    assert_eq!(m(&ev(1, 1, "x"), &[]), Some(Reason::AuthRequired));
    assert_eq!(m(&ev(1, 1, "x"), &[pk(4)]), Some(Reason::Restricted));
    assert_eq!(
        m(&ev(1, 1, "x"), &[pk(3)]),
        None,
        "a member publishes another's event"
    );
    assert_eq!(m(&ev(3, 1, "x"), &[]), None, "a member's own event");
    assert_eq!(
        members.check_read(ip, &[]).unwrap_err().reason,
        Reason::AuthRequired
    );
    assert_eq!(
        members.check_read(ip, &[pk(4)]).unwrap_err().reason,
        Reason::Restricted
    );
    assert!(members.check_read(ip, &[pk(3)]).is_ok());
}

#[test]
fn blocks_match_by_prefix_in_one_family_and_bad_config_is_named() {
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let cfg = PolicyConfig {
        deny_ips: vec![
            "10.1.0.0/16".into(),
            "::ffff:10.9.0.0/112".into(),
            "2001:db8::/32".into(),
        ],
        ..PolicyConfig::default()
    };
    assert_eq!(cfg.validate(), Ok(()));
    // A NIP-86 entry an older build stored in mapped form.
    let runtime = [(
        "block_ip:::ffff:192.0.2.0/120".to_string(),
        "spam".to_string(),
    )];
    let rules = AccessRules::build(&cfg, &runtime);
    assert!(rules.ip_blocked(ip("10.1.200.3")));
    assert!(!rules.ip_blocked(ip("10.2.0.1")));
    assert!(
        rules.ip_blocked(ip("10.9.1.1")),
        "a mapped block is its IPv4 block"
    );
    assert!(
        rules.ip_blocked(ip("::ffff:10.1.0.1")),
        "a mapped address too"
    );
    assert!(rules.ip_blocked(ip("2001:db8:1::1")));
    assert!(rules.ip_blocked(ip("192.0.2.7")));
    assert_eq!(
        rules.blocked_ips(),
        [
            ("10.1.0.0/16".to_string(), "config".to_string()),
            ("10.9.0.0/16".to_string(), "config".to_string()),
            ("2001:db8::/32".to_string(), "config".to_string()),
            ("192.0.2.0/24".to_string(), "spam".to_string()),
        ]
    );
    let bad = |entry: &str| {
        PolicyConfig {
            deny_ips: vec![entry.into()],
            ..PolicyConfig::default()
        }
        .validate()
        .unwrap_err()
    };
    assert_eq!(
        bad("nope"),
        "policy.deny_ips: \"nope\" is not an address or CIDR"
    );
    assert_eq!(
        bad("10.0.0.1/33"),
        "policy.deny_ips: \"10.0.0.1/33\" is not an address or CIDR"
    );
    let mapped = bad("::ffff:10.0.0.0/80");
    assert!(
        mapped.starts_with("policy.deny_ips: \"::ffff:10.0.0.0/80\": ")
            && mapped.contains("write the IPv4 block"),
        "{mapped}"
    );
}
