//! Power cuts at every point of a first boot: `azprov provision` is killed (SIGKILL, through
//! strace's fault injection) on entering its k-th rename, fsync, syncfs, mkdir, unlink,
//! connect, open or write, for every k the run reaches, and a second boot runs on the same root against a
//! healthy fabric. After every cut: Ready reached the fabric (from one boot or the other),
//! `clean --user` still knows the admin azprov created, no temporary is left, the account
//! files agree with each other (right after the cut too: each passwd and group entry with its
//! shadow and gshadow line), azprov's state directory is private and says Ready.

mod common;

use common::netns::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// The syscalls cut at, each set swept on its own (strace counts each syscall per thread).
const SETS: &[&str] = &[
    "rename,renameat,renameat2",
    "fsync,fdatasync,syncfs",
    "mkdir,mkdirat",
    "unlink,unlinkat,rmdir",
    "connect",
    "openat,open,creat",
    "write,writev,pwrite64",
];
/// No set needs more: a first boot makes at most a few dozen of each per thread.
const MAX_K: u32 = 400;

fn doc() -> Value {
    json!({
        "compute": {
            "location": "westeurope", "name": "n", "vmSize": "Standard_B1s",
            "osProfile": {"adminUsername": "azureuser", "computerName": "vm-cut",
                          "disablePasswordAuthentication": "true"},
            "publicKeys": [{"keyData": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2cut cut@test",
                            "path": "/home/azureuser/.ssh/authorized_keys"}],
            "userData": "IyEvYmluL3NoCmVjaG8gdXNlci1kYXRhCg==",
            "vmId": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
        },
        "network": {"interface": []},
        "extended": {"compute": {"hasCustomData": false, "ppsType": "None"}}
    })
}

fn lines_named(text: &str, name: &str) -> usize {
    text.lines()
        .filter(|l| l.split(':').next() == Some(name))
        .count()
}

/// Every entry of a primary account file with its line in the secondary (passwd in shadow,
/// group in gshadow), as login and grpck need them; what disagrees.
fn accounts_agree(root: &Path) -> Vec<String> {
    let names = |p: &str| -> Vec<String> {
        fs::read_to_string(root.join(p))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(':').next())
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut bad = Vec::new();
    for (primary, secondary) in [("etc/passwd", "etc/shadow"), ("etc/group", "etc/gshadow")] {
        let second = names(secondary);
        for name in names(primary) {
            if !second.contains(&name) {
                bad.push(format!(
                    "{primary} has {name}, {secondary} has no line for it"
                ));
            }
        }
    }
    bad
}

/// What must hold after a cut and a second boot; the failures found.
fn check(net: &Net, root: &Path, readies_before: usize, what: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let mut c = |ok: bool, msg: String| {
        if !ok {
            bad.push(format!("{what}: {msg}"));
        }
    };
    let readies = net
        .fabric_log()
        .iter()
        .filter(|e| e["endpoint"] == "health" && e["state"] == "Ready" && e["status"] == 200)
        .count();
    c(
        readies > readies_before,
        "Ready lost: no Ready reached the fabric".into(),
    );
    let text = |p: &str| fs::read_to_string(root.join(p)).unwrap_or_default();
    let passwd = text("etc/passwd");
    if lines_named(&passwd, "azureuser") == 1 {
        let r = root.to_str().unwrap();
        let o = net.azprov(&["clean", "--root", r, "--user", "--dry-run", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(json!({}));
        c(
            v["user"] == "azureuser",
            format!("admin kept by clean: {v}"),
        );
    }
    let group = text("etc/group");
    for disagreement in accounts_agree(root) {
        c(false, disagreement);
    }
    for l in passwd.lines() {
        let gid = l.split(':').nth(3).unwrap_or("");
        c(
            group.lines().any(|g| g.split(':').nth(2) == Some(gid)),
            format!("passwd names gid {gid} that group lacks"),
        );
    }
    let out = Command::new("find")
        .arg(root)
        .args(["-name", "*.azprov-tmp"])
        .output()
        .unwrap();
    c(
        out.stdout.is_empty(),
        format!("temporaries left: {}", String::from_utf8_lossy(&out.stdout)),
    );
    let mode = fs::metadata(root.join("var/lib/azprov"))
        .map(|m| m.mode() & 0o7777)
        .unwrap_or(0);
    c(mode == 0o700, format!("/var/lib/azprov is {mode:o}"));
    let state: Value =
        serde_json::from_str(&text("var/lib/azprov/state.json")).unwrap_or(json!({}));
    c(
        state["report"] == "ready",
        format!("state says {}", state["report"]),
    );
    bad
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_power_cut_anywhere_in_a_first_boot_loses_no_ready_and_no_admin() {
    require_privileges();
    let mut net = Net::new();
    net.dnsmasq(&[]);
    net.fabric(&doc(), &json!([]), &[]);
    let dmi = net.azure_dmi();
    let cmdline = net.cmdline("ro");
    let bin = common::bin();
    let (mut runs, mut cut, mut failures) = (0, 0, Vec::new());
    let mut per_set = Vec::new();
    for set in SETS {
        let cut_before = cut;
        for k in 1..=MAX_K {
            let root = net.path("root");
            let _ = fs::remove_dir_all(&root);
            let root = net.seed_root();
            let r = root.to_str().unwrap().to_string();
            let readies_before = net
                .fabric_log()
                .iter()
                .filter(|e| {
                    e["endpoint"] == "health" && e["state"] == "Ready" && e["status"] == 200
                })
                .count();
            let args = [
                "provision",
                "--root",
                &r,
                "--iface",
                "vm0",
                "--dmi",
                &dmi,
                "--cmdline",
                &cmdline,
                "--timeout",
                "20",
                "--keep-host-keys",
            ];
            let inject = format!("inject={set}:signal=SIGKILL:when={k}");
            let mut first: Vec<&str> = vec![
                "strace",
                "-f",
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                &inject,
                &bin,
            ];
            first.extend(args);
            let o = net.in_vm(&first);
            runs += 1;
            let killed = !o.status.success()
                && String::from_utf8_lossy(&o.stderr).contains("SIGKILL")
                || o.status.code().is_none()
                || o.status.code() == Some(137);
            if !killed {
                // the run made fewer than k of these calls: this set is swept
                assert!(
                    o.status.success(),
                    "{set} k={k}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                break;
            }
            cut += 1;
            // what the cut left, before anything repairs it
            failures.extend(
                accounts_agree(&root)
                    .into_iter()
                    .map(|d| format!("{set} k={k}, after the cut: {d}")),
            );
            let o = net.azprov(&args);
            runs += 1;
            if !o.status.success() {
                failures.push(format!(
                    "{set} k={k}: the second boot failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
                continue;
            }
            failures.extend(check(&net, &root, readies_before, &format!("{set} k={k}")));
        }
        per_set.push(format!("{set}: {}", cut - cut_before));
    }
    eprintln!(
        "cut points: {runs} runs, {cut} cuts ({}), {} failures",
        per_set.join("; "),
        failures.len()
    );
    assert!(cut > 60, "only {cut} cut points reached");
    assert!(failures.is_empty(), "{failures:#?}");
}
