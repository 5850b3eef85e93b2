//! The TCP connection under every request: what ureq's own TCP connector does, except that an
//! IMDS socket carries the firewall mark [`IMDS_FWMARK`] before it connects.
//!
//! systemd v261's IMDS import, in its "locked" mode, routes 169.254.169.254 to a prohibit route
//! for every socket whose mark is not 0x7FFF0815. With the mark, azprov and systemd's import
//! live in one initrd. Setting a mark needs CAP_NET_ADMIN: without it (`azprov inspect` as a
//! user) the socket connects unmarked, as it would have before.

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, LazyBuffers, NextTimeout, Transport,
};

/// The mark systemd's locked IMDS mode lets through to 169.254.169.254.
pub const IMDS_FWMARK: u32 = 0x7FFF_0815;

/// Opens plain TCP connections, marked with `mark` when there is one.
#[derive(Debug, Clone, Copy, Default)]
pub struct MarkedConnector {
    pub mark: Option<u32>,
}

impl Connector<()> for MarkedConnector {
    type Out = Tcp;

    fn connect(
        &self,
        details: &ConnectionDetails,
        _chained: Option<()>,
    ) -> Result<Option<Tcp>, ureq::Error> {
        let started = Instant::now();
        let budget = details.timeout.not_zero().map(|t| *t);
        let mut last = None;
        for addr in details.addrs.iter() {
            let left = match budget {
                Some(b) => match b.checked_sub(started.elapsed()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Err(ureq::Error::Timeout(details.timeout.reason)),
                },
                None => None,
            };
            match connect(*addr, self.mark, left) {
                Ok(stream) => {
                    if details.config.no_delay() {
                        stream.set_nodelay(true)?;
                    }
                    let buffers = LazyBuffers::new(
                        details.config.input_buffer_size(),
                        details.config.output_buffer_size(),
                    );
                    return Ok(Some(Tcp { stream, buffers }));
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    last = Some(ureq::Error::Timeout(ureq::Timeout::Connect));
                }
                Err(e) => last = Some(e.into()),
            }
        }
        Err(last.unwrap_or(ureq::Error::ConnectionFailed))
    }
}

/// A socket for `addr` with `mark` set before the SYN leaves, connected within `timeout`.
pub fn connect(
    addr: SocketAddr,
    mark: Option<u32>,
    timeout: Option<Duration>,
) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
    let fd = socket::socket(family, SockType::Stream, flags, None)?;
    if let Some(mark) = mark {
        match socket::setsockopt(&fd, sockopt::Mark, &mark) {
            Ok(()) => {}
            Err(Errno::EPERM) => log::debug!("{addr}: no fwmark (needs CAP_NET_ADMIN)"),
            Err(e) => return Err(e.into()),
        }
    }
    match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) => {}
        Err(Errno::EINPROGRESS) => wait_connected(&fd, timeout)?,
        Err(e) => return Err(e.into()),
    }
    let stream = TcpStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Waits for a non-blocking connect to finish, and says how it ended.
fn wait_connected(fd: &OwnedFd, timeout: Option<Duration>) -> io::Result<()> {
    let until = timeout.map(|t| Instant::now() + t);
    loop {
        let wait = match until {
            Some(u) => {
                let left = u.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                // rounded up: a poll of 0 ms would spin
                PollTimeout::try_from(left.as_millis().saturating_add(1))
                    .unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, wait) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => break,
            Err(e) => return Err(e.into()),
        }
    }
    match socket::getsockopt(fd, sockopt::SocketError)? {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// One connection: the stream and ureq's buffers for it.
#[derive(Debug)]
pub struct Tcp {
    stream: TcpStream,
    buffers: LazyBuffers,
}

/// ureq's timeout for an I/O step: how long the socket may block, or the timeout error now.
fn budget(timeout: NextTimeout) -> Result<Option<Duration>, ureq::Error> {
    if timeout.after.is_zero() {
        return Err(ureq::Error::Timeout(timeout.reason));
    }
    Ok(timeout.not_zero().map(|t| *t))
}

/// A blocked socket call that ran out of time is ureq's timeout; anything else its I/O error.
fn io_error(e: io::Error, timeout: NextTimeout) -> ureq::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ureq::Error::Timeout(timeout.reason),
        _ => e.into(),
    }
}

impl Transport for Tcp {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let timeout = timeout.for_write();
        self.stream.set_write_timeout(budget(timeout)?)?;
        let output = self.buffers.output();
        let output = output.get(..amount).unwrap_or(output);
        self.stream
            .write_all(output)
            .map_err(|e| io_error(e, timeout))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let timeout = timeout.for_read();
        let limit = budget(timeout)?;
        let started = Instant::now();
        let amount = loop {
            // SO_RCVTIMEO is not restarted after a signal: the rest of the budget, again
            let left = match limit {
                Some(l) => match l.checked_sub(started.elapsed()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(ureq::Error::Timeout(timeout.reason)),
                },
                None => None,
            };
            self.stream.set_read_timeout(left)?;
            match self.stream.read(self.buffers.input_append_buf()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(e, timeout)),
                Ok(n) => break n,
            }
        };
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    /// Open when a read would block: nothing unasked-for waits and the peer has not closed.
    fn is_open(&mut self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let idle = matches!(
            self.stream.read(&mut byte),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        );
        idle && self.stream.set_nonblocking(false).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn mark_of(stream: &TcpStream) -> u32 {
        socket::getsockopt(stream, sockopt::Mark).unwrap()
    }

    fn blocking_off(stream: &TcpStream) -> bool {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let flags = fcntl(stream, FcntlArg::F_GETFL).unwrap();
        OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK)
    }

    fn privileged() -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid() == 0
    }

    #[test]
    fn an_imds_socket_carries_the_mark_before_it_connects() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let marked = connect(addr, Some(IMDS_FWMARK), Some(Duration::from_secs(3))).unwrap();
        let plain = connect(addr, None, Some(Duration::from_secs(3))).unwrap();
        if privileged() {
            assert_eq!(mark_of(&marked), 0x7FFF_0815);
        } else {
            // unprivileged: SO_MARK is refused and the socket connects unmarked
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI runs as root"
            );
            assert_eq!(mark_of(&marked), 0);
        }
        assert_eq!(mark_of(&plain), 0);
        // both connected, blocking again
        for s in [&marked, &plain] {
            assert_eq!(s.peer_addr().unwrap(), addr);
            assert!(!blocking_off(s));
        }
    }

    #[test]
    fn a_refused_connect_is_the_os_error() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // the listener is gone: nothing listens on the port
        let e = connect(addr, None, Some(Duration::from_secs(3))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    }
}
