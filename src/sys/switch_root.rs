//! switch_root as named steps (u-root's `pkg/mount/switch_root_linux.go`): check that the new
//! root is a mount point, move the API filesystems into it, free the initramfs, make the new
//! root `/` and exec its init. Each step is logged at debug level; the first one that fails is
//! returned with its name.

use super::kernel::{Kernel, Linux};
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
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

/// Makes `new_root` the root and execs `init` with `args`. Returns only on failure.
pub fn switch_root(new_root: &Path, init: &str, args: &[String]) -> SwitchRootError {
    switch_root_with(&Linux, new_root, init, args)
}

/// [`switch_root`] through `k`'s kernel calls.
pub fn switch_root_with(
    k: &impl Kernel,
    new_root: &Path,
    init: &str,
    args: &[String],
) -> SwitchRootError {
    match run(k, new_root, init, args) {
        Err(e) => e,
        Ok(never) => match never {},
    }
}

fn run(
    k: &impl Kernel,
    new_root: &Path,
    init: &str,
    args: &[String],
) -> Result<std::convert::Infallible, SwitchRootError> {
    let new_dev = step("stat", new_root, k.device_of(new_root))?;
    let old_dev = step("stat", Path::new("/"), k.device_of(Path::new("/")))?;
    if new_dev == old_dev {
        return step("check mount point", new_root, Err(Errno::EINVAL));
    }
    for dir in MOVED {
        let target = new_root.join(dir.trim_start_matches('/'));
        let moved = if k.is_dir(&target) {
            step(
                "move",
                &target,
                k.mount(Path::new(dir), &target, "", MsFlags::MS_MOVE, None),
            )
        } else {
            log::warn!("{} is missing; unmounting {dir}", target.display());
            step(
                "unmount",
                Path::new(dir),
                k.umount(Path::new(dir), MntFlags::MNT_DETACH),
            )
        };
        if let Err(e) = moved {
            log::warn!("switch_root: {e}");
        }
    }
    step("chdir", new_root, k.chdir(new_root))?;
    // Free the initramfs memory: delete its files, never crossing into another filesystem.
    k.delete_tree(Path::new("/"), old_dev);
    step(
        "move root",
        new_root,
        k.mount(Path::new("."), Path::new("/"), "", MsFlags::MS_MOVE, None),
    )?;
    step("chroot", Path::new("."), k.chroot(Path::new(".")))?;
    step("chdir", Path::new("/"), k.chdir(Path::new("/")))?;
    log::debug!("switch_root: exec {init}");
    let e = k.exec(init, args);
    step("exec", Path::new(init), Err(e))
}

#[cfg(test)]
mod tests {
    use super::super::kernel::fake::Recorder;
    use super::*;

    fn recorder() -> Recorder {
        Recorder {
            devices: vec![("/sysroot".into(), 2), ("/".into(), 1)],
            ..Recorder::default()
        }
    }

    #[test]
    fn the_steps_run_in_order_and_end_in_exec() {
        let k = recorder();
        let e = switch_root_with(&k, Path::new("/sysroot"), "/sbin/init", &["splash".into()]);
        assert_eq!((e.step, e.errno), ("exec", Errno::ENOEXEC));
        assert_eq!(
            k.calls(),
            [
                "stat /sysroot",
                "stat /",
                "mount /dev /sysroot/dev  0x2000 -",
                "mount /proc /sysroot/proc  0x2000 -",
                "mount /sys /sysroot/sys  0x2000 -",
                "mount /run /sysroot/run  0x2000 -",
                "chdir /sysroot",
                "delete / on 1",
                "mount . /  0x2000 -",
                "chroot .",
                "chdir /",
                "exec /sbin/init splash",
            ]
        );
    }

    #[test]
    fn a_root_that_is_no_mount_point_stops_before_anything_is_moved() {
        let k = Recorder {
            devices: vec![("/sysroot".into(), 1), ("/".into(), 1)],
            ..Recorder::default()
        };
        let e = switch_root_with(&k, Path::new("/sysroot"), "/sbin/init", &[]);
        assert_eq!((e.step, e.errno), ("check mount point", Errno::EINVAL));
        assert_eq!(k.calls(), ["stat /sysroot", "stat /"]);
    }

    #[test]
    fn a_missing_api_directory_is_unmounted_and_a_failed_move_does_not_stop_the_switch() {
        let k = Recorder {
            missing_dirs: vec!["/sysroot/run".into()],
            fail: vec![("mount /proc".into(), Errno::EBUSY)],
            ..recorder()
        };
        let e = switch_root_with(&k, Path::new("/sysroot"), "/sbin/init", &[]);
        assert_eq!(e.step, "exec");
        let calls = k.calls();
        assert!(calls.contains(&"umount /run 0x2".to_string()), "{calls:?}");
        assert!(calls.contains(&"chroot .".to_string()));
    }

    #[test]
    fn a_failed_chroot_is_returned_and_nothing_is_executed() {
        let k = Recorder {
            fail: vec![("chroot".into(), Errno::EPERM)],
            ..recorder()
        };
        let e = switch_root_with(&k, Path::new("/sysroot"), "/sbin/init", &[]);
        assert_eq!((e.step, e.errno), ("chroot", Errno::EPERM));
        assert!(!k.calls().iter().any(|c| c.starts_with("exec")));
    }
}
