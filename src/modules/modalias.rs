//! Which listed modules a device of this VM needs: the part of udev's job PID 1 does. The
//! initramfs holds the drivers for Azure (Hyper-V's VMBus, Gen1's IDE CD) and for QEMU
//! (virtio); a VM has the devices of one. A driver for a bus the kernel has enumerated before
//! PID 1 starts is loaded only when a present device matches one of its aliases (the
//! patterns of modules.alias, matched as kmod does); a library that only skipped modules need
//! is skipped with them. Buses:
//!
//! - PCI: `/sys/bus/pci/devices/*/modalias`, complete before PID 1 (host bridges are built in).
//! - virtio: what virtio_pci will create, from the PCI ids (the virtio spec's "PCI Device
//!   Discovery": a device id of 0x1040 + type, or a transitional id with the type as its
//!   subsystem id; the vendor is the subsystem vendor), plus what built-in transports made.
//!   Not judged when a virtio-mmio transport exists: its devices appear only once it probes.
//! - Hyper-V (`vmbus:` aliases and hv_vmbus's ACPI ones): on x86 the kernel starts VMBus only
//!   when CPUID names Microsoft's hypervisor (`hv_is_hyperv_initialized`), so the same test
//!   here skips exactly what would fail; elsewhere the modules load and hv_vmbus says ENODEV.
//!   On Hyper-V (or where that is unknown) a listed pci_hyperv brings PCI devices later
//!   (Azure's NVMe disks), so PCI and virtio are not judged there at all.
//!
//! A module with any alias on another bus (scsi:, acpi:, of:, …), or with no aliases, loads as
//! before; so does a module named in `azprov.modules=`.

use super::Module;
use std::fs;
use std::path::Path;

/// The devices of the buses judged; None: that bus's devices are not all known yet, so its
/// drivers all load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Devices {
    pub pci: Option<Vec<String>>,
    pub virtio: Option<Vec<String>>,
    pub hyperv: Option<bool>,
}

/// A bus this module judges, by the alias's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bus {
    Pci,
    Virtio,
    HyperV,
}

fn bus(alias: &str) -> Option<Bus> {
    if alias.starts_with("pci:") {
        Some(Bus::Pci)
    } else if alias.starts_with("virtio:") {
        Some(Bus::Virtio)
    } else if alias.starts_with("vmbus:")
        || (alias.starts_with("acpi") && (alias.contains(":VMBUS:") || alias.contains(":VMBus:")))
    {
        Some(Bus::HyperV)
    } else {
        None
    }
}

/// A hex field of a PCI modalias (`v00001AF4`, `d00001041`, `sv…`, `sd…`), by its key.
fn field(modalias: &str, key: &str) -> Option<u32> {
    // the keys in order: v, d, sv, sd, bc; each value 8 hex digits but the class bytes
    let rest = modalias.strip_prefix("pci:")?;
    let at = match key {
        "v" => 0,
        "d" => 9,
        "sv" => 18,
        "sd" => 28,
        _ => return None,
    };
    let start = at + key.len();
    let k = rest.get(at..start)?;
    let hex = rest.get(start..start + 8)?;
    if k != key {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

/// The virtio device virtio_pci makes of a PCI device, as its modalias; None: not virtio.
pub fn virtio_of_pci(modalias: &str) -> Option<String> {
    const VIRTIO_VENDOR: u32 = 0x1AF4;
    if field(modalias, "v")? != VIRTIO_VENDOR {
        return None;
    }
    let device = field(modalias, "d")?;
    let kind = match device {
        0x1040..=0x107F => device - 0x1040,
        0x1000..=0x103F => field(modalias, "sd")?,
        _ => return None,
    };
    Some(format!("virtio:d{kind:08X}v{:08X}", field(modalias, "sv")?))
}

/// Every `modalias` file one level below `dir` (`/sys/bus/pci/devices/*/modalias`); None when
/// the directory cannot be read.
fn modaliases(dir: &Path) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).ok()?.flatten() {
        if let Ok(s) = fs::read_to_string(e.path().join("modalias")) {
            out.push(s.trim().to_string());
        }
    }
    out.sort();
    Some(out)
}

impl Devices {
    /// Reads the buses below `sys` (normally /sys) for the modules in `list`; `hyperv` is
    /// [`super::hyperv`]'s answer. Hyper-V's virtual PCI (pci_hyperv) brings PCI devices after
    /// PID 1 starts (the NVMe disks of Azure's NVMe sizes, Accelerated Networking's VFs): with
    /// it in the list, PCI (and so virtio) is complete only where this is known not to be
    /// Hyper-V, and is not read at all elsewhere.
    pub fn scan(sys: &Path, hyperv: Option<bool>, list: &[Module]) -> Devices {
        if hyperv != Some(false) && list.iter().any(|m| m.name == "pci_hyperv") {
            return Devices {
                pci: None,
                virtio: None,
                hyperv,
            };
        }
        let pci = modaliases(&sys.join("bus/pci/devices"));
        let platform = modaliases(&sys.join("bus/platform/devices")).unwrap_or_default();
        let mmio = platform
            .iter()
            .any(|m| m.contains("virtio,mmio") || m.starts_with("acpi:LNRO0005:"));
        let virtio = match (&pci, mmio) {
            (Some(pci), false) => {
                let mut v = modaliases(&sys.join("bus/virtio/devices")).unwrap_or_default();
                v.extend(pci.iter().filter_map(|m| virtio_of_pci(m)));
                Some(v)
            }
            _ => None,
        };
        Devices {
            pci,
            virtio,
            hyperv,
        }
    }

    /// Whether `m` may be needed: None when no judged bus says no; Some(why) to skip it.
    fn verdict(&self, m: &Module) -> Option<&'static str> {
        let buses: Vec<Option<Bus>> = m.aliases.iter().map(|a| bus(a)).collect();
        if buses.is_empty() || buses.contains(&None) {
            return None;
        }
        let mut judged_all = true;
        for (alias, b) in m.aliases.iter().zip(buses.iter().flatten()) {
            let seen = match b {
                Bus::Pci => self.pci.as_ref(),
                Bus::Virtio => self.virtio.as_ref(),
                Bus::HyperV => match self.hyperv {
                    Some(true) => return None,
                    Some(false) => continue,
                    None => None,
                },
            };
            match seen {
                Some(devs) if devs.iter().any(|d| crate::glob::matches(alias, d)) => return None,
                Some(_) => {}
                None => judged_all = false,
            }
        }
        if !judged_all {
            None
        } else if buses.contains(&Some(Bus::HyperV)) {
            Some("not Hyper-V")
        } else {
            Some("no device")
        }
    }
}

/// Splits `list` into what loads and what no device needs (name, why). A module
/// in `wanted` (`azprov.modules=`) always loads. A module that listed modules depend on (a
/// library: libata, virtio_ring, scsi_transport_fc) is skipped when everything listed that
/// needs it is.
pub fn gate(
    list: Vec<Module>,
    devices: &Devices,
    wanted: &[String],
) -> (Vec<Module>, Vec<(String, &'static str)>) {
    let mut skip: Vec<(usize, &'static str)> = list
        .iter()
        .enumerate()
        .filter(|(_, m)| !wanted.contains(&m.name))
        .filter_map(|(i, m)| devices.verdict(m).map(|why| (i, why)))
        .collect();
    // libraries, until nothing changes: each pass can free the next layer down
    loop {
        let skipped = |i: usize| skip.iter().any(|&(j, _)| j == i);
        let more: Vec<usize> = list
            .iter()
            .enumerate()
            .filter(|&(i, m)| !skipped(i) && !wanted.contains(&m.name))
            .filter(|(_, m)| {
                let users: Vec<usize> = list
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| o.deps.contains(&m.name))
                    .map(|(j, _)| j)
                    .collect();
                !users.is_empty() && users.iter().all(|&j| skipped(j))
            })
            .map(|(i, _)| i)
            .collect();
        if more.is_empty() {
            break;
        }
        skip.extend(
            more.into_iter()
                .map(|i| (i, "only skipped modules need it")),
        );
    }
    let mut why = Vec::new();
    let mut kept = Vec::new();
    for (i, m) in list.into_iter().enumerate() {
        match skip.iter().find(|&&(j, _)| j == i) {
            Some(&(_, w)) => why.push((m.name, w)),
            None => kept.push(m),
        }
    }
    (kept, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::parse_list;

    // what mkinitramfs writes for the default list, trimmed to a few aliases each, and
    // without pci_hyperv (see hyperv_pci_makes_pci_late_on_hyperv_only)
    const LIST: &str = "\
/k/drivers/hv/hv_vmbus.ko: | acpi*:VMBUS:* acpi*:VMBus:*
/k/drivers/net/hyperv/hv_netvsc.ko: hv_vmbus | vmbus:635161f83edfc546913ff2d2f965ed0e
/k/drivers/scsi/scsi_common.ko:
/k/drivers/scsi/scsi_mod.ko: scsi_common
/k/drivers/scsi/scsi_transport_fc.ko: scsi_mod scsi_common
/k/drivers/scsi/hv_storvsc.ko: scsi_transport_fc scsi_mod scsi_common hv_vmbus | vmbus:d96361baa104294db60572e2ffb1dc7f
/k/drivers/ata/libata.ko: scsi_mod scsi_common
/k/drivers/ata/ata_piix.ko: libata scsi_mod scsi_common | pci:v00008086d00007111sv*sd*bc*sc*i* pci:v00008086d00007010sv*sd*bc*sc*i*
/k/drivers/cdrom/cdrom.ko:
/k/drivers/scsi/sr_mod.ko: scsi_mod scsi_common cdrom | scsi:t-0x04* scsi:t-0x05*
/k/fs/udf/udf.ko: cdrom
/k/drivers/virtio/virtio_ring.ko:
/k/drivers/virtio/virtio.ko: virtio_ring
/k/drivers/virtio/virtio_pci.ko: virtio virtio_ring | pci:v00001AF4d*sv*sd*bc*sc*i*
/k/drivers/net/virtio_net.ko: virtio virtio_ring | virtio:d00000001v*
/k/drivers/block/virtio_blk.ko: virtio virtio_ring | virtio:d00000002v*
/k/drivers/scsi/virtio_scsi.ko: scsi_mod scsi_common virtio virtio_ring | virtio:d00000008v*
";

    // QEMU's gen1 shape: PIIX3 IDE, a virtio-net and a virtio-blk (transitional ids)
    const QEMU_PC: [&str; 3] = [
        "pci:v00008086d00007010sv00001AF4sd00001100bc01sc01i80",
        "pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00",
        "pci:v00001AF4d00001001sv00001AF4sd00000002bc01sc00i00",
    ];
    // Azure Gen1: the 440BX bridge, PIIX4 ISA and IDE, Hyper-V's video
    const AZURE_GEN1: [&str; 3] = [
        "pci:v00008086d00007192sv00000000sd00000000bc06sc00i00",
        "pci:v00008086d00007111sv00001414sd00000000bc01sc01i80",
        "pci:v00001414d00005353sv00000000sd00000000bc03sc00i00",
    ];

    fn run(pci: &[&str], hyperv: Option<bool>, wanted: &[&str]) -> (Vec<String>, Vec<String>) {
        let pci: Vec<String> = pci.iter().map(|s| s.to_string()).collect();
        let virtio = pci.iter().filter_map(|m| virtio_of_pci(m)).collect();
        let d = Devices {
            pci: Some(pci),
            virtio: Some(virtio),
            hyperv,
        };
        let wanted: Vec<String> = wanted.iter().map(|s| s.to_string()).collect();
        let (kept, why) = gate(parse_list(LIST), &d, &wanted);
        let why = why.into_iter().map(|(m, w)| format!("{m} ({w})")).collect();
        (kept.into_iter().map(|m| m.name).collect(), why)
    }

    #[test]
    fn qemu_pc_keeps_ide_and_its_virtio_devices_only() {
        let (kept, why) = run(&QEMU_PC, Some(false), &[]);
        assert_eq!(
            why,
            [
                "hv_vmbus (not Hyper-V)",
                "hv_netvsc (not Hyper-V)",
                "scsi_transport_fc (only skipped modules need it)",
                "hv_storvsc (not Hyper-V)",
                "virtio_scsi (no device)",
            ]
        );
        assert!(kept.contains(&"ata_piix".to_string()) && kept.contains(&"virtio_blk".to_string()));
        assert!(kept.contains(&"sr_mod".to_string()) && kept.contains(&"udf".to_string()));
    }

    #[test]
    fn azure_gen1_drops_virtio_and_keeps_hyperv_and_ide() {
        let (kept, why) = run(&AZURE_GEN1, Some(true), &[]);
        assert_eq!(
            why,
            [
                "virtio_ring (only skipped modules need it)",
                "virtio (only skipped modules need it)",
                "virtio_pci (no device)",
                "virtio_net (no device)",
                "virtio_blk (no device)",
                "virtio_scsi (no device)",
            ]
        );
        for m in [
            "hv_vmbus",
            "hv_netvsc",
            "hv_storvsc",
            "scsi_transport_fc",
            "ata_piix",
            "libata",
        ] {
            assert!(kept.contains(&m.to_string()), "{m} dropped");
        }
    }

    #[test]
    fn hyperv_pci_makes_pci_late_on_hyperv_only() {
        let with_vpci = parse_list(&format!(
            "{LIST}/k/drivers/pci/controller/pci-hyperv.ko: hv_vmbus | vmbus:1df6c444444400449d52802e27ede19f\n"
        ));
        let dir = std::env::temp_dir().join(format!("azprov-modalias-vpci-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (i, alias) in AZURE_GEN1.iter().enumerate() {
            let d = dir.join(format!("bus/pci/devices/0000:00:0{i}.0"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("modalias"), format!("{alias}\n")).unwrap();
        }
        let gated = |hyperv| {
            gate(
                with_vpci.clone(),
                &Devices::scan(&dir, hyperv, &with_vpci),
                &[],
            )
        };
        // Azure: an NVMe disk may still come through pci_hyperv, so no PCI driver is judged
        assert_eq!(
            Devices::scan(&dir, Some(true), &with_vpci),
            Devices {
                pci: None,
                virtio: None,
                hyperv: Some(true)
            }
        );
        let (kept, why) = gated(Some(true));
        assert!(why.is_empty(), "{why:?}");
        assert_eq!(kept.len(), with_vpci.len());
        // arm64 (unknown): the same
        assert!(gated(None).1.is_empty());
        // QEMU: pci_hyperv itself goes, and PCI is judged as before
        let (_, why) = gated(Some(false));
        let names: Vec<&str> = why.iter().map(|(m, _)| m.as_str()).collect();
        assert!(
            names.contains(&"pci_hyperv") && names.contains(&"virtio_pci"),
            "{names:?}"
        );
        // a list without pci_hyperv: PCI is read on Hyper-V too
        let plain = parse_list(LIST);
        assert!(Devices::scan(&dir, Some(true), &plain).pci.is_some());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn azure_gen2_has_no_pci_so_no_ide() {
        let (kept, why) = run(&[], Some(true), &[]);
        assert!(why.contains(&"ata_piix (no device)".to_string()));
        assert!(why.contains(&"libata (only skipped modules need it)".to_string()));
        for m in ["hv_storvsc", "scsi_mod", "sr_mod", "cdrom", "udf"] {
            assert!(kept.contains(&m.to_string()), "{m} dropped");
        }
    }

    #[test]
    fn unknown_buses_and_wanted_modules_load() {
        // hyperv unknown (arm64): every Hyper-V module loads
        let (kept, _) = run(&QEMU_PC, None, &[]);
        assert!(kept.contains(&"hv_vmbus".to_string()) && kept.contains(&"hv_storvsc".to_string()));
        // azprov.modules= wins over the verdict
        let (kept, why) = run(&QEMU_PC, Some(false), &["virtio_scsi"]);
        assert!(kept.contains(&"virtio_scsi".to_string()));
        assert!(!why.iter().any(|w| w.starts_with("virtio_scsi")));
        // PCI or virtio unknown: nothing on them is judged
        let d = Devices::default();
        let all = parse_list(LIST).len();
        assert_eq!(gate(parse_list(LIST), &d, &[]).0.len(), all);
    }

    #[test]
    fn virtio_types_from_pci_ids() {
        // modern ids: 0x1040 + type
        assert_eq!(
            virtio_of_pci("pci:v00001AF4d00001041sv00001AF4sd00001100bc02sc00i00").as_deref(),
            Some("virtio:d00000001v00001AF4")
        );
        assert_eq!(
            virtio_of_pci("pci:v00001AF4d00001048sv00001AF4sd00001100bc01sc00i00").as_deref(),
            Some("virtio:d00000008v00001AF4")
        );
        // transitional: the subsystem id is the type
        assert_eq!(
            virtio_of_pci("pci:v00001AF4d00001004sv00001AF4sd00000008bc01sc00i00").as_deref(),
            Some("virtio:d00000008v00001AF4")
        );
        // ivshmem (1af4:1110) and other vendors are not virtio
        assert_eq!(
            virtio_of_pci("pci:v00001AF4d00001110sv00001AF4sd00001100bc05sc00i00"),
            None
        );
        assert_eq!(
            virtio_of_pci("pci:v00008086d00001041sv00001AF4sd00000001bc02sc00i00"),
            None
        );
        assert_eq!(virtio_of_pci("garbage"), None);
    }

    #[test]
    fn scans_a_sysfs_tree() {
        let dir = std::env::temp_dir().join(format!("azprov-modalias-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let dev = |bus: &str, name: &str, alias: &str| {
            let d = dir.join("bus").join(bus).join("devices").join(name);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("modalias"), format!("{alias}\n")).unwrap();
        };
        dev("pci", "0000:00:01.1", QEMU_PC[0]);
        dev("pci", "0000:00:03.0", QEMU_PC[1]);
        dev("platform", "serial8250", "platform:serial8250");
        let d = Devices::scan(&dir, Some(false), &[]);
        assert_eq!(d.pci.as_ref().map(Vec::len), Some(2));
        assert_eq!(
            d.virtio,
            Some(vec!["virtio:d00000001v00001AF4".to_string()])
        );
        // a virtio-mmio transport: its devices are not known before it probes
        dev("platform", "LNRO0005:00", "acpi:LNRO0005:");
        assert_eq!(Devices::scan(&dir, Some(false), &[]).virtio, None);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(Devices::scan(&dir, None, &[]), Devices::default());
    }
}
