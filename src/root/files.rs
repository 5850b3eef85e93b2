//! The other files of the contract: hostname and hosts, authorized_keys, the sudoers and sshd
//! drop-ins, and azprov's state directory.

use super::accounts::Account;
use super::values::{Hostname, KeyEntry, SshKey, Username};
use super::{includes, io_err, Sysroot, WriteError, MARKER, STATE_DIR};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path};

/// sshd's main configuration file.
pub const SSHD_CONFIG: &str = "/etc/ssh/sshd_config";
/// The sudoers drop-in azprov writes (and `clean --user` removes).
pub const SUDOERS: &str = "/etc/sudoers.d/90-azprov";
/// The sshd drop-in azprov writes where sshd_config includes sshd_config.d first.
pub const SSHD_DROP_IN: &str = "/etc/ssh/sshd_config.d/50-azprov.conf";

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
        let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
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
            match index.get(&path) {
                Some(&i) => {
                    if let Some((_, list)) = files.get_mut(i) {
                        list.push(k);
                    }
                }
                None => {
                    index.insert(path.clone(), files.len());
                    files.push((path, vec![k]));
                }
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
        self.owners.set(&resolved, None, owner)?;
        // The metadata's own paths first: one that cannot be written safely (a symlink, a
        // path leading out of the home) hands its keys to the default file instead of failing
        // the whole run, so the user can still log in.
        let mut written = Vec::new();
        let (own, default_group): (Vec<_>, Vec<_>) =
            files.into_iter().partition(|(p, _)| *p != default);
        let mut fallback: Vec<&KeyEntry> = default_group.into_iter().flat_map(|(_, l)| l).collect();
        for (path, list) in own {
            match self.merge_keys(&path, &account.home, &list, owner) {
                Ok(()) => written.push(path),
                Err(e) => {
                    log::warn!("key path {path}: {e}; using {default}");
                    fallback.extend(list);
                }
            }
        }
        if !fallback.is_empty() {
            self.merge_keys(&default, &account.home, &fallback, owner)?;
            written.push(default);
        }
        Ok(written)
    }

    /// Adds `list` to one authorized_keys file below `home`, keeping what it holds.
    fn merge_keys(
        &self,
        path: &str,
        home: &str,
        list: &[&KeyEntry],
        owner: (u32, u32),
    ) -> Result<(), WriteError> {
        let path = path.to_string();
        {
            let p = self.resolve(&path)?;
            // never through a symlink below the (checked) home, such as ~/.ssh/x -> /etc
            if !p.starts_with(self.resolve(home)?) {
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
            // the line each key is on; the metadata's line replaces an image's line for the
            // same key (a `command="/bin/false"` there must not become the admin's login), as
            // cloud-init does
            let mut at: std::collections::HashMap<String, usize> = lines
                .iter()
                .enumerate()
                .filter_map(|(i, l)| SshKey::parse(l).ok().map(|k| (k.identity(), i)))
                .collect();
            for k in list {
                match at.get(&k.key.identity()) {
                    Some(&i) => {
                        if let Some(l) = lines.get_mut(i) {
                            *l = k.key.as_str().to_string();
                        }
                    }
                    None => {
                        at.insert(k.key.identity(), lines.len());
                        lines.push(k.key.as_str().to_string());
                    }
                }
            }
            let mut text = lines.join("\n");
            text.push('\n');
            self.replace(&p, text.as_bytes(), 0o600, owner)
        }
    }

    /// The sudoers drop-in, and `#includedir /etc/sudoers.d` appended to /etc/sudoers when it
    /// reads no drop-ins (so the rule counts; `includes`).
    pub fn write_sudoers(&self, user: &Username, has_password: bool) -> Result<(), WriteError> {
        self.mkdir("/etc/sudoers.d", 0o750, (0, 0))?;
        let rule = if has_password { "ALL" } else { "NOPASSWD:ALL" };
        let text = format!("# written by azprov\n{user} ALL=(ALL) {rule}\n");
        self.write(SUDOERS, text.as_bytes(), 0o440, (0, 0))?;
        if let Some(sudoers) = self.read("/etc/sudoers")? {
            if !includes::sudoers_includes_dir(&sudoers) {
                self.rewrite(
                    "/etc/sudoers",
                    &includes::sudoers_with_includedir(&sudoers),
                    0o440,
                )?;
                log::info!("sudo: /etc/sudoers read no /etc/sudoers.d; #includedir added");
            }
        }
        Ok(())
    }

    /// Puts sshd's `PasswordAuthentication` where the root's sshd takes it from: the drop-in
    /// when sshd_config reads it first, else the top of sshd_config itself (`includes`).
    /// Which one, or None when the root has no sshd_config.
    pub fn write_sshd(&self, password_auth: bool) -> Result<Option<&'static str>, WriteError> {
        let Some(config) = self.read(SSHD_CONFIG)? else {
            return Ok(None);
        };
        let dir = self.resolve("/etc/ssh/sshd_config.d")?;
        let dir_ok = fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        if dir_ok && includes::sshd_reads_first(&String::from_utf8_lossy(&config), SSHD_DROP_IN) {
            let text = format!(
                "# written by azprov\nPasswordAuthentication {}\n",
                if password_auth { "yes" } else { "no" }
            );
            self.write(SSHD_DROP_IN, text.as_bytes(), 0o644, (0, 0))?;
            // an earlier run's lines in sshd_config itself would win over the drop-in
            if let Some(without) = includes::sshd_without_setting(&config) {
                self.rewrite(SSHD_CONFIG, &without, 0o644)?;
            }
            return Ok(Some(SSHD_DROP_IN));
        }
        self.rewrite(
            SSHD_CONFIG,
            &includes::sshd_with_setting(&config, password_auth),
            0o644,
        )?;
        Ok(Some(SSHD_CONFIG))
    }

    /// Takes azprov's lines out of sshd_config (`azprov clean --user`); whether there were any.
    pub fn remove_sshd_setting(&self, dry_run: bool) -> Result<bool, WriteError> {
        let Some(config) = self.read(SSHD_CONFIG)? else {
            return Ok(false);
        };
        let Some(without) = includes::sshd_without_setting(&config) else {
            return Ok(false);
        };
        if !dry_run {
            self.rewrite(SSHD_CONFIG, &without, 0o644)?;
        }
        Ok(true)
    }

    pub fn write_state(&self, name: &str, data: &[u8]) -> Result<(), WriteError> {
        let dir = self.mkdir(STATE_DIR, 0o700, (0, 0))?;
        // azprov's own directory: whatever mode an earlier run or the image left, it is private
        match fs::symlink_metadata(&dir) {
            Ok(md) if md.mode() & 0o7777 != 0o700 || md.uid() != 0 => {
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                    .map_err(io_err("chmod", &dir))?;
                self.owners.set(&dir, None, (0, 0))?;
            }
            _ => {}
        }
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
