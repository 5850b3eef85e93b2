//! Extended attributes of one file, not following a last symlink (nix has no wrapper): the
//! `security.selinux` label azprov gives what it writes into a root.
#![allow(unsafe_code)]

use super::Errno;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn c_path(path: &Path) -> Result<CString, Errno> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// lsetxattr(2): sets `name` on `path` itself (a symlink's own attribute, never its target's).
pub fn lset(path: &Path, name: &str, value: &[u8]) -> Result<(), Errno> {
    let p = c_path(path)?;
    let n = CString::new(name).map_err(|_| Errno::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and live across the call; `value` is a valid
    // slice of `value.len()` bytes the kernel only reads.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    Errno::result(rc).map(drop)
}

/// lgetxattr(2): the value of `name` on `path` itself; None when it has none (or the
/// filesystem keeps no such attributes).
pub fn lget(path: &Path, name: &str) -> Result<Option<Vec<u8>>, Errno> {
    let p = c_path(path)?;
    let n = CString::new(name).map_err(|_| Errno::EINVAL)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated and live across the call; the kernel writes at
    // most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    match Errno::result(rc) {
        Ok(len) => {
            buf.truncate(usize::try_from(len).unwrap_or(0));
            Ok(Some(buf))
        }
        Err(Errno::ENODATA) | Err(Errno::EOPNOTSUPP) => Ok(None),
        Err(e) => Err(e),
    }
}

/// fsetxattr(2): sets `name` on the open file `file`.
pub fn fset(file: &std::fs::File, name: &str, value: &[u8]) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let n = CString::new(name).map_err(|_| Errno::EINVAL)?;
    // SAFETY: the descriptor is open for the whole call (borrowed from `file`), the name is
    // NUL-terminated and lives across the call; `value` is a valid slice the kernel only reads.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    Errno::result(rc).map(drop)
}
