//! PID 1 duties that need raw system calls: loading modules, reaping children, switching the
//! root, rebooting.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// finit_module(2) with no parameters. EEXIST (already loaded) is success.
pub fn load_module(path: &Path) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    let params = c"";
    // SAFETY: a valid descriptor and a NUL-terminated empty parameter string.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
    match check(rc) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

/// Reaps every exited child without blocking; returns how many.
pub fn reap() -> usize {
    let mut n = 0;
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return n;
        }
        n += 1;
    }
}

pub fn chdir(p: &Path) -> io::Result<()> {
    let c = cstr(p)?;
    // SAFETY: a valid NUL-terminated path.
    check(unsafe { libc::chdir(c.as_ptr()) } as libc::c_long)
}

pub fn chroot(p: &Path) -> io::Result<()> {
    let c = cstr(p)?;
    // SAFETY: a valid NUL-terminated path.
    check(unsafe { libc::chroot(c.as_ptr()) } as libc::c_long)
}

/// The device a path lives on (to tell mount points and filesystems apart).
pub fn device_of(p: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::symlink_metadata(p)?.dev())
}

#[derive(Debug, Clone, Copy)]
pub enum Power {
    Reboot,
    PowerOff,
}

/// Syncs and reboots or powers off. Returns only on failure.
pub fn power(how: Power) -> io::Error {
    // SAFETY: sync and reboot take no pointers.
    unsafe {
        libc::sync();
        let cmd = match how {
            Power::Reboot => libc::RB_AUTOBOOT,
            Power::PowerOff => libc::RB_POWER_OFF,
        };
        libc::reboot(cmd);
    }
    io::Error::last_os_error()
}

pub fn getpid() -> u32 {
    std::process::id()
}
