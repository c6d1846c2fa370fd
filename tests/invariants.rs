//! Runtime checks of the invariants ARCHITECTURE.md states, against the
//! real binary over real WebSockets (the static ones are in
//! `architecture.rs`).

use crate::source_scan;
use crate::support;

use std::collections::HashMap;

use serde_json::json;
use support::*;

/// Every EVENT a connection sends gets exactly one OK, whatever answers
/// it: stored, duplicate, ephemeral, invalid id or signature, too far in
/// the future, oversized, refused by the in-flight cap or a per-IP bucket.
/// (The documented exceptions are a connection that ends first: shutdown
/// and slow-consumer disconnects.)
#[tokio::test]
async fn every_event_gets_exactly_one_ok() {
    let relay = Relay::start_with(&[
        ("SLUICE_SERVER__MAX_PENDING_WRITES", "8"),
        ("SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S", "5"),
    ]);
    let mut c = relay.client().await;
    let t = now();
    let mut sent: Vec<String> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    // A burst past the in-flight cap and the per-IP bucket.
    for i in 0..60u64 {
        let e = ev(1, t - 200 + i, 1, &[], &format!("burst {i}"));
        sent.push(e.id_hex());
        texts.push(format!("[\"EVENT\",{}]", e.raw()));
    }
    // The same event twice (a duplicate, or refused with it).
    let dup = ev(2, t - 10, 1, &[], "twice");
    for _ in 0..2 {
        texts.push(format!("[\"EVENT\",{}]", dup.raw()));
    }
    sent.push(dup.id_hex());
    sent.push(dup.id_hex());
    // Ephemeral.
    let eph = ev(3, t, 20001, &[], "ephemeral");
    sent.push(eph.id_hex());
    texts.push(format!("[\"EVENT\",{}]", eph.raw()));
    // Too far in the future.
    let future = ev(4, t + 100_000, 1, &[], "future");
    sent.push(future.id_hex());
    texts.push(format!("[\"EVENT\",{}]", future.raw()));
    // A wrong id and a bad signature.
    let good = ev(5, t - 5, 1, &[], "tampered");
    let mut v: serde_json::Value = serde_json::from_str(good.raw()).unwrap();
    v["content"] = json!("changed after signing");
    sent.push(good.id_hex());
    texts.push(json!(["EVENT", v]).to_string());
    let other = ev(6, t - 5, 1, &[], "resigned");
    let mut v: serde_json::Value = serde_json::from_str(other.raw()).unwrap();
    v["sig"] = json!("00".repeat(64));
    sent.push(other.id_hex());
    texts.push(json!(["EVENT", v]).to_string());
    // Oversized: refused from its head without parsing the rest.
    let big = ev(7, t - 5, 1, &[], &"x".repeat(200 * 1024));
    sent.push(big.id_hex());
    texts.push(format!("[\"EVENT\",{}]", big.raw()));

    for text in &texts {
        c.send_text(text).await;
    }
    let mut expected: HashMap<String, usize> = HashMap::new();
    for id in &sent {
        *expected.entry(id.clone()).or_default() += 1;
    }
    let mut got: HashMap<String, usize> = HashMap::new();
    for _ in 0..sent.len() {
        let m = c.expect("OK").await;
        *got.entry(m[1].as_str().unwrap().to_string()).or_default() += 1;
    }
    // A barrier: anything still owed would come before this EOSE's reply
    // is long gone; nothing more may arrive.
    c.send(json!(["REQ", "barrier", {"limit": 0}])).await;
    loop {
        let m = c.recv().await;
        assert_ne!(m[0], "OK", "an extra OK: {m}");
        if m[0] == "EOSE" {
            break;
        }
    }
    assert_eq!(got, expected, "one OK per EVENT sent");
    // The burst really hit the limits this test is about.
    let refused = relay
        .metric("sluice_events_refused_total", &["reason=\"rate-limited\""])
        .await;
    assert!(refused > 0.0, "the burst was never refused");
}

// ------------------------------------------------------------- static checks

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Every product source file (`crates/*/src`, not the load generator),
/// as (path relative to the root, code lines without comments).
fn product_sources() -> Vec<(String, Vec<String>)> {
    let root = std::path::Path::new(ROOT);
    let mut out = Vec::new();
    let mut stack = vec![root.join("crates")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                let name = p.file_name().unwrap().to_string_lossy();
                if !(rel == "crates/bench" || name == "tests" || name == "benches") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|e| e == "rs")
                && rel.contains("/src/")
                && !rel.ends_with("/tests.rs")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                // Unit test modules at the end of a file are not product code.
                let code = text.split("#[cfg(test)]\nmod ").next().unwrap_or("");
                let lines = code
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .map(str::to_string)
                    .collect();
                out.push((rel, lines));
            }
        }
    }
    out.sort();
    out
}

fn files_containing(pattern: &str) -> Vec<String> {
    product_sources()
        .into_iter()
        .filter(|(_, lines)| lines.iter().any(|l| l.contains(pattern)))
        .map(|(path, _)| path)
        .collect()
}

/// Only the writer thread writes to the store: the store's write entry
/// points are called from the writer's files alone
/// (`crates/engine/src/writer/`; `serve` and `import` both go through
/// it), and retention's from the writer's `Retainer`
/// (`crates/engine/src/retention/retainer.rs`, run by the writer thread
/// between batches).
#[test]
fn only_the_writer_thread_writes() {
    let writer = "crates/engine/src/writer/";
    let retainer = "crates/engine/src/retention/retainer.rs";
    for (call, by) in [
        (".write_batch(", None),
        (".write_batch_ruled(", Some(writer)),
        (".purge_expired(", Some(writer)),
        (".set_policy(", Some(writer)),
        (".purge_author(", Some(writer)),
        (".purge_event(", Some(writer)),
        (".purge_events(", Some(writer)),
        (".purge_vanished(", Some(writer)),
        (".prune_oldest(", Some(retainer)),
        (".write_batch_evicting(", Some(retainer)),
        (".prune_author_excess(", Some(retainer)),
    ] {
        let callers = files_containing(call);
        match by {
            None => assert!(callers.is_empty(), "{call} is called by {callers:?}"),
            Some(place) => assert!(
                !callers.is_empty() && callers.iter().all(|f| f.starts_with(place)),
                "{call} must be called by the engine's writer thread only ({place}), not {callers:?}"
            ),
        }
    }
}

/// One kind of lock: product code takes `parking_lot`'s locks, which do
/// not poison, so no code handles poisoning (no `PoisonError`, no lock
/// helper around one) and no std lock is named, however it is imported.
#[test]
fn locks_are_parking_lot() {
    let hits: Vec<String> = source_scan::product_files()
        .into_iter()
        .flat_map(|(path, text)| std_locks(&path, &text))
        .collect();
    assert!(
        hits.is_empty(),
        "std locks in product code:\n{}",
        hits.join("\n")
    );
    assert_eq!(
        std_locks(
            "a.rs",
            "use std::sync::{Arc,\n Mutex};\nfn f() { let _ = PoisonError::into_inner; }"
        )
        .len(),
        2
    );
    assert_eq!(
        std_locks("a.rs", "type L = std::sync::RwLock<u8>;").len(),
        1
    );
    assert!(
        std_locks(
            "a.rs",
            "use std::sync::Arc; use parking_lot::Mutex; // std::sync::Mutex"
        )
        .is_empty()
    );
}

/// The places in one file's product code that name a std lock or its poison.
fn std_locks(path: &str, text: &str) -> Vec<String> {
    use source_scan::Tok;
    const LOCKS: [&str; 4] = ["Mutex", "RwLock", "Condvar", "PoisonError"];
    let t = source_scan::product_tokens(text);
    let id = |i: usize, name: &str| t.get(i).is_some_and(|x| x.tok == Tok::Ident(name.into()));
    let punct = |i: usize, c: char| t.get(i).is_some_and(|x| x.tok == Tok::Punct(c));
    let sep = |i: usize| punct(i, ':') && punct(i + 1, ':');
    let mut hits = Vec::new();
    for i in 0..t.len() {
        if id(i, "PoisonError") {
            hits.push(format!("{path}:{}: PoisonError", t[i].line));
        }
        if !(id(i, "std") && sep(i + 1) && id(i + 3, "sync") && sep(i + 4)) {
            continue;
        }
        let mut j = i + 6;
        let group = punct(j, '{');
        loop {
            if let Some(Tok::Ident(name)) = t.get(j).map(|x| &x.tok)
                && LOCKS.contains(&name.as_str())
                && name != "PoisonError"
            {
                hits.push(format!("{path}:{}: std::sync::{name}", t[j].line));
            }
            if !group || punct(j, '}') || j >= t.len() {
                break;
            }
            j += 1;
        }
    }
    hits
}

/// Every channel is bounded: no unbounded constructor anywhere in the
/// product, however it is named: `unbounded`/`unbounded_channel` (tokio,
/// flume, crossbeam), the unbounded halves' types, any `channel` called
/// without a capacity (std's `mpsc::channel()`, with or without a
/// turbofish), and std's `channel` imported under another name. Read by
/// the lexer, so a comment does not count and formatting does not hide a
/// call; clippy.toml's `disallowed-methods` checks the same by type.
#[test]
fn every_channel_is_bounded() {
    let hits: Vec<String> = source_scan::product_files()
        .into_iter()
        .flat_map(|(path, text)| unbounded_channels(&path, &text))
        .collect();
    assert!(hits.is_empty(), "unbounded channels:\n{}", hits.join("\n"));
}

/// The places in one file's product code that make an unbounded channel.
fn unbounded_channels(path: &str, text: &str) -> Vec<String> {
    use source_scan::Tok;
    let t = source_scan::product_tokens(text);
    let is = |i: usize, tok: Tok| t.get(i).is_some_and(|x| x.tok == tok);
    let id = |i: usize, name: &str| is(i, Tok::Ident(name.into()));
    let path_sep = |i: usize| is(i, Tok::Punct(':')) && is(i + 1, Tok::Punct(':'));
    let mut hits = Vec::new();
    for (i, tok) in t.iter().enumerate() {
        let Tok::Ident(name) = &tok.tok else {
            continue;
        };
        let hit = match name.as_str() {
            "unbounded" | "unbounded_channel" | "UnboundedSender" | "UnboundedReceiver" => true,
            "channel" => {
                // A call without a capacity: `channel()`, `channel::<T>()`.
                let mut j = i + 1;
                if path_sep(j) && is(j + 2, Tok::Punct('<')) {
                    let mut depth = 0;
                    j += 2;
                    while j < t.len() {
                        match t[j].tok {
                            Tok::Punct('<') => depth += 1,
                            Tok::Punct('>') => depth -= 1,
                            _ => {}
                        }
                        j += 1;
                        if depth == 0 {
                            break;
                        }
                    }
                }
                // (A oneshot holds one value: bounded.)
                let oneshot = i >= 3 && id(i - 3, "oneshot") && path_sep(i - 2);
                let empty_call = !oneshot && is(j, Tok::Punct('(')) && is(j + 1, Tok::Punct(')'));
                // Or std's, named in a path or a `use` (`std::sync::mpsc::channel`,
                // `std::sync::mpsc::{channel, …}`).
                let mut k = i;
                while k > 0 && !matches!(t[k - 1].tok, Tok::Punct(';' | '(')) && i - k < 16 {
                    k -= 1;
                }
                let std_path = (k..i).any(|m| {
                    id(m, "std")
                        && path_sep(m + 1)
                        && id(m + 3, "sync")
                        && path_sep(m + 4)
                        && id(m + 6, "mpsc")
                });
                empty_call || std_path
            }
            _ => false,
        };
        if hit {
            hits.push(format!("{path}:{}: {name}", tok.line));
        }
    }
    hits
}

/// The channel check above can fail, and does not fail on bounded ones.
#[test]
fn the_channel_scan_finds_every_spelling_of_an_unbounded_channel() {
    let caught = [
        "fn f() { let (tx, rx) = std::sync::mpsc::channel(); }",
        "fn f() { let (tx, rx) = std::sync::mpsc::channel::<()>(); }",
        "fn f() { let (tx, rx) = mpsc::channel::<Vec<u8>>(); }",
        "fn f() { let (tx, rx) = mpsc::channel\n    ::<()>\n    (\n    ); }",
        "use std::sync::mpsc::channel as make;",
        "use std::sync::mpsc::{Receiver, channel};",
        "fn f() { let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u8>(); }",
        "fn f() { let (tx, rx) = flume::unbounded(); }",
        "struct S { tx: tokio::sync::mpsc::UnboundedSender<u8> }",
    ];
    for src in caught {
        assert!(!unbounded_channels("x.rs", src).is_empty(), "missed: {src}");
    }
    let clean = [
        "fn f() { let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1); }",
        "fn f() { let (tx, rx) = tokio::sync::mpsc::channel(8); }",
        "fn f() { let (tx, rx) = mpsc::channel::<u8>(cap); }",
        "fn f() { let (tx, rx) = tokio::sync::oneshot::channel::<u8>(); }",
        "use tokio::sync::mpsc::{Sender, channel};",
        "// std::sync::mpsc::channel() in a comment\nfn f() {}",
        "fn f() { let s = \"mpsc::channel()\"; }",
        "#[cfg(test)] mod tests { fn t() { std::sync::mpsc::channel::<()>(); } }",
    ];
    for src in clean {
        assert_eq!(
            unbounded_channels("x.rs", src),
            Vec::<String>::new(),
            "{src}"
        );
    }
}

/// Every LMDB transaction opens in one place, which runs the thread check
/// (`Store::begin_read`/`begin_write` in crates/store/src/lib.rs): heed's
/// `read_txn()`/`write_txn()` (no arguments, unlike the store's own
/// `write_txn(|…| …)` helper) are called there once each and nowhere else.
#[test]
fn every_transaction_opens_in_the_stores_one_place() {
    use source_scan::Tok;
    let mut hits = Vec::new();
    for (path, text) in source_scan::product_files() {
        let t = source_scan::product_tokens(&text);
        for i in 1..t.len().saturating_sub(2) {
            if let Tok::Ident(name) = &t[i].tok
                && (name == "read_txn" || name == "write_txn")
                && t[i - 1].tok == Tok::Punct('.')
                && t[i + 1].tok == Tok::Punct('(')
                && t[i + 2].tok == Tok::Punct(')')
            {
                hits.push(format!("{path} {name}"));
            }
        }
    }
    assert_eq!(
        hits,
        [
            "crates/store/src/lib.rs read_txn",
            "crates/store/src/lib.rs write_txn"
        ]
    );
}

/// clippy reads only the nearest clippy.toml, so a crate's own file must
/// repeat the workspace's lists; the store's leaves out only its own write
/// methods (its tests and benches call them).
#[test]
fn crate_clippy_files_repeat_the_workspace_lists() {
    let paths = |file: &str| -> Vec<String> {
        let text = std::fs::read_to_string(source_scan::root().join(file)).unwrap();
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| l.split("path = \"").nth(1)?.split('"').next())
            .map(str::to_string)
            .collect()
    };
    let workspace = paths("clippy.toml");
    assert!(workspace.len() >= 10, "{workspace:?}");
    for (file, may_omit) in [
        ("crates/store/clippy.toml", "sluice_store::Store::"),
        ("crates/throttle/clippy.toml", "-"),
    ] {
        let own = paths(file);
        for p in &workspace {
            assert!(
                own.contains(p) || p.starts_with(may_omit),
                "{file} must repeat {p}"
            );
        }
    }
    assert!(paths("crates/throttle/clippy.toml").contains(&"std::time::Instant::now".to_string()));
}

// ------------------------------------------------------- refusal vocabulary

/// The modules that may spell a NIP-01 prefix: proto's definitions and the
/// session's refusal vocabulary.
const VOCABULARY: [&str; 2] = [
    "crates/proto/src/reason.rs",
    "crates/server/src/session/refusal.rs",
];

/// Every prefix a relay's answer may start with: each one proto's `Reason`
/// spells (read from `Reason::as_str`), and `mute`, which NIP-01 defines
/// and Sluice never sends.
fn reason_prefixes() -> Vec<String> {
    let text = std::fs::read_to_string(source_scan::root().join(VOCABULARY[0])).unwrap();
    let tokens = source_scan::product_tokens(&text);
    let ident = |i: usize, name: &str| {
        tokens.get(i).map(|t| &t.tok) == Some(&source_scan::Tok::Ident(name.to_string()))
    };
    let start = (0..tokens.len())
        .find(|&i| ident(i, "fn") && ident(i + 1, "as_str"))
        .expect("Reason::as_str in reason.rs");
    let open = start
        + tokens[start..]
            .iter()
            .position(|t| t.tok == source_scan::Tok::Punct('{'))
            .unwrap();
    let mut depth = 0;
    let mut prefixes = vec!["mute".to_string()];
    for t in &tokens[open..] {
        match &t.tok {
            source_scan::Tok::Punct('{') => depth += 1,
            source_scan::Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            source_scan::Tok::Str(s) => prefixes.push(s.clone()),
            _ => {}
        }
    }
    for known in [
        "blocked",
        "rate-limited",
        "invalid",
        "pow",
        "duplicate",
        "error",
    ] {
        assert!(
            prefixes.iter().any(|p| p == known),
            "{known} in {prefixes:?}"
        );
    }
    prefixes
}

/// The hits of the prefix scan in one file's product code.
fn prefix_hits(path: &str, text: &str, prefixes: &[String]) -> Vec<String> {
    let mut hits: Vec<String> = source_scan::literal_strings(&source_scan::product_tokens(text))
        .into_iter()
        .filter_map(|(s, line)| {
            source_scan::prefix_in(&s, prefixes).map(|p| format!("{path}:{line}: `{p}:` in {s:?}"))
        })
        .collect();
    // A format string is seen as written and with its holes filled.
    hits.dedup_by(|b, a| a.split(" in ").next() == b.split(" in ").next());
    hits
}

/// One refusal vocabulary: no product code outside it writes a NIP-01
/// prefix (`blocked:`, `rate-limited:`, … and NIP-77's `closed:`) in a
/// string, however the string is spelled or assembled (escapes, raw
/// strings, `concat!`, format holes filled by literals or constants).
/// Handlers name a case of `session::refusal`; its prefix, wording and
/// metrics are chosen there. Comments and test code are not product code.
#[test]
fn only_the_refusal_vocabulary_writes_nip01_prefixes() {
    let prefixes = reason_prefixes();
    let mut hits = Vec::new();
    for (path, text) in source_scan::product_files() {
        if !VOCABULARY.contains(&path.as_str()) {
            hits.extend(prefix_hits(&path, &text, &prefixes));
        }
    }
    assert!(
        hits.is_empty(),
        "NIP-01 prefixes outside the refusal vocabulary (name a case of \
         crates/server/src/session/refusal.rs instead):\n{}",
        hits.join("\n")
    );
}

/// The server names proto's `Reason` only in its refusal module: a handler
/// that picked a prefix by its enum would dodge the literal scan above.
#[test]
fn only_the_refusal_module_names_reason_in_the_server() {
    let hits: Vec<String> = source_scan::product_files()
        .into_iter()
        .filter(|(path, _)| path.starts_with("crates/server/src/") && path != VOCABULARY[1])
        .filter(|(_, text)| {
            source_scan::product_tokens(text)
                .iter()
                .any(|t| t.tok == source_scan::Tok::Ident("Reason".into()))
        })
        .map(|(path, _)| path)
        .collect();
    assert!(hits.is_empty(), "Reason named in {hits:?}");
}

/// The scan above can fail: it finds a prefix however the literal is
/// written, and only in product code.
#[test]
fn the_prefix_scan_sees_through_spelling_and_skips_comments_and_tests() {
    let prefixes = reason_prefixes();
    let caught = [
        r#"fn f() { send("blocked: no") }"#,
        r#"fn f() { send("bl\x6fcked: no") }"#,
        r#"fn f() { send("\u{72}ate-limited: slow down") }"#,
        r##"fn f() { send(r#"invalid: x"#) }"##,
        r#"fn f() { send(concat!("inva", "lid", ": x")) }"#,
        r#"fn f() { send(format!("{}: {}", "pow", x)) }"#,
        r#"fn f() { send(format!("{1}: {0}", x, "duplicate")) }"#,
        r#"const P: &str = "restricted"; fn f() { send(format!("{P}: {x}")) }"#,
        r#"fn f() { let p = "auth-required"; send(format!("{p}: x")) }"#,
        r#"fn f() { send(format!("{p}: x", p = "error")) }"#,
        r#"fn f() { write!(out, "{}: x", "mute") }"#,
        r#"fn f() { send("[\"OK\",\"id\",false,\"duplicate: x\"]") }"#,
        "fn f() { send(\"blo\\\n        cked: x\") }",
        r#"fn f() { send("closed: no such session") }"#,
        r#"#[cfg(not(test))] fn f() { send("blocked: x") }"#,
    ];
    for src in caught {
        assert!(
            !prefix_hits("x.rs", src, &prefixes).is_empty(),
            "missed in {src}"
        );
    }
    let clean = [
        "// blocked: a comment\nfn f() {}",
        "/* rate-limited: a /* nested */ comment */ fn f() {}",
        "/// `invalid: x` in a doc\nfn f() {}",
        r#"fn f() { err("store error: x") }"#,
        r#"fn f() { eprintln!("sluice: error: {e:#}") }"#,
        r#"fn f() { label("invalid") }"#,
        r#"fn f() { format!("{prefix}: {x}") }"#,
        r#"fn f() { let c = '"'; s("x") }"#,
        r#"#[cfg(test)] mod tests { fn t() { s("blocked: x") } }"#,
        r#"#[test] fn t() { s("blocked: x"); }"#,
        r#"#[tokio::test] async fn t() { s("blocked: x"); }"#,
        r#"#[cfg(test)] use x::{a, b}; fn f() {}"#,
    ];
    for src in clean {
        assert_eq!(prefix_hits("x.rs", src, &prefixes), Vec::<String>::new());
    }
}
