use super::*;

fn ev(kind: u16, tags: Vec<Vec<&str>>, content: &str) -> Event {
    let tags = tags
        .into_iter()
        .map(|t| t.into_iter().map(str::to_owned).collect())
        .collect();
    Event::sign(&[3u8; 32], 10, kind, tags, content)
}

fn w(text: &str) -> Vec<String> {
    words(text).map(|(_, w)| w).collect()
}

#[test]
fn words_are_lowercase_unicode_runs() {
    assert_eq!(w("Hello, World!"), ["hello", "world"]);
    assert_eq!(
        w("  Bitcoin's #Nostr-relay "),
        ["bitcoin", "s", "nostr", "relay"]
    );
    assert_eq!(
        w("Ünïcode ÉTÉ 東京 x2"),
        ["ünïcode", "été", "東", "東京", "京", "x2"]
    );
    assert_eq!(w(""), Vec::<String>::new());
    assert_eq!(w("end"), ["end"]);
    let long = "a".repeat(MAX_WORD_BYTES + 1);
    let fits = "b".repeat(MAX_WORD_BYTES);
    assert_eq!(w(&format!("{long} {fits}")), [fits]);
    // Offsets point at the word in the original text.
    let offsets: Vec<usize> = words("ab  cd").map(|(o, _)| o).collect();
    assert_eq!(offsets, [0, 4]);
}

#[test]
fn cjk_runs_are_indexed_by_characters_and_pairs_and_searched_by_pairs() {
    assert_eq!(
        w("東京都に住む"),
        [
            "東", "東京", "京", "京都", "都", "都に", "に", "に住", "住", "住む", "む"
        ]
    );
    // Offsets of the characters and pairs, in bytes of the text.
    let at: Vec<(usize, String)> = words("a 東京").collect();
    assert_eq!(
        at,
        [
            (0, "a".to_owned()),
            (2, "東".to_owned()),
            (2, "東京".to_owned()),
            (5, "京".to_owned())
        ]
    );
    // Offsets inside a run that mixes scripts.
    let at: Vec<usize> = words("x 東京ab猫").map(|(o, _)| o).collect();
    assert_eq!(at, [0, 2, 2, 5, 8, 10]);
    // A run mixing scripts: each stretch on its own; a lone character
    // is itself; other words keep the length bound.
    assert_eq!(
        w("東京2024年ABC"),
        ["東", "東京", "京", "2024", "年", "abc"]
    );
    let long = "é".repeat(MAX_WORD_BYTES);
    assert_eq!(w(&format!("猫{long}")), ["猫"]);
    // Long CJK runs are not dropped as over-long words.
    assert_eq!(w(&"字".repeat(30)).len(), 30 + 29);
    assert_eq!(Search::parse("東京").words, ["東京"]);
    assert_eq!(Search::parse("東京都").words, ["東京", "京都"]);
    assert_eq!(Search::parse("猫 cat").words, ["猫", "cat"]);
    assert_eq!(Search::parse("ラーメン").words, ["ラー", "ーメ", "メン"]);
    let e = ev(1, vec![], "黒猫が好き。東京都に住む");
    for hit in ["猫", "好き", "東京", "東京都", "黒猫", "住む 東京"] {
        assert!(Search::parse(hit).matches(&e), "{hit}");
    }
    for miss in ["犬", "京東", "大阪", "猫好"] {
        assert!(!Search::parse(miss).matches(&e), "{miss}");
    }
    let ko = ev(1, vec![], "서울에서 만나요");
    assert!(Search::parse("서울").matches(&ko));
    assert!(Search::parse("만나요").matches(&ko));
    assert!(!Search::parse("부산").matches(&ko));
    assert!(is_cjk('漢') && is_cjk('か') && is_cjk('カ') && is_cjk('한'));
    assert!(is_cjk('\u{20000}') && is_cjk('ｶ'));
    assert!(!is_cjk('a') && !is_cjk('é') && !is_cjk('ж') && !is_cjk('。'));
}

#[test]
fn extensions_are_split_out() {
    let s = Search::parse("Best NOSTR apps include:spam language:EN nsfw:false best");
    assert_eq!(s.words, ["best", "nostr", "apps"]);
    assert_eq!(s.language.as_deref(), Some("en"));
    let s = Search::parse("include:spam");
    assert!(s.words.is_empty() && s.language.is_none());
    // A colon in a word that is not `key:value` keeps the words.
    assert_eq!(
        Search::parse("12:30 Rust:fun").words,
        ["12", "30", "rust", "fun"]
    );
    let many: String = (0..40).map(|i| format!("w{i} ")).collect();
    assert_eq!(Search::parse(&many).words.len(), MAX_SEARCH_WORDS);
}

#[test]
fn matching_needs_every_word() {
    let e = ev(1, vec![], "The quick brown fox");
    assert!(Search::parse("QUICK fox").matches(&e));
    assert!(!Search::parse("quick wolf").matches(&e));
    assert!(!Search::parse("qui").matches(&e), "whole words only");
    assert!(Search::parse("").matches(&e));
}

#[test]
fn profiles_and_long_form_are_searched_by_their_fields() {
    let p = ev(
        0,
        vec![],
        r#"{"name":"alice","display_name":"Alice W","about":"rust dev","website":"zzz"}"#,
    );
    assert!(Search::parse("alice rust").matches(&p));
    assert!(!Search::parse("zzz").matches(&p));
    assert!(!Search::parse("name").matches(&p), "keys are not text");
    let bad = ev(0, vec![], "not json alice");
    assert!(!Search::parse("alice").matches(&bad));
    let lf = ev(
        LONG_FORM,
        vec![
            vec!["title", "Gardening"],
            vec!["summary", "tomatoes"],
            vec!["t", "zz"],
        ],
        "body text",
    );
    assert!(Search::parse("gardening tomatoes body").matches(&lf));
    assert!(!Search::parse("zz").matches(&lf));
    let note = ev(1, vec![vec!["title", "hidden"]], "shown");
    assert!(!Search::parse("hidden").matches(&note));
}

#[test]
fn language_matches_only_when_known() {
    let en = ev(
        1,
        vec![vec!["L", "ISO-639-1"], vec!["l", "en", "ISO-639-1"]],
        "hi",
    );
    let none = ev(1, vec![], "hi");
    assert!(Search::parse("hi language:en").matches(&en));
    assert!(!Search::parse("hi language:de").matches(&en));
    assert!(!Search::parse("hi language:en").matches(&none));
    assert_eq!(language(&en).as_deref(), Some("en"));
}

#[test]
fn text_is_cut_at_a_char_boundary() {
    let e = ev(1, vec![], "héllo wörld");
    assert_eq!(searchable_text(&e, 2), "h");
    assert_eq!(searchable_text(&e, 3), "hé");
    assert_eq!(searchable_text(&e, 1000), "héllo wörld");
}
