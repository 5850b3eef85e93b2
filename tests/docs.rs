//! The design documents stay a map of the code: every reference to one from src/ names a
//! document that exists and, where it quotes a section, a heading that document has;
//! DESIGN.md's code map names every module in its folder's entry and stays within 32 KB;
//! README.md stays within 200 lines; azprov(8) names exactly the `azprov.*` words config.rs
//! reads.

use std::fs;
use std::path::{Path, PathBuf};

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every .rs file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `## ` and `### ` headings of a markdown file.
fn headings(doc: &str) -> Vec<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .map(|h| h.replace('`', ""))
        .collect()
}

/// The references in `text`: the document's name and, when one follows it as `, "…"`, the
/// section quoted (a comment may break the quote over lines: `//!` and `///` are dropped).
fn references(text: &str) -> Vec<(String, Option<String>)> {
    let flat: String = text
        .lines()
        .map(|l| {
            let t = l.trim_start();
            t.strip_prefix("//!")
                .or_else(|| t.strip_prefix("///"))
                .or_else(|| t.strip_prefix("//"))
                .unwrap_or(l)
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ");
    let mut refs = Vec::new();
    let mut rest = flat.as_str();
    while let Some(at) = rest.find("docs/") {
        rest = &rest[at + "docs/".len()..];
        let taken: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-' || *c == '.')
            .collect();
        // a reference that ends a sentence takes its full stop along
        let name = taken.trim_end_matches('.').to_owned();
        if !name.ends_with(".md") {
            continue;
        }
        let after = &rest[name.len()..];
        let section = after
            .strip_prefix(", \"")
            .and_then(|s| s.split_once('"'))
            .map(|(q, _)| q.to_owned());
        refs.push((name, section));
    }
    refs
}

#[test]
fn every_reference_from_src_to_a_design_document_resolves() {
    let mut files = Vec::new();
    rust_files(&top().join("src"), &mut files);
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("read");
        assert!(
            !text.contains("DESIGN.md §"),
            "{}: the documents' headings have no numbers; quote the heading instead",
            file.display()
        );
        for (name, section) in references(&text) {
            checked += 1;
            let Ok(doc) = fs::read_to_string(top().join("docs").join(&name)) else {
                broken.push(format!("{}: docs/{name} does not exist", file.display()));
                continue;
            };
            if let Some(section) = section {
                if !headings(&doc).iter().any(|h| h.starts_with(&section)) {
                    broken.push(format!(
                        "{}: docs/{name} has no heading \"{section}\"",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} references found: the scan is broken"
    );
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The code map's entry for `folder` (its `**`src/folder/`**` paragraph and bullets), or for a
/// file at the top of src/ the map's headings.
fn map_entry<'a>(map: &'a str, folder: &str) -> Option<&'a str> {
    let head = format!("**`src/{folder}/`**");
    let at = map.find(&head)?;
    let rest = &map[at + head.len()..];
    Some(&rest[..rest.find("\n**`src/").unwrap_or(rest.len())])
}

/// Each file is named in its folder's entry: `src/x.rs` in a heading, `folder/x.rs` as `x.rs`
/// in `folder`'s entry, `folder/sub/x.rs` as `sub/x.rs` there or as `x.rs` in the entry's bullet
/// for `sub/` (a basename elsewhere does not count).
#[test]
fn the_code_map_names_every_module() {
    let design = fs::read_to_string(top().join("docs/DESIGN.md")).expect("DESIGN.md");
    let start = design.find("## Code map").expect("a Code map section");
    let map = &design[start..];
    let map = &map[..map[3..].find("\n## ").map_or(map.len(), |e| e + 3)];
    let mut files = Vec::new();
    rust_files(&top().join("src"), &mut files);
    let mut missing = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(top().join("src")).expect("under src");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        // unit tests beside a module are the module's
        if parts.iter().any(|p| p == "tests.rs" || p == "tests") {
            continue;
        }
        let named = match parts.as_slice() {
            [file] => map.contains(&format!("`src/{file}`")),
            [folder, file] if file == "mod.rs" => map_entry(map, folder).is_some(),
            [folder, file] => {
                map_entry(map, folder).is_some_and(|e| e.contains(&format!("`{file}`")))
            }
            [folder, sub, file] => map_entry(map, folder).is_some_and(|e| {
                let bullet = e.split("\n- ").find(|b| {
                    b.starts_with(&format!("`{sub}/`")) || b.contains(&format!("`{sub}/` ("))
                });
                let file = if file == "mod.rs" {
                    String::new()
                } else {
                    file.clone()
                };
                e.contains(&format!("`{sub}/{file}`"))
                    || bullet.is_some_and(|b| file.is_empty() || b.contains(&format!("`{file}`")))
            }),
            _ => false,
        };
        if !named {
            missing.push(rel.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md's code map does not name in its folder's entry: {}",
        missing.join(", ")
    );
}

#[test]
fn the_design_map_is_at_most_32_kb() {
    let len = fs::metadata(top().join("docs/DESIGN.md"))
        .expect("DESIGN.md")
        .len();
    assert!(len <= 32 * 1024, "docs/DESIGN.md is {len} bytes");
}

#[test]
fn references_are_read_across_comment_lines() {
    let text = "//! see docs/contracts.md, \"The file\n//! contract\"; and docs/DESIGN.md.";
    assert_eq!(
        references(text),
        vec![
            (
                "contracts.md".to_owned(),
                Some("The file contract".to_owned())
            ),
            ("DESIGN.md".to_owned(), None),
        ]
    );
}

#[test]
fn the_readme_is_at_most_200_lines() {
    let readme = fs::read_to_string(top().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; details go to docs/"
    );
}

/// The `azprov.WORD` names in `text` (`azprov.` followed by lowercase letters).
fn azprov_words(text: &str) -> std::collections::BTreeSet<String> {
    text.match_indices("azprov.")
        .map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_lowercase())
                .unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Every `azprov.*` word of the kernel command line that config.rs reads is in azprov(8), and
/// azprov(8) names no word of the command line that config.rs does not read.
#[test]
fn the_command_line_words_are_the_man_pages() {
    let config = fs::read_to_string(top().join("src/config.rs")).expect("config.rs");
    let config = config.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    // the words as the parser matches them: string literals
    let read: std::collections::BTreeSet<String> = azprov_words(config)
        .into_iter()
        .filter(|w| config.contains(&format!("\"azprov.{w}\"")))
        .collect();
    let man = fs::read_to_string(top().join("docs/azprov.8")).expect("azprov.8");
    // files and units named azprov.something are not command-line words
    let not_words = ["conf", "log", "service", "json"];
    let documented: std::collections::BTreeSet<String> = azprov_words(&man)
        .into_iter()
        .filter(|w| read.contains(w) || !not_words.contains(&w.as_str()))
        .collect();
    assert!(read.len() >= 15, "config.rs reads {read:?}");
    assert_eq!(
        read, documented,
        "config.rs's azprov.* words against azprov(8)'s"
    );
}
