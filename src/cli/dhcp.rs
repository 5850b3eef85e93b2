//! `azprov dhcp`: lease and configure the NIC, print the lease, undo it unless `--keep`.

use super::{opt, print_json, usage, Args, CliError};
use crate::deadline::Deadline;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

#[derive(Serialize)]
struct RouteJson {
    dest: String,
    gateway: String,
}

#[derive(Serialize)]
struct DhcpJson {
    iface: String,
    mac: String,
    address: String,
    prefix_len: u8,
    router: Option<String>,
    routes: Vec<RouteJson>,
    dns: Vec<String>,
    domain: Option<String>,
    mtu: Option<u16>,
    server_id: String,
    wireserver: Option<String>,
    lease_secs: u32,
}

pub(super) fn cmd_dhcp(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "dhcp")?;
    a.no_positionals()?;
    let timeout = a.timeout(Duration::from_secs(30))?;
    let class_net = Path::new(crate::net::link::SYS_CLASS_NET);
    let iface = a.value("iface")?;
    let (nic, applied) = crate::net::dhclient::bring_up(
        class_net,
        iface,
        a.value("hostname")?,
        Deadline::after(timeout),
    )
    .map_err(|e| {
        // naming an interface that does not exist is bad input; anything else a failure
        if iface.is_some() && e.no_interface() {
            usage(e.to_string())
        } else {
            CliError::Failed(e.to_string())
        }
    })?;
    let l = applied.lease();
    let out = DhcpJson {
        iface: nic.name.clone(),
        mac: nic.mac_string(),
        address: l.address.to_string(),
        prefix_len: l.prefix_len,
        router: l.router.map(|r| r.to_string()),
        routes: l
            .routes
            .iter()
            .map(|r| RouteJson {
                dest: format!("{}/{}", r.dest, r.prefix_len),
                gateway: r.gateway.to_string(),
            })
            .collect(),
        dns: l.dns.iter().map(|d| d.to_string()).collect(),
        domain: l.domain.clone(),
        mtu: l.mtu,
        server_id: l.server_id.to_string(),
        wireserver: l.wireserver.map(|w| w.to_string()),
        lease_secs: l.lease_secs,
    };
    if a.has("json") {
        print_json(&out)?;
    } else {
        println!(
            "{}: {}/{} from {} ({})",
            out.iface, out.address, out.prefix_len, out.server_id, out.mac
        );
        for r in &out.routes {
            println!("route {} via {}", r.dest, r.gateway);
        }
        println!("dns: {}", out.dns.join(" "));
        println!("domain: {}", opt(out.domain.as_deref()));
        println!("mtu: {}", opt(out.mtu));
        println!("wireserver: {}", opt(out.wireserver.as_deref()));
        println!("lease_secs: {}", out.lease_secs);
    }
    if a.has("keep") {
        applied.keep();
        Ok(())
    } else {
        applied
            .teardown()
            .map_err(|e| CliError::Failed(format!("teardown: {e}")))
    }
}
