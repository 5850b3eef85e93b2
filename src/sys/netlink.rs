//! A NETLINK_ROUTE socket that sends one request at a time and waits for its ACK. Messages are
//! built by `net::apply` (pure code); this file only moves bytes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_ERROR: u16 = 2;
const NLMSG_HEADER: usize = 16;

pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2) call; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid timeval for SO_RCVTIMEO; a failure only loses the timeout.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        Ok(Netlink { fd, seq: 1 })
    }

    /// Sends one request whose header (16 bytes) is filled in here except type and flags, and
    /// waits for the kernel's ACK. The error is the kernel's errno (e.g. EEXIST).
    pub fn request(&mut self, msg: &mut [u8]) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let len = msg.len() as u32;
        if let Some(h) = msg.get_mut(0..4) {
            h.copy_from_slice(&len.to_ne_bytes());
        }
        if let Some(h) = msg.get_mut(8..12) {
            h.copy_from_slice(&seq.to_ne_bytes());
        }
        // SAFETY: the buffer is valid for its length; the kernel is the destination (default).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = buf.get(..n as usize).unwrap_or(&[]);
            while rest.len() >= NLMSG_HEADER {
                let u32_at = |b: &[u8], i: usize| match b.get(i..i + 4) {
                    Some(&[a, b, c, d]) => u32::from_ne_bytes([a, b, c, d]),
                    _ => 0,
                };
                let mlen = u32_at(rest, 0) as usize;
                let mtype = match rest.get(4..6) {
                    Some(&[a, b]) => u16::from_ne_bytes([a, b]),
                    _ => 0,
                };
                let mseq = u32_at(rest, 8);
                if mlen < NLMSG_HEADER || mlen > rest.len() {
                    break;
                }
                if mtype == NLMSG_ERROR && mseq == seq {
                    let errno = u32_at(rest, NLMSG_HEADER) as i32;
                    return if errno == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-errno))
                    };
                }
                rest = rest.get(((mlen + 3) & !3)..).unwrap_or(&[]);
            }
        }
    }
}
