//! Architecture invariants checked by `cargo test`: the dependency
//! direction between crates, and which crates may name heed and axum.

use std::collections::BTreeMap;
use std::path::Path;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// crate directory → internal crates it may depend on (DESIGN.md layout).
fn allowed() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("proto", &[][..]),
        ("store", &["sluice-proto"][..]),
        ("throttle", &[][..]),
        (
            "engine",
            &["sluice-proto", "sluice-store", "sluice-throttle"][..],
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
