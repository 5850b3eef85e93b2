//! `azprov disks`: the `/dev/disk/azure` names of Azure's disks in a sysfs tree (the packages'
//! udev rule imports `--udev NAME`); `azprov resource-disk NAME`: the resource disk formatted
//! when Azure handed it over blank, and mounted (`azprov-resource-disk@.service`).

use super::{print_json, usage, Args, CliError};
use crate::disk::names;
use crate::provision::resource_disk::{self, Outcome};
use std::path::Path;

const CMDLINE: &str = "/proc/cmdline";

pub(super) fn cmd_disks(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "disks")?;
    a.no_positionals()?;
    let sys = a.value("sys")?.unwrap_or("/sys");
    if !Path::new(sys).join("class/block").is_dir() {
        return Err(usage(format!(
            "--sys {sys}: no such sysfs tree (no class/block in it)"
        )));
    }
    let sys = Path::new(sys);
    if let Some(kernel) = a.value("udev")? {
        // udev's IMPORT{program}: KEY="value" lines; links relative to /dev, as SYMLINK takes them
        let links: Vec<String> = names::links_of(sys, kernel)
            .iter()
            .filter_map(|l| l.strip_prefix("/dev/").map(str::to_string))
            .collect();
        if !links.is_empty() {
            println!("AZPROV_DISK_LINKS=\"{}\"", links.join(" "));
        }
        let cfg = crate::config::read(None, Path::new(a.value("cmdline")?.unwrap_or(CMDLINE)));
        if resource_disk::is_resource_disk(sys, kernel, &cfg.resource) {
            println!("AZPROV_RESOURCE_DISK=1");
        }
        return Ok(());
    }
    let disks = names::scan(sys);
    if a.has("json") {
        return print_json(&disks);
    }
    for d in &disks {
        let lun = d.lun.map_or_else(String::new, |l| format!(" lun {l}"));
        println!("{} {}{lun}: {}", d.name, d.kind.as_str(), d.links.join(" "));
        for p in &d.partitions {
            println!("  {}: {}", p.name, p.links.join(" "));
        }
    }
    Ok(())
}

pub(super) fn cmd_resource_disk(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "resource-disk")?;
    let [name] = a.positional.as_slice() else {
        return Err(usage(
            "resource-disk: give the disk's kernel name (sdb, nvme0n1)",
        ));
    };
    let name = name.trim_start_matches("/dev/");
    let sys = a.value("sys")?.unwrap_or("/sys");
    let dev = a.value("dev")?.unwrap_or("/dev");
    if !Path::new(sys).join("class/block").join(name).exists() {
        return Err(usage(format!(
            "resource-disk: no disk {name} in {sys}/class/block"
        )));
    }
    let cfg = crate::config::read(None, Path::new(a.value("cmdline")?.unwrap_or(CMDLINE)));
    crate::logger::init(cfg.log_level);
    let _log = crate::logger::hook_output();
    match resource_disk::run(Path::new(sys), Path::new(dev), name, &cfg.resource) {
        Outcome::Formatted { device, mount } => log::info!(
            "resource disk: {} formatted and mounted on {}",
            device.display(),
            mount.display()
        ),
        Outcome::Mounted { device, mount } => log::info!(
            "resource disk: {} mounted on {} (formatted on an earlier boot)",
            device.display(),
            mount.display()
        ),
        Outcome::Untouched(why) => log::warn!("resource disk: {name} left alone: {why}"),
    }
    Ok(())
}
