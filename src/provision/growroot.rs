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
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

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

fn sysfs_dev(mount: &Path, sys: &Path) -> Result<Dev, String> {
    let st = std::fs::metadata(mount).map_err(|e| format!("stat {}: {e}", mount.display()))?;
    let mut id = st.dev();
    if nix::sys::stat::major(id) == 0 {
        if let Some(source) = mount_source(mount) {
            id = std::fs::metadata(&source)
                .map_err(|e| format!("stat {}: {e}", source.display()))?
                .rdev();
        }
    }
    let (maj, min) = (nix::sys::stat::major(id), nix::sys::stat::minor(id));
    let link = sys.join(format!("dev/block/{maj}:{min}"));
    let path = std::fs::canonicalize(&link)
        .map_err(|_| format!("{maj}:{min} is not a block device (a virtual root?)"))?;
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

/// ext4's block size and block count from its superblock (read from the device).
fn ext4_blocks(dev: &Path) -> Option<(u64, u64)> {
    let f = File::open(dev).ok()?;
    let mut sb = vec![0u8; 1024];
    f.read_exact_at(&mut sb, 1024).ok()?;
    let le32 = |at: usize| crate::disk::block::le32(&sb, at);
    let log = le32(24)?;
    if log > 6 {
        return None;
    }
    let bs = 1024u64 << log;
    let lo = u64::from(le32(4)?);
    let incompat = le32(0x60)?;
    let hi = if incompat & 0x80 != 0 {
        u64::from(le32(0x150)?)
    } else {
        0
    };
    Some((bs, (hi << 32) | lo))
}

/// A single-device btrfs's size on its device (the superblock's dev_item total_bytes), or
/// None for another filesystem or one spanning several devices.
fn btrfs_dev_bytes(dev: &Path) -> Option<u64> {
    let f = File::open(dev).ok()?;
    let mut sb = vec![0u8; 4096];
    f.read_exact_at(&mut sb, 65536).ok()?;
    let le64 = |at: usize| crate::disk::block::le64(&sb, at);
    if sb.get(0x40..0x48)? != b"_BHRfS_M" || le64(0x88)? != 1 || le64(0xc9)? != 1 {
        return None;
    }
    le64(0xd1)
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
fn write_in_order(disk: &Path, writes: &[(u64, Vec<u8>)]) -> Result<(), String> {
    let direct = File::options()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(disk)
        .map_err(|e| format!("open {} for direct writes: {e}", disk.display()))?;
    for (at, bytes) in writes {
        write_direct(&direct, bytes, *at).map_err(|e| format!("write {}: {e}", disk.display()))?;
        direct
            .sync_data()
            .map_err(|e| format!("sync {}: {e}", disk.display()))?;
    }
    Ok(())
}

/// Partition `number` of `table` (the root, `name`) grown to the disk's end: a GPT primary
/// that a cut left unsound put back from its backup first, then the plan's writes and BLKPG.
/// `writable` is called before the first write. The line to say, or None: nothing to gain.
fn grow_partition(
    table: &Table,
    name: &str,
    number: u32,
    mut writable: impl FnMut(),
) -> Result<Option<String>, String> {
    let f = File::options()
        .read(true)
        .write(true)
        .open(table.disk)
        .map_err(|e| format!("open {}: {e}", table.disk.display()))?;
    let mut read = |at: u64, len: usize| {
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, at).ok().map(|_| b)
    };
    if let Some(fix) = grow::restore(&mut read, table.bytes, table.sector) {
        writable();
        write_in_order(table.disk, &fix)?;
        log::warn!(
            "growroot: {}'s primary GPT was not sound (a cut during an earlier grow); put back \
             from its backup",
            table.disk.display()
        );
    }
    let plan = match grow::plan(&mut read, table.bytes, number, table.sector) {
        Ok(plan) => plan,
        Err(Skip::Little(_)) => return Ok(None),
        Err(skip) => return Err(format!("{name}: {skip}; not grown")),
    };
    writable();
    let t = Instant::now();
    if let Some(note) = plan.note {
        log::info!("growroot: {}: {note}", table.disk.display());
    }
    write_in_order(table.disk, &plan.writes)?;
    crate::sys::block::resize_partition(
        &f,
        number as i32,
        plan.start * plan.sector,
        plan.sectors * plan.sector,
    )
    .map_err(|e| format!("BLKPG resize of {name}: {e}"))?;
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
        let (Some(bytes), Ok(f)) = (size, File::open(&path)) else {
            continue;
        };
        checked.insert(disk.clone());
        let mut read = |at: u64, len: usize| {
            let mut b = vec![0u8; len];
            f.read_exact_at(&mut b, at).ok().map(|_| b)
        };
        let Some(fix) = grow::restore(&mut read, bytes, logical_block_size(sys, &disk)) else {
            continue;
        };
        match write_in_order(&path, &fix)
            .and_then(|()| crate::sys::block::reread_partitions(&f).map_err(|e| e.to_string()))
        {
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

/// The root's filesystem: its device's name and node, where it is mounted, and the bytes its
/// partition holds now.
struct Fs<'a> {
    name: &'a str,
    node: &'a Path,
    mount: &'a Path,
    bytes: u64,
}

/// What `grow_filesystem` did.
enum Grown {
    Done(String),
    /// Less than `grow::MIN_GAIN` to gain.
    Nothing,
    /// A filesystem azprov does not grow, by its type.
    Unsupported(&'static str),
}

/// The filesystem of `fs` grown online to its partition by its own ioctl, on its mounted root
/// (ext4; xfs, then a freeze and thaw; btrfs on one device). `writable` is called before the
/// first change.
fn grow_filesystem(fs: &Fs, mut writable: impl FnMut()) -> Result<Grown, String> {
    let name = fs.name;
    // each filesystem's grow ioctl goes to its mounted root
    let dir = File::open(fs.mount).map_err(|e| format!("open {}: {e}", fs.mount.display()))?;
    // each timed from its first change (after `writable`)
    let (kind, from, to, t) = match crate::disk::block::probe_device(fs.node).map(|i| i.fstype) {
        Some("ext4") => {
            let (bs, blocks) = ext4_blocks(fs.node).ok_or("cannot read the ext4 superblock")?;
            let target = fs.bytes / bs;
            if target <= blocks || (target - blocks) * bs < grow::MIN_GAIN {
                return Ok(Grown::Nothing);
            }
            writable();
            let t = Instant::now();
            crate::sys::block::ext4_resize(&dir, target)
                .map_err(|e| format!("ext4 resize of {name}: {e}"))?;
            ("ext4", blocks * bs, target * bs, t)
        }
        Some("xfs") => {
            let geo = crate::sys::block::xfs_geometry(&dir)
                .map_err(|e| format!("xfs geometry of {name}: {e}"))?;
            let bs = u64::from(geo.block_size.max(512));
            let target = fs.bytes / bs;
            if target <= geo.data_blocks || (target - geo.data_blocks) * bs < grow::MIN_GAIN {
                return Ok(Grown::Nothing);
            }
            writable();
            let t = Instant::now();
            crate::sys::block::xfs_grow(&dir, target, geo.imaxpct)
                .map_err(|e| format!("xfs grow of {name}: {e}"))?;
            // the grow is committed to the log only; a 6.1 kernel that must replay it after a
            // power cut refuses the mount (EUCLEAN: the new AGs' buffers lie beyond the old
            // superblock's size). A freeze writes it home and quiesces the log.
            crate::sys::block::freeze_thaw(&dir)
                .map_err(|e| format!("xfs freeze after the grow of {name}: {e}"))?;
            ("xfs", geo.data_blocks * bs, target * bs, t)
        }
        Some("btrfs") => {
            let size = btrfs_dev_bytes(fs.node)
                .ok_or("btrfs on more than one device (or an unreadable superblock)")?;
            if fs.bytes <= size || fs.bytes - size < grow::MIN_GAIN {
                return Ok(Grown::Nothing);
            }
            writable();
            let t = Instant::now();
            crate::sys::block::btrfs_resize_max(&dir)
                .map_err(|e| format!("btrfs resize of {name}: {e}"))?;
            ("btrfs", size, fs.bytes, t)
        }
        Some(other) => return Ok(Grown::Unsupported(other)),
        None => return Err(format!("{name}: no filesystem azprov recognises")),
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
/// Err: why nothing was (a skip is not a failure of the run).
pub fn run<G>(
    mount: &Path,
    sys: &Path,
    dev: &Path,
    writable: impl Fn() -> G,
) -> Result<String, String> {
    let d = sysfs_dev(mount, sys)?;
    if d.name.starts_with("dm-") {
        return Err(format!(
            "{} is device-mapper (LVM or LUKS): not grown",
            d.name
        ));
    }
    let mut done = Vec::new();
    let mut guard = None;
    if let Some((disk, number)) = &d.partition {
        let disk_path = dev.join(disk);
        let table = Table {
            disk: &disk_path,
            bytes: sectors(sys, disk).ok_or(format!("no size for {disk}"))? * 512,
            sector: logical_block_size(sys, disk),
        };
        if let Some(line) = grow_partition(&table, &d.name, *number, || {
            guard.get_or_insert_with(&writable);
        })? {
            done.push(line);
        }
    }
    // the filesystem, to what its device holds now (also after a boot cut short between the
    // partition and the filesystem)
    let part_bytes = sectors(sys, &d.name).ok_or(format!("no size for {}", d.name))? * 512;
    let fs = Fs {
        name: &d.name,
        node: &dev.join(&d.name),
        mount,
        bytes: part_bytes,
    };
    match grow_filesystem(&fs, || {
        guard.get_or_insert_with(&writable);
    })? {
        Grown::Done(line) => done.push(line),
        Grown::Nothing => {}
        Grown::Unsupported(other) if done.is_empty() => {
            return Err(format!(
                "{} holds {other}, which azprov does not grow",
                d.name
            ));
        }
        Grown::Unsupported(other) => done.push(format!("{other} not grown (not supported)")),
    }
    drop(guard);
    if done.is_empty() {
        return Err(format!("{} fills its disk already", d.name));
    }
    Ok(done.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::grow::tests::{reader, sfdisk};

    /// A 64 MiB GPT disk image (sfdisk) grown from 32 MiB, cut between the primary's entry
    /// sector and its header: the kernel would find no partition on it.
    fn torn_disk(path: &Path) {
        File::create(path).unwrap().set_len(32 << 20).unwrap();
        sfdisk(path.to_str().unwrap(), "label: gpt\n,8M\n,8M\n");
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
}
