//! The Metadata Security Protocol (docs/contracts.md, "The Metadata Security Protocol"): a VM
//! created with it (`ProvisionGuestProxyAgent` in the OVF) protects the WireServer and IMDS
//! with a key the Guest Proxy Agent (GPA, `azure-proxy-agent`) gets from the host in the
//! booted system; a report sent before GPA has it fails the VM with an internal error. So the
//! initramfs sends nothing for such a VM: it hands the network part of the run to
//! `azprov-msp.service`, enabled for this boot only, which waits for GPA as cloud-init does
//! (`azure-proxy-agent --status --wait 120`) and then asks IMDS and reports. A root without GPA
//! (or without the unit) gets a NotReady naming what is missing, before any IMDS request.

use super::options::Options;
use super::{Failure, Reason};
use crate::root::Sysroot;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where GPA's packages put its binary, in the root's view.
pub const PROXY_AGENT: [&str; 2] = ["/usr/sbin/azure-proxy-agent", "/usr/bin/azure-proxy-agent"];
/// The unit of azprov's packages that finishes an MSP VM's provisioning after GPA.
pub const UNIT: &str = "azprov-msp.service";
/// Where the root's systemd finds a unit a package ships, in its view.
const UNIT_DIRS: [&str; 3] = [
    "/etc/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
];
/// How long GPA is given to get its key, as cloud-init gives it (`--wait 120`).
pub const STATUS_WAIT: Duration = Duration::from_secs(120);
/// The most of GPA's output that goes into the cause (the description has 512 characters).
const MESSAGE_MAX: usize = 160;

/// What a run does about MSP, decided once the media is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msp {
    /// Not an MSP VM: provision as always (in the booted system's unit: nothing to do).
    Off,
    /// The initramfs, GPA and azprov's unit in the root: nothing is sent here; the unit,
    /// enabled for this boot, finishes after GPA.
    Defer,
    /// The run fails with this before any IMDS request, and reports it.
    Fail(Failure),
    /// The booted system's unit: GPA has its key, the run goes on.
    KeyHeld,
}

/// The decision for a run whose OVF says `flag` (`ProvisionGuestProxyAgent`). In the booted
/// system's unit (`opts.after_proxy_agent`) this waits for GPA.
pub fn decide(opts: &Options, root: &Sysroot, flag: bool) -> Msp {
    if !flag {
        return Msp::Off;
    }
    log::info!(
        "msp: the VM was created with the Metadata Security Protocol (ProvisionGuestProxyAgent)"
    );
    let Some(agent) = proxy_agent(root) else {
        return Msp::Fail(Failure::new(
            Reason::ProxyAgentNotFound,
            format!(
                "neither {} nor {} in the root",
                PROXY_AGENT[0], PROXY_AGENT[1]
            ),
        ));
    };
    if opts.after_proxy_agent {
        return match wait_for_key(&agent, STATUS_WAIT) {
            Ok(()) => Msp::KeyHeld,
            Err(f) => Msp::Fail(f),
        };
    }
    match unit(root) {
        Some(unit) => match enable_for_this_boot(opts, &unit) {
            Ok(link) => {
                log::info!(
                    "msp: {} finishes the provisioning after azure-proxy-agent in the booted system ({} enabled for this boot); nothing is sent from here",
                    UNIT,
                    link.display()
                );
                Msp::Defer
            }
            Err(e) => Msp::Fail(Failure::new(
                Reason::ProxyAgentUnit,
                format!("cannot enable {UNIT} for this boot: {e}"),
            )),
        },
        None => Msp::Fail(Failure::new(
            Reason::ProxyAgentUnit,
            format!("{UNIT} is in none of {}", UNIT_DIRS.join(", ")),
        )),
    }
}

/// GPA's binary in the root, as a host path.
fn proxy_agent(root: &Sysroot) -> Option<PathBuf> {
    PROXY_AGENT.iter().find_map(|p| {
        let host = root.resolve_full(p).ok()?;
        is_executable(&host).then_some(host)
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// azprov's unit in the root, in the root's own view (`/usr/lib/systemd/system/…`).
fn unit(root: &Sysroot) -> Option<String> {
    UNIT_DIRS
        .iter()
        .map(|d| format!("{d}/{UNIT}"))
        .find(|p| root.resolve_full(p).is_ok_and(|h| h.is_file()))
}

/// `systemctl enable --runtime` of the unit: a `multi-user.target.wants` link under /run (the
/// initramfs hands its /run to the booted system), so the unit runs on this boot only and no
/// other boot waits for the network before sshd.
fn enable_for_this_boot(opts: &Options, unit: &str) -> std::io::Result<PathBuf> {
    let run = opts
        .record_dir
        .as_deref()
        .and_then(Path::parent)
        .ok_or_else(|| std::io::Error::other("no /run to enable it in"))?;
    let wants = run.join("systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants)?;
    let link = wants.join(UNIT);
    match std::fs::remove_file(&link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(unit, &link)?;
    Ok(link)
}

/// `azure-proxy-agent --status --wait N`: 0 once GPA finished provisioning (it holds the key),
/// 1 when it has not after N s, 2 when it failed; anything else is a failure with GPA's exit
/// code and message. GPA bounds its own wait; a GPA that never answers is stopped by the
/// unit's start timeout (azprov-msp.service, 480 s).
pub fn wait_for_key(agent: &Path, wait: Duration) -> Result<(), Failure> {
    let t = Instant::now();
    log::info!(
        "msp: waiting for azure-proxy-agent's key ({} --status --wait {})",
        agent.display(),
        wait.as_secs()
    );
    let failure = |code: String, message: &str| {
        Failure::new(
            Reason::ProxyAgentStatus,
            format!(
                "exit {code}: {}",
                if message.is_empty() {
                    "no message"
                } else {
                    message
                }
            ),
        )
        .with("exit", code)
    };
    let out = Command::new(agent)
        .args(["--status", "--wait", &wait.as_secs().to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            failure(
                "none".into(),
                &format!("cannot run {}: {e}", agent.display()),
            )
        })?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    match out.status.code() {
        Some(0) => {
            log::info!(
                "msp: azure-proxy-agent holds its key ({} ms)",
                t.elapsed().as_millis()
            );
            Ok(())
        }
        Some(code) => Err(failure(code.to_string(), &one_line(&text))),
        None => Err(failure(
            "none".into(),
            format!("killed {}", one_line(&text)).trim(),
        )),
    }
}

/// GPA's output as one short line for the cause: whitespace folded, at most [`MESSAGE_MAX`]
/// characters, its end kept (where the error usually is).
fn one_line(text: &str) -> String {
    let folded: Vec<&str> = text.split_whitespace().collect();
    let line = folded.join(" ");
    let n = line.chars().count();
    if n <= MESSAGE_MAX {
        return line;
    }
    let tail: String = line.chars().skip(n - MESSAGE_MAX + 1).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("azprov-msp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn script(path: &Path, body: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn options(root: &Path, run: &Path, after: bool) -> Options {
        let (cfg, _) = crate::config::load(None, "");
        Options {
            record_dir: Some(run.join("azprov")),
            after_proxy_agent: after,
            ..Options::from_config(root.into(), &cfg, super::super::options::Mode::Hook)
        }
    }

    #[test]
    fn without_the_flag_nothing_is_looked_at() {
        let d = tmp("off");
        let opts = options(&d, &d.join("run"), false);
        assert_eq!(decide(&opts, &Sysroot::new(&d), false), Msp::Off);
        assert!(!d.join("run").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_root_without_the_proxy_agent_fails_naming_it() {
        let d = tmp("missing");
        // a directory or a file that is not executable is no agent
        std::fs::create_dir_all(d.join("usr/sbin/azure-proxy-agent")).unwrap();
        std::fs::create_dir_all(d.join("usr/bin")).unwrap();
        std::fs::write(d.join("usr/bin/azure-proxy-agent"), "").unwrap();
        let opts = options(&d, &d.join("run"), false);
        match decide(&opts, &Sysroot::new(&d), true) {
            Msp::Fail(f) => {
                assert_eq!(f.reason, Reason::ProxyAgentNotFound);
                assert!(
                    f.to_string().starts_with("azure-proxy-agent not found"),
                    "{f}"
                );
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_initramfs_defers_to_the_unit_enabled_for_this_boot_only() {
        let d = tmp("defer");
        let (root, run) = (d.join("root"), d.join("run"));
        script(&root.join("usr/sbin/azure-proxy-agent"), "exit 0");
        let opts = options(&root, &run, false);
        // GPA without azprov's unit (PID 1 with azprov not in the root): named
        match decide(&opts, &Sysroot::new(&root), true) {
            Msp::Fail(f) => assert_eq!(f.reason, Reason::ProxyAgentUnit),
            other => panic!("{other:?}"),
        }
        std::fs::create_dir_all(root.join("usr/lib/systemd/system")).unwrap();
        std::fs::write(root.join("usr/lib/systemd/system").join(UNIT), "[Unit]\n").unwrap();
        assert_eq!(decide(&opts, &Sysroot::new(&root), true), Msp::Defer);
        let link = run
            .join("systemd/system/multi-user.target.wants")
            .join(UNIT);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from("/usr/lib/systemd/system/azprov-msp.service")
        );
        // a second run (a reboot that still owes the Ready) replaces the link
        assert_eq!(decide(&opts, &Sysroot::new(&root), true), Msp::Defer);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_unit_waits_for_the_key_and_names_gpas_failure() {
        let d = tmp("wait");
        let agent = d.join("usr/sbin/azure-proxy-agent");
        let opts = options(&d, &d.join("run"), true);
        // GPA's command line as cloud-init uses it
        script(
            &agent,
            "[ \"$*\" = '--status --wait 120' ] || exit 9; echo provisioned",
        );
        assert_eq!(decide(&opts, &Sysroot::new(&d), true), Msp::KeyHeld);
        script(
            &agent,
            "echo 'Provision failed: key latch refused (403)' >&2; exit 2",
        );
        match decide(&opts, &Sysroot::new(&d), true) {
            Msp::Fail(f) => {
                assert_eq!(f.reason, Reason::ProxyAgentStatus);
                assert_eq!(
                    f.to_string(),
                    "azure-proxy-agent status failure: exit 2: Provision failed: key latch refused (403)"
                );
                assert_eq!(f.extra, [("exit", "2".to_string())]);
            }
            other => panic!("{other:?}"),
        }
        script(&agent, "echo not yet; exit 1");
        let f = wait_for_key(&agent, Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            f.to_string(),
            "azure-proxy-agent status failure: exit 1: not yet"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_long_message_keeps_its_end() {
        let s = one_line(&format!("{}\n  the end", "x".repeat(400)));
        assert_eq!(s.chars().count(), MESSAGE_MAX);
        assert!(s.ends_with("x the end") && s.starts_with('…'));
    }
}
