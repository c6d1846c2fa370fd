//! NIP-50 search: the query string of a filter's `search` field, the text
//! an event is searched by, and the one tokeniser both go through.
//!
//! The full-text index (`crates/search`) tokenises with [`words`] too, so
//! [`crate::Filter::matches`] (live fan-out, the store's final check) and the
//! index agree on what "contains the words" means: lowercase Unicode
//! words, split at every character that is not alphanumeric, words longer
//! than [`MAX_WORD_BYTES`] dropped.

use serde_json::Value;

use crate::Event;

/// Longest word indexed or searched, in bytes (longer runs are base64,
/// hashes and the like: noise for a word search, and large terms).
pub const MAX_WORD_BYTES: usize = 40;

/// Most words one search may ask for; the rest are ignored (a bound on the
/// postings one query walks).
pub const MAX_SEARCH_WORDS: usize = 16;

/// Longest `search` string accepted, in bytes.
pub const MAX_SEARCH_BYTES: usize = 1024;

/// The kind of long-form posts (NIP-23), searched by title and summary too.
pub const LONG_FORM: u16 = 30023;

/// A parsed NIP-50 `search` value: the words every match contains, and the
/// `key:value` extensions this relay supports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    /// Lowercase words, deduplicated, in the order given; at most
    /// [`MAX_SEARCH_WORDS`]. Empty: no word condition.
    pub words: Vec<String>,
    /// `language:xx`: only events whose language is known to be `xx`
    /// (an ISO-639-1 code, lowercase).
    pub language: Option<String>,
}

impl Search {
    /// Splits a `search` value into words and extensions. A whitespace
    /// separated item `key:value` whose key is lowercase ASCII letters is an
    /// extension: `language:xx` is kept, `include:spam` is a no-op (this
    /// relay filters no spam from search), others are ignored as NIP-50
    /// asks. Everything else is words.
    pub fn parse(text: &str) -> Search {
        let mut s = Search::default();
        for item in text.split_whitespace() {
            if let Some((key, value)) = item.split_once(':')
                && !key.is_empty()
                && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            {
                if key == "language" && !value.is_empty() {
                    s.language = Some(value.to_lowercase());
                }
                continue;
            }
            for (_, w) in words(item) {
                if s.words.len() < MAX_SEARCH_WORDS && !s.words.contains(&w) {
                    s.words.push(w);
                }
            }
        }
        s
    }

    /// Whether `ev` matches: its searchable text contains every word and,
    /// with `language:`, its language is the one asked for.
    pub fn matches(&self, ev: &Event) -> bool {
        if let Some(lang) = &self.language
            && language(ev).as_deref() != Some(lang.as_str())
        {
            return false;
        }
        if self.words.is_empty() {
            return true;
        }
        let text = searchable_text(ev, usize::MAX);
        let mut found = vec![false; self.words.len()];
        for (_, w) in words(&text) {
            if let Some(i) = self.words.iter().position(|x| *x == w) {
                found[i] = true;
            }
        }
        found.iter().all(|f| *f)
    }
}

/// The words of `text`: maximal runs of alphanumeric characters, each with
/// its byte offset, lowercased; runs longer than [`MAX_WORD_BYTES`] are
/// skipped.
pub fn words(text: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    let mut start = None;
    let mut chars = text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')));
    std::iter::from_fn(move || {
        for (i, c) in chars.by_ref() {
            match (start, c.is_alphanumeric()) {
                (None, true) => start = Some(i),
                (Some(s), false) => {
                    start = None;
                    if i - s <= MAX_WORD_BYTES {
                        return Some((s, text[s..i].to_lowercase()));
                    }
                }
                _ => {}
            }
        }
        None
    })
}

/// The text `ev` is searched by, cut to at most `max_bytes` (at a
/// character boundary): a profile's (kind 0) `name`, `display_name` and
/// `about`; a long-form post's `title` and `summary` tags and content;
/// any other event's content.
pub fn searchable_text(ev: &Event, max_bytes: usize) -> String {
    let mut text = match ev.kind {
        0 => profile_text(&ev.content),
        LONG_FORM => {
            let mut t = String::new();
            for tag in &ev.tags {
                if let [name, value, ..] = tag.as_slice()
                    && (name == "title" || name == "summary")
                {
                    t.push_str(value);
                    t.push('\n');
                }
            }
            t.push_str(&ev.content);
            t
        }
        _ => ev.content.clone(),
    };
    if text.len() > max_bytes {
        let mut cut = max_bytes;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

fn profile_text(content: &str) -> String {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(content) else {
        return String::new();
    };
    let mut t = String::new();
    for key in ["name", "display_name", "about"] {
        if let Some(Value::String(v)) = m.get(key) {
            t.push_str(v);
            t.push('\n');
        }
    }
    t
}

/// The event's language when it says so (NIP-32: an `l` tag in the
/// `ISO-639-1` namespace), lowercase.
pub fn language(ev: &Event) -> Option<String> {
    ev.tags.iter().find_map(|t| match t.as_slice() {
        [l, code, ns, ..] if l == "l" && ns == "ISO-639-1" && !code.is_empty() => {
            Some(code.to_lowercase())
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
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
        assert_eq!(w("Ünïcode ÉTÉ 東京 x2"), ["ünïcode", "été", "東京", "x2"]);
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
}
