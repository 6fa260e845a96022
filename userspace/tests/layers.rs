//! The modules of `src/` form layers (see the crate documentation): a
//! module imports only modules of lower layers. This reads the sources,
//! collects every `crate::<module>` a top-level module names in its code,
//! and fails on an import that points sideways or up — a cycle in the
//! making.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Bottom first. A module may import the modules of the layers before its
/// own, never those of its own layer or after.
const LAYERS: &[&[&str]] = &[
    &["config"],
    &["store", "netlink"],
    &["datapath", "objects"],
    &["nat", "events", "install", "services", "policy"],
    &["endpoint"],
    &["cluster"],
    &["agent"],
    &["server"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules and their files: `src/x.rs`, or `src/x/**.rs`.
fn modules() -> BTreeMap<String, Vec<PathBuf>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(src()).expect("src") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_owned();
        if path.is_dir() {
            if name == "bin" {
                continue;
            }
            let mut files = Vec::new();
            rs_files(&path, &mut files);
            out.insert(name, files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            out.insert(name, vec![path]);
        }
    }
    out
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of `text`, without line comments (doc comments included: an
/// intra-doc link is not an import).
fn code(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Every top-level module named after `crate::` in `code`, including each
/// item of a group (`use crate::{a::X, b}` names `a` and `b`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // Not part of a longer path such as `rivet_crate::`.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let after = rest.trim_start();
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        item_start = false;
                        let name = ident(&group[i..]);
                        if !name.is_empty() {
                            out.insert(name.to_owned());
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(after);
            if !name.is_empty() {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

#[test]
fn the_reference_parser_sees_paths_and_groups() {
    let refs = crate_refs(
        "use crate::{\n    a::{X, y::Z},\n    b,\n};\nfn f() { crate::c::g(); my_crate::d::h(); }",
    );
    let names: Vec<&str> = refs.iter().map(String::as_str).collect();
    assert_eq!(names, ["a", "b", "c"]);
}

#[test]
fn every_module_has_a_layer() {
    let unplaced: Vec<String> = modules()
        .into_keys()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules without a layer (add them to LAYERS here and to the table in lib.rs): {unplaced:?}"
    );
}

#[test]
fn imports_point_only_down() {
    let mut wrong = Vec::new();
    for (module, files) in modules() {
        let Some(own) = layer_of(&module) else {
            continue;
        };
        for file in files {
            let text = fs::read_to_string(&file).expect("read");
            for target in crate_refs(&code(&text)) {
                if target == module {
                    continue;
                }
                match layer_of(&target) {
                    Some(layer) if layer < own => {}
                    Some(layer) => wrong.push(format!(
                        "{} (layer {own}) imports crate::{target} (layer {layer})",
                        file.strip_prefix(src()).unwrap_or(&file).display()
                    )),
                    None => wrong.push(format!(
                        "{} names crate::{target}, which is no module of a layer",
                        file.strip_prefix(src()).unwrap_or(&file).display()
                    )),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that do not point down:\n{}",
        wrong.join("\n")
    );
}
