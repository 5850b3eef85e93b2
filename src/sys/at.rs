//! Files relative to a directory handle (openat, renameat): how a process that outlives the
//! initramfs keeps writing into the real root after switch_root moved it away from the path
//! it had when the handle was opened.

use super::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;
use std::fs::File;

/// Opens `name` in `dir` with `flags` (O_CLOEXEC and O_NOFOLLOW always) and `mode`.
pub fn open(dir: &File, name: &str, flags: OFlag, mode: u32) -> Result<File, Errno> {
    let fd = openat(
        dir,
        name,
        flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(mode),
    )?;
    Ok(File::from(fd))
}

/// A new file `name` in `dir` (it must not exist), write-only, with `mode`.
pub fn create_new(dir: &File, name: &str, mode: u32) -> Result<File, Errno> {
    open(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        mode,
    )
}

/// renameat(2) within `dir`: `from` replaces `to` atomically.
pub fn rename(dir: &File, from: &str, to: &str) -> Result<(), Errno> {
    renameat(dir, from, dir, to)
}

/// unlinkat(2) of a file in `dir`.
pub fn remove(dir: &File, name: &str) -> Result<(), Errno> {
    nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
}
