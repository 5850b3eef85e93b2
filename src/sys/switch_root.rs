//! switch_root as named steps (u-root's `pkg/mount/switch_root_linux.go`): check that the new
//! root is a mount point, move the API filesystems into it, free the initramfs, make the new
//! root `/` and exec its init. Each step is logged at debug level; the first one that fails is
//! returned with its name.

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The filesystems PID 1 mounted early, moved into the new root.
pub const MOVED: [&str; 4] = ["/dev", "/proc", "/sys", "/run"];

/// The step of switch_root that failed, and why.
#[derive(Debug)]
pub struct SwitchRootError {
    pub step: &'static str,
    pub path: PathBuf,
    pub errno: Errno,
}

impl std::fmt::Display for SwitchRootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.step, self.path.display(), self.errno)
    }
}

impl std::error::Error for SwitchRootError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.errno)
    }
}

fn step<T>(name: &'static str, path: &Path, r: Result<T, Errno>) -> Result<T, SwitchRootError> {
    log::debug!("switch_root: {name} {}", path.display());
    r.map_err(|errno| SwitchRootError {
        step: name,
        path: path.to_path_buf(),
        errno,
    })
}

fn device_of(p: &Path) -> Result<u64, Errno> {
    fs::symlink_metadata(p)
        .map(|m| m.dev())
        .map_err(|e| super::errno_of(&e))
}

/// Makes `new_root` the root and execs `init` with `args`. Returns only on failure.
pub fn switch_root(new_root: &Path, init: &str, args: &[String]) -> SwitchRootError {
    match run(new_root, init, args) {
        Err(e) => e,
        Ok(never) => match never {},
    }
}

fn run(
    new_root: &Path,
    init: &str,
    args: &[String],
) -> Result<std::convert::Infallible, SwitchRootError> {
    let new_dev = step("stat", new_root, device_of(new_root))?;
    let old_dev = step("stat", Path::new("/"), device_of(Path::new("/")))?;
    if new_dev == old_dev {
        return step("check mount point", new_root, Err(Errno::EINVAL));
    }
    for dir in MOVED {
        let target = new_root.join(dir.trim_start_matches('/'));
        let moved = if target.is_dir() {
            step(
                "move",
                &target,
                nix::mount::mount(
                    Some(dir),
                    &target,
                    None::<&str>,
                    MsFlags::MS_MOVE,
                    None::<&str>,
                ),
            )
        } else {
            log::warn!("{} is missing; unmounting {dir}", target.display());
            step(
                "unmount",
                Path::new(dir),
                nix::mount::umount2(dir, MntFlags::MNT_DETACH),
            )
        };
        if let Err(e) = moved {
            log::warn!("switch_root: {e}");
        }
    }
    step("chdir", new_root, nix::unistd::chdir(new_root))?;
    // Free the initramfs memory: delete its files, never crossing into another filesystem.
    delete_tree(Path::new("/"), old_dev);
    step(
        "move root",
        new_root,
        nix::mount::mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>),
    )?;
    step("chroot", Path::new("."), nix::unistd::chroot("."))?;
    step("chdir", Path::new("/"), nix::unistd::chdir("/"))?;
    log::debug!("switch_root: exec {init}");
    let e = std::process::Command::new(init)
        .arg0(init)
        .args(args)
        .exec();
    step("exec", Path::new(init), Err(super::errno_of(&e)))
}

/// Removes everything below `dir` that lives on device `dev` (the initramfs).
fn delete_tree(dir: &Path, dev: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        let Ok(md) = fs::symlink_metadata(&p) else {
            continue;
        };
        if md.dev() != dev {
            continue; // a mount point: the new root and the moved API filesystems
        }
        if md.is_dir() {
            delete_tree(&p, dev);
            let _ = fs::remove_dir(&p);
        } else {
            let _ = fs::remove_file(&p);
        }
    }
}
