//! IPv4 + UDP framing for DHCP over an AF_PACKET/SOCK_DGRAM socket (the kernel adds and strips
//! the Ethernet header). RFC 791 header without options on emit; options skipped on parse.

use super::WireError;
use std::net::Ipv4Addr;

pub const PROTO_UDP: u8 = 17;
const IP_HEADER: usize = 20;
const UDP_HEADER: usize = 8;

/// A UDP datagram carried in IPv4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpIpv4<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> Result<u16, WireError> {
    match b.get(at..at + 2) {
        Some(&[x, y]) => Ok(u16::from_be_bytes([x, y])),
        _ => Err(WireError::Truncated),
    }
}

fn addr(b: &[u8], at: usize) -> Result<Ipv4Addr, WireError> {
    match b.get(at..at + 4) {
        Some(&[p, q, r, s]) => Ok(Ipv4Addr::new(p, q, r, s)),
        _ => Err(WireError::Truncated),
    }
}

/// The one's-complement sum of RFC 1071, folded.
fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for c in chunks {
        let mut it = c.chunks_exact(2);
        for pair in it.by_ref() {
            if let &[a, b] = pair {
                sum += u32::from(u16::from_be_bytes([a, b]));
            }
        }
        if let &[last] = it.remainder() {
            sum += u32::from(u16::from_be_bytes([last, 0]));
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Writes a big-endian u16 at `at` (always in bounds: the headers were just built).
fn put(buf: &mut [u8], at: usize, v: u16) {
    if let Some(s) = buf.get_mut(at..at + 2) {
        s.copy_from_slice(&v.to_be_bytes());
    }
}

impl<'a> UdpIpv4<'a> {
    /// Parses an IPv4 packet holding UDP. Fragments and non-UDP packets are errors.
    pub fn parse(b: &'a [u8]) -> Result<Self, WireError> {
        let first = *b.first().ok_or(WireError::Truncated)?;
        if first >> 4 != 4 {
            return Err(WireError::Malformed("not IPv4"));
        }
        let ihl = usize::from(first & 0x0f) * 4;
        if ihl < IP_HEADER || b.len() < ihl {
            return Err(WireError::Truncated);
        }
        let total = usize::from(be16(b, 2)?);
        if total < ihl + UDP_HEADER || total > b.len() {
            return Err(WireError::Truncated);
        }
        let frag = be16(b, 6)?;
        if frag & 0x3fff != 0 {
            return Err(WireError::Malformed("fragment"));
        }
        if b.get(9) != Some(&PROTO_UDP) {
            return Err(WireError::Malformed("not UDP"));
        }
        let header = b.get(..ihl).ok_or(WireError::Truncated)?;
        if checksum(&[header]) != 0 {
            return Err(WireError::Malformed("bad IPv4 header checksum"));
        }
        let udp = b.get(ihl..total).ok_or(WireError::Truncated)?;
        let ulen = usize::from(be16(udp, 4)?);
        if ulen < UDP_HEADER || ulen > udp.len() {
            return Err(WireError::Truncated);
        }
        Ok(UdpIpv4 {
            src: addr(b, 12)?,
            dst: addr(b, 16)?,
            src_port: be16(udp, 0)?,
            dst_port: be16(udp, 2)?,
            payload: udp.get(UDP_HEADER..ulen).ok_or(WireError::Truncated)?,
        })
    }

    /// Emits the IPv4 header, UDP header (with checksum) and payload.
    pub fn emit(&self) -> Vec<u8> {
        let ulen = (UDP_HEADER + self.payload.len()) as u16;
        let total = IP_HEADER as u16 + ulen;
        let mut out = Vec::with_capacity(usize::from(total));
        out.extend_from_slice(&[0x45, 0x10]); // version 4, IHL 5; TOS low delay (as ISC dhclient)
        out.extend_from_slice(&total.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]); // id 0, no fragmentation
        out.extend_from_slice(&[64, PROTO_UDP, 0, 0]); // TTL, protocol, checksum placeholder
        out.extend_from_slice(&self.src.octets());
        out.extend_from_slice(&self.dst.octets());
        let ip_sum = checksum(&[&out]);
        put(&mut out, 10, ip_sum);

        let mut udp = Vec::with_capacity(usize::from(ulen));
        udp.extend_from_slice(&self.src_port.to_be_bytes());
        udp.extend_from_slice(&self.dst_port.to_be_bytes());
        udp.extend_from_slice(&ulen.to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(self.payload);
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&self.src.octets());
        pseudo.extend_from_slice(&self.dst.octets());
        pseudo.extend_from_slice(&[0, PROTO_UDP]);
        pseudo.extend_from_slice(&ulen.to_be_bytes());
        let sum = match checksum(&[&pseudo, &udp]) {
            0 => 0xffff, // RFC 768: a computed zero is sent as all ones
            s => s,
        };
        put(&mut udp, 6, sum);
        out.extend_from_slice(&udp);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_then_parse_round_trips_with_valid_checksums() {
        let p = UdpIpv4 {
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::BROADCAST,
            src_port: 68,
            dst_port: 67,
            payload: b"hello dhcp",
        };
        let bytes = p.emit();
        assert_eq!(bytes.len(), 20 + 8 + 10);
        assert_eq!(checksum(&[&bytes[..20]]), 0);
        assert_eq!(UdpIpv4::parse(&bytes).unwrap(), p);
    }

    #[test]
    fn garbage_is_rejected_without_panic() {
        let good = UdpIpv4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 5),
            src_port: 67,
            dst_port: 68,
            payload: &[1, 2, 3],
        }
        .emit();
        for n in 0..good.len() {
            assert!(UdpIpv4::parse(&good[..n]).is_err(), "prefix {n}");
        }
        let mut bad = good.clone();
        bad[9] = 6; // TCP
        assert!(UdpIpv4::parse(&bad).is_err());
        let mut bad = good.clone();
        bad[12] ^= 1; // header checksum no longer matches
        assert_eq!(
            UdpIpv4::parse(&bad),
            Err(WireError::Malformed("bad IPv4 header checksum"))
        );
        assert!(UdpIpv4::parse(&[0x60; 40]).is_err());
        assert!(UdpIpv4::parse(&[0x4f; 40]).is_err());
    }
}
