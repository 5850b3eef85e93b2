//! The DHCP client: the thin I/O loop around the DHCP state machine: a raw socket on the chosen NIC, the real
//! clock, and then applying the lease. Acquiring and applying are separate steps (u-root's
//! dhclient split), so the lease can be inspected before anything is configured.

use super::apply::{self, Applied};
use super::dhcp::{Action, Lease, Machine, Params};
use super::link::{self, LinkError, LinkUp, Nic};
use super::rtnl::NetlinkError;
use super::wire::dhcpv4::{DhcpMessage, CLIENT_PORT, SERVER_PORT};
use super::wire::ipv4::UdpIpv4;
use super::wire::WireError;
use crate::deadline::Deadline;
use crate::sys::packet::PacketSocket;
use crate::sys::Errno;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub enum DhcpError {
    Link(LinkError),
    Socket { iface: String, errno: Errno },
    NoLease { iface: String, waited: Duration },
    Apply(NetlinkError),
}

impl DhcpError {
    /// Whether the interface itself is missing (no NIC, or `--iface` names none).
    pub fn no_interface(&self) -> bool {
        matches!(
            self,
            DhcpError::Link(LinkError::NoInterface | LinkError::Unknown(_))
        )
    }
}

impl std::fmt::Display for DhcpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DhcpError::Link(e) => write!(f, "{e}"),
            DhcpError::Socket { iface, errno } => write!(f, "raw socket on {iface}: {errno}"),
            DhcpError::NoLease { iface, waited } => write!(
                f,
                "failure to obtain DHCP lease on {iface} after {}s",
                (waited.as_millis() + 500) / 1000
            ),
            DhcpError::Apply(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DhcpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DhcpError::Link(e) => Some(e),
            DhcpError::Apply(e) => Some(e),
            DhcpError::Socket { errno, .. } => Some(errno),
            DhcpError::NoLease { .. } => None,
        }
    }
}

/// No lease on `nic` since `started` (no carrier, or no answer in time).
fn no_lease(nic: &Nic, started: Instant) -> DhcpError {
    DhcpError::NoLease {
        iface: nic.name.clone(),
        waited: started.elapsed(),
    }
}

/// A NIC with its link up, carrier seen and the raw socket open: ready for the exchange.
/// What comes before the first packet, so it can run while the OVF (whose HostName the
/// exchange sends) is still being read.
pub struct Prepared {
    nic: Nic,
    up: LinkUp,
    sock: PacketSocket,
    started: Instant,
}

/// Picks the NIC, brings its link up (restored when the guard inside is dropped), waits for
/// carrier and opens the socket. Sends nothing.
pub fn prepare(
    class_net: &Path,
    iface: Option<&str>,
    deadline: Deadline,
) -> Result<Prepared, DhcpError> {
    let started = Instant::now();
    let nic = link::wait_choose(class_net, iface, deadline).map_err(DhcpError::Link)?;
    let up = link::up(&nic).map_err(DhcpError::Link)?;
    if !link::wait_carrier(class_net, &nic.name, deadline) {
        log::warn!("no carrier on {} within the deadline", nic.name);
        return Err(no_lease(&nic, started));
    }
    log::debug!(
        "dhcp: carrier on {} after {} ms",
        nic.name,
        started.elapsed().as_millis()
    );
    if !link::wait_queues(nic.ifindex, deadline) {
        log::debug!("dhcp: {}'s queues still inactive; sending anyway", nic.name);
    }
    let sock = PacketSocket::open(nic.ifindex as i32).map_err(|errno| DhcpError::Socket {
        iface: nic.name.clone(),
        errno,
    })?;
    Ok(Prepared {
        nic,
        up,
        sock,
        started,
    })
}

impl Prepared {
    /// Runs DHCP, sending `hostname` as option 12, until bound or the deadline.
    pub fn exchange(
        self,
        hostname: Option<&str>,
        deadline: Deadline,
    ) -> Result<(Nic, LinkUp, Lease), DhcpError> {
        let Prepared {
            nic,
            up,
            sock,
            started,
        } = self;
        let mut seed = [0u8; 8];
        crate::sys::random_bytes(&mut seed);
        let t0 = Instant::now();
        let params = Params {
            mac: nic.mac,
            hostname: hostname.map(str::to_string),
            deadline: deadline.remaining(),
        };
        let mut client = Machine::new(params, u64::from_le_bytes(seed), Duration::ZERO);
        let mut buf = vec![0u8; 2048];
        let mut said = PacketLines::default();
        loop {
            let now = t0.elapsed();
            match client.poll(now) {
                Action::Send(m) => {
                    let kind = m.message_type;
                    let payload = m.emit();
                    let packet = UdpIpv4 {
                        src: Ipv4Addr::UNSPECIFIED,
                        dst: Ipv4Addr::BROADCAST,
                        src_port: CLIENT_PORT,
                        dst_port: SERVER_PORT,
                        payload: &payload,
                    }
                    .emit();
                    log::debug!("dhcp: sending {kind:?} xid {:#010x} on {}", m.xid, nic.name);
                    if let Err(e) = sock.send_broadcast(&packet) {
                        // e.g. ENETDOWN while the link settles: the retransmit timer retries
                        log::debug!("dhcp: send on {}: {e}", nic.name);
                    }
                }
                Action::Wait(until) => {
                    let wait = until.saturating_sub(now);
                    match sock.recv(&mut buf, wait) {
                        Ok(Some(n)) => {
                            let packet = buf.get(..n).unwrap_or_default();
                            said.take(&mut client, t0.elapsed(), packet, &nic.name);
                        }
                        Ok(None) => {}
                        Err(errno) => {
                            return Err(DhcpError::Socket {
                                iface: nic.name.clone(),
                                errno,
                            })
                        }
                    }
                }
                Action::Bound(lease) => {
                    said.summary();
                    if client.naks > 0 {
                        log::info!("dhcp: bound after {} NAK(s)", client.naks);
                    }
                    // closing an AF_PACKET socket waits for an RCU grace period: off
                    // the path to Ready
                    std::thread::spawn(move || drop(sock));
                    return Ok((nic, up, lease));
                }
                Action::TimedOut => {
                    said.summary();
                    return Err(no_lease(&nic, started));
                }
            }
        }
    }

    /// Runs the exchange and configures the lease: the rest of "bring the network up".
    pub fn bring_up(
        self,
        hostname: Option<&str>,
        deadline: Deadline,
    ) -> Result<(Nic, Applied), DhcpError> {
        let (nic, up, lease) = self.exchange(hostname, deadline)?;
        let applied = apply::apply(up, &lease).map_err(DhcpError::Apply)?;
        Ok((nic, applied))
    }
}

/// What a packet on the DHCP socket was.
enum Decoded {
    /// Not UDP from port 67 to port 68 (other traffic the socket sees).
    NotDhcp,
    /// Meant as a DHCP reply, but it does not parse.
    Malformed(WireError),
    Reply(Box<DhcpMessage>),
}

/// A DHCP reply inside an IPv4/UDP packet from port 67 to port 68.
fn decode(packet: &[u8]) -> Decoded {
    let Ok(udp) = UdpIpv4::parse(packet) else {
        return Decoded::NotDhcp;
    };
    if udp.dst_port != CLIENT_PORT || udp.src_port != SERVER_PORT {
        return Decoded::NotDhcp;
    }
    match DhcpMessage::parse(udp.payload) {
        Ok(m) => Decoded::Reply(Box::new(m)),
        Err(e) => Decoded::Malformed(e),
    }
}

/// Acquires a lease and configures it: the whole "bring the network up" step.
pub fn bring_up(
    class_net: &Path,
    iface: Option<&str>,
    hostname: Option<&str>,
    deadline: Deadline,
) -> Result<(Nic, Applied), DhcpError> {
    prepare(class_net, iface, deadline)?.bring_up(hostname, deadline)
}

/// The kinds of line a received packet can cause.
#[derive(Debug, Clone, Copy)]
enum Said {
    Malformed = 0,
    Skipped = 1,
    Dropped = 2,
}

/// Lines caused by packets, which anything on the link can send at line rate: the first
/// [`PacketLines::EACH`] of each kind, then a count, said once when the exchange ends.
#[derive(Debug, Default)]
struct PacketLines {
    said: [u64; 3],
}

impl PacketLines {
    const EACH: u64 = 3;

    /// Whether this line is said (counted either way).
    fn allow(&mut self, kind: Said) -> bool {
        let n = self.said.get_mut(kind as usize);
        n.is_some_and(|n| {
            *n += 1;
            *n <= Self::EACH
        })
    }

    /// How many were not said, by kind; None when every one was.
    fn unsaid(&self) -> Option<String> {
        let names = ["malformed replies", "skipped options", "replies dropped"];
        let parts: Vec<String> = self
            .said
            .iter()
            .zip(names)
            .filter(|(n, _)| **n > Self::EACH)
            .map(|(n, name)| format!("{} {name}", n - Self::EACH))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// A received packet: handed to `client` when it is a DHCP reply, the lines it causes
    /// said within the limits.
    fn take(&mut self, client: &mut Machine, now: Duration, packet: &[u8], iface: &str) {
        match decode(packet) {
            Decoded::NotDhcp => {}
            Decoded::Malformed(e) => {
                if self.allow(Said::Malformed) {
                    log::warn!("dhcp: a reply on {iface} dropped: {e}");
                }
            }
            Decoded::Reply(m) => {
                for (code, why) in &m.skipped {
                    if self.allow(Said::Skipped) {
                        log::warn!("dhcp: option {code} from {:?} skipped: {why}", m.server_id);
                    }
                }
                match client.handle(now, &m) {
                    Ok(()) => log::debug!("dhcp: got {:?} from {:?}", m.message_type, m.server_id),
                    Err(why) => {
                        if self.allow(Said::Dropped) {
                            log::info!(
                                "dhcp: {:?} from {:?} (xid {:#010x}) dropped: {why}",
                                m.message_type,
                                m.server_id,
                                m.xid
                            );
                        }
                    }
                }
            }
        }
    }

    fn summary(&self) {
        if let Some(unsaid) = self.unsaid() {
            log::warn!(
                "dhcp: {unsaid} more, not logged one by one (the first {} of each were)",
                Self::EACH
            );
        }
    }
}

#[cfg(test)]
mod packet_lines_tests {
    use super::*;

    #[test]
    fn a_flood_is_said_three_times_and_then_counted() {
        let mut p = PacketLines::default();
        let said = (0..100_000).filter(|_| p.allow(Said::Malformed)).count();
        assert_eq!(said, 3);
        assert!(p.allow(Said::Dropped));
        assert_eq!(p.unsaid().as_deref(), Some("99997 malformed replies"));
        let quiet = PacketLines::default();
        assert_eq!(quiet.unsaid(), None);
    }
}
