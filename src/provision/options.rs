//! What a provisioning run is told: the root, where the data comes from, the deadline, the
//! endpoints, and the paths tests inject. PID 1 and the CLI build it from the kernel command
//! line alike ([`Options::from_config`]).

use crate::azure::vmid;
use crate::config::Config;
use crate::modules::OnDemand;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where the provisioning data may come from.
#[derive(Debug, Clone)]
pub enum MediaSource {
    /// CD-ROM drives under `/dev` plus these extra devices.
    Devices(Vec<PathBuf>),
    /// An ovf-env.xml file instead of a disc.
    File(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    pub iface: Option<String>,
    pub dhcp: bool,
    pub media: MediaSource,
    pub force: bool,
    /// `azprov.disable`, `azprov=0`, `rd.azprov=0`: do nothing at all.
    pub disable: bool,
    pub timeout: Duration,
    pub wireserver: Option<SocketAddr>,
    pub imds: String,
    pub keep_network: bool,
    /// Normally `/sys`, `/sys/class/dmi/id` and `/dev`; injected in tests (`--dmi`).
    pub sys: PathBuf,
    pub dmi: PathBuf,
    pub dev: PathBuf,
    /// How long to wait for a CD-ROM drive to appear when a CD-ROM driver is loaded but no
    /// drive is there yet (PID 1 right after loading modules; a hook while udev probes).
    pub cdrom_settle: Duration,
    /// Hook mode: a read-only root is remounted read-write for the run and read-only again
    /// afterwards (PID 1 mounts the root itself).
    pub remount: bool,
    /// New SSH host keys for a new VM (`azprov.hostkeys=keep` / `--keep-host-keys`: false).
    pub host_keys: bool,
    /// Which host key types (`azprov.hostkeytypes=`).
    pub host_key_types: Vec<super::hostkeys::KeyType>,
    /// Grow the root's partition and filesystem to the disk (`azprov.growroot=0`: no).
    pub growroot: bool,
    /// PID 1: the module loader, perhaps still loading (the network waits for it, the media
    /// stage when no CD drive is there yet), and loading a CD filesystem's module on demand
    /// (iso9660). Hook mode: none.
    pub modules: OnDemand,
    /// Where this boot's world-readable outcome goes (`/run/azprov`; [`super::record`]).
    pub record_dir: Option<PathBuf>,
    /// The Hyper-V KVP device the report is served on while the run lasts (absent off
    /// Hyper-V: the pool file only).
    pub kvp_device: PathBuf,
    /// `--after-proxy-agent`: the booted system's `azprov-msp.service`, which finishes an MSP
    /// VM's provisioning once the Guest Proxy Agent holds its key ([`super::msp`]).
    pub after_proxy_agent: bool,
    /// `azprov.inplace`: PID 1 provisions the initramfs it runs in (the OS itself) and execs
    /// its init in place; the running system's hostname is set.
    pub in_place: bool,
    /// Where linuxkit's `/run/config` layout is written (`--run-config`; `/run/config` in
    /// place), or nowhere.
    pub run_config: Option<PathBuf>,
}

/// How long to wait for a CD-ROM drive once its driver is loaded (SCSI and ATA scans finish
/// after their modules load).
pub const CDROM_SETTLE: Duration = Duration::from_secs(2);

/// Which way azprov runs, for what differs between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `azprov provision --root DIR` from a framework's hook: the root as the framework
    /// mounted it (remounted read-write for the run).
    Hook,
    /// `/init` of azprov's own initramfs: the root mounted by PID 1, read-write.
    Pid1,
}

impl Options {
    /// The kernel command line's settings (`azprov.iface=`, `azprov.timeout=`, …) over the
    /// defaults: the system's /sys and /dev, CD-ROM drives and DHCP, the network torn down
    /// afterwards; in hook mode the root made writable for the run. The CLI puts its flags
    /// over this.
    pub fn from_config(root: PathBuf, cfg: &Config, mode: Mode) -> Self {
        Options {
            root,
            iface: cfg.iface.clone(),
            dhcp: true,
            media: MediaSource::Devices(Vec::new()),
            force: cfg.force,
            disable: cfg.disable,
            timeout: cfg.timeout,
            wireserver: cfg.wireserver,
            imds: cfg.imds.clone(),
            keep_network: cfg.keepnet,
            sys: "/sys".into(),
            dmi: vmid::DMI_DIR.into(),
            dev: "/dev".into(),
            cdrom_settle: CDROM_SETTLE,
            remount: mode == Mode::Hook,
            host_keys: cfg.host_keys,
            growroot: cfg.growroot,
            host_key_types: cfg
                .host_key_types
                .iter()
                .filter_map(|t| super::hostkeys::KeyType::parse(t))
                .collect(),
            modules: OnDemand::default(),
            record_dir: Some(super::record::RUN_DIR.into()),
            kvp_device: crate::azure::kvp::responder::DEVICE.into(),
            after_proxy_agent: false,
            in_place: false,
            run_config: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid1_and_hooks_read_the_same_command_line_and_differ_in_the_remount_only() {
        let (cfg, _) = crate::config::load(
            None,
            "root=/dev/sda1 azprov.iface=eth1 azprov.timeout=42 azprov.force azprov.keepnet \
             azprov.hostkeys=keep azprov.wireserver=10.0.0.9 azprov.imds=http://127.0.0.1:8080",
        );
        let pid1 = Options::from_config("/sysroot".into(), &cfg, Mode::Pid1);
        let hook = Options::from_config("/root".into(), &cfg, Mode::Hook);
        for o in [&pid1, &hook] {
            assert_eq!(o.iface.as_deref(), Some("eth1"));
            assert_eq!(o.timeout, Duration::from_secs(42));
            assert!(o.force && o.keep_network && !o.host_keys && o.dhcp && !o.disable);
            assert_eq!(o.wireserver, cfg.wireserver);
            assert_eq!(o.imds, "http://127.0.0.1:8080");
            assert_eq!(o.sys, PathBuf::from("/sys"));
        }
        assert!(!pid1.remount && hook.remount);
        let (off, _) = crate::config::load(None, "azprov=0");
        assert!(Options::from_config("/".into(), &off, Mode::Hook).disable);
    }
}
