use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/dhcp/{name}", env!("CARGO_MANIFEST_DIR"));
    hex(&std::fs::read_to_string(path).unwrap())
}

const GW: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

#[test]
fn azure_ack_from_the_lease_sample() {
    let m = DhcpMessage::parse(&fixture("azure-ack.hex")).unwrap();
    assert_eq!(m.op, 2);
    assert_eq!(m.xid, 0x3903_f326);
    assert_eq!(m.message_type, Some(MessageType::Ack));
    assert_eq!(m.yiaddr, Some(Ipv4Addr::new(10, 0, 0, 69)));
    assert_eq!(m.chaddr, [0x00, 0x0d, 0x3a, 0x12, 0x34, 0x56]);
    assert_eq!(m.server_id, Some(Ipv4Addr::new(168, 63, 129, 16)));
    assert_eq!(m.lease_secs, Some(u32::MAX));
    assert_eq!(m.subnet_mask, Some(Ipv4Addr::new(255, 255, 255, 0)));
    assert_eq!(m.routers, [GW]);
    assert_eq!(m.dns, [Ipv4Addr::new(168, 63, 129, 16)]);
    assert_eq!(
        m.domain.as_deref(),
        Some("2rdlxelcdvjkok2emfc.bx.internal.cloudapp.net")
    );
    assert_eq!(m.wireserver, Some(Ipv4Addr::new(168, 63, 129, 16)));
    assert_eq!(
        m.classless_routes.unwrap(),
        [
            Route {
                dest: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                gateway: GW
            },
            Route {
                dest: Ipv4Addr::new(168, 63, 129, 16),
                prefix_len: 32,
                gateway: GW
            },
            Route {
                dest: Ipv4Addr::new(169, 254, 169, 254),
                prefix_len: 32,
                gateway: GW
            },
        ]
    );
}

#[test]
fn option_245_raw_bytes() {
    let mut b = fixture("azure-ack.hex");
    // replace the end with only option 245 and END
    b.truncate(240);
    b.extend_from_slice(&[53, 1, 2, 0xf5, 4, 0xa8, 0x3f, 0x81, 0x10, 255]);
    let m = DhcpMessage::parse(&b).unwrap();
    assert_eq!(m.wireserver, Some(Ipv4Addr::new(168, 63, 129, 16)));
    assert_eq!(m.message_type, Some(MessageType::Offer));
}

#[test]
fn classless_routes_with_non_octet_prefixes() {
    // 10.17.0.0/18 via 10.0.0.1: 3 significant octets; 172.16.0.0/12 on-link: 2 octets
    let data = hex("12 0a 11 00 0a 00 00 01  0c ac 10 00 00 00 00");
    let r = parse_classless_routes(&data).unwrap();
    assert_eq!(
        r[0],
        Route {
            dest: Ipv4Addr::new(10, 17, 0, 0),
            prefix_len: 18,
            gateway: GW
        }
    );
    assert_eq!(
        r[1],
        Route {
            dest: Ipv4Addr::new(172, 16, 0, 0),
            prefix_len: 12,
            gateway: Ipv4Addr::UNSPECIFIED
        }
    );
    assert_eq!(emit_classless_routes(&r), data);
    // bits past the prefix are masked off
    let r = parse_classless_routes(&hex("09 0a ff 0a 00 00 01")).unwrap();
    assert_eq!(r[0].dest, Ipv4Addr::new(10, 128, 0, 0));
    // refusals
    assert!(parse_classless_routes(&hex("21 0a 00 00 00 00 0a 00 00 01")).is_err());
    assert!(parse_classless_routes(&hex("18 0a 00 00 0a 00")).is_err());
}

#[test]
fn emit_then_parse_round_trips() {
    let m = DhcpMessage {
        op: 1,
        xid: 0xdead_beef,
        secs: 3,
        chaddr: [2, 0, 0, 0, 0, 9],
        message_type: Some(MessageType::Request),
        client_id: vec![1, 2, 0, 0, 0, 0, 9],
        requested_ip: Some(Ipv4Addr::new(10, 0, 0, 5)),
        server_id: Some(Ipv4Addr::new(10, 0, 0, 1)),
        hostname: Some("vm-1".into()),
        parameter_request: PARAMETER_REQUEST_LIST.to_vec(),
        ..DhcpMessage::default()
    };
    let bytes = m.emit();
    assert_eq!(bytes.len(), 300);
    assert_eq!(&bytes[236..240], &MAGIC_COOKIE);
    assert_eq!(DhcpMessage::parse(&bytes).unwrap(), m);
}

#[test]
fn emit_layout_matches_rfc2131() {
    let m = DhcpMessage {
        op: 1,
        xid: 0x0102_0304,
        chaddr: [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff],
        message_type: Some(MessageType::Discover),
        ..DhcpMessage::default()
    };
    let b = m.emit();
    assert_eq!(&b[..8], &[1, 1, 6, 0, 1, 2, 3, 4]);
    assert_eq!(&b[28..34], &[0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
    assert_eq!(&b[240..244], &[53, 1, 1, 255]);
    assert!(b[244..].iter().all(|&x| x == 0));
}

#[test]
fn truncated_and_garbage_packets_are_rejected_without_panic() {
    let good = fixture("azure-ack.hex");
    for n in 0..240 {
        assert!(DhcpMessage::parse(&good[..n]).is_err(), "prefix {n}");
    }
    // cut inside the options: an option whose length runs past the end
    for n in 241..good.len() - 1 {
        let _ = DhcpMessage::parse(&good[..n]); // must not panic; may or may not parse
    }
    assert!(DhcpMessage::parse(&good[..good.len() - 3]).is_err());
    let mut bad = good.clone();
    bad[236] = 0;
    assert_eq!(
        DhcpMessage::parse(&bad),
        Err(WireError::Malformed("no DHCP magic cookie"))
    );
    // pseudo-random garbage after a valid header
    let mut seed = 0x1234_5678u32;
    for _ in 0..2000 {
        let mut b = good[..240].to_vec();
        for _ in 0..(seed % 64) {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            b.push(seed as u8);
        }
        let _ = DhcpMessage::parse(&b);
    }
}

#[test]
fn unknown_message_types_are_kept() {
    let mut b = fixture("azure-ack.hex");
    b.truncate(240);
    b.extend_from_slice(&[53, 1, 42, 255]);
    assert_eq!(
        DhcpMessage::parse(&b).unwrap().message_type,
        Some(MessageType::Unknown(42))
    );
}

/// OFFER and ACK captured from dnsmasq 2.89 in the test namespaces (10.42.0.0/24, options 121,
/// 245 and 26 as the integration tests serve them).
#[test]
fn dnsmasq_offer_and_ack() {
    for (name, kind) in [
        ("dnsmasq-offer.hex", MessageType::Offer),
        ("dnsmasq-ack.hex", MessageType::Ack),
    ] {
        let m = DhcpMessage::parse(&fixture(name)).unwrap();
        assert_eq!(m.op, 2);
        assert_eq!(m.message_type, Some(kind), "{name}");
        assert_eq!(m.server_id, Some(Ipv4Addr::new(10, 42, 0, 1)));
        assert_eq!(m.subnet_mask, Some(Ipv4Addr::new(255, 255, 255, 0)));
        assert_eq!(m.routers, [Ipv4Addr::new(10, 42, 0, 1)]);
        assert_eq!(m.mtu, Some(1400));
        assert_eq!(m.lease_secs, Some(u32::MAX));
        assert_eq!(m.wireserver, Some(Ipv4Addr::new(168, 63, 129, 16)));
        let gw = Ipv4Addr::new(10, 42, 0, 1);
        assert_eq!(
            m.classless_routes.as_deref().unwrap(),
            [
                Route {
                    dest: Ipv4Addr::UNSPECIFIED,
                    prefix_len: 0,
                    gateway: gw
                },
                Route {
                    dest: Ipv4Addr::new(168, 63, 129, 16),
                    prefix_len: 32,
                    gateway: gw
                },
                Route {
                    dest: Ipv4Addr::new(169, 254, 169, 254),
                    prefix_len: 32,
                    gateway: gw
                },
            ]
        );
        let yi = m.yiaddr.unwrap().octets();
        assert_eq!(&yi[..3], &[10, 42, 0]);
    }
}

#[test]
fn a_name_option_with_nul_or_control_bytes_is_no_name() {
    // found by fuzz/dhcp: option 15 held NULs and control bytes inside the name
    let m = DhcpMessage::parse(&fixture("fuzz-nul-domain.hex")).unwrap();
    assert_eq!(m.domain, None);
    assert_eq!(m.message_type, Some(MessageType::Ack));
    // NUL padding at the end is fine, and so is the name before it
    assert_eq!(text(b"cloudapp.net\0\0").as_deref(), Some("cloudapp.net"));
    for bad in [&b"a\0b"[..], b"\x16evil", b"caf\xc3\xa9", b"\0\0"] {
        assert_eq!(text(bad), None, "{bad:?}");
    }
}

/// An ACK with the options in `extra` (code, len, data… as raw bytes) after the message type
/// and server id.
fn ack_with(extra: &[u8]) -> Vec<u8> {
    let mut b = DhcpMessage {
        op: 2,
        xid: 7,
        message_type: Some(MessageType::Ack),
        server_id: Some(GW),
        yiaddr: Some(Ipv4Addr::new(10, 0, 0, 9)),
        ..DhcpMessage::default()
    }
    .emit();
    let end = b.iter().rposition(|x| *x == opt::END).unwrap();
    b.truncate(end);
    b.extend_from_slice(extra);
    b.push(opt::END);
    b
}

#[test]
fn repeated_options_are_concatenated_as_rfc_3396_says() {
    // two DNS servers split over two option 6 instances, a route split mid-entry
    let m = DhcpMessage::parse(&ack_with(&[
        6, 4, 1, 1, 1, 1, 6, 4, 2, 2, 2, 2, 121, 3, 0, 10, 0, 121, 2, 0, 1,
    ]))
    .unwrap();
    assert_eq!(
        m.dns,
        [Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(2, 2, 2, 2)]
    );
    assert_eq!(
        m.classless_routes.unwrap(),
        [Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: Ipv4Addr::new(10, 0, 0, 1)
        }]
    );
    assert!(m.skipped.is_empty());
}

#[test]
fn a_malformed_option_azprov_can_do_without_is_skipped_not_fatal() {
    // a 5-byte 245, a 3-byte MTU, a route cut short: the lease is still usable
    let m = DhcpMessage::parse(&ack_with(&[
        245, 5, 168, 63, 129, 16, 0, 26, 3, 5, 220, 0, 121, 2, 24, 10,
    ]))
    .unwrap();
    assert_eq!(m.wireserver, None);
    assert_eq!(m.mtu, None);
    assert_eq!(m.classless_routes, None);
    let codes: Vec<u8> = m.skipped.iter().map(|(c, _)| *c).collect();
    assert_eq!(codes, [245, 26, 121]);
    assert_eq!(m.yiaddr, Some(Ipv4Addr::new(10, 0, 0, 9)));
    // but a message type or server id that is malformed leaves no usable reply
    assert!(DhcpMessage::parse(&ack_with(&[54, 3, 1, 2, 3])).is_err());
}

#[test]
fn a_value_over_255_bytes_goes_out_split_and_comes_back_whole() {
    let routes: Vec<Route> = (0..60u8)
        .map(|i| Route {
            dest: Ipv4Addr::new(10, i, 0, 0),
            prefix_len: 16,
            gateway: GW,
        })
        .collect();
    let m = DhcpMessage {
        op: 2,
        message_type: Some(MessageType::Ack),
        server_id: Some(GW),
        classless_routes: Some(routes.clone()),
        ..DhcpMessage::default()
    };
    assert!(emit_classless_routes(&routes).len() > 255);
    let back = DhcpMessage::parse(&m.emit()).unwrap();
    assert_eq!(back.classless_routes, Some(routes));
}
