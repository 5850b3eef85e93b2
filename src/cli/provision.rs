//! `azprov provision --root DIR`: hook mode, the whole provisioning run into a mounted root.

use super::{imds_base, print_json, usage, wireserver_flag, Args, CliError};
use std::path::Path;

pub(super) fn cmd_provision(args: &[String]) -> Result<(), CliError> {
    use crate::provision::run::{provision, MediaSource, Options};
    let a = Args::parse(
        args,
        &[
            "root",
            "iface",
            "media",
            "ovf",
            "timeout",
            "wireserver",
            "imds",
            "dmi",
        ],
        &["no-dhcp", "force", "json"],
    )?;
    a.no_positionals()?;
    let root = a
        .value("root")?
        .ok_or_else(|| usage("azprov provision: --root DIR is required"))?;
    if !Path::new(root).is_dir() {
        return Err(usage(format!("--root {root}: not a directory")));
    }
    let media = match a.value("ovf")? {
        Some(f) => {
            if !a.values("media").is_empty() {
                return Err(usage("--ovf and --media exclude each other"));
            }
            std::fs::File::open(f).map_err(|e| usage(format!("--ovf {f}: {e}")))?;
            MediaSource::File(f.into())
        }
        None => MediaSource::Devices(a.values("media").iter().map(Into::into).collect()),
    };
    let opts = Options {
        iface: a.value("iface")?.map(str::to_string),
        dhcp: !a.has("no-dhcp"),
        media,
        force: a.has("force"),
        timeout: a.timeout(crate::config::DEFAULT_TIMEOUT)?,
        wireserver: wireserver_flag(&a)?,
        imds: imds_base(&a)?,
        dmi: a
            .value("dmi")?
            .unwrap_or(crate::azure::vmid::DMI_DIR)
            .into(),
        ..Options::hook(root.into())
    };
    let summary = provision(&opts);
    if a.has("json") {
        print_json(&summary)?;
    }
    match summary.exit_code() {
        0 => Ok(()),
        _ => Err(CliError::Failed(format!(
            "provisioning failed: {}",
            summary.reason.map_or("unknown", |r| r.as_str())
        ))),
    }
}
