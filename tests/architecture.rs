//! Architecture invariants checked by `cargo test`: the dependency
//! direction between crates, which crates may name heed and axum, that
//! every file a comment or doc cites is in the repository, that no crate's
//! files import each other in a circle, and that no product file is over
//! 700 lines.

use crate::source_scan;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use source_scan::{Tok, Token};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// crate directory → internal crates it may depend on (ARCHITECTURE.md, Codemap).
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("proto", &[][..]),
        ("store", &["sluice-proto"][..]),
        ("search", &["sluice-proto", "sluice-store"][..]),
        ("throttle", &[][..]),
        ("ws", &[][..]),
        (
            "engine",
            &[
                "sluice-proto",
                "sluice-store",
                "sluice-search",
                "sluice-throttle",
            ][..],
        ),
        (
            "server",
            &[
                "sluice-proto",
                "sluice-store",
                "sluice-engine",
                "sluice-throttle",
                "sluice-ws",
            ][..],
        ),
        (
            "cluster",
            &[
                "sluice-proto",
                "sluice-store",
                "sluice-engine",
                "sluice-throttle",
            ][..],
        ),
        ("bench", &["sluice-proto"][..]),
        (
            "sluice",
            &[
                "sluice-proto",
                "sluice-store",
                "sluice-search",
                "sluice-throttle",
                "sluice-engine",
                "sluice-server",
                "sluice-cluster",
            ][..],
        ),
    ])
}

fn internal_deps(manifest: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]" || line == "[dev-dependencies]";
            continue;
        }
        if in_deps && line.starts_with("sluice-") {
            deps.push(line.split(['.', ' ', '=']).next().unwrap().to_string());
        }
    }
    deps
}

#[test]
fn crates_depend_only_in_the_allowed_direction() {
    let crates = Path::new(ROOT).join("crates");
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let allowed = allowed();
        let ok = allowed
            .get(name.as_str())
            .unwrap_or_else(|| panic!("crates/{name} is not in the architecture table"));
        for dep in internal_deps(&manifest) {
            assert!(
                ok.contains(&dep.as_str()),
                "crates/{name} must not depend on {dep}"
            );
        }
    }
}

fn sources_naming(word: &str) -> Vec<String> {
    let mut hits = Vec::new();
    let crates = Path::new(ROOT).join("crates");
    let mut stack = vec![crates.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs" || e == "toml")
                // A lint config names heed's methods to forbid them.
                && !p.ends_with("clippy.toml")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                if text.lines().any(|l| {
                    let l = l.trim_start();
                    !l.starts_with("//")
                        && (l.contains(&format!("{word}::"))
                            || l.starts_with(&format!("{word} "))
                            || l.starts_with(&format!("{word}.")))
                }) {
                    let rel = p
                        .strip_prefix(&crates)
                        .unwrap()
                        .to_string_lossy()
                        .to_string();
                    hits.push(rel.split('/').next().unwrap().to_string());
                }
            }
        }
    }
    hits.sort();
    hits.dedup();
    hits
}

#[test]
fn only_the_store_names_heed() {
    assert_eq!(sources_naming("heed"), vec!["store".to_string()]);
}

#[test]
fn only_the_server_names_axum() {
    assert_eq!(sources_naming("axum"), vec!["server".to_string()]);
}

// ------------------------------------------------------------ cited files

/// The repository's top-level folders: a path starting with one is a
/// citation of a file or folder of this repository.
const TOP: [&str; 7] = ["crates", "docs", "tests", "config", "deploy", "fuzz", ".ci"];

/// Extensions of files a comment may cite by a relative path.
const CITED_EXT: [&str; 8] = ["rs", "md", "toml", "sh", "yml", "yaml", "json", "txt"];

/// The path-like citations in a text, as written (with their `#anchor`): a
/// path under one of [`TOP`]; a relative path whose file has one of
/// [`CITED_EXT`]; a Markdown file's bare name; an absolute path to a
/// Markdown file; and a seed document by its number (the word "seed" and
/// three digits), which lives outside the repository. URLs, other
/// absolute paths and placeholders (a component in capitals, such as
/// TARGET) are not citations. In Markdown, a link to a section of the
/// same page (`](#section)`) is one too.
fn citations(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let words: Vec<&str> = text.split_whitespace().collect();
    let bare = |w: &str| {
        w.trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    for (i, word) in words.iter().enumerate() {
        if matches!(bare(word).as_str(), "seed" | "seeds")
            && words.get(i + 1).is_some_and(|n| {
                let n = bare(n);
                n.len() >= 3 && n.starts_with('0') && n[..3].chars().all(|c| c.is_ascii_digit())
            })
        {
            out.push(format!("{} {}", bare(word), bare(words[i + 1])));
        }
        if word.contains("://") || word.contains("www.") {
            continue;
        }
        let path_char = |c: char| c.is_alphanumeric() || "_./#-".contains(c);
        if let Some(at) = word.find("](#") {
            let anchor = word[at + 3..].split(')').next().unwrap_or("");
            out.push(format!("#{anchor}"));
        }
        for piece in word.split(|c: char| !path_char(c)) {
            let piece = piece.trim_end_matches('.');
            let (piece, anchor) = piece.split_once('#').unwrap_or((piece, ""));
            let anchor = anchor.trim_end_matches('.');
            let placeholder = piece
                .split('/')
                .any(|c| c.len() > 1 && c.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_'));
            if piece.is_empty() || piece.contains("...") || placeholder {
                continue;
            }
            let last = piece.rsplit('/').next().unwrap_or("");
            let ext = last.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
            let with_anchor = if anchor.is_empty() {
                piece.to_string()
            } else {
                format!("{piece}#{anchor}")
            };
            if piece.starts_with('/') {
                if ext == "md" {
                    out.push(with_anchor);
                }
                continue;
            }
            let first = piece.split('/').next().unwrap_or("");
            let cited = (piece.contains('/') && TOP.contains(&first))
                || (piece.contains('/') && CITED_EXT.contains(&ext) && !last.starts_with('.'))
                || (!piece.contains('/') && ext == "md" && last.len() > 3);
            if cited {
                out.push(with_anchor);
            }
        }
    }
    out
}

/// Whether `cited` (as written in `file`) names something in the
/// repository: relative to the citing file's folder or any folder above
/// it up to the root, or to `crates/`; and, with an anchor into a Markdown
/// file, one of its headings.
fn cited_exists(root: &Path, file: &Path, cited: &str) -> bool {
    if cited.starts_with("seed") {
        return false;
    }
    let (path, anchor) = cited.split_once('#').unwrap_or((cited, ""));
    let root = root.canonicalize().unwrap();
    let mut bases: Vec<std::path::PathBuf> =
        file.ancestors().skip(1).map(Path::to_path_buf).collect();
    bases.push(root.join("crates"));
    let target = if path.is_empty() {
        Some(file.to_path_buf())
    } else {
        bases.iter().find_map(|base| {
            base.join(path)
                .canonicalize()
                .ok()
                .filter(|p| p.starts_with(&root))
        })
    };
    let Some(target) = target else {
        return false;
    };
    if anchor.is_empty() || target.extension().is_none_or(|e| e != "md") {
        return true;
    }
    let text = std::fs::read_to_string(&target).unwrap_or_default();
    headings(&text).iter().any(|h| h == anchor)
}

/// The anchors of a Markdown file's headings, as GitHub makes them:
/// lower case, punctuation dropped, spaces as hyphens (code fences aside).
fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let title = line.trim_start_matches('#').trim();
            out.push(
                title
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect(),
            );
        }
    }
    out
}

/// Every `.rs` (its comments) and `.md` file of the repository, but build
/// output and dependencies.
fn documents(root: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                if !(name == "target"
                    || name == "node_modules"
                    || (name.starts_with('.') && name != ".ci"))
                {
                    stack.push(p);
                }
            } else if name.ends_with(".md") {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let comments = source_scan::lex(&text)
                    .comments
                    .into_iter()
                    .map(|c| c.text)
                    .collect::<Vec<_>>()
                    .join("\n");
                out.push((p.clone(), comments));
            }
        }
    }
    out.sort();
    out
}

/// A comment or doc cites only files that are in the repository: no seed
/// documents, no design brief, nothing outside it; where the design comes
/// from is cited as a section of docs/design.md, which links to the public
/// sources.
#[test]
fn every_cited_file_exists_in_the_repository() {
    let root = Path::new(ROOT).canonicalize().unwrap();
    let mut missing = Vec::new();
    for (file, text) in documents(&root) {
        for cited in citations(&text) {
            if !cited_exists(&root, &file, &cited) {
                let rel = file.strip_prefix(&root).unwrap().display().to_string();
                missing.push(format!("{rel}: {cited}"));
            }
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "cited but not in the repository:\n{}",
        missing.join("\n")
    );
}

/// The citation check can fail: it sees what it should and skips what it
/// should.
#[test]
fn the_citation_scan_finds_paths_and_seeds_but_not_urls() {
    let root = Path::new(ROOT).canonicalize().unwrap();
    let file = root.join("crates/throttle/src/lib.rs");
    let found = citations(
        "see docs/design.md#pid-control, (seed 004) and seeds 001, 003; \
         DESIGN.md's target; [x](docs/nothing.md); `engine/src/writer/mod.rs`; \
         ../shared/DESIGN.md and tests/simulation.rs; /work/shared/PEERS.md; \
         docs/design.md#no-such-section.",
    );
    assert_eq!(
        found,
        [
            "docs/design.md#pid-control",
            "seed 004",
            "seeds 001",
            "DESIGN.md",
            "docs/nothing.md",
            "engine/src/writer/mod.rs",
            "../shared/DESIGN.md",
            "tests/simulation.rs",
            "/work/shared/PEERS.md",
            "docs/design.md#no-such-section",
        ]
    );
    let exists: Vec<bool> = found
        .iter()
        .map(|c| cited_exists(&root, &file, c))
        .collect();
    assert_eq!(
        exists,
        [
            true, false, false, false, false, true, false, true, false, false
        ]
    );
    // A link to a section of the same page.
    let page = root.join("docs/design.md");
    let links = citations("[a](#targets) and [b](#elsewhere).");
    assert_eq!(links, ["#targets", "#elsewhere"]);
    assert!(cited_exists(&root, &page, &links[0]));
    assert!(!cited_exists(&root, &page, &links[1]));
    assert!(
        citations(
            "https://example.org/docs/x.md read/write I/O /proc/self/status \
             text/plain sluice_throttle::admission a seed 7 rows/s fuzz/corpus/TARGET"
        )
        .is_empty()
    );
}

// ------------------------------------------------------------ module circles

/// A source file's module within its crate, from its path under `src/`:
/// `lib.rs` and `main.rs` are the root (no name); `a.rs`, or `mod.rs` in
/// folder `a`, is `a`; `b.rs` in folder `a` is `a::b`.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

fn ident_at(tokens: &[Token], i: usize) -> Option<&str> {
    match &tokens.get(i)?.tok {
        Tok::Ident(s) => Some(s),
        _ => None,
    }
}

fn punct_at(tokens: &[Token], i: usize, p: char) -> bool {
    tokens.get(i).is_some_and(|t| t.tok == Tok::Punct(p))
}

fn path_sep_at(tokens: &[Token], i: usize) -> bool {
    punct_at(tokens, i, ':') && punct_at(tokens, i + 1, ':')
}

/// The modules a token stream declares from other files: `mod name;`.
fn declared_mods(tokens: &[Token]) -> BTreeSet<String> {
    (0..tokens.len())
        .filter(|&i| ident_at(tokens, i) == Some("mod") && punct_at(tokens, i + 2, ';'))
        .filter_map(|i| ident_at(tokens, i + 1).map(str::to_string))
        .collect()
}

/// The files of one crate's `src/` (paths under it) that are test code:
/// named `tests.rs`, under a `tests/` folder, or a module (or inside one)
/// its parent declares under `#[cfg(test)]`.
fn test_files(files: &[(String, String)]) -> BTreeSet<String> {
    let mut test_mods = Vec::new();
    for (rel, text) in files {
        let tokens = source_scan::lex(text).tokens;
        let product = declared_mods(&source_scan::without_tests(&tokens));
        for name in declared_mods(&tokens).difference(&product) {
            let mut module = module_of(rel);
            module.push(name.clone());
            test_mods.push(module);
        }
    }
    files
        .iter()
        .map(|(rel, _)| rel)
        .filter(|rel| {
            let module = module_of(rel);
            rel.split('/').any(|c| c == "tests" || c == "tests.rs")
                || test_mods.iter().any(|t| module.starts_with(t))
        })
        .cloned()
        .collect()
}

/// Where a file first names another: the line and the path as written.
#[derive(Clone, Debug)]
struct Import {
    line: usize,
    path: String,
}

/// One crate's imports between its product files (paths under `src/`):
/// file → file it names → where it first does.
type Graph = BTreeMap<String, BTreeMap<String, Import>>;

/// The import graph of one crate's `src/` files, given as (path under
/// `src/`, text). Test files and test code are left out; so are paths to
/// the crate root (its re-exports), to the file itself (its inline
/// modules) and to the file's own descendants (a folder's parts); a
/// `mod child;` declaration is no path, so no import.
fn import_graph(files: &[(String, String)]) -> Graph {
    let tests = test_files(files);
    let product: Vec<&(String, String)> = files
        .iter()
        .filter(|(rel, _)| !tests.contains(rel))
        .collect();
    let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for (rel, _) in &product {
        modules.entry(module_of(rel)).or_insert_with(|| rel.clone());
    }
    let mut graph = Graph::new();
    for (rel, text) in product {
        let edges = graph.entry(rel.clone()).or_default();
        let tokens = source_scan::product_tokens(text);
        for (full, line, path) in named_modules(&tokens, &module_of(rel), &modules) {
            // The longest prefix that is a file: an item inside folder
            // `b`'s `mod.rs` is `b`'s; a prefix of length 0 is the root,
            // left out.
            let Some(target) = (1..=full.len()).rev().find_map(|n| modules.get(&full[..n])) else {
                continue;
            };
            // A module naming its own parts (a folder's `mod.rs` using or
            // re-exporting its files) is structure, not an import: a
            // folder is one concept. Its parts naming it, and any path
            // between siblings or across folders, count.
            let here = module_of(rel);
            let inside = target != rel && module_of(target).starts_with(&here);
            if target != rel && !inside {
                edges.entry(target.clone()).or_insert(Import { line, path });
            }
        }
    }
    graph
}

/// Every crate path in a file's product tokens, as the full path from the
/// crate root it names (each leaf of a `use` group apart), its line, and
/// the path as written. `here` is the file's module; `modules` are the
/// crate's files, so that a bare `child::x` is known for a child module.
fn named_modules(
    tokens: &[Token],
    here: &[String],
    modules: &BTreeMap<Vec<String>, String>,
) -> Vec<(Vec<String>, usize, String)> {
    let mut out = Vec::new();
    // Inline `mod name { … }` blocks open here, with the depth outside each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(m) if m == "mod" && punct_at(tokens, i + 2, '{') => {
                if let Some(name) = ident_at(tokens, i + 1) {
                    inline.push((name.to_string(), depth));
                }
            }
            _ => {}
        }
        let current: Vec<String> = here
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let Some((base, start)) = path_base(tokens, i, &current, modules) else {
            i += 1;
            continue;
        };
        let mut leaves = Vec::new();
        let end = use_tree(tokens, start, base, &mut leaves).max(i + 1);
        let written: String = tokens[i..end]
            .iter()
            .map(|t| match &t.tok {
                Tok::Ident(s) if s == "as" => " as ".to_string(),
                Tok::Ident(s) => s.clone(),
                Tok::Punct(',') => ", ".to_string(),
                Tok::Punct(p) => p.to_string(),
                _ => "_".to_string(),
            })
            .collect();
        for leaf in leaves {
            out.push((leaf, tokens[i].line, written.clone()));
        }
        // A `use` group's braces are balanced: the depth is unchanged.
        i = end;
    }
    out
}

/// Whether a crate path starts at `i` (`crate::`, `self::`, `super::`, or
/// `child::` for a child module of `current`; not in the middle of a
/// longer path, after a `.`, nor in `pub(in …)`): the module it starts
/// from and the index of its first segment after those keywords.
fn path_base(
    tokens: &[Token],
    i: usize,
    current: &[String],
    modules: &BTreeMap<Vec<String>, String>,
) -> Option<(Vec<String>, usize)> {
    let name = ident_at(tokens, i)?;
    if !path_sep_at(tokens, i + 1)
        || (i >= 1 && (punct_at(tokens, i - 1, ':') || punct_at(tokens, i - 1, '.')))
        || (i >= 2 && ident_at(tokens, i - 1) == Some("in") && punct_at(tokens, i - 2, '('))
    {
        return None;
    }
    match name {
        "crate" => Some((Vec::new(), i + 3)),
        "self" => Some((current.to_vec(), i + 3)),
        "super" => {
            let mut base = current.to_vec();
            let mut j = i;
            while ident_at(tokens, j) == Some("super") && path_sep_at(tokens, j + 1) {
                base.pop();
                j += 3;
            }
            Some((base, j))
        }
        // Not `name::<T>`: a generic function or type, no module.
        child if !punct_at(tokens, i + 3, '<') => {
            let mut module = current.to_vec();
            module.push(child.to_string());
            modules.contains_key(&module).then(|| (current.to_vec(), i))
        }
        _ => None,
    }
}

/// Reads a path (or `use` tree) from `j` on, below `path`: pushes each
/// leaf's full path into `leaves` (a glob or `self` names its prefix) and
/// returns the index after it.
fn use_tree(
    tokens: &[Token],
    mut j: usize,
    mut path: Vec<String>,
    leaves: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        if punct_at(tokens, j, '{') {
            j += 1;
            loop {
                match tokens.get(j).map(|t| &t.tok) {
                    None => return j,
                    Some(Tok::Punct('}')) => return j + 1,
                    Some(Tok::Punct(',')) => j += 1,
                    Some(Tok::Ident(s)) if s == "self" => {
                        leaves.push(path.clone());
                        j += 1;
                    }
                    Some(Tok::Ident(s)) if s == "as" => j += 2,
                    _ => j = use_tree(tokens, j, path.clone(), leaves).max(j + 1),
                }
            }
        }
        let Some(segment) = ident_at(tokens, j) else {
            leaves.push(path);
            return j;
        };
        path.push(segment.to_string());
        j += 1;
        if path_sep_at(tokens, j) {
            j += 2;
            continue;
        }
        if ident_at(tokens, j) == Some("as") {
            j += 2;
        }
        leaves.push(path);
        return j;
    }
}

/// The circles of an import graph: for each strongly connected component
/// of more than one file, shortest circles through its files until each
/// file is on one; a circle is written first file, …, first file.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(v) = stack.pop() {
            for w in graph.get(&v).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(w.clone()) {
                    stack.push(w.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|v| (v, reach(v))).collect();
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for v in graph.keys() {
        if placed.contains(v) {
            continue;
        }
        let component: BTreeSet<String> = reaches[v]
            .iter()
            .filter(|u| reaches.get(u).is_some_and(|r| r.contains(v)))
            .cloned()
            .collect();
        if component.len() < 2 {
            continue;
        }
        placed.extend(component.iter().cloned());
        let mut covered = BTreeSet::new();
        for start in &component {
            if !covered.contains(start) {
                let circle = shortest_circle(graph, start, &component);
                covered.extend(circle.iter().cloned());
                out.push(circle);
            }
        }
    }
    out
}

/// The shortest circle from `start` back to it within `component`.
fn shortest_circle(graph: &Graph, start: &String, component: &BTreeSet<String>) -> Vec<String> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(u) = queue.pop_front() {
        for w in graph[&u].keys().filter(|w| component.contains(*w)) {
            if w == start {
                let mut back = vec![start.clone(), u.clone()];
                let mut x = &u;
                while x != start {
                    x = &prev[x];
                    back.push(x.clone());
                }
                back.reverse();
                return back;
            }
            if !prev.contains_key(w) {
                prev.insert(w.clone(), u.clone());
                queue.push_back(w.clone());
            }
        }
    }
    unreachable!("{start} is in a strongly connected component")
}

/// Each crate's `src/` folder (from the root) and its `.rs` files, as
/// (path under `src/`, text).
fn crate_sources() -> Vec<(String, Vec<(String, String)>)> {
    let root = Path::new(ROOT);
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    let mut out = Vec::new();
    for src in crates {
        let mut files = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let p = entry.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|e| e == "rs") {
                    let rel = p.strip_prefix(&src).unwrap().to_string_lossy().to_string();
                    files.push((rel, std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        files.sort();
        let name = src
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .to_string();
        out.push((name, files));
    }
    out
}

/// No two files of a crate import each other, directly or around a
/// circle: a module that needs its parent's items while the parent needs
/// its items (or two siblings each other's) is one module in two files,
/// or wants the shared part moved out to a third.
#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    let mut found = Vec::new();
    for (src, files) in crate_sources() {
        let graph = import_graph(&files);
        for circle in circles(&graph) {
            found.push(format!("{src}: {}", circle.join(" -> ")));
            for pair in circle.windows(2) {
                let import = &graph[&pair[0]][&pair[1]];
                found.push(format!(
                    "    {}:{} names {}",
                    pair[0], import.line, import.path
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "import circles between the files of a crate:\n{}",
        found.join("\n")
    );
}

fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

/// The circle check can fail: it finds circles through `crate::`,
/// `super::`, `self::`, bare child paths and `use` groups, and not through
/// the root's re-exports, `mod` declarations, inline modules, test code,
/// comments or strings.
#[test]
fn the_circle_check_finds_circles_and_only_circles() {
    let clean = sources(&[
        (
            "lib.rs",
            "mod a; mod b; mod c; mod e; pub use a::Engine; pub(crate) fn f() {}",
        ),
        (
            "a.rs",
            "use crate::{b::B, c};\n\
             pub struct Engine;\n\
             pub(crate) fn g() { crate::b::h(); c::x(); }\n\
             mod inner { use super::*; pub(super) fn i() { self::j(); } fn j() {} }\n\
             #[cfg(test)] mod helper;",
        ),
        (
            "b.rs",
            "use crate::Engine;\n\
             // crate::a::g()\n\
             pub(in crate::b) fn h() { let _ = \"crate::a::g\"; }\n\
             #[cfg(test)]\nmod tests { use crate::a::g; use super::super::a; }",
        ),
        (
            "c/mod.rs",
            "mod d; pub fn x() {} fn d<T>() {} fn z(s: S) { s.d::<u8>(); d::<u8>(); }",
        ),
        (
            "c/d.rs",
            "use super::super::b::B; pub fn y() { super::x(); }",
        ),
        ("e/mod.rs", "mod f; pub fn e() { f::g(); }"),
        ("e/f.rs", "pub(in crate::e) fn g() {}"),
        ("a/helper.rs", "use crate::b::h;"),
        ("tests.rs", "use crate::a::g;"),
    ]);
    let graph = import_graph(&clean);
    assert!(circles(&graph).is_empty(), "{graph:?}");
    let edges: Vec<(&str, &str)> = graph
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |t| (from.as_str(), t.as_str())))
        .collect();
    assert_eq!(
        edges,
        [
            ("a.rs", "b.rs"),
            ("a.rs", "c/mod.rs"),
            ("c/d.rs", "b.rs"),
            ("c/d.rs", "c/mod.rs"),
        ]
    );

    // Siblings through a `use` group and a path in code; a child naming
    // its parent, the parent a sibling that names the child; and a longer
    // circle.
    let circled = sources(&[
        ("lib.rs", "mod a; mod b; mod p; mod r; mod x; mod y; mod z;"),
        ("a.rs", "use crate::{b::{self, B}, Engine};"),
        ("b.rs", "fn f() { let _ = crate::a::A::new(); }"),
        (
            "p/mod.rs",
            "mod q; use self::q::Q; use crate::r::R; pub struct P;",
        ),
        ("p/q.rs", "use super::*; pub struct Q;"),
        ("r.rs", "use crate::p::q::Q; pub struct R;"),
        ("x.rs", "use crate::y::Y;"),
        ("y.rs", "use crate::z;"),
        ("z/mod.rs", "pub fn f() { super::x::g(); }"),
    ]);
    let found: Vec<String> = circles(&import_graph(&circled))
        .iter()
        .map(|c| c.join(" -> "))
        .collect();
    assert_eq!(
        found,
        [
            "a.rs -> b.rs -> a.rs",
            "p/mod.rs -> r.rs -> p/q.rs -> p/mod.rs",
            "x.rs -> y.rs -> z/mod.rs -> x.rs",
        ]
    );
    // A parent naming its child by a bare `child::` path is structure: no
    // circle with the child naming it back.
    let bare = sources(&[
        ("lib.rs", "mod p;"),
        ("p.rs", "mod q; fn f() { q::g(); }"),
        ("p/q.rs", "pub fn g() { super::super::p::f(); }"),
    ]);
    let found: Vec<String> = circles(&import_graph(&bare))
        .iter()
        .map(|c| c.join(" -> "))
        .collect();
    assert!(found.is_empty(), "{found:?}");
}

// ------------------------------------------------------------ long files

/// The most lines a product file may have, its tests not counted.
const MAX_LINES: usize = 700;

/// A file's lines but those of its test items (`#[cfg(test)]`, `#[test]`:
/// from the attribute to the closing brace, found on the lexed tokens)
/// and the comment lines right above each.
fn product_lines(text: &str) -> usize {
    let lexed = source_scan::lex(text);
    let total = text.lines().count();
    let code: BTreeSet<usize> = lexed.tokens.iter().map(|t| t.line).collect();
    let commented: BTreeSet<usize> = lexed.comments.iter().map(|c| c.line).collect();
    let mut test = BTreeSet::new();
    for item in source_scan::test_items(&lexed.tokens) {
        let first = lexed.tokens[item.start].line;
        test.extend(first..=lexed.tokens[item.end - 1].line);
        let mut above = first - 1;
        while above > 0 && commented.contains(&above) && !code.contains(&above) {
            test.insert(above);
            above -= 1;
        }
    }
    total - test.iter().filter(|&&l| l <= total).count()
}

/// One crate's product files over [`MAX_LINES`], with their counts: not
/// its test files (see [`test_files`]) and not their test code.
fn long_files(files: &[(String, String)]) -> Vec<(String, usize)> {
    let tests = test_files(files);
    files
        .iter()
        .filter(|(rel, _)| !tests.contains(rel))
        .map(|(rel, text)| (rel.clone(), product_lines(text)))
        .filter(|(_, n)| *n > MAX_LINES)
        .collect()
}

/// No product file is over 700 lines, its tests aside: past that, a file
/// holds more than one idea and wants splitting along them.
#[test]
fn no_product_file_is_over_700_lines() {
    let mut long = Vec::new();
    for (src, files) in crate_sources() {
        for (rel, n) in long_files(&files) {
            long.push(format!("{src}/{rel}: {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "product files over {MAX_LINES} lines (tests not counted):\n{}",
        long.join("\n")
    );
}

/// The most lines of tests a product file may hold inline; more go to a
/// `tests.rs` submodule (`#[cfg(test)] mod tests;`) or the crate's `tests/`.
const MAX_INLINE_TEST_LINES: usize = 100;

/// A file's lines of inline test code (`#[cfg(test)]`, `#[test]` items).
fn inline_test_lines(text: &str) -> usize {
    let lexed = source_scan::lex(text);
    source_scan::test_items(&lexed.tokens)
        .iter()
        .map(|item| lexed.tokens[item.end - 1].line - lexed.tokens[item.start].line + 1)
        .sum()
}

/// Tests out of product files: no product file holds more than
/// [`MAX_INLINE_TEST_LINES`] lines of tests.
#[test]
fn no_product_file_holds_long_inline_tests() {
    let mut long = Vec::new();
    for (src, files) in crate_sources() {
        let tests = test_files(&files);
        for (rel, text) in &files {
            let n = inline_test_lines(text);
            if !tests.contains(rel) && n > MAX_INLINE_TEST_LINES {
                long.push(format!("{src}/{rel}: {n} lines of tests"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "product files with over {MAX_INLINE_TEST_LINES} lines of inline tests:\n{}",
        long.join("\n")
    );
    let mut text = String::from("pub fn f() {}\n#[cfg(test)]\nmod tests {\n");
    for i in 0..MAX_INLINE_TEST_LINES {
        text.push_str(&format!("    #[test] fn t{i}() {{}}\n"));
    }
    text.push_str("}\n");
    assert!(
        inline_test_lines(&text) > MAX_INLINE_TEST_LINES,
        "the check can fail"
    );
    assert_eq!(
        inline_test_lines("pub fn f() {}\n#[cfg(test)]\nmod tests;\n"),
        2
    );
}

/// The length check can fail: 705 product lines are too many, however
/// many test lines follow; test files and test code are not counted.
#[test]
fn the_length_check_counts_product_lines_only() {
    let mut text = String::from("//! A long file.\n");
    for i in 1..704 {
        text.push_str(&format!(
            "pub fn f{i}() {{ let _ = \"#[cfg(test)] mod x {{\"; }}\n"
        ));
    }
    text.push_str("#[cfg(test)]\nmod helper;\n\n");
    // 300 test lines: a doc comment, the attribute, the block.
    text.push_str("/// Tests.\n#[cfg(test)]\nmod tests {\n");
    for i in 0..296 {
        text.push_str(&format!("    #[test] fn t{i}() {{ let _ = \"}}\"; }}\n"));
    }
    text.push_str("}\n");
    assert_eq!(text.lines().count(), 705 + 2 + 300);
    assert_eq!(product_lines(&text), 705);
    let short: String = text.lines().skip(5).map(|l| format!("{l}\n")).collect();
    assert_eq!(product_lines(&short), 700);
    let files = sources(&[
        ("lib.rs", &text),
        ("short.rs", &short),
        ("helper.rs", &text),
        ("tests.rs", &text),
        ("a/tests/b.rs", &text),
    ]);
    assert_eq!(long_files(&files), [("lib.rs".to_string(), 705)]);
}
