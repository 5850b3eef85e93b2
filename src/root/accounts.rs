//! The account files: passwd, shadow, group and gshadow edited in place, the password hashed
//! with SHA-512 crypt, a new home filled from /etc/skel.

use super::passwd::{login_defs, AccountFiles, IdRanges, Table};
use super::{io_err, Sysroot, WriteError, STATE_DIR};

/// The file in azprov's state directory that names the user azprov created.
pub const OWNED_USER: &str = "user";
use super::values::Username;
use crate::secret::Secret;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;

/// The account azprov made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub created: bool,
}

/// SHA-512 crypt (`$6$`) with a random 16-character salt and the default 5000 rounds: the
/// string shadow holds, as secret as the password.
pub fn hash_password(password: &Secret<String>) -> Result<Secret<String>, WriteError> {
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
    crypt_sha512(password.expose(), &salt).map(Secret::new)
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
    /// new home from /etc/skel. `hash` is the password's crypt string ([`hash_password`]);
    /// none locks a new account.
    pub fn ensure_user(
        &self,
        user: &Username,
        hash: Option<&Secret<String>>,
    ) -> Result<Account, WriteError> {
        let _lock = self.lock_account_files()?;
        let defs = self
            .read("/etc/login.defs")?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let ids = IdRanges::from_defs(&defs);
        let name = user.as_str();
        let mut files = AccountFiles::read(self)?;
        let account = match files.passwd.find(name) {
            Some(i) => self.existing_account(&files.passwd, i, name, &ids)?,
            None => self.new_account(&mut files, name, &ids)?,
        };
        files.set_password(name, hash);
        self.write_account_files(&files, &account, name, &defs)?;
        if !self.exists(&account.home) {
            self.make_home(&account)?;
        } else {
            self.claim_home(&account, name, &files.passwd)?;
        }
        Ok(account)
    }

    /// The account `name` that passwd has at line `i`, when it may be the admin.
    fn existing_account(
        &self,
        passwd: &Table,
        i: usize,
        name: &str,
        ids: &IdRanges,
    ) -> Result<Account, WriteError> {
        let uid: u32 = passwd.field(i, 2).and_then(|v| v.parse().ok()).unwrap_or(0);
        // `nobody` (65534), root, daemons: never the admin with sudo and the keys
        if uid < ids.uid.0 || uid > ids.uid.1 || uid == 0 {
            return Err(WriteError::SystemAccount {
                name: name.to_string(),
                uid,
            });
        }
        let shell = passwd.field(i, 6).unwrap_or("");
        if shell.ends_with("/nologin") || shell.ends_with("/false") {
            return Err(WriteError::NoLogin {
                name: name.to_string(),
                shell: shell.to_string(),
            });
        }
        let gid = passwd
            .field(i, 3)
            .and_then(|v| v.parse().ok())
            .unwrap_or(uid);
        let home = passwd.field(i, 5).unwrap_or("").to_string();
        // a user an interrupted run of azprov's created is still azprov's
        Ok(Account {
            uid,
            gid,
            home,
            created: self.owned_user().as_deref() == Some(name),
        })
    }

    /// A new account `name` added to `files` (passwd, and group and gshadow where it has no
    /// line yet), with the lowest free uid and a primary group, azprov's claim on it on disk
    /// first.
    fn new_account(
        &self,
        files: &mut AccountFiles,
        name: &str,
        ids: &IdRanges,
    ) -> Result<Account, WriteError> {
        let (gid_min, gid_max) = ids.gid;
        let used_uids = files.passwd.ids(2);
        let used_gids = files.group.ids(2);
        let uid = (ids.uid.0..=ids.uid.1)
            .find(|u| !used_uids.contains(u))
            .ok_or(WriteError::NoFreeId)?;
        // a group already named like the user becomes its primary group, unless it is a
        // system group (the user would get its files' group rights)
        let same_name = files
            .group
            .find(name)
            .map(|g| files.group.field(g, 2).and_then(|v| v.parse::<u32>().ok()));
        let gid = if let Some(existing) = same_name {
            match existing {
                Some(g) if g >= gid_min && g <= gid_max => g,
                g => {
                    return Err(WriteError::SystemGroup {
                        name: name.to_string(),
                        gid: g.unwrap_or(0),
                    })
                }
            }
        } else if used_gids.contains(&uid) || uid < gid_min || uid > gid_max {
            (gid_min..=gid_max)
                .find(|g| !used_gids.contains(g))
                .ok_or(WriteError::NoFreeId)?
        } else {
            uid
        };
        let home = format!("/home/{name}");
        let shell = self.login_shell();
        // azprov's claim on the user is on disk before passwd names it (the barrier in
        // write_account_files renames it with group and shadow; passwd goes after), so `clean
        // --user` removes an admin whose first boot was cut short anywhere after that
        self.write_state(OWNED_USER, format!("{name}\n").as_bytes())?;
        files
            .passwd
            .push(format!("{name}:x:{uid}:{gid}::{home}:{shell}"));
        // each file on its own: a run interrupted between the rewrites left some of them
        if files.group.find(name).is_none() {
            files.group.push(format!("{name}:x:{gid}:"));
        }
        if files.gshadow_present && files.gshadow.find(name).is_none() {
            files.gshadow.push(format!("{name}:!::"));
        }
        Ok(Account {
            uid,
            gid,
            home,
            created: true,
        })
    }

    /// The account files into place. Group and gshadow first (on disk before passwd in a batch
    /// too), so a passwd entry never names a missing group; in a batch they go into place
    /// together or, when one cannot be written, none of them does (a group without its
    /// gshadow line). Each secondary file is renamed before its primary (gshadow before group,
    /// shadow before passwd): a cut between two renames leaves no entry without its secondary
    /// line. A new account's subordinate id ranges go with them.
    fn write_account_files(
        &self,
        files: &AccountFiles,
        account: &Account,
        name: &str,
        defs: &str,
    ) -> Result<(), WriteError> {
        let together = || -> Result<(), WriteError> {
            if files.gshadow_present {
                self.rewrite("/etc/gshadow", &files.gshadow.bytes(), 0o640)?;
            }
            self.rewrite("/etc/group", &files.group.bytes(), 0o644)?;
            self.rewrite("/etc/shadow", &files.shadow.bytes(), 0o640)?;
            if account.created {
                for (file, kind) in [("/etc/subuid", "UID"), ("/etc/subgid", "GID")] {
                    self.add_subordinate_ids(file, kind, name, defs)?;
                }
            }
            Ok(())
        };
        if let Err(e) = together() {
            let files = [
                "/etc/group",
                "/etc/gshadow",
                "/etc/shadow",
                "/etc/subuid",
                "/etc/subgid",
            ];
            let targets: Vec<_> = files
                .iter()
                .filter_map(|f| self.resolve_full(f).ok())
                .collect();
            self.discard(&targets);
            return Err(e);
        }
        self.barrier()?;
        self.rewrite("/etc/passwd", &files.passwd.bytes(), 0o644)
    }

    /// The user azprov created in this root (`/var/lib/azprov/user`), if any.
    pub fn owned_user(&self) -> Option<String> {
        let b = self
            .read(&format!("{STATE_DIR}/{OWNED_USER}"))
            .ok()
            .flatten()?;
        let name = String::from_utf8_lossy(&b).trim().to_string();
        (!name.is_empty()).then_some(name)
    }

    /// The home directory /etc/passwd names for `name`, or None when there is no such user.
    pub fn user_home(&self, name: &str) -> Result<Option<String>, WriteError> {
        let passwd = Table::parse(self.read("/etc/passwd")?);
        Ok(passwd
            .find(name)
            .map(|i| passwd.field(i, 5).unwrap_or("").to_string()))
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
        let me = name.as_bytes();
        let mut shadow = Table::parse(self.read("/etc/shadow")?);
        shadow.remove_where(|f| f.first() == Some(&me));
        let mut group = Table::parse(self.read("/etc/group")?);
        group.remove_where(|f| f.first() == Some(&me) && f.get(2) == Some(&gid.as_bytes()));
        group.drop_member(&[3], name);
        let own_group_left = group.find(name).is_some();
        self.rewrite("/etc/passwd", &passwd.bytes(), 0o644)?;
        self.rewrite("/etc/shadow", &shadow.bytes(), 0o640)?;
        if self.exists("/etc/gshadow") {
            let mut gshadow = Table::parse(self.read("/etc/gshadow")?);
            gshadow.remove_where(|f| f.first() == Some(&me) && !own_group_left);
            gshadow.drop_member(&[2, 3], name);
            self.rewrite("/etc/gshadow", &gshadow.bytes(), 0o640)?;
        }
        self.rewrite("/etc/group", &group.bytes(), 0o644)?;
        for file in ["/etc/subuid", "/etc/subgid"] {
            if let Some(bytes) = self.read(file)? {
                let mut t = Table::parse(Some(bytes));
                let before = t.0.len();
                t.remove_where(|f| f.first() == Some(&me));
                if t.0.len() != before {
                    self.rewrite(file, &t.bytes(), 0o644)?;
                }
            }
        }
        Ok(Some(home))
    }

    /// /bin/bash where the root has it (what cloud-init and waagent give the admin), else
    /// useradd's default (`SHELL=` in /etc/default/useradd), else /bin/sh.
    pub(super) fn login_shell(&self) -> String {
        if self.exists("/bin/bash") {
            return "/bin/bash".into();
        }
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
        from_defaults
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/bin/sh".into())
    }

    /// shadow-utils' `lckpwdf`: /etc/.pwd.lock (0600 root, created when missing) locked with
    /// an fcntl write lock while the account files are read and edited, so a useradd or passwd
    /// running beside azprov (hook mode, `clean` in a booted system) cannot interleave. Waits
    /// at most 15 s for it, as lckpwdf does, and never past the run's deadline. Released when
    /// the file is dropped.
    fn lock_account_files(&self) -> Result<fs::File, WriteError> {
        const LOCK: &str = "/etc/.pwd.lock";
        let p = self.resolve(LOCK)?;
        let created = !p.exists();
        let f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .map_err(io_err("open", &p))?;
        if created {
            self.label(&p, libc::S_IFREG)?;
        }
        let deadline = self.wait_budget(std::time::Duration::from_secs(15));
        super::fcntl_lock(&f, LOCK, deadline)?;
        Ok(f)
    }

    /// A subordinate id range for a new user in /etc/subuid or /etc/subgid, as useradd gives
    /// one where the file exists (rootless containers need it): `SUB_UID_COUNT` (or `_GID_`)
    /// ids from login.defs, the lowest free range between `SUB_UID_MIN` and `SUB_UID_MAX`. A
    /// count of 0, a name already listed or no free range adds nothing.
    fn add_subordinate_ids(
        &self,
        file: &str,
        kind: &str,
        name: &str,
        defs: &str,
    ) -> Result<(), WriteError> {
        let Some(bytes) = self.read(file)? else {
            return Ok(());
        };
        let def = |k: &str, d: u32| login_defs(defs, &format!("SUB_{kind}_{k}")).unwrap_or(d);
        let (min, max, count) = (
            def("MIN", 100_000),
            def("MAX", 600_100_000),
            def("COUNT", 65_536),
        );
        let mut table = Table::parse(Some(bytes));
        if count == 0 || table.find(name).is_some() {
            return Ok(());
        }
        let taken: Vec<(u64, u64)> = (0..table.0.len())
            .filter_map(|i| {
                let start: u64 = table.field(i, 1)?.parse().ok()?;
                let n: u64 = table.field(i, 2)?.parse().ok()?;
                Some((start, start + n))
            })
            .collect();
        let Some(start) = free_range(taken, u64::from(min), u64::from(max), u64::from(count))
        else {
            log::warn!("{file}: no free range of {count} ids between {min} and {max}; none given");
            return Ok(());
        };
        table.push(format!("{name}:{start}:{count}"));
        self.rewrite(file, &table.bytes(), 0o644)
    }
}

/// The lowest start of `count` ids in `[min, max]` that overlap none of the `taken` ranges
/// (start, end exclusive).
pub(super) fn free_range(
    mut taken: Vec<(u64, u64)>,
    min: u64,
    max: u64,
    count: u64,
) -> Option<u64> {
    taken.sort_unstable();
    let mut start = min;
    for (s, e) in taken {
        if e <= start {
            continue;
        }
        if s >= start + count {
            break;
        }
        start = e;
    }
    (start + count - 1 <= max).then_some(start)
}
