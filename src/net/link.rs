//! Choosing the NIC and bringing its link up (docs/contracts.md, "Protocol rules").
//!
//! Candidates are Ethernet interfaces backed by a device (not loopback, bridges, bonds, VLANs,
//! veth or tun pairs). An interface that shares its MAC with an `hv_netvsc` interface but has
//! another driver is an Accelerated Networking VF (mlx4/mlx5/mana) and is never configured.

use super::rtnl::{getlink_msg, link_msg, link_qdisc, NetlinkError, Op, IFF_UP};
use crate::deadline::Deadline;
use crate::sys::netlink::Netlink;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const SYS_CLASS_NET: &str = "/sys/class/net";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// ARPHRD type: 1 is Ethernet.
    pub arp_type: u32,
    /// The kernel driver bound to the backing device; None for virtual interfaces.
    pub driver: Option<String>,
    /// A bridge, bond or VLAN: never a candidate even when it has a device.
    pub stacked: bool,
    pub carrier: bool,
    pub up: bool,
    pub mtu: u32,
}

impl Nic {
    pub fn mac_string(&self) -> String {
        self.mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    }
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// Reads one interface's facts from `class_net/NAME`.
pub fn read_nic(class_net: &Path, name: &str) -> Option<Nic> {
    let dir = class_net.join(name);
    let ifindex = read_trim(&dir.join("ifindex"))?.parse().ok()?;
    let mac = read_trim(&dir.join("address"))
        .and_then(|m| parse_mac(&m))
        .unwrap_or([0; 6]);
    let arp_type = read_trim(&dir.join("type"))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let driver = fs::read_link(dir.join("device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let uevent = read_trim(&dir.join("uevent")).unwrap_or_default();
    let stacked = dir.join("bridge").exists()
        || dir.join("bonding").exists()
        || uevent
            .lines()
            .any(|l| l == "DEVTYPE=vlan" || l == "DEVTYPE=bridge" || l == "DEVTYPE=bond");
    let flags = read_trim(&dir.join("flags"))
        .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    Some(Nic {
        name: name.to_string(),
        ifindex,
        mac,
        arp_type,
        driver,
        stacked,
        // reading `carrier` fails with EINVAL while the link is down
        carrier: read_trim(&dir.join("carrier")).as_deref() == Some("1"),
        up: flags & IFF_UP != 0,
        mtu: read_trim(&dir.join("mtu"))
            .and_then(|m| m.parse().ok())
            .unwrap_or(1500),
    })
}

pub fn scan(class_net: &Path) -> Vec<Nic> {
    let names = crate::sys::sorted_names(class_net);
    names
        .iter()
        .filter_map(|n| read_nic(class_net, n))
        .collect()
}

/// The interfaces DHCP may run on, best first: hv_netvsc, then carrier up, then name order.
pub fn candidates(nics: &[Nic]) -> Vec<&Nic> {
    let netvsc_macs: Vec<[u8; 6]> = nics
        .iter()
        .filter(|n| n.driver.as_deref() == Some("hv_netvsc"))
        .map(|n| n.mac)
        .collect();
    let mut c: Vec<&Nic> = nics
        .iter()
        .filter(|n| n.arp_type == 1 && n.driver.is_some() && !n.stacked && n.name != "lo")
        .filter(|n| n.driver.as_deref() == Some("hv_netvsc") || !netvsc_macs.contains(&n.mac))
        .collect();
    c.sort_by_key(|n| {
        (
            n.driver.as_deref() != Some("hv_netvsc"),
            !n.carrier,
            n.name.clone(),
        )
    });
    c
}

#[derive(Debug)]
pub enum LinkError {
    NoInterface,
    Unknown(String),
    Netlink(NetlinkError),
    NoCarrier(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::NoInterface => write!(f, "no Ethernet interface to configure"),
            LinkError::Unknown(n) => write!(f, "no interface named {n}"),
            LinkError::Netlink(e) => write!(f, "{e}"),
            LinkError::NoCarrier(n) => write!(f, "no carrier on {n}"),
        }
    }
}

impl std::error::Error for LinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LinkError::Netlink(e) => Some(e),
            _ => None,
        }
    }
}

/// `--iface` wins; otherwise the best candidate.
pub fn choose(class_net: &Path, iface: Option<&str>) -> Result<Nic, LinkError> {
    match iface {
        Some(name) => read_nic(class_net, name).ok_or_else(|| LinkError::Unknown(name.to_string())),
        None => {
            let nics = scan(class_net);
            candidates(&nics)
                .first()
                .map(|n| (*n).clone())
                .ok_or(LinkError::NoInterface)
        }
    }
}

/// How long [`wait_choose`] waits for a NIC to show up (a driver still probing, udev still
/// renaming) before "no interface" stands.
pub const NIC_WAIT: Duration = Duration::from_secs(5);

/// [`choose`], polling while no interface (or not the named one) exists yet, for at most
/// [`NIC_WAIT`] inside `deadline`.
pub fn wait_choose(
    class_net: &Path,
    iface: Option<&str>,
    deadline: Deadline,
) -> Result<Nic, LinkError> {
    let started = std::time::Instant::now();
    let wait = deadline.min(NIC_WAIT);
    loop {
        match choose(class_net, iface) {
            Err(LinkError::NoInterface | LinkError::Unknown(_))
                if wait.sleep(Duration::from_millis(50)) => {}
            Ok(nic) => {
                if started.elapsed() >= Duration::from_millis(50) {
                    log::info!(
                        "dhcp: {} appeared after {} ms",
                        nic.name,
                        started.elapsed().as_millis()
                    );
                }
                return Ok(nic);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A link azprov set up; restores the previous state on drop unless kept.
pub struct LinkUp {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
    was_up: bool,
    done: bool,
}

/// Sets or clears IFF_UP on one interface over rtnetlink.
fn set_up(ifindex: u32, name: &str, up: bool) -> Result<(), NetlinkError> {
    let err = |errno| NetlinkError {
        op: Op::SetLink {
            name: name.to_string(),
            up,
        },
        errno,
    };
    let mut nl = Netlink::open().map_err(err)?;
    let mut m = link_msg(ifindex, if up { IFF_UP } else { 0 }, IFF_UP, None).into_bytes();
    nl.request(&mut m).map_err(err)
}

/// Sets the link up (if it was down); the guard sets it back.
pub fn up(nic: &Nic) -> Result<LinkUp, LinkError> {
    if !nic.up {
        set_up(nic.ifindex, &nic.name, true).map_err(LinkError::Netlink)?;
    }
    Ok(LinkUp {
        ifindex: nic.ifindex,
        name: nic.name.clone(),
        mtu: nic.mtu,
        was_up: nic.up,
        done: false,
    })
}

impl LinkUp {
    pub fn keep(mut self) {
        self.done = true;
    }

    pub fn restore(mut self) -> Result<(), NetlinkError> {
        self.set_back()
    }

    fn set_back(&mut self) -> Result<(), NetlinkError> {
        if std::mem::replace(&mut self.done, true) || self.was_up {
            return Ok(());
        }
        set_up(self.ifindex, &self.name, false)
    }
}

impl Drop for LinkUp {
    fn drop(&mut self) {
        if let Err(e) = self.set_back() {
            log::warn!("{e}");
        }
    }
}

/// How long [`wait_queues`] waits for the kernel to activate a link's queues.
const QUEUES_WAIT: Duration = Duration::from_secs(1);

/// Waits (at most [`QUEUES_WAIT`], inside `deadline`) until the kernel has attached the link's
/// root qdisc. `carrier` reads 1 as soon as the driver says so, but the queues are activated
/// afterwards, by the link watch work: until then the qdisc is "noop", which drops every packet
/// while `send` succeeds, so a DISCOVER sent then is lost and only the retransmission gets
/// through. True when the queues are active or cannot be asked about.
pub fn wait_queues(ifindex: u32, deadline: Deadline) -> bool {
    let Ok(mut nl) = Netlink::open() else {
        return true;
    };
    let wait = deadline.min(QUEUES_WAIT);
    let started = std::time::Instant::now();
    for polls in 0u32.. {
        let qdisc = nl
            .query(&mut getlink_msg(ifindex).into_bytes())
            .ok()
            .and_then(|reply| link_qdisc(&reply));
        match qdisc.as_deref() {
            Some("noop") if wait.sleep(Duration::from_millis(2)) => {}
            Some("noop") => return false,
            q => {
                if polls > 0 {
                    log::debug!(
                        "link {ifindex}: qdisc {} after {} us",
                        q.unwrap_or("?"),
                        started.elapsed().as_micros()
                    );
                }
                return true;
            }
        }
    }
    true
}

/// Polls `class_net/NAME/carrier` until it reads 1 or the deadline passes.
pub fn wait_carrier(class_net: &Path, name: &str, deadline: Deadline) -> bool {
    let path: PathBuf = class_net.join(name).join("carrier");
    loop {
        if read_trim(&path).as_deref() == Some("1") {
            return true;
        }
        if !deadline.sleep(Duration::from_millis(20)) {
            return read_trim(&path).as_deref() == Some("1");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(name: &str, mac: u8, driver: Option<&str>, carrier: bool) -> Nic {
        Nic {
            name: name.into(),
            ifindex: 1,
            mac: [0, 0x0d, 0x3a, 0, 0, mac],
            arp_type: 1,
            driver: driver.map(Into::into),
            stacked: false,
            carrier,
            up: false,
            mtu: 1500,
        }
    }

    fn names(c: Vec<&Nic>) -> Vec<&str> {
        c.into_iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn vf_twins_of_netvsc_are_never_candidates() {
        let nics = vec![
            nic("enP1s1", 1, Some("mlx5_core"), true),
            nic("eth0", 1, Some("hv_netvsc"), true),
            nic("eth1", 2, Some("hv_netvsc"), false),
            nic("enP2s2", 2, Some("mana"), true),
        ];
        assert_eq!(names(candidates(&nics)), ["eth0", "eth1"]);
    }

    /// ManaDirect (V8 sizes on): MANA is the only NIC, with no hv_netvsc twin to defer to.
    #[test]
    fn a_mana_nic_without_a_netvsc_twin_is_the_candidate() {
        let nics = vec![nic("enP30832s1", 7, Some("mana"), true)];
        assert_eq!(names(candidates(&nics)), ["enP30832s1"]);
        // on a MANA host with Accelerated Networking, the VF twin stays out
        let both = vec![
            nic("enP30832s1", 7, Some("mana"), true),
            nic("eth0", 7, Some("hv_netvsc"), true),
        ];
        assert_eq!(names(candidates(&both)), ["eth0"]);
    }

    #[test]
    fn netvsc_then_carrier_then_name() {
        let nics = vec![
            nic("ens5", 5, Some("virtio_net"), true),
            nic("ens3", 3, Some("virtio_net"), false),
            nic("ens4", 4, Some("virtio_net"), true),
            nic("eth9", 9, Some("hv_netvsc"), false),
        ];
        assert_eq!(names(candidates(&nics)), ["eth9", "ens4", "ens5", "ens3"]);
    }

    #[test]
    fn virtual_and_stacked_interfaces_are_skipped() {
        let mut lo = nic("lo", 0, None, true);
        lo.arp_type = 772;
        let veth = nic("veth0", 7, None, true);
        let mut br = nic("br0", 8, Some("bridge"), true);
        br.stacked = true;
        let mut ib = nic("ib0", 6, Some("mlx4_ib"), true);
        ib.arp_type = 32;
        let eth = nic("eth0", 1, Some("virtio_net"), false);
        assert_eq!(names(candidates(&[lo, veth, br, ib, eth])), ["eth0"]);
    }

    #[test]
    fn reads_a_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("azprov-link-{}", std::process::id()));
        let eth = root.join("eth0");
        fs::create_dir_all(eth.join("dev/drv/hv_netvsc")).unwrap();
        fs::create_dir_all(&eth).unwrap();
        for (f, v) in [
            ("ifindex", "2\n"),
            ("address", "00:0d:3a:12:34:56\n"),
            ("type", "1\n"),
            ("flags", "0x1003\n"),
            ("carrier", "1\n"),
            ("mtu", "1500\n"),
            ("uevent", "INTERFACE=eth0\nIFINDEX=2\n"),
        ] {
            fs::write(eth.join(f), v).unwrap();
        }
        fs::create_dir_all(eth.join("device")).unwrap();
        std::os::unix::fs::symlink(eth.join("dev/drv/hv_netvsc"), eth.join("device/driver"))
            .unwrap();
        let n = read_nic(&root, "eth0").unwrap();
        assert_eq!(n.ifindex, 2);
        assert_eq!(n.mac_string(), "00:0d:3a:12:34:56");
        assert_eq!(n.driver.as_deref(), Some("hv_netvsc"));
        assert!(n.up && n.carrier && !n.stacked);
        assert_eq!(choose(&root, None).unwrap().name, "eth0");
        assert!(matches!(
            choose(&root, Some("eth7")),
            Err(LinkError::Unknown(_))
        ));
        fs::remove_dir_all(&root).unwrap();
    }
}
