//! Every write into the real root (DESIGN.md §3). Paths are resolved inside the root the way a
//! chroot would see them, and a symlink that would lead out of it is refused; files are written
//! atomically (temp file in the same directory, fsync, rename, fsync of the directory) with
//! their mode and owner set before the rename. No useradd, passwd or hostnamectl: an initramfs
//! has none of them.

use super::data::{Hostname, KeyEntry, ProvisioningData, Username};
use super::Failure;
use crate::secret::Secret;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

pub const MARKER: &str = "/var/lib/azprov/provisioned";
pub const STATE_DIR: &str = "/var/lib/azprov";
pub const LOG_FILE: &str = "/var/log/azprov.log";

#[derive(Debug)]
pub enum WriteError {
    /// A symlink on the way leads out of the root (or `..` climbs above it).
    Escape(String),
    /// A path that must not be a symlink is one (e.g. `~/.ssh`).
    Symlink(String),
    Io {
        op: &'static str,
        path: String,
        source: io::Error,
    },
    /// The user name belongs to a system account (uid below UID_MIN).
    SystemAccount {
        name: String,
        uid: u32,
    },
    /// No free uid or gid in the login.defs range.
    NoFreeId,
    Corrupt(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Escape(p) => write!(f, "{p}: a symlink leads out of the root"),
            WriteError::Symlink(p) => write!(f, "{p} is a symlink; refusing to write through it"),
            WriteError::Io { op, path, source } => write!(f, "{op} {path}: {source}"),
            WriteError::SystemAccount { name, uid } => {
                write!(f, "{name} is an existing system account (uid {uid})")
            }
            WriteError::NoFreeId => write!(f, "no free uid/gid in the login.defs range"),
            WriteError::Corrupt(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for WriteError {}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WriteError + 'a {
    move |source| WriteError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// The mounted real root, and every write azprov makes into it.
pub struct Sysroot {
    root: PathBuf,
}

impl Sysroot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysroot { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Maps an absolute path of the root's own view (`/etc/passwd`) to a host path, following
    /// symlinks in the directories on the way with the root as `/`. The last component is not
    /// followed: atomic writes replace it.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, WriteError> {
        let mut pending: VecDeque<OsString> = VecDeque::new();
        for c in Path::new(path).components() {
            match c {
                Component::Normal(n) => pending.push_back(n.to_owned()),
                Component::ParentDir => pending.push_back("..".into()),
                _ => {}
            }
        }
        let last = pending
            .pop_back()
            .ok_or_else(|| WriteError::Corrupt(format!("empty path {path:?}")))?;
        let mut cur: Vec<OsString> = Vec::new();
        let mut links = 0;
        while let Some(c) = pending.pop_front() {
            if c == ".." {
                cur.pop()
                    .ok_or_else(|| WriteError::Escape(path.to_string()))?;
                continue;
            }
            let here: PathBuf = self
                .root
                .iter()
                .chain(cur.iter().map(|s| s.as_ref()))
                .collect::<PathBuf>()
                .join(&c);
            match fs::symlink_metadata(&here) {
                Ok(md) if md.file_type().is_symlink() => {
                    links += 1;
                    if links > 40 {
                        return Err(WriteError::Escape(path.to_string()));
                    }
                    let target = fs::read_link(&here).map_err(io_err("readlink", &here))?;
                    if target.is_absolute() {
                        cur.clear();
                    }
                    let mut parts: Vec<OsString> = Vec::new();
                    for t in target.components() {
                        match t {
                            Component::Normal(n) => parts.push(n.to_owned()),
                            Component::ParentDir => parts.push("..".into()),
                            _ => {}
                        }
                    }
                    for p in parts.into_iter().rev() {
                        pending.push_front(p);
                    }
                }
                _ => cur.push(c),
            }
        }
        if last == ".." {
            return Err(WriteError::Escape(path.to_string()));
        }
        let mut out = self.root.clone();
        out.extend(cur);
        out.push(last);
        Ok(out)
    }

    /// Like `resolve`, and follows the last component too (for an executable such as init).
    pub fn resolve_full(&self, path: &str) -> Result<PathBuf, WriteError> {
        let mut p = path.to_string();
        for _ in 0..40 {
            let host = self.resolve(&p)?;
            match fs::read_link(&host) {
                Ok(target) => {
                    let t = target.to_string_lossy().into_owned();
                    p = if target.is_absolute() {
                        t
                    } else {
                        let parent = Path::new(&p).parent().unwrap_or(Path::new("/"));
                        parent.join(t).to_string_lossy().into_owned()
                    };
                }
                Err(_) => return Ok(host),
            }
        }
        Err(WriteError::Escape(path.to_string()))
    }

    pub fn read(&self, path: &str) -> Result<Option<Vec<u8>>, WriteError> {
        let p = self.resolve(path)?;
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &p)(e)),
        }
    }

    /// Whether `path` exists as the root sees it (symlinks followed inside the root).
    pub fn exists(&self, path: &str) -> bool {
        self.resolve_full(path)
            .map(|p| fs::symlink_metadata(p).is_ok())
            .unwrap_or(false)
    }

    /// Creates `path` and its missing parents (parents 0755 root, the last one `mode`).
    pub fn mkdir(&self, path: &str, mode: u32, owner: (u32, u32)) -> Result<PathBuf, WriteError> {
        let p = self.resolve(path)?;
        if let Ok(md) = fs::symlink_metadata(&p) {
            if md.file_type().is_symlink() {
                return Err(WriteError::Symlink(path.to_string()));
            }
            return Ok(p);
        }
        if let Some(parent) = Path::new(path).parent().filter(|p| *p != Path::new("/")) {
            let parent = parent.to_string_lossy();
            self.mkdir(&parent, 0o755, (0, 0))?;
        }
        fs::create_dir(&p).map_err(io_err("mkdir", &p))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &p))?;
        std::os::unix::fs::lchown(&p, Some(owner.0), Some(owner.1)).map_err(io_err("chown", &p))?;
        Ok(p)
    }

    /// Writes `data` to `path` atomically with this mode and owner.
    pub fn write(
        &self,
        path: &str,
        data: &[u8],
        mode: u32,
        owner: (u32, u32),
    ) -> Result<(), WriteError> {
        let p = self.resolve(path)?;
        write_atomic(&p, data, mode, owner)
    }

    /// Rewrites an existing file keeping its mode and owner (passwd, shadow, hosts…).
    fn rewrite(&self, path: &str, data: &[u8], default_mode: u32) -> Result<(), WriteError> {
        let p = self.resolve(path)?;
        let (mode, owner) = match fs::metadata(&p) {
            Ok(md) => (md.mode() & 0o7777, (md.uid(), md.gid())),
            Err(_) => (default_mode, (0, 0)),
        };
        write_atomic(&p, data, mode, owner)
    }
}

/// temp file in the same directory, mode and owner set, fsync, rename, fsync the directory.
pub fn write_atomic(p: &Path, data: &[u8], mode: u32, owner: (u32, u32)) -> Result<(), WriteError> {
    let dir = p
        .parent()
        .ok_or_else(|| WriteError::Corrupt(format!("{} has no parent", p.display())))?;
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.azprov-tmp"));
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.write_all(data).map_err(io_err("write", &tmp))?;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &tmp))?;
        std::os::unix::fs::fchown(&f, Some(owner.0), Some(owner.1))
            .map_err(io_err("chown", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        fs::rename(&tmp, p).map_err(io_err("rename", p))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

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

fn crypt_sha512(password: &str, salt: &str) -> Result<String, WriteError> {
    let params = sha_crypt::Sha512Params::new(5000)
        .map_err(|_| WriteError::Corrupt("crypt parameters".into()))?;
    let hash = sha_crypt::sha512_crypt_b64(password.as_bytes(), salt.as_bytes(), &params)
        .map_err(|_| WriteError::Corrupt("crypt failed".into()))?;
    Ok(format!("$6${salt}${hash}"))
}

impl Sysroot {
    pub fn write_hostname(&self, h: &Hostname) -> Result<(), WriteError> {
        self.write("/etc/hostname", format!("{h}\n").as_bytes(), 0o644, (0, 0))?;
        // 127.0.1.1 maps the hostname, as Debian's installer writes it.
        let old = self
            .read("/etc/hosts")?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|| "127.0.0.1\tlocalhost\n".into());
        let entry = format!("127.0.1.1\t{h}");
        let mut replaced = false;
        let mut lines: Vec<String> = old
            .lines()
            .map(|l| {
                if l.split_whitespace().next() == Some("127.0.1.1") {
                    replaced = true;
                    entry.clone()
                } else {
                    l.to_string()
                }
            })
            .collect();
        if !replaced {
            let at = lines
                .iter()
                .position(|l| l.split_whitespace().next() == Some("127.0.0.1"))
                .map_or(0, |i| i + 1);
            lines.insert(at.min(lines.len()), entry);
        }
        let mut text = lines.join("\n");
        text.push('\n');
        self.rewrite("/etc/hosts", text.as_bytes(), 0o644)
    }

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

    fn login_shell(&self) -> String {
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

    /// Merges keys into the user's authorized_keys files without duplicates. A metadata `path`
    /// is honoured only inside the home; `~/.ssh` must not be a symlink.
    pub fn write_keys(
        &self,
        account: &Account,
        user: &Username,
        keys: &[KeyEntry],
    ) -> Result<Vec<String>, WriteError> {
        let default = format!("{}/.ssh/authorized_keys", account.home);
        let mut files: Vec<(String, Vec<&KeyEntry>)> = Vec::new();
        for k in keys {
            let wanted = k.path.as_deref().map(|p| p.replace("$HOME", "/home"));
            let path = match wanted {
                Some(p) if inside_home(&p, &account.home) => p,
                Some(p) => {
                    log::warn!("key path {p} is outside {}'s home; using {default}", user);
                    default.clone()
                }
                None => default.clone(),
            };
            match files.iter_mut().find(|(f, _)| *f == path) {
                Some((_, list)) => list.push(k),
                None => files.push((path, vec![k])),
            }
        }
        let owner = (account.uid, account.gid);
        let ssh_dir = format!("{}/.ssh", account.home);
        let resolved = self.resolve(&ssh_dir)?;
        if let Ok(md) = fs::symlink_metadata(&resolved) {
            if md.file_type().is_symlink() {
                return Err(WriteError::Symlink(ssh_dir));
            }
        }
        self.mkdir(&ssh_dir, 0o700, owner)?;
        fs::set_permissions(&resolved, fs::Permissions::from_mode(0o700))
            .map_err(io_err("chmod", &resolved))?;
        std::os::unix::fs::lchown(&resolved, Some(owner.0), Some(owner.1))
            .map_err(io_err("chown", &resolved))?;
        let mut written = Vec::new();
        for (path, list) in files {
            let p = self.resolve(&path)?;
            // never through a symlink below the (checked) home, such as ~/.ssh/x -> /etc
            if !p.starts_with(self.resolve(&account.home)?) {
                return Err(WriteError::Escape(path));
            }
            if let Ok(md) = fs::symlink_metadata(&p) {
                if md.file_type().is_symlink() {
                    return Err(WriteError::Symlink(path));
                }
            }
            if let Some(parent) = Path::new(&path).parent() {
                self.mkdir(&parent.to_string_lossy(), 0o700, owner)?;
            }
            let existing = match fs::read(&p) {
                Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(io_err("read", &p)(e)),
            };
            let mut lines: Vec<String> = existing.lines().map(str::to_string).collect();
            let have: Vec<String> = lines
                .iter()
                .filter_map(|l| super::data::SshKey::parse(l).ok().map(|k| k.identity()))
                .collect();
            for k in list {
                if !have.contains(&k.key.identity())
                    && !lines.iter().any(|l| l.trim() == k.key.as_str())
                {
                    lines.push(k.key.as_str().to_string());
                }
            }
            let mut text = lines.join("\n");
            text.push('\n');
            write_atomic(&p, text.as_bytes(), 0o600, owner)?;
            written.push(path);
        }
        Ok(written)
    }

    pub fn write_sudoers(&self, user: &Username, has_password: bool) -> Result<(), WriteError> {
        self.mkdir("/etc/sudoers.d", 0o750, (0, 0))?;
        let rule = if has_password { "ALL" } else { "NOPASSWD:ALL" };
        let text = format!("# written by azprov\n{user} ALL=(ALL) {rule}\n");
        self.write("/etc/sudoers.d/90-azprov", text.as_bytes(), 0o440, (0, 0))
    }

    /// Writes the sshd drop-in when the root's sshd reads drop-ins; returns whether it did.
    pub fn write_sshd(&self, password_auth: bool) -> Result<bool, WriteError> {
        let dir = self.resolve("/etc/ssh/sshd_config.d")?;
        if !fs::symlink_metadata(&dir)
            .map(|m| m.is_dir())
            .unwrap_or(false)
        {
            return Ok(false);
        }
        let text = format!(
            "# written by azprov\nPasswordAuthentication {}\n",
            if password_auth { "yes" } else { "no" }
        );
        self.write(
            "/etc/ssh/sshd_config.d/50-azprov.conf",
            text.as_bytes(),
            0o644,
            (0, 0),
        )?;
        Ok(true)
    }

    pub fn write_state(&self, name: &str, data: &[u8]) -> Result<(), WriteError> {
        self.mkdir(STATE_DIR, 0o700, (0, 0))?;
        self.write(&format!("{STATE_DIR}/{name}"), data, 0o600, (0, 0))
    }

    pub fn read_marker(&self) -> Option<String> {
        self.read(MARKER)
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
    }
}

fn inside_home(path: &str, home: &str) -> bool {
    let p = Path::new(path);
    p.is_absolute()
        && !p.components().any(|c| c == Component::ParentDir)
        && p.starts_with(home)
        && p != Path::new(home)
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

/// Writes all of `data` into the root in the order of DESIGN.md §3, the marker last.
/// Each step's failure has its own reason string.
pub fn write_all(root: &Sysroot, data: &ProvisioningData, vm_id: &str) -> Result<(), Failure> {
    let fail = |reason: &'static str| move |e: WriteError| Failure::new(reason, e.to_string());
    let user = &data.username.0;
    root.write_hostname(&data.hostname.0)
        .map_err(fail("failed to write hostname"))?;
    let account = root
        .ensure_user(user, data.password.as_ref())
        .map_err(|e| match e {
            WriteError::SystemAccount { .. } => Failure::new("invalid username", e.to_string()),
            e => Failure::new("failed to create user", e.to_string()),
        })?;
    log::info!(
        "user {user} (uid {}, {}) from {}",
        account.uid,
        if account.created {
            "created"
        } else {
            "existing"
        },
        data.username.1
    );
    if !data.keys.is_empty() {
        let files = root
            .write_keys(&account, user, &data.keys)
            .map_err(fail("failed to write authorized_keys"))?;
        log::info!("{} SSH key(s) into {}", data.keys.len(), files.join(", "));
    }
    root.write_sudoers(user, data.password.is_some())
        .map_err(fail("failed to write sudoers"))?;
    let password_auth = match data.disable_password_auth {
        Some((disable, _)) => !disable,
        None => data.password.is_some(),
    };
    if root
        .write_sshd(password_auth)
        .map_err(fail("failed to write sshd configuration"))?
    {
        log::info!(
            "sshd PasswordAuthentication {}",
            if password_auth { "yes" } else { "no" }
        );
    }
    if let Some(c) = &data.custom_data {
        root.write_state("customdata", c.expose())
            .map_err(fail("failed to write custom data"))?;
    }
    if let Some(u) = &data.user_data {
        root.write_state("userdata", u.expose())
            .map_err(fail("failed to write user data"))?;
    }
    if let Some(j) = &data.imds_json {
        root.write_state("imds.json", j.expose())
            .map_err(fail("failed to write instance metadata"))?;
    }
    root.write_state("provisioned", format!("{vm_id}\n").as_bytes())
        .map_err(fail("failed to write provisioned marker"))
}

#[cfg(test)]
mod tests;
