//! The layer table of ARCHITECTURE.md ("Layers"), enforced: every `crate::…`
//! path in host/src (comments aside) names a module of a lower layer, or one
//! listed before it in its own layer; every herald-* crate depends only on
//! crates of lower layers. The table is read from ARCHITECTURE.md itself, so
//! the document and the check cannot drift apart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// (layer index, position in its row) of every module the table names.
fn table() -> HashMap<String, (usize, usize)> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("\n## Layers\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a \"## Layers\" section");
    let mut modules = HashMap::new();
    let rows = section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| L") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit));
    for (layer, row) in rows.enumerate() {
        let cells: Vec<&str> = row.split('|').collect();
        assert!(
            cells[1].trim().starts_with(&format!("L{layer}")),
            "rows in order: {row}"
        );
        for (i, name) in cells[2].split('`').skip(1).step_by(2).enumerate() {
            assert!(
                modules.insert(name.to_string(), (layer, i)).is_none(),
                "{name} is in the table twice"
            );
        }
    }
    assert!(modules.len() > 20, "the table was not read: {modules:?}");
    modules
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without comments (line comments, doc comments, block comments)
/// and without the contents of string literals.
fn code(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            // A string literal (raw strings with `#` are skipped whole too).
            let raw_hashes = src[..i].chars().rev().take_while(|&c| c == '#').count();
            let is_raw = src[..i].trim_end_matches('#').ends_with('r');
            out.push('"');
            i += 1;
            if is_raw {
                let close = format!("\"{}", "#".repeat(raw_hashes));
                i += src[i..]
                    .find(&close)
                    .map_or(src.len() - i, |n| n + close.len());
            } else {
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            out.push('"');
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The top-level modules a file's code names through `crate::`.
fn imports(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `herald_crate::` and the like
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::B, c, d::{E, F}}`: the first name of each item.
            let mut depth = 0;
            let mut item_start = true;
            for (i, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphabetic() || c == '_') => {
                        let name: String = group[i..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        found.push(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

/// The top-level module a file of host/src belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

#[test]
fn no_module_imports_against_the_layer_table() {
    let table = table();
    let src = root().join("host/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let from = module_of(&src, file);
        let Some(&(layer, pos)) = table.get(&from) else {
            wrong.push(format!(
                "{}: module {from} is not in the layer table",
                file.display()
            ));
            continue;
        };
        let code = code(&std::fs::read_to_string(file).unwrap());
        for to in imports(&code) {
            if to == from || to == "self" {
                continue;
            }
            match table.get(&to) {
                None => wrong.push(format!(
                    "{}: crate::{to} is not in the layer table",
                    file.display()
                )),
                Some(&(l, p)) if l < layer || (l == layer && p < pos) => {}
                Some(&(l, _)) => wrong.push(format!(
                    "{}: {from} (L{layer}) imports {to} (L{l}{})",
                    file.display(),
                    if l == layer {
                        ", later in its layer"
                    } else {
                        ""
                    }
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports the layer table forbids:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_lower_crates_depend_only_downwards() {
    let table = table();
    // Each crate by the modules it holds (the host re-exports them under these names).
    let crates = [
        ("base", "clock"),
        ("proto", "proto"),
        ("fanout", "fanout"),
        ("plugin", "plugin"),
    ];
    let layer_of = |krate: &str| {
        let (_, module) = crates.iter().find(|(c, _)| *c == krate).unwrap();
        table[*module]
    };
    for (krate, _) in crates {
        let manifest =
            std::fs::read_to_string(root().join(format!("crates/{krate}/Cargo.toml"))).unwrap();
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .unwrap_or("")
            .split("\n[")
            .next()
            .unwrap_or("");
        for line in deps.lines() {
            let Some(dep) = line.strip_prefix("herald-") else {
                continue;
            };
            let dep = dep.split([' ', '=', '.']).next().unwrap();
            assert_ne!(dep, "host", "herald-{krate} depends on the host");
            let (from, to) = (layer_of(krate), layer_of(dep));
            assert!(
                to.0 < from.0 || (to.0 == from.0 && to.1 < from.1),
                "herald-{krate} (L{}) depends on herald-{dep} (L{})",
                from.0,
                to.0
            );
        }
    }
}

/// The checker itself: it finds what it must and nothing in comments.
#[test]
fn the_checker_reads_paths_groups_and_skips_comments() {
    let src = r#"
        use crate::tenant::Tenant;
        use crate::{node::Node, source::{self, Sources}, clock};
        /// Like `crate::config` in a doc comment.
        // crate::cli in a comment
        let s = "crate::api in a string";
        /* crate::server in a block */
        crate::registry::log::TABLE;
    "#;
    assert_eq!(
        imports(&code(src)),
        ["tenant", "node", "source", "clock", "registry"]
    );
}
