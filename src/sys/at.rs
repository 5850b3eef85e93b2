//! Files relative to a directory handle (openat, renameat): how a process that outlives the
//! initramfs keeps writing into the real root after switch_root moved it away from the path
//! it had when the handle was opened.
#![allow(unsafe_code)]

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

/// `from` in `dir` becomes `to` unless `to` exists: Ok(false) then, `from` left as it was.
/// renameat2(RENAME_NOREPLACE), or on a filesystem without it, linkat and unlinkat (a link
/// fails on an existing name as well).
pub fn rename_noreplace(dir: &File, from: &str, to: &str) -> Result<bool, Errno> {
    use std::os::fd::AsRawFd;
    let (from_c, to_c) = (
        std::ffi::CString::new(from).map_err(|_| Errno::EINVAL)?,
        std::ffi::CString::new(to).map_err(|_| Errno::EINVAL)?,
    );
    let fd = dir.as_raw_fd();
    // nix wraps renameat2 for glibc only (musl's libc has no wrapper): the system call itself
    // SAFETY: both names are NUL-terminated strings that live across the call, and `fd` is an
    // open directory descriptor; renameat2 reads the names and changes nothing in memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            fd,
            from_c.as_ptr(),
            fd,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    let done = match Errno::result(rc).map(drop) {
        Err(Errno::EINVAL | Errno::ENOSYS) => {
            nix::unistd::linkat(dir, from, dir, to, nix::fcntl::AtFlags::empty())
                .and_then(|()| remove(dir, from))
        }
        other => other,
    };
    match done {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// mkdirat(2): the directory `name` in `dir` with `mode` (before the umask); an existing one
/// is EEXIST.
pub fn mkdir(dir: &File, name: &str, mode: u32) -> Result<(), Errno> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode))
}

/// The directory `name` in `dir`, opened without following a symlink.
pub fn open_dir(dir: &File, name: &str) -> Result<File, Errno> {
    open(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)
}

/// unlinkat(2) of a file in `dir`.
pub fn remove(dir: &File, name: &str) -> Result<(), Errno> {
    nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
}
