//! mount(2) and umount2(2), and the CD-ROM drive status ioctl.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// mount(2) with `flags` (e.g. `libc::MS_RDONLY`) and optional data.
pub fn mount(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = cstr(source)?;
    let dst = cstr(target)?;
    let fs = CString::new(fstype).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let data = data
        .map(CString::new)
        .transpose()
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let data_ptr = data
        .as_ref()
        .map_or(std::ptr::null(), |d| d.as_ptr().cast());
    // SAFETY: all pointers are valid NUL-terminated strings (or null data) for the call.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), flags, data_ptr) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn umount(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let t = cstr(target)?;
    // SAFETY: `t` is a valid NUL-terminated path.
    let rc = unsafe { libc::umount2(t.as_ptr(), flags) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// linux/cdrom.h: CDROM_DRIVE_STATUS and its answers.
const CDROM_DRIVE_STATUS: libc::c_ulong = 0x5326;
const CDSL_CURRENT: libc::c_int = i32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveStatus {
    NoInfo,
    NoDisc,
    TrayOpen,
    NotReady,
    DiscOk,
    Other(i32),
}

/// Asks a CD-ROM drive whether it holds a readable disc (Ignition does the same "to avoid
/// reading data from an arbitrary block device"). An error means the device is no CD-ROM.
pub fn drive_status(dev: &Path) -> io::Result<DriveStatus> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(dev)?;
    // SAFETY: a valid descriptor; CDROM_DRIVE_STATUS takes an integer slot argument.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), CDROM_DRIVE_STATUS as _, CDSL_CURRENT) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(match rc {
        0 => DriveStatus::NoInfo,
        1 => DriveStatus::NoDisc,
        2 => DriveStatus::TrayOpen,
        3 => DriveStatus::NotReady,
        4 => DriveStatus::DiscOk,
        n => DriveStatus::Other(n),
    })
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    /// O_NONBLOCK: opening a drive without a disc must not block or fail with ENOMEDIUM.
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::custom_flags(self, libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}
