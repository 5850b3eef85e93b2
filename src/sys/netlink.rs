//! A NETLINK_ROUTE socket that sends one request at a time and waits for its ACK. Messages are
//! built by `net::rtnl` (pure code); this file only moves bytes.

use nix::errno::Errno;
use nix::sys::socket::{
    recv, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol,
    SockType,
};
use nix::sys::time::TimeVal;
use std::os::fd::{AsRawFd, OwnedFd};

const NLMSG_ERROR: u16 = 2;
const NLMSG_HEADER: usize = 16;

pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    match b.get(i..i + 4) {
        Some(&[a, b, c, d]) => u32::from_ne_bytes([a, b, c, d]),
        _ => 0,
    }
}

impl Netlink {
    pub fn open() -> Result<Self, Errno> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        // A kernel that never answers must not hang the boot; losing the timeout is harmless.
        let _ = setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(5, 0));
        Ok(Netlink { fd, seq: 1 })
    }

    /// Sends one request whose header (16 bytes) is filled in here except type and flags, and
    /// waits for the kernel's ACK. The error is the kernel's errno (e.g. EEXIST).
    pub fn request(&mut self, msg: &mut [u8]) -> Result<(), Errno> {
        self.round_trip(msg, false).map(drop)
    }

    /// Sends one query (a GET without NLM_F_ACK) and returns the first message answering it,
    /// header included; or the kernel's errno.
    pub fn query(&mut self, msg: &mut [u8]) -> Result<Vec<u8>, Errno> {
        self.round_trip(msg, true)
    }

    /// One request and its answer: the ACK (an empty Vec), or with `reply` the first other
    /// message with the request's sequence number.
    fn round_trip(&mut self, msg: &mut [u8], reply: bool) -> Result<Vec<u8>, Errno> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let len = msg.len() as u32;
        if let Some(h) = msg.get_mut(0..4) {
            h.copy_from_slice(&len.to_ne_bytes());
        }
        if let Some(h) = msg.get_mut(8..12) {
            h.copy_from_slice(&seq.to_ne_bytes());
        }
        send(self.fd.as_raw_fd(), msg, MsgFlags::empty())?;
        let mut buf = [0u8; 8192];
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut rest = buf.get(..n).unwrap_or(&[]);
            while rest.len() >= NLMSG_HEADER {
                let mlen = u32_at(rest, 0) as usize;
                let mtype = match rest.get(4..6) {
                    Some(&[a, b]) => u16::from_ne_bytes([a, b]),
                    _ => 0,
                };
                if mlen < NLMSG_HEADER || mlen > rest.len() {
                    break;
                }
                if u32_at(rest, 8) == seq {
                    if mtype == NLMSG_ERROR {
                        let errno = u32_at(rest, NLMSG_HEADER) as i32;
                        return if errno == 0 {
                            Ok(Vec::new())
                        } else {
                            Err(Errno::from_raw(-errno))
                        };
                    }
                    if reply {
                        return Ok(rest.get(..mlen).unwrap_or(&[]).to_vec());
                    }
                }
                rest = rest.get(((mlen + 3) & !3)..).unwrap_or(&[]);
            }
        }
    }
}
