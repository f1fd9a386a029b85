//! `docs/architecture.md` against the code: every module its room tables
//! name exists, every module of `core`, `store` and `server` is named, and
//! every module path the invariants table cites resolves.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const ROOMS: [&str; 3] = ["core", "store", "server"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn doc() -> String {
    let path = repo().join("docs/architecture.md");
    fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The words in backticks of a table cell.
fn ticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The rows of the module table under `### <room>`: (names, description).
fn rows(doc: &str, room: &str) -> Vec<(Vec<String>, String)> {
    let heading = format!("### {room} (");
    let section = doc
        .split("\n### ")
        .find(|s| s.starts_with(&heading[4..]))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    // The section ends at the next heading of any level.
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
            let names = ticked(cells[0]).iter().map(|s| s.to_string()).collect();
            (names, cells[1..].join(" | "))
        })
        .collect()
}

/// A module `name` (a file or a directory with `mod.rs`) under `dir`.
fn module_exists(dir: &Path, name: &str) -> bool {
    let name = name.trim_end_matches('/');
    dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("mod.rs").is_file()
}

/// The modules of a directory: its `.rs` files but `lib.rs`, `mod.rs`
/// and test files, and its subdirectories with a `mod.rs`.
fn modules(dir: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let entries = fs::read_dir(dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if path.is_dir() && path.join("mod.rs").is_file() {
            found.insert(format!("{name}/"));
        } else if path.extension().is_some_and(|e| e == "rs")
            && !matches!(name, "lib" | "mod" | "tests" | "testing")
        {
            found.insert(name.to_owned());
        }
    }
    found
}

#[test]
fn every_module_named_exists_and_every_module_is_named() {
    let doc = doc();
    for room in ROOMS {
        let src = repo().join("crates").join(room).join("src");
        let mut named = BTreeSet::new();
        for (names, description) in rows(&doc, room) {
            for name in &names {
                assert!(
                    module_exists(&src, name),
                    "docs/architecture.md names `{name}` in {room}, which has no such module"
                );
                assert!(
                    name.ends_with('/') || !src.join(name).join("mod.rs").is_file(),
                    "docs/architecture.md names the directory `{name}` in {room} without its `/`, so its modules go unchecked"
                );
                named.insert(name.trim_end_matches('/').to_owned());
                if let Some(dir) = name.strip_suffix('/') {
                    // A directory's own modules are named in its description.
                    let inner: BTreeSet<&str> = ticked(&description).into_iter().collect();
                    for module in modules(&src.join(dir)) {
                        assert!(
                            inner.contains(module.trim_end_matches('/')),
                            "{room}::{dir}::{module} is not named in docs/architecture.md"
                        );
                    }
                }
            }
        }
        for module in modules(&src) {
            assert!(
                named.contains(module.trim_end_matches('/')),
                "{room}::{module} is not named in docs/architecture.md"
            );
        }
    }
}

#[test]
fn every_module_path_the_invariants_cite_resolves() {
    let doc = doc();
    let mut cited = 0;
    for path in ticked(&doc) {
        let mut parts = path.split("::");
        let Some(room) = parts.next().filter(|r| ROOMS.contains(r)) else {
            continue;
        };
        let mut dir = repo().join("crates").join(room).join("src");
        let rest: Vec<&str> = parts.collect();
        // The last segment may be a function of the module before it.
        for (i, part) in rest.iter().enumerate() {
            if module_exists(&dir, part) {
                dir = dir.join(part);
            } else {
                let module = dir.with_extension("rs");
                let file = if module.is_file() {
                    module
                } else {
                    dir.join("mod.rs")
                };
                let text = fs::read_to_string(&file).unwrap_or_default();
                assert!(
                    i + 1 == rest.len() && text.contains(&format!("fn {part}")),
                    "docs/architecture.md cites `{path}`, which does not resolve"
                );
            }
        }
        cited += 1;
    }
    assert!(cited >= 10, "only {cited} module paths cited");
}
