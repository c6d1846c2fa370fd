use super::*;

const SK: [u8; 32] = [7; 32];
const OTHER: [u8; 32] = [9; 32];

fn auth_event(kind: u16, created_at: u64, challenge: &str, relay: &str) -> Event {
    Event::sign(
        &SK,
        created_at,
        kind,
        vec![
            vec!["relay".into(), relay.into()],
            vec!["challenge".into(), challenge.into()],
        ],
        "",
    )
}

fn check<'a>(urls: &'a [String], host: Option<&'a str>) -> AuthCheck<'a> {
    AuthCheck {
        challenge: "abc",
        relay_urls: urls,
        host,
        now: 1_000_000,
        max_skew_secs: 600,
    }
}

#[test]
fn a_good_auth_event_passes_and_each_fault_is_named() {
    let urls = vec!["wss://relay.example.com".to_string()];
    let c = check(&urls, None);
    let ok = auth_event(AUTH_KIND, 1_000_100, "abc", "wss://relay.example.com/");
    assert_eq!(check_auth_event(&ok, &c), Ok(()));
    let e = auth_event(1, 1_000_000, "abc", "wss://relay.example.com");
    assert_eq!(check_auth_event(&e, &c), Err(AuthError::WrongKind));
    let e = auth_event(AUTH_KIND, 1_000_000, "abd", "wss://relay.example.com");
    assert_eq!(check_auth_event(&e, &c), Err(AuthError::WrongChallenge));
    let e = auth_event(AUTH_KIND, 1_000_000, "abc", "wss://other.example.com");
    assert_eq!(check_auth_event(&e, &c), Err(AuthError::WrongRelay));
    let e = auth_event(AUTH_KIND, 1_000_601, "abc", "wss://relay.example.com");
    assert_eq!(check_auth_event(&e, &c), Err(AuthError::Stale));
    let e = auth_event(AUTH_KIND, 999_399, "abc", "wss://relay.example.com");
    assert_eq!(check_auth_event(&e, &c), Err(AuthError::Stale));
}

#[test]
fn created_at_exactly_max_skew_away_is_still_fresh() {
    let urls = vec!["wss://relay.example.com".to_string()];
    let c = check(&urls, None);
    for created_at in [1_000_000 - 600, 1_000_000 + 600] {
        let e = auth_event(AUTH_KIND, created_at, "abc", "wss://relay.example.com");
        assert_eq!(check_auth_event(&e, &c), Ok(()), "created_at {created_at}");
    }
    for created_at in [1_000_000 - 601, 1_000_000 + 601] {
        let e = auth_event(AUTH_KIND, created_at, "abc", "wss://relay.example.com");
        assert_eq!(
            check_auth_event(&e, &c),
            Err(AuthError::Stale),
            "created_at {created_at}"
        );
    }
}

#[test]
fn relay_urls_compare_normalised() {
    let urls = vec!["wss://Relay.Example.com:443/".to_string()];
    assert!(relay_matches("wss://relay.example.com", &urls, None));
    assert!(relay_matches("WSS://relay.example.com/", &urls, None));
    assert!(!relay_matches("ws://relay.example.com", &urls, None));
    assert!(!relay_matches("wss://relay.example.com/sub", &urls, None));
    assert!(!relay_matches("relay.example.com", &urls, None));
    // No configured URL: the host the client connected to.
    assert!(relay_matches(
        "ws://127.0.0.1:7777",
        &[],
        Some("127.0.0.1:7777")
    ));
    assert!(relay_matches(
        "wss://relay.example.com",
        &[],
        Some("relay.example.com")
    ));
    assert!(!relay_matches(
        "wss://evil.example.com",
        &[],
        Some("relay.example.com")
    ));
    assert!(relay_matches("ws://[::1]:7777/", &[], Some("[::1]:7777")));
    assert!(relay_matches("wss://anything", &[], None));
}

/// The session reads these to know whether (and as whom) a connection
/// is authenticated: for `auth-required:` answers, the per-connection
/// cap on AUTHs and the pubkey-keyed throttle.
#[test]
fn readers_report_the_authenticated_pubkeys_as_given() {
    let me = crate::event::public_key_of(&SK);
    let them = crate::event::public_key_of(&OTHER);
    assert!(Readers::new(vec![4], vec![]).pubkeys().is_empty());
    assert_eq!(Readers::new(vec![4], vec![me]).pubkeys(), &[me]);
    assert_eq!(Readers::new(vec![], vec![them, me]).pubkeys(), &[them, me]);
}

#[test]
fn protected_is_exactly_a_lone_dash_tag() {
    let ev = |tags: Vec<Vec<String>>| Event::sign(&SK, 1, 1, tags, "");
    assert!(is_protected(&ev(vec![vec!["-".into()]])));
    assert!(!is_protected(&ev(vec![vec!["-".into(), "x".into()]])));
    assert!(!is_protected(&ev(vec![])));
}

#[test]
fn private_messages_go_to_their_parties_only() {
    let me = crate::event::public_key_of(&SK);
    let them = crate::event::public_key_of(&OTHER);
    let to_me = Event::sign(
        &OTHER,
        1,
        4,
        vec![vec!["p".into(), crate::hex32::encode(&me)]],
        "",
    );
    let nobody = Readers::new(vec![4, 1059], vec![]);
    let reader = Readers::new(vec![4, 1059], vec![me]);
    let stranger = Readers::new(vec![4, 1059], vec![[1; 32]]);
    assert!(!nobody.may_read(&to_me));
    assert!(reader.may_read(&to_me));
    assert!(!stranger.may_read(&to_me));
    assert!(
        Readers::new(vec![4], vec![them]).may_read(&to_me),
        "the author"
    );
    assert!(
        Readers::new(vec![], vec![]).may_read(&to_me),
        "nothing private"
    );
    let note = Event::sign(&OTHER, 1, 1, vec![], "");
    assert!(nobody.may_read(&note));
    assert!(nobody.asks_only_private(Some(&[4, 1059])));
    assert!(!nobody.asks_only_private(Some(&[4, 1])));
    assert!(!nobody.asks_only_private(None));
}
