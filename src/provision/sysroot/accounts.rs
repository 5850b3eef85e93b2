//! The account files: passwd, shadow, group and gshadow edited in place, the password hashed
//! with SHA-512 crypt, a new home filled from /etc/skel.

use super::{io_err, write_atomic, Sysroot, WriteError};
use crate::provision::data::Username;
use crate::secret::Secret;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// `KEY VALUE` settings from /etc/login.defs.
fn login_defs(text: &str, key: &str) -> Option<u32> {
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

/// The lines of a colon-separated account file.
struct Table(Vec<String>);

impl Table {
    fn parse(bytes: Option<Vec<u8>>) -> Table {
        let text = bytes
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Table(text.lines().map(str::to_string).collect())
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.0
            .iter()
            .position(|l| l.split(':').next() == Some(name))
    }

    fn field(&self, i: usize, n: usize) -> Option<&str> {
        self.0.get(i).and_then(|l| l.split(':').nth(n))
    }

    fn ids(&self, n: usize) -> Vec<u32> {
        self.0
            .iter()
            .filter_map(|l| l.split(':').nth(n)?.parse().ok())
            .collect()
    }

    fn set_field(&mut self, i: usize, n: usize, value: &str) {
        if let Some(line) = self.0.get_mut(i) {
            let mut f: Vec<&str> = line.split(':').collect();
            while f.len() <= n {
                f.push("");
            }
            if let Some(slot) = f.get_mut(n) {
                *slot = value;
            }
            *line = f.join(":");
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut s = self.0.join("\n");
        s.push('\n');
        s.into_bytes()
    }
}

/// The account azprov made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub created: bool,
}

fn days_since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0)
}

/// SHA-512 crypt (`$6$`) with a random 16-character salt and the default 5000 rounds.
pub fn hash_password(password: &Secret<String>) -> Result<String, WriteError> {
    const SALT_CHARS: &[u8] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut raw = [0u8; 16];
    crate::sys::random_bytes(&mut raw);
    let salt: String = raw
        .iter()
        .map(|b| {
            char::from(
                SALT_CHARS
                    .get(usize::from(*b) % SALT_CHARS.len())
                    .copied()
                    .unwrap_or(b'.'),
            )
        })
        .collect();
    crypt_sha512(password.expose(), &salt)
}

pub(super) fn crypt_sha512(password: &str, salt: &str) -> Result<String, WriteError> {
    let params = sha_crypt::Sha512Params::new(5000)
        .map_err(|_| WriteError::Corrupt("crypt parameters".into()))?;
    let hash = sha_crypt::sha512_crypt_b64(password.as_bytes(), salt.as_bytes(), &params)
        .map_err(|_| WriteError::Corrupt("crypt failed".into()))?;
    Ok(format!("$6${salt}${hash}"))
}

impl Sysroot {
    /// Creates the user (or finds it), edits passwd/shadow/group/gshadow in place, and fills a
    /// new home from /etc/skel. A password is stored hashed; none locks the account.
    pub fn ensure_user(
        &self,
        user: &Username,
        password: Option<&Secret<String>>,
    ) -> Result<Account, WriteError> {
        let defs = self
            .read("/etc/login.defs")?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let uid_min = login_defs(&defs, "UID_MIN").unwrap_or(1000);
        let uid_max = login_defs(&defs, "UID_MAX").unwrap_or(60000);
        let gid_min = login_defs(&defs, "GID_MIN").unwrap_or(1000);
        let gid_max = login_defs(&defs, "GID_MAX").unwrap_or(60000);
        let name = user.as_str();

        let mut passwd = Table::parse(self.read("/etc/passwd")?);
        let mut shadow = Table::parse(self.read("/etc/shadow")?);
        let mut group = Table::parse(self.read("/etc/group")?);
        let gshadow_present = self.exists("/etc/gshadow");
        let mut gshadow = Table::parse(self.read("/etc/gshadow")?);

        let hash = password.map(hash_password).transpose()?;
        let account = if let Some(i) = passwd.find(name) {
            let uid: u32 = passwd.field(i, 2).and_then(|v| v.parse().ok()).unwrap_or(0);
            if uid < uid_min {
                return Err(WriteError::SystemAccount {
                    name: name.to_string(),
                    uid,
                });
            }
            let gid = passwd
                .field(i, 3)
                .and_then(|v| v.parse().ok())
                .unwrap_or(uid);
            let home = passwd.field(i, 5).unwrap_or("").to_string();
            Account {
                uid,
                gid,
                home,
                created: false,
            }
        } else {
            let used_uids = passwd.ids(2);
            let used_gids = group.ids(2);
            let uid = (uid_min..=uid_max)
                .find(|u| !used_uids.contains(u))
                .ok_or(WriteError::NoFreeId)?;
            let gid = if used_gids.contains(&uid) || uid < gid_min || uid > gid_max {
                (gid_min..=gid_max)
                    .find(|g| !used_gids.contains(g))
                    .ok_or(WriteError::NoFreeId)?
            } else {
                uid
            };
            let home = format!("/home/{name}");
            let shell = self.login_shell();
            passwd
                .0
                .push(format!("{name}:x:{uid}:{gid}::{home}:{shell}"));
            if group.find(name).is_none() {
                group.0.push(format!("{name}:x:{gid}:"));
                if gshadow_present {
                    gshadow.0.push(format!("{name}:!::"));
                }
            }
            Account {
                uid,
                gid,
                home,
                created: true,
            }
        };
        // shadow: the hash, or locked ("!") for a new account without a password
        match shadow.find(name) {
            Some(i) => {
                if let Some(h) = &hash {
                    shadow.set_field(i, 1, h);
                    shadow.set_field(i, 2, &days_since_epoch().to_string());
                }
            }
            None => {
                let pw = hash.clone().unwrap_or_else(|| "!".into());
                shadow
                    .0
                    .push(format!("{name}:{pw}:{}:0:99999:7:::", days_since_epoch()));
            }
        }
        // group and gshadow first, so a passwd entry never names a missing group
        self.rewrite("/etc/group", &group.bytes(), 0o644)?;
        if gshadow_present {
            self.rewrite("/etc/gshadow", &gshadow.bytes(), 0o640)?;
        }
        self.rewrite("/etc/shadow", &shadow.bytes(), 0o640)?;
        self.rewrite("/etc/passwd", &passwd.bytes(), 0o644)?;

        if !self.exists(&account.home) {
            self.mkdir(&account.home, 0o750, (account.uid, account.gid))?;
            self.copy_skel(&account)?;
        }
        Ok(account)
    }

    /// Removes `name` from passwd and shadow, its own group (named like it, its primary gid)
    /// from group and gshadow, and its name from other groups' member lists; the other lines
    /// stay as they were. Returns the home directory passwd named, or None when no such user.
    /// group and gshadow go last, so passwd never names a missing group.
    pub fn remove_user(&self, name: &str) -> Result<Option<String>, WriteError> {
        let mut passwd = Table::parse(self.read("/etc/passwd")?);
        let Some(i) = passwd.find(name) else {
            return Ok(None);
        };
        let home = passwd.field(i, 5).unwrap_or("").to_string();
        let gid = passwd.field(i, 3).unwrap_or("").to_string();
        passwd.0.remove(i);
        let mut shadow = Table::parse(self.read("/etc/shadow")?);
        shadow.0.retain(|l| l.split(':').next() != Some(name));
        let drop_member = |members: &str| -> String {
            members
                .split(',')
                .filter(|m| !m.is_empty() && *m != name)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut group = Table::parse(self.read("/etc/group")?);
        group
            .0
            .retain(|l| !(l.split(':').next() == Some(name) && l.split(':').nth(2) == Some(&gid)));
        for i in 0..group.0.len() {
            if let Some(m) = group.field(i, 3).map(drop_member) {
                group.set_field(i, 3, &m);
            }
        }
        self.rewrite("/etc/passwd", &passwd.bytes(), 0o644)?;
        self.rewrite("/etc/shadow", &shadow.bytes(), 0o640)?;
        if self.exists("/etc/gshadow") {
            let mut gshadow = Table::parse(self.read("/etc/gshadow")?);
            gshadow
                .0
                .retain(|l| l.split(':').next() != Some(name) || group.find(name).is_some());
            for i in 0..gshadow.0.len() {
                for n in [2, 3] {
                    if let Some(m) = gshadow.field(i, n).map(drop_member) {
                        gshadow.set_field(i, n, &m);
                    }
                }
            }
            self.rewrite("/etc/gshadow", &gshadow.bytes(), 0o640)?;
        }
        self.rewrite("/etc/group", &group.bytes(), 0o644)?;
        Ok(Some(home))
    }

    pub(super) fn login_shell(&self) -> String {
        let from_defaults = self
            .read("/etc/default/useradd")
            .ok()
            .flatten()
            .and_then(|b| {
                String::from_utf8_lossy(&b).lines().find_map(|l| {
                    l.trim()
                        .strip_prefix("SHELL=")
                        .map(|s| s.trim().to_string())
                })
            });
        from_defaults.filter(|s| !s.is_empty()).unwrap_or_else(|| {
            if self.exists("/bin/bash") {
                "/bin/bash".into()
            } else {
                "/bin/sh".into()
            }
        })
    }

    fn copy_skel(&self, account: &Account) -> Result<(), WriteError> {
        let skel = self.resolve("/etc/skel")?;
        // a real directory only: a symlinked skel could point anywhere on the host
        if !fs::symlink_metadata(&skel)
            .map(|m| m.is_dir())
            .unwrap_or(false)
        {
            return Ok(());
        }
        let home = self.resolve(&account.home)?;
        copy_tree(&skel, &home, (account.uid, account.gid))
    }
}

fn copy_tree(from: &Path, to: &Path, owner: (u32, u32)) -> Result<(), WriteError> {
    for entry in fs::read_dir(from).map_err(io_err("read", from))? {
        let entry = entry.map_err(io_err("read", from))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let md = fs::symlink_metadata(&src).map_err(io_err("stat", &src))?;
        if md.file_type().is_symlink() {
            let target = fs::read_link(&src).map_err(io_err("readlink", &src))?;
            std::os::unix::fs::symlink(&target, &dst).map_err(io_err("symlink", &dst))?;
        } else if md.is_dir() {
            fs::create_dir(&dst).map_err(io_err("mkdir", &dst))?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(md.mode() & 0o7777))
                .map_err(io_err("chmod", &dst))?;
            copy_tree(&src, &dst, owner)?;
        } else if md.is_file() {
            let data = fs::read(&src).map_err(io_err("read", &src))?;
            write_atomic(&dst, &data, md.mode() & 0o7777, owner)?;
            continue;
        } else {
            continue;
        }
        std::os::unix::fs::lchown(&dst, Some(owner.0), Some(owner.1))
            .map_err(io_err("chown", &dst))?;
    }
    Ok(())
}
