//! `azprov ovf` and `azprov imds`: parse and print what the provisioning CD and IMDS hold.
//! The password and the custom and user data are never printed, only their presence or size.

use super::{imds_base, network_failure, opt, print_json, usage, Args, CliError};
use crate::azure::http::Client;
use crate::azure::{imds, ovf};
use crate::deadline::Deadline;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

#[derive(Serialize)]
struct OvfJson<'a> {
    hostname: &'a str,
    username: Option<&'a str>,
    has_password: bool,
    disable_ssh_password_auth: Option<bool>,
    ssh_keys: Vec<&'a str>,
    custom_data_bytes: Option<usize>,
    preprovisioned_vm: bool,
    pps_type: Option<&'a str>,
    provision_guest_proxy_agent: bool,
}

pub(super) fn cmd_ovf(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "ovf")?;
    let (name, bytes) = match (a.positional.as_slice(), a.value("device")?) {
        ([f], None) => {
            let bytes = std::fs::read(f).map_err(|e| usage(format!("cannot read {f}: {e}")))?;
            (f.clone(), bytes)
        }
        ([], Some(dev)) => {
            if !Path::new(dev).exists() {
                return Err(usage(format!("--device {dev}: no such device")));
            }
            let deadline = Deadline::after(Duration::from_secs(10));
            match crate::azure::media::read_ovf(&[], &[dev.into()], deadline, &Default::default()) {
                Ok(Some(found)) => found,
                Ok(None) => return Err(usage(format!("{dev}: no ovf-env.xml on it"))),
                Err(e) => return Err(usage(e.to_string())),
            }
        }
        ([], None) => {
            return Err(usage(
                "azprov ovf: give the ovf-env.xml file or --device DEV",
            ))
        }
        _ => return Err(usage("ovf: give exactly one file, or --device DEV")),
    };
    let env = ovf::parse(&bytes).map_err(|e| usage(format!("{name}: {e}")))?;
    // what provision checks of the same values: refused here as there
    use crate::root::values::{Hostname, SshKey, Username};
    Hostname::parse(&env.hostname)
        .map_err(|e| usage(format!("{name}: {e}; provision would refuse it")))?;
    if let Some(u) = env.username.as_deref() {
        Username::parse(u).map_err(|e| usage(format!("{name}: {e}; provision would refuse it")))?;
    }
    for (i, k) in env.ssh_keys.iter().enumerate() {
        if let Some(Err(e)) = k.value.as_deref().map(SshKey::parse) {
            eprintln!("azprov: {name}: key {}: {e}; provision skips it", i + 1);
        }
    }
    let out = OvfJson {
        hostname: &env.hostname,
        username: env.username.as_deref(),
        has_password: env.password.is_some(),
        disable_ssh_password_auth: env.disable_ssh_password_auth,
        ssh_keys: env
            .ssh_keys
            .iter()
            .filter_map(|k| k.value.as_deref())
            .collect(),
        custom_data_bytes: env.custom_data.as_ref().map(|c| c.expose().len()),
        preprovisioned_vm: env.preprovisioned_vm,
        pps_type: env.pps_type.as_deref(),
        provision_guest_proxy_agent: env.provision_guest_proxy_agent,
    };
    if a.has("json") {
        return print_json(&out);
    }
    println!("hostname: {}", out.hostname);
    println!("username: {}", opt(out.username));
    println!(
        "password: {}",
        if out.has_password {
            "set (not shown)"
        } else {
            "none"
        }
    );
    println!(
        "disable_ssh_password_auth: {}",
        opt(out.disable_ssh_password_auth)
    );
    for k in &out.ssh_keys {
        println!("ssh_key: {k}");
    }
    println!("custom_data_bytes: {}", opt(out.custom_data_bytes));
    println!("preprovisioned_vm: {}", out.preprovisioned_vm);
    println!("pps_type: {}", opt(out.pps_type));
    println!(
        "provision_guest_proxy_agent: {}",
        out.provision_guest_proxy_agent
    );
    Ok(())
}

#[derive(Serialize)]
struct ImdsJson<'a> {
    vm_id: &'a str,
    computer_name: Option<&'a str>,
    admin_username: Option<&'a str>,
    disable_password_auth: bool,
    ssh_keys: Vec<&'a str>,
    user_data_bytes: Option<usize>,
    location: Option<&'a str>,
    vm_size: Option<&'a str>,
}

pub(super) fn cmd_imds(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "imds")?;
    a.no_positionals()?;
    let base = imds_base(&a)?;
    let base = base.as_str();
    let timeout = a.timeout(Duration::from_secs(30))?;
    let client = Client::new();
    let m = imds::fetch(&client, base, Deadline::after(timeout))
        .map_err(|e| network_failure("IMDS query", timeout, &e))?;
    let out = ImdsJson {
        vm_id: &m.vm_id,
        computer_name: m.computer_name.as_deref(),
        admin_username: m.admin_username.as_deref(),
        disable_password_auth: m.disable_password_auth.unwrap_or(false),
        ssh_keys: m.ssh_keys.iter().map(|k| k.data.as_str()).collect(),
        user_data_bytes: m.user_data.as_ref().map(|u| u.expose().len()),
        location: m.location.as_deref(),
        vm_size: m.vm_size.as_deref(),
    };
    if a.has("json") {
        return print_json(&out);
    }
    println!("vm_id: {}", out.vm_id);
    println!("computer_name: {}", opt(out.computer_name));
    println!("admin_username: {}", opt(out.admin_username));
    println!("disable_password_auth: {}", out.disable_password_auth);
    for k in &out.ssh_keys {
        println!("ssh_key: {k}");
    }
    println!("user_data_bytes: {}", opt(out.user_data_bytes));
    println!("location: {}", opt(out.location));
    println!("vm_size: {}", opt(out.vm_size));
    Ok(())
}
