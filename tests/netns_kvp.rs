//! KVP end to end: what `azprov provision` leaves in the root's guest pool, read by readers no
//! one here wrote (Debian's hv_kvp_daemon through a fake kernel, cloud-init's
//! HyperVKvpReportingHandler; tests/kvp_readers.py), for each outcome; and azprov's responder
//! against Debian's daemon under one fake kernel's transcript.

mod common;

use azprov::azure::kvp::responder::{Opener, Pools, Responder};
use azprov::root::kvp::{BootClock, Freshness};
use azprov::root::Sysroot;
use common::netns::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";
const VM_ID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const READERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kvp_readers.py");

fn doc(computer: &str) -> Value {
    json!({
        "compute": {
            "location": "westeurope", "name": computer, "vmSize": "Standard_B1s",
            "osProfile": {"adminUsername": "azureuser", "computerName": computer, "disablePasswordAuthentication": "true"},
            "publicKeys": [{"keyData": KEY, "path": "/home/azureuser/.ssh/authorized_keys"}],
            "userData": "", "customData": "", "vmId": VM_ID
        },
        "network": {"interface": []},
        "extended": {"compute": {"hasCustomData": false, "ppsType": "None"}}
    })
}

/// The fabric's namespace with the simulated fabric for `computer` (and dnsmasq with `dhcp`),
/// and a seeded root.
fn setup(computer: &str, dhcp: bool) -> (Net, std::path::PathBuf) {
    let mut net = Net::new();
    if dhcp {
        net.dnsmasq(&[]);
    }
    net.fabric(&doc(computer), &json!([]), &[]);
    let root = net.seed_root();
    (net, root)
}

fn readers(args: &[&str]) -> Value {
    let o = Command::new("python3")
        .arg(READERS)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "kvp_readers.py {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The guest pool as both foreign readers see it; they must agree.
fn guest_pool(root: &Path) -> Vec<(String, String)> {
    let dir = root.join("var/lib/hyperv");
    let file = dir.join(".kvp_pool_1");
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(bytes.len() % 2560, 0, "whole 2,560-byte records");
    let cloud_init = readers(&["cloud-init", file.to_str().unwrap()]);
    // the daemon on a copy: the transcript sets into pools 0 and 3
    let copy = root.join("kvp-copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(&file, copy.join(".kvp_pool_1")).unwrap();
    let daemon = readers(&["daemon", copy.to_str().unwrap()]);
    let swept = &daemon[0];
    assert_eq!(swept[0], "enumerate 1");
    assert_eq!(swept[2], 0x8007_0103u32, "the sweep ends with HV_S_CONT");
    assert_eq!(
        swept[1], cloud_init,
        "hv_kvp_daemon and cloud-init disagree"
    );
    serde_json::from_value(cloud_init).unwrap()
}

/// The one PROVISIONING_REPORT's value.
fn report(pool: &[(String, String)]) -> String {
    let r: Vec<&String> = pool
        .iter()
        .filter(|(k, _)| k == "PROVISIONING_REPORT")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(r.len(), 1, "one PROVISIONING_REPORT: {pool:?}");
    assert!(r[0].len() <= 1022);
    r[0].clone()
}

fn provision(net: &Net, root: &Path, extra: &[&str]) -> Value {
    let dmi = net.azure_dmi();
    let cmdline = net.cmdline("root=/dev/sda1 ro");
    let mut args = vec![
        "provision",
        "--root",
        root.to_str().unwrap(),
        "--json",
        "--dmi",
        &dmi,
        "--cmdline",
        &cmdline,
        "--iface",
        "vm0",
    ];
    if !extra.contains(&"--timeout") {
        args.extend(["--timeout", "8"]);
    }
    args.extend(extra);
    let o = net.azprov(&args);
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&o.stderr)))
}

fn health_descriptions(net: &Net) -> Vec<String> {
    net.fabric_log()
        .into_iter()
        .filter(|e| e["endpoint"] == "health")
        .filter_map(|e| e["description"].as_str().map(str::to_string))
        .collect()
}

/// `k=v` fields of an encoded report (no quoting in these cases' values).
fn field<'a>(report: &'a str, key: &str) -> Option<&'a str> {
    report
        .split('|')
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn every_outcome_leaves_one_report_both_readers_read() {
    require_privileges();
    // Ready
    let (net, root) = setup("vm-kvp", true);
    // a stale pool from the image's build: dropped
    std::fs::create_dir_all(root.join("var/lib/hyperv")).unwrap();
    let stale = root.join("var/lib/hyperv/.kvp_pool_1");
    std::fs::write(&stale, [b'x'; 2560 * 2]).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1))
        .unwrap();
    let v = provision(&net, &root, &[]);
    assert_eq!(v["report"], "ready");
    let pool = guest_pool(&root);
    assert_eq!(pool.len(), 1, "{pool:?}");
    let r = report(&pool);
    assert!(r.starts_with("result=success|agent=azprov/"), "{r}");
    assert_eq!(field(&r, "vm_id"), Some(VM_ID));
    assert!(
        field(&r, "timestamp").is_some_and(|t| t.ends_with('Z')),
        "{r}"
    );
    let meta = std::fs::metadata(&stale).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.mode() & 0o7777, 0o644);
    drop(net);

    // NotReady for a provisioning failure: the same reason the fabric received
    let (net, root) = setup("bad_host!", true);
    let v = provision(&net, &root, &[]);
    assert_eq!(v["report"], "failure");
    let r = report(&guest_pool(&root));
    let posted = health_descriptions(&net);
    assert_eq!(posted.len(), 1);
    assert_eq!(field(&r, "result"), Some("error"));
    assert_eq!(field(&r, "reason"), Some("invalid hostname"));
    assert_eq!(field(&r, "reason"), field(&posted[0], "reason"));
    assert_eq!(field(&r, "timestamp"), field(&posted[0], "timestamp"));
    assert_eq!(
        field(&r, "documentation_url"),
        Some("https://aka.ms/linuxprovisioningerror")
    );
    drop(net);

    // the WireServer unreachable (nothing listens on its port): the provisioning's outcome
    // is in KVP though no POST arrived
    let (net, root) = setup("vm-nows", true);
    let v = provision(&net, &root, &["--wireserver", "168.63.129.16:81"]);
    assert_eq!(v["report"], "pending");
    assert!(health_descriptions(&net).is_empty());
    let r = report(&guest_pool(&root));
    assert!(r.starts_with("result=success|agent=azprov/"), "{r}");
    drop(net);

    // no DHCP: the lease's reason, with no network at all
    let (net, root) = setup("vm-nodhcp", false);
    let v = provision(&net, &root, &["--timeout", "4"]);
    assert_eq!(v["reason"], "failure to obtain DHCP lease");
    assert!(net.fabric_log().is_empty());
    let r = report(&guest_pool(&root));
    assert_eq!(field(&r, "reason"), Some("failure to obtain DHCP lease"));
    assert_eq!(field(&r, "stage"), Some("dhcp"));
}

/// A connection to the fake kernel's socket standing for the device, opened anew on each
/// (re-)registration.
fn seqpacket_opener(path: std::path::PathBuf) -> Opener {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    Box::new(move || {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        connect(fd.as_raw_fd(), &UnixAddr::new(&path)?)?;
        Ok(std::fs::File::from(fd))
    })
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn the_responder_answers_as_debians_daemon_does() {
    require_privileges();
    let (net, root) = setup("vm-kvp2", true);
    assert_eq!(provision(&net, &root, &[])["report"], "ready");
    // the root's pools as the run loads them, and a host pool from an earlier boot
    let dir = root.join("var/lib/hyperv");
    let host = azprov::azure::kvp::emit_pool(&[azprov::azure::kvp::Record::new("Kept", "yes")]);
    std::fs::write(dir.join(".kvp_pool_3"), host).unwrap();
    let sysroot = Sysroot::new(&root);
    let clock = BootClock::read();
    let mut pools = Pools::default();
    pools[0] = sysroot.read_kvp(0, Freshness::Any, clock);
    pools[1] = sysroot.read_kvp(1, Freshness::ThisBoot, clock);
    pools[3] = sysroot.read_kvp(3, Freshness::Any, clock);
    let copy = root.join("kvp-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for n in [1, 3] {
        let f = format!(".kvp_pool_{n}");
        std::fs::copy(dir.join(&f), copy.join(&f)).unwrap();
    }
    let daemon = readers(&["daemon", copy.to_str().unwrap()]);

    let sock = root.join("kvp.sock");
    let mut kernel = Command::new("python3")
        .arg(READERS)
        .args(["kernel", sock.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(kernel.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "listening");
    let responder = Responder::start(seqpacket_opener(sock), pools).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(kernel.wait().unwrap().success());
    drop(responder);
    let ours: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ours, daemon);
    // what the transcript checks is there to check
    assert_eq!(ours[0][1][0][0], "PROVISIONING_REPORT");
    assert_eq!(ours[2][1], json!([["Kept", "yes"]]));
    assert_eq!(ours.as_array().unwrap().len(), 13);
}
