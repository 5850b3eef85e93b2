//! The subcommands of docs/DESIGN.md, "Entry points" (tool and hook mode): argument parsing
//! (`args`) and one file per command. Each returns a [`CliError`] that decides the exit code: 0 ok,
//! 1 a network or provisioning failure, 2 bad input or usage.

mod args;
mod clean;
mod dhcp;
mod disks;
pub mod help;
mod inspect;
mod provision;
mod report;
mod status;

pub use args::Args;

use crate::azure::http::HttpError;
use crate::azure::{imds, wireserver};
use serde::Serialize;
use std::fmt;
use std::time::Duration;

pub const USAGE: &str = "\
usage:
  azprov                                   as PID 1 of an initramfs; otherwise prints this help
  azprov ovf FILE | --device DEV [--json]  parse ovf-env.xml (the password is never printed)
  azprov imds [--imds URL] [--timeout SECS] [--json]
  azprov provision --root DIR [--iface IF] [--no-dhcp] [--media DEV]... [--ovf FILE] [--force]
                   [--timeout SECS] [--json] [--wireserver IP[:PORT]] [--imds URL]
                   [--keep-host-keys] [--dmi DIR] [--cmdline FILE]
  azprov status [--root DIR] [--json]      what azprov recorded: provisioned? reported?
  azprov clean [--root DIR] [--user] [--machine-id] [--dry-run] [--json]
                                           prepare the image for capture
  azprov run-scripts [--root DIR]          run #! custom data / user data once per VM
  azprov disks [--sys DIR] [--json] [--udev NAME]  Azure's disks and their /dev/disk/azure names
  azprov resource-disk NAME                format the resource disk when blank, and mount it
  azprov dhcp [--iface IF] [--hostname NAME] [--timeout SECS] [--json] [--keep]
  azprov report ready [--wireserver IP[:PORT]] [--timeout SECS]
  azprov report failure --reason TEXT [--wireserver IP[:PORT]] [--timeout SECS]
  azprov version | -V
  azprov COMMAND --help                    that command's options, one line each
exit codes: 0 ok (also: already provisioned, disabled, not Azure), 1 failed (network,
provisioning; status: not provisioned or Ready not acknowledged), 2 usage or bad input,
3 status cannot tell (the state is readable by root only and this boot left no record)";

/// Why a command failed, and so its exit code.
#[derive(Debug)]
pub enum CliError {
    /// Wrong flags, a missing or malformed file: exit 2.
    Usage(String),
    /// The network or the fabric failed: exit 1.
    Failed(String),
    /// `status` cannot tell what it was asked (it may not read the state): exit 3.
    Unknown(String),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
            CliError::Unknown(_) => 3,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Failed(m) | CliError::Unknown(m) => f.write_str(m),
        }
    }
}

pub(crate) fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

/// Runs a subcommand (`args` excludes the program name).
pub fn run(args: &[String]) -> Result<(), CliError> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err(usage(USAGE));
    };
    // `azprov COMMAND --help`: that command's flags, one line each
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        let c = help::command(cmd).ok_or_else(|| {
            usage(format!(
                "unknown command {cmd:?} (azprov --help lists them)"
            ))
        })?;
        print!("{}", c.help());
        return Ok(());
    }
    match cmd.as_str() {
        "ovf" => inspect::cmd_ovf(rest),
        "imds" => inspect::cmd_imds(rest),
        "dhcp" => dhcp::cmd_dhcp(rest),
        "provision" => provision::cmd_provision(rest),
        "report" => report::cmd_report(rest),
        "status" => status::cmd_status(rest),
        "run-scripts" => run_scripts(rest),
        "clean" => clean::cmd_clean(rest),
        "disks" => disks::cmd_disks(rest),
        "resource-disk" => disks::cmd_resource_disk(rest),
        "version" | "--version" | "-V" => {
            Args::parse(rest, &[], &[])?.no_positionals()?;
            println!("azprov {}", crate::VERSION);
            Ok(())
        }
        // the RSA host key after the handover (provision::hostkeys::later); not for users
        crate::provision::hostkeys::later::COMMAND => host_key_rsa(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(usage(format!(
            "unknown command {other:?} (azprov --help lists them)"
        ))),
    }
}

fn run_scripts(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "run-scripts")?;
    a.no_positionals()?;
    let root = crate::root::Sysroot::new(a.value("root")?.unwrap_or("/"));
    let said = crate::provision::scripts::run_once(&root, &crate::provision::scripts::execute)
        .map_err(|e| CliError::Failed(format!("run-scripts: {e}")))?;
    for line in said {
        log::info!("{line}");
    }
    Ok(())
}

fn host_key_rsa(args: &[String]) -> Result<(), CliError> {
    let a = Args::parse(
        args,
        &["comment", "label-key", "label-pub", "label-state", "line"],
        &[],
    )?;
    let hex = |flag: &str| -> Result<Option<Vec<u8>>, CliError> {
        a.value(flag)?
            .map(|h| {
                (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(h.get(i..i + 2).unwrap_or("zz"), 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| usage(format!("--{flag}: not hex")))
            })
            .transpose()
    };
    let job = crate::provision::hostkeys::later::Job {
        comment: a.value("comment")?.unwrap_or("root@localhost").to_string(),
        label_key: hex("label-key")?,
        label_pub: hex("label-pub")?,
        label_state: hex("label-state")?,
        lines: a.values("line").to_vec(),
    };
    crate::provision::hostkeys::later::main(&job)
        .map_err(|e| CliError::Failed(format!("host keys: {e}")))
}

pub(crate) fn print_json<T: Serialize>(v: &T) -> Result<(), CliError> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| CliError::Failed(format!("JSON output: {e}")))?;
    println!("{s}");
    Ok(())
}

/// `-` for a missing value in the plain-text output.
pub(crate) fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

pub(crate) fn network_failure(what: &str, timeout: Duration, e: &HttpError) -> CliError {
    CliError::Failed(format!(
        "{what} failed within {}s: {e}",
        crate::time::secs(timeout)
    ))
}

pub(crate) fn imds_base(a: &Args) -> Result<String, CliError> {
    let base = a.value("imds")?.unwrap_or(imds::DEFAULT_BASE);
    // https:// works only in a build with the `tls` feature; say so now, not after retries
    let https_ok = cfg!(feature = "tls") && base.starts_with("https://");
    if !base.starts_with("http://") && !https_ok {
        let hint = if base.starts_with("https://") {
            " (this build has no TLS: rebuild with --features tls)"
        } else {
            ""
        };
        return Err(usage(format!(
            "--imds: expected an http:// URL, got {base:?}{hint}"
        )));
    }
    Ok(base.to_string())
}

pub(crate) fn wireserver_flag(a: &Args) -> Result<Option<std::net::SocketAddr>, CliError> {
    a.value("wireserver")?
        .map(wireserver::parse_endpoint)
        .transpose()
        .map_err(|e| usage(e.to_string()))
}
