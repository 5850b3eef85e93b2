//! mount(2), umount2(2) and syncfs(2) through nix, and the read-write remount of hook mode.

use nix::errno::Errno;
use nix::sys::statvfs::{statvfs, FsFlags};
use std::path::{Path, PathBuf};

pub use nix::mount::{MntFlags, MsFlags};

/// mount(2). An empty `fstype` passes none (remounts, moves and binds take none).
pub fn mount(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), Errno> {
    let fstype = (!fstype.is_empty()).then_some(fstype);
    nix::mount::mount(Some(source), target, fstype, flags, data)
}

pub fn umount(target: &Path, flags: MntFlags) -> Result<(), Errno> {
    nix::mount::umount2(target, flags)
}

/// Mount points azprov mounted (the provisioning disc, fstab's filesystems for the run),
/// unmounted last first when dropped; one that is busy is detached.
#[derive(Debug, Default)]
pub struct Mounted(Vec<PathBuf>);

impl Mounted {
    pub fn push(&mut self, target: PathBuf) {
        self.0.push(target);
    }

    pub fn targets(&self) -> &[PathBuf] {
        &self.0
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for t in self.0.iter().rev() {
            if let Err(e) = umount(t, MntFlags::empty()) {
                log::warn!("unmount {}: {e}; detaching it", t.display());
                let _ = umount(t, MntFlags::MNT_DETACH);
            }
        }
    }
}

/// syncfs(2) of the filesystem that holds `path`: its data and metadata are on disk when it
/// returns Ok (write errors since the last syncfs are reported, Linux 5.8 and later).
pub fn syncfs(path: &Path) -> Result<(), Errno> {
    let f = std::fs::File::open(path).map_err(|e| super::errno_of(&e))?;
    nix::unistd::syncfs(&f)
}

/// A filesystem found read-only and remounted read-write; read-only again when dropped, on
/// every path out of the run. Hook mode gets the root as the frameworks mount it (`ro` unless
/// the command line says `rw`) and must not depend on the initramfs's `mount` tool (klibc's
/// rejects `mount -o remount,rw DIR`).
#[derive(Debug)]
pub struct Writable {
    target: PathBuf,
    /// The mount's other flags (nosuid, noatime, ...), kept on both remounts.
    kept: MsFlags,
    /// Whether the superblock was remounted too, not only the mount point.
    superblock: bool,
}

/// statvfs(2)'s per-mount flags as mount(2) flags.
fn ms_flags(f: FsFlags) -> MsFlags {
    const MAP: [(FsFlags, MsFlags); 9] = [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_SYNCHRONOUS, MsFlags::MS_SYNCHRONOUS),
        (FsFlags::ST_MANDLOCK, MsFlags::MS_MANDLOCK),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        // ST_RELATIME (linux/statfs.h), which nix does not name for musl
        (FsFlags::from_bits_retain(0x1000), MsFlags::MS_RELATIME),
    ];
    MAP.iter()
        .filter(|(st, _)| f.contains(*st))
        .fold(MsFlags::empty(), |acc, (_, ms)| acc | *ms)
}

fn remount(target: &Path, flags: MsFlags) -> Result<(), Errno> {
    nix::mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | flags,
        None::<&str>,
    )
}

fn read_only(target: &Path) -> Result<(bool, MsFlags), Errno> {
    let flags = ms_flags(statvfs(target)?.flags());
    Ok((
        flags.contains(MsFlags::MS_RDONLY),
        flags - MsFlags::MS_RDONLY,
    ))
}

/// Makes the filesystem mounted at `target` writable when statvfs says it is read-only; None
/// when it was writable already. `target` must be the mount point itself. The mount point is
/// made writable first (`MS_REMOUNT|MS_BIND`: a read-only bind mount leaves its filesystem
/// alone); only if the filesystem itself is read-only (a root mounted `ro`) is it remounted.
pub fn make_writable(target: &Path) -> Result<Option<Writable>, Errno> {
    let (ro, kept) = read_only(target)?;
    if !ro {
        return Ok(None);
    }
    remount(target, kept | MsFlags::MS_BIND)?;
    let superblock = read_only(target)?.0;
    if superblock {
        if let Err(e) = remount(target, kept) {
            let _ = remount(target, kept | MsFlags::MS_BIND | MsFlags::MS_RDONLY);
            return Err(e);
        }
    }
    Ok(Some(Writable {
        target: target.to_path_buf(),
        kept,
        superblock,
    }))
}

impl Drop for Writable {
    fn drop(&mut self) {
        let bind = if self.superblock {
            MsFlags::empty()
        } else {
            MsFlags::MS_BIND
        };
        match remount(&self.target, self.kept | bind | MsFlags::MS_RDONLY) {
            Ok(()) => log::debug!("{}: read-only again", self.target.display()),
            Err(e) => log::warn!(
                "{}: cannot remount read-only again: {e}",
                self.target.display()
            ),
        }
    }
}
