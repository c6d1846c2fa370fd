//! docs/metrics.md against the code. The registry's names are the string
//! constants of every `metrics_names.rs` under crates/*/src, plus any name
//! written inline in a `counter!`, `gauge!` or `histogram!` call (such as
//! `sluice_build_info` in the binary's telemetry.rs). The doc's tables must
//! list exactly that set, each name once, with a type that fits the name.
//! Every `sluice_` name that the alert rules and the Grafana dashboard use
//! must exist too, so a renamed metric cannot silently empty a panel or an
//! alert. crates/bench is a client of /metrics, not part of the registry, and
//! is not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `path` relative to the repository, for messages.
fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
}

/// Every `sluice_[a-z0-9_]+` token in `text`, with its byte offset.
fn sluice_tokens(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("sluice_") {
        let start = from + i;
        let before_ok = text[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !is_name_char(c) && !c.is_ascii_uppercase());
        let len = text[start..]
            .find(|c: char| !is_name_char(c))
            .unwrap_or(text.len() - start);
        if before_ok && len > "sluice_".len() {
            out.push((start, &text[start..start + len]));
        }
        from = start + len;
    }
    out
}

/// The string literal `"sluice_…"` starting at `start` (the offset of the
/// name), or None when the token is not a whole literal.
fn literal_at<'a>(text: &'a str, start: usize, name: &'a str) -> Option<&'a str> {
    let quoted = text[..start].ends_with('"') && text[start + name.len()..].starts_with('"');
    quoted.then_some(name)
}

/// Whether the literal at `start` is the first argument of a metrics macro.
fn in_metrics_macro(text: &str, start: usize) -> bool {
    let head = text[..start - 1].trim_end();
    let Some(head) = head.strip_suffix('(') else {
        return false;
    };
    let Some(head) = head.trim_end().strip_suffix('!') else {
        return false;
    };
    ["counter", "gauge", "histogram"]
        .iter()
        .any(|m| head.ends_with(m))
}

/// Metric names declared in the code, with the file that declares each.
fn code_names() -> BTreeMap<String, PathBuf> {
    let mut files = Vec::new();
    let crates = root().join("crates");
    let mut dirs: Vec<_> = std::fs::read_dir(&crates)
        .expect("listing crates/")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "bench"))
        .collect();
    dirs.sort();
    for dir in dirs {
        let src = dir.join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut names = BTreeMap::new();
    for file in files {
        let text = read(&file);
        let is_names_file = file.file_name().is_some_and(|n| n == "metrics_names.rs");
        for (start, token) in sluice_tokens(&text) {
            let Some(name) = literal_at(&text, start, token) else {
                continue;
            };
            if is_names_file || in_metrics_macro(&text, start) {
                names.insert(name.to_string(), file.clone());
            }
        }
    }
    names
}

/// Rows of the doc's tables: name → type.
fn doc_rows() -> Vec<(String, String)> {
    let doc = read(&root().join("docs/metrics.md"));
    let mut rows = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let names = sluice_tokens(cells[0]);
        if names.is_empty() {
            continue;
        }
        assert_eq!(
            names.len(),
            1,
            "docs/metrics.md: one metric per row: {line}"
        );
        let kind = cells.get(1).copied().unwrap_or("").to_string();
        rows.push((names[0].1.to_string(), kind));
    }
    rows
}

#[test]
fn docs_list_exactly_the_metrics_in_the_code() {
    let code = code_names();
    assert!(
        code.contains_key("sluice_build_info") && code.len() > 30,
        "found too few metric names in crates/*/src: {code:?}"
    );
    let rows = doc_rows();
    let mut doc = BTreeSet::new();
    for (name, _) in &rows {
        assert!(
            doc.insert(name.clone()),
            "docs/metrics.md lists {name} twice"
        );
    }
    let missing: Vec<_> = code
        .iter()
        .filter(|(n, _)| !doc.contains(*n))
        .map(|(n, f)| format!("{n} (declared in {})", rel(f)))
        .collect();
    let unknown: Vec<_> = doc.iter().filter(|n| !code.contains_key(*n)).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/metrics.md and the code disagree.\n  in the code, not in the doc: {missing:?}\n  in the doc, not in the code: {unknown:?}"
    );
}

#[test]
fn documented_types_fit_the_names() {
    for (name, kind) in doc_rows() {
        match kind.as_str() {
            "counter" => assert!(
                name.ends_with("_total"),
                "counter {name} must end in _total"
            ),
            "gauge" | "histogram" => assert!(
                !name.ends_with("_total"),
                "{kind} {name} must not end in _total"
            ),
            other => panic!(
                "docs/metrics.md: {name} has type {other:?}, not counter, gauge or histogram"
            ),
        }
    }
}

#[test]
fn alerts_and_dashboard_use_only_existing_metrics() {
    let code = code_names();
    let histograms: BTreeSet<String> = doc_rows()
        .into_iter()
        .filter(|(_, kind)| kind == "histogram")
        .map(|(name, _)| name)
        .collect();
    let mut files = vec![
        root().join("deploy/prometheus/alerts.yml"),
        root().join("deploy/grafana/dashboards/sluice.json"),
    ];
    let tests = root().join("deploy/prometheus/tests");
    if tests.is_dir() {
        let mut more: Vec<_> = std::fs::read_dir(&tests)
            .expect("listing deploy/prometheus/tests")
            .map(|e| e.expect("directory entry").path())
            .collect();
        more.sort();
        files.extend(more);
    }
    let mut unknown = BTreeSet::new();
    for file in files {
        let text = read(&file);
        for (_, token) in sluice_tokens(&text) {
            let series_of_histogram = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|s| token.strip_suffix(s))
                .any(|base| histograms.contains(base));
            if !code.contains_key(token) && !series_of_histogram {
                unknown.insert(format!("{token} in {}", rel(&file)));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "names used in deploy/ that the code does not declare: {unknown:?}"
    );
}

/// Every `layer` and `reason` a throttle refusal is counted with is listed
/// in the row of `sluice_throttle_refusals_total` (and `decisions_total`
/// points to it).
#[test]
fn every_throttle_layer_and_reason_is_documented() {
    let doc = read(&root().join("docs/metrics.md"));
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `sluice_throttle_refusals_total`"))
        .expect("the refusals row");
    let labels = row.split('|').nth(3).expect("its labels cell");
    let listed = |name: &str| labels.contains(&format!("`{name}`"));
    for layer in sluice_throttle::Layer::ALL {
        assert!(
            listed(layer.as_str()),
            "layer {} undocumented",
            layer.as_str()
        );
    }
    for cause in sluice_throttle::Cause::ALL {
        assert!(
            listed(cause.as_str()),
            "reason {} undocumented",
            cause.as_str()
        );
    }
}
