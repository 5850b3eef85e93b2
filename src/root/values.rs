//! The values written into a root, as types that cannot hold bad ones: parse once at the
//! boundary, then trust.

use std::fmt;

/// A value from metadata that one of these types refused, with what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    Hostname {
        value: String,
        why: &'static str,
    },
    Username {
        value: String,
        why: &'static str,
    },
    /// An SSH key line that is not one; only its first characters are kept.
    SshKey {
        start: String,
    },
    /// An SSH key line longer than `SSH_KEY_MAX` bytes (an RSA-16384 key is about 2.8 KiB).
    SshKeyTooLong {
        len: usize,
    },
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Hostname { value, why } => write!(f, "invalid hostname {value:?}: {why}"),
            Invalid::Username { value, why } => write!(f, "invalid username {value:?}: {why}"),
            Invalid::SshKey { start } => write!(f, "not an OpenSSH public key: {start:?}…"),
            Invalid::SshKeyTooLong { len } => {
                write!(f, "an SSH key of {len} bytes (more than {SSH_KEY_MAX})")
            }
        }
    }
}

impl std::error::Error for Invalid {}

/// A hostname as `/etc/hostname` takes it: RFC 1123 labels (letters, digits, hyphens, not at
/// a label's ends), at most 64 characters, Linux's HOST_NAME_MAX and Azure's limit for a
/// computer name (longer names are truncated, as afterburn does; 63 is DNS's limit for one
/// label, not for the name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostname(String);

pub const HOSTNAME_MAX: usize = 64;

impl Hostname {
    pub fn parse(s: &str) -> Result<Hostname, Invalid> {
        let s = s.trim();
        let cut: String = s.chars().take(HOSTNAME_MAX).collect();
        // A trailing dot is the DNS root; a hyphen left at the end by truncation is dropped.
        let cut = if s.chars().count() > HOSTNAME_MAX {
            cut.trim_end_matches(['.', '-'])
        } else {
            cut.trim_end_matches('.')
        };
        if cut.is_empty() {
            return Err(Invalid::Hostname {
                value: s.to_string(),
                why: "empty",
            });
        }
        for label in cut.split('.') {
            let ok = !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(Invalid::Hostname {
                    value: s.to_string(),
                    why: "not an RFC 1123 name",
                });
            }
        }
        Ok(Hostname(cut.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A POSIX portable user name (letters, digits, `.`, `_`, `-`; not starting with `-` or a
/// digit; at most 32 characters). Whether it collides with a system account is decided
/// against the root's /etc/passwd when writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Username(String);

impl Username {
    pub fn parse(s: &str) -> Result<Username, Invalid> {
        let s = s.trim();
        let first_ok = s
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        let rest_ok = s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !first_ok || !rest_ok || s.len() > 32 {
            return Err(Invalid::Username {
                value: s.to_string(),
                why: "not a POSIX portable name",
            });
        }
        if s == "root" {
            return Err(Invalid::Username {
                value: s.to_string(),
                why: "a system account",
            });
        }
        Ok(Username(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Username {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One OpenSSH public key line: `[options] TYPE BASE64 [comment]`, no CR/LF inside. The
/// options field is read as sshd reads it: up to the first white space outside double quotes
/// (`command="echo ssh-rsa AAAA"` is an option, not a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshKey {
    line: String,
    /// Where TYPE starts in `line`.
    type_at: usize,
}

const KEY_TYPES: [&str; 6] = [
    "ssh-rsa",
    "ssh-ed25519",
    "ssh-dss",
    "ecdsa-sha2-",
    "sk-ssh-ed25519@",
    "sk-ecdsa-sha2-",
];

/// The longest key line accepted.
pub const SSH_KEY_MAX: usize = 16 * 1024;

/// The most keys written for one user; more are dropped with a warning (OpenSSH has no limit,
/// but thousands of lines only slow every login down).
pub const SSH_KEYS_MAX: usize = 1000;

/// A key type name: one of the known prefixes, and nothing but the characters type names are
/// made of (`ssh-dss="…` is an option, not a type).
fn is_key_type(w: &str) -> bool {
    KEY_TYPES.iter().any(|t| w.starts_with(t))
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'@' | b'.'))
}

/// The byte where the options field of `line` ends (white space outside double quotes, a
/// backslash escaping the next byte inside them); None when a quote is left open.
fn options_end(line: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return Some(i),
            _ => {}
        }
    }
    (!quoted).then_some(line.len())
}

impl SshKey {
    pub fn parse(s: &str) -> Result<SshKey, Invalid> {
        if s.len() > SSH_KEY_MAX {
            return Err(Invalid::SshKeyTooLong { len: s.len() });
        }
        let line: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        let line = line.trim().to_string();
        let invalid = || Invalid::SshKey {
            start: line.chars().take(24).collect(),
        };
        // a line that starts with its type has no options; else the options field comes first
        let first = line.split_whitespace().next().unwrap_or("");
        let type_at = if is_key_type(first) {
            0
        } else {
            let end = options_end(&line).ok_or_else(invalid)?;
            let rest = line.get(end..).ok_or_else(invalid)?;
            end + (rest.len() - rest.trim_start().len())
        };
        let mut words = line.get(type_at..).unwrap_or("").split_whitespace();
        let ok = words.next().is_some_and(is_key_type)
            && words.next().is_some_and(|b64| {
                b64.len() >= 16
                    && b64
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
            });
        if !ok {
            return Err(invalid());
        }
        Ok(SshKey { line, type_at })
    }

    pub fn as_str(&self) -> &str {
        &self.line
    }

    /// The options field (`command="…",no-pty`), empty when there is none.
    pub fn options(&self) -> &str {
        self.line.get(..self.type_at).unwrap_or("").trim_end()
    }

    /// The key without options and comment (TYPE BASE64), for de-duplication.
    pub fn identity(&self) -> String {
        self.line
            .get(self.type_at..)
            .unwrap_or("")
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Where a value came from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Imds,
    Ovf,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Imds => "IMDS",
            Source::Ovf => "ovf-env.xml",
        })
    }
}

/// A key and the file metadata asked for (honoured only inside the user's home).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    pub key: SshKey,
    pub path: Option<String>,
    pub source: Source,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_keys_are_refused() {
        let big = format!("ssh-rsa {}", "A".repeat(SSH_KEY_MAX));
        assert_eq!(
            SshKey::parse(&big),
            Err(Invalid::SshKeyTooLong { len: big.len() })
        );
    }

    #[test]
    fn hostnames() {
        assert_eq!(Hostname::parse("vm-1").unwrap().as_str(), "vm-1");
        assert_eq!(
            Hostname::parse(" web01.example.com \n").unwrap().as_str(),
            "web01.example.com"
        );
        let long = "a".repeat(70);
        assert_eq!(Hostname::parse(&long).unwrap().as_str().len(), 64);
        // a 64-character name, as Azure allows and sethostname takes, is kept whole
        let max = format!("{}.{}", "a".repeat(31), "b".repeat(32));
        assert_eq!(Hostname::parse(&max).unwrap().as_str(), max);
        // truncation never leaves a trailing hyphen or dot
        let edge = format!("{}-b", "a".repeat(63));
        assert_eq!(Hostname::parse(&edge).unwrap().as_str(), "a".repeat(63));
        for bad in [
            "",
            "-vm",
            "vm-",
            "under_score",
            "sp ace",
            "a..b",
            "vm;reboot",
            "ümlaut",
        ] {
            assert!(Hostname::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn usernames() {
        for ok in ["azureuser", "a", "_svc", "john.doe", "x-y_z1"] {
            assert!(Username::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "root",
            "-x",
            "1abc",
            "a b",
            "a:b",
            "a/b",
            &"u".repeat(33),
        ] {
            assert!(Username::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys() {
        let k = SshKey::parse("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2 me@host\r\n").unwrap();
        assert_eq!(
            k.as_str(),
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2 me@host"
        );
        assert_eq!(k.identity(), "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2");
        let opt = SshKey::parse("no-pty ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB other").unwrap();
        assert_eq!(opt.identity(), "ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB");
        for bad in [
            "",
            "hello world",
            "ssh-rsa",
            "ssh-rsa short",
            "ssh-rsa AAAA$$$$$$$$$$$$$$$$",
        ] {
            assert!(SshKey::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_options_field_is_read_quote_aware_as_sshd_reads_it() {
        const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2";
        // a key-type word inside a quoted option is part of the option
        let k = SshKey::parse(&format!(
            "command=\"echo ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB\",no-pty {ED} me"
        ))
        .unwrap();
        assert_eq!(k.identity(), ED);
        assert_eq!(
            k.options(),
            "command=\"echo ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB\",no-pty"
        );
        // an escaped quote does not end the quoted part
        let k = SshKey::parse(&format!("command=\"a \\\" b\" {ED}")).unwrap();
        assert_eq!(k.identity(), ED);
        assert_eq!(SshKey::parse(ED).unwrap().options(), "");
        for bad in [
            // the only key words are inside the quotes: no key at all
            "command=\"echo ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB\"",
            "command=\"echo ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB\" no-key-here",
            // a quote left open
            "command=\"/bin/false ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2",
            // two option fields
            "no-pty no-agent-forwarding ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2",
        ] {
            assert!(SshKey::parse(bad).is_err(), "{bad}");
        }
        // the fuzzer's find (fuzz/artifacts/authorized_keys/crash-efd36b9b…): an option that
        // starts like a type name is an option; the identity is the words after it
        let k = SshKey::parse(
            "ssh-dss=\"echo255\u{1}[\\ssh-\0d2\0/19\t\t AAAAC1llZDIE5AAAAIK2 me@host",
        );
        assert!(k.is_err(), "{k:?}");
        let k = SshKey::parse(&format!("ssh-dss=\"a b\"\t\t{ED}\tme")).unwrap();
        assert_eq!(k.identity(), ED);
        assert_eq!(k.options(), "ssh-dss=\"a b\"");
    }
}
