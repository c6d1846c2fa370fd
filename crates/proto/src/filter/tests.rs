use super::*;
use serde_json::json;

fn ev(kind: u16, created_at: u64, tags: Vec<Vec<&str>>) -> Event {
    let tags = tags
        .into_iter()
        .map(|t| t.into_iter().map(str::to_owned).collect())
        .collect();
    Event::sign(&[3u8; 32], created_at, kind, tags, "c")
}

fn f(v: Value) -> Filter {
    Filter::from_value(&v).unwrap()
}

#[test]
fn empty_filter_matches_everything() {
    assert!(f(json!({})).matches(&ev(1, 10, vec![])));
}

#[test]
fn fields_are_anded() {
    let e = ev(1, 10, vec![vec!["t", "nostr"], vec!["e", "x"]]);
    assert!(f(json!({"kinds":[1,2],"#t":["nostr"],"since":10,"until":10})).matches(&e));
    assert!(!f(json!({"kinds":[2]})).matches(&e));
    assert!(!f(json!({"#t":["other"]})).matches(&e));
    assert!(!f(json!({"since":11})).matches(&e));
    assert!(!f(json!({"until":9})).matches(&e));
    assert!(
        f(json!({"authors":[e.pubkey.iter().map(|b| format!("{b:02x}")).collect::<String>()]}))
            .matches(&e)
    );
    assert!(f(json!({"ids":[e.id_hex()]})).matches(&e));
    assert!(!f(json!({"ids":["00".repeat(32)]})).matches(&e));
}

#[test]
fn multi_letter_tags_and_bad_values_are_refused() {
    assert!(matches!(
        Filter::from_value(&json!({"#emoji":["x"]})),
        Err(FilterError::UnsupportedTag(_))
    ));
    assert!(matches!(
        Filter::from_value(&json!({"kinds":[70000]})),
        Err(FilterError::BadKind)
    ));
    assert!(matches!(
        Filter::from_value(&json!({"ids":["ABC"]})),
        Err(FilterError::BadHex { .. })
    ));
    assert!(matches!(
        Filter::from_value(&json!({"limit":-1})),
        Err(FilterError::BadInteger("limit"))
    ));
    assert!(matches!(
        Filter::from_value(&json!([])),
        Err(FilterError::NotAnObject)
    ));
    assert!(matches!(
        Filter::from_value(&json!({"kinds":1})),
        Err(FilterError::NotAnArray(_))
    ));
}

#[test]
fn empty_lists_match_nothing() {
    assert!(f(json!({"kinds":[]})).is_empty_match());
    assert!(f(json!({"since":5,"until":4})).is_empty_match());
    assert!(!f(json!({"since":5,"until":5})).is_empty_match());
}

/// Each empty list alone makes the filter match nothing (the store and
/// the live index skip it); non-empty lists do not.
#[test]
fn any_one_empty_list_matches_nothing() {
    for empty in [
        json!({"ids":[]}),
        json!({"authors":[]}),
        json!({"kinds":[]}),
        json!({"#e":[]}),
        json!({"#p":["x"],"#t":[]}),
    ] {
        assert!(f(empty.clone()).is_empty_match(), "{empty}");
        assert!(!f(empty).matches(&ev(1, 10, vec![vec!["p", "x"], vec!["t", "y"]])));
    }
    let full = json!({
        "ids":["00".repeat(32)],
        "authors":["11".repeat(32)],
        "kinds":[1],
        "#e":["x"],
    });
    assert!(!f(full).is_empty_match());
    assert!(!f(json!({})).is_empty_match());
}

/// Fields this relay does not implement are ignored, not refused as
/// tag filters.
#[test]
fn unknown_fields_are_ignored() {
    let with_x = f(json!({"kinds":[1],"x":5,"nips":[50]}));
    assert_eq!(with_x, f(json!({"kinds":[1]})));
    assert!(with_x.matches(&ev(1, 10, vec![])));
}

/// NIP-50: `search` is parsed (extensions split out) and matching
/// honours it with every other field.
#[test]
fn search_is_parsed_and_matched() {
    let s = f(json!({"search":"Best nostr include:spam language:en foo:bar","kinds":[1]}));
    let search = s.search.clone().unwrap();
    assert_eq!(search.words, ["best", "nostr"]);
    assert_eq!(search.language.as_deref(), Some("en"));
    let lang = vec![vec!["l", "en", "ISO-639-1"]];
    let hit = Event::sign(
        &[3u8; 32],
        10,
        1,
        vec![vec!["l".into(), "en".into(), "ISO-639-1".into()]],
        "the best of Nostr",
    );
    assert!(s.matches(&hit));
    assert!(
        !s.matches(&ev(1, 10, lang.clone())),
        "content lacks the words"
    );
    let other_kind = Event::sign(&[3u8; 32], 10, 2, hit.tags.clone(), "the best of Nostr");
    assert!(!s.matches(&other_kind));
    let plain = f(json!({"search":"best nostr"}));
    assert!(!plain.matches(&ev(1, 10, vec![])), "content is `c`");
    assert!(f(json!({"search":"c"})).matches(&ev(1, 10, vec![])));
    assert!(f(json!({"search":""})).matches(&ev(1, 10, vec![])));
    assert_eq!(
        Filter::from_value(&json!({"search":5})),
        Err(FilterError::BadSearch {
            max: MAX_SEARCH_BYTES
        })
    );
    let long = "a ".repeat(MAX_SEARCH_BYTES);
    assert!(Filter::from_value(&json!({ "search": long })).is_err());
}

#[test]
fn a_field_takes_up_to_max_values_and_refuses_one_more() {
    let kinds = |n: u16| json!({ "kinds": (0..n).collect::<Vec<u16>>() });
    let at_max = u16::try_from(MAX_VALUES_PER_FIELD).unwrap();
    assert_eq!(
        f(kinds(at_max)).kinds.map(|k| k.len()),
        Some(MAX_VALUES_PER_FIELD)
    );
    assert_eq!(
        Filter::from_value(&kinds(at_max + 1)),
        Err(FilterError::TooManyValues {
            field: "kinds".into(),
            count: MAX_VALUES_PER_FIELD + 1,
            max: MAX_VALUES_PER_FIELD,
        })
    );
    let tag_values = |n: usize| json!({ "#t": vec!["x"; n] });
    f(tag_values(MAX_VALUES_PER_FIELD));
    assert!(matches!(
        Filter::from_value(&tag_values(MAX_VALUES_PER_FIELD + 1)),
        Err(FilterError::TooManyValues { ref field, .. }) if field == "#t"
    ));
}
