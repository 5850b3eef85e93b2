//! `azprov provision --root DIR`: hook mode, the whole provisioning run into a mounted root.

use super::{imds_base, print_json, usage, wireserver_flag, Args, CliError};
use std::path::Path;

pub(super) fn cmd_provision(args: &[String]) -> Result<(), CliError> {
    use crate::provision::run::{provision, MediaSource, Mode, Options};
    let a = Args::for_command(args, "provision")?;
    a.no_positionals()?;
    let root = a
        .value("root")?
        .ok_or_else(|| usage("provision: --root DIR is required"))?;
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
    // The kernel command line, as PID 1 reads it: hooks stay one line, and `azprov.disable`,
    // `azprov.timeout=`, ... work the same in every framework. A flag given here wins.
    let cfg = kernel_config(a.value("cmdline")?.unwrap_or(CMDLINE));
    let _log = crate::logger::hook_output();
    let imds = match a.value("imds")? {
        Some(_) => imds_base(&a)?,
        None => cfg.imds.clone(),
    };
    let base = Options::from_config(root.into(), &cfg, Mode::Hook);
    let opts = Options {
        iface: a.value("iface")?.map(str::to_string).or(base.iface.clone()),
        dhcp: !a.has("no-dhcp"),
        media,
        force: a.has("force") || base.force,
        timeout: a.timeout(cfg.timeout)?,
        wireserver: wireserver_flag(&a)?.or(base.wireserver),
        imds,
        host_keys: base.host_keys && !a.has("keep-host-keys"),
        dmi: a
            .value("dmi")?
            .unwrap_or(crate::azure::vmid::DMI_DIR)
            .into(),
        record_dir: Some(crate::provision::record::dir(a.value("run-dir")?)),
        run_config: a.value("run-config")?.map(Into::into),
        ..base
    };
    // the booted system's azprov-msp.service: its network is up, the initramfs grew the root
    // and made the host keys
    let opts = match a.has("after-proxy-agent") {
        true => Options {
            after_proxy_agent: true,
            dhcp: false,
            growroot: false,
            host_keys: false,
            ..opts
        },
        false => opts,
    };
    let summary = provision(&opts);
    if a.has("json") {
        print_json(&summary)?;
    }
    match summary.exit_code() {
        0 => Ok(()),
        _ => Err(CliError::Failed(format!(
            "provisioning failed: {}",
            summary.cause.as_deref().unwrap_or("unknown")
        ))),
    }
}

const CMDLINE: &str = "/proc/cmdline";

/// The `azprov.*` settings of the kernel command line at `path`, read as PID 1 reads them;
/// sets the log level.
fn kernel_config(path: &str) -> crate::config::Config {
    let cfg = crate::config::read(None, Path::new(path));
    crate::logger::init(cfg.log_level);
    cfg
}
