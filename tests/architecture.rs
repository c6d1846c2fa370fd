//! Architecture invariants checked by `cargo test`: the dependency
//! direction between crates, which crates may name heed and axum, and that
//! every file a comment or doc cites is in the repository.

mod source_scan;

use std::collections::BTreeMap;
use std::path::Path;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// crate directory → internal crates it may depend on (ARCHITECTURE.md, Codemap).
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("proto", &[][..]),
        ("store", &["sluice-proto"][..]),
        ("search", &["sluice-proto", "sluice-store"][..]),
        ("throttle", &[][..]),
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
            &["sluice-proto", "sluice-engine", "sluice-throttle"][..],
        ),
        (
            "cluster",
            &["sluice-proto", "sluice-engine", "sluice-throttle"][..],
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
         DESIGN.md's target; [x](docs/nothing.md); `engine/src/writer.rs`; \
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
            "engine/src/writer.rs",
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
             text/plain sluice_throttle::policy a seed 7 rows/s fuzz/corpus/TARGET"
        )
        .is_empty()
    );
}
