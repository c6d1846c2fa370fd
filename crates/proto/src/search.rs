//! NIP-50 search: the query string of a filter's `search` field, the text
//! an event is searched by, and the one tokeniser both go through.
//!
//! The full-text index (`crates/search`) tokenises with [`words`] too, so
//! [`crate::Filter::matches`] (live fan-out, the store's final check) and the
//! index agree on what "contains the words" means: lowercase Unicode
//! words, split at every character that is not alphanumeric, words longer
//! than [`MAX_WORD_BYTES`] dropped. Scripts written without spaces between
//! words (Han, Hiragana, Katakana, Hangul: [`is_cjk`]) are split into
//! overlapping pairs of characters, as Lucene's CJK bigrams do: a text is
//! indexed by every character and every pair, a search asks for the pairs
//! of what it names (a single character: that character), so a search
//! for `東京` finds `東京都` and a search for `猫` finds `黒猫が`.

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
            tokens(item, Side::Query, &mut |_, w: &str| {
                if s.words.len() < MAX_SEARCH_WORDS && !s.words.iter().any(|x| x == w) {
                    s.words.push(w.to_owned());
                }
            });
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
        for_each_word(&text, |_, w| {
            if let Some(i) = self.words.iter().position(|x| x == w) {
                found[i] = true;
            }
        });
        found.iter().all(|f| *f)
    }
}

/// Version of what [`words`] makes of a text: an index made by another
/// version is rebuilt (`crates/search`). 2: CJK pairs.
pub const TOKENS_VERSION: u32 = 2;

/// The words of `text` as the index and a filter's check see them:
/// maximal runs of alphanumeric characters, each with its byte offset,
/// lowercased; runs longer than [`MAX_WORD_BYTES`] are skipped. A run of
/// [`is_cjk`] characters gives each character and each overlapping pair.
pub fn words(text: &str) -> impl Iterator<Item = (usize, String)> + use<> {
    let mut out = Vec::new();
    for_each_word(text, |offset, w| out.push((offset, w.to_owned())));
    out.into_iter()
}

/// [`words`] without an allocation per word: calls `f(offset, word)` for
/// each, the word lent from a buffer reused for the next.
pub fn for_each_word(text: &str, mut f: impl FnMut(usize, &str)) {
    tokens(text, Side::Text, &mut f);
}

/// Whether `c` belongs to a script written without spaces between words
/// (Han, Hiragana, Katakana, Hangul), whose runs are split into pairs.
pub fn is_cjk(c: char) -> bool {
    matches!(
        c as u32,
        0x1100..=0x11FF // Hangul Jamo
            | 0x3040..=0x30FF // Hiragana, Katakana
            | 0x3130..=0x318F // Hangul compatibility Jamo
            | 0x31F0..=0x31FF // Katakana phonetic extensions
            | 0x3400..=0x4DBF // CJK extension A
            | 0x4E00..=0x9FFF // CJK unified ideographs
            | 0xAC00..=0xD7AF // Hangul syllables
            | 0xF900..=0xFAFF // CJK compatibility ideographs
            | 0xFF66..=0xFF9F // halfwidth Katakana
            | 0x20000..=0x3134F // CJK extensions B to G
    )
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// An event's text: every CJK character and every pair.
    Text,
    /// A search: the pairs (a lone character: itself), each of which an
    /// event holding the searched run holds too.
    Query,
}

/// Calls `emit(offset, token)` for each token of `text` on `side`.
fn tokens(text: &str, side: Side, emit: &mut impl FnMut(usize, &str)) {
    let mut scratch = String::new();
    let mut start = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        match (start, c.is_alphanumeric()) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                start = None;
                run(s, &text[s..i], side, &mut scratch, emit);
            }
            _ => {}
        }
    }
}

/// The tokens of one alphanumeric run `r` at byte `at`: its stretches of
/// CJK and of other characters, each on its own. `scratch` holds a
/// lowercased word while it is lent to `emit`.
fn run(at: usize, r: &str, side: Side, scratch: &mut String, emit: &mut impl FnMut(usize, &str)) {
    if r.is_ascii() {
        if r.len() <= MAX_WORD_BYTES {
            if r.bytes().any(|b| b.is_ascii_uppercase()) {
                scratch.clear();
                scratch.push_str(r);
                scratch.make_ascii_lowercase();
                emit(at, scratch);
            } else {
                emit(at, r);
            }
        }
        return;
    }
    let mut from = 0;
    let mut cjk = None;
    for (i, c) in r.char_indices() {
        let this = is_cjk(c);
        if let Some(was) = cjk
            && was != this
        {
            stretch(at + from, &r[from..i], was, side, emit);
            from = i;
        }
        cjk = Some(this);
    }
    if let Some(was) = cjk {
        stretch(at + from, &r[from..], was, side, emit);
    }
}

fn stretch(at: usize, r: &str, cjk: bool, side: Side, emit: &mut impl FnMut(usize, &str)) {
    if cjk {
        pairs(at, r, side, emit);
    } else if r.len() <= MAX_WORD_BYTES {
        // Not `make_ascii_lowercase`: Unicode lowercasing depends on the
        // word (a final sigma), which `str::to_lowercase` knows.
        emit(at, &r.to_lowercase());
    }
}

/// A stretch of CJK characters at byte `at`: on the text side each
/// character and each overlapping pair, on the query side the pairs (a
/// lone character: itself).
fn pairs(at: usize, r: &str, side: Side, emit: &mut impl FnMut(usize, &str)) {
    let chars: Vec<(usize, char)> = r.char_indices().collect();
    if chars.len() == 1 {
        emit(at, r);
        return;
    }
    for (k, &(i, c)) in chars.iter().enumerate() {
        if side == Side::Text {
            emit(at + i, &r[i..i + c.len_utf8()]);
        }
        if let Some(&(j, d)) = chars.get(k + 1) {
            emit(at + i, &r[i..j + d.len_utf8()]);
        }
    }
}

/// The text `ev` is searched by, cut to at most `max_bytes` (at a
/// character boundary): a profile's (kind 0) `name`, `display_name` and
/// `about`; a long-form post's `title` and `summary` tags and content;
/// any other event's content.
pub fn searchable_text(ev: &Event, max_bytes: usize) -> String {
    text_of(ev.kind, &ev.tags, ev.content.clone(), max_bytes)
}

/// [`searchable_text`] of an event's parts.
pub fn text_of(kind: u16, tags: &[Vec<String>], content: String, max_bytes: usize) -> String {
    let mut text = match kind {
        0 => profile_text(&content),
        LONG_FORM => {
            let mut t = String::new();
            for tag in tags {
                if let [name, value, ..] = tag.as_slice()
                    && (name == "title" || name == "summary")
                {
                    t.push_str(value);
                    t.push('\n');
                }
            }
            t.push_str(&content);
            t
        }
        _ => content,
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

/// The parts of a stored event's JSON its searchable text and language
/// come from, parsed alone (no id, pubkey or signature: the index takes
/// those from the store's header of an event checked when stored).
#[derive(Debug, Default, serde::Deserialize)]
pub struct TextParts {
    #[serde(default)]
    pub tags: Vec<Vec<String>>,
    #[serde(default)]
    pub content: String,
}

impl TextParts {
    /// `None` when `raw` is not an event object.
    pub fn parse(raw: &str) -> Option<TextParts> {
        serde_json::from_str(raw).ok()
    }
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
    language_of(&ev.tags)
}

/// [`language`] of an event's tags.
pub fn language_of(tags: &[Vec<String>]) -> Option<String> {
    tags.iter().find_map(|t| match t.as_slice() {
        [l, code, ns, ..] if l == "l" && ns == "ISO-639-1" && !code.is_empty() => {
            Some(code.to_lowercase())
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests;
