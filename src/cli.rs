//! The subcommands of DESIGN.md §1 (tool mode): argument parsing and printing. Each command
//! returns an exit code: 0 ok, 1 a network or provisioning failure, 2 bad input or usage.

use crate::azure::http::{Client, HttpError};
use crate::azure::wireserver::{self, Health, WireServer};
use crate::azure::{imds, ovf, vmid};
use crate::deadline::Deadline;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

pub const USAGE: &str = "\
usage:
  azprov                                   as PID 1 of an initramfs; otherwise prints this help
  azprov ovf FILE | --device DEV [--json]  parse ovf-env.xml (the password is never printed)
  azprov imds [--imds URL] [--timeout SECS] [--json]
  azprov provision --root DIR [--iface IF] [--no-dhcp] [--media DEV]... [--ovf FILE] [--force]
                   [--timeout SECS] [--json] [--wireserver IP[:PORT]] [--imds URL]
  azprov dhcp [--iface IF] [--hostname NAME] [--timeout SECS] [--json] [--keep]
  azprov report ready [--wireserver IP[:PORT]] [--timeout SECS]
  azprov report failure --reason TEXT [--wireserver IP[:PORT]] [--timeout SECS]
  azprov version
exit codes: 0 ok, 1 failed (network, provisioning), 2 usage or bad input";

/// Why a command failed, and so its exit code.
#[derive(Debug)]
pub enum CliError {
    /// Wrong flags, a missing or malformed file: exit 2.
    Usage(String),
    /// The network or the fabric failed: exit 1.
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => f.write_str(m),
        }
    }
}

fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

/// Flags after the subcommand: `--name VALUE`, `--name=VALUE`, switches, and positionals.
#[derive(Debug, Default)]
pub struct Args {
    pub positional: Vec<String>,
    values: BTreeMap<&'static str, Vec<String>>,
    switches: Vec<&'static str>,
}

impl Args {
    pub fn parse(
        args: &[String],
        valued: &[&'static str],
        switches: &[&'static str],
    ) -> Result<Args, CliError> {
        let mut out = Args::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                out.positional.extend(it.by_ref().cloned());
                break;
            }
            let Some(name) = a.strip_prefix("--") else {
                out.positional.push(a.clone());
                continue;
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (name, None),
            };
            if let Some(flag) = valued.iter().find(|f| **f == name) {
                let v = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| usage(format!("--{name} needs a value")))?,
                };
                out.values.entry(flag).or_default().push(v);
            } else if let Some(flag) = switches.iter().find(|f| **f == name) {
                if inline.is_some() {
                    return Err(usage(format!("--{name} takes no value")));
                }
                out.switches.push(flag);
            } else {
                return Err(usage(format!("unknown option --{name}")));
            }
        }
        Ok(out)
    }

    pub fn value(&self, name: &str) -> Result<Option<&str>, CliError> {
        match self.values.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([v]) => Ok(Some(v)),
            Some(_) => Err(usage(format!("--{name} given more than once"))),
        }
    }

    pub fn values(&self, name: &str) -> &[String] {
        self.values.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn has(&self, name: &str) -> bool {
        self.switches.contains(&name)
    }

    pub fn timeout(&self, default: Duration) -> Result<Duration, CliError> {
        match self.value("timeout")? {
            None => Ok(default),
            Some(s) => parse_secs(s)
                .ok_or_else(|| usage(format!("--timeout: not a number of seconds: {s:?}"))),
        }
    }

    pub fn no_positionals(&self) -> Result<(), CliError> {
        match self.positional.first() {
            Some(p) => Err(usage(format!("unexpected argument {p:?}"))),
            None => Ok(()),
        }
    }
}

/// Seconds as `30` or `2.5`; positive and finite.
pub fn parse_secs(s: &str) -> Option<Duration> {
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v > 0.0 && v < 1e9).then(|| Duration::from_secs_f64(v))
}

/// Runs a subcommand (`args` excludes the program name).
pub fn run(args: &[String]) -> Result<(), CliError> {
    let Some((cmd, rest)) = args.split_first() else {
        return Err(usage(USAGE));
    };
    match cmd.as_str() {
        "ovf" => cmd_ovf(rest),
        "imds" => cmd_imds(rest),
        "dhcp" => cmd_dhcp(rest),
        "provision" => cmd_provision(rest),
        "report" => cmd_report(rest),
        "version" | "--version" => {
            Args::parse(rest, &[], &[])?.no_positionals()?;
            println!("azprov {}", crate::VERSION);
            Ok(())
        }
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(usage(format!(
            "unknown command {other:?} (azprov --help lists them)"
        ))),
    }
}

fn print_json<T: Serialize>(v: &T) -> Result<(), CliError> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| CliError::Failed(format!("JSON output: {e}")))?;
    println!("{s}");
    Ok(())
}

#[derive(Serialize)]
struct OvfJson<'a> {
    hostname: &'a str,
    username: &'a str,
    has_password: bool,
    disable_ssh_password_auth: Option<bool>,
    ssh_keys: Vec<&'a str>,
    custom_data_bytes: Option<usize>,
    preprovisioned_vm: bool,
    pps_type: Option<&'a str>,
}

fn cmd_ovf(args: &[String]) -> Result<(), CliError> {
    let a = Args::parse(args, &["device"], &["json"])?;
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
            match crate::azure::media::read_ovf(&[], &[dev.into()], deadline) {
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
        _ => return Err(usage("azprov ovf: give exactly one file, or --device DEV")),
    };
    let env = ovf::parse(&bytes).map_err(|e| usage(format!("{name}: {e}")))?;
    let out = OvfJson {
        hostname: &env.hostname,
        username: &env.username,
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
    };
    if a.has("json") {
        return print_json(&out);
    }
    println!("hostname: {}", out.hostname);
    println!("username: {}", out.username);
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
    Ok(())
}

fn opt<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
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

fn network_failure(what: &str, timeout: Duration, e: &HttpError) -> CliError {
    CliError::Failed(format!(
        "{what} failed within {}s: {e}",
        timeout.as_secs_f64()
    ))
}

fn imds_base(a: &Args) -> Result<String, CliError> {
    let base = a.value("imds")?.unwrap_or(imds::DEFAULT_BASE);
    if !base.starts_with("http://") && !base.starts_with("https://") {
        return Err(usage(format!(
            "--imds: expected an http:// URL, got {base:?}"
        )));
    }
    Ok(base.to_string())
}

fn wireserver_flag(a: &Args) -> Result<Option<std::net::SocketAddr>, CliError> {
    a.value("wireserver")?
        .map(wireserver::parse_endpoint)
        .transpose()
        .map_err(usage)
}

fn cmd_provision(args: &[String]) -> Result<(), CliError> {
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
        root: root.into(),
        iface: a.value("iface")?.map(str::to_string),
        dhcp: !a.has("no-dhcp"),
        media,
        force: a.has("force"),
        timeout: a.timeout(Duration::from_secs(300))?,
        wireserver: wireserver_flag(&a)?,
        imds: imds_base(&a)?,
        keep_network: false,
        sys: "/sys".into(),
        dev: "/dev".into(),
        cdrom_settle: Duration::ZERO,
    };
    let summary = provision(&opts);
    if a.has("json") {
        print_json(&summary)?;
    }
    match summary.exit_code() {
        0 => Ok(()),
        _ => Err(CliError::Failed(format!(
            "provisioning failed: {}",
            summary.reason.as_deref().unwrap_or("unknown")
        ))),
    }
}

fn cmd_imds(args: &[String]) -> Result<(), CliError> {
    let a = Args::parse(args, &["imds", "timeout"], &["json"])?;
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

fn cmd_report(args: &[String]) -> Result<(), CliError> {
    let a = Args::parse(args, &["wireserver", "timeout", "reason"], &[])?;
    let health = match a.positional.as_slice() {
        [k] if k == "ready" => {
            if a.value("reason")?.is_some() {
                return Err(usage("--reason goes with `report failure`"));
            }
            Health::Ready
        }
        [k] if k == "failure" => {
            let reason = a
                .value("reason")?
                .filter(|r| !r.trim().is_empty())
                .ok_or_else(|| usage("azprov report failure: --reason TEXT is required"))?;
            let vm_id = vmid::read(Path::new("/sys")).unwrap_or_else(|| "unknown".into());
            Health::Failed {
                description: wireserver::failure_description(
                    reason,
                    &vm_id,
                    &crate::time::now_rfc3339(),
                ),
            }
        }
        _ => {
            return Err(usage(
                "azprov report: say `ready` or `failure --reason TEXT`",
            ))
        }
    };
    let addr = wireserver_flag(&a)?
        .unwrap_or_else(|| std::net::SocketAddr::from((wireserver::DEFAULT_ADDR, 80)));
    let timeout = a.timeout(Duration::from_secs(60))?;
    let client = Client::new();
    let ws = WireServer {
        client: &client,
        addr,
    };
    let r = ws
        .report(&health, Deadline::after(timeout))
        .map_err(|e| network_failure("health report", timeout, &e))?;
    let state = if health == Health::Ready {
        "Ready"
    } else {
        "NotReady"
    };
    println!(
        "reported {state} to {addr} (incarnation {}, {} POST(s))",
        r.incarnation, r.posts
    );
    Ok(())
}

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

fn cmd_dhcp(args: &[String]) -> Result<(), CliError> {
    let a = Args::parse(args, &["iface", "hostname", "timeout"], &["json", "keep"])?;
    a.no_positionals()?;
    let timeout = a.timeout(Duration::from_secs(30))?;
    let class_net = Path::new(crate::net::link::SYS_CLASS_NET);
    let (nic, applied) = crate::net::run::bring_up(
        class_net,
        a.value("iface")?,
        a.value("hostname")?,
        Deadline::after(timeout),
    )
    .map_err(|e| match e {
        crate::net::run::DhcpError::Link(crate::net::link::LinkError::Unknown(_)) => {
            usage(e.to_string())
        }
        e => CliError::Failed(e.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn flags_in_both_forms() {
        let a = Args::parse(
            &s(&["ready", "--timeout=5", "--wireserver", "1.2.3.4"]),
            &["timeout", "wireserver"],
            &["json"],
        )
        .unwrap();
        assert_eq!(a.positional, ["ready"]);
        assert_eq!(a.value("timeout").unwrap(), Some("5"));
        assert_eq!(a.value("wireserver").unwrap(), Some("1.2.3.4"));
        assert!(!a.has("json"));
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for bad in [&["--nope"][..], &["--timeout"], &["--json=1"]] {
            let e = Args::parse(&s(bad), &["timeout"], &["json"]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        let a = Args::parse(&s(&["--timeout", "1", "--timeout", "2"]), &["timeout"], &[]).unwrap();
        assert!(a.value("timeout").is_err());
        assert!(a.timeout(Duration::from_secs(1)).is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_secs("2.5"), Some(Duration::from_millis(2500)));
        for bad in ["0", "-1", "x", "inf", "NaN", ""] {
            assert_eq!(parse_secs(bad), None, "{bad}");
        }
    }
}
