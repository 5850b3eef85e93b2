//! Block devices and the filesystems on them: the CD-ROM drive status, the partition table
//! re-read and resized (BLKRRPART, BLKPG), and the online grows of ext4, xfs and btrfs with
//! the freeze that puts xfs's grow on disk. Every request code comes from nix's ioctl macros
//! (the kernel's `_IO`/`_IOR`/`_IOW`/`_IOWR`, with the argument's size), and every repr(C)
//! argument has a compile-time check of the size the kernel's header gives it.
#![allow(unsafe_code)]

use nix::errno::Errno;
use std::os::fd::AsRawFd;
use std::path::Path;

/// linux/cdrom.h: CDROM_DRIVE_STATUS takes the slot as an integer argument.
const CDROM_DRIVE_STATUS: u32 = 0x5326;
const CDSL_CURRENT: libc::c_int = i32::MAX;

/// struct blkpg_partition (linux/blkpg.h): two long longs, an int, two 64-byte names.
#[repr(C)]
struct BlkpgPartition {
    start: i64,
    length: i64,
    pno: libc::c_int,
    devname: [u8; 64],
    volname: [u8; 64],
}
const _: () = assert!(std::mem::size_of::<BlkpgPartition>() == 152);

/// struct blkpg_ioctl_arg (linux/blkpg.h).
#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}
const _: () = assert!(std::mem::size_of::<BlkpgIoctlArg>() == 24);

/// struct xfs_fsop_geom_v4 (linux xfs_fs.h).
#[repr(C)]
#[derive(Default)]
struct XfsFsopGeomV4 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    logblocks: u32,
    sectsize: u32,
    inodesize: u32,
    imaxpct: u32,
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    logstart: u64,
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
    logsunit: u32,
}
const _: () = assert!(std::mem::size_of::<XfsFsopGeomV4>() == 112);

/// struct xfs_growfs_data (linux xfs_fs.h).
#[repr(C)]
struct XfsGrowfsData {
    newblocks: u64,
    imaxpct: u32,
}
const _: () = assert!(std::mem::size_of::<XfsGrowfsData>() == 16);

/// struct btrfs_ioctl_vol_args (linux btrfs.h).
#[repr(C)]
struct BtrfsVolArgs {
    fd: i64,
    name: [u8; 4088],
}
const _: () = assert!(std::mem::size_of::<BtrfsVolArgs>() == 4096);

mod ioctl {
    use super::{BlkpgIoctlArg, BtrfsVolArgs, XfsFsopGeomV4, XfsGrowfsData};
    nix::ioctl_write_int_bad!(cdrom_drive_status, super::CDROM_DRIVE_STATUS);
    // BLKRRPART _IO(0x12, 95)
    nix::ioctl_none!(blkrrpart, 0x12, 95);
    // BLKPG _IO(0x12, 105), yet it takes a pointer (the header's own irregularity)
    nix::ioctl_write_ptr_bad!(blkpg, nix::request_code_none!(0x12, 105), BlkpgIoctlArg);
    // EXT4_IOC_RESIZE_FS _IOW('f', 16, __u64)
    nix::ioctl_write_ptr!(ext4_resize_fs, b'f', 16, u64);
    // XFS_IOC_FSGEOMETRY_V4 _IOR('X', 124, struct xfs_fsop_geom_v4)
    nix::ioctl_read!(xfs_fsgeometry_v4, b'X', 124, XfsFsopGeomV4);
    // XFS_IOC_FSGROWFSDATA _IOW('X', 110, struct xfs_growfs_data)
    nix::ioctl_write_ptr!(xfs_growfsdata, b'X', 110, XfsGrowfsData);
    // BTRFS_IOC_RESIZE _IOW(0x94, 3, struct btrfs_ioctl_vol_args)
    nix::ioctl_write_ptr!(btrfs_resize, 0x94, 3, BtrfsVolArgs);
    // FIFREEZE _IOWR('X', 119, int), FITHAW _IOWR('X', 120, int)
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
}

/// BLKRRPART on `disk`: the kernel reads its partition table again (refused with EBUSY while
/// a partition of it is in use).
pub fn reread_partitions(disk: &std::fs::File) -> Result<(), Errno> {
    // SAFETY: BLKRRPART takes no argument; the descriptor is open for the call.
    unsafe { ioctl::blkrrpart(disk.as_raw_fd()) }.map(drop)
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

/// BLKPG_RESIZE_PARTITION on `disk`: partition `number` now spans `length` bytes from `start`
/// (the kernel's view, after the table on disk says so; growing works while it is mounted).
pub fn resize_partition(
    disk: &std::fs::File,
    number: i32,
    start: u64,
    length: u64,
) -> Result<(), Errno> {
    const BLKPG_RESIZE_PARTITION: libc::c_int = 3;
    let mut part = BlkpgPartition {
        start: i64::try_from(start).map_err(|_| Errno::EINVAL)?,
        length: i64::try_from(length).map_err(|_| Errno::EINVAL)?,
        pno: number,
        devname: [0; 64],
        volname: [0; 64],
    };
    let arg = BlkpgIoctlArg {
        op: BLKPG_RESIZE_PARTITION,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut part as *mut BlkpgPartition).cast(),
    };
    // SAFETY: `arg` and the partition it points at live across the call and have the layout of
    // the kernel's structs (checked above); the descriptor is open for the call.
    unsafe { ioctl::blkpg(disk.as_raw_fd(), &arg) }.map(drop)
}

/// EXT4_IOC_RESIZE_FS on the mounted ext4 filesystem `dir` is open on: grows it online to
/// `blocks` blocks of its own size.
pub fn ext4_resize(dir: &std::fs::File, blocks: u64) -> Result<(), Errno> {
    // SAFETY: the kernel reads one u64, which lives across the call; the descriptor is open.
    unsafe { ioctl::ext4_resize_fs(dir.as_raw_fd(), &blocks) }.map(drop)
}

/// The mounted xfs filesystem's geometry that growing needs: block size, data blocks and the
/// inode space limit (XFS_IOC_FSGEOMETRY_V4, which every kernel since 2.6 answers).
pub struct XfsGeometry {
    pub block_size: u32,
    pub data_blocks: u64,
    pub imaxpct: u32,
}

/// XFS_IOC_FSGEOMETRY_V4 on the mounted xfs filesystem `dir` is open on.
pub fn xfs_geometry(dir: &std::fs::File) -> Result<XfsGeometry, Errno> {
    let mut geom = XfsFsopGeomV4::default();
    // SAFETY: `geom` has the layout of struct xfs_fsop_geom_v4 (size checked above), which the
    // kernel fills, and lives across the call; the descriptor is open for the call.
    unsafe { ioctl::xfs_fsgeometry_v4(dir.as_raw_fd(), &mut geom) }?;
    Ok(XfsGeometry {
        block_size: geom.blocksize,
        data_blocks: geom.datablocks,
        imaxpct: geom.imaxpct,
    })
}

/// XFS_IOC_FSGROWFSDATA on the mounted xfs filesystem `dir` is open on: grows its data
/// section online to `blocks` blocks, keeping the inode space limit `imaxpct`.
pub fn xfs_grow(dir: &std::fs::File, blocks: u64, imaxpct: u32) -> Result<(), Errno> {
    let arg = XfsGrowfsData {
        newblocks: blocks,
        imaxpct,
    };
    // SAFETY: `arg` has the layout of struct xfs_growfs_data (size checked above) and lives
    // across the call; the descriptor is open for the call.
    unsafe { ioctl::xfs_growfsdata(dir.as_raw_fd(), &arg) }.map(drop)
}

/// BTRFS_IOC_RESIZE on the mounted btrfs filesystem `dir` is open on: device 1 (a root on
/// one partition) grows to the end of its device ("1:max", as `btrfs filesystem resize max`).
pub fn btrfs_resize_max(dir: &std::fs::File) -> Result<(), Errno> {
    let mut arg = BtrfsVolArgs {
        fd: 0,
        name: [0; 4088],
    };
    for (to, from) in arg.name.iter_mut().zip(b"1:max") {
        *to = *from;
    }
    // SAFETY: `arg` has the layout of struct btrfs_ioctl_vol_args (size checked above), its
    // name NUL-terminated, and lives across the call; the descriptor is open for the call.
    unsafe { ioctl::btrfs_resize(dir.as_raw_fd(), &arg) }.map(drop)
}

/// FIFREEZE then FITHAW on the mounted filesystem `dir` is open on: freezing writes every
/// dirty metadata buffer home and quiesces the log, so a later mount has nothing to recover.
pub fn freeze_thaw(dir: &std::fs::File) -> Result<(), Errno> {
    let mut unused: libc::c_int = 0;
    // SAFETY: both requests take an int argument, which `unused` is and which lives across the
    // calls; the descriptor is open for them.
    unsafe { ioctl::fifreeze(dir.as_raw_fd(), &mut unused) }?;
    // SAFETY: as above.
    unsafe { ioctl::fithaw(dir.as_raw_fd(), &mut unused) }.map(drop)
}

#[cfg(test)]
mod tests {
    /// The request codes nix's macros make are the ones the kernel's headers define (compared
    /// as u32: the request type is c_ulong on glibc, c_int on musl).
    #[test]
    fn request_codes_are_the_kernels() {
        use nix::{
            request_code_none, request_code_read, request_code_readwrite, request_code_write,
        };
        let codes: [(u32, u32); 8] = [
            (request_code_none!(0x12, 95) as u32, 0x125f),
            (request_code_none!(0x12, 105) as u32, 0x1269),
            (request_code_write!(b'f', 16, 8) as u32, 0x4008_6610),
            (request_code_read!(b'X', 124, 112) as u32, 0x8070_587c),
            (request_code_write!(b'X', 110, 16) as u32, 0x4010_586e),
            (request_code_write!(0x94, 3, 4096) as u32, 0x5000_9403),
            (request_code_readwrite!(b'X', 119, 4) as u32, 0xc004_5877),
            (request_code_readwrite!(b'X', 120, 4) as u32, 0xc004_5878),
        ];
        for (made, kernel) in codes {
            assert_eq!(made, kernel, "{made:#x} != {kernel:#x}");
        }
    }
}
