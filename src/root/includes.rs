//! Whether the root's sshd and sudo read azprov's drop-ins, and the edits that make its settings
//! count where they would not: pure text in, text out, every byte azprov does not own kept.
//!
//! sshd takes the first value it reads for a keyword, and reads `Include`d files where the
//! `Include` stands, so a drop-in counts only when an `Include` that covers it comes before any
//! other `PasswordAuthentication` and before the first `Match` block (RHEL 8, Debian 10 and many
//! hardened images have no `Include` at all). Where it would not count, the setting goes into
//! sshd_config itself, at its top, under a comment line that marks it as azprov's. sudo reads
//! /etc/sudoers.d only through an include directive; where there is none, one is appended as
//! cloud-init's `ensure_sudo_dir` does, in the `#includedir` spelling every sudo reads (1.8 on
//! RHEL 8 refuses `@includedir`, which 1.9.1 introduced).

use std::path::Path;

/// The comment line above azprov's setting in sshd_config.
pub const SSHD_MARK: &str =
    "# azprov: the VM's password login setting (azprov clean --user removes these two lines)";

/// sshd_config's words on a line: keyword (lower-cased) and arguments; None for comments.
fn sshd_words(line: &str) -> Option<(String, Vec<&str>)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    // `Keyword value` or `Keyword=value`
    let (key, rest) = match line.find(|c: char| c.is_whitespace() || c == '=') {
        Some(i) => (line.get(..i)?, line.get(i + 1..)?),
        None => (line, ""),
    };
    let rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == '=');
    Some((key.to_ascii_lowercase(), rest.split_whitespace().collect()))
}

/// Whether an `Include` argument (relative ones are under /etc/ssh) covers `drop_in`.
fn include_covers(arg: &str, drop_in: &str) -> bool {
    let arg = if arg.starts_with('/') {
        arg.to_string()
    } else {
        format!("/etc/ssh/{arg}")
    };
    let (Some(dir), Some(pattern)) = (Path::new(&arg).parent(), Path::new(&arg).file_name()) else {
        return false;
    };
    let (Some(want_dir), Some(name)) =
        (Path::new(drop_in).parent(), Path::new(drop_in).file_name())
    else {
        return false;
    };
    let pattern = pattern.to_string_lossy();
    // a bracket class is left to sshd: azprov then writes into sshd_config, which counts anyway
    dir == want_dir
        && !pattern.contains('[')
        && crate::glob::matches(&pattern, &name.to_string_lossy())
}

/// Whether sshd, reading `config`, takes `PasswordAuthentication` from `drop_in` first
/// (azprov's own lines from an earlier run aside: they go when the drop-in is written).
pub fn sshd_reads_first(config: &str, drop_in: &str) -> bool {
    let mut lines = config.lines();
    while let Some(line) = lines.next() {
        if line == SSHD_MARK {
            lines.next();
            continue;
        }
        let Some((key, args)) = sshd_words(line) else {
            continue;
        };
        match key.as_str() {
            "include" if args.iter().any(|a| include_covers(a, drop_in)) => return true,
            "passwordauthentication" | "match" => return false,
            _ => {}
        }
    }
    false
}

/// `config` with azprov's `PasswordAuthentication` as its first setting: the marked line
/// replaced where an earlier run put it, else the mark and the line put at the top.
pub fn sshd_with_setting(config: &[u8], password_auth: bool) -> Vec<u8> {
    let setting = format!(
        "PasswordAuthentication {}",
        if password_auth { "yes" } else { "no" }
    );
    let mut lines: Vec<&[u8]> = split_lines(config);
    match lines.iter().position(|l| *l == SSHD_MARK.as_bytes()) {
        Some(i) if lines.get(i + 1).is_some() => {
            if let Some(l) = lines.get_mut(i + 1) {
                *l = setting.as_bytes();
            }
        }
        Some(_) => lines.push(setting.as_bytes()),
        None => {
            lines.insert(0, setting.as_bytes());
            lines.insert(0, SSHD_MARK.as_bytes());
        }
    }
    join_lines(&lines, config)
}

/// `config` without azprov's two lines; None when it has none.
pub fn sshd_without_setting(config: &[u8]) -> Option<Vec<u8>> {
    let mut lines = split_lines(config);
    let i = lines.iter().position(|l| *l == SSHD_MARK.as_bytes())?;
    let end = (i + 2).min(lines.len());
    lines.drain(i..end);
    Some(join_lines(&lines, config))
}

/// Whether sudoers has an include directive for /etc/sudoers.d (`@includedir` or the older
/// `#includedir`, a trailing slash allowed).
pub fn sudoers_includes_dir(sudoers: &[u8]) -> bool {
    String::from_utf8_lossy(sudoers).lines().any(|l| {
        let mut w = l.split_whitespace();
        matches!(w.next(), Some("@includedir") | Some("#includedir"))
            && w.next().map(|d| d.trim_end_matches('/')) == Some("/etc/sudoers.d")
    })
}

/// `sudoers` with `#includedir /etc/sudoers.d` appended, every other byte kept.
pub fn sudoers_with_includedir(sudoers: &[u8]) -> Vec<u8> {
    let mut out = sudoers.to_vec();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(
        b"\n# added by azprov: read the drop-ins in /etc/sudoers.d\n#includedir /etc/sudoers.d\n",
    );
    out
}

fn split_lines(text: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// The lines joined again, with a final newline when `original` had one (or was empty).
fn join_lines(lines: &[&[u8]], original: &[u8]) -> Vec<u8> {
    let mut out = lines.join(&b'\n');
    if !out.is_empty() && (original.is_empty() || original.ends_with(b"\n")) {
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::root::SSHD_DROP_IN as DROP_IN;

    #[test]
    fn a_drop_in_counts_only_when_an_include_reads_it_first() {
        let yes = [
            "Include /etc/ssh/sshd_config.d/*.conf\nPasswordAuthentication yes\n",
            "# c\ninclude sshd_config.d/*.conf\n",
            "Include=/etc/ssh/sshd_config.d/*\n",
            "Include /etc/x.conf /etc/ssh/sshd_config.d/5?-*.conf\nMatch User x\n",
        ];
        for c in yes {
            assert!(sshd_reads_first(c, DROP_IN), "{c}");
        }
        let no = [
            "",
            "PasswordAuthentication yes\n",
            "PasswordAuthentication yes\nInclude /etc/ssh/sshd_config.d/*.conf\n",
            "Match User bob\n  Include /etc/ssh/sshd_config.d/*.conf\n",
            "#Include /etc/ssh/sshd_config.d/*.conf\n",
            "Include /etc/ssh/other.d/*.conf\n",
            "Include /etc/ssh/sshd_config.d/9*.conf\n",
            "Include /etc/ssh/sshd_config.d/[0-9]*.conf\n",
        ];
        for c in no {
            assert!(!sshd_reads_first(c, DROP_IN), "{c}");
        }
    }

    #[test]
    fn the_setting_goes_on_top_of_sshd_config_once_and_comes_out_again() {
        let rhel8 =
            b"#\t$OpenBSD$\n\nPasswordAuthentication yes\nMatch User bob\n\tX11Forwarding no";
        let once = sshd_with_setting(rhel8, false);
        let mut want = format!("{SSHD_MARK}\nPasswordAuthentication no\n").into_bytes();
        want.extend_from_slice(rhel8);
        assert_eq!(once, want, "{}", String::from_utf8_lossy(&once));
        // a second run replaces its own line, nothing else
        let twice = sshd_with_setting(&once, true);
        assert_eq!(
            twice,
            [
                format!("{SSHD_MARK}\nPasswordAuthentication yes\n").as_bytes(),
                rhel8.as_slice()
            ]
            .concat()
        );
        assert_eq!(sshd_without_setting(&twice).unwrap(), rhel8.to_vec());
        assert_eq!(sshd_without_setting(rhel8), None);
        // bytes that are not UTF-8 stay as they were
        let latin1 = b"# caf\xe9\nPort 22\n";
        let with = sshd_with_setting(latin1, false);
        assert!(with.ends_with(latin1));
        assert_eq!(sshd_without_setting(&with).unwrap(), latin1.to_vec());
        assert_eq!(
            sshd_with_setting(b"", true),
            format!("{SSHD_MARK}\nPasswordAuthentication yes\n").into_bytes()
        );
    }

    #[test]
    fn sudoers_gets_its_includedir_appended_when_it_has_none() {
        assert!(sudoers_includes_dir(
            b"root ALL=(ALL) ALL\n@includedir /etc/sudoers.d\n"
        ));
        assert!(sudoers_includes_dir(b"#includedir /etc/sudoers.d/\n"));
        assert!(!sudoers_includes_dir(b"# #includedir /etc/sudoers.d\n"));
        assert!(!sudoers_includes_dir(b"@includedir /etc/other.d\n"));
        let hardened = b"Defaults env_reset\nroot ALL=(ALL:ALL) ALL";
        let out = sudoers_with_includedir(hardened);
        assert_eq!(
            out,
            b"Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n\n# added by azprov: read the drop-ins in /etc/sudoers.d\n#includedir /etc/sudoers.d\n".to_vec()
        );
        assert!(sudoers_includes_dir(&out));
    }
}
