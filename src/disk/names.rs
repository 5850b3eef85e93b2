//! Azure's disks as sysfs shows them, and the `/dev/disk/azure/...` names tools rely on, in
//! both schemes: WALinuxAgent's `66-azure-storage.rules` (`root`, `resource`, `scsiN/lunL`)
//! and azure-vm-utils' `80-azure-disk.rules` (`os`, `resource`, `data/by-lun/L`,
//! `local/by-serial/S`), each with `-partN` for partitions. `azprov disks` prints them and the
//! packages' udev rule imports them (`azprov disks --udev KERNEL`), so what a VM gets and what
//! the command says are one code path.
//!
//! Recognition (azure-vm-utils' doc/disk-identification.md): a SCSI disk whose vendor is `Msft`
//! and model `Virtual Disk`, named by the VMBus `device_id` of its controller and its LUN
//! (the fourth field of its SCSI address); an NVMe namespace by its controller's model. A CD,
//! or a disk of anything else, gets nothing.

use std::path::{Path, PathBuf};

/// What a disk is to Azure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Os,
    Resource,
    Data,
    /// A local (temporary) NVMe disk of the v6 and Lsv2/v3 sizes.
    Local,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Os => "os",
            Kind::Resource => "resource",
            Kind::Data => "data",
            Kind::Local => "local",
        }
    }
}

/// One of Azure's disks (a whole disk) with its names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AzureDisk {
    /// The kernel's name (`sda`, `nvme0n1`).
    pub name: String,
    #[serde(rename = "type")]
    pub kind: Kind,
    /// A data disk's LUN.
    pub lun: Option<u32>,
    /// A local NVMe disk's serial.
    pub serial: Option<String>,
    /// Every `/dev/disk/azure/...` link to the whole disk, both schemes.
    pub links: Vec<String>,
    /// Its partitions with their links.
    pub partitions: Vec<Partition>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Partition {
    pub name: String,
    pub number: u32,
    pub links: Vec<String>,
}

const DIR: &str = "/dev/disk/azure";
/// The Gen2 VM's controllers: scsi0 (OS disk, resource disk, CD), then scsi1-3 (data disks);
/// the same tail after the first field.
const GEN2_TAIL: &str = "-1e82-4818-a1c3-63d806ec15bb}";
const GEN2_CONTROLLERS: [&str; 4] = ["{f8b3781a", "{f8b3781b", "{f8b3781c", "{f8b3781d"];
/// Gen1: the IDE channel of the OS disk and of the resource disk (`?` is any first character).
const GEN1_OS: &str = "00000000-0000-";
const GEN1_RESOURCE: &str = "00000000-0001-";
const NVME_REMOTE: &str = "MSFT NVMe Accelerator v1.0";
const NVME_DIRECT: [&str; 2] = [
    "Microsoft NVMe Direct Disk",
    "Microsoft NVMe Direct Disk v2",
];

/// Every Azure disk under `sys` (normally /sys), whole disks in name order.
pub fn scan(sys: &Path) -> Vec<AzureDisk> {
    let block = sys.join("class/block");
    let names = crate::sys::sorted_names(&block);
    let mut disks: Vec<AzureDisk> = names
        .iter()
        .filter(|n| !block.join(n).join("partition").exists())
        .filter_map(|n| identify(&block, n))
        .collect();
    for d in &mut disks {
        for n in &names {
            if let Some(number) = partition_of(&block, n, &d.name) {
                d.partitions.push(Partition {
                    name: n.clone(),
                    number,
                    links: d
                        .links
                        .iter()
                        .map(|l| format!("{l}-part{number}"))
                        .collect(),
                });
            }
        }
    }
    disks
}

/// The links udev gives the block device `kernel` (a disk or a partition), or none.
pub fn links_of(sys: &Path, kernel: &str) -> Vec<String> {
    let block = sys.join("class/block");
    let Some(disk) = parent_disk(&block, kernel) else {
        return identify(&block, kernel)
            .map(|d| d.links)
            .unwrap_or_default();
    };
    let number = partition_of(&block, kernel, &disk).unwrap_or(0);
    identify(&block, &disk)
        .map(|d| {
            d.links
                .iter()
                .map(|l| format!("{l}-part{number}"))
                .collect()
        })
        .unwrap_or_default()
}

/// The partition number of `name` when it is a partition of `disk`.
fn partition_of(block: &Path, name: &str, disk: &str) -> Option<u32> {
    if parent_disk(block, name)? != disk {
        return None;
    }
    read(&block.join(name).join("partition"))?.parse().ok()
}

/// The disk a partition belongs to (its directory's parent in sysfs), None for a disk.
pub fn parent_disk(block: &Path, name: &str) -> Option<String> {
    let dir = block.join(name);
    if !dir.join("partition").exists() {
        return None;
    }
    let real = std::fs::canonicalize(&dir).ok()?;
    Some(real.parent()?.file_name()?.to_string_lossy().into_owned())
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A whole disk's kind and names, if it is one of Azure's.
pub fn identify(block: &Path, name: &str) -> Option<AzureDisk> {
    let dev = block.join(name).join("device");
    let disk = |kind, lun: Option<u32>, serial: Option<String>, links: Vec<String>| AzureDisk {
        name: name.to_string(),
        kind,
        lun,
        serial,
        links: links.into_iter().map(|l| format!("{DIR}/{l}")).collect(),
        partitions: Vec::new(),
    };
    if name.starts_with("nvme") {
        let model = read(&dev.join("model"))?;
        let nsid: u32 = read(&block.join(name).join("nsid"))?.parse().ok()?;
        if model == NVME_REMOTE {
            return Some(match nsid {
                1 => disk(Kind::Os, None, None, vec!["root".into(), "os".into()]),
                n => {
                    let lun = n.checked_sub(2)?;
                    disk(
                        Kind::Data,
                        Some(lun),
                        None,
                        vec![format!("data/by-lun/{lun}")],
                    )
                }
            });
        }
        if NVME_DIRECT.contains(&model.as_str()) {
            let serial = read(&dev.join("serial")).filter(|s| !s.is_empty());
            let links = serial
                .iter()
                .map(|s| format!("local/by-serial/{s}"))
                .collect();
            return Some(disk(Kind::Local, None, serial, links));
        }
        return None;
    }
    if read(&dev.join("vendor"))? != "Msft" || read(&dev.join("model"))? != "Virtual Disk" {
        return None;
    }
    let scsi = std::fs::canonicalize(&dev).ok()?;
    let lun: u32 = scsi
        .file_name()?
        .to_str()?
        .split(':')
        .nth(3)?
        .parse()
        .ok()?;
    let controller = device_id(&scsi)?;
    if controller.get(1..)?.starts_with(GEN1_OS) {
        return Some(disk(Kind::Os, None, None, vec!["root".into(), "os".into()]));
    }
    if controller.get(1..)?.starts_with(GEN1_RESOURCE) {
        return Some(disk(Kind::Resource, None, None, vec!["resource".into()]));
    }
    let n = GEN2_CONTROLLERS
        .iter()
        .position(|c| controller == format!("{c}{GEN2_TAIL}"))?;
    Some(match (n, lun) {
        (0, 0) => disk(Kind::Os, None, None, vec!["root".into(), "os".into()]),
        (0, 1) => disk(Kind::Resource, None, None, vec!["resource".into()]),
        // the provisioning CD is a DVD-ROM, not a Virtual Disk; another LUN of scsi0 is a data
        // disk to WALinuxAgent only
        (0, lun) => disk(Kind::Data, Some(lun), None, vec![format!("scsi0/lun{lun}")]),
        (n, lun) => disk(
            Kind::Data,
            Some(lun),
            None,
            vec![format!("scsi{n}/lun{lun}"), format!("data/by-lun/{lun}")],
        ),
    })
}

/// The VMBus `device_id` of the controller above a SCSI device: the first directory up the
/// device's sysfs path that has one.
fn device_id(scsi: &Path) -> Option<String> {
    let mut dir: Option<PathBuf> = scsi.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        if let Some(id) = read(&d.join("device_id")) {
            return Some(id.to_ascii_lowercase());
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// A sysfs tree shaped as a VM's: devices under `devices/`, `class/block/NAME` links.
    pub(crate) struct Tree(pub PathBuf);

    impl Tree {
        pub(crate) fn new(name: &str) -> Tree {
            let d =
                std::env::temp_dir().join(format!("azprov-sysfs-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(d.join("class/block")).unwrap();
            Tree(d)
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }

        fn link(&self, name: &str, dir: &str) {
            symlink(self.0.join(dir), self.0.join("class/block").join(name)).unwrap();
        }

        /// A Hyper-V SCSI disk: the VMBus device `id`, the SCSI address, vendor and model as
        /// the kernel pads them, and `parts` partitions.
        pub(crate) fn scsi(&self, name: &str, id: &str, addr: &str, model: &str, parts: u32) {
            let host = addr.split(':').next().unwrap();
            let vmbus = format!(
                "devices/LNXSYSTM:00/VMBUS:00/{}",
                id.trim_matches(|c| c == '{' || c == '}')
            );
            self.write(&format!("{vmbus}/device_id"), &format!("{id}\n"));
            let sdev = format!(
                "{vmbus}/host{host}/target{}/{addr}",
                &addr[..addr.rfind(':').unwrap()]
            );
            self.write(&format!("{sdev}/vendor"), "Msft    \n");
            self.write(&format!("{sdev}/model"), &format!("{model:<16}\n"));
            let disk = format!("{sdev}/block/{name}");
            fs::create_dir_all(self.0.join(&disk)).unwrap();
            symlink(self.0.join(&sdev), self.0.join(&disk).join("device")).unwrap();
            self.link(name, &disk);
            for p in 1..=parts {
                let part = format!("{disk}/{name}{p}");
                self.write(&format!("{part}/partition"), &format!("{p}\n"));
                self.link(&format!("{name}{p}"), &part);
            }
        }

        pub(crate) fn nvme(&self, ctrl: &str, nsid: u32, model: &str, serial: &str, parts: u32) {
            let c = format!("devices/pci0000:00/0000:00:04.0/nvme/{ctrl}");
            self.write(&format!("{c}/model"), &format!("{model:<40}\n"));
            self.write(&format!("{c}/serial"), &format!("{serial:<20}\n"));
            let name = format!("{ctrl}n{nsid}");
            let disk = format!("{c}/{name}");
            self.write(&format!("{disk}/nsid"), &format!("{nsid}\n"));
            let _ = symlink(self.0.join(&c), self.0.join(&disk).join("device"));
            self.link(&name, &disk);
            for p in 1..=parts {
                let part = format!("{disk}/{name}p{p}");
                self.write(&format!("{part}/partition"), &format!("{p}\n"));
                self.link(&format!("{name}p{p}"), &part);
            }
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const GEN2_SCSI0: &str = "{f8b3781a-1e82-4818-a1c3-63d806ec15bb}";
    const GEN2_SCSI1: &str = "{f8b3781b-1e82-4818-a1c3-63d806ec15bb}";

    fn summary(sys: &Path) -> Vec<(String, Kind, Option<u32>, Vec<String>)> {
        scan(sys)
            .into_iter()
            .map(|d| (d.name, d.kind, d.lun, d.links))
            .collect()
    }

    fn l(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("{DIR}/{n}")).collect()
    }

    #[test]
    fn gen1_scsi_disks() {
        let t = Tree::new("gen1");
        t.scsi(
            "sda",
            "{00000000-0000-8899-0000-000000000000}",
            "0:0:0:0",
            "Virtual Disk",
            2,
        );
        t.scsi(
            "sdb",
            "{00000000-0001-8899-0000-000000000000}",
            "1:0:1:0",
            "Virtual Disk",
            1,
        );
        t.scsi("sdc", GEN2_SCSI1, "3:0:0:4", "Virtual Disk", 0);
        // the provisioning CD on Gen1 is on the IDE channel as a DVD-ROM
        t.scsi(
            "sr0",
            "{00000000-0001-8899-0000-000000000000}",
            "1:0:0:0",
            "Virtual DVD-ROM",
            0,
        );
        assert_eq!(
            summary(&t.0),
            [
                ("sda".into(), Kind::Os, None, l(&["root", "os"])),
                ("sdb".into(), Kind::Resource, None, l(&["resource"])),
                (
                    "sdc".into(),
                    Kind::Data,
                    Some(4),
                    l(&["scsi1/lun4", "data/by-lun/4"])
                ),
            ]
        );
        let sda = &scan(&t.0)[0];
        assert_eq!(sda.partitions.len(), 2);
        assert_eq!(sda.partitions[1].links, l(&["root-part2", "os-part2"]));
        assert_eq!(links_of(&t.0, "sdb1"), l(&["resource-part1"]));
        assert_eq!(links_of(&t.0, "sr0"), Vec::<String>::new());
    }

    #[test]
    fn gen2_scsi_disks_and_the_cd_without_a_name() {
        let t = Tree::new("gen2");
        t.scsi("sda", GEN2_SCSI0, "0:0:0:0", "Virtual Disk", 1);
        t.scsi("sdb", GEN2_SCSI0, "0:0:0:1", "Virtual Disk", 1);
        t.scsi("sr0", GEN2_SCSI0, "0:0:0:2", "Virtual DVD-ROM", 0);
        t.scsi("sdc", GEN2_SCSI1, "1:0:0:0", "Virtual Disk", 0);
        t.scsi(
            "sdd",
            "{f8b3781d-1e82-4818-a1c3-63d806ec15bb}",
            "5:0:0:12",
            "Virtual Disk",
            0,
        );
        assert_eq!(
            summary(&t.0),
            [
                ("sda".into(), Kind::Os, None, l(&["root", "os"])),
                ("sdb".into(), Kind::Resource, None, l(&["resource"])),
                (
                    "sdc".into(),
                    Kind::Data,
                    Some(0),
                    l(&["scsi1/lun0", "data/by-lun/0"])
                ),
                (
                    "sdd".into(),
                    Kind::Data,
                    Some(12),
                    l(&["scsi3/lun12", "data/by-lun/12"])
                ),
            ]
        );
        assert_eq!(links_of(&t.0, "sda1"), l(&["root-part1", "os-part1"]));
    }

    #[test]
    fn remote_and_direct_nvme() {
        let t = Tree::new("nvme");
        t.nvme("nvme0", 1, NVME_REMOTE, "SN-OS", 2);
        t.nvme("nvme0", 2, NVME_REMOTE, "SN-OS", 0);
        t.nvme("nvme0", 5, NVME_REMOTE, "SN-OS", 1);
        t.nvme("nvme1", 1, "Microsoft NVMe Direct Disk", "a1b2c3d4e5", 0);
        t.nvme("nvme2", 1, "Microsoft NVMe Direct Disk v2", "f6e5d4c3b2", 0);
        assert_eq!(
            summary(&t.0),
            [
                ("nvme0n1".into(), Kind::Os, None, l(&["root", "os"])),
                ("nvme0n2".into(), Kind::Data, Some(0), l(&["data/by-lun/0"])),
                ("nvme0n5".into(), Kind::Data, Some(3), l(&["data/by-lun/3"])),
                (
                    "nvme1n1".into(),
                    Kind::Local,
                    None,
                    l(&["local/by-serial/a1b2c3d4e5"])
                ),
                (
                    "nvme2n1".into(),
                    Kind::Local,
                    None,
                    l(&["local/by-serial/f6e5d4c3b2"])
                ),
            ]
        );
        assert_eq!(links_of(&t.0, "nvme0n5p1"), l(&["data/by-lun/3-part1"]));
        assert_eq!(scan(&t.0)[3].serial.as_deref(), Some("a1b2c3d4e5"));
    }

    #[test]
    fn a_vm_elsewhere_has_no_azure_disks() {
        let t = Tree::new("other");
        // QEMU's SCSI disk and NVMe, a virtio disk without vendor or model
        let sdev = "devices/pci0000:00/virtio1/host0/target0:0:0/0:0:0:0";
        t.write(&format!("{sdev}/vendor"), "QEMU    \n");
        t.write(&format!("{sdev}/model"), "QEMU HARDDISK   \n");
        fs::create_dir_all(t.0.join(sdev).join("block/sda")).unwrap();
        symlink(t.0.join(sdev), t.0.join(sdev).join("block/sda/device")).unwrap();
        t.link("sda", &format!("{sdev}/block/sda"));
        t.nvme("nvme0", 1, "QEMU NVMe Ctrl", "deadbeef", 0);
        fs::create_dir_all(t.0.join("devices/virtual/block/vda")).unwrap();
        t.link("vda", "devices/virtual/block/vda");
        assert_eq!(scan(&t.0), Vec::new());
        assert_eq!(links_of(&t.0, "nvme0n1"), Vec::<String>::new());
    }
}
