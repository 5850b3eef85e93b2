//! mount(2) and umount2(2) through nix, and the CD-ROM drive status ioctl.

use nix::errno::Errno;
use std::os::fd::AsRawFd;
use std::path::Path;

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

/// linux/cdrom.h: CDROM_DRIVE_STATUS takes the slot as an integer argument.
const CDROM_DRIVE_STATUS: u32 = 0x5326;
const CDSL_CURRENT: libc::c_int = i32::MAX;

mod ioctl {
    nix::ioctl_write_int_bad!(cdrom_drive_status, super::CDROM_DRIVE_STATUS);
}

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
pub fn drive_status(dev: &Path) -> Result<DriveStatus, Errno> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a drive without a disc must not block or fail with ENOMEDIUM.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(dev)
        .map_err(|e| super::errno_of(&e))?;
    // SAFETY: a valid open descriptor; CDROM_DRIVE_STATUS reads only its integer argument.
    let rc = unsafe { ioctl::cdrom_drive_status(f.as_raw_fd(), CDSL_CURRENT) }?;
    Ok(match rc {
        0 => DriveStatus::NoInfo,
        1 => DriveStatus::NoDisc,
        2 => DriveStatus::TrayOpen,
        3 => DriveStatus::NotReady,
        4 => DriveStatus::DiscOk,
        n => DriveStatus::Other(n),
    })
}
