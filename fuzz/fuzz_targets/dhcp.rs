//! DHCP: never a panic. What azprov emits parses back (emit writes the client's options, not
//! every server option, so the check is a fixpoint: a message made from an emitted one emits
//! and parses to itself), and the IPv4/UDP frame parser never panics either.
#![no_main]
use azprov::net::wire::dhcpv4::DhcpMessage;
use azprov::net::wire::ipv4::UdpIpv4;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = UdpIpv4::parse(data);
    if let Ok(m) = DhcpMessage::parse(data) {
        let once = DhcpMessage::parse(&m.emit()).expect("an emitted message parses");
        let twice = DhcpMessage::parse(&once.emit()).expect("an emitted message parses");
        assert_eq!(twice, once);
    }
});
