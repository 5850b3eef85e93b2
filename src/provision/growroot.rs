//! growroot: the root filesystem grows to its disk on every boot. Azure's OS disk is usually
//! larger than the uploaded image, and users enlarge it later; cloud-init (growpart and
//! resize2fs) and Ubuntu's initramfs do this, so an image that drops cloud-init for azprov
//! must not lose it. The root's partition, when it is the last on its disk, is extended to the
//! disk's end (`disk::grow` plans the table; the writes go in its safe order, each direct
//! and synced),
//! the kernel told (BLKPG), and the filesystem grown online by its own ioctl (ext4
//! EXT4_IOC_RESIZE_FS, xfs XFS_IOC_FSGROWFSDATA, btrfs BTRFS_IOC_RESIZE "1:max"). Skipped with
//! one line saying why: device-mapper (LVM, LUKS), a partition that is not last, less than
//! 1 MiB to gain, another filesystem, a btrfs on several devices. `azprov.growroot=0` turns
//! it off. Runs on the mounted root in both modes, before anything is written into it.

use crate::disk::grow::{self, Skip};
use crate::disk::superblock;
use nix::errno::Errno;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

/// Why growroot grew nothing, or stopped partway (a skip is not a failure of the run).
#[derive(Debug)]
pub enum GrowError {
    /// A call on a file failed: the call, the file, why.
    File(&'static str, String, std::io::Error),
    /// An ioctl on the root failed: what it did, the root's device, why.
    Ioctl(&'static str, String, Errno),
    /// The root's device number names no block device in sysfs.
    NotBlock(u64, u64),
    /// device-mapper (LVM or LUKS).
    DeviceMapper(String),
    /// sysfs gives no size for the disk or partition.
    NoSize(String),
    /// The table cannot be grown as it is.
    Skip(String, Skip),
    /// The ext4 superblock could not be read.
    Ext4Superblock,
    /// The btrfs superblock names several devices, or could not be read.
    BtrfsDevices,
    /// No filesystem azprov recognises on the device.
    Unknown(String),
    /// A filesystem azprov does not grow, and no partition grew.
    Unsupported(String, &'static str),
    /// Nothing to gain.
    Full(String),
}

impl std::fmt::Display for GrowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrowError::File(call, file, e) => write!(f, "{call} {file}: {e}"),
            GrowError::Ioctl(what, name, e) => write!(f, "{what} {name}: {e}"),
            GrowError::NotBlock(maj, min) => {
                write!(f, "{maj}:{min} is not a block device (a virtual root?)")
            }
            GrowError::DeviceMapper(name) => {
                write!(f, "{name} is device-mapper (LVM or LUKS): not grown")
            }
            GrowError::NoSize(name) => write!(f, "no size for {name}"),
            GrowError::Skip(name, skip) => write!(f, "{name}: {skip}; not grown"),
            GrowError::Ext4Superblock => f.write_str("cannot read the ext4 superblock"),
            GrowError::BtrfsDevices => {
                f.write_str("btrfs on more than one device (or an unreadable superblock)")
            }
            GrowError::Unknown(name) => write!(f, "{name}: no filesystem azprov recognises"),
            GrowError::Unsupported(name, fs) => {
                write!(f, "{name} holds {fs}, which azprov does not grow")
            }
            GrowError::Full(name) => write!(f, "{name} fills its disk already"),
        }
    }
}

impl std::error::Error for GrowError {}

/// A failed call on `file` as a [`GrowError`].
fn file_err<'a>(
    call: &'static str,
    file: &'a Path,
) -> impl FnOnce(std::io::Error) -> GrowError + 'a {
    move |e| GrowError::File(call, file.display().to_string(), e)
}

/// The root's block device as sysfs knows it.
struct Dev {
    name: String,
    /// The disk and the 1-based partition number, when it is a partition.
    partition: Option<(String, u32)>,
}

/// The source device of the mount at `mount` in /proc/self/mountinfo (btrfs gives its
/// mounts an anonymous st_dev; its source names the partition).
fn mount_source(mount: &Path) -> Option<std::path::PathBuf> {
    let want = std::fs::canonicalize(mount).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let mut fields = l.split(' ');
        let point = fields.nth(4)?;
        let (_, after) = l.split_once(" - ")?;
        let source = after.split(' ').nth(1)?;
        (Path::new(&point.replace("\\040", " ")) == want && source.starts_with("/dev/"))
            .then(|| std::path::PathBuf::from(source))
    })
}

fn sysfs_dev(mount: &Path, sys: &Path) -> Result<Dev, GrowError> {
    let st = std::fs::metadata(mount).map_err(file_err("stat", mount))?;
    let mut id = st.dev();
    if nix::sys::stat::major(id) == 0 {
        if let Some(source) = mount_source(mount) {
            id = std::fs::metadata(&source)
                .map_err(file_err("stat", &source))?
                .rdev();
        }
    }
    let (maj, min) = (nix::sys::stat::major(id), nix::sys::stat::minor(id));
    let link = sys.join(format!("dev/block/{maj}:{min}"));
    let path = std::fs::canonicalize(&link).map_err(|_| GrowError::NotBlock(maj, min))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let partition = std::fs::read_to_string(path.join("partition"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .and_then(|n| {
            let disk = path.parent()?.file_name()?.to_string_lossy().into_owned();
            Some((disk, n))
        });
    Ok(Dev { name, partition })
}

fn sectors(sys: &Path, name: &str) -> Option<u64> {
    let p = sys.join("class/block").join(name).join("size");
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// `len` bytes at `at` of the device `dev` (a superblock).
fn read_sb(dev: &Path, at: usize, len: usize) -> Option<Vec<u8>> {
    let mut sb = vec![0u8; len];
    File::open(dev)
        .ok()?
        .read_exact_at(&mut sb, at as u64)
        .ok()?;
    Some(sb)
}

/// Writes `bytes` (whole sectors) at `at` through `f`, opened O_DIRECT: from a buffer aligned
/// to the page, which every disk's logical block size divides.
fn write_direct(f: &File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    const ALIGN: usize = 4096;
    let mut buf = vec![0u8; bytes.len() + ALIGN];
    let skip = buf.as_ptr().align_offset(ALIGN);
    let aligned = buf
        .get_mut(skip..skip + bytes.len())
        .ok_or(std::io::ErrorKind::InvalidInput)?;
    aligned.copy_from_slice(bytes);
    f.write_all_at(aligned, at)
}

/// A disk whose partition table growroot reads and writes.
struct Table<'a> {
    disk: &'a Path,
    bytes: u64,
    /// Its logical block size (512, or 4096 on a 4Kn disk).
    sector: u64,
}

/// The disk's logical block size from sysfs (`queue/logical_block_size`, what BLKSSZGET
/// gives), 512 when sysfs does not say.
fn logical_block_size(sys: &Path, disk: &str) -> u64 {
    let p = sys
        .join("class/block")
        .join(disk)
        .join("queue/logical_block_size");
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(512)
}

/// Writes `writes` to `disk` in their order, each direct and synced: the table's writes
/// bypass the disk's page cache, so each goes out as exactly its own sectors, never as a
/// 4 KiB page that carries neighbours from a cache the partition's filesystem does not share.
fn write_in_order(disk: &Path, writes: &[(u64, Vec<u8>)]) -> Result<(), GrowError> {
    let direct = File::options()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(disk)
        .map_err(file_err("open (O_DIRECT)", disk))?;
    for (at, bytes) in writes {
        write_direct(&direct, bytes, *at).map_err(file_err("write", disk))?;
        direct.sync_data().map_err(file_err("sync", disk))?;
    }
    Ok(())
}

/// growroot's calls on the disk that holds the root's partition, behind a seam (as
/// `sys::kernel::Kernel` is PID 1's): [`Disk`] makes them on the device; the unit tests' fake
/// records them and fails the one it is told to, so their order and every failure path are
/// tested without a disk.
trait DiskCalls {
    /// `len` bytes at `at`, None when they cannot be read.
    fn read(&mut self, at: u64, len: usize) -> Option<Vec<u8>>;
    /// The writes in their order, each direct and synced.
    fn write(&mut self, writes: &[(u64, Vec<u8>)]) -> Result<(), GrowError>;
    /// BLKPG: partition `number` now spans `length` bytes from `start`.
    fn resize_partition(&mut self, number: u32, start: u64, length: u64) -> Result<(), Errno>;
}

/// The disk device itself.
struct Disk<'a> {
    path: &'a Path,
    file: File,
}

impl DiskCalls for Disk<'_> {
    fn read(&mut self, at: u64, len: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, at).ok().map(|_| b)
    }

    fn write(&mut self, writes: &[(u64, Vec<u8>)]) -> Result<(), GrowError> {
        write_in_order(self.path, writes)
    }

    fn resize_partition(&mut self, number: u32, start: u64, length: u64) -> Result<(), Errno> {
        crate::sys::block::resize_partition(&self.file, number as i32, start, length)
    }
}

/// Partition `number` of `table` (the root, `name`) grown to the disk's end: a GPT primary
/// that a cut left unsound put back from its backup first, then the plan's writes and BLKPG.
/// `writable` is called before the first write. The line to say, or None: nothing to gain.
fn grow_partition(
    table: &Table,
    disk: &mut impl DiskCalls,
    name: &str,
    number: u32,
    mut writable: impl FnMut(),
) -> Result<Option<String>, GrowError> {
    let fix = grow::restore(&mut |at, len| disk.read(at, len), table.bytes, table.sector);
    if let Some(fix) = fix {
        writable();
        disk.write(&fix)?;
        log::warn!(
            "growroot: {}'s primary GPT was not sound (a cut during an earlier grow); put back \
             from its backup",
            table.disk.display()
        );
    }
    let plan = grow::plan(
        &mut |at, len| disk.read(at, len),
        table.bytes,
        number,
        table.sector,
    );
    let plan = match plan {
        Ok(plan) => plan,
        Err(Skip::Little(_)) => return Ok(None),
        Err(skip) => return Err(GrowError::Skip(name.to_string(), skip)),
    };
    writable();
    let t = Instant::now();
    if let Some(note) = plan.note {
        log::info!("growroot: {}: {note}", table.disk.display());
    }
    disk.write(&plan.writes)?;
    disk.resize_partition(number, plan.start * plan.sector, plan.sectors * plan.sector)
        .map_err(|e| GrowError::Ioctl("BLKPG resize of", name.to_string(), e))?;
    Ok(Some(format!(
        "partition {name} +{} MiB ({}) in {} ms",
        plan.gain >> 20,
        plan.table,
        t.elapsed().as_millis()
    )))
}

/// The whole disks under `sys` (not yet in `checked`) whose primary GPT a cut during a grow
/// left unsound beside a sound backup: the primary put back from the backup, and the kernel
/// told to read the table again, so the root's partition can be found. PID 1 runs it while it
/// waits for the root (the kernel reads only the primary, and without it finds no partition).
/// The disks it put back.
pub fn restore_tables(
    sys: &Path,
    dev: &Path,
    checked: &mut std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut restored = Vec::new();
    for disk in crate::sys::sorted_names(&sys.join("class/block")) {
        let whole = !sys
            .join("class/block")
            .join(&disk)
            .join("partition")
            .exists();
        let virtual_disk = ["loop", "ram", "sr", "dm-", "md"]
            .iter()
            .any(|p| disk.starts_with(p));
        if !whole || virtual_disk || checked.contains(&disk) {
            continue;
        }
        // sysfs shows a disk before devtmpfs has its node: looked at again on the next call
        // until its node opens and its size is known
        let path = dev.join(&disk);
        let size = sectors(sys, &disk).filter(|&s| s > 0).map(|s| s * 512);
        let (Some(bytes), Ok(file)) = (size, File::open(&path)) else {
            continue;
        };
        checked.insert(disk.clone());
        let mut calls = Disk { path: &path, file };
        let sector = logical_block_size(sys, &disk);
        let Some(fix) = grow::restore(&mut |at, len| calls.read(at, len), bytes, sector) else {
            continue;
        };
        match calls.write(&fix).and_then(|()| {
            crate::sys::block::reread_partitions(&calls.file)
                .map_err(|e| GrowError::Ioctl("BLKRRPART on", disk.clone(), e))
        }) {
            Ok(()) => {
                log::warn!(
                    "growroot: {disk}'s primary GPT was not sound (a cut during a grow); put back \
                     from its backup"
                );
                restored.push(disk);
            }
            Err(e) => log::warn!("growroot: {disk}'s primary GPT could not be put back: {e}"),
        }
    }
    restored
}

/// growroot's calls on the root's filesystem (its device read, its mounted root's ioctls),
/// behind a seam as [`DiskCalls`] is.
trait FsCalls {
    /// The filesystem's type from its superblock.
    fn fstype(&mut self) -> Option<&'static str>;
    /// ext4's block size and block count.
    fn ext4_blocks(&mut self) -> Option<(u64, u64)>;
    fn ext4_resize(&mut self, blocks: u64) -> Result<(), Errno>;
    fn xfs_geometry(&mut self) -> Result<crate::sys::block::XfsGeometry, Errno>;
    fn xfs_grow(&mut self, blocks: u64, imaxpct: u32) -> Result<(), Errno>;
    fn freeze_thaw(&mut self) -> Result<(), Errno>;
    /// The bytes btrfs's only device holds; None with more than one device.
    fn btrfs_bytes(&mut self) -> Option<u64>;
    fn btrfs_resize_max(&mut self) -> Result<(), Errno>;
}

/// The root's filesystem: its device node, and its mounted root open for the ioctls.
struct MountedFs<'a> {
    node: &'a Path,
    dir: File,
}

impl FsCalls for MountedFs<'_> {
    fn fstype(&mut self) -> Option<&'static str> {
        crate::disk::block::probe_device(self.node).map(|i| i.fstype)
    }
    fn ext4_blocks(&mut self) -> Option<(u64, u64)> {
        let sb = read_sb(self.node, superblock::ext4::AT, superblock::ext4::LEN)?;
        superblock::ext4_size(&sb)
    }
    fn ext4_resize(&mut self, blocks: u64) -> Result<(), Errno> {
        crate::sys::block::ext4_resize(&self.dir, blocks)
    }
    fn xfs_geometry(&mut self) -> Result<crate::sys::block::XfsGeometry, Errno> {
        crate::sys::block::xfs_geometry(&self.dir)
    }
    fn xfs_grow(&mut self, blocks: u64, imaxpct: u32) -> Result<(), Errno> {
        crate::sys::block::xfs_grow(&self.dir, blocks, imaxpct)
    }
    fn freeze_thaw(&mut self) -> Result<(), Errno> {
        crate::sys::block::freeze_thaw(&self.dir)
    }
    fn btrfs_bytes(&mut self) -> Option<u64> {
        let sb = read_sb(self.node, superblock::btrfs::AT, superblock::btrfs::LEN)?;
        superblock::btrfs_single_device_bytes(&sb)
    }
    fn btrfs_resize_max(&mut self) -> Result<(), Errno> {
        crate::sys::block::btrfs_resize_max(&self.dir)
    }
}

/// What `grow_filesystem` did.
#[derive(Debug, PartialEq, Eq)]
enum Grown {
    Done(String),
    /// Less than `grow::MIN_GAIN` to gain.
    Nothing,
    /// A filesystem azprov does not grow, by its type.
    Unsupported(&'static str),
}

/// The filesystem on `name` grown online by its own ioctl to the `bytes` its partition holds
/// (ext4; xfs, then a freeze and thaw; btrfs on one device). `writable` is called before the
/// first change.
fn grow_filesystem(
    name: &str,
    bytes: u64,
    fs: &mut impl FsCalls,
    mut writable: impl FnMut(),
) -> Result<Grown, GrowError> {
    // each timed from its first change (after `writable`)
    let (kind, from, to, t) = match fs.fstype() {
        Some("ext4") => {
            let (bs, blocks) = fs.ext4_blocks().ok_or(GrowError::Ext4Superblock)?;
            let target = bytes / bs;
            if target <= blocks || (target - blocks) * bs < grow::MIN_GAIN {
                return Ok(Grown::Nothing);
            }
            writable();
            let t = Instant::now();
            fs.ext4_resize(target)
                .map_err(|e| GrowError::Ioctl("ext4 resize of", name.to_string(), e))?;
            ("ext4", blocks * bs, target * bs, t)
        }
        Some("xfs") => {
            let geo = fs
                .xfs_geometry()
                .map_err(|e| GrowError::Ioctl("xfs geometry of", name.to_string(), e))?;
            let bs = u64::from(geo.block_size.max(512));
            let target = bytes / bs;
            if target <= geo.data_blocks || (target - geo.data_blocks) * bs < grow::MIN_GAIN {
                return Ok(Grown::Nothing);
            }
            writable();
            let t = Instant::now();
            fs.xfs_grow(target, geo.imaxpct)
                .map_err(|e| GrowError::Ioctl("xfs grow of", name.to_string(), e))?;
            // the grow is committed to the log only; a 6.1 kernel that must replay it after a
            // power cut refuses the mount (EUCLEAN: the new AGs' buffers lie beyond the old
            // superblock's size). A freeze writes it home and quiesces the log.
            fs.freeze_thaw().map_err(|e| {
                GrowError::Ioctl("xfs freeze after the grow of", name.to_string(), e)
            })?;
            ("xfs", geo.data_blocks * bs, target * bs, t)
        }
        Some("btrfs") => {
            let size = fs.btrfs_bytes().ok_or(GrowError::BtrfsDevices)?;
            if bytes <= size || bytes - size < grow::MIN_GAIN {
                return Ok(Grown::Nothing);
            }
            writable();
            let t = Instant::now();
            fs.btrfs_resize_max()
                .map_err(|e| GrowError::Ioctl("btrfs resize of", name.to_string(), e))?;
            ("btrfs", size, bytes, t)
        }
        Some(other) => return Ok(Grown::Unsupported(other)),
        None => return Err(GrowError::Unknown(name.to_string())),
    };
    Ok(Grown::Done(format!(
        "{kind} {} MiB -> {} MiB in {} ms",
        from >> 20,
        to >> 20,
        t.elapsed().as_millis()
    )))
}

/// Grows the root mounted at `mount` (its devices under `dev`, sysfs at `sys`). `writable` is
/// called once, and its guard held, only when something is to grow. Ok: what was done, one line.
/// Err: why nothing was, or what stopped it.
pub fn run<G>(
    mount: &Path,
    sys: &Path,
    dev: &Path,
    writable: impl Fn() -> G,
) -> Result<String, GrowError> {
    let d = sysfs_dev(mount, sys)?;
    if d.name.starts_with("dm-") {
        return Err(GrowError::DeviceMapper(d.name));
    }
    let mut done = Vec::new();
    let mut guard = None;
    if let Some((disk, number)) = &d.partition {
        let disk_path = dev.join(disk);
        let table = Table {
            disk: &disk_path,
            bytes: sectors(sys, disk).ok_or_else(|| GrowError::NoSize(disk.clone()))? * 512,
            sector: logical_block_size(sys, disk),
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(&disk_path)
            .map_err(file_err("open", &disk_path))?;
        let mut calls = Disk {
            path: &disk_path,
            file,
        };
        if let Some(line) = grow_partition(&table, &mut calls, &d.name, *number, || {
            guard.get_or_insert_with(&writable);
        })? {
            done.push(line);
        }
    }
    // the filesystem, to what its device holds now (also after a boot cut short between the
    // partition and the filesystem)
    let part_bytes = sectors(sys, &d.name).ok_or_else(|| GrowError::NoSize(d.name.clone()))? * 512;
    // each filesystem's grow ioctl goes to its mounted root
    let mut fs = MountedFs {
        node: &dev.join(&d.name),
        dir: File::open(mount).map_err(file_err("open", mount))?,
    };
    match grow_filesystem(&d.name, part_bytes, &mut fs, || {
        guard.get_or_insert_with(&writable);
    })? {
        Grown::Done(line) => done.push(line),
        Grown::Nothing => {}
        Grown::Unsupported(other) if done.is_empty() => {
            return Err(GrowError::Unsupported(d.name, other));
        }
        Grown::Unsupported(other) => done.push(format!("{other} not grown (not supported)")),
    }
    drop(guard);
    if done.is_empty() {
        return Err(GrowError::Full(d.name));
    }
    Ok(done.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::grow::tests::{reader, sfdisk};

    /// A disk whose first partition follows the primary array at once: no gap to stage the
    /// array in, so growroot writes the entry sector and then the header.
    const NO_GAP: &str = "label: gpt\nfirst-lba: 34\nstart=34,size=8M\nsize=8M\n";

    /// A 64 MiB GPT disk image (sfdisk) grown from 32 MiB, cut between the primary's entry
    /// sector and its header: the kernel would find no partition on it.
    fn torn_disk(path: &Path) {
        File::create(path).unwrap().set_len(32 << 20).unwrap();
        sfdisk(path.to_str().unwrap(), NO_GAP);
        let f = File::options().read(true).write(true).open(path).unwrap();
        f.set_len(64 << 20).unwrap();
        let plan = grow::plan(&mut reader(&f), 64 << 20, 2, 512).unwrap();
        // all but the last write: the header
        for (at, bytes) in plan.writes.iter().take(plan.writes.len() - 1) {
            f.write_all_at(bytes, *at).unwrap();
        }
        assert!(grow::restore(&mut reader(&f), 64 << 20, 512).is_some());
    }

    #[test]
    fn a_disk_is_looked_at_again_until_its_node_opens_and_then_put_back() {
        // beside the build, not in /tmp: the table's writes are O_DIRECT, which a tmpfs before
        // Linux 6.6 refuses
        let d = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("azprov-restore-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (sys, dev) = (d.join("sys"), d.join("dev"));
        std::fs::create_dir_all(sys.join("class/block/sdz/queue")).unwrap();
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(sys.join("class/block/sdz/size"), format!("{}\n", 64 << 11)).unwrap();
        std::fs::write(
            sys.join("class/block/sdz/queue/logical_block_size"),
            "512\n",
        )
        .unwrap();
        let mut checked = std::collections::BTreeSet::new();
        // sysfs has the disk, devtmpfs no node yet: not given up on
        assert!(restore_tables(&sys, &dev, &mut checked).is_empty());
        assert!(checked.is_empty());
        torn_disk(&dev.join("sdz"));
        // the node is there: the primary is put back (the kernel's re-read then fails on a
        // file, so it is not counted as restored, but the table on it is whole)
        restore_tables(&sys, &dev, &mut checked);
        assert!(checked.contains("sdz"));
        let f = File::open(dev.join("sdz")).unwrap();
        assert_eq!(
            grow::restore(&mut reader(&f), 64 << 20, 512),
            None,
            "sound now"
        );
        assert!(matches!(
            grow::plan(&mut reader(&f), 64 << 20, 2, 512),
            Err(Skip::Little(_))
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A disk in memory that records growroot's calls (and `writable`'s, in `log`) and fails
    /// the one named in `fail`.
    struct FakeDisk<'a> {
        image: Vec<u8>,
        log: &'a std::cell::RefCell<Vec<String>>,
        fail: Option<&'static str>,
    }

    impl DiskCalls for FakeDisk<'_> {
        fn read(&mut self, at: u64, len: usize) -> Option<Vec<u8>> {
            self.image
                .get(at as usize..at as usize + len)
                .map(<[u8]>::to_vec)
        }
        fn write(&mut self, writes: &[(u64, Vec<u8>)]) -> Result<(), GrowError> {
            self.log
                .borrow_mut()
                .push(format!("write {}", writes.len()));
            if self.fail == Some("write") {
                let eio = std::io::Error::from_raw_os_error(libc::EIO);
                return Err(GrowError::File("write", "/dev/sdz".into(), eio));
            }
            for (at, bytes) in writes {
                let at = *at as usize;
                self.image[at..at + bytes.len()].copy_from_slice(bytes);
            }
            Ok(())
        }
        fn resize_partition(&mut self, number: u32, start: u64, length: u64) -> Result<(), Errno> {
            self.log
                .borrow_mut()
                .push(format!("blkpg {number} {start} {length}"));
            match self.fail {
                Some("blkpg") => Err(Errno::EBUSY),
                _ => Ok(()),
            }
        }
    }

    /// A 32 MiB GPT image (sfdisk): 8 MiB, then a partition to the image's end; on a disk of
    /// `disk_mib` MiB.
    fn gpt_image(disk_mib: u64) -> Vec<u8> {
        gpt_image_of(disk_mib, "label: gpt\n,8M\n,\n")
    }

    fn gpt_image_of(disk_mib: u64, layout: &str) -> Vec<u8> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("azprov-growseam-{}-{n}", std::process::id()));
        File::create(&d).unwrap().set_len(32 << 20).unwrap();
        sfdisk(d.to_str().unwrap(), layout);
        File::options()
            .write(true)
            .open(&d)
            .unwrap()
            .set_len(disk_mib << 20)
            .unwrap();
        let image = std::fs::read(&d).unwrap();
        std::fs::remove_file(&d).unwrap();
        image
    }

    fn table(disk_mib: u64) -> Table<'static> {
        Table {
            disk: Path::new("/dev/sdz"),
            bytes: disk_mib << 20,
            sector: 512,
        }
    }

    /// grow_partition on a fake: its result and the calls in order.
    fn partition_calls(
        image: Vec<u8>,
        disk_mib: u64,
        fail: Option<&'static str>,
    ) -> (Result<Option<String>, String>, Vec<String>, Vec<u8>) {
        let log = std::cell::RefCell::new(Vec::new());
        let mut disk = FakeDisk {
            image,
            log: &log,
            fail,
        };
        let r = grow_partition(&table(disk_mib), &mut disk, "sdz2", 2, || {
            log.borrow_mut().push("writable".into())
        });
        let image = disk.image;
        (r.map_err(|e| e.to_string()), log.into_inner(), image)
    }

    #[test]
    fn the_partition_grows_writable_first_then_the_table_then_blkpg() {
        let (r, calls, image) = partition_calls(gpt_image(64), 64, None);
        let line = r.unwrap().unwrap();
        assert!(line.starts_with("partition sdz2 +32 MiB (GPT)"), "{line}");
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(calls[0], "writable");
        assert!(calls[1].starts_with("write "), "{calls:?}");
        // partition 2 starts at 9 MiB and ends at the new last usable sector (before the
        // backup's 32 sectors of entries and its header)
        let want = format!("blkpg 2 {} {}", 9 << 20, (64 << 20) - (9 << 20) - 33 * 512);
        assert_eq!(calls[2], want);
        // the table on the fake disk is the new one: nothing more to gain
        let (again, calls, _) = partition_calls(image, 64, None);
        assert_eq!(again, Ok(None));
        assert!(calls.is_empty(), "{calls:?}");
    }

    #[test]
    fn nothing_to_gain_makes_nothing_writable_and_calls_nothing() {
        let (r, calls, _) = partition_calls(gpt_image(32), 32, None);
        assert_eq!(r, Ok(None));
        assert!(calls.is_empty(), "{calls:?}");
    }

    #[test]
    fn a_failed_write_stops_before_blkpg_and_a_failed_blkpg_is_the_error() {
        let (r, calls, _) = partition_calls(gpt_image(64), 64, Some("write"));
        assert!(
            r.as_ref().is_err_and(|e| e.starts_with("write /dev/sdz: ")),
            "{r:?}"
        );
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert!(calls[1].starts_with("write "), "{calls:?}");
        let (r, calls, _) = partition_calls(gpt_image(64), 64, Some("blkpg"));
        assert_eq!(
            r,
            Err("BLKPG resize of sdz2: EBUSY: Device or resource busy".into())
        );
        assert_eq!(calls.last().map(|c| &c[..5]), Some("blkpg"));
    }

    #[test]
    fn a_torn_primary_is_put_back_before_the_grow_is_planned() {
        // a grow cut between the entry sector and the header (a disk with no gap to stage the
        // array in): the primary's array does not match its header, the backup at the new end
        // is sound and new
        let mut image = gpt_image_of(64, NO_GAP);
        let plan = grow::plan(
            &mut |at, len| {
                image
                    .get(at as usize..at as usize + len)
                    .map(<[u8]>::to_vec)
            },
            64 << 20,
            2,
            512,
        )
        .unwrap();
        for (at, bytes) in plan.writes.iter().take(plan.writes.len() - 1) {
            image[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        let (r, calls, _) = partition_calls(image, 64, None);
        // put back (the new table, from the backup): then there is nothing left to grow
        assert_eq!(r, Ok(None));
        assert_eq!(calls.first().map(String::as_str), Some("writable"));
        assert!(
            calls.get(1).is_some_and(|c| c.starts_with("write ")),
            "{calls:?}"
        );
        assert!(!calls.iter().any(|c| c.starts_with("blkpg")), "{calls:?}");
    }

    /// A filesystem that records growroot's calls and fails the one named in `fail`.
    struct FakeFs<'a> {
        fstype: Option<&'static str>,
        /// ext4's (block size, blocks), xfs's (block size, data blocks), btrfs's (1, bytes)
        size: (u64, u64),
        log: &'a std::cell::RefCell<Vec<String>>,
        fail: Option<&'static str>,
    }

    impl FakeFs<'_> {
        fn call(&self, what: String, name: &str) -> Result<(), Errno> {
            self.log.borrow_mut().push(what);
            if self.fail == Some(name) {
                return Err(Errno::EIO);
            }
            Ok(())
        }
    }

    impl FsCalls for FakeFs<'_> {
        fn fstype(&mut self) -> Option<&'static str> {
            self.fstype
        }
        fn ext4_blocks(&mut self) -> Option<(u64, u64)> {
            Some(self.size)
        }
        fn ext4_resize(&mut self, blocks: u64) -> Result<(), Errno> {
            self.call(format!("ext4_resize {blocks}"), "ext4_resize")
        }
        fn xfs_geometry(&mut self) -> Result<crate::sys::block::XfsGeometry, Errno> {
            Ok(crate::sys::block::XfsGeometry {
                block_size: self.size.0 as u32,
                data_blocks: self.size.1,
                imaxpct: 25,
            })
        }
        fn xfs_grow(&mut self, blocks: u64, imaxpct: u32) -> Result<(), Errno> {
            self.call(format!("xfs_grow {blocks} {imaxpct}"), "xfs_grow")
        }
        fn freeze_thaw(&mut self) -> Result<(), Errno> {
            self.call("freeze_thaw".into(), "freeze_thaw")
        }
        fn btrfs_bytes(&mut self) -> Option<u64> {
            Some(self.size.1)
        }
        fn btrfs_resize_max(&mut self) -> Result<(), Errno> {
            self.call("btrfs_resize_max".into(), "btrfs_resize_max")
        }
    }

    /// grow_filesystem of a filesystem `size` on a 256 MiB partition: result and calls.
    fn fs_calls(
        fstype: Option<&'static str>,
        size: (u64, u64),
        fail: Option<&'static str>,
    ) -> (Result<Grown, String>, Vec<String>) {
        let log = std::cell::RefCell::new(Vec::new());
        let r = grow_filesystem(
            "sdz2",
            256 << 20,
            &mut FakeFs {
                fstype,
                size,
                log: &log,
                fail,
            },
            || log.borrow_mut().push("writable".into()),
        );
        (r.map_err(|e| e.to_string()), log.into_inner())
    }

    #[test]
    fn each_filesystem_grows_by_its_own_call_after_writable() {
        let (r, calls) = fs_calls(Some("ext4"), (4096, 12288), None);
        assert!(
            matches!(&r, Ok(Grown::Done(l)) if l.starts_with("ext4 48 MiB -> 256 MiB")),
            "{r:?}"
        );
        assert_eq!(calls, ["writable", "ext4_resize 65536"]);
        // xfs: the grow, then the freeze that puts it on disk
        let (r, calls) = fs_calls(Some("xfs"), (4096, 12288), None);
        assert!(
            matches!(&r, Ok(Grown::Done(l)) if l.starts_with("xfs 48 MiB -> 256 MiB")),
            "{r:?}"
        );
        assert_eq!(calls, ["writable", "xfs_grow 65536 25", "freeze_thaw"]);
        let (r, calls) = fs_calls(Some("btrfs"), (1, 48 << 20), None);
        assert!(
            matches!(&r, Ok(Grown::Done(l)) if l.starts_with("btrfs 48 MiB -> 256 MiB")),
            "{r:?}"
        );
        assert_eq!(calls, ["writable", "btrfs_resize_max"]);
    }

    #[test]
    fn a_filesystem_with_little_to_gain_is_left_alone_and_nothing_made_writable() {
        // 255.5 MiB of 256: less than MIN_GAIN
        for fs in ["ext4", "xfs"] {
            let (r, calls) = fs_calls(Some(fs), (4096, 65408), None);
            assert_eq!(r, Ok(Grown::Nothing), "{fs}");
            assert!(calls.is_empty(), "{fs}: {calls:?}");
        }
        let (r, calls) = fs_calls(Some("btrfs"), (1, (256 << 20) - 4096), None);
        assert_eq!(r, Ok(Grown::Nothing));
        assert!(calls.is_empty());
    }

    #[test]
    fn a_failed_xfs_grow_is_not_frozen_and_a_failed_freeze_is_the_error() {
        let (r, calls) = fs_calls(Some("xfs"), (4096, 12288), Some("xfs_grow"));
        assert_eq!(r, Err("xfs grow of sdz2: EIO: I/O error".into()));
        assert_eq!(calls, ["writable", "xfs_grow 65536 25"]);
        let (r, calls) = fs_calls(Some("xfs"), (4096, 12288), Some("freeze_thaw"));
        assert_eq!(
            r,
            Err("xfs freeze after the grow of sdz2: EIO: I/O error".into())
        );
        assert_eq!(calls.len(), 3);
    }

    #[test]
    fn other_filesystems_are_named_and_an_unknown_one_is_an_error() {
        assert_eq!(
            fs_calls(Some("vfat"), (0, 0), None).0,
            Ok(Grown::Unsupported("vfat"))
        );
        assert_eq!(
            fs_calls(None, (0, 0), None).0,
            Err("sdz2: no filesystem azprov recognises".into())
        );
    }
}
