//! Reading the repository's Rust sources as tokens, for the static checks
//! of `invariants.rs` and `architecture.rs`: what grep cannot tell apart
//! (a string literal from a comment, `"bl\x6fcked: "` from `"blocked: "`,
//! a turbofish from a plain call, test code from product code) a lexer can.
//!
//! The lexer knows Rust's comments (line, block, nested), string literals
//! (escapes, line continuations, raw strings with any number of `#`, byte
//! and C strings), char literals and lifetimes; everything else is an
//! identifier, a number or one punctuation character.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).to_path_buf()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    /// A string literal's value, escapes decoded.
    Str(String),
    Ident(String),
    Punct(char),
    /// A number, char literal or lifetime.
    Other,
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
}

/// A comment's text (without its `//` or `/* */`) and first line.
#[derive(Clone, Debug)]
pub struct Comment {
    pub text: String,
    pub line: usize,
}

#[derive(Default, Debug)]
pub struct Lexed {
    pub tokens: Vec<Token>,
    pub comments: Vec<Comment>,
}

/// Splits Rust source into tokens and comments. Malformed input (an
/// unterminated string or comment) ends the scan where it breaks.
pub fn lex(src: &str) -> Lexed {
    let c: Vec<char> = src.chars().collect();
    let mut out = Lexed::default();
    let mut i = 0;
    let mut line = 1;
    let count_lines = |from: usize, to: usize, c: &[char]| -> usize {
        c[from..to.min(c.len())]
            .iter()
            .filter(|&&ch| ch == '\n')
            .count()
    };
    while i < c.len() {
        let ch = c[i];
        let start = i;
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            let end = c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p);
            out.comments.push(Comment {
                text: c[i + 2..end].iter().collect(),
                line,
            });
            i = end;
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            let mut j = i;
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            let end = j.min(c.len());
            let body_end = end.saturating_sub(2).max(i + 2);
            out.comments.push(Comment {
                text: c[i + 2..body_end.min(c.len())].iter().collect(),
                line,
            });
            line += count_lines(i, end, &c);
            i = end;
        } else if let Some((value, end)) = string_literal(&c, i) {
            out.tokens.push(Token {
                tok: Tok::Str(value),
                line,
            });
            line += count_lines(i, end, &c);
            i = end;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime/label.
            if c.get(i + 1) == Some(&'\\') {
                // Past the escaped character: '\'' ends at the next quote.
                let mut j = i + 3;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
            out.tokens.push(Token {
                tok: Tok::Other,
                line,
            });
        } else if ch.is_alphabetic() || ch == '_' {
            if ch == 'r' && c.get(i + 1) == Some(&'#') {
                // A raw identifier: r#match.
                i += 2;
            }
            let from = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.tokens.push(Token {
                tok: Tok::Ident(c[from..i].iter().collect()),
                line,
            });
        } else if ch.is_ascii_digit() {
            i += 1;
            while i < c.len()
                && (c[i].is_alphanumeric()
                    || c[i] == '_'
                    || (c[i] == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit)))
            {
                i += 1;
            }
            out.tokens.push(Token {
                tok: Tok::Other,
                line,
            });
        } else {
            out.tokens.push(Token {
                tok: Tok::Punct(ch),
                line,
            });
            i += 1;
        }
        debug_assert!(i > start);
    }
    out
}

/// A string literal starting at `i` (`"…"`, `r#"…"#`, `b"…"`, `br"…"`,
/// `c"…"`, `cr"…"`): its decoded value and the index after it.
fn string_literal(c: &[char], i: usize) -> Option<(String, usize)> {
    let mut j = i;
    // An identifier character before the prefix means this is the middle
    // of an identifier (`attr"` never occurs, but `bar` must not read as
    // `b` + `ar`).
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    if matches!(c.get(j), Some('b' | 'c')) {
        j += 1;
    }
    let raw = c.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    if raw {
        while c.get(j) == Some(&'#') {
            hashes += 1;
            j += 1;
        }
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    let mut value = String::new();
    if raw {
        loop {
            let ch = *c.get(j)?;
            if ch == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                return Some((value, j + 1 + hashes));
            }
            value.push(ch);
            j += 1;
        }
    }
    loop {
        let ch = *c.get(j)?;
        j += 1;
        match ch {
            '"' => return Some((value, j)),
            '\\' => {
                let e = *c.get(j)?;
                j += 1;
                match e {
                    'n' => value.push('\n'),
                    'r' => value.push('\r'),
                    't' => value.push('\t'),
                    '0' => value.push('\0'),
                    '\\' | '\'' | '"' => value.push(e),
                    'x' => {
                        let hex: String = c.get(j..j + 2)?.iter().collect();
                        value.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                        j += 2;
                    }
                    'u' => {
                        // \u{XXXX}
                        let close = j + c[j..].iter().position(|&x| x == '}')?;
                        let hex: String = c[j + 1..close].iter().filter(|&&x| x != '_').collect();
                        value.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                        j = close + 1;
                    }
                    '\n' | '\r' => {
                        // A line continuation: the newline and the next
                        // line's leading whitespace are not in the value.
                        while c.get(j).is_some_and(|x| x.is_whitespace()) {
                            j += 1;
                        }
                    }
                    other => value.push(other),
                }
            }
            other => value.push(other),
        }
    }
}

/// The tokens without test code: an item under `#[cfg(test)]`, `#[test]`
/// or `#[tokio::test]` (a `mod tests { … }`, a test function, an `impl`)
/// is dropped with its attributes, up to its closing brace or semicolon.
pub fn without_tests(tokens: &[Token]) -> Vec<Token> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if let Some(end) = attribute_end(tokens, i)
            && is_test_attribute(&tokens[i + 2..end - 1])
        {
            i = item_end(tokens, end);
            continue;
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// Where [`without_tests`] cuts: the token range of each test item, from
/// its test attribute to its closing brace or semicolon.
pub fn test_items(tokens: &[Token]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if let Some(end) = attribute_end(tokens, i)
            && is_test_attribute(&tokens[i + 2..end - 1])
        {
            let stop = item_end(tokens, end);
            out.push(i..stop);
            i = stop;
            continue;
        }
        i += 1;
    }
    out
}

/// `#[…]` or `#![…]` starting at `i`: the index after its `]`.
fn attribute_end(t: &[Token], i: usize) -> Option<usize> {
    if t.get(i)?.tok != Tok::Punct('#') {
        return None;
    }
    let mut j = i + 1;
    if t.get(j)?.tok == Tok::Punct('!') {
        j += 1;
    }
    if t.get(j)?.tok != Tok::Punct('[') {
        return None;
    }
    let mut depth = 0;
    while j < t.len() {
        match t[j].tok {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

/// The inside of an attribute, `[` `]` included at either end: is it
/// `test`, `tokio::test`, or a `cfg(…)` that needs `test`?
fn is_test_attribute(inner: &[Token]) -> bool {
    let idents: Vec<&str> = inner
        .iter()
        .filter_map(|t| match &t.tok {
            Tok::Ident(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    match idents.as_slice() {
        ["test"] | ["tokio", "test", ..] => true,
        ["cfg", "test", ..] => true,
        ["cfg", "all", rest @ ..] => rest.contains(&"test"),
        _ => false,
    }
}

/// The index after the item that starts at `i` (further attributes, then
/// up to a `;` at depth 0 or the `}` closing its first brace).
fn item_end(t: &[Token], mut i: usize) -> usize {
    while let Some(end) = attribute_end(t, i) {
        i = end;
    }
    let mut depth = 0i32;
    while i < t.len() {
        match t[i].tok {
            Tok::Punct('{') | Tok::Punct('(') | Tok::Punct('[') => depth += 1,
            Tok::Punct('}') | Tok::Punct(')') | Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 && t[i].tok == Tok::Punct('}') {
                    return i + 1;
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Every product source file (`crates/*/src`, not the load generator,
/// not `tests/` or `benches/` folders), as (path from the root, text).
pub fn product_files() -> Vec<(String, String)> {
    let root = root();
    let mut out = Vec::new();
    let mut stack = vec![root.join("crates")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            let rel = p.strip_prefix(&root).unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                let name = p.file_name().unwrap().to_string_lossy();
                if !(rel == "crates/bench" || name == "tests" || name == "benches") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|e| e == "rs")
                && rel.contains("/src/")
                && !rel.ends_with("/tests.rs")
            {
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// The product code of one file: its tokens without test code.
pub fn product_tokens(text: &str) -> Vec<Token> {
    without_tests(&lex(text).tokens)
}

fn ident(t: &Token) -> Option<&str> {
    match &t.tok {
        Tok::Ident(s) => Some(s),
        _ => None,
    }
}

fn is_punct(t: Option<&Token>, p: char) -> bool {
    t.is_some_and(|t| t.tok == Tok::Punct(p))
}

/// Every string a file's code can produce from literals alone, with the
/// line it starts on: each literal; each `concat!` of literals; and each
/// format string (`format!`, `write!`, `println!`, … any macro whose first
/// argument is a literal) with its `{}`, `{0}` and `{name}` holes filled
/// from literal arguments and from the file's `const`/`static`/`let`
/// bindings of a literal (a hole filled by anything else stays empty).
pub fn literal_strings(tokens: &[Token]) -> Vec<(String, usize)> {
    let bindings = literal_bindings(tokens);
    let mut out: Vec<(String, usize)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if let Tok::Str(s) = &t.tok {
            out.push((s.clone(), t.line));
        }
        let (Some(name), true, true) = (
            ident(t),
            is_punct(tokens.get(i + 1), '!'),
            tokens
                .get(i + 2)
                .is_some_and(|t| matches!(t.tok, Tok::Punct('(' | '[' | '{'))),
        ) else {
            continue;
        };
        let args = macro_args(tokens, i + 2);
        let value = |arg: &[Token]| -> Option<String> {
            match arg {
                [
                    Token {
                        tok: Tok::Str(s), ..
                    },
                ] => Some(s.clone()),
                [
                    Token {
                        tok: Tok::Ident(n), ..
                    },
                ] => bindings.get(n).cloned(),
                [
                    Token {
                        tok: Tok::Punct('&'),
                        ..
                    },
                    rest @ ..,
                ] if rest.len() == 1 => match &rest[0].tok {
                    Tok::Str(s) => Some(s.clone()),
                    Tok::Ident(n) => bindings.get(n).cloned(),
                    _ => None,
                },
                _ => None,
            }
        };
        if name == "concat" {
            let joined: String = args.iter().map(|a| value(a).unwrap_or_default()).collect();
            out.push((joined, t.line));
            continue;
        }
        // A format string is the first literal argument (`write!(f, "…")`
        // has the writer first).
        let Some(fmt_at) = args
            .iter()
            .position(|a| {
                matches!(
                    a.as_slice(),
                    [Token {
                        tok: Tok::Str(_),
                        ..
                    }]
                )
            })
            .filter(|&p| p <= 1)
        else {
            continue;
        };
        let Tok::Str(fmt) = &args[fmt_at][0].tok else {
            continue;
        };
        let rest = &args[fmt_at + 1..];
        let mut positional = Vec::new();
        let mut named = HashMap::new();
        for a in rest {
            match a.as_slice() {
                [
                    Token {
                        tok: Tok::Ident(n), ..
                    },
                    Token {
                        tok: Tok::Punct('='),
                        ..
                    },
                    v @ ..,
                ] if !is_punct(v.first(), '=') => {
                    named.insert(n.clone(), value(v));
                }
                _ => positional.push(value(a)),
            }
        }
        out.push((fill_holes(fmt, &positional, &named, &bindings), t.line));
    }
    out
}

/// The top-level comma-separated arguments of the macro call whose opening
/// delimiter is at `open`.
fn macro_args(tokens: &[Token], open: usize) -> Vec<Vec<Token>> {
    let mut args = vec![Vec::new()];
    let mut depth = 0;
    for t in &tokens[open..] {
        match t.tok {
            Tok::Punct('(' | '[' | '{') => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(',') if depth == 1 => {
                args.push(Vec::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = args.last_mut() {
            last.push(t.clone());
        }
    }
    args.retain(|a| !a.is_empty());
    args
}

/// `NAME = "literal"` bindings: `const`, `static` and `let` (with or
/// without a type) whose value is one string literal.
fn literal_bindings(tokens: &[Token]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if !matches!(ident(t), Some("const" | "static" | "let")) {
            continue;
        }
        let mut j = i + 1;
        if ident(&tokens[j.min(tokens.len() - 1)]) == Some("mut") {
            j += 1;
        }
        let Some(name) = tokens.get(j).and_then(ident) else {
            continue;
        };
        // Up to the `=` of this binding, then one literal and `;`.
        let Some(eq) = tokens[j..]
            .iter()
            .take(12)
            .position(|t| t.tok == Tok::Punct('='))
        else {
            continue;
        };
        if let (Some(Tok::Str(s)), true) = (
            tokens.get(j + eq + 1).map(|t| &t.tok),
            is_punct(tokens.get(j + eq + 2), ';'),
        ) {
            out.insert(name.to_string(), s.clone());
        }
    }
    out
}

/// A format string with its holes filled (`{{`/`}}` are braces).
fn fill_holes(
    fmt: &str,
    positional: &[Option<String>],
    named: &HashMap<String, Option<String>>,
    bindings: &HashMap<String, String>,
) -> String {
    let mut out = String::new();
    let mut next = 0;
    let mut chars = fmt.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut hole = String::new();
                for h in chars.by_ref() {
                    if h == '}' {
                        break;
                    }
                    hole.push(h);
                }
                let arg = hole.split(':').next().unwrap_or("").trim();
                let filled = if arg.is_empty() {
                    next += 1;
                    positional.get(next - 1).cloned().flatten()
                } else if let Ok(n) = arg.parse::<usize>() {
                    positional.get(n).cloned().flatten()
                } else {
                    named
                        .get(arg)
                        .cloned()
                        .flatten()
                        .or_else(|| bindings.get(arg).cloned())
                };
                out.push_str(&filled.unwrap_or_default());
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether `text` holds a NIP-01 message with one of `prefixes`: the
/// prefix and its colon at the start (after blanks) or right after a
/// quote (a message inside a JSON frame).
pub fn prefix_in<'p>(text: &str, prefixes: &'p [String]) -> Option<&'p str> {
    let starts = std::iter::once(text.trim_start()).chain(
        text.match_indices(['"', '\''])
            .map(|(at, q)| text[at + q.len()..].trim_start()),
    );
    for s in starts {
        for p in prefixes {
            if s.strip_prefix(p.as_str())
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
            {
                return Some(p);
            }
        }
    }
    None
}
