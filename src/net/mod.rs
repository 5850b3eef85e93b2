//! azprov's own network bring-up: NIC choice, a DHCPv4 client over a raw socket, and applying
//! the lease over rtnetlink (DESIGN.md §2, §4).

pub mod apply;
pub mod dhcp;
pub mod link;
pub mod run;
pub mod wire;
