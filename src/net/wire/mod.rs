//! Packet formats, parsed and emitted without I/O (smoltcp style): DHCPv4 messages and the
//! IPv4/UDP framing around them.

pub mod dhcpv4;
pub mod ipv4;

/// Why bytes were not a packet. Never a panic: every access is checked against the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    Truncated,
    Malformed(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated packet"),
            WireError::Malformed(m) => write!(f, "malformed packet: {m}"),
        }
    }
}
