use super::*;

const MAC: [u8; 6] = [0x00, 0x0d, 0x3a, 0x12, 0x34, 0x56];
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 69);

fn s(secs: f64) -> Duration {
    Duration::from_secs_f64(secs)
}

fn client(deadline: f64) -> Machine {
    Machine::new(
        Params {
            mac: MAC,
            hostname: Some("vm-7".into()),
            deadline: s(deadline),
        },
        42,
        s(0.0),
    )
}

fn reply(c: &Machine, kind: MessageType) -> DhcpMessage {
    DhcpMessage {
        op: 2,
        xid: c.xid(),
        chaddr: MAC,
        yiaddr: Some(ME),
        message_type: Some(kind),
        server_id: Some(SERVER),
        subnet_mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
        routers: vec![SERVER],
        lease_secs: Some(u32::MAX),
        ..DhcpMessage::default()
    }
}

fn sent(a: Action) -> DhcpMessage {
    match a {
        Action::Send(m) => m,
        other => panic!("expected a send, got {other:?}"),
    }
}

#[test]
fn discover_carries_the_contract_options() {
    let mut c = client(60.0);
    let d = sent(c.poll(s(0.0)));
    assert_eq!(d.message_type, Some(MessageType::Discover));
    assert_eq!(d.op, 1);
    assert_eq!(d.chaddr, MAC);
    assert_eq!(d.client_id, [1, 0x00, 0x0d, 0x3a, 0x12, 0x34, 0x56]);
    assert_eq!(d.hostname.as_deref(), Some("vm-7"));
    assert_eq!(d.parameter_request, [1, 3, 6, 15, 26, 28, 51, 54, 121, 245]);
    assert_eq!(d.requested_ip, None);
    assert_eq!(d.xid, c.xid());
}

#[test]
fn retransmit_schedule_follows_rfc2131() {
    let mut c = client(300.0);
    let mut now = s(0.0);
    let mut sends = Vec::new();
    loop {
        match c.poll(now) {
            Action::Send(m) => {
                assert_eq!(m.xid, c.xid(), "retransmissions keep the xid");
                sends.push(now);
            }
            Action::Wait(t) => {
                assert!(t > now);
                now = t;
            }
            Action::TimedOut => break,
            Action::Bound(_) => unreachable!(),
        }
    }
    assert_eq!(now, s(300.0));
    let gaps: Vec<f64> = sends
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    // a quick first retry (a DISCOVER lost on a link just up), then RFC 2131's schedule
    assert!((0.5..=1.0).contains(&gaps[0]), "{gaps:?}");
    let want = [4.0, 8.0, 16.0, 32.0, 64.0, 64.0];
    assert!(gaps.len() > want.len(), "{gaps:?}");
    for (g, w) in gaps[1..].iter().zip(want) {
        assert!((g - w).abs() <= 1.0 + 1e-9, "gap {g} vs {w}: {gaps:?}");
    }
    // the jitter is real: not every gap is the exact base
    assert!(gaps[1..]
        .iter()
        .zip(want)
        .any(|(g, w)| (g - w).abs() > 1e-3));
}

#[test]
fn full_exchange_binds_with_the_lease() {
    let mut c = client(60.0);
    sent(c.poll(s(0.0)));
    let offer = reply(&c, MessageType::Offer);
    assert_eq!(c.handle(s(0.1), &offer), Ok(()));
    let r = sent(c.poll(s(0.1)));
    assert_eq!(r.message_type, Some(MessageType::Request));
    assert_eq!(r.requested_ip, Some(ME));
    assert_eq!(r.server_id, Some(SERVER));
    assert_eq!(r.hostname.as_deref(), Some("vm-7"));
    assert_eq!(r.xid, offer.xid);
    let ack = reply(&c, MessageType::Ack);
    assert_eq!(c.handle(s(0.2), &ack), Ok(()));
    let Action::Bound(lease) = c.poll(s(0.2)) else {
        panic!()
    };
    assert_eq!(lease.address, ME);
    assert_eq!(lease.prefix_len, 24);
    assert_eq!(lease.router, Some(SERVER));
    assert_eq!(
        lease.routes,
        [Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: SERVER
        }]
    );
    assert_eq!(lease.lease_secs, u32::MAX);
    // bound stays bound, even past the deadline
    assert!(matches!(c.poll(s(100.0)), Action::Bound(_)));
}

#[test]
fn classless_routes_win_over_the_router() {
    let mut c = client(60.0);
    sent(c.poll(s(0.0)));
    c.handle(s(0.1), &reply(&c, MessageType::Offer))
        .expect("taken");
    sent(c.poll(s(0.1)));
    let mut ack = reply(&c, MessageType::Ack);
    ack.routers = vec![Ipv4Addr::new(10, 0, 0, 254)];
    let wire = Ipv4Addr::new(168, 63, 129, 16);
    ack.classless_routes = Some(vec![
        Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: SERVER,
        },
        Route {
            dest: wire,
            prefix_len: 32,
            gateway: SERVER,
        },
    ]);
    ack.wireserver = Some(wire);
    ack.mtu = Some(1400);
    c.handle(s(0.2), &ack).expect("taken");
    let Action::Bound(lease) = c.poll(s(0.2)) else {
        panic!()
    };
    assert_eq!(lease.router, Some(Ipv4Addr::new(10, 0, 0, 254)));
    assert_eq!(lease.routes.len(), 2);
    assert!(lease.routes.iter().all(|r| r.gateway == SERVER));
    assert_eq!(lease.wireserver, Some(wire));
    assert_eq!(lease.mtu, Some(1400));
}

#[test]
fn wrong_xid_chaddr_or_missing_server_id_are_dropped() {
    let mut c = client(60.0);
    sent(c.poll(s(0.0)));
    let mut bad = reply(&c, MessageType::Offer);
    bad.xid ^= 1;
    assert_eq!(c.handle(s(0.1), &bad), Err(Ignored::OtherXid));
    let mut bad = reply(&c, MessageType::Offer);
    bad.chaddr[5] ^= 1;
    assert_eq!(c.handle(s(0.1), &bad), Err(Ignored::OtherMac));
    let mut bad = reply(&c, MessageType::Offer);
    bad.server_id = None;
    assert_eq!(c.handle(s(0.1), &bad), Err(Ignored::NoServerId));
    let mut bad = reply(&c, MessageType::Offer);
    bad.op = 1;
    assert_eq!(c.handle(s(0.1), &bad), Err(Ignored::NotAReply));
    let mut bad = reply(&c, MessageType::Offer);
    bad.yiaddr = None;
    assert_eq!(c.handle(s(0.1), &bad), Err(Ignored::OfferWithoutAddress));
    // an ACK while selecting is unexpected, and the reason says so
    let why = c.handle(s(0.1), &reply(&c, MessageType::Ack));
    assert_eq!(
        why,
        Err(Ignored::Unexpected {
            kind: Some(MessageType::Ack),
            state: "selecting"
        })
    );
    assert_eq!(
        why.unwrap_err().to_string(),
        "Ack not expected while selecting"
    );
    assert!(matches!(c.poll(s(0.1)), Action::Wait(_)));
}

#[test]
fn nak_restarts_with_a_new_xid() {
    let mut c = client(60.0);
    sent(c.poll(s(0.0)));
    let first_xid = c.xid();
    c.handle(s(0.1), &reply(&c, MessageType::Offer))
        .expect("taken");
    sent(c.poll(s(0.1)));
    // a NAK from another server is ignored
    let mut other = reply(&c, MessageType::Nak);
    other.server_id = Some(Ipv4Addr::new(10, 0, 0, 2));
    assert_eq!(c.handle(s(0.2), &other), Err(Ignored::OtherServer));
    assert_eq!(c.handle(s(0.2), &reply(&c, MessageType::Nak)), Ok(()));
    assert_eq!(c.naks, 1);
    assert_ne!(c.xid(), first_xid);
    // a randomised pause of 0.5–1 s before the new DISCOVER
    assert!(matches!(c.poll(s(0.6)), Action::Wait(_)));
    let d = sent(c.poll(s(1.3)));
    assert_eq!(d.message_type, Some(MessageType::Discover));
    assert_eq!(d.xid, c.xid());
}

/// A server that NAKs every REQUEST: the client's packets stay a few a second at most and
/// thin out, instead of a DISCOVER/REQUEST flood.
#[test]
fn a_server_that_naks_forever_is_not_flooded() {
    let mut c = client(120.0);
    let mut now = 0.0;
    let mut sends: Vec<f64> = Vec::new();
    while now < 120.0 {
        match c.poll(s(now)) {
            Action::Send(m) => {
                sends.push(now);
                let kind = match m.message_type {
                    Some(MessageType::Discover) => MessageType::Offer,
                    _ => MessageType::Nak,
                };
                // the server answers at once
                c.handle(s(now), &reply(&c, kind)).expect("taken");
            }
            Action::Wait(until) => now = until.as_secs_f64().max(now + 0.001),
            Action::TimedOut | Action::Bound(_) => break,
        }
    }
    assert!(c.naks >= 5, "naks {}", c.naks);
    assert!(sends.len() < 40, "{} packets in 120 s", sends.len());
    for w in sends.windows(5) {
        assert!(w[4] - w[0] >= 1.0, "5 packets within a second: {w:?}");
    }
}

#[test]
fn the_first_offer_wins() {
    let mut c = client(60.0);
    sent(c.poll(s(0.0)));
    assert_eq!(c.handle(s(0.1), &reply(&c, MessageType::Offer)), Ok(()));
    let mut second = reply(&c, MessageType::Offer);
    second.server_id = Some(Ipv4Addr::new(10, 0, 0, 2));
    second.yiaddr = Some(Ipv4Addr::new(10, 0, 0, 99));
    assert_eq!(
        c.handle(s(0.5), &second),
        Err(Ignored::Unexpected {
            kind: Some(MessageType::Offer),
            state: "requesting"
        })
    );
    let r = sent(c.poll(s(0.5)));
    assert_eq!(r.server_id, Some(SERVER));
    assert_eq!(r.requested_ip, Some(ME));
}

#[test]
fn unanswered_requests_fall_back_to_discover() {
    let mut c = client(600.0);
    sent(c.poll(s(0.0)));
    c.handle(s(0.1), &reply(&c, MessageType::Offer))
        .expect("taken");
    let mut now = s(0.1);
    let mut kinds = Vec::new();
    while kinds.len() < 6 {
        match c.poll(now) {
            Action::Send(m) => kinds.push(m.message_type.unwrap()),
            Action::Wait(t) => now = t,
            other => panic!("{other:?}"),
        }
    }
    use MessageType::*;
    assert_eq!(
        kinds,
        [Request, Request, Request, Request, Discover, Discover]
    );
}

#[test]
fn deadline_times_out() {
    let mut c = client(5.0);
    sent(c.poll(s(0.0)));
    assert_eq!(c.poll(s(0.4)), Action::Wait(c_next(&mut client(5.0))));
    assert_eq!(c.poll(s(5.0)), Action::TimedOut);
    // even in the middle of requesting
    let mut c = client(5.0);
    sent(c.poll(s(0.0)));
    c.handle(s(4.9), &reply(&c, MessageType::Offer))
        .expect("taken");
    assert_eq!(c.poll(s(5.0)), Action::TimedOut);
}

/// The wake time a fresh client with the same seed reports after its first DISCOVER.
fn c_next(c: &mut Machine) -> Duration {
    sent(c.poll(s(0.0)));
    match c.poll(s(0.0)) {
        Action::Wait(t) => t,
        other => panic!("{other:?}"),
    }
}

#[test]
fn masks() {
    assert_eq!(prefix_from_mask(Ipv4Addr::new(255, 255, 255, 0)), Some(24));
    assert_eq!(prefix_from_mask(Ipv4Addr::new(255, 255, 240, 0)), Some(20));
    assert_eq!(prefix_from_mask(Ipv4Addr::new(0, 0, 0, 0)), Some(0));
    assert_eq!(
        prefix_from_mask(Ipv4Addr::new(255, 255, 255, 255)),
        Some(32)
    );
    assert_eq!(prefix_from_mask(Ipv4Addr::new(255, 0, 255, 0)), None);
}
