//! The mounted real root (docs/contracts.md, "The file contract"): paths resolved inside it the way
//! a chroot would see them (a symlink that would lead out of it is refused), and atomic writes
//! (temp file in the same directory, fsync, rename, fsync of the directory; in a batch, every temp
//! file, one syncfs, the renames, one syncfs) with mode and owner set before the rename. The
//! account files are edited in `accounts`, the other files of the contract written in `files`. No
//! useradd, passwd or hostnamectl: an initramfs has none of them.

mod accounts;
mod atomic;
mod files;
pub mod fstab;
mod home;
pub mod includes;
pub mod kvp;
pub mod label;
mod owners;
mod passwd;
pub mod selinux;
pub mod values;

pub use accounts::{hash_password, Account};
pub use files::{SSHD_CONFIG, SSHD_DROP_IN, SUDOERS};
pub use owners::Owners;

use atomic::{sync_dir, write_temp};

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, OnceLock};

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
    /// The user name belongs to an account that cannot log in (nologin, false).
    NoLogin {
        name: String,
        shell: String,
    },
    /// A group named like the new user exists and is a system group.
    SystemGroup {
        name: String,
        gid: u32,
    },
    /// No free uid or gid in the login.defs range.
    NoFreeId,
    /// The user's home exists and another account owns it.
    HomeOwned {
        home: String,
        owner: String,
        uid: u32,
    },
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
            WriteError::NoLogin { name, shell } => {
                write!(
                    f,
                    "{name} is an existing account that cannot log in ({shell})"
                )
            }
            WriteError::SystemGroup { name, gid } => {
                write!(f, "a system group named {name} exists (gid {gid})")
            }
            WriteError::NoFreeId => write!(f, "no free uid/gid in the login.defs range"),
            WriteError::HomeOwned { home, owner, uid } => write!(
                f,
                "{home} exists and belongs to the account {owner} (uid {uid}); not taken over"
            ),
            WriteError::Corrupt(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WriteError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub(super) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> WriteError + 'a {
    move |source| WriteError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// A batch's change waiting for its barrier: the temporary that replaces the file (None: the
/// file goes), and the file.
type Pending = (Option<PathBuf>, PathBuf);

/// The mounted real root, and every write azprov makes into it.
pub struct Sysroot {
    root: PathBuf,
    /// Inside a [`Sysroot::batch`]: the writes' temporaries and the files they replace, renamed
    /// by the next [`Sysroot::barrier`] or [`Batch::sync`] (no temporary: a file that goes);
    /// None outside a batch.
    pending: Mutex<Option<Vec<Pending>>>,
    /// The root's SELinux labels ([`Sysroot::labels`]), read on first use.
    labels: OnceLock<Option<label::Labels>>,
    /// The run's deadline, when there is one: no wait inside a write outlasts it.
    deadline: OnceLock<crate::deadline::Deadline>,
    /// Whether owners are set or only recorded ([`Owners`]).
    owners: Owners,
    /// Tests: the number of writes that succeed before one fails with ENOSPC.

    #[cfg(test)]
    pub(crate) writes_left: std::sync::atomic::AtomicUsize,
    /// Tests: the directory fsyncs a rename got at once, and the syncfs calls.
    #[cfg(test)]
    pub(crate) dir_syncs: std::sync::atomic::AtomicUsize,
    #[cfg(test)]
    pub(crate) syncfs_calls: std::sync::atomic::AtomicUsize,
}

impl Sysroot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_owners(root, Owners::Apply)
    }

    /// A root whose writes follow `owners`: [`Owners::recording`] runs without root.
    pub fn with_owners(root: impl Into<PathBuf>, owners: Owners) -> Self {
        Sysroot {
            root: root.into(),
            owners,
            pending: Mutex::new(None),
            labels: OnceLock::new(),
            deadline: OnceLock::new(),
            #[cfg(test)]
            writes_left: std::sync::atomic::AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            dir_syncs: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            syncfs_calls: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Tests: fails this write with ENOSPC once `writes_left` successful writes are used up.
    #[cfg(test)]
    fn injected_fault(&self, path: &str) -> Result<(), WriteError> {
        use std::sync::atomic::Ordering;
        let left = self.writes_left.load(Ordering::SeqCst);
        if left == 0 {
            return Err(WriteError::Io {
                op: "write",
                path: path.to_string(),
                source: io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        if left != usize::MAX {
            self.writes_left.store(left - 1, Ordering::SeqCst);
        }
        Ok(())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The ownership policy: what a recording policy was asked, for tests.
    pub fn owners(&self) -> &Owners {
        &self.owners
    }

    /// Bounds every wait a write makes (the account files' lock) by the run's deadline.
    pub fn set_deadline(&self, deadline: crate::deadline::Deadline) {
        let _ = self.deadline.set(deadline);
    }

    /// `budget` from now, or less when the run's deadline comes first.
    pub(super) fn wait_budget(&self, budget: std::time::Duration) -> crate::deadline::Deadline {
        match self.deadline.get() {
            Some(run) => run.min(budget),
            None => crate::deadline::Deadline::after(budget),
        }
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

    /// Reads `path` as the root sees it: every component, the last one too, resolved inside
    /// the root (an absolute symlink points into the root, never at the host's file).
    pub fn read(&self, path: &str) -> Result<Option<Vec<u8>>, WriteError> {
        let p = self.resolve_full(path)?;
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
        // created with its final mode (less the umask), so a run cut short before the chmod
        // never leaves it wider than it should be
        match fs::DirBuilder::new().mode(mode).create(&p) {
            // made by the other write chain in the meantime
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return match fs::symlink_metadata(&p) {
                    Ok(md) if md.is_dir() => Ok(p),
                    _ => Err(io_err("mkdir", &p)(e)),
                };
            }
            r => r.map_err(io_err("mkdir", &p))?,
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &p))?;
        self.owners.set(&p, None, owner)?;
        self.label(&p, libc::S_IFDIR)?;
        Ok(p)
    }

    /// The temporaries (`.NAME.azprov-tmp`, files or a home's directory) an interrupted run
    /// left in the directories azprov writes into, as host paths.
    pub fn stale_temporaries(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<String> = [
            "/etc",
            "/etc/ssh",
            "/etc/ssh/sshd_config.d",
            "/etc/sudoers.d",
            STATE_DIR,
            "/var/log",
            "/home",
        ]
        .iter()
        .map(|d| d.to_string())
        .collect();
        if let Ok(p) = self.resolve("/home/x") {
            for name in p.parent().map(crate::sys::sorted_names).unwrap_or_default() {
                dirs.push(format!("/home/{name}/.ssh"));
            }
        }
        dirs.iter()
            .filter_map(|d| self.resolve(&format!("{d}/x")).ok())
            .filter_map(|p| p.parent().map(Path::to_path_buf))
            .flat_map(|dir| {
                crate::sys::sorted_names(&dir)
                    .into_iter()
                    .filter(|n| n.starts_with('.') && n.ends_with(".azprov-tmp"))
                    .map(move |n| dir.join(n))
            })
            .collect()
    }

    /// Removes `path` inside the root: a directory with its contents, a symlink itself (never
    /// its target). Ok(false) when there was nothing to remove.
    pub fn remove(&self, path: &str) -> Result<bool, WriteError> {
        let p = self.resolve(path)?;
        let Ok(md) = fs::symlink_metadata(&p) else {
            return Ok(false);
        };
        if md.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        }
        .map_err(io_err("remove", &p))?;
        Ok(true)
    }
}

/// An fcntl write lock on all of `file` (`path` as the root sees it, for the error), the kind
/// lckpwdf and hv_kvp_daemon take; tried without blocking, with backoff, until `deadline`.
/// Released when the process closes any descriptor of the file.
pub(super) fn fcntl_lock(
    file: &impl std::os::fd::AsFd,
    path: &str,
    deadline: crate::deadline::Deadline,
) -> Result<(), WriteError> {
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    let backoff = crate::deadline::Backoff {
        base: std::time::Duration::from_millis(20),
        cap: std::time::Duration::from_millis(500),
    };
    let mut attempt = 0;
    loop {
        match nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_SETLK(&lock)) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EACCES) => {
                let wait = backoff.delay(attempt, crate::deadline::jitter());
                attempt += 1;
                if !deadline.sleep(wait) {
                    return Err(WriteError::Io {
                        op: "lock (another process held it until the deadline)",
                        path: path.to_string(),
                        source: std::io::Error::from_raw_os_error(libc::EAGAIN),
                    });
                }
            }
            Err(e) => {
                return Err(WriteError::Io {
                    op: "lock",
                    path: path.to_string(),
                    source: std::io::Error::from(e),
                })
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// Hook mode (`remount`, `Options::remount`): the root as the framework mounted it, made
/// writable when it is read-only, until the guard drops. A failure is logged; the writes then
/// fail and are reported with their reason.
pub fn writable(root: &Path, remount: bool) -> Option<crate::sys::mount::Writable> {
    if !remount {
        return None;
    }
    match crate::sys::mount::make_writable(root) {
        Ok(Some(w)) => {
            log::info!("{}: remounted read-write for provisioning", root.display());
            Some(w)
        }
        Ok(None) => None,
        Err(e) => {
            log::warn!(
                "{}: read-only and cannot remount read-write: {e}",
                root.display()
            );
            None
        }
    }
}
