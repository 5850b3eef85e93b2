//! An AF_PACKET/SOCK_DGRAM socket bound to one interface for IPv4 frames: DHCP runs before the
//! interface has an address, so ordinary UDP sockets cannot be used. The kernel adds and strips
//! the Ethernet header.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const ETH_P_IP: u16 = 0x0800;

pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

fn sockaddr(ifindex: i32, dst: [u8; 6]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = ETH_P_IP.to_be();
    sa.sll_ifindex = ifindex;
    sa.sll_halen = 6;
    for (d, s) in sa.sll_addr.iter_mut().zip(dst) {
        *d = s;
    }
    sa
}

impl PacketSocket {
    /// Opens a socket that receives every IPv4 packet arriving on `ifindex`.
    pub fn open(ifindex: i32) -> io::Result<Self> {
        // SAFETY: plain socket(2) call; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                i32::from(ETH_P_IP.to_be()),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sa = sockaddr(ifindex, [0; 6]);
        // SAFETY: `sa` is a valid sockaddr_ll and the length matches it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PacketSocket { fd, ifindex })
    }

    /// Sends an IPv4 packet to the Ethernet broadcast address.
    pub fn send_broadcast(&self, packet: &[u8]) -> io::Result<()> {
        let sa = sockaddr(self.ifindex, [0xff; 6]);
        // SAFETY: the buffer and address are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` for one packet; `Ok(None)` when none arrived in time.
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(e)
            };
        }
        if rc == 0 {
            return Ok(None);
        }
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }
}
