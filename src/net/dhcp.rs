//! The DHCPv4 client state machine (RFC 2131 §4.4), with no I/O: it is fed received messages
//! and the time, and answers what to send and when to wake (smoltcp's `socket/dhcpv4.rs`
//! shape). Time is a `Duration` since an arbitrary start, so tests drive a virtual clock.

use super::wire::dhcpv4::{DhcpMessage, MessageType, Route, PARAMETER_REQUEST_LIST};
use std::net::Ipv4Addr;
use std::time::Duration;

/// The first DISCOVER is sent again after a random 0.5–1 s: a link whose queue is not ready
/// right after coming up can drop it (about 1 % of boots), and then waiting RFC 2131's 4 s is
/// most of the time to Ready. From the second retransmission on, RFC 2131 §4.1: 4 s, doubling
/// up to 64 s, each ±1 s.
const QUICK_RETRY_MS: (u64, u64) = (500, 1000);
const FIRST_RETRANSMIT: Duration = Duration::from_secs(4);
const MAX_RETRANSMIT: Duration = Duration::from_secs(64);
/// REQUESTs sent for one offer before going back to INIT (§4.4.1: "reverts to INIT state").
const MAX_REQUESTS: u32 = 4;

#[derive(Debug, Clone)]
pub struct Params {
    pub mac: [u8; 6],
    /// Sent as option 12: Azure DNS registers the name the client sends.
    pub hostname: Option<String>,
    /// Give up at this time.
    pub deadline: Duration,
}

/// A lease as applied: the address and what the routes and resolvers should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    /// Option 3's first router, as the server sent it (ignored for routing when option 121 is
    /// present, RFC 3442 §2).
    pub router: Option<Ipv4Addr>,
    /// The routes to install: option 121's, else a default route via the router.
    pub routes: Vec<Route>,
    pub dns: Vec<Ipv4Addr>,
    pub domain: Option<String>,
    pub mtu: Option<u16>,
    pub server_id: Ipv4Addr,
    /// Option 245: the WireServer address.
    pub wireserver: Option<Ipv4Addr>,
    /// 0xffffffff is infinite, as Azure hands out.
    pub lease_secs: u32,
    pub broadcast: Option<Ipv4Addr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Broadcast this message now.
    Send(DhcpMessage),
    /// Nothing to do before this time (or until a message arrives).
    Wait(Duration),
    Bound(Lease),
    TimedOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offer {
    address: Ipv4Addr,
    server: Ipv4Addr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Selecting {
        next: Duration,
        sent: u32,
    },
    Requesting {
        offer: Offer,
        next: Duration,
        sent: u32,
    },
    Bound(Lease),
}

#[derive(Debug)]
pub struct Machine {
    cfg: Params,
    rng: u64,
    xid: u32,
    start: Duration,
    state: State,
    /// NAKs received, for the log.
    pub naks: u32,
}

impl Machine {
    /// `seed` feeds the xid and the jitter (from getrandom in production, fixed in tests).
    pub fn new(cfg: Params, seed: u64, now: Duration) -> Self {
        let mut c = Machine {
            cfg,
            rng: seed | 1,
            xid: 0,
            start: now,
            state: State::Selecting { next: now, sent: 0 },
            naks: 0,
        };
        c.xid = c.next_random() as u32;
        c
    }

    pub fn xid(&self) -> u32 {
        self.xid
    }

    /// xorshift64*: enough for an xid and ±1 s of jitter.
    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The wait after send number `sent` (1-based): 0.5–1 s, then 4, 8, 16, 32, 64, 64… s,
    /// ±1 s.
    fn retransmit_delay(&mut self, sent: u32) -> Duration {
        if sent <= 1 {
            let (lo, hi) = QUICK_RETRY_MS;
            return Duration::from_millis(lo + self.next_random() % (hi - lo + 1));
        }
        let base = FIRST_RETRANSMIT
            .saturating_mul(1u32 << sent.saturating_sub(2).min(4))
            .min(MAX_RETRANSMIT);
        let jitter_ms = (self.next_random() % 2001) as i64 - 1000;
        let ms = base.as_millis() as i64 + jitter_ms;
        Duration::from_millis(ms.max(0) as u64)
    }

    /// Back to DISCOVER with a new xid, the first one sent at `at`.
    fn restart(&mut self, at: Duration) {
        self.xid = self.next_random() as u32;
        self.state = State::Selecting { next: at, sent: 0 };
    }

    /// The pause before DISCOVER after NAK number `naks` (1-based): a random time in
    /// [d/2, d] with d = 1, 2, 4 … 64 s, so a server that NAKs every REQUEST gets a few
    /// packets a second at first and one a minute later, never a flood (RFC 2131 §4.1 asks
    /// for randomised retransmission; §3.1 step 4 only says "restart").
    fn nak_backoff(&mut self, naks: u32) -> Duration {
        let d = Duration::from_secs(1)
            .saturating_mul(1u32 << naks.saturating_sub(1).min(6))
            .min(MAX_RETRANSMIT);
        let half = d / 2;
        let span = half.as_millis() as u64 + 1;
        half + Duration::from_millis(self.next_random() % span)
    }

    /// What to do at `now`.
    pub fn poll(&mut self, now: Duration) -> Action {
        if let State::Bound(lease) = &self.state {
            return Action::Bound(lease.clone());
        }
        if now >= self.cfg.deadline {
            return Action::TimedOut;
        }
        if let State::Requesting { sent, next, .. } = self.state {
            if sent >= MAX_REQUESTS && now >= next {
                self.restart(now);
            }
        }
        let wake = match self.state {
            State::Selecting { next, sent } if now >= next => {
                let delay = self.retransmit_delay(sent + 1);
                self.state = State::Selecting {
                    next: now + delay,
                    sent: sent + 1,
                };
                return Action::Send(self.message(now, MessageType::Discover, None));
            }
            State::Requesting { offer, next, sent } if now >= next => {
                let delay = self.retransmit_delay(sent + 1);
                self.state = State::Requesting {
                    offer,
                    next: now + delay,
                    sent: sent + 1,
                };
                return Action::Send(self.message(now, MessageType::Request, Some(offer)));
            }
            State::Selecting { next, .. } | State::Requesting { next, .. } => next,
            State::Bound(_) => now,
        };
        Action::Wait(wake.min(self.cfg.deadline))
    }

    fn message(&self, now: Duration, kind: MessageType, offer: Option<Offer>) -> DhcpMessage {
        let mut client_id = vec![1u8]; // hardware type Ethernet, then the MAC (RFC 2132 §9.14)
        client_id.extend_from_slice(&self.cfg.mac);
        DhcpMessage {
            op: 1,
            xid: self.xid,
            secs: now
                .saturating_sub(self.start)
                .as_secs()
                .min(u64::from(u16::MAX)) as u16,
            chaddr: self.cfg.mac,
            message_type: Some(kind),
            client_id,
            hostname: self.cfg.hostname.clone(),
            parameter_request: PARAMETER_REQUEST_LIST.to_vec(),
            max_message_size: Some(1500),
            requested_ip: offer.map(|o| o.address),
            server_id: offer.map(|o| o.server),
            ..DhcpMessage::default()
        }
    }

    /// Feeds one received message: Ok when it moved the exchange on, else why it was dropped
    /// (checked in this order, as each return below says).
    pub fn handle(&mut self, now: Duration, m: &DhcpMessage) -> Result<(), Ignored> {
        if m.op != 2 {
            return Err(Ignored::NotAReply);
        }
        if m.xid != self.xid {
            return Err(Ignored::OtherXid);
        }
        if m.chaddr != self.cfg.mac {
            return Err(Ignored::OtherMac);
        }
        let Some(server) = m.server_id else {
            return Err(Ignored::NoServerId);
        };
        match (&self.state, m.message_type) {
            (State::Selecting { .. }, Some(MessageType::Offer)) => {
                let Some(address) = m.yiaddr else {
                    return Err(Ignored::OfferWithoutAddress);
                };
                // The first valid offer wins (RFC 2131 §4.4.1 lets the client choose).
                self.state = State::Requesting {
                    offer: Offer { address, server },
                    next: now,
                    sent: 0,
                };
                Ok(())
            }
            (State::Requesting { offer, .. }, Some(MessageType::Ack | MessageType::Nak))
                if offer.server != server =>
            {
                Err(Ignored::OtherServer)
            }
            (State::Requesting { .. }, Some(MessageType::Ack)) => {
                let lease = lease_from_ack(m, server).ok_or(Ignored::AckWithoutLease)?;
                self.state = State::Bound(lease);
                Ok(())
            }
            (State::Requesting { .. }, Some(MessageType::Nak)) => {
                self.naks += 1;
                let pause = self.nak_backoff(self.naks);
                self.restart(now + pause);
                Ok(())
            }
            (state, kind) => Err(Ignored::Unexpected {
                kind,
                state: state.name(),
            }),
        }
    }
}

/// Why a received DHCP message did not move the exchange on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// op is not BOOTREPLY (another client's request, seen on the link).
    NotAReply,
    /// A reply to another exchange (another client's, or one of ours before a restart).
    OtherXid,
    /// A reply for another client's hardware address.
    OtherMac,
    /// No option 54: RFC 2131 requires the server identifier in OFFER, ACK and NAK.
    NoServerId,
    /// An OFFER with no address in yiaddr.
    OfferWithoutAddress,
    /// An ACK or NAK from a server other than the one whose offer was taken.
    OtherServer,
    /// An ACK without a usable lease (no address, or a subnet mask that is not a prefix).
    AckWithoutLease,
    /// A message this state does not take (an ACK while selecting, anything once bound).
    Unexpected {
        kind: Option<MessageType>,
        state: &'static str,
    },
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ignored::NotAReply => f.write_str("not a reply (op is not BOOTREPLY)"),
            Ignored::OtherXid => f.write_str("another exchange's xid"),
            Ignored::OtherMac => f.write_str("another client's MAC"),
            Ignored::NoServerId => f.write_str("no server identifier (option 54)"),
            Ignored::OfferWithoutAddress => f.write_str("an offer of no address"),
            Ignored::OtherServer => {
                f.write_str("from another server than the one whose offer was taken")
            }
            Ignored::AckWithoutLease => f.write_str(
                "an ACK without a usable lease (no address, or a mask that is not a prefix)",
            ),
            Ignored::Unexpected { kind, state } => match kind {
                Some(k) => write!(f, "{k:?} not expected while {state}"),
                None => write!(f, "no message type (option 53) while {state}"),
            },
        }
    }
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Selecting { .. } => "selecting",
            State::Requesting { .. } => "requesting",
            State::Bound(_) => "bound",
        }
    }
}

fn prefix_from_mask(mask: Ipv4Addr) -> Option<u8> {
    let bits = u32::from(mask);
    let len = bits.leading_ones();
    (bits.checked_shl(len).unwrap_or(0) == 0).then_some(len as u8)
}

/// The classful default when a server sends no mask (RFC 2132 §3.3 leaves it to the client).
fn classful_prefix(a: Ipv4Addr) -> u8 {
    match a.octets()[0] {
        0..=127 => 8,
        128..=191 => 16,
        _ => 24,
    }
}

fn lease_from_ack(m: &DhcpMessage, server_id: Ipv4Addr) -> Option<Lease> {
    let address = m.yiaddr?;
    let prefix_len = match m.subnet_mask {
        Some(mask) => prefix_from_mask(mask)?,
        None => classful_prefix(address),
    };
    let router = m.routers.first().copied();
    let routes = match &m.classless_routes {
        Some(r) => r.clone(),
        None => router
            .map(|gw| {
                vec![Route {
                    dest: Ipv4Addr::UNSPECIFIED,
                    prefix_len: 0,
                    gateway: gw,
                }]
            })
            .unwrap_or_default(),
    };
    Some(Lease {
        address,
        prefix_len,
        router,
        routes,
        dns: m.dns.clone(),
        domain: m.domain.clone(),
        mtu: m.mtu,
        server_id,
        wireserver: m.wireserver,
        lease_secs: m.lease_secs.unwrap_or(u32::MAX),
        broadcast: m.broadcast_addr,
    })
}

#[cfg(test)]
mod tests;
