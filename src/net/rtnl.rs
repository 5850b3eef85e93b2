//! rtnetlink messages as bytes (pure code, no I/O): links, addresses and routes for one lease,
//! and the error type for a request the kernel refused. `sys::netlink` moves the bytes.

use super::dhcp::Lease;
use super::wire::dhcpv4::Route;
use nix::errno::Errno;
use std::net::Ipv4Addr;

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_DELROUTE: u16 = 25;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const AF_INET: u8 = 2;
pub const IFLA_MTU: u16 = 4;
pub const IFLA_QDISC: u16 = 6;
pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
pub const IFA_BROADCAST: u16 = 4;
pub const RTA_DST: u16 = 1;
pub const RTA_OIF: u16 = 4;
pub const RTA_GATEWAY: u16 = 5;
pub const RTA_PREFSRC: u16 = 7;
pub const RT_TABLE_MAIN: u8 = 254;
pub const RTPROT_DHCP: u8 = 16;
pub const RT_SCOPE_UNIVERSE: u8 = 0;
pub const RT_SCOPE_LINK: u8 = 253;
pub const RTN_UNICAST: u8 = 1;
pub const RTNH_F_ONLINK: u32 = 4;
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

/// An ifinfomsg: family AF_UNSPEC, the interface, the flags and which of them change.
fn ifinfomsg(ifindex: u32, flags: u32, change: u32) -> Vec<u8> {
    let mut fixed = vec![0u8; 4]; // family AF_UNSPEC, pad, type
    fixed.extend_from_slice(&ifindex.to_ne_bytes());
    fixed.extend_from_slice(&flags.to_ne_bytes());
    fixed.extend_from_slice(&change.to_ne_bytes());
    fixed
}

/// RTM_GETLINK for one interface (the reply is its RTM_NEWLINK).
pub fn getlink_msg(ifindex: u32) -> Msg {
    Msg::new(RTM_GETLINK, NLM_F_REQUEST).raw(&ifinfomsg(ifindex, 0, 0))
}

/// The root qdisc's name (`IFLA_QDISC`) in an RTM_NEWLINK message (header included): "noop"
/// until the kernel has activated the device's queues, then e.g. "pfifo_fast", "fq_codel" or
/// "noqueue". None when the message has no such attribute.
pub fn link_qdisc(msg: &[u8]) -> Option<String> {
    const ATTRS: usize = 16 + 16; // nlmsghdr, ifinfomsg
    let mut rest = msg.get(ATTRS..)?;
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([*rest.first()?, *rest.get(1)?]));
        let kind = u16::from_ne_bytes([*rest.get(2)?, *rest.get(3)?]);
        if len < 4 || len > rest.len() {
            return None;
        }
        if kind == IFLA_QDISC {
            let value = rest.get(4..len)?;
            let value = value.split(|&b| b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(value).into_owned());
        }
        rest = rest.get(((len + 3) & !3)..).unwrap_or_default();
    }
    None
}

/// RTM_NEWLINK changing only the flags in `change` (e.g. IFF_UP) and optionally the MTU.
pub fn link_msg(ifindex: u32, flags: u32, change: u32, mtu: Option<u32>) -> Msg {
    let m =
        Msg::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK).raw(&ifinfomsg(ifindex, flags, change));
    match mtu {
        Some(v) => m.attr(IFLA_MTU, &v.to_ne_bytes()),
        None => m,
    }
}

pub fn addr_msg(kind: u16, flags: u16, ifindex: u32, lease: &Lease) -> Msg {
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

pub fn route_msg(kind: u16, flags: u16, ifindex: u32, lease: &Lease, r: &Route) -> Msg {
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

/// What a netlink request was for; the error names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Open,
    SetLink { name: String, up: bool },
    SetMtu(u32),
    RestoreMtu(u32),
    AddAddress(Ipv4Addr, u8),
    DeleteAddress(Ipv4Addr),
    AddRoute(Route),
    DeleteRoute(Route),
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Open => write!(f, "open netlink"),
            Op::SetLink { name, up } => write!(f, "set {name} {}", if *up { "up" } else { "down" }),
            Op::SetMtu(m) => write!(f, "set MTU {m}"),
            Op::RestoreMtu(m) => write!(f, "restore MTU {m}"),
            Op::AddAddress(a, p) => write!(f, "add address {a}/{p}"),
            Op::DeleteAddress(a) => write!(f, "delete address {a}"),
            Op::AddRoute(r) => write!(f, "add route {}/{} via {}", r.dest, r.prefix_len, r.gateway),
            Op::DeleteRoute(r) => write!(f, "delete route {}/{}", r.dest, r.prefix_len),
        }
    }
}

/// A netlink request the kernel refused: what it was for and the kernel's errno.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetlinkError {
    pub op: Op,
    pub errno: Errno,
}

impl std::fmt::Display for NetlinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.op, self.errno)
    }
}

impl std::error::Error for NetlinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.errno)
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

    #[test]
    fn the_qdisc_is_read_from_a_link_reply() {
        // RTM_NEWLINK: header, ifinfomsg, IFLA_MTU, IFLA_QDISC "noop\0"
        let reply = |qdisc: &[u8]| {
            let mut m = Msg::new(RTM_NEWLINK, 0)
                .raw(&[0u8; 16])
                .attr(IFLA_MTU, &1500u32.to_ne_bytes())
                .attr(IFLA_QDISC, qdisc)
                .into_bytes();
            let len = m.len() as u32;
            m[..4].copy_from_slice(&len.to_ne_bytes());
            m
        };
        assert_eq!(link_qdisc(&reply(b"noop\0")).as_deref(), Some("noop"));
        assert_eq!(
            link_qdisc(&reply(b"fq_codel\0")).as_deref(),
            Some("fq_codel")
        );
        let none = Msg::new(RTM_NEWLINK, 0)
            .raw(&[0u8; 16])
            .attr(IFLA_MTU, &[0; 4])
            .into_bytes();
        assert_eq!(link_qdisc(&none), None);
        // truncated or lying lengths end the walk
        assert_eq!(link_qdisc(&reply(b"noop\0")[..34]), None);
        let mut bad = reply(b"noop\0");
        bad[32] = 200;
        assert_eq!(link_qdisc(&bad), None);
        let b = getlink_msg(7).into_bytes();
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), RTM_GETLINK);
        assert_eq!(u32::from_ne_bytes([b[20], b[21], b[22], b[23]]), 7);
    }
}
