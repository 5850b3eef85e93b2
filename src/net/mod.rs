//! azprov's own network bring-up: NIC choice (`link`), the DHCPv4 wire format (`wire`) and
//! state machine (`dhcp`, no I/O), the I/O loop around it (`dhclient`), rtnetlink messages
//! (`rtnl`, pure) and applying a lease with them (`apply`). See docs/DESIGN.md, "The boot
//! flow in PID 1", and docs/contracts.md, "Protocol rules".

pub mod apply;
pub mod dhclient;
pub mod dhcp;
pub mod link;
pub mod rtnl;
pub mod wire;
