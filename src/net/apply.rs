//! Applying a lease over rtnetlink: MTU, address, routes (option 121 wins over option 3, RFC
//! 3442). `apply` returns an [`Applied`] handle that undoes exactly what it added; dropping it
//! undoes too, unless [`Applied::keep`] was called.

use super::dhcp::Lease;
use super::link::LinkUp;
use super::wire::dhcpv4::Route;
use crate::sys::netlink::Netlink;
use std::io;
use std::net::Ipv4Addr;

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const AF_INET: u8 = 2;
const IFLA_MTU: u16 = 4;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_BROADCAST: u16 = 4;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_DHCP: u8 = 16;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;
const RTNH_F_ONLINK: u32 = 4;
pub const IFF_UP: u32 = 1;

/// A netlink message under construction: header, fixed part, attributes (4-byte aligned).
pub struct Msg(Vec<u8>);

impl Msg {
    pub fn new(kind: u16, flags: u16) -> Self {
        // length and sequence are filled in by `Netlink::request`
        let mut b = vec![0u8; 4];
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&[0u8; 8]);
        Msg(b)
    }

    pub fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    pub fn attr(mut self, kind: u16, data: &[u8]) -> Self {
        let len = (4 + data.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
        self
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// RTM_NEWLINK changing only the flags in `change` (e.g. IFF_UP) and optionally the MTU.
pub fn link_msg(ifindex: u32, flags: u32, change: u32, mtu: Option<u32>) -> Msg {
    let mut fixed = vec![0u8; 4]; // family AF_UNSPEC, pad, type
    fixed.extend_from_slice(&ifindex.to_ne_bytes());
    fixed.extend_from_slice(&flags.to_ne_bytes());
    fixed.extend_from_slice(&change.to_ne_bytes());
    let m = Msg::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK).raw(&fixed);
    match mtu {
        Some(v) => m.attr(IFLA_MTU, &v.to_ne_bytes()),
        None => m,
    }
}

fn addr_msg(kind: u16, flags: u16, ifindex: u32, lease: &Lease) -> Msg {
    let mut fixed = vec![AF_INET, lease.prefix_len, 0, RT_SCOPE_UNIVERSE];
    fixed.extend_from_slice(&ifindex.to_ne_bytes());
    let a = lease.address.octets();
    Msg::new(kind, NLM_F_REQUEST | NLM_F_ACK | flags)
        .raw(&fixed)
        .attr(IFA_LOCAL, &a)
        .attr(IFA_ADDRESS, &a)
        .attr(IFA_BROADCAST, &broadcast(lease).octets())
}

/// Option 28, else the subnet's all-ones address.
pub fn broadcast(lease: &Lease) -> Ipv4Addr {
    lease.broadcast.unwrap_or_else(|| {
        let host_bits = u32::MAX
            .checked_shr(u32::from(lease.prefix_len))
            .unwrap_or(0);
        Ipv4Addr::from(u32::from(lease.address) | host_bits)
    })
}

fn in_subnet(lease: &Lease, ip: Ipv4Addr) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(lease.prefix_len))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(lease.address) & mask
}

fn route_msg(kind: u16, flags: u16, ifindex: u32, lease: &Lease, r: &Route) -> Msg {
    let on_link = r.gateway.is_unspecified();
    let scope = if on_link {
        RT_SCOPE_LINK
    } else {
        RT_SCOPE_UNIVERSE
    };
    let mut fixed = vec![
        AF_INET,
        r.prefix_len,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_DHCP,
        scope,
        RTN_UNICAST,
    ];
    // A gateway outside the subnet is still reachable on this link (RFC 3442 allows it).
    let rt_flags = if !on_link && !in_subnet(lease, r.gateway) {
        RTNH_F_ONLINK
    } else {
        0
    };
    fixed.extend_from_slice(&rt_flags.to_ne_bytes());
    let mut m = Msg::new(kind, NLM_F_REQUEST | NLM_F_ACK | flags).raw(&fixed);
    if r.prefix_len > 0 {
        m = m.attr(RTA_DST, &r.dest.octets());
    }
    m = m.attr(RTA_OIF, &ifindex.to_ne_bytes());
    if !on_link {
        m = m.attr(RTA_GATEWAY, &r.gateway.octets());
    }
    m.attr(RTA_PREFSRC, &lease.address.octets())
}

/// What went wrong while configuring, with the step and the kernel's errno.
#[derive(Debug)]
pub struct ApplyError {
    pub step: String,
    pub source: io::Error,
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.source)
    }
}

impl std::error::Error for ApplyError {}

/// The configuration azprov added to one interface. Undone on drop unless kept.
pub struct Applied {
    nl: Netlink,
    ifindex: u32,
    lease: Lease,
    address_added: bool,
    routes_added: Vec<Route>,
    old_mtu: Option<u32>,
    link: Option<LinkUp>,
    kept: bool,
}

/// Configures `lease` on the interface that `link` brought up.
pub fn apply(link: LinkUp, lease: &Lease) -> Result<Applied, ApplyError> {
    let err = |step: String| move |source: io::Error| ApplyError { step, source };
    let nl = Netlink::open().map_err(err("open netlink".into()))?;
    let ifindex = link.ifindex;
    let mut a = Applied {
        nl,
        ifindex,
        lease: lease.clone(),
        address_added: false,
        routes_added: Vec::new(),
        old_mtu: None,
        link: Some(link),
        kept: false,
    };
    if let Some(mtu) = lease.mtu.filter(|m| *m >= 576) {
        let old = a.link.as_ref().map(|l| l.mtu).unwrap_or(1500);
        if old != u32::from(mtu) {
            let mut m = link_msg(ifindex, 0, 0, Some(u32::from(mtu))).into_bytes();
            a.nl.request(&mut m)
                .map_err(err(format!("set MTU {mtu}")))?;
            a.old_mtu = Some(old);
        }
    }
    let mut m = addr_msg(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, ifindex, lease).into_bytes();
    match a.nl.request(&mut m) {
        Ok(()) => a.address_added = true,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => {
            return Err(err(format!(
                "add address {}/{}",
                lease.address, lease.prefix_len
            ))(e))
        }
    }
    // On-link routes first: a gateway route needs its gateway reachable.
    let mut routes = lease.routes.clone();
    routes.sort_by_key(|r| !r.gateway.is_unspecified());
    for r in &routes {
        let mut m =
            route_msg(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, ifindex, lease, r).into_bytes();
        match a.nl.request(&mut m) {
            Ok(()) => a.routes_added.push(*r),
            // Already there (e.g. the subnet route the kernel made): not ours to remove.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => {
                return Err(err(format!(
                    "add route {}/{} via {}",
                    r.dest, r.prefix_len, r.gateway
                ))(e))
            }
        }
    }
    Ok(a)
}

impl Applied {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Leaves everything configured (`--keep`, `azprov.keepnet`).
    pub fn keep(mut self) {
        self.kept = true;
        if let Some(l) = self.link.take() {
            l.keep();
        }
    }

    /// Removes the routes and the address azprov added, restores the MTU and the link state.
    pub fn teardown(mut self) -> Result<(), ApplyError> {
        self.undo()
    }

    fn undo(&mut self) -> Result<(), ApplyError> {
        let mut first_err = None;
        for r in std::mem::take(&mut self.routes_added).iter().rev() {
            let mut m = route_msg(RTM_DELROUTE, 0, self.ifindex, &self.lease, r).into_bytes();
            match self.nl.request(&mut m) {
                // Gone with the address or removed by someone else: fine.
                Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                    first_err.get_or_insert(ApplyError {
                        step: format!("delete route {}/{}", r.dest, r.prefix_len),
                        source: e,
                    });
                }
                _ => {}
            }
        }
        if std::mem::take(&mut self.address_added) {
            let mut m = addr_msg(RTM_DELADDR, 0, self.ifindex, &self.lease).into_bytes();
            if let Err(e) = self.nl.request(&mut m) {
                if e.raw_os_error() != Some(libc::EADDRNOTAVAIL) {
                    first_err.get_or_insert(ApplyError {
                        step: format!("delete address {}", self.lease.address),
                        source: e,
                    });
                }
            }
        }
        if let Some(old) = self.old_mtu.take() {
            let mut m = link_msg(self.ifindex, 0, 0, Some(old)).into_bytes();
            if let Err(e) = self.nl.request(&mut m) {
                first_err.get_or_insert(ApplyError {
                    step: format!("restore MTU {old}"),
                    source: e,
                });
            }
        }
        if let Some(link) = self.link.take() {
            if let Err(e) = link.restore() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Applied {
    fn drop(&mut self) {
        if !self.kept {
            if let Err(e) = self.undo() {
                log::warn!("network teardown: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease {
            address: Ipv4Addr::new(10, 0, 0, 69),
            prefix_len: 24,
            router: None,
            routes: vec![],
            dns: vec![],
            domain: None,
            mtu: None,
            server_id: Ipv4Addr::new(168, 63, 129, 16),
            wireserver: None,
            lease_secs: u32::MAX,
            broadcast: None,
        }
    }

    #[test]
    fn address_message_layout() {
        let b = addr_msg(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, 3, &lease()).into_bytes();
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), RTM_NEWADDR);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), 0x605);
        assert_eq!(&b[16..20], &[AF_INET, 24, 0, 0]);
        assert_eq!(u32::from_ne_bytes([b[20], b[21], b[22], b[23]]), 3);
        // IFA_LOCAL, IFA_ADDRESS, IFA_BROADCAST, 8 bytes each
        assert_eq!(b.len(), 24 + 3 * 8);
        assert_eq!(&b[24..32], &[8, 0, 2, 0, 10, 0, 0, 69][..]);
        assert_eq!(&b[44..48], &[10, 0, 0, 255]);
    }

    #[test]
    fn route_messages() {
        let l = lease();
        let gw = Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: Ipv4Addr::new(10, 0, 0, 1),
        };
        let b = route_msg(RTM_NEWROUTE, 0, 2, &l, &gw).into_bytes();
        assert_eq!(
            &b[16..24],
            &[
                AF_INET,
                0,
                0,
                0,
                RT_TABLE_MAIN,
                RTPROT_DHCP,
                RT_SCOPE_UNIVERSE,
                RTN_UNICAST
            ]
        );
        assert_eq!(
            u32::from_ne_bytes([b[24], b[25], b[26], b[27]]),
            0,
            "gateway in subnet: no ONLINK"
        );
        // no RTA_DST for a /0; OIF, GATEWAY, PREFSRC
        assert_eq!(b.len(), 28 + 3 * 8);
        assert_eq!(u16::from_ne_bytes([b[30], b[31]]), RTA_OIF);

        let onlink = Route {
            dest: Ipv4Addr::new(172, 16, 0, 0),
            prefix_len: 12,
            gateway: Ipv4Addr::UNSPECIFIED,
        };
        let b = route_msg(RTM_NEWROUTE, 0, 2, &l, &onlink).into_bytes();
        assert_eq!(b[22], RT_SCOPE_LINK);
        assert_eq!(u16::from_ne_bytes([b[30], b[31]]), RTA_DST);
        assert_eq!(&b[32..36], &[172, 16, 0, 0]);

        let far = Route {
            dest: Ipv4Addr::new(168, 63, 129, 16),
            prefix_len: 32,
            gateway: Ipv4Addr::new(192, 168, 9, 1),
        };
        let b = route_msg(RTM_NEWROUTE, 0, 2, &l, &far).into_bytes();
        assert_eq!(
            u32::from_ne_bytes([b[24], b[25], b[26], b[27]]),
            RTNH_F_ONLINK
        );
    }

    #[test]
    fn broadcast_address() {
        assert_eq!(broadcast(&lease()), Ipv4Addr::new(10, 0, 0, 255));
        let mut l = lease();
        l.prefix_len = 32;
        assert_eq!(broadcast(&l), l.address);
        l.prefix_len = 0;
        assert_eq!(broadcast(&l), Ipv4Addr::BROADCAST);
    }
}
