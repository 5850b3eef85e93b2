//! DHCPv4 messages (RFC 2131 §2, options RFC 2132, classless routes RFC 3442, Azure's
//! option 245). Parsing never panics: every read is bounds-checked, and unknown message types
//! and options are kept or skipped, not fatal.

use super::WireError;
use std::net::Ipv4Addr;

/// Byte offsets of the fixed BOOTP header (RFC 2131 figure 1).
mod field {
    use std::ops::Range;
    pub const OP: usize = 0;
    pub const HTYPE: usize = 1;
    pub const HLEN: usize = 2;
    pub const XID: Range<usize> = 4..8;
    pub const SECS: Range<usize> = 8..10;
    pub const FLAGS: Range<usize> = 10..12;
    pub const CIADDR: Range<usize> = 12..16;
    pub const YIADDR: Range<usize> = 16..20;
    pub const SIADDR: Range<usize> = 20..24;
    pub const GIADDR: Range<usize> = 24..28;
    pub const CHADDR: Range<usize> = 28..44;
    pub const MAGIC: Range<usize> = 236..240;
    pub const OPTIONS: usize = 240;
}

pub const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;

/// Option codes azprov reads or sends.
pub mod opt {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS: u8 = 6;
    pub const HOSTNAME: u8 = 12;
    pub const DOMAIN: u8 = 15;
    pub const MTU: u8 = 26;
    pub const BROADCAST: u8 = 28;
    pub const REQUESTED_IP: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETER_REQUEST: u8 = 55;
    pub const MAX_MESSAGE_SIZE: u8 = 57;
    pub const CLIENT_ID: u8 = 61;
    pub const CLASSLESS_ROUTES: u8 = 121;
    /// Azure: the WireServer address, 4 raw bytes.
    pub const AZURE_WIRESERVER: u8 = 245;
    pub const END: u8 = 255;
}

/// What azprov asks for, in option 55.
pub const PARAMETER_REQUEST_LIST: [u8; 10] = [
    opt::SUBNET_MASK,
    opt::ROUTER,
    opt::DNS,
    opt::DOMAIN,
    opt::MTU,
    opt::BROADCAST,
    opt::LEASE_TIME,
    opt::SERVER_ID,
    opt::CLASSLESS_ROUTES,
    opt::AZURE_WIRESERVER,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Discover,
    Offer,
    Request,
    Decline,
    Ack,
    Nak,
    Release,
    Inform,
    Unknown(u8),
}

impl From<u8> for MessageType {
    fn from(v: u8) -> Self {
        match v {
            1 => MessageType::Discover,
            2 => MessageType::Offer,
            3 => MessageType::Request,
            4 => MessageType::Decline,
            5 => MessageType::Ack,
            6 => MessageType::Nak,
            7 => MessageType::Release,
            8 => MessageType::Inform,
            other => MessageType::Unknown(other),
        }
    }
}

impl From<MessageType> for u8 {
    fn from(t: MessageType) -> u8 {
        match t {
            MessageType::Discover => 1,
            MessageType::Offer => 2,
            MessageType::Request => 3,
            MessageType::Decline => 4,
            MessageType::Ack => 5,
            MessageType::Nak => 6,
            MessageType::Release => 7,
            MessageType::Inform => 8,
            MessageType::Unknown(v) => v,
        }
    }
}

/// A classless static route (RFC 3442). A gateway of 0.0.0.0 means on-link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub dest: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Ipv4Addr,
}

/// A DHCP message with the options azprov understands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DhcpMessage {
    /// 1 = BOOTREQUEST, 2 = BOOTREPLY.
    pub op: u8,
    pub xid: u32,
    pub secs: u16,
    pub broadcast: bool,
    pub ciaddr: Option<Ipv4Addr>,
    pub yiaddr: Option<Ipv4Addr>,
    pub siaddr: Option<Ipv4Addr>,
    pub giaddr: Option<Ipv4Addr>,
    pub chaddr: [u8; 6],
    pub message_type: Option<MessageType>,
    pub subnet_mask: Option<Ipv4Addr>,
    pub routers: Vec<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub hostname: Option<String>,
    pub domain: Option<String>,
    pub mtu: Option<u16>,
    pub broadcast_addr: Option<Ipv4Addr>,
    pub requested_ip: Option<Ipv4Addr>,
    pub lease_secs: Option<u32>,
    pub server_id: Option<Ipv4Addr>,
    pub parameter_request: Vec<u8>,
    pub max_message_size: Option<u16>,
    pub client_id: Vec<u8>,
    pub classless_routes: Option<Vec<Route>>,
    pub wireserver: Option<Ipv4Addr>,
    /// Options that were malformed and that azprov can do without (the WireServer falls back
    /// to 168.63.129.16, the MTU to the link's, …): skipped, with why, for the log.
    pub skipped: Vec<(u8, &'static str)>,
}

/// Options a reply is unusable without: a malformed one makes the whole message malformed.
const REQUIRED: [u8; 2] = [opt::MESSAGE_TYPE, opt::SERVER_ID];

impl Default for MessageType {
    fn default() -> Self {
        MessageType::Unknown(0)
    }
}

fn addr_at(b: &[u8], r: std::ops::Range<usize>) -> Result<Option<Ipv4Addr>, WireError> {
    match b.get(r) {
        Some(&[p, q, s, t]) => {
            let a = Ipv4Addr::new(p, q, s, t);
            Ok((!a.is_unspecified()).then_some(a))
        }
        _ => Err(WireError::Truncated),
    }
}

fn one_addr(data: &[u8]) -> Result<Ipv4Addr, WireError> {
    match data {
        &[p, q, s, t] => Ok(Ipv4Addr::new(p, q, s, t)),
        _ => Err(WireError::Malformed("address option is not 4 bytes")),
    }
}

fn addr_list(data: &[u8]) -> Result<Vec<Ipv4Addr>, WireError> {
    if data.is_empty() || data.len() % 4 != 0 {
        return Err(WireError::Malformed(
            "address list length is not a multiple of 4",
        ));
    }
    Ok(data
        .chunks_exact(4)
        .filter_map(|c| one_addr(c).ok())
        .collect())
}

/// A name option (host name, domain): trailing NUL padding and blanks dropped; a value with
/// anything but printable ASCII left (a NUL inside, control bytes, non-ASCII) is no name at all.
fn text(data: &[u8]) -> Option<String> {
    let end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let s = std::str::from_utf8(data.get(..end)?).ok()?.trim();
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() || b == b' ')).then(|| s.to_string())
}

/// Parses RFC 3442 option 121: (prefix length, significant octets of the destination, gateway)
/// repeated. Destination bits beyond the prefix must be zero (§2, they are masked here).
pub fn parse_classless_routes(data: &[u8]) -> Result<Vec<Route>, WireError> {
    let mut routes = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        if len > 32 {
            return Err(WireError::Malformed(
                "classless route prefix longer than 32",
            ));
        }
        let octets = usize::from(len).div_ceil(8);
        let dest_bytes = tail
            .get(..octets)
            .ok_or(WireError::Malformed("classless route cut short"))?;
        let gw = tail
            .get(octets..octets + 4)
            .ok_or(WireError::Malformed("classless route cut short"))?;
        let mut dest = [0u8; 4];
        for (d, s) in dest.iter_mut().zip(dest_bytes) {
            *d = *s;
        }
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        routes.push(Route {
            dest: Ipv4Addr::from(u32::from_be_bytes(dest) & mask),
            prefix_len: len,
            gateway: one_addr(gw)?,
        });
        rest = tail.get(octets + 4..).unwrap_or(&[]);
    }
    Ok(routes)
}

pub fn emit_classless_routes(routes: &[Route]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in routes {
        out.push(r.prefix_len);
        let octets = usize::from(r.prefix_len).div_ceil(8);
        out.extend(r.dest.octets().iter().take(octets));
        out.extend_from_slice(&r.gateway.octets());
    }
    out
}

impl DhcpMessage {
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < field::OPTIONS {
            return Err(WireError::Truncated);
        }
        if b.get(field::MAGIC) != Some(&MAGIC_COOKIE[..]) {
            return Err(WireError::Malformed("no DHCP magic cookie"));
        }
        let get = |i: usize| b.get(i).copied().ok_or(WireError::Truncated);
        let be16 = |r: std::ops::Range<usize>| match b.get(r) {
            Some(&[x, y]) => Ok(u16::from_be_bytes([x, y])),
            _ => Err(WireError::Truncated),
        };
        let mut m = DhcpMessage {
            op: get(field::OP)?,
            xid: match b.get(field::XID) {
                Some(&[p, q, r, s]) => u32::from_be_bytes([p, q, r, s]),
                _ => return Err(WireError::Truncated),
            },
            secs: be16(field::SECS)?,
            broadcast: be16(field::FLAGS)? & 0x8000 != 0,
            ciaddr: addr_at(b, field::CIADDR)?,
            yiaddr: addr_at(b, field::YIADDR)?,
            siaddr: addr_at(b, field::SIADDR)?,
            giaddr: addr_at(b, field::GIADDR)?,
            ..DhcpMessage::default()
        };
        if get(field::HTYPE)? == 1 && get(field::HLEN)? == 6 {
            if let Some(mac) = b.get(field::CHADDR.start..field::CHADDR.start + 6) {
                m.chaddr.copy_from_slice(mac);
            }
        }
        let mut rest = b.get(field::OPTIONS..).unwrap_or(&[]);
        // RFC 3396: the values of an option that appears more than once are concatenated, in
        // order, before it is read
        let mut options: Vec<(u8, Vec<u8>)> = Vec::new();
        // A missing END option is tolerated, as many stacks do.
        while let Some((&code, tail)) = rest.split_first() {
            match code {
                opt::PAD => {
                    rest = tail;
                    continue;
                }
                opt::END => break,
                _ => {}
            }
            let (&len, tail) = tail
                .split_first()
                .ok_or(WireError::Malformed("option cut short"))?;
            let data = tail
                .get(..usize::from(len))
                .ok_or(WireError::Malformed("option cut short"))?;
            rest = tail.get(usize::from(len)..).unwrap_or(&[]);
            match options.iter_mut().find(|(c, _)| *c == code) {
                Some((_, value)) => value.extend_from_slice(data),
                None => options.push((code, data.to_vec())),
            }
        }
        for (code, data) in options {
            match m.set_option(code, &data) {
                Ok(()) => {}
                Err(WireError::Malformed(why)) if !REQUIRED.contains(&code) => {
                    m.skipped.push((code, why));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(m)
    }

    fn set_option(&mut self, code: u8, data: &[u8]) -> Result<(), WireError> {
        match code {
            opt::MESSAGE_TYPE => match data {
                &[t] => self.message_type = Some(MessageType::from(t)),
                _ => return Err(WireError::Malformed("message type is not 1 byte")),
            },
            opt::SUBNET_MASK => self.subnet_mask = Some(one_addr(data)?),
            opt::ROUTER => self.routers = addr_list(data)?,
            opt::DNS => self.dns = addr_list(data)?,
            opt::HOSTNAME => self.hostname = text(data),
            opt::DOMAIN => self.domain = text(data),
            opt::MTU => match data {
                &[a, b] => self.mtu = Some(u16::from_be_bytes([a, b])),
                _ => return Err(WireError::Malformed("MTU is not 2 bytes")),
            },
            opt::BROADCAST => self.broadcast_addr = Some(one_addr(data)?),
            opt::REQUESTED_IP => self.requested_ip = Some(one_addr(data)?),
            opt::LEASE_TIME => match data {
                &[a, b, c, d] => self.lease_secs = Some(u32::from_be_bytes([a, b, c, d])),
                _ => return Err(WireError::Malformed("lease time is not 4 bytes")),
            },
            opt::SERVER_ID => self.server_id = Some(one_addr(data)?),
            opt::PARAMETER_REQUEST => self.parameter_request = data.to_vec(),
            opt::MAX_MESSAGE_SIZE => match data {
                &[a, b] => self.max_message_size = Some(u16::from_be_bytes([a, b])),
                _ => return Err(WireError::Malformed("max message size is not 2 bytes")),
            },
            opt::CLIENT_ID => self.client_id = data.to_vec(),
            opt::CLASSLESS_ROUTES => self.classless_routes = Some(parse_classless_routes(data)?),
            opt::AZURE_WIRESERVER => self.wireserver = Some(one_addr(data)?),
            _ => {} // options azprov does not use are skipped
        }
        Ok(())
    }

    /// Emits the message (BOOTP header, magic cookie, options, END, padded to 300 bytes as
    /// some relays require).
    pub fn emit(&self) -> Vec<u8> {
        let mut b = vec![0u8; field::OPTIONS];
        let mut put = |r: std::ops::Range<usize>, v: &[u8]| {
            if let Some(s) = b.get_mut(r) {
                s.copy_from_slice(v);
            }
        };
        put(field::OP..field::OP + 1, &[self.op]);
        put(field::HTYPE..field::HLEN + 1, &[1, 6]);
        put(field::XID, &self.xid.to_be_bytes());
        put(field::SECS, &self.secs.to_be_bytes());
        put(
            field::FLAGS,
            &(if self.broadcast { 0x8000u16 } else { 0 }).to_be_bytes(),
        );
        let a = |v: Option<Ipv4Addr>| v.unwrap_or(Ipv4Addr::UNSPECIFIED).octets();
        put(field::CIADDR, &a(self.ciaddr));
        put(field::YIADDR, &a(self.yiaddr));
        put(field::SIADDR, &a(self.siaddr));
        put(field::GIADDR, &a(self.giaddr));
        put(field::CHADDR.start..field::CHADDR.start + 6, &self.chaddr);
        put(field::MAGIC, &MAGIC_COOKIE);

        let mut o = |code: u8, data: &[u8]| {
            // RFC 3396: a value longer than 255 bytes goes out as several options of the code
            for chunk in data.chunks(255) {
                b.push(code);
                b.push(u8::try_from(chunk.len()).unwrap_or(u8::MAX));
                b.extend_from_slice(chunk);
            }
        };
        if let Some(t) = self.message_type {
            o(opt::MESSAGE_TYPE, &[u8::from(t)]);
        }
        if !self.client_id.is_empty() {
            o(opt::CLIENT_ID, &self.client_id);
        }
        if let Some(ip) = self.requested_ip {
            o(opt::REQUESTED_IP, &ip.octets());
        }
        if let Some(ip) = self.server_id {
            o(opt::SERVER_ID, &ip.octets());
        }
        if let Some(s) = self.max_message_size {
            o(opt::MAX_MESSAGE_SIZE, &s.to_be_bytes());
        }
        if let Some(h) = &self.hostname {
            o(opt::HOSTNAME, h.as_bytes());
        }
        if !self.parameter_request.is_empty() {
            o(opt::PARAMETER_REQUEST, &self.parameter_request);
        }
        if let Some(m) = self.subnet_mask {
            o(opt::SUBNET_MASK, &m.octets());
        }
        if !self.routers.is_empty() {
            o(
                opt::ROUTER,
                &self
                    .routers
                    .iter()
                    .flat_map(|r| r.octets())
                    .collect::<Vec<_>>(),
            );
        }
        if !self.dns.is_empty() {
            o(
                opt::DNS,
                &self.dns.iter().flat_map(|r| r.octets()).collect::<Vec<_>>(),
            );
        }
        if let Some(d) = &self.domain {
            o(opt::DOMAIN, d.as_bytes());
        }
        if let Some(m) = self.mtu {
            o(opt::MTU, &m.to_be_bytes());
        }
        if let Some(l) = self.lease_secs {
            o(opt::LEASE_TIME, &l.to_be_bytes());
        }
        if let Some(r) = &self.classless_routes {
            o(opt::CLASSLESS_ROUTES, &emit_classless_routes(r));
        }
        if let Some(w) = self.wireserver {
            o(opt::AZURE_WIRESERVER, &w.octets());
        }
        b.push(opt::END);
        if b.len() < 300 {
            b.resize(300, 0);
        }
        b
    }
}

#[cfg(test)]
mod tests;
