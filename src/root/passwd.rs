//! The account files' format: colon-separated tables (passwd, shadow, group, gshadow) read and
//! edited in memory, byte for byte where untouched, and login.defs' settings.

use super::{Sysroot, WriteError};
use crate::secret::Secret;

/// `KEY VALUE` settings from /etc/login.defs.
pub(super) fn login_defs(text: &str, key: &str) -> Option<u32> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(key))
                .then(|| w.next().and_then(|v| v.parse().ok()))
                .flatten()
        })
}

/// The lines of a colon-separated account file, as bytes: lines azprov does not edit are
/// written back byte for byte, whatever their encoding (a GECOS field in Latin-1 stays so).
pub(super) struct Table(pub(super) Vec<Vec<u8>>);

fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| *b == b':')
}

impl Table {
    pub(super) fn parse(bytes: Option<Vec<u8>>) -> Table {
        let bytes = bytes.unwrap_or_default();
        let mut lines: Vec<Vec<u8>> = bytes.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        Table(lines)
    }

    pub(super) fn find(&self, name: &str) -> Option<usize> {
        self.0
            .iter()
            .position(|l| fields(l).next() == Some(name.as_bytes()))
    }

    /// Field `n` of line `i` (text fields only: ids, home, shell).
    pub(super) fn field(&self, i: usize, n: usize) -> Option<&str> {
        self.0
            .get(i)
            .and_then(|l| fields(l).nth(n))
            .and_then(|f| std::str::from_utf8(f).ok())
    }

    pub(super) fn ids(&self, n: usize) -> Vec<u32> {
        self.0
            .iter()
            .filter_map(|l| std::str::from_utf8(fields(l).nth(n)?).ok()?.parse().ok())
            .collect()
    }

    pub(super) fn set_field(&mut self, i: usize, n: usize, value: &[u8]) {
        if let Some(line) = self.0.get_mut(i) {
            let mut f: Vec<&[u8]> = fields(line).collect();
            while f.len() <= n {
                f.push(b"");
            }
            if let Some(slot) = f.get_mut(n) {
                *slot = value;
            }
            *line = f.join(&b':');
        }
    }

    pub(super) fn push(&mut self, line: String) {
        self.0.push(line.into_bytes());
    }

    /// Drops the lines whose fields `drop` picks.
    pub(super) fn remove_where(&mut self, drop: impl Fn(&[&[u8]]) -> bool) {
        self.0.retain(|l| !drop(&fields(l).collect::<Vec<_>>()));
    }

    /// Removes `name` from the comma-separated member lists in fields `cols` of every line.
    pub(super) fn drop_member(&mut self, cols: &[usize], name: &str) {
        for i in 0..self.0.len() {
            for &n in cols {
                let Some(members) = self.0.get(i).and_then(|l| fields(l).nth(n)) else {
                    continue;
                };
                let kept: Vec<&[u8]> = members
                    .split(|b| *b == b',')
                    .filter(|m| !m.is_empty() && *m != name.as_bytes())
                    .collect();
                let kept = kept.join(&b',');
                if kept.as_slice() != members {
                    self.set_field(i, n, &kept);
                }
            }
        }
    }

    /// The account other than `except` that has `uid`, when a passwd line gives one.
    pub(super) fn name_of_uid(&self, uid: u32, except: &str) -> Option<String> {
        (0..self.0.len()).find_map(|i| {
            let u: u32 = self.field(i, 2)?.parse().ok()?;
            let who = self.field(i, 0)?;
            (u == uid && who != except).then(|| who.to_string())
        })
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let mut s = self.0.join(&b'\n');
        s.push(b'\n');
        s
    }
}

/// Days since 1970-01-01: shadow's "last change" field.
fn days_since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0)
}

/// login.defs' uid and gid ranges for accounts that log in (shadow's defaults without it).
pub(super) struct IdRanges {
    pub(super) uid: (u32, u32),
    pub(super) gid: (u32, u32),
}

impl IdRanges {
    pub(super) fn from_defs(defs: &str) -> Self {
        IdRanges {
            uid: (
                login_defs(defs, "UID_MIN").unwrap_or(1000),
                login_defs(defs, "UID_MAX").unwrap_or(60000),
            ),
            gid: (
                login_defs(defs, "GID_MIN").unwrap_or(1000),
                login_defs(defs, "GID_MAX").unwrap_or(60000),
            ),
        }
    }
}

/// passwd, shadow, group and gshadow as read, edited in memory.
pub(super) struct AccountFiles {
    pub(super) passwd: Table,
    pub(super) shadow: Table,
    pub(super) group: Table,
    pub(super) gshadow: Table,
    pub(super) gshadow_present: bool,
}

impl AccountFiles {
    pub(super) fn read(root: &Sysroot) -> Result<Self, WriteError> {
        Ok(AccountFiles {
            passwd: Table::parse(root.read("/etc/passwd")?),
            shadow: Table::parse(root.read("/etc/shadow")?),
            group: Table::parse(root.read("/etc/group")?),
            gshadow_present: root.exists("/etc/gshadow"),
            gshadow: Table::parse(root.read("/etc/gshadow")?),
        })
    }

    /// shadow: the hash, or locked ("!") for a new account without a password.
    pub(super) fn set_password(&mut self, name: &str, hash: Option<&Secret<String>>) {
        match self.shadow.find(name) {
            Some(i) => {
                if let Some(h) = hash {
                    self.shadow.set_field(i, 1, h.expose().as_bytes());
                    self.shadow
                        .set_field(i, 2, days_since_epoch().to_string().as_bytes());
                }
            }
            None => {
                let pw = hash.map_or("!", |h| h.expose().as_str());
                self.shadow
                    .push(format!("{name}:{pw}:{}:0:99999:7:::", days_since_epoch()));
            }
        }
    }
}
