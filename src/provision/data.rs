//! Types that cannot hold bad values: parse once at the boundary, then trust.

use crate::secret::Secret;
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

/// One OpenSSH public key line: `[options] TYPE BASE64 [comment]`, no CR/LF inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshKey(String);

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

impl SshKey {
    pub fn parse(s: &str) -> Result<SshKey, Invalid> {
        if s.len() > SSH_KEY_MAX {
            return Err(Invalid::SshKeyTooLong { len: s.len() });
        }
        let line: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        let line = line.trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        let type_at = words
            .iter()
            .position(|w| KEY_TYPES.iter().any(|t| w.starts_with(t)));
        let ok = type_at.is_some_and(|i| {
            words.get(i + 1).is_some_and(|b64| {
                b64.len() >= 16
                    && b64
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
            })
        });
        if !ok {
            return Err(Invalid::SshKey {
                start: line.chars().take(24).collect(),
            });
        }
        Ok(SshKey(line.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key without options and comment, for de-duplication.
    pub fn identity(&self) -> String {
        let words: Vec<&str> = self.0.split_whitespace().collect();
        let i = words
            .iter()
            .position(|w| KEY_TYPES.iter().any(|t| w.starts_with(t)))
            .unwrap_or(0);
        words
            .iter()
            .skip(i)
            .take(2)
            .copied()
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

/// Everything that is written into the root, validated.
#[derive(Debug, Clone)]
pub struct ProvisioningData {
    pub vm_id: Option<String>,
    pub hostname: (Hostname, Source),
    pub username: (Username, Source),
    pub keys: Vec<KeyEntry>,
    pub password: Option<Secret<String>>,
    /// `PasswordAuthentication no` when true.
    pub disable_password_auth: Option<(bool, Source)>,
    pub custom_data: Option<Secret<Vec<u8>>>,
    pub user_data: Option<Secret<Vec<u8>>>,
    pub imds_json: Option<Secret<Vec<u8>>>,
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
}
