//! A VM created with the Metadata Security Protocol, end to end in network namespaces: the
//! fabric hands out the key as Azure's host does (testbed/fabric.py --msp) and records when
//! it was latched; the Guest Proxy Agent is the tests' stand-in (testbed/gpa), installed into
//! the temporary root, keeping the real agent's command line. The initramfs run sends nothing
//! for such a VM and enables `azprov-msp.service` for the boot; the booted system's run
//! (`--after-proxy-agent`) waits for the agent and then asks IMDS and reports.

mod common;

use common::netns::*;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const MSP_OVF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ovf/msp.xml");
const STANDIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testbed/gpa/azure-proxy-agent");
const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/initramfs/systemd/azprov-msp.service"
);
const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";
const VM_ID: &str = "7d6c5b4a-3928-4716-a5b4-c3d2e1f00f1e";

fn doc() -> Value {
    json!({
        "compute": {
            "location": "westeurope", "name": "vm-msp", "vmSize": "Standard_B1s",
            "osProfile": {"adminUsername": "mspuser", "computerName": "vm-msp", "disablePasswordAuthentication": "true"},
            "publicKeys": [{"keyData": KEY, "path": "/home/mspuser/.ssh/authorized_keys"}],
            "userData": "", "customData": "", "vmId": VM_ID
        },
        "network": {"interface": []},
        "extended": {"compute": {"hasCustomData": false, "ppsType": "None"}}
    })
}

/// A fabric (with `fabric_args`) and a seeded root; with `gpa`, the stand-in agent and
/// azprov's unit in it, as the packages put them.
fn setup(fabric_args: &[&str], gpa: bool) -> (Net, PathBuf) {
    let mut net = Net::new();
    net.dnsmasq(&[]);
    net.fabric(&doc(), &json!([]), fabric_args);
    let root = net.seed_root();
    if gpa {
        install(STANDIN, &root.join("usr/sbin/azure-proxy-agent"));
        install(
            UNIT,
            &root.join("usr/lib/systemd/system/azprov-msp.service"),
        );
    }
    (net, root)
}

fn install(from: &str, to: &Path) {
    fs::create_dir_all(to.parent().unwrap()).unwrap();
    fs::copy(from, to).unwrap();
}

/// `azprov provision` into `root` with this test's DMI, command line and run directory.
fn provision(net: &Net, root: &Path, extra: &[&str]) -> (Output, Value) {
    let (r, dmi) = (root.to_str().unwrap().to_string(), net.azure_dmi());
    let cmdline = net.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro");
    let run = run_dir(net);
    let mut args = vec![
        "provision",
        "--root",
        &r,
        "--json",
        "--dmi",
        &dmi,
        "--cmdline",
        &cmdline,
        "--iface",
        "vm0",
        "--ovf",
        MSP_OVF,
        "--run-dir",
        &run,
    ];
    if !extra.contains(&"--timeout") {
        args.extend(["--timeout", "20"]);
    }
    args.extend(extra);
    let o = net.azprov(&args);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (o, v)
}

/// This test's /run/azprov (never the host's: the run enables a unit under its parent).
fn run_dir(net: &Net) -> String {
    net.path("run/azprov").display().to_string()
}

fn runtime_link(net: &Net) -> PathBuf {
    net.path("run/systemd/system/multi-user.target.wants/azprov-msp.service")
}

/// The booted system: its network up (the image's own client stands in as `azprov dhcp
/// --keep`), and the agent's service latching its key.
fn boot_the_system(net: &Net, root: &Path) -> Child {
    let o = net.azprov(&["dhcp", "--iface", "vm0", "--keep", "--timeout", "20"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let agent = root.join("usr/sbin/azure-proxy-agent");
    Command::new("ip")
        .args(["netns", "exec", &net.vm, agent.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn stop(mut agent: Child, root: &Path) {
    let _ = agent.kill();
    let _ = agent.wait();
    // its `sleep infinity`, in the agent's process group no more
    let _ = Command::new("pkill")
        .args(["-f", &format!("{}", root.display())])
        .status();
}

/// The fabric's requests other than the agent's own (/secure-channel/...).
fn azprov_requests(net: &Net) -> Vec<Value> {
    net.fabric_log()
        .into_iter()
        .filter(|e| {
            !e["path"]
                .as_str()
                .unwrap_or("")
                .starts_with("/secure-channel/")
        })
        .collect()
}

fn health(net: &Net) -> Vec<Value> {
    net.fabric_log()
        .into_iter()
        .filter(|e| e["endpoint"] == "health")
        .collect()
}

fn state(root: &Path) -> Value {
    serde_json::from_slice(&fs::read(root.join("var/lib/azprov/state.json")).unwrap()).unwrap()
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn without_the_proxy_agent_notready_names_it_before_any_imds_request() {
    require_privileges();
    let (net, root) = setup(&["--msp"], false);
    let (o, v) = provision(&net, &root, &[]);
    assert!(!o.status.success());
    assert_eq!(
        (v["report"].clone(), v["reason"].clone(), v["msp"].clone()),
        (
            json!("failure"),
            json!("azure-proxy-agent not found"),
            json!(true)
        ),
        "{v}"
    );
    assert!(v["hint"].as_str().unwrap().contains("Guest Proxy Agent"));
    let posts = health(&net);
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["state"], "NotReady");
    let d = posts[0]["description"].as_str().unwrap();
    assert!(d.contains("reason=azure-proxy-agent not found"), "{d}");
    assert!(
        net.fabric_log().iter().all(|e| e["server"] != "imds"),
        "IMDS was asked"
    );
    assert!(!root.join("var/lib/azprov/provisioned").exists());
    // status says why, with what to do
    let r = root.to_str().unwrap();
    let s = net.azprov(&["status", "--root", r]);
    let text = String::from_utf8_lossy(&s.stdout);
    assert!(text.contains("msp:            yes"), "{text}");
    assert!(text.contains("put the Guest Proxy Agent"), "{text}");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn with_the_proxy_agent_everything_is_asked_after_its_key() {
    require_privileges();
    let (net, root) = setup(&["--msp"], true);
    // the initramfs: nothing sent, the unit enabled for this boot
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(v["report"], "deferred", "{v}");
    assert_eq!(net.fabric_log(), Vec::<Value>::new());
    assert_eq!(
        fs::read_link(runtime_link(&net)).unwrap(),
        PathBuf::from("/usr/lib/systemd/system/azprov-msp.service")
    );
    assert!(!root.join("var/lib/azprov/provisioned").exists());
    let st = state(&root);
    assert_eq!(
        (st["msp"].clone(), st["report"].clone()),
        (json!(true), Value::Null)
    );
    assert_eq!(
        st["host_keys_vm_id"],
        Value::Null,
        "no VM id is known before IMDS"
    );

    // the booted system: the agent latches its key, then azprov-msp.service runs
    let agent = boot_the_system(&net, &root);
    let (o, v) = provision(&net, &root, &["--after-proxy-agent"]);
    stop(agent, &root);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        (
            v["report"].clone(),
            v["hostname"].clone(),
            v["ssh_keys"].clone()
        ),
        (json!("ready"), json!("vm-msp"), json!(1)),
        "{v}"
    );
    let asked = azprov_requests(&net);
    assert!(asked.iter().any(|e| e["server"] == "imds"), "{asked:?}");
    let early: Vec<&Value> = asked.iter().filter(|e| e["msp_key"] != true).collect();
    assert!(early.is_empty(), "asked before the key: {early:?}");
    let posts = health(&net);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["state"], "Ready");
    assert!(
        fs::read_to_string(root.join("home/mspuser/.ssh/authorized_keys"))
            .unwrap()
            .contains(KEY)
    );
    assert!(root.join("var/lib/azprov/provisioned").exists());
    assert_eq!(state(&root)["report"], "ready");

    // the next boot owes nothing: nothing sent, the unit not enabled again
    fs::remove_file(runtime_link(&net)).unwrap();
    let before = net.fabric_log().len();
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success());
    assert_eq!(v["report"], "skipped");
    assert_eq!(net.fabric_log().len(), before);
    assert!(fs::symlink_metadata(runtime_link(&net)).is_err());
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_refused_key_is_reported_with_the_agents_exit_code_and_message() {
    require_privileges();
    let (net, root) = setup(&["--msp", "--msp-refuse-key"], true);
    let (_, v) = provision(&net, &root, &[]);
    assert_eq!(v["report"], "deferred");
    let agent = boot_the_system(&net, &root);
    let (o, v) = provision(&net, &root, &["--after-proxy-agent"]);
    stop(agent, &root);
    assert!(!o.status.success());
    assert_eq!(v["reason"], "azure-proxy-agent status failure", "{v}");
    let cause = v["cause"].as_str().unwrap();
    assert!(
        cause.contains("exit 2") && cause.contains("key latch refused"),
        "{cause}"
    );
    let posts = health(&net);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["state"], "NotReady");
    let d = posts[0]["description"].as_str().unwrap();
    assert!(d.contains("exit=2"), "{d}");
    assert!(net.fabric_log().iter().all(|e| e["server"] != "imds"));
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_ready_owed_on_a_later_boot_waits_for_the_agent_too() {
    require_privileges();
    let (mut net, root) = setup(&["--msp"], true);
    provision(&net, &root, &[]);
    let agent = boot_the_system(&net, &root);
    // the WireServer takes no report on this boot: Ready is owed
    net.restart_fabric_with(
        &doc(),
        &json!([{"endpoint": "health", "status": 503}]),
        &["--msp"],
    );
    let (_, v) = provision(&net, &root, &["--after-proxy-agent", "--timeout", "8"]);
    assert_eq!(v["report"], "pending", "{v}");
    assert_eq!(state(&root)["report"], "pending");
    net.restart_fabric_with(&doc(), &json!([]), &["--msp"]);
    let before = net.fabric_log().len();
    // the initramfs of the next boot sends nothing, and enables the unit again
    fs::remove_file(runtime_link(&net)).unwrap();
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success());
    assert_eq!(v["report"], "deferred", "{v}");
    assert_eq!(
        net.fabric_log().len(),
        before,
        "the initramfs sent something"
    );
    assert!(fs::symlink_metadata(runtime_link(&net)).is_ok());
    // the unit, after the agent (its key is latched again by the new fabric's agent run)
    let (o, v) = provision(&net, &root, &["--after-proxy-agent"]);
    stop(agent, &root);
    assert!(o.status.success(), "{v}");
    assert_eq!(v["report"], "ready");
    assert_eq!(state(&root)["report"], "ready");
    let posts = health(&net);
    assert_eq!(posts.last().unwrap()["state"], "Ready");
}
