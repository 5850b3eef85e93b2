//! The kernel calls of PID 1's own path (early mounts, the root's mount, switch_root) behind
//! one small trait, as youki keeps its syscalls: [`Linux`] makes them; tests hand the same code
//! [`fake::Recorder`], which records each call and fails the ones it is told to, so the mount
//! and pivot sequences and their failure paths are checked without root.

use super::Errno;
use nix::mount::{MntFlags, MsFlags};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

pub trait Kernel {
    /// mount(2); an empty `fstype` passes none (moves, remounts).
    fn mount(
        &self,
        source: &Path,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), Errno>;
    fn umount(&self, target: &Path, flags: MntFlags) -> Result<(), Errno>;
    /// mkdir -p; a failure shows in the mount that follows.
    fn mkdir_all(&self, path: &Path);
    /// The device a path lives on (lstat's st_dev).
    fn device_of(&self, path: &Path) -> Result<u64, Errno>;
    fn is_dir(&self, path: &Path) -> bool;
    fn chdir(&self, path: &Path) -> Result<(), Errno>;
    fn chroot(&self, path: &Path) -> Result<(), Errno>;
    /// Removes everything below `dir` on device `dev`, never crossing into another filesystem.
    fn delete_tree(&self, dir: &Path, dev: u64);
    /// execve(2) of `init` with `args`; returns only when it failed.
    fn exec(&self, init: &str, args: &[String]) -> Errno;
}

/// The running kernel.
pub struct Linux;

impl Kernel for Linux {
    fn mount(
        &self,
        source: &Path,
        target: &Path,
        fstype: &str,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), Errno> {
        super::mount::mount(source, target, fstype, flags, data)
    }

    fn umount(&self, target: &Path, flags: MntFlags) -> Result<(), Errno> {
        super::mount::umount(target, flags)
    }

    fn mkdir_all(&self, path: &Path) {
        let _ = fs::create_dir_all(path);
    }

    fn device_of(&self, path: &Path) -> Result<u64, Errno> {
        fs::symlink_metadata(path)
            .map(|m| m.dev())
            .map_err(|e| super::errno_of(&e))
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn chdir(&self, path: &Path) -> Result<(), Errno> {
        nix::unistd::chdir(path)
    }

    fn chroot(&self, path: &Path) -> Result<(), Errno> {
        nix::unistd::chroot(path)
    }

    fn delete_tree(&self, dir: &Path, dev: u64) {
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
                self.delete_tree(&p, dev);
                let _ = fs::remove_dir(&p);
            } else {
                let _ = fs::remove_file(&p);
            }
        }
    }

    fn exec(&self, init: &str, args: &[String]) -> Errno {
        let e = std::process::Command::new(init)
            .arg0(init)
            .args(args)
            .exec();
        super::errno_of(&e)
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;
    use std::cell::RefCell;

    /// Records every call as one line (`mount SOURCE TARGET FSTYPE FLAGS DATA`, `chroot .`, …)
    /// and answers from what it was given: devices by path, directories, and the calls that
    /// fail (matched by the start of their line).
    #[derive(Default)]
    pub struct Recorder {
        pub calls: RefCell<Vec<String>>,
        pub devices: Vec<(String, u64)>,
        pub missing_dirs: Vec<String>,
        pub fail: Vec<(String, Errno)>,
    }

    impl Recorder {
        fn call(&self, line: String) -> Result<(), Errno> {
            let failed = self
                .fail
                .iter()
                .find(|(start, _)| line.starts_with(start.as_str()))
                .map(|(_, e)| *e);
            self.calls.borrow_mut().push(line);
            failed.map_or(Ok(()), Err)
        }

        pub fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }
    }

    impl Kernel for Recorder {
        fn mount(
            &self,
            source: &Path,
            target: &Path,
            fstype: &str,
            flags: MsFlags,
            data: Option<&str>,
        ) -> Result<(), Errno> {
            self.call(format!(
                "mount {} {} {fstype} {:#x} {}",
                source.display(),
                target.display(),
                flags.bits(),
                data.unwrap_or("-")
            ))
        }

        fn umount(&self, target: &Path, flags: MntFlags) -> Result<(), Errno> {
            self.call(format!("umount {} {:#x}", target.display(), flags.bits()))
        }

        fn mkdir_all(&self, path: &Path) {
            let _ = self.call(format!("mkdir {}", path.display()));
        }

        fn device_of(&self, path: &Path) -> Result<u64, Errno> {
            self.call(format!("stat {}", path.display()))?;
            let p = path.display().to_string();
            self.devices
                .iter()
                .find(|(d, _)| *d == p)
                .map(|(_, dev)| *dev)
                .ok_or(Errno::ENOENT)
        }

        fn is_dir(&self, path: &Path) -> bool {
            let p = path.display().to_string();
            !self.missing_dirs.contains(&p)
        }

        fn chdir(&self, path: &Path) -> Result<(), Errno> {
            self.call(format!("chdir {}", path.display()))
        }

        fn chroot(&self, path: &Path) -> Result<(), Errno> {
            self.call(format!("chroot {}", path.display()))
        }

        fn delete_tree(&self, dir: &Path, dev: u64) {
            let _ = self.call(format!("delete {} on {dev}", dir.display()));
        }

        fn exec(&self, init: &str, args: &[String]) -> Errno {
            match self.call(format!("exec {init} {}", args.join(" "))) {
                Err(e) => e,
                Ok(()) => Errno::ENOEXEC,
            }
        }
    }
}
