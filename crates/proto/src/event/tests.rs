use super::*;

const SK: [u8; 32] = [7u8; 32];

/// `ev` with one hex digit of its signature changed.
fn forged_sig(ev: &Event) -> Event {
    let sig = hex32::encode(&ev.sig);
    let mut bad = sig.clone().into_bytes();
    bad[10] = if bad[10] == b'0' { b'1' } else { b'0' };
    Event::parse(&ev.raw().replace(&sig, std::str::from_utf8(&bad).unwrap())).unwrap()
}

#[test]
fn signed_event_verifies_and_round_trips() {
    let ev = Event::sign(
        &SK,
        1_700_000_000,
        1,
        vec![vec!["t".into(), "x".into()]],
        "hi\n\"there\"",
    );
    ev.verify().unwrap();
    let back = Event::parse(ev.raw()).unwrap();
    assert_eq!(back, ev);
    back.verify().unwrap();
}

#[test]
fn tampered_content_fails_id_check() {
    let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "hello");
    let raw = ev.raw().replace("hello", "hellp");
    assert_eq!(
        Event::parse(&raw).unwrap().verify(),
        Err(EventError::IdMismatch)
    );
}

#[test]
fn bad_signature_is_refused() {
    let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "hello");
    assert_eq!(forged_sig(&ev).verify(), Err(EventError::BadSignature));
}

#[test]
fn verify_cached_agrees_with_verify() {
    let mut keys = PubkeyCache::new(2);
    let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "hello");
    for _ in 0..3 {
        ev.verify_cached(&mut keys).unwrap();
    }
    assert_eq!(
        forged_sig(&ev).verify_cached(&mut keys),
        Err(EventError::BadSignature)
    );
    let tampered = Event::parse(&ev.raw().replace("hello", "hellp")).unwrap();
    assert_eq!(
        tampered.verify_cached(&mut keys),
        Err(EventError::IdMismatch)
    );
    // x = 5 is not on the curve: the key itself is refused, and cached so.
    let mut off_curve = [0u8; 32];
    off_curve[31] = 5;
    assert!(keys.get(&off_curve).is_none());
    assert!(keys.get(&off_curve).is_none());
    // Bounded: a third key starts the cache over.
    assert!(keys.get(&public_key_of(&[9u8; 32])).is_some());
    assert!(keys.keys.len() <= 2);
    ev.verify_cached(&mut keys).unwrap();
}

#[test]
fn the_key_cache_holds_capacity_keys_then_starts_over() {
    let mut keys = PubkeyCache::new(3);
    let pks = [1u8, 2, 3, 4].map(|b| public_key_of(&[b; 32]));
    for pk in &pks[..3] {
        assert_eq!(keys.get(pk).map(|k| k.to_byte_array()), Some(*pk));
    }
    assert_eq!(keys.keys.len(), 3, "three authors fit a cache of three");
    assert!(keys.get(&pks[0]).is_some());
    assert_eq!(keys.keys.len(), 3, "a known author is a hit");
    assert_eq!(keys.get(&pks[3]).map(|k| k.to_byte_array()), Some(pks[3]));
    assert_eq!(keys.keys.len(), 1, "a fourth starts the cache over");
}

/// What a client reads after `invalid: ` when its EVENT holds no object.
#[test]
fn an_event_that_is_not_an_object_is_refused_saying_an_object_was_expected() {
    assert_eq!(
        Event::parse("[]"),
        Err(EventError::Malformed(
            "invalid type: sequence, expected an event object".into()
        ))
    );
}

#[test]
fn canonical_escapes_only_the_seven() {
    let mut out = Vec::new();
    write_json_string(&mut out, "a\u{1}b\u{8}\u{c}\n\r\t\"\\/é", Escapes::Nip01);
    assert_eq!(out, "\"a\u{1}b\\b\\f\\n\\r\\t\\\"\\\\/é\"".as_bytes());
}

/// What `write_json_string` writes, a character at a time.
fn escaped_one_by_one(s: &str, escapes: Escapes) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' && escapes == Escapes::AllControls => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

proptest::proptest! {
    /// Word at a time or not, every string is written as it would be a
    /// character at a time: escapes at any offset, in runs, at the ends,
    /// beside multi-byte characters.
    #[test]
    fn strings_are_written_as_one_character_at_a_time(
        s in "[a-z\u{0}-\u{1f}\"\\\\é€😀 ]{0,40}"
    ) {
        for escapes in [Escapes::Nip01, Escapes::AllControls] {
            let mut out = Vec::new();
            write_json_string(&mut out, &s, escapes);
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), escaped_one_by_one(&s, escapes));
        }
        let mut out = Vec::new();
        write_json_string(&mut out, &s, Escapes::AllControls);
        proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
    }
}

#[test]
fn control_characters_verify_either_way() {
    // Signed the NIP-01 way (raw control character in the hash input).
    let ev = Event::sign(
        &SK,
        1_700_000_000,
        1,
        vec![vec!["t".into(), "a\u{1f}".into()]],
        "x\u{1}y",
    );
    ev.verify().unwrap();
    // Signed the JSON.stringify way: hash over \u0001 escapes.
    let pubkey = public_key_of(&SK);
    let tags = vec![vec!["t".to_string(), "a\u{1f}".to_string()]];
    let alt = canonical_json_as(
        &pubkey,
        1_700_000_000,
        1,
        &tags,
        "x\u{1}y",
        Escapes::AllControls,
    );
    assert!(String::from_utf8_lossy(&alt).contains("x\\u0001y"));
    let id: [u8; 32] = Sha256::digest(&alt).into();
    let keypair = secp256k1::Keypair::from_secret_bytes(SK).unwrap();
    let sig = schnorr::sign_no_aux_rand(&id, &keypair).to_byte_array();
    let other = Event {
        id,
        sig,
        ..ev.clone()
    };
    other.verify().unwrap();
    // Without such characters only the NIP-01 form counts.
    let plain = Event::sign(&SK, 1_700_000_000, 1, vec![], "plain");
    let bad = Event {
        id: [9; 32],
        ..plain
    };
    assert_eq!(bad.verify(), Err(EventError::IdMismatch));
}

/// `ev` with its id and signature over the JSON.stringify form (other
/// control characters written as `\u00XX`).
fn signed_all_controls(tags: Vec<Vec<String>>, content: &str) -> Event {
    let ev = Event::sign(&SK, 1_700_000_000, 1, tags, content);
    let alt = canonical_json_as(
        &ev.pubkey,
        ev.created_at,
        ev.kind,
        &ev.tags,
        &ev.content,
        Escapes::AllControls,
    );
    let id: [u8; 32] = Sha256::digest(&alt).into();
    assert_ne!(id, ev.id, "the two forms must differ");
    let keypair = secp256k1::Keypair::from_secret_bytes(SK).unwrap();
    let sig = schnorr::sign_no_aux_rand(&id, &keypair).to_byte_array();
    Event { id, sig, ..ev }
}

#[test]
fn a_control_character_in_the_content_alone_or_a_tag_alone_verifies_either_way() {
    // Nothing but the control character: no other byte to lean on.
    signed_all_controls(vec![], "\u{1}").verify().unwrap();
    signed_all_controls(vec![], "x\u{1f}y").verify().unwrap();
    signed_all_controls(vec![vec!["t".into(), "\u{7}".into()]], "")
        .verify()
        .unwrap();
    signed_all_controls(vec![vec!["\u{1b}".into()]], "plain")
        .verify()
        .unwrap();
}

/// A mismatched id is hashed a second way only when the text holds a
/// control character the two camps of serializers write differently:
/// spaces, printable text and the seven NIP-01 escapes do not count,
/// so a flood of bad ids costs one hash each.
#[test]
fn only_other_control_characters_ask_for_the_second_id_form() {
    let ev = |tags: Vec<Vec<String>>, content: &str| Event::sign(&SK, 1, 1, tags, content);
    let ordinary = "a b\n\r\t\u{8}\u{c}\"\\/\u{7f}é";
    assert!(!ev(vec![], ordinary).has_other_controls());
    assert!(!ev(vec![vec![" ".into(), ordinary.into()]], ordinary).has_other_controls());
    assert!(ev(vec![], "\u{0}").has_other_controls());
    assert!(ev(vec![], "\u{1f}").has_other_controls());
    assert!(ev(vec![vec!["t".into(), "\u{1}".into()]], "x").has_other_controls());
}

#[test]
fn uppercase_hex_is_refused() {
    let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "x");
    let raw = ev.raw().replace(&ev.id_hex(), &ev.id_hex().to_uppercase());
    assert_eq!(Event::parse(&raw), Err(EventError::BadIdHex));
}

#[test]
fn structural_errors() {
    let ev = Event::sign(&SK, 1_700_000_000, 1, vec![], "x");
    let v: serde_json::Value = serde_json::from_str(ev.raw()).unwrap();
    let with = |k: &str, val: serde_json::Value| {
        let mut v = v.clone();
        v[k] = val;
        Event::parse(&v.to_string())
    };
    assert_eq!(
        with("kind", 70000.into()),
        Err(EventError::KindRange(70000))
    );
    assert!(matches!(
        with("kind", (-1).into()),
        Err(EventError::Malformed(_))
    ));
    assert!(matches!(
        with("created_at", 1.5.into()),
        Err(EventError::Malformed(_))
    ));
    assert!(matches!(
        with("tags", serde_json::json!([[1]])),
        Err(EventError::Malformed(_))
    ));
    assert!(matches!(
        with("tags", serde_json::json!(["a"])),
        Err(EventError::Malformed(_))
    ));
    assert!(matches!(Event::parse("[]"), Err(EventError::Malformed(_))));
}

#[test]
fn limits_and_expiration() {
    let now = 1_700_000_000;
    let lim = Limits::default();
    let future = Event::sign(&SK, now + 901, 1, vec![], "x");
    assert!(matches!(
        future.check_limits(&lim, now),
        Err(EventError::TooNew { .. })
    ));
    let ok = Event::sign(&SK, now + 900, 1, vec![], "x");
    ok.check_limits(&lim, now).unwrap();
    let expired = Event::sign(
        &SK,
        now - 10,
        1,
        vec![vec!["expiration".into(), (now - 1).to_string()]],
        "x",
    );
    assert_eq!(expired.check_limits(&lim, now), Err(EventError::Expired));
    let live = Event::sign(
        &SK,
        now - 10,
        1,
        vec![vec!["expiration".into(), (now + 60).to_string()]],
        "x",
    );
    live.check_limits(&lim, now).unwrap();
}

/// Each limit admits its value and refuses one more: tags and content
/// bytes at the maximum, created_at exactly at either edge of the window.
#[test]
fn limits_are_inclusive_at_their_edges() {
    let now = 1_700_000_000;
    let lim = Limits {
        max_event_tags: 2,
        max_content_length: 5,
        created_at_max_ahead_secs: 900,
        created_at_max_age_secs: 3600,
    };
    let ev = |created_at: u64, tags: usize, content: &str| {
        let tag = vec!["t".to_string(), "x".to_string()];
        Event::sign(&SK, created_at, 1, vec![tag; tags], content)
    };
    ev(now, 2, "abcde").check_limits(&lim, now).unwrap();
    assert_eq!(
        ev(now, 3, "").check_limits(&lim, now),
        Err(EventError::TooManyTags { count: 3, max: 2 })
    );
    // Bytes, not characters: "abcé" is 4 characters, 5 bytes.
    ev(now, 0, "abcé").check_limits(&lim, now).unwrap();
    assert_eq!(
        ev(now, 0, "abcdé").check_limits(&lim, now),
        Err(EventError::ContentTooLong { len: 6, max: 5 })
    );
    ev(now + 900, 0, "").check_limits(&lim, now).unwrap();
    assert_eq!(
        ev(now + 901, 0, "").check_limits(&lim, now),
        Err(EventError::TooNew {
            created_at: now + 901,
            max_ahead_secs: 900
        })
    );
    ev(now - 3600, 0, "").check_limits(&lim, now).unwrap();
    assert_eq!(
        ev(now - 3601, 0, "").check_limits(&lim, now),
        Err(EventError::TooOld {
            created_at: now - 3601,
            max_age_secs: 3600
        })
    );
    // 0: no lower limit at all.
    let no_age = Limits {
        created_at_max_age_secs: 0,
        ..lim
    };
    ev(0, 0, "").check_limits(&no_age, now).unwrap();
}

/// NIP-40: an event whose expiration is now has expired.
#[test]
fn an_expiration_of_exactly_now_has_passed() {
    let now = 1_700_000_000;
    let expiring = |at: u64| {
        let tags = vec![vec!["expiration".into(), at.to_string()]];
        Event::sign(&SK, now - 10, 1, tags, "x")
    };
    let lim = Limits::default();
    assert_eq!(
        expiring(now).check_limits(&lim, now),
        Err(EventError::Expired)
    );
    expiring(now + 1).check_limits(&lim, now).unwrap();
}

/// The store keys an addressable event by its `d` tag's value; without
/// one (or with a `d` tag that has no value) the key is the empty string.
#[test]
fn the_d_tag_is_the_first_d_value_or_empty() {
    let ev = |tags: Vec<Vec<&str>>| {
        let tags = tags
            .into_iter()
            .map(|t| t.into_iter().map(str::to_owned).collect())
            .collect();
        Event::sign(&SK, 1, 30023, tags, "")
    };
    assert_eq!(
        ev(vec![vec!["d", "slot"], vec!["d", "other"]]).d_tag(),
        "slot"
    );
    assert_eq!(ev(vec![vec!["d"], vec!["d", "late"]]).d_tag(), "late");
    assert_eq!(ev(vec![vec!["t", "slot"]]).d_tag(), "");
    assert_eq!(ev(vec![vec!["d"]]).d_tag(), "");
}

/// Only single-letter names (either case) with a value are indexed:
/// `expiration` must not answer a `#e` filter, nor `1` a filter at all.
#[test]
fn only_single_letter_tags_with_a_value_are_indexed() {
    let tags = [
        vec!["e", "aa"],
        vec!["expiration", "123"],
        vec!["1", "one"],
        vec!["", "nameless"],
        vec!["t"],
        vec!["E", "bb", "extra"],
        vec!["-"],
    ]
    .map(|t| t.into_iter().map(str::to_owned).collect())
    .to_vec();
    let ev = Event::sign(&SK, 1, 1, tags, "");
    let indexed: Vec<(u8, &str)> = ev.indexed_tags().collect();
    assert_eq!(indexed, vec![(b'e', "aa"), (b'E', "bb")]);
}

#[test]
fn supersedes_prefers_newer_then_lower_id() {
    let ev = Event::sign(&SK, 100, 0, vec![], "x");
    assert!(ev.supersedes(99, &[0u8; 32]));
    assert!(!ev.supersedes(101, &[0xff; 32]));
    assert!(ev.supersedes(100, &[0xff; 32]));
    assert!(!ev.supersedes(100, &[0x00; 32]));
}

/// The same event sent again is a duplicate, not a replacement.
#[test]
fn an_event_does_not_supersede_itself() {
    let ev = Event::sign(&SK, 100, 0, vec![], "x");
    assert!(!ev.supersedes(ev.created_at, &ev.id));
}

#[test]
fn try_public_key_of_gives_the_bip340_key_and_refuses_non_scalars() {
    // BIP-340 test vector 0: secret key 3.
    let mut three = [0u8; 32];
    three[31] = 3;
    assert_eq!(
        try_public_key_of(&three)
            .map(|k| hex32::encode(&k))
            .as_deref(),
        Some("f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9")
    );
    assert_eq!(
        try_public_key_of(&SK),
        Some(Event::sign(&SK, 1, 1, vec![], "").pubkey)
    );
    assert_eq!(try_public_key_of(&[0; 32]), None);
    let order: [u8; 32] =
        hex32::decode("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141").unwrap();
    assert_eq!(try_public_key_of(&order), None);
}
