//! SELinux file labels computed from a root's own policy files, as libselinux's file backend
//! computes them (`selabel_lookup`, what `restorecon` and `setfiles` apply): no libselinux, no
//! policy loaded, no label name known in advance (Debian's refpolicy and Fedora's targeted
//! policy name them differently).
//!
//! libselinux reads `file_contexts`, then `file_contexts.homedirs` and `file_contexts.local`,
//! into one list; it moves the specifications without regex meta-characters (exact paths) to
//! the end, keeping the order of each kind, and takes the last one that matches, so an exact
//! path wins over any expression and a later expression over an earlier one. A specification
//! may name a file type (`--` regular file, `-d` directory, `-l` symlink, …) and then matches
//! only that type. Before the lookup a path is rewritten by `file_contexts.subs` and then
//! `file_contexts.subs_dist` (`/var/run /run`: a path under the first is looked up under the
//! second). `<<none>>` means "leave it unlabelled".

pub mod regex;

use regex::Regex;
use std::sync::OnceLock;

/// The policy a root is configured with (`/etc/selinux/config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `enforcing` or `permissive`.
    pub mode: String,
    /// `SELINUXTYPE`: the directory under /etc/selinux that holds the policy.
    pub policy: String,
}

impl Config {
    /// `SELINUX=` and `SELINUXTYPE=` of /etc/selinux/config; None when SELinux is disabled
    /// there (or the file says nothing).
    pub fn parse(text: &str) -> Option<Config> {
        let value = |key: &str| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        let mode = value("SELINUX")?.to_ascii_lowercase();
        if mode != "enforcing" && mode != "permissive" {
            return None;
        }
        let policy = value("SELINUXTYPE").unwrap_or_else(|| "targeted".into());
        // a policy name is one directory under /etc/selinux
        if policy.is_empty() || policy.contains('/') || policy.starts_with('.') {
            return None;
        }
        Some(Config { mode, policy })
    }

    /// The policy's file_contexts, as a path in the root.
    pub fn file_contexts(&self) -> String {
        format!("/etc/selinux/{}/contexts/files/file_contexts", self.policy)
    }
}

/// One line of a file_contexts file.
#[derive(Debug)]
struct Spec {
    pattern: String,
    /// The bytes every match starts with (a quick test before the expression's).
    prefix: Vec<u8>,
    /// `S_IFMT` bits this specification is for; 0 for every type.
    file_type: u32,
    /// None for `<<none>>`.
    context: Option<String>,
    /// The expression, compiled on first use (a root's policy has thousands; a run looks up
    /// a few dozen paths); None when it does not compile.
    regex: OnceLock<Option<Regex>>,
}

/// A root's file contexts, ready for lookups.
#[derive(Debug, Default)]
pub struct FileContexts {
    specs: Vec<Spec>,
    subs: Vec<(String, String)>,
    dist_subs: Vec<(String, String)>,
}

impl FileContexts {
    /// `texts`: file_contexts, file_contexts.homedirs and file_contexts.local in that order
    /// (the missing ones left out); `subs` and `dist_subs` the two substitution files' texts.
    /// Malformed lines are skipped (libselinux refuses the whole file; a label for every other
    /// path is worth more here) and counted in the second value.
    pub fn parse(texts: &[&str], subs: &str, dist_subs: &str) -> (FileContexts, usize) {
        let mut bad = 0;
        let (mut regexes, mut exact) = (Vec::new(), Vec::new());
        for line in texts.iter().flat_map(|t| t.lines()) {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let (pattern, kind, context) = match words.as_slice() {
                [p, c] => (*p, None, *c),
                [p, t, c] => (*p, Some(*t), *c),
                _ => {
                    bad += 1;
                    continue;
                }
            };
            let file_type = match kind.map(file_type) {
                None => 0,
                Some(Some(t)) => t,
                Some(None) => {
                    bad += 1;
                    continue;
                }
            };
            let spec = Spec {
                pattern: pattern.to_string(),
                prefix: literal_prefix(pattern),
                file_type,
                context: (context != "<<none>>").then(|| context.to_string()),
                regex: OnceLock::new(),
            };
            if has_meta(pattern) {
                regexes.push(spec);
            } else {
                exact.push(spec);
            }
        }
        regexes.extend(exact);
        let fc = FileContexts {
            specs: regexes,
            subs: parse_subs(subs),
            dist_subs: parse_subs(dist_subs),
        };
        (fc, bad)
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The context for `path` (absolute, as the root sees it) of file type `kind` (`S_IFMT`
    /// bits of its mode; 0 for any), or None when no specification gives one.
    pub fn lookup(&self, path: &str, kind: u32) -> Option<&str> {
        let mut key = path.to_string();
        while key.contains("//") {
            key = key.replace("//", "/");
        }
        let key = match substitute(&self.subs, &key) {
            Some(k) => substitute(&self.dist_subs, &k).unwrap_or(k),
            None => substitute(&self.dist_subs, &key).unwrap_or(key),
        };
        let kind = kind & libc::S_IFMT;
        let spec = self.specs.iter().rev().find(|s| {
            (kind == 0 || s.file_type == 0 || s.file_type == kind)
                && key.as_bytes().starts_with(&s.prefix)
                && s.regex
                    .get_or_init(|| match Regex::anchored(&s.pattern) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            log::warn!("selinux: file_contexts expression {}: {e}", s.pattern);
                            None
                        }
                    })
                    .as_ref()
                    .is_some_and(|r| r.is_match(key.as_bytes()))
        })?;
        spec.context.as_deref()
    }
}

fn file_type(t: &str) -> Option<u32> {
    Some(match t {
        "--" => libc::S_IFREG,
        "-d" => libc::S_IFDIR,
        "-l" => libc::S_IFLNK,
        "-c" => libc::S_IFCHR,
        "-b" => libc::S_IFBLK,
        "-s" => libc::S_IFSOCK,
        "-p" => libc::S_IFIFO,
        _ => return None,
    })
}

/// libselinux's `spec_hasMetaChars`: any of `.^$?*+|[({` not escaped by a backslash.
fn has_meta(pattern: &str) -> bool {
    let mut bytes = pattern.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => {
                bytes.next();
            }
            b'.' | b'^' | b'$' | b'?' | b'*' | b'+' | b'|' | b'[' | b'(' | b'{' => return true,
            _ => {}
        }
    }
    false
}

/// The literal bytes every match of `pattern` starts with: up to the first meta-character,
/// less the last byte when a quantifier that allows none of it follows; nothing when a `|`
/// outside any group makes two expressions of it.
fn literal_prefix(pattern: &str) -> Vec<u8> {
    let b = pattern.as_bytes();
    let (mut depth, mut i, mut class) = (0usize, 0, false);
    while let Some(&c) = b.get(i) {
        match c {
            b'\\' => i += 1,
            b']' if class => class = false,
            _ if class => {}
            b'[' => class = true,
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b'|' if depth == 0 => return Vec::new(),
            _ => {}
        }
        i += 1;
    }
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'\\' => match b.get(i + 1) {
                Some(e) if !e.is_ascii_alphanumeric() => {
                    out.push(*e);
                    i += 2;
                    continue;
                }
                _ => break,
            },
            b'?' | b'*' | b'{' => {
                out.pop();
                break;
            }
            b'.' | b'^' | b'$' | b'+' | b'|' | b'[' | b'(' | b')' => break,
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

/// The lines of a substitution file, the last one first (libselinux prepends each line to
/// its list and takes the first that applies).
fn parse_subs(text: &str) -> Vec<(String, String)> {
    let mut subs: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect();
    subs.reverse();
    subs
}

/// `key` with the first applicable alias replaced: `/var/run/x` under `/var/run /run` is
/// `/run/x`; an alias applies to itself and what is below it, never to `/var/running`.
fn substitute(subs: &[(String, String)], key: &str) -> Option<String> {
    subs.iter().find_map(|(alias, real)| {
        let rest = key.strip_prefix(alias.as_str())?;
        if !rest.is_empty() && !rest.starts_with('/') {
            return None;
        }
        let rest = if real == "/" {
            rest.strip_prefix('/').unwrap_or(rest)
        } else {
            rest
        };
        Some(format!("{real}{rest}"))
    })
}

#[cfg(test)]
mod tests;
