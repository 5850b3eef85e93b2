//! The CLI contract: exact JSON keys, exit codes, one-line errors, no secrets printed.

mod common;

use common::*;
use serde_json::Value;
use std::process::{Command, Output};

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn azprov(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        // A proxy that would swallow every request: azprov must ignore it.
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("http_proxy", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9")
        .output()
        .unwrap()
}

fn json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort();
    k
}

fn one_line_error(o: &Output, code: i32, needle: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

/// `azprov disks` on a Gen2 VM's sysfs (tests/fixtures/sysfs/gen2: the OS and resource disks
/// and the CD on scsi0, a data disk on scsi1, a local NVMe v2 disk) and as udev imports it.
#[test]
fn disks_names_both_schemes_and_udev_imports_them() {
    let sys = format!("{FIX}/sysfs/gen2");
    let v = json(&azprov(&["disks", "--sys", &sys, "--json"]));
    let got: Vec<(String, String, Value, Vec<String>)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let links = d["links"].as_array().unwrap();
            (
                d["name"].as_str().unwrap().to_string(),
                d["type"].as_str().unwrap().to_string(),
                d["lun"].clone(),
                links
                    .iter()
                    .map(|l| l.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect();
    let l =
        |n: &[&str]| -> Vec<String> { n.iter().map(|n| format!("/dev/disk/azure/{n}")).collect() };
    assert_eq!(
        got,
        [
            (
                "nvme0n1".into(),
                "local".into(),
                Value::Null,
                l(&["local/by-serial/6f1e2d3c4b5a"])
            ),
            ("sda".into(), "os".into(), Value::Null, l(&["root", "os"])),
            (
                "sdb".into(),
                "resource".into(),
                Value::Null,
                l(&["resource"])
            ),
            (
                "sdc".into(),
                "data".into(),
                serde_json::json!(3),
                l(&["scsi1/lun3", "data/by-lun/3"])
            ),
        ]
    );
    let udev = |name: &str, cmdline: &str| {
        let dir = std::env::temp_dir().join(format!("azprov-cli-disks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(format!("cmdline-{name}"));
        std::fs::write(&f, cmdline).unwrap();
        let o = azprov(&[
            "disks",
            "--sys",
            &sys,
            "--udev",
            name,
            "--cmdline",
            f.to_str().unwrap(),
        ]);
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(
        udev("sda2", ""),
        "AZPROV_DISK_LINKS=\"disk/azure/root-part2 disk/azure/os-part2\"\n"
    );
    // the SCSI resource disk is the resource disk (the local NVMe disk is not, beside it)
    assert_eq!(
        udev("sdb", ""),
        "AZPROV_DISK_LINKS=\"disk/azure/resource\"\nAZPROV_RESOURCE_DISK=1\n"
    );
    assert_eq!(
        udev("nvme0n1", ""),
        "AZPROV_DISK_LINKS=\"disk/azure/local/by-serial/6f1e2d3c4b5a\"\n"
    );
    assert_eq!(
        udev("sdb", "azprov.resourcedisk=off"),
        "AZPROV_DISK_LINKS=\"disk/azure/resource\"\n"
    );
    assert_eq!(udev("sr0", ""), "");
    // a missing tree is a usage error naming it
    let o = azprov(&["disks", "--sys", "/nonexistent/sys"]);
    one_line_error(&o, 2, "/nonexistent/sys");
}

#[test]
fn ovf_json_has_exactly_the_contract_keys() {
    let v = json(&azprov(&["ovf", &format!("{FIX}/ovf/wala.xml"), "--json"]));
    assert_eq!(
        keys(&v),
        [
            "custom_data_bytes",
            "disable_ssh_password_auth",
            "has_password",
            "hostname",
            "pps_type",
            "preprovisioned_vm",
            "provision_guest_proxy_agent",
            "ssh_keys",
            "username"
        ]
    );
    assert_eq!(v["provision_guest_proxy_agent"], false);
    let msp = json(&azprov(&["ovf", &format!("{FIX}/ovf/msp.xml"), "--json"]));
    assert_eq!(msp["provision_guest_proxy_agent"], true);
    // a confidential VM's sealed password is named, not measured, and never printed
    let o = azprov(&[
        "ovf",
        &format!("{FIX}/ovf/protected-password.xml"),
        "--json",
    ]);
    one_line_error(
        &o,
        2,
        "UserPassword is a confidential VM's protected secret",
    );
    assert!(!String::from_utf8_lossy(&o.stderr).contains("length"));
    assert_eq!(v["hostname"], "vm-wala");
    assert_eq!(v["username"], "azureuser");
    assert_eq!(v["has_password"], true);
    assert_eq!(v["disable_ssh_password_auth"], false);
    assert_eq!(
        v["ssh_keys"],
        serde_json::json!(["ssh-rsa AAAANOTAREALKEY== foo@bar.local"])
    );
    assert_eq!(v["custom_data_bytes"], 33);
    assert_eq!(v["preprovisioned_vm"], false);
    assert_eq!(v["pps_type"], Value::Null);

    let v = json(&azprov(&[
        "ovf",
        &format!("{FIX}/ovf/mixed-crlf-bom.xml"),
        "--json",
    ]));
    assert_eq!(v["has_password"], false);
    assert_eq!(v["disable_ssh_password_auth"], Value::Null);
    assert_eq!(v["pps_type"], "None");
    assert_eq!(v["custom_data_bytes"], 13);
}

#[test]
fn ovf_never_prints_the_password() {
    for args in [vec!["ovf", "W"], vec!["ovf", "W", "--json"]] {
        let f = format!("{FIX}/ovf/wala.xml");
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "W" { f.as_str() } else { a })
            .collect();
        let o = azprov(&args);
        assert!(o.status.success());
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!all.contains("S3cr3t"), "{all}");
        assert!(!all.contains("cloud-config"), "{all}");
    }
}

#[test]
fn bad_input_exits_2_with_one_line() {
    one_line_error(
        &azprov(&["ovf", "/nonexistent/ovf-env.xml"]),
        2,
        "/nonexistent/ovf-env.xml",
    );
    one_line_error(
        &azprov(&["ovf", &format!("{FIX}/ovf/not-xml.xml")]),
        2,
        "not well-formed XML",
    );
    one_line_error(
        &azprov(&["ovf", &format!("{FIX}/ovf/not-azure.xml")]),
        2,
        "ProvisioningSection",
    );
    one_line_error(
        &azprov(&["ovf", &format!("{FIX}/ovf/no-hostname.xml")]),
        2,
        "HostName",
    );
    one_line_error(
        &azprov(&["ovf", &format!("{FIX}/ovf/long-password.xml")]),
        2,
        "password length=73",
    );
    one_line_error(
        &azprov(&["ovf", &format!("{FIX}/ovf/duplicate-hostname.xml")]),
        2,
        "more than one HostName",
    );
    one_line_error(&azprov(&["ovf", FIX]), 2, FIX);
    one_line_error(&azprov(&["ovf"]), 2, "ovf-env.xml");
    one_line_error(&azprov(&["imds", "--bogus"]), 2, "--bogus");
    one_line_error(&azprov(&["imds", "--timeout", "soon"]), 2, "--timeout");
    one_line_error(&azprov(&["report", "failure"]), 2, "--reason");
    // without the tls feature an https:// IMDS is refused at once, not after retries
    one_line_error(
        &azprov(&["imds", "--imds", "https://127.0.0.1:9", "--timeout", "30"]),
        2,
        "no TLS",
    );
    one_line_error(
        &azprov(&["report", "ready", "--wireserver", "nowhere"]),
        2,
        "nowhere",
    );
    one_line_error(&azprov(&["frobnicate"]), 2, "frobnicate");
    // a root that is not there is a usage error, not "not provisioned" (exit 1)
    one_line_error(
        &azprov(&["status", "--root", "/nonexistent/root"]),
        2,
        "/nonexistent/root",
    );
}

#[test]
fn imds_json_against_a_local_server_ignoring_http_proxy() {
    let s = Server::start(vec![answer(429, ""), answer(200, &imds_doc())]);
    let v = json(&azprov(&[
        "imds",
        "--imds",
        &format!("http://{}", s.addr),
        "--timeout",
        "20",
        "--json",
    ]));
    assert_eq!(
        keys(&v),
        [
            "admin_username",
            "computer_name",
            "disable_password_auth",
            "location",
            "ssh_keys",
            "user_data_bytes",
            "vm_id",
            "vm_size"
        ]
    );
    assert_eq!(v["vm_id"], "12345678-90ab-cdef-1234-567890abcdef");
    assert_eq!(v["computer_name"], "temp-vm");
    assert_eq!(v["admin_username"], "azureuser");
    assert_eq!(v["disable_password_auth"], true);
    assert_eq!(
        v["ssh_keys"][0],
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7== azureuser@temp-vm"
    );
    assert_eq!(v["user_data_bytes"], 21);
    assert_eq!(v["location"], "eastus2");
    assert_eq!(v["vm_size"], "Standard_D2ds_v5");
    assert_eq!(s.requests().len(), 2);
    assert_eq!(s.requests()[0].header("Metadata"), Some("true"));
}

#[test]
fn imds_network_failure_exits_1() {
    let s = Server::start(vec![answer(503, "")]);
    let o = azprov(&[
        "imds",
        "--imds",
        &format!("http://{}", s.addr),
        "--timeout",
        "0.5",
    ]);
    one_line_error(&o, 1, "503");
    let s = Server::start(vec![answer(403, "")]);
    let o = azprov(&["imds", "--imds", &format!("http://{}", s.addr)]);
    one_line_error(&o, 1, "403");
}

#[test]
fn report_ready_and_failure() {
    let s = Server::start(vec![
        goal_state(9),
        answer(200, ""),
        goal_state(9),
        answer(201, ""),
    ]);
    let ws = s.addr.to_string();
    let o = azprov(&["report", "ready", "--wireserver", &ws]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = azprov(&[
        "report",
        "failure",
        "--reason",
        "failed to write authorized_keys & <more>",
        "--wireserver",
        &ws,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reqs = s.requests();
    assert_eq!(reqs.len(), 4);
    let ready = String::from_utf8(reqs[1].body.clone()).unwrap();
    assert!(ready.contains("<State>Ready</State>") && ready.contains("<GoalStateIncarnation>9<"));
    let failed = String::from_utf8(reqs[3].body.clone()).unwrap();
    assert!(failed.contains("<State>NotReady</State>"), "{failed}");
    assert!(failed.contains("<SubStatus>ProvisioningFailed</SubStatus>"));
    // the reason is the fixed one; the operator's words follow as detail=, escaped
    assert!(
        failed.contains("result=error|reason=reported by operator|agent=azprov/"),
        "{failed}"
    );
    assert!(
        failed.contains("|detail=failed to write authorized_keys &amp; &lt;more&gt;|vm_id="),
        "{failed}"
    );
}

#[test]
fn report_network_failure_exits_1() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = azprov(&[
        "report",
        "ready",
        "--wireserver",
        &format!("127.0.0.1:{port}"),
        "--timeout",
        "0.5",
    ]);
    one_line_error(&o, 1, "health report failed");
}

#[test]
fn version() {
    let o = azprov(&["version"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("azprov {}", env!("CARGO_PKG_VERSION"))
    );
}

/// README's synopsis is the binary's usage text, word for word.
#[test]
fn the_readme_synopsis_is_the_usage_text() {
    let o = std::process::Command::new(common::bin())
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success());
    let usage = String::from_utf8(o.stdout).unwrap();
    let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"));
    let block = readme
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("README.md has a ```text block with the synopsis");
    assert_eq!(
        block.trim_end(),
        usage.trim_end(),
        "README.md's synopsis differs from `azprov --help`"
    );
}

/// Every command has `--help` with its flags, one line each; `-V` is the version; an error
/// carries one `azprov:` prefix; `ovf` refuses what `provision` would refuse.
#[test]
fn each_command_has_help_and_the_cli_speaks_as_tools_do() {
    for cmd in [
        "provision",
        "status",
        "clean",
        "ovf",
        "imds",
        "dhcp",
        "report",
        "version",
    ] {
        let o = azprov(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd} --help");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.starts_with("usage: azprov "), "{cmd}: {out}");
        assert!(out.contains("-h, --help"), "{cmd}: {out}");
    }
    let o = azprov(&["provision", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--root DIR",
        "--no-dhcp",
        "--keep-host-keys",
        "--run-dir DIR",
    ] {
        assert!(
            out.lines().any(|l| l.trim_start().starts_with(flag)),
            "{flag}: {out}"
        );
    }
    let o = azprov(&["-V"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("azprov "));
    let o = azprov(&["provision"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("azprov").count(), 1, "{err}");

    let wala = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ovf/wala.xml"
    ))
    .unwrap();
    let dir = std::env::temp_dir().join(format!("azprov-cli-ovf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to, needle) in [
        (
            "<HostName>vm-wala",
            "<HostName>bad_host name!",
            "invalid hostname",
        ),
        ("<UserName>azureuser", "<UserName>root", "invalid username"),
    ] {
        assert!(wala.contains(from));
        let f = dir.join("ovf-env.xml");
        std::fs::write(&f, wala.replace(from, to)).unwrap();
        one_line_error(&azprov(&["ovf", f.to_str().unwrap()]), 2, needle);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
