//! An AF_PACKET/SOCK_DGRAM socket bound to one interface for IPv4 frames: DHCP runs before the
//! interface has an address, so ordinary UDP sockets cannot be used. The kernel adds and strips
//! the Ethernet header.
#![allow(unsafe_code)]

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, recv, sendto, socket, AddressFamily, LinkAddr, MsgFlags, SockFlag, SockType, SockaddrLike,
};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

const ETH_P_IP: u16 = 0x0800;

pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

/// A link-layer address for `ifindex`; nix has no safe constructor for `LinkAddr`.
fn link_addr(ifindex: i32, dst: [u8; 6]) -> Result<LinkAddr, Errno> {
    let mut sa = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: ETH_P_IP.to_be(),
        sll_ifindex: ifindex,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: [0; 8],
    };
    for (d, s) in sa.sll_addr.iter_mut().zip(dst) {
        *d = s;
    }
    let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `sa` is a fully initialised sockaddr_ll of `len` bytes, alive for the call.
    unsafe { LinkAddr::from_raw((&sa as *const libc::sockaddr_ll).cast(), Some(len)) }
        .ok_or(Errno::EINVAL)
}

impl PacketSocket {
    /// Opens a socket that receives every IPv4 packet arriving on `ifindex`.
    pub fn open(ifindex: i32) -> Result<Self, Errno> {
        // Protocol 0 here and ETH_P_IP only in bind()'s address: a protocol given to
        // socket() registers the socket's packet hook at once, and bind() re-registering it
        // waits for an RCU grace period (docs/performance.md).
        let fd = socket(
            AddressFamily::Packet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        bind(fd.as_raw_fd(), &link_addr(ifindex, [0; 6])?)?;
        Ok(PacketSocket { fd, ifindex })
    }

    /// Sends an IPv4 packet to the Ethernet broadcast address.
    pub fn send_broadcast(&self, packet: &[u8]) -> Result<(), Errno> {
        let to = link_addr(self.ifindex, [0xff; 6])?;
        sendto(self.fd.as_raw_fd(), packet, &to, MsgFlags::empty()).map(drop)
    }

    /// Waits up to `timeout` for one packet; `Ok(None)` when none arrived in time.
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> Result<Option<usize>, Errno> {
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) | Err(Errno::EINTR) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(e),
        }
        match recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()) {
            Ok(n) => Ok(Some(n)),
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
