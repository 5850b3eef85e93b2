//! The resource (temporary) disk on every boot (docs/contracts.md, "Azure's disks"): Azure hands
//! it over blank after every redeploy, resize or host move, as one NTFS partition labelled
//! `Temporary Storage` (SCSI) or as a raw namespace (the local NVMe disks of v6 sizes). azprov
//! formats it only in such a state (ext4, or xfs with `azprov.resourcefs=xfs`, labelled
//! [`LABEL`] as azure-vm-utils labels it), mounts one it formatted before as it is, and leaves
//! anything else alone with a line saying why: data is never lost.
//!
//! Run by `azprov-resource-disk@DEV.service`, which the packages' udev rule starts for the disk
//! `azprov disks --udev` marks, in the booted system (the root's mkfs; the root writable).

use crate::config::{ResourceDevice, ResourceDisk};
use crate::disk::block::{self, FsInfo};
use crate::disk::names::{self, Kind};
use crate::disk::ntfs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The label of a filesystem azprov made on a resource disk (azure-vm-utils' for its
/// ephemeral disks, within xfs's 12 characters).
pub const LABEL: &str = "AzureEphmDsk";
/// The NTFS label of Azure's SCSI resource disk.
pub const AZURE_NTFS_LABEL: &str = "Temporary Storage";
/// What Azure leaves in it, compared without case (cloud-init's list).
const AZURE_NTFS_FILES: [&str; 2] = ["dataloss_warning_readme.txt", "system volume information"];
/// How much of a raw disk's start and end must read as zeros.
const RAW_CHECK: usize = 1 << 20;

/// The resource disk's state, as examined before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Azure's SCSI handover: one NTFS partition, this one, labelled `Temporary Storage`,
    /// holding nothing but Azure's readme.
    AzureNtfs(PathBuf),
    /// No signature at all: no partition table, no filesystem, zeros at both ends.
    Raw,
    /// A filesystem azprov made before, on this device (the disk or its partition).
    Formatted(PathBuf, &'static str),
    /// Anything else: left alone, for this reason.
    Other(String),
}

/// What `azprov resource-disk` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Formatted (the state it was found in) and mounted.
    Formatted {
        device: PathBuf,
        mount: PathBuf,
    },
    Mounted {
        device: PathBuf,
        mount: PathBuf,
    },
    /// Left alone: why.
    Untouched(String),
}

/// Which whole disk `azprov disks --udev` marks as the resource disk: the one named on the
/// command line, else the SCSI resource disk, else the first local NVMe disk.
pub fn is_resource_disk(sys: &Path, kernel: &str, cfg: &ResourceDisk) -> bool {
    let block = sys.join("class/block");
    if names::parent_disk(&block, kernel).is_some() {
        return false;
    }
    match &cfg.device {
        ResourceDevice::Off => false,
        ResourceDevice::Named(n) => n == kernel,
        ResourceDevice::Auto => chosen(sys).is_some_and(|(name, _)| name == kernel),
    }
}

/// The disk azprov takes for the resource disk, and its kind: the SCSI resource disk, else the
/// first local NVMe disk (by name: the others are left alone, see the docs).
fn chosen(sys: &Path) -> Option<(String, Kind)> {
    let disks = names::scan(sys);
    let pick = |k| {
        disks
            .iter()
            .find(|d| d.kind == k)
            .map(|d| (d.name.clone(), k))
    };
    pick(Kind::Resource).or_else(|| pick(Kind::Local))
}

/// Examines `disk` (a whole disk's node; its partitions from `sys`) as Azure may hand it over.
pub fn examine(sys: &Path, dev: &Path, disk: &str) -> State {
    let block = sys.join("class/block");
    let parts: Vec<String> = crate::sys::sorted_names(&block)
        .into_iter()
        .filter(|n| names::parent_disk(&block, n).as_deref() == Some(disk))
        .collect();
    let node = dev.join(disk);
    match parts.as_slice() {
        [] => whole_disk(&node),
        [one] => partition(&dev.join(one)),
        many => State::Other(format!(
            "{} partitions (Azure hands it over with one)",
            many.len()
        )),
    }
}

fn ours(fs: &FsInfo) -> Option<&'static str> {
    (fs.label == LABEL && matches!(fs.fstype, "ext4" | "xfs")).then_some(fs.fstype)
}

fn whole_disk(node: &Path) -> State {
    let Some(start) = block::read_at(node, 0, RAW_CHECK) else {
        return State::Other(format!("{} cannot be read", node.display()));
    };
    if let Some(fs) = block::probe_device(node) {
        return match ours(&fs) {
            Some(t) => State::Formatted(node.to_path_buf(), t),
            None => State::Other(format!("it holds {} (label {:?})", fs.fstype, fs.label)),
        };
    }
    if start.len() < RAW_CHECK.min(4096) || start.iter().any(|b| *b != 0) {
        return State::Other("it has a signature or data at its start".into());
    }
    let size = block::size_of(node).unwrap_or(0);
    let tail_at = size.saturating_sub(RAW_CHECK as u64);
    match block::read_at(node, tail_at, RAW_CHECK) {
        Some(tail) if tail.iter().all(|b| *b == 0) => State::Raw,
        _ => State::Other("it has data at its end (a backup GPT, an md or LVM label)".into()),
    }
}

fn partition(node: &Path) -> State {
    if let Some(fs) = block::probe_device(node) {
        return match ours(&fs) {
            Some(t) => State::Formatted(node.to_path_buf(), t),
            None => State::Other(format!(
                "its partition holds {} (label {:?})",
                fs.fstype, fs.label
            )),
        };
    }
    let mut read = |at: u64, len: usize| block::read_at(node, at, len);
    let volume = match ntfs::read_volume(&mut read) {
        Ok(v) => v,
        Err(ntfs::NtfsError::NotNtfs) => {
            return State::Other("its partition holds no NTFS and no filesystem azprov made".into())
        }
        Err(e) => return State::Other(format!("its NTFS cannot be read: {e}")),
    };
    if volume.label != AZURE_NTFS_LABEL {
        return State::Other(format!(
            "its NTFS is labelled {:?}, not {AZURE_NTFS_LABEL:?}",
            volume.label
        ));
    }
    let other: Vec<&String> = volume
        .root
        .iter()
        .filter(|n| !n.starts_with('$') && *n != ".")
        .filter(|n| !AZURE_NTFS_FILES.contains(&n.to_lowercase().as_str()))
        .collect();
    match other.first() {
        None => State::AzureNtfs(node.to_path_buf()),
        Some(first) => State::Other(format!(
            "its NTFS holds {} file(s) Azure did not put there ({first:?} …)",
            other.len()
        )),
    }
}

/// Formats (when pristine) and mounts the resource disk `disk` (a kernel name).
pub fn run(sys: &Path, dev: &Path, disk: &str, cfg: &ResourceDisk) -> Outcome {
    let kind = names::identify(&sys.join("class/block"), disk).map(|d| d.kind);
    let named = matches!(&cfg.device, ResourceDevice::Named(n) if n == disk);
    if cfg.device == ResourceDevice::Off {
        return Outcome::Untouched("azprov.resourcedisk=off".into());
    }
    if !named && !matches!(kind, Some(Kind::Resource | Kind::Local)) {
        return Outcome::Untouched(format!(
            "{disk} is not Azure's resource disk (azprov.resourcedisk={disk} takes it)"
        ));
    }
    let mount = PathBuf::from(&cfg.mount);
    let state = examine(sys, dev, disk);
    log::info!("resource disk: {disk}: {}", describe(&state));
    // the states Azure hands each kind over in; a disk named on the command line, either
    let target = match (state, kind, named) {
        (State::Formatted(device, fstype), _, _) => {
            return match mount_at(&device, fstype, &mount) {
                Ok(()) => Outcome::Mounted { device, mount },
                Err(e) => Outcome::Untouched(e.to_string()),
            }
        }
        (State::AzureNtfs(part), Some(Kind::Resource), _) | (State::AzureNtfs(part), _, true) => {
            part
        }
        (State::Raw, Some(Kind::Local), _) | (State::Raw, _, true) => dev.join(disk),
        (State::Other(why), _, _) => return Outcome::Untouched(why),
        (s, _, _) => {
            return Outcome::Untouched(format!(
                "{} is not how Azure hands this disk over",
                describe(&s)
            ))
        }
    };
    if let Err(e) = format(&target, cfg.fstype) {
        return Outcome::Untouched(e.to_string());
    }
    match mount_at(&target, cfg.fstype, &mount) {
        Ok(()) => Outcome::Formatted {
            device: target,
            mount,
        },
        Err(e) => Outcome::Untouched(e.to_string()),
    }
}

fn describe(s: &State) -> String {
    match s {
        State::AzureNtfs(p) => format!("{} is Azure's NTFS, as handed over", p.display()),
        State::Raw => "raw, as handed over".into(),
        State::Formatted(p, t) => format!("{} holds the {t} azprov made", p.display()),
        State::Other(why) => why.clone(),
    }
}

/// Why a disk examined as Azure's blank handover could not be formatted or mounted.
#[derive(Debug)]
pub enum ResourceError {
    Clear(PathBuf, std::io::Error),
    NoMkfs(&'static str, std::io::Error),
    Mkfs(&'static str, PathBuf, String),
    MountPoint(PathBuf, std::io::Error),
    Busy(PathBuf),
    Mount(PathBuf, PathBuf, crate::sys::Errno),
}

impl std::fmt::Display for ResourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResourceError::Clear(p, e) => {
                write!(f, "cannot clear the start of {}: {e}", p.display())
            }
            ResourceError::NoMkfs(tool, e) => write!(f, "cannot run {tool}: {e}"),
            ResourceError::Mkfs(tool, p, said) => {
                write!(f, "{tool} {} failed: {said}", p.display())
            }
            ResourceError::MountPoint(p, e) => write!(f, "cannot make {}: {e}", p.display()),
            ResourceError::Busy(p) => {
                write!(f, "{} has a filesystem mounted on it already", p.display())
            }
            ResourceError::Mount(d, m, e) => {
                write!(f, "cannot mount {} on {}: {e}", d.display(), m.display())
            }
        }
    }
}

impl std::error::Error for ResourceError {}

/// mkfs of the root: the start zeroed first, so no NTFS boot sector stays for blkid to see.
fn format(target: &Path, fstype: &str) -> Result<(), ResourceError> {
    block::zero_start(target, 64 * 1024).map_err(|e| ResourceError::Clear(target.into(), e))?;
    let (tool, force) = if fstype == "xfs" {
        ("mkfs.xfs", "-f")
    } else {
        ("mkfs.ext4", "-F")
    };
    let out = Command::new(tool)
        .args([force, "-q", "-L", LABEL])
        .arg(target)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ResourceError::NoMkfs(tool, e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(ResourceError::Mkfs(tool, target.into(), err));
    }
    log::info!(
        "resource disk: {} formatted ({fstype}, label {LABEL})",
        target.display()
    );
    Ok(())
}

/// Mounts `device` at `mount` (made if missing, 0755), read-write; a mount point already in
/// use is left as it is.
fn mount_at(device: &Path, fstype: &str, mount: &Path) -> Result<(), ResourceError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(mount)
        .map_err(|e| ResourceError::MountPoint(mount.into(), e))?;
    let dev_of = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    if dev_of(mount) != mount.parent().and_then(dev_of) {
        return Err(ResourceError::Busy(mount.into()));
    }
    let flags = crate::sys::mount::MsFlags::empty();
    crate::sys::mount::mount(device, mount, fstype, flags, None)
        .map_err(|e| ResourceError::Mount(device.into(), mount.into(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::names::tests::Tree;

    /// A sysfs tree and a /dev with the disk `name` as an image file holding `bytes`, and its
    /// partition (starting at 1 MiB) when `part` holds bytes.
    fn disk(t: &Tree, name: &str, whole: Vec<u8>, part: Option<Vec<u8>>) -> PathBuf {
        let dev = t.0.join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join(name), whole).unwrap();
        if let Some(p) = part {
            std::fs::write(dev.join(format!("{name}1")), p).unwrap();
        }
        dev
    }

    #[test]
    fn azures_ntfs_is_pristine_and_a_user_file_is_not() {
        let Some(fresh) = crate::disk::ntfs::tests::volume(
            AZURE_NTFS_LABEL,
            &["DATALOSS_WARNING_README.txt", "System Volume Information"],
        ) else {
            return;
        };
        let t = Tree::new("rd-ntfs");
        t.scsi(
            "sdb",
            "{00000000-0001-8899-0000-000000000000}",
            "1:0:1:0",
            "Virtual Disk",
            1,
        );
        let dev = disk(&t, "sdb", vec![0; 4096], Some(fresh));
        assert_eq!(
            examine(&t.0, &dev, "sdb"),
            State::AzureNtfs(dev.join("sdb1"))
        );

        let used = crate::disk::ntfs::tests::volume(
            AZURE_NTFS_LABEL,
            &["dataloss_warning_readme.txt", "results.csv"],
        )
        .unwrap();
        std::fs::write(dev.join("sdb1"), used).unwrap();
        match examine(&t.0, &dev, "sdb") {
            State::Other(why) => assert!(
                why.contains("1 file(s)") && why.contains("results.csv"),
                "{why}"
            ),
            s => panic!("{s:?}"),
        }
        let relabelled = crate::disk::ntfs::tests::volume("Data", &[]).unwrap();
        std::fs::write(dev.join("sdb1"), relabelled).unwrap();
        assert!(matches!(examine(&t.0, &dev, "sdb"), State::Other(w) if w.contains("\"Data\"")));
    }

    #[test]
    fn a_raw_disk_is_raw_only_when_blank_at_both_ends() {
        let t = Tree::new("rd-raw");
        t.nvme("nvme1", 1, "Microsoft NVMe Direct Disk v2", "local1", 0);
        let dev = disk(&t, "nvme1n1", vec![0; 8 << 20], None);
        assert_eq!(examine(&t.0, &dev, "nvme1n1"), State::Raw);
        let mut end = vec![0; 8 << 20];
        end[(8 << 20) - 600] = 1;
        std::fs::write(dev.join("nvme1n1"), end).unwrap();
        assert!(matches!(examine(&t.0, &dev, "nvme1n1"), State::Other(_)));
        let mut start = vec![0; 8 << 20];
        start[510] = 0x55;
        std::fs::write(dev.join("nvme1n1"), start).unwrap();
        assert!(matches!(examine(&t.0, &dev, "nvme1n1"), State::Other(_)));
    }

    #[test]
    fn which_disk_is_the_resource_disk() {
        let t = Tree::new("rd-which");
        t.scsi(
            "sda",
            "{f8b3781a-1e82-4818-a1c3-63d806ec15bb}",
            "0:0:0:0",
            "Virtual Disk",
            1,
        );
        t.nvme("nvme0", 1, "Microsoft NVMe Direct Disk v2", "b", 0);
        t.nvme("nvme1", 1, "Microsoft NVMe Direct Disk v2", "a", 0);
        let auto = ResourceDisk::default();
        // no SCSI resource disk: the first local NVMe disk, only it
        assert!(is_resource_disk(&t.0, "nvme0n1", &auto));
        assert!(!is_resource_disk(&t.0, "nvme1n1", &auto));
        assert!(!is_resource_disk(&t.0, "sda", &auto));
        assert!(!is_resource_disk(&t.0, "sda1", &auto));
        t.scsi(
            "sdb",
            "{f8b3781a-1e82-4818-a1c3-63d806ec15bb}",
            "0:0:0:1",
            "Virtual Disk",
            1,
        );
        assert!(is_resource_disk(&t.0, "sdb", &auto));
        assert!(!is_resource_disk(&t.0, "nvme0n1", &auto));
        let off = ResourceDisk {
            device: ResourceDevice::Off,
            ..ResourceDisk::default()
        };
        assert!(!is_resource_disk(&t.0, "sdb", &off));
        let named = ResourceDisk {
            device: ResourceDevice::Named("vdb".into()),
            ..ResourceDisk::default()
        };
        assert!(is_resource_disk(&t.0, "vdb", &named) && !is_resource_disk(&t.0, "sdb", &named));
    }

    #[test]
    fn a_disk_that_is_not_the_resource_disk_is_never_touched() {
        let t = Tree::new("rd-other");
        t.scsi(
            "sdc",
            "{f8b3781b-1e82-4818-a1c3-63d806ec15bb}",
            "1:0:0:0",
            "Virtual Disk",
            0,
        );
        let dev = disk(&t, "sdc", vec![0; 8 << 20], None);
        let out = run(&t.0, &dev, "sdc", &ResourceDisk::default());
        assert!(
            matches!(out, Outcome::Untouched(ref w) if w.contains("not Azure's resource disk")),
            "{out:?}"
        );
        // a raw SCSI resource disk is not how Azure hands it over
        t.scsi(
            "sdb",
            "{00000000-0001-8899-0000-000000000000}",
            "1:0:1:0",
            "Virtual Disk",
            0,
        );
        std::fs::write(dev.join("sdb"), vec![0; 8 << 20]).unwrap();
        let out = run(&t.0, &dev, "sdb", &ResourceDisk::default());
        assert!(
            matches!(out, Outcome::Untouched(ref w) if w.contains("not how Azure")),
            "{out:?}"
        );
        assert!(std::fs::read(dev.join("sdb"))
            .unwrap()
            .iter()
            .all(|b| *b == 0));
    }
}
