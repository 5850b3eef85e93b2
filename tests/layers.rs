//! The module graph as the source spells it (each file's `crate::…` and `super::…` paths, tests
//! aside): no circle among the files of one folder, and no use the layers of docs/DESIGN.md,
//! "Code map", forbid (its may-use table, pinned here row by row); and no function over 100
//! lines, the shape a long run of steps gets split by.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Every .rs file under `dir` but the unit tests' own files.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// Every .rs file of src/ but the unit tests' own files.
fn sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(Path::new(SRC), &mut out);
    out
}

/// A file's text before its `#[cfg(test)]` tail (the unit tests).
fn without_unit_tests(text: &str) -> &str {
    text.split("#[cfg(test)]\nmod tests").next().unwrap_or("")
}

/// `src/provision/state.rs` -> provision::state; `mod.rs` is its folder's module.
fn module_of(path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(SRC).unwrap().with_extension("");
    let mut m: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        m.pop();
    }
    m
}

/// The file's code without comments and without its `#[cfg(test)]` tail (the unit tests).
fn code(text: &str) -> String {
    without_unit_tests(text)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path the code names through `crate::` or `super::`, as module segments from the root
/// (braces expanded one level: `use super::{a, b::c}`).
fn paths(module: &[String], code: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            rest = &rest[i..];
            // inside a longer name, or the second `super::` of `super::super::`
            if before.is_some_and(|c| ident(c) || c == ':') {
                rest = &rest[start.len()..];
                continue;
            }
            // the path itself: segments and one level of braces
            let end = rest
                .find(|c: char| {
                    !(ident(c)
                        || c == ':'
                        || c == '{'
                        || c == '}'
                        || c == ','
                        || c == ' '
                        || c == '\n')
                })
                .unwrap_or(rest.len());
            let text = &rest[..end];
            rest = &rest[start.len()..];
            // `super::` is the module's parent (a mod.rs file's module is its folder), once per
            // `super::` in a row
            let ups = text.split("super::").take_while(|s| s.is_empty()).count();
            let base: Vec<String> = if start == "crate::" {
                Vec::new()
            } else {
                module[..module.len().saturating_sub(ups)].to_vec()
            };
            let body = text
                .trim_start_matches("super::")
                .trim_start_matches("crate::");
            let (head, braces) = match body.find('{') {
                Some(b) => (
                    &body[..b],
                    Some(&body[b + 1..body.find('}').unwrap_or(body.len())]),
                ),
                None => (body, None),
            };
            let head: Vec<String> = head
                .split("::")
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s != "super")
                .take_while(|s| s.chars().all(ident))
                .collect();
            let mut full = base.clone();
            full.extend(head.iter().cloned());
            match braces {
                Some(list) => {
                    for item in list.split(',') {
                        let mut p = full.clone();
                        p.extend(
                            item.split("::")
                                .map(|s| s.trim().to_string())
                                .filter(|s| !s.is_empty()),
                        );
                        out.push(p);
                    }
                }
                None => out.push(full),
            }
        }
    }
    out
}

struct Graph {
    modules: BTreeSet<Vec<String>>,
    /// module -> the modules it names
    uses: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn graph() -> Graph {
    let list = sources();
    let modules: BTreeSet<Vec<String>> = list.iter().map(|p| module_of(p)).collect();
    let mut uses = BTreeMap::new();
    for p in &list {
        let m = module_of(p);
        let text = code(&std::fs::read_to_string(p).unwrap());
        let mut named = BTreeSet::new();
        for path in paths(&m, &text) {
            // the longest prefix that is a module of the crate
            let found = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|q| modules.contains(q));
            if let Some(q) = found.filter(|q| *q != m) {
                named.insert(q);
            }
        }
        uses.insert(m, named);
    }
    Graph { modules, uses }
}

/// Within each folder: the files' uses of each other (a use of a sibling's submodule counts
/// as a use of the sibling); a circle is a bug of the layering.
#[test]
fn no_circle_among_the_files_of_a_folder() {
    let g = graph();
    // what the graph must see, or it sees nothing
    let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    for (from, to) in [
        ("provision::state", "provision::summary"),
        ("provision::write", "provision::state"),
        ("provision::hostkeys::later", "provision::hostkeys"),
        ("boot", "provision::run"),
        ("cli::status", "provision::record"),
    ] {
        assert!(g.uses[&m(from)].contains(&m(to)), "{from} -> {to} not seen");
    }
    assert!(g.uses.values().map(BTreeSet::len).sum::<usize>() > 300);
    let mut circles = Vec::new();
    let folders: BTreeSet<Vec<String>> = g
        .modules
        .iter()
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    for folder in folders {
        let depth = folder.len() + 1;
        let sibling = |m: &Vec<String>| -> Option<Vec<String>> {
            (m.len() >= depth && m[..folder.len()] == folder[..]).then(|| m[..depth].to_vec())
        };
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (m, named) in &g.uses {
            let Some(from) = sibling(m) else { continue };
            for n in named {
                if let Some(to) = sibling(n).filter(|t| *t != from) {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        // a circle: a module that reaches itself
        for start in edges.keys() {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<Vec<String>> = edges[start].iter().cloned().collect();
            while let Some(n) = stack.pop() {
                if n == *start {
                    circles.push(start.join("::"));
                    break;
                }
                if seen.insert(n.clone()) {
                    stack.extend(edges.get(&n).into_iter().flatten().cloned());
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules in a circle with a sibling: {circles:?}"
    );
}

/// docs/DESIGN.md's may-use table: each layer's folder and what of the crate it may name
/// (beside itself; `a::b` allows that module of `a` only); `deadline`, `time`, `secret`,
/// `glob` and `logger` serve every layer but `sys`.
const MAY_USE: &[(&str, &[&str])] = &[
    ("sys", &[]),
    ("disk", &["sys"]),
    ("modules", &["sys", "glob"]),
    ("net", &["sys", "deadline"]),
    ("azure", &["sys", "modules", "deadline", "logger", "secret"]),
    ("config", &["modules", "azure", "logger", "time"]),
    (
        "root",
        &["sys", "disk", "config", "azure::reason", "azure::kvp"],
    ),
    (
        "provision",
        &[
            "sys", "disk", "modules", "net", "azure", "config", "root", "deadline", "time",
            "secret", "glob", "logger",
        ],
    ),
];
const SERVE_EVERY_ONE: &[&str] = &["deadline", "time", "secret", "glob", "logger"];

#[test]
fn every_use_is_one_the_layers_allow() {
    let g = graph();
    let mut wrong = Vec::new();
    for (m, named) in &g.uses {
        let Some(top) = m.first() else { continue };
        let Some((_, allowed)) = MAY_USE.iter().find(|(f, _)| f == top) else {
            continue;
        };
        for n in named {
            let other = &n[0];
            let path = n.join("::");
            let ok = other == top
                || allowed.contains(&other.as_str())
                || allowed.iter().any(|a| {
                    a.contains("::") && (path == *a || path.starts_with(&format!("{a}::")))
                })
                || (top != "sys" && SERVE_EVERY_ONE.contains(&other.as_str()));
            if !ok {
                wrong.push(format!("{} uses {}", m.join("::"), n.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses docs/DESIGN.md's table forbids: {wrong:#?}"
    );
}

/// The table above is DESIGN's: each folder's row names what it may use.
#[test]
fn the_table_is_the_designs() {
    let design = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/DESIGN.md"));
    for (folder, allowed) in MAY_USE.iter().filter(|(f, _)| *f != "provision") {
        let key = if *folder == "config" {
            "`config.rs`".to_string()
        } else {
            format!("`{folder}/`")
        };
        let row = design
            .lines()
            .find(|l| l.starts_with(&format!("| {key} |")))
            .unwrap_or_else(|| panic!("DESIGN.md has no row for {key}"));
        let may = row.split('|').nth(2).unwrap_or("");
        for a in *allowed {
            assert!(
                may.contains(&format!("`{a}`")),
                "DESIGN.md's row {key} lacks {a}: {row}"
            );
        }
    }
}

/// The lines of each `fn` in `code` that are not blank (comments count), by name: its
/// signature to the `}` that closes its body (strings, chars and comments skipped while braces
/// are counted).
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let words: Vec<&str> = lines[i].split_whitespace().collect();
        let name = words
            .iter()
            .position(|w| *w == "fn")
            .filter(|&p| {
                words[..p].iter().all(|w| {
                    w.starts_with("pub") || ["const", "unsafe", "async", "extern"].contains(w)
                })
            })
            .and_then(|p| words.get(p + 1))
            .map(|n| n.split(['(', '<']).next().unwrap_or("").to_string());
        let Some(name) = name.filter(|_| !lines[i].trim_end().ends_with(';')) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut n, mut j) = (0i32, false, 0, i);
        while j < lines.len() {
            n += usize::from(!lines[j].trim().is_empty());
            let (mut in_str, mut prev) = (false, ' ');
            let comment = lines[j].trim_start().starts_with("//");
            for c in lines[j].chars().filter(|_| !comment) {
                match c {
                    '"' if prev != '\\' => in_str = !in_str,
                    '{' if !in_str && prev != '\'' => (depth, opened) = (depth + 1, true),
                    '}' if !in_str && prev != '\'' => depth -= 1,
                    _ => {}
                }
                prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            }
            if opened && depth <= 0 {
                break;
            }
            j += 1;
        }
        out.push((name, n));
        i = j + 1;
    }
    out
}

/// A long function is split by stage: none in src/ (the unit tests aside) is over 100 lines.
#[test]
fn no_function_is_over_100_lines() {
    let all = sources();
    let mut long = Vec::new();
    for path in &all {
        let text = std::fs::read_to_string(path).unwrap();
        for (name, n) in function_lengths(without_unit_tests(&text)) {
            if n > 100 {
                long.push(format!("{} {name}: {n} lines", path.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these by stage:\n{}",
        long.join("\n")
    );
    // the counter itself: a 3-line function with a brace in a string
    let lengths = function_lengths("fn a() {\n    // }\n\n    let s = \"}\";\n}\nfn b() {}\n");
    assert_eq!(lengths, [("a".to_string(), 4), ("b".to_string(), 1)]);
}

/// One module-file convention: a folder's module is its `mod.rs`; a file `x.rs` has at most
/// its unit tests beside it (`x/tests.rs`), never submodules of its own.
#[test]
fn a_module_with_submodules_is_a_folder_with_mod_rs() {
    let all = sources();
    let mut wrong = Vec::new();
    for path in &all {
        let beside = path.with_extension("");
        if path.file_name().is_some_and(|n| n != "mod.rs") && beside.is_dir() {
            let others: Vec<String> = std::fs::read_dir(&beside)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != "tests.rs")
                .collect();
            if !others.is_empty() {
                wrong.push(format!("{} beside {others:?}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "make these folders with mod.rs:\n{}",
        wrong.join("\n")
    );
}
