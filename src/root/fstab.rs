//! The root's /etc/fstab, for the filesystems it mounts on a path azprov writes under (a
//! separate /home, /var, /var/lib, /var/log: CIS layouts and LVM images). Writing into the
//! root filesystem's mount-point directory would be hidden by the real mount once the system
//! boots: Ready, and no home, no keys, no state. So each such filesystem is mounted under the
//! root for the run, read-write with fstab's other options, parents first, and unmounted on
//! every path out ([`Mounted`]'s drop). A filesystem already mounted there (a framework that
//! mounted it, the booted system) is left as it is. `noauto`, network filesystems, swap and
//! tmpfs are not mounted. A device that cannot be found is a failure naming the mount (an LVM
//! volume the initramfs did not activate: the writes would land in the hidden directory).

use super::Sysroot;
use crate::azure::reason::{Failure, Reason};
use crate::config::RootSpec;
use crate::disk::block;
use crate::sys::mount::Mounted;
use nix::mount::MsFlags;
use std::path::{Path, PathBuf};

/// Where azprov writes, as the root sees it: the admin's home (under /home), its state and
/// log, the files in /etc.
const WRITES: &[&str] = &[
    "/home/",
    "/var/lib/azprov/",
    "/var/log/azprov.log",
    "/etc/ssh/",
];

/// Filesystem types that need the network or hold nothing across a boot.
const SKIPPED_TYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "ncpfs",
    "sshfs",
    "glusterfs",
    "ceph",
    "davfs",
    "afs",
    "9p",
    "swap",
    "tmpfs",
    "ramfs",
    "none",
];

/// One line of fstab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub spec: String,
    pub target: String,
    pub fstype: String,
    pub options: Vec<String>,
}

/// fstab's lines (comments and short lines skipped; `\040` and the other octal escapes
/// decoded, as getmntent does).
pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            if l.starts_with('#') {
                return None;
            }
            let mut w = l.split_whitespace().map(unescape);
            let (spec, target, fstype) = (w.next()?, w.next()?, w.next()?);
            let options = w
                .next()
                .unwrap_or_else(|| "defaults".into())
                .split(',')
                .map(str::to_string)
                .collect();
            Some(Entry {
                spec,
                target,
                fstype,
                options,
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|x| (b'0'..=b'7').contains(x)));
        match (c, oct) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |a, x| a * 8 + u32::from(x - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Entry {
    fn has(&self, option: &str) -> bool {
        self.options.iter().any(|o| o == option)
    }

    /// Whether azprov writes below this entry's mount point.
    fn covers_a_write(&self) -> bool {
        let t = self.target.trim_end_matches('/');
        // the admin's home is some directory under /home
        !t.is_empty()
            && (t.starts_with("/home/")
                || WRITES
                    .iter()
                    .any(|w| w.starts_with(&format!("{t}/")) || *w == t))
    }

    /// Why this entry is not mounted for the run, or None when it is.
    fn skipped(&self) -> Option<&'static str> {
        if self.has("noauto") {
            Some("noauto")
        } else if self.has("bind") || self.has("rbind") {
            None
        } else if self.has("_netdev")
            || SKIPPED_TYPES.contains(&self.fstype.as_str())
            || self.fstype.starts_with("fuse")
        {
            Some("network, swap or memory filesystem")
        } else {
            None
        }
    }

    /// The mount flags and the filesystem's own options, read-write whatever fstab says
    /// (the booted system mounts it as fstab says).
    pub fn flags(&self) -> (MsFlags, String) {
        let mut flags = MsFlags::empty();
        let mut data = Vec::new();
        for o in &self.options {
            let f = match o.as_str() {
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "sync" => MsFlags::MS_SYNCHRONOUS,
                "dirsync" => MsFlags::MS_DIRSYNC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                "lazytime" => MsFlags::MS_LAZYTIME,
                "bind" => MsFlags::MS_BIND,
                "rbind" => MsFlags::MS_BIND | MsFlags::MS_REC,
                // mount(8)'s own words, or the opposite of a flag that is off by default
                "defaults" | "ro" | "rw" | "auto" | "noauto" | "user" | "nouser" | "users"
                | "owner" | "group" | "nofail" | "_netdev" | "suid" | "dev" | "exec" | "async"
                | "atime" | "diratime" | "norelatime" | "nostrictatime" | "nolazytime"
                | "silent" | "loud" => MsFlags::empty(),
                o if o.starts_with("x-") || o.starts_with("X-") || o.starts_with("comment=") => {
                    MsFlags::empty()
                }
                o => {
                    data.push(o.to_string());
                    MsFlags::empty()
                }
            };
            flags |= f;
        }
        (flags, data.join(","))
    }
}

/// The device an fstab spec names: `UUID=`, `LABEL=`, `PARTUUID=`, `PARTLABEL=` (and their
/// /dev/disk/by-* links) found by reading the devices' superblocks and partition tables, as
/// the root is found; other /dev paths (/dev/mapper/VG-LV, /dev/sdb1) as they are.
pub fn find_device(spec: &str, sys_block: &Path, dev: &Path) -> Option<PathBuf> {
    let by = |dir: &str, v: &str| -> Option<String> {
        let name = spec.strip_prefix(&format!("/dev/disk/{dir}/"))?;
        Some(format!("{v}={name}"))
    };
    let spec = by("by-uuid", "UUID")
        .or_else(|| by("by-label", "LABEL"))
        .or_else(|| by("by-partuuid", "PARTUUID"))
        .or_else(|| by("by-partlabel", "PARTLABEL"))
        .unwrap_or_else(|| spec.to_string());
    let spec = RootSpec::parse(&spec).ok()?;
    find(&spec, sys_block, dev).map(|(p, _)| p)
}

/// The device for a root= style spec, once it exists, with the filesystem its superblock
/// names.
pub fn find(
    spec: &RootSpec,
    sys_block: &Path,
    dev: &Path,
) -> Option<(PathBuf, Option<&'static str>)> {
    if let RootSpec::Dev(d) = spec {
        let p = PathBuf::from(d);
        if !p.exists() {
            return None;
        }
        let fstype = block::probe_device(&p).map(|i| i.fstype);
        return Some((p, fstype));
    }
    block::scan(sys_block, dev).into_iter().find_map(|d| {
        let hit = match spec {
            RootSpec::Uuid(u) => d.fs.as_ref().is_some_and(|f| f.uuid == *u),
            RootSpec::Label(l) => d.fs.as_ref().is_some_and(|f| f.label == *l),
            RootSpec::PartUuid(u) => d.part.as_ref().is_some_and(|p| p.partuuid == *u),
            RootSpec::PartLabel(l) => d.part.as_ref().is_some_and(|p| p.partlabel == *l),
            RootSpec::Dev(_) => false,
        };
        hit.then(|| (d.node.clone(), d.fs.as_ref().map(|f| f.fstype)))
    })
}

/// The mount points (host paths) in /proc/self/mountinfo.
fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(|p| PathBuf::from(unescape(p))))
        .collect()
}

/// Mounts under `root` every filesystem its fstab puts on a path azprov writes under (module
/// comment). Fails, naming the mount, when a device cannot be found or mounted; what was
/// mounted by then is unmounted again.
pub fn mount_for_writes(root: &Sysroot, sys_block: &Path, dev: &Path) -> Result<Mounted, Failure> {
    // the mount point as supporting data for Azure's description; the spec is in the message
    let fail = |target: &str, m: String| {
        Failure::new(Reason::MountFstab, m).with("mount", target.to_string())
    };
    let Some(text) = root.read("/etc/fstab").ok().flatten() else {
        return Ok(Mounted::default());
    };
    let mut entries: Vec<Entry> = parse(&String::from_utf8_lossy(&text))
        .into_iter()
        .filter(Entry::covers_a_write)
        .collect();
    // parents first: /var before /var/log
    entries.sort_by_key(|e| e.target.trim_end_matches('/').matches('/').count());
    let mut mounted = Mounted::default();
    for e in entries {
        if let Some(why) = e.skipped() {
            log::info!(
                "fstab: {} ({}) not mounted for the run: {why}",
                e.target,
                e.fstype
            );
            continue;
        }
        let target = root
            .resolve(&e.target)
            .map_err(|err| fail(&e.target, format!("{}: {err}", e.target)))?;
        if mount_points().contains(&target) {
            log::info!("fstab: {} is mounted already", e.target);
            continue;
        }
        if !target.is_dir() {
            return Err(fail(
                &e.target,
                format!("{}: the mount point does not exist in the root", e.target),
            ));
        }
        let (mut flags, data) = e.flags();
        let source = if flags.contains(MsFlags::MS_BIND) {
            root.resolve(&e.spec)
                .map_err(|err| fail(&e.target, format!("{} (bind {}): {err}", e.target, e.spec)))?
        } else {
            find_device(&e.spec, sys_block, dev).ok_or_else(|| {
                fail(
                    &e.target,
                    format!(
                        "{} on {}: no such device (an LVM volume the initramfs did not activate? \
                     dracut: rd.lvm.lv= or rd.lvm.vg= for it)",
                        e.target, e.spec
                    ),
                )
            })?
        };
        let fstype = match e.fstype.as_str() {
            "auto" | "" if !flags.contains(MsFlags::MS_BIND) => block::probe_device(&source)
                .map(|i| i.fstype)
                .unwrap_or("")
                .to_string(),
            t => t.to_string(),
        };
        flags.remove(MsFlags::MS_RDONLY);
        let t = std::time::Instant::now();
        crate::sys::mount::mount(
            &source,
            &target,
            &fstype,
            flags,
            (!data.is_empty()).then_some(data.as_str()),
        )
        .map_err(|errno| {
            fail(
                &e.target,
                format!(
                    "{} on {} ({}): mount: {errno}",
                    e.target,
                    source.display(),
                    e.fstype
                ),
            )
        })?;
        log::info!(
            "fstab: {} mounted from {} ({fstype}) for the run: {} ms",
            e.target,
            source.display(),
            t.elapsed().as_millis()
        );
        mounted.push(target);
    }
    Ok(mounted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CIS: &str = "# /etc/fstab: static file system information.\n\
        UUID=0a1b / ext4 errors=remount-ro 0 1\n\
        UUID=77aa-01 /home ext4 defaults,nodev,nosuid 0 2\n\
        /dev/mapper/vg-var /var xfs defaults,noatime,x-systemd.device-timeout=0 0 2\n\
        LABEL=logs /var/log ext4 nodev,noexec,nosuid,data=journal 0 2\n\
        /dev/mapper/vg-audit /var/log/audit ext4 defaults 0 2\n\
        tmpfs /tmp tmpfs nodev,nosuid 0 0\n\
        server:/export /home/shared nfs4 _netdev 0 0\n\
        PARTLABEL=scratch /var/lib/azprov ext4 noauto 0 0\n\
        /swapfile none swap sw 0 0\n\
        /srv/My\\040Files /mnt/x none bind 0 0\n";

    #[test]
    fn fstab_lines_parse_and_only_mounts_over_azprovs_paths_count() {
        let e = parse(CIS);
        assert_eq!(e.len(), 10);
        assert_eq!(e[9].spec, "/srv/My Files");
        let wanted: Vec<&str> = e
            .iter()
            .filter(|e| e.covers_a_write())
            .map(|e| e.target.as_str())
            .collect();
        assert_eq!(
            wanted,
            [
                "/home",
                "/var",
                "/var/log",
                "/home/shared",
                "/var/lib/azprov"
            ]
        );
        let skipped: Vec<Option<&str>> = e.iter().map(Entry::skipped).collect();
        assert_eq!(skipped[1], None);
        assert_eq!(skipped[6], Some("network, swap or memory filesystem"));
        assert_eq!(skipped[7], Some("noauto"));
        assert_eq!(skipped[5], Some("network, swap or memory filesystem"));
    }

    #[test]
    fn options_become_flags_and_the_filesystems_own_data() {
        let e = parse(CIS);
        let (f, d) = e[3].flags();
        assert_eq!(
            f,
            MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID
        );
        assert_eq!(d, "data=journal");
        let (f, d) = e[2].flags();
        assert_eq!((f, d.as_str()), (MsFlags::MS_NOATIME, ""));
        let ro = parse("/dev/sdb1 /home ext4 ro,errors=remount-ro,context=\"system_u:object_r:home_root_t:s0\" 0 2\n");
        let (f, d) = ro[0].flags();
        assert!(!f.contains(MsFlags::MS_RDONLY));
        assert_eq!(
            d,
            "errors=remount-ro,context=\"system_u:object_r:home_root_t:s0\""
        );
    }

    #[test]
    fn by_links_are_looked_up_by_what_they_name() {
        let dir = std::env::temp_dir().join(format!("azprov-fstab-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sys")).unwrap();
        let none = find_device("/dev/disk/by-uuid/1234", &dir.join("sys"), &dir);
        assert_eq!(none, None);
        assert_eq!(find_device("not a spec", &dir.join("sys"), &dir), None);
        let node = dir.join("sdz1");
        std::fs::write(&node, b"").unwrap();
        assert_eq!(
            find_device(node.to_str().unwrap(), &dir.join("sys"), &dir),
            Some(node)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[cfg_attr(
        azprov_unprivileged,
        ignore = "needs root (runs as root and under CI=true)"
    )]
    fn a_separate_home_is_mounted_for_the_run_and_the_user_lands_on_it() {
        let (dir, root) = crate::root::tests::seeded("fstab-home");
        std::fs::create_dir_all(dir.join("srv/homes")).unwrap();
        std::fs::write(
            dir.join("etc/fstab"),
            "UUID=0a1b / ext4 defaults 0 1\n/srv/homes /home none bind 0 0\n",
        )
        .unwrap();
        let sys = dir.join("no-sys");
        {
            let m = mount_for_writes(&root, &sys, &dir).unwrap();
            assert_eq!(m.targets(), [dir.join("home")]);
            root.ensure_user(
                &crate::root::values::Username::parse("azureuser").unwrap(),
                None,
            )
            .unwrap();
            // mounted already: left alone, not mounted twice
            let again = mount_for_writes(&root, &sys, &dir).unwrap();
            assert!(again.targets().is_empty());
        }
        // the home is on the filesystem fstab mounts there, not in the directory under it
        assert!(dir.join("srv/homes/azureuser/.bashrc").exists());
        assert!(!dir.join("home/azureuser").exists());
        // a device nobody made: the run fails naming the mount, nothing stays mounted
        std::fs::write(
            dir.join("etc/fstab"),
            "/srv/homes /home none bind 0 0\nUUID=dead-beef /var/lib/azprov ext4 defaults 0 2\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("var/lib/azprov")).unwrap();
        let e = mount_for_writes(&root, &sys, &dir).unwrap_err();
        assert_eq!(e.reason, Reason::MountFstab);
        assert!(
            e.detail.contains("/var/lib/azprov on UUID=dead-beef"),
            "{}",
            e.detail
        );
        assert_eq!(e.extra, [("mount", "/var/lib/azprov".to_string())]);
        assert!(!mount_points().contains(&dir.join("home")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
