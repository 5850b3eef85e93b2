//! mount(2), umount2(2) and syncfs(2) through nix, and the CD-ROM drive status ioctl.

use nix::errno::Errno;
use nix::sys::statvfs::{statvfs, FsFlags};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

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

/// syncfs(2) of the filesystem that holds `path`: its data and metadata are on disk when it
/// returns Ok (write errors since the last syncfs are reported, Linux 5.8 and later).
pub fn syncfs(path: &Path) -> Result<(), Errno> {
    let f = std::fs::File::open(path).map_err(|e| super::errno_of(&e))?;
    nix::unistd::syncfs(&f)
}

/// A filesystem found read-only and remounted read-write; read-only again when dropped, on
/// every path out of the run. Hook mode gets the root as the frameworks mount it (`ro` unless
/// the command line says `rw`) and must not depend on the initramfs's `mount` tool (klibc's
/// rejects `mount -o remount,rw DIR`).
#[derive(Debug)]
pub struct Writable {
    target: PathBuf,
    /// The mount's other flags (nosuid, noatime, ...), kept on both remounts.
    kept: MsFlags,
    /// Whether the superblock was remounted too, not only the mount point.
    superblock: bool,
}

/// statvfs(2)'s per-mount flags as mount(2) flags.
fn ms_flags(f: FsFlags) -> MsFlags {
    const MAP: [(FsFlags, MsFlags); 9] = [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_SYNCHRONOUS, MsFlags::MS_SYNCHRONOUS),
        (FsFlags::ST_MANDLOCK, MsFlags::MS_MANDLOCK),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        // ST_RELATIME (linux/statfs.h), which nix does not name for musl
        (FsFlags::from_bits_retain(0x1000), MsFlags::MS_RELATIME),
    ];
    MAP.iter()
        .filter(|(st, _)| f.contains(*st))
        .fold(MsFlags::empty(), |acc, (_, ms)| acc | *ms)
}

fn remount(target: &Path, flags: MsFlags) -> Result<(), Errno> {
    nix::mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | flags,
        None::<&str>,
    )
}

fn read_only(target: &Path) -> Result<(bool, MsFlags), Errno> {
    let flags = ms_flags(statvfs(target)?.flags());
    Ok((
        flags.contains(MsFlags::MS_RDONLY),
        flags - MsFlags::MS_RDONLY,
    ))
}

/// Makes the filesystem mounted at `target` writable when statvfs says it is read-only; None
/// when it was writable already. `target` must be the mount point itself. The mount point is
/// made writable first (`MS_REMOUNT|MS_BIND`: a read-only bind mount leaves its filesystem
/// alone); only if the filesystem itself is read-only (a root mounted `ro`) is it remounted.
pub fn make_writable(target: &Path) -> Result<Option<Writable>, Errno> {
    let (ro, kept) = read_only(target)?;
    if !ro {
        return Ok(None);
    }
    remount(target, kept | MsFlags::MS_BIND)?;
    let superblock = read_only(target)?.0;
    if superblock {
        if let Err(e) = remount(target, kept) {
            let _ = remount(target, kept | MsFlags::MS_BIND | MsFlags::MS_RDONLY);
            return Err(e);
        }
    }
    Ok(Some(Writable {
        target: target.to_path_buf(),
        kept,
        superblock,
    }))
}

impl Drop for Writable {
    fn drop(&mut self) {
        let bind = if self.superblock {
            MsFlags::empty()
        } else {
            MsFlags::MS_BIND
        };
        match remount(&self.target, self.kept | bind | MsFlags::MS_RDONLY) {
            Ok(()) => log::debug!("{}: read-only again", self.target.display()),
            Err(e) => log::warn!(
                "{}: cannot remount read-only again: {e}",
                self.target.display()
            ),
        }
    }
}

/// linux/cdrom.h: CDROM_DRIVE_STATUS takes the slot as an integer argument.
const CDROM_DRIVE_STATUS: u32 = 0x5326;
const CDSL_CURRENT: libc::c_int = i32::MAX;

mod ioctl {
    nix::ioctl_write_int_bad!(cdrom_drive_status, super::CDROM_DRIVE_STATUS);
    // linux/fs.h: #define BLKRRPART _IO(0x12,95)
    nix::ioctl_none!(blkrrpart, 0x12, 95);
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
    #[repr(C)]
    struct BlkpgPartition {
        start: i64,
        length: i64,
        pno: libc::c_int,
        devname: [u8; 64],
        volname: [u8; 64],
    }
    #[repr(C)]
    struct BlkpgIoctlArg {
        op: libc::c_int,
        flags: libc::c_int,
        datalen: libc::c_int,
        data: *mut libc::c_void,
    }
    const BLKPG: libc::c_ulong = 0x1269;
    const BLKPG_RESIZE_PARTITION: libc::c_int = 3;
    let mut part = BlkpgPartition {
        start: i64::try_from(start).map_err(|_| Errno::EINVAL)?,
        length: i64::try_from(length).map_err(|_| Errno::EINVAL)?,
        pno: number,
        devname: [0; 64],
        volname: [0; 64],
    };
    let mut arg = BlkpgIoctlArg {
        op: BLKPG_RESIZE_PARTITION,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut part as *mut BlkpgPartition).cast(),
    };
    // SAFETY: `arg` and the partition it points at live across the call and have the layout of
    // the kernel's struct blkpg_ioctl_arg and blkpg_partition (linux/blkpg.h); the descriptor
    // is open for the call.
    unsafe { ioctl_arg(disk, BLKPG, &mut arg) }
}

/// One ioctl on `fd` with `arg` as the request's argument.
///
/// # Safety
/// `T` must have the layout (repr(C), the kernel's size) of the struct `request` reads or
/// writes.
unsafe fn ioctl_arg<T>(
    fd: &impl AsRawFd,
    request: libc::c_ulong,
    arg: &mut T,
) -> Result<(), Errno> {
    // SAFETY: the caller vouches for T's layout; `arg` is a live, exclusive reference for the
    // call, and the descriptor is open for it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) };
    Errno::result(rc).map(drop)
}

/// EXT4_IOC_RESIZE_FS on the mounted ext4 filesystem `dir` is open on: grows it online to
/// `blocks` blocks of its own size.
pub fn ext4_resize(dir: &std::fs::File, blocks: u64) -> Result<(), Errno> {
    const EXT4_IOC_RESIZE_FS: libc::c_ulong = 0x4008_6610;
    let mut n = blocks;
    // SAFETY: the kernel reads one u64 from `n`, which lives across the call; the descriptor
    // is open for the call.
    unsafe { ioctl_arg(dir, EXT4_IOC_RESIZE_FS, &mut n) }
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
    /// struct xfs_fsop_geom_v4 (linux xfs_fs.h): 112 bytes.
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
    // _IOR('X', 124, struct xfs_fsop_geom_v4)
    const XFS_IOC_FSGEOMETRY_V4: libc::c_ulong = 0x8070_587c;
    let mut geom = XfsFsopGeomV4::default();
    // SAFETY: `geom` has the layout of struct xfs_fsop_geom_v4, which the kernel fills, and
    // lives across the call; the descriptor is open for the call.
    unsafe { ioctl_arg(dir, XFS_IOC_FSGEOMETRY_V4, &mut geom) }?;
    Ok(XfsGeometry {
        block_size: geom.blocksize,
        data_blocks: geom.datablocks,
        imaxpct: geom.imaxpct,
    })
}

/// XFS_IOC_FSGROWFSDATA on the mounted xfs filesystem `dir` is open on: grows its data
/// section online to `blocks` blocks, keeping the inode space limit `imaxpct`.
pub fn xfs_grow(dir: &std::fs::File, blocks: u64, imaxpct: u32) -> Result<(), Errno> {
    #[repr(C)]
    struct XfsGrowfsData {
        newblocks: u64,
        imaxpct: u32,
    }
    const _: () = assert!(std::mem::size_of::<XfsGrowfsData>() == 16);
    // _IOW('X', 110, struct xfs_growfs_data)
    const XFS_IOC_FSGROWFSDATA: libc::c_ulong = 0x4010_586e;
    let mut arg = XfsGrowfsData {
        newblocks: blocks,
        imaxpct,
    };
    // SAFETY: `arg` has the layout of struct xfs_growfs_data (linux xfs_fs.h) and lives across
    // the call; the descriptor is open for the call.
    unsafe { ioctl_arg(dir, XFS_IOC_FSGROWFSDATA, &mut arg) }
}

/// BTRFS_IOC_RESIZE on the mounted btrfs filesystem `dir` is open on: device 1 (a root on
/// one partition) grows to the end of its device ("1:max", as `btrfs filesystem resize max`).
pub fn btrfs_resize_max(dir: &std::fs::File) -> Result<(), Errno> {
    #[repr(C)]
    struct BtrfsVolArgs {
        fd: i64,
        name: [u8; 4088],
    }
    const _: () = assert!(std::mem::size_of::<BtrfsVolArgs>() == 4096);
    // _IOW(0x94, 3, struct btrfs_ioctl_vol_args)
    const BTRFS_IOC_RESIZE: libc::c_ulong = 0x5000_9403;
    let mut arg = BtrfsVolArgs {
        fd: 0,
        name: [0; 4088],
    };
    for (to, from) in arg.name.iter_mut().zip(b"1:max") {
        *to = *from;
    }
    // SAFETY: `arg` has the layout of struct btrfs_ioctl_vol_args (linux btrfs.h), its name
    // NUL-terminated, and lives across the call; the descriptor is open for the call.
    unsafe { ioctl_arg(dir, BTRFS_IOC_RESIZE, &mut arg) }
}

/// FIFREEZE then FITHAW on the mounted filesystem `dir` is open on: freezing writes every
/// dirty metadata buffer home and quiesces the log, so a later mount has nothing to recover.
pub fn freeze_thaw(dir: &std::fs::File) -> Result<(), Errno> {
    // _IOWR('X', 119, int) and _IOWR('X', 120, int)
    const FIFREEZE: libc::c_ulong = 0xc004_5877;
    const FITHAW: libc::c_ulong = 0xc004_5878;
    let mut unused: libc::c_int = 0;
    // SAFETY: both requests take an int argument, which `unused` is and which lives across the
    // calls; the descriptor is open for them.
    unsafe { ioctl_arg(dir, FIFREEZE, &mut unused) }?;
    // SAFETY: as above.
    unsafe { ioctl_arg(dir, FITHAW, &mut unused) }
}
