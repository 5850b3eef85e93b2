//! The provisioning CD (docs/contracts.md, "Protocol rules"): find CD-ROM drives, mount the
//! disc read-only (udf, then iso9660; udf only when the disc says it holds UDF) with mount(2), read
//! ovf-env.xml, and always unmount.

use crate::deadline::Deadline;
use crate::modules::OnDemand;
use crate::sys::block::{self, DriveStatus};
use crate::sys::mount::{self, Mounted, MsFlags};
use crate::sys::Errno;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const MOUNT_POINT: &str = "/run/azprov/media";
const FS_TYPES: [&str; 2] = ["udf", "iso9660"];
const OVF_MAX: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaError {
    /// A drive with a disc failed to mount with every type (e.g. no udf in a hardened
    /// kernel): the errno of each attempt, in `FS_TYPES` order.
    Mount {
        device: PathBuf,
        errors: Vec<(&'static str, Errno)>,
    },
    Read {
        device: PathBuf,
        errno: Errno,
    },
    MountPoint(Errno),
}

impl std::fmt::Display for MediaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MediaError::Mount { device, errors } => {
                write!(f, "cannot mount {}:", device.display())?;
                for (fstype, e) in errors {
                    write!(f, " {fstype}: {e}")?;
                }
                Ok(())
            }
            MediaError::Read { device, errno } => {
                write!(
                    f,
                    "cannot read ovf-env.xml on {}: {errno}",
                    device.display()
                )
            }
            MediaError::MountPoint(e) => write!(f, "mount point {MOUNT_POINT}: {e}"),
        }
    }
}

impl std::error::Error for MediaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MediaError::Read { errno, .. } | MediaError::MountPoint(errno) => Some(errno),
            // the last type tried: each attempt's errno is in the message
            MediaError::Mount { errors, .. } => errors.last().map(|(_, e)| e as _),
        }
    }
}

/// The CD-ROM device nodes under `dev` (`sr0`, `sr1`, …), sorted.
pub fn cdrom_devices(dev: &Path) -> Vec<PathBuf> {
    crate::sys::sorted_names(dev)
        .into_iter()
        .filter(|n| {
            n.strip_prefix("sr")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|n| dev.join(n))
        .collect()
}

/// Hyper-V's VMBus storage controllers (`class_id` in sysfs): IDE (Gen1's disks) and SCSI
/// (Gen2's disks and DVD drive).
const VMBUS_STORAGE: [&str; 2] = [
    "32412632-86cb-44a2-9b5c-50d1417354f5",
    "ba6163d9-04a1-4d29-b605-72e2ffb1dc7f",
];

/// Why a CD-ROM drive may still show up under `sys`; None when every controller that could
/// carry one is done. A PCI or virtio controller is probed and scanned inside its module's load
/// (or before init, when built in), so its drives exist once the module is in. Hyper-V's VMBus
/// controllers may be offered after hv_storvsc loaded and are probed on their own time: one
/// without a driver yet is still coming, and with synchronous SCSI scans (PID 1 sets them,
/// `modules::SCSI_SCAN`) one with a driver has its drives. With asynchronous scans (hook
/// mode) nothing in sysfs says such a scan is done: a loaded CD-ROM driver is reason enough.
pub fn still_scanning(sys: &Path) -> Option<String> {
    if !(sys.join("module/sr_mod").exists() || sys.join("module/cdrom").exists()) {
        return None;
    }
    let scan = fs::read_to_string(sys.join(crate::modules::SCSI_SCAN)).ok();
    if scan.as_deref().map(str::trim) != Some("sync") {
        return Some("SCSI scans are asynchronous".into());
    }
    if !sys.join("module/hv_storvsc").exists() {
        return None;
    }
    let devices = sys.join("bus/vmbus/devices");
    crate::sys::sorted_names(&devices)
        .into_iter()
        .find(|name| {
            let d = devices.join(name);
            let class = fs::read_to_string(d.join("class_id")).unwrap_or_default();
            let class = class.trim().trim_matches(['{', '}']).to_ascii_lowercase();
            VMBUS_STORAGE.contains(&class.as_str()) && !d.join("driver").exists()
        })
        .map(|name| format!("VMBus storage controller {name} is still being probed"))
}

/// The CD-ROM drives, waiting up to `bound` for one while [`still_scanning`] says one may
/// still show up. A boot without a CD (every boot after the first) waits for nothing.
pub fn wait_for_drives(dev: &Path, sys: &Path, bound: Duration) -> Vec<PathBuf> {
    let deadline = Deadline::after(bound);
    loop {
        let drives = cdrom_devices(dev);
        if !drives.is_empty() {
            return drives;
        }
        let Some(why) = still_scanning(sys) else {
            return drives;
        };
        if !deadline.sleep(Duration::from_millis(25)) {
            log::info!("no CD-ROM drive after {} ms ({why})", bound.as_millis());
            return drives;
        }
    }
}

/// Whether the disc's volume recognition sequence (ECMA-167: 2 KiB descriptors from sector
/// 16, after any iso9660 ones) names UDF (`NSR02`, `NSR03`); None when it cannot be read. One
/// 32 KiB read: the kernel's own check reads the sectors one at a time, so udf is then mounted
/// with `novrs`.
pub fn has_udf(device: &Path) -> Option<bool> {
    use std::os::unix::fs::FileExt;
    let mut vrs = vec![0u8; 16 * 2048];
    let n = fs::File::open(device)
        .ok()?
        .read_at(&mut vrs, 16 * 2048)
        .ok()?;
    let vrs = vrs.get(..n)?;
    Some(
        vrs.chunks(2048)
            .any(|d| matches!(d.get(1..6), Some(b"NSR02" | b"NSR03"))),
    )
}

/// Mounts `device` as udf, then iso9660, each type's module loaded first when it waits in
/// `modules` (PID 1's isofs). A disc whose recognition sequence names no UDF ([`has_udf`]) is
/// not tried as udf: the kernel would log a page of errors for it.
fn mount_any(
    device: &Path,
    at: &Path,
    modules: &OnDemand,
) -> Result<(Mounted, &'static str), MediaError> {
    let mut errors = Vec::new();
    let udf = has_udf(device);
    for fstype in FS_TYPES {
        if fstype == "udf" && udf == Some(false) {
            continue;
        }
        modules.ensure_fs(fstype);
        match mount::mount(
            device,
            at,
            fstype,
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            (fstype == "udf" && udf == Some(true)).then_some("novrs"),
        ) {
            Ok(()) => {
                let mut disc = Mounted::default();
                disc.push(at.to_path_buf());
                return Ok((disc, fstype));
            }
            Err(e) => errors.push((fstype, e)),
        }
    }
    Err(MediaError::Mount {
        device: device.to_path_buf(),
        errors,
    })
}

/// Reads ovf-env.xml from the first drive that has it. `drives` are checked with the CD-ROM
/// ioctl and retried while they report no disc yet (bounded by `deadline`); `extra` devices
/// (`--media`) are mounted as given; `modules` loads a filesystem module that waits for its
/// first mount. Ok(None): no media at all, normal on later boots.
pub fn read_ovf(
    drives: &[PathBuf],
    extra: &[PathBuf],
    deadline: Deadline,
    modules: &OnDemand,
) -> Result<Option<(String, Vec<u8>)>, MediaError> {
    if drives.is_empty() && extra.is_empty() {
        return Ok(None);
    }
    let at = Path::new(MOUNT_POINT);
    fs::create_dir_all(at).map_err(|e| MediaError::MountPoint(crate::sys::errno_of(&e)))?;
    let _ = fs::set_permissions(at, std::os::unix::fs::PermissionsExt::from_mode(0o700));
    let mut last_err = None;
    let candidates = drives
        .iter()
        .map(|d| (d, true))
        .chain(extra.iter().map(|d| (d, false)));
    for (device, is_drive) in candidates {
        let name = device.display().to_string();
        if is_drive && !disc_ready(device, deadline) {
            continue;
        }
        let (guard, fstype) = match mount_any(device, at, modules) {
            Ok(m) => m,
            Err(e) => {
                log::debug!("{e}");
                last_err = Some(e);
                continue;
            }
        };
        let read = fs::File::open(at.join("ovf-env.xml")).and_then(|f| {
            let mut buf = Vec::new();
            f.take(OVF_MAX).read_to_end(&mut buf).map(|_| buf)
        });
        drop(guard);
        match read {
            Ok(bytes) => {
                log::info!("ovf-env.xml read from {name} ({fstype})");
                return Ok(Some((name, bytes)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                log::info!("{name} ({fstype}) has no ovf-env.xml");
            }
            Err(e) => {
                last_err = Some(MediaError::Read {
                    device: device.clone(),
                    errno: crate::sys::errno_of(&e),
                })
            }
        }
    }
    last_err.map_or(Ok(None), Err)
}

/// True once the drive reports a disc; retries "no disc"/"not ready" a few times, since the
/// medium can show up a moment after the drive (WALA: 5 attempts, 5 s apart).
fn disc_ready(device: &Path, deadline: Deadline) -> bool {
    let limit = deadline.min(Duration::from_secs(10));
    loop {
        match block::drive_status(device) {
            Ok(DriveStatus::DiscOk) => return true,
            Ok(
                s @ (DriveStatus::NoDisc
                | DriveStatus::NotReady
                | DriveStatus::TrayOpen
                | DriveStatus::NoInfo),
            ) => {
                if !limit.sleep(Duration::from_millis(500)) {
                    log::info!("{}: {s:?}", device.display());
                    return false;
                }
            }
            Ok(other) => {
                log::info!("{}: drive status {other:?}", device.display());
                return false;
            }
            Err(e) => {
                log::info!("{}: not a CD-ROM drive ({e})", device.display());
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sr_devices_only() {
        let dir = std::env::temp_dir().join(format!("azprov-media-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for n in ["sr1", "sr0", "sda", "srx", "sr", "sr10"] {
            fs::write(dir.join(n), b"").unwrap();
        }
        let names: Vec<String> = cdrom_devices(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["sr0", "sr1", "sr10"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_drive_may_still_come_only_while_a_controller_scans() {
        let base = std::env::temp_dir().join(format!("azprov-drives-{}", std::process::id()));
        let (dev, sys) = (base.join("dev"), base.join("sys"));
        fs::create_dir_all(&dev).unwrap();
        fs::create_dir_all(sys.join("module/scsi_mod/parameters")).unwrap();
        // no CD-ROM driver
        assert_eq!(still_scanning(&sys), None);
        fs::create_dir_all(sys.join("module/sr_mod")).unwrap();
        let scan = sys.join("module/scsi_mod/parameters/scan");
        // asynchronous SCSI scans (or no scsi_mod): nothing tells when they end
        assert!(still_scanning(&sys).unwrap().contains("asynchronous"));
        fs::write(&scan, "async\n").unwrap();
        assert!(still_scanning(&sys).is_some());
        // synchronous scans, no Hyper-V storage driver: done once the modules are in
        fs::write(&scan, "sync\n").unwrap();
        assert_eq!(still_scanning(&sys), None);
        // Hyper-V: a SCSI controller without a driver yet is still coming
        fs::create_dir_all(sys.join("module/hv_storvsc")).unwrap();
        // a VMBus device as sysfs shows it: its directory and its braced class_id
        let vmbus_device = |id: &str, class: &str| {
            let d = sys.join("bus/vmbus/devices").join(id);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("class_id"), format!("{{{class}}}\n")).unwrap();
            d
        };
        let ctl = vmbus_device(
            "f8b3781b-1e82-4818-a1c3-63d806ec15bb",
            "ba6163d9-04a1-4d29-b605-72e2ffb1dc7f",
        );
        // a NIC (netvsc), never waited for
        vmbus_device(
            "000d3a6e-4548-000d-3a6e-4548000d3a6e",
            "f8615163-df3e-46c5-913f-f2d2f965ed0e",
        );
        assert!(still_scanning(&sys).unwrap().contains("f8b3781b"));
        fs::create_dir_all(ctl.join("driver")).unwrap();
        // bound now; the NIC without a driver does not count
        assert_eq!(still_scanning(&sys), None);
        assert!(wait_for_drives(&dev, &sys, Duration::from_secs(60)).is_empty());
        fs::write(dev.join("sr0"), b"").unwrap();
        assert_eq!(
            wait_for_drives(&dev, &sys, Duration::from_secs(60)),
            [dev.join("sr0")]
        );
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_recognition_sequence_tells_udf_from_iso9660() {
        let dir = std::env::temp_dir().join(format!("azprov-vrs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let disc = |name: &str, ids: &[&[u8; 5]]| {
            // sectors 16.. hold the descriptors: type, identifier, version 1
            let mut img = vec![0u8; 40 * 2048];
            for (i, id) in ids.iter().enumerate() {
                let at = (16 + i) * 2048;
                img[at + 1..at + 6].copy_from_slice(*id);
                img[at + 6] = 1;
            }
            let p = dir.join(name);
            fs::write(&p, img).unwrap();
            p
        };
        // a UDF bridge disc as genisoimage -udf makes it, and pure UDF 2.x
        let bridge = disc(
            "bridge",
            &[b"CD001", b"CD001", b"BEA01", b"NSR02", b"TEA01"],
        );
        assert_eq!(has_udf(&bridge), Some(true));
        assert_eq!(
            has_udf(&disc("udf", &[b"BEA01", b"NSR03", b"TEA01"])),
            Some(true)
        );
        // iso9660 alone (Azure Stack): not tried as udf
        assert_eq!(has_udf(&disc("iso", &[b"CD001", b"CD001"])), Some(false));
        fs::write(dir.join("short"), b"tiny").unwrap();
        assert_eq!(has_udf(&dir.join("short")), Some(false));
        assert_eq!(has_udf(&dir.join("absent")), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_media_is_normal() {
        assert!(matches!(
            read_ovf(
                &[],
                &[],
                Deadline::after(Duration::from_secs(1)),
                &OnDemand::default()
            ),
            Ok(None)
        ));
    }

    #[test]
    fn an_ordinary_file_is_not_a_cdrom() {
        let f = std::env::temp_dir().join(format!("azprov-notcd-{}", std::process::id()));
        fs::write(&f, b"").unwrap();
        assert!(block::drive_status(&f).is_err());
        fs::remove_file(&f).unwrap();
    }
}
