//! `azprov provision --root` end to end in network namespaces: dnsmasq hands out options 121
//! and 245, the mock fabric listens on the real Azure addresses in the fabric namespace, and
//! azprov runs in the VM namespace against a Debian-like temporary root.

mod common;

use common::netns::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Output;

const OVF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ovf/wala.xml");
const KEY_A: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";
const KEY_B: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7bob== bob@desk";
const VM_ID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn doc(computer: &str, user: &str) -> Value {
    json!({
        "compute": {
            "location": "westeurope", "name": "vm-name-not-used", "vmSize": "Standard_B1s",
            "osProfile": {"adminUsername": user, "computerName": computer, "disablePasswordAuthentication": "true"},
            "publicKeys": [
                {"keyData": format!("{KEY_A}\r\n"), "path": format!("/home/{user}/.ssh/authorized_keys")},
                {"keyData": KEY_B, "path": format!("/home/{user}/.ssh/authorized_keys")}
            ],
            "userData": "IyEvYmluL3NoCmVjaG8gdXNlci1kYXRhCg==",
            "customData": "",
            "vmId": VM_ID
        },
        "network": {"interface": []},
        "extended": {"compute": {"hasCustomData": false, "ppsType": "None"}}
    })
}

/// A fabric namespace with dnsmasq and the mock fabric, and a seeded root.
fn setup(doc: Value, playbook: Value, fabric_args: &[&str]) -> (Net, std::path::PathBuf) {
    let mut net = Net::new();
    net.dnsmasq(&[]);
    net.fabric(&doc, &playbook, fabric_args);
    let root = net.seed_root();
    (net, root)
}

fn provision(net: &Net, root: &Path, extra: &[&str]) -> (Output, Value) {
    let r = root.to_str().unwrap();
    let dmi = net.azure_dmi();
    let cmdline = if extra.contains(&"--cmdline") {
        String::new()
    } else {
        net.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro")
    };
    let mut args = vec!["provision", "--root", r, "--json", "--dmi", &dmi];
    if !cmdline.is_empty() {
        args.extend(["--cmdline", &cmdline]);
    }
    if !extra.contains(&"--iface") && !extra.contains(&"--cmdline") {
        args.extend(["--iface", "vm0"]);
    }
    if !extra.contains(&"--timeout") && !extra.contains(&"--cmdline") {
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

fn text(p: impl AsRef<Path>) -> String {
    fs::read_to_string(p.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", p.as_ref().display()))
}

fn mode_owner(p: impl AsRef<Path>) -> (u32, u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.mode() & 0o7777, m.uid(), m.gid())
}

fn health_posts(net: &Net) -> Vec<Value> {
    net.fabric_log()
        .into_iter()
        .filter(|e| e["endpoint"] == "health")
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn ovf_and_imds_happy_path_writes_the_whole_file_contract() {
    require_privileges();
    let (net, root) = setup(doc("vm-prov-1", "azureuser"), json!([]), &[]);
    let (o, v) = provision(&net, &root, &["--ovf", OVF]);
    assert!(o.status.success(), "{}", stderr(&o));

    // the summary
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "cause",
            "custom_data",
            "growroot",
            "hint",
            "host_keys",
            "host_keys_pending",
            "hostname",
            "msp",
            "reason",
            "report",
            "schema",
            "ssh_keys",
            "stage",
            "timings_ms",
            "user_data",
            "username",
            "version",
            "vm_id"
        ]
    );
    assert_eq!(v["report"], "ready");
    assert_eq!(v["reason"], Value::Null);
    assert_eq!(v["msp"], false);
    assert_eq!(v["hostname"], "vm-prov-1");
    assert_eq!(v["username"], "azureuser");
    assert_eq!(v["ssh_keys"], 3);
    assert_eq!(
        (v["custom_data"].clone(), v["user_data"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(v["vm_id"], VM_ID);
    let t = v["timings_ms"].as_object().unwrap();
    let mut tk: Vec<&str> = t.keys().map(String::as_str).collect();
    tk.sort();
    assert_eq!(
        tk,
        [
            "dhcp",
            "host_keys",
            "imds",
            "media",
            "report",
            "total",
            "write"
        ]
    );

    // hostname from IMDS, /etc/hosts
    assert_eq!(text(root.join("etc/hostname")), "vm-prov-1\n");
    assert_eq!(mode_owner(root.join("etc/hostname")), (0o644, 0, 0));
    assert!(text(root.join("etc/hosts")).contains("127.0.1.1\tvm-prov-1\n"));
    // the account
    assert!(text(root.join("etc/passwd"))
        .contains("azureuser:x:1000:1000::/home/azureuser:/bin/bash\n"));
    assert!(text(root.join("etc/group")).contains("azureuser:x:1000:\n"));
    assert!(text(root.join("etc/gshadow")).contains("azureuser:!::\n"));
    let shadow = text(root.join("etc/shadow"));
    let line = shadow
        .lines()
        .find(|l| l.starts_with("azureuser:"))
        .unwrap();
    assert!(line.split(':').nth(1).unwrap().starts_with("$6$"), "{line}");
    assert_eq!(mode_owner(root.join("etc/shadow")), (0o640, 0, 42));
    assert_eq!(mode_owner(root.join("home/azureuser")), (0o750, 1000, 1000));
    assert!(root.join("home/azureuser/.bashrc").exists());
    // keys: IMDS's two (CR/LF stripped) and the OVF one
    let ak = root.join("home/azureuser/.ssh/authorized_keys");
    assert_eq!(
        text(&ak),
        format!("{KEY_A}\n{KEY_B}\nssh-rsa AAAANOTAREALKEY== foo@bar.local\n")
    );
    assert_eq!(mode_owner(&ak), (0o600, 1000, 1000));
    assert_eq!(
        mode_owner(root.join("home/azureuser/.ssh")),
        (0o700, 1000, 1000)
    );
    // sudo: a password is set, so no NOPASSWD
    let sudo = root.join("etc/sudoers.d/90-azprov");
    assert_eq!(
        text(&sudo),
        "# written by azprov\nazureuser ALL=(ALL) ALL\n"
    );
    assert_eq!(mode_owner(&sudo), (0o440, 0, 0));
    // IMDS disablePasswordAuthentication wins over OVF's false
    assert!(text(root.join("etc/ssh/sshd_config.d/50-azprov.conf"))
        .contains("PasswordAuthentication no\n"));
    // state
    assert_eq!(
        text(root.join("var/lib/azprov/customdata")),
        "#cloud-config\nruncmd: [echo, hi]\n"
    );
    assert_eq!(
        text(root.join("var/lib/azprov/userdata")),
        "#!/bin/sh\necho user-data\n"
    );
    let imds: Value = serde_json::from_str(&text(root.join("var/lib/azprov/imds.json"))).unwrap();
    assert_eq!(imds["compute"]["vmId"], VM_ID);
    for f in ["customdata", "userdata", "imds.json", "provisioned"] {
        assert_eq!(
            mode_owner(root.join("var/lib/azprov").join(f)),
            (0o600, 0, 0),
            "{f}"
        );
    }
    assert_eq!(mode_owner(root.join("var/lib/azprov")).0, 0o700);
    assert_eq!(
        text(root.join("var/lib/azprov/provisioned")),
        format!("{VM_ID}\n")
    );
    // the log: one line per stage, no secrets
    let log = text(root.join("var/log/azprov.log"));
    assert_eq!(mode_owner(root.join("var/log/azprov.log")), (0o640, 0, 0));
    for stage in ["media: ", "dhcp: ", "imds: ", "write: ", "report: "] {
        assert!(log.contains(stage), "{stage} missing in\n{log}");
    }
    let all = format!("{log}{}{}", stderr(&o), String::from_utf8_lossy(&o.stdout));
    for secret in [
        "S3cr3t",
        "cloud-config",
        "runcmd",
        "user-data",
        "IyEv",
        "I2Nsb3Vk",
    ] {
        assert!(!all.contains(secret), "{secret} leaked");
    }

    // what the fabric received
    let fl = net.fabric_log();
    let imds_reqs: Vec<&Value> = fl.iter().filter(|e| e["server"] == "imds").collect();
    assert_eq!(imds_reqs.len(), 1);
    assert_eq!(
        imds_reqs[0]["path"],
        "/metadata/instance?api-version=2023-11-15&extended=true"
    );
    assert_eq!(imds_reqs[0]["headers"]["metadata"], "true");
    assert!(imds_reqs[0]["headers"].get("x-forwarded-for").is_none());
    let posts = health_posts(&net);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["state"], "Ready");
    assert_eq!(posts[0]["status"], 200);
    assert_eq!(posts[0]["incarnation"], "1");
    assert_eq!(posts[0]["headers"]["x-ms-version"], "2012-11-30");
    assert_eq!(posts[0]["headers"]["x-ms-agent-name"], "azprov");
    assert_eq!(
        posts[0]["headers"]["content-type"],
        "text/xml;charset=utf-8"
    );
    // the goal state right before the POST was fetched fresh
    let idx = fl.iter().position(|e| e["endpoint"] == "health").unwrap();
    assert_eq!(fl[idx - 1]["endpoint"], "goalstate");
    // DHCP sent the OVF HostName as option 12
    wait_for(
        || read(&net.path("dnsmasq.log")).contains("client provides name: vm-wala"),
        "option 12 in dnsmasq's log",
    );
    // and the network is torn down again
    assert!(net.vm_addrs().is_empty());
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn imds_only_without_media() {
    require_privileges();
    let (net, root) = setup(doc("vm-imds-only", "imdsuser"), json!([]), &[]);
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    assert_eq!(v["custom_data"], false);
    assert_eq!(v["ssh_keys"], 2);
    assert!(stderr(&o).contains("no provisioning media"));
    let shadow = text(root.join("etc/shadow"));
    assert!(
        shadow.contains("\nimdsuser:!:"),
        "locked without a password: {shadow}"
    );
    assert!(text(root.join("etc/sudoers.d/90-azprov")).contains("imdsuser ALL=(ALL) NOPASSWD:ALL"));
    assert!(!root.join("var/lib/azprov/customdata").exists());
    assert_eq!(health_posts(&net)[0]["state"], "Ready");
}

/// How a socket in the VM's namespace fares connecting to IMDS, with and without the mark:
/// the errno's name, or "connected".
fn imds_connect(net: &Net, mark: u32) -> String {
    let script = format!(
        "import errno, socket\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, {mark})\n\
         s.settimeout(3)\n\
         try:\n    s.connect(('169.254.169.254', 80)); print('connected')\n\
         except OSError as e:\n    print(errno.errorcode[e.errno])\n"
    );
    let o = net.in_vm(&["python3", "-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn imds_is_reached_through_systemds_locked_mode() {
    require_privileges();
    let (net, root) = setup(doc("vm-locked", "azureuser"), json!([]), &[]);
    // systemd v261's locked IMDS mode, as policy routing: 169.254.169.254 is prohibited to
    // every socket but those marked 0x7FFF0815
    let vm = net.vm.as_str();
    let rule = |args: &[&str]| sh(&[&["ip", "-n", vm, "rule", "add"], args].concat());
    rule(&["pref", "100", "fwmark", "0x7FFF0815", "goto", "32766"]);
    rule(&["pref", "101", "to", "169.254.169.254", "prohibit"]);
    assert_eq!(imds_connect(&net, 0), "EACCES", "unmarked: the lock holds");
    assert_eq!(
        imds_connect(&net, 0x7FFF_0815),
        "ENETUNREACH",
        "marked: past the lock, on to the main table, still empty"
    );

    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    assert_eq!(v["hostname"], "vm-locked");
    assert_eq!(v["ssh_keys"], 2, "the keys came from IMDS: no media");
    let log = net.fabric_log();
    let answered = log
        .iter()
        .filter(|e| e["endpoint"] == "imds" && e["status"] == 200)
        .count();
    assert!(answered >= 1, "IMDS answered: {log:?}");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn imds_429_three_times_then_200() {
    require_privileges();
    let pb = json!([{"endpoint": "imds", "requests": [1, 2, 3], "status": 429}]);
    let (net, root) = setup(doc("vm-429", "azureuser"), pb, &[]);
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    let statuses: Vec<Value> = net
        .fabric_log()
        .iter()
        .filter(|e| e["server"] == "imds")
        .map(|e| e["status"].clone())
        .collect();
    assert_eq!(statuses, [json!(429), json!(429), json!(429), json!(200)]);
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn imds_down_for_good_provisions_from_ovf_and_reports_ready() {
    require_privileges();
    let pb = json!([{"endpoint": "imds", "requests": "*", "status": 503}]);
    let (net, root) = setup(doc("unused", "unused"), pb, &[]);
    let (o, v) = provision(&net, &root, &["--ovf", OVF, "--timeout", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    assert_eq!(v["hostname"], "vm-wala");
    assert_eq!(v["username"], "azureuser");
    assert_eq!(v["user_data"], false);
    assert!(
        stderr(&o).contains("http error querying IMDS"),
        "{}",
        stderr(&o)
    );
    assert_eq!(text(root.join("etc/hostname")), "vm-wala\n");
    // OVF's DisableSshPasswordAuthentication=false
    assert!(text(root.join("etc/ssh/sshd_config.d/50-azprov.conf"))
        .contains("PasswordAuthentication yes"));
    assert!(
        net.fabric_log()
            .iter()
            .filter(|e| e["server"] == "imds")
            .count()
            > 1
    );
    assert_eq!(health_posts(&net).last().unwrap()["state"], "Ready");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn custom_data_imds_announces_and_no_cd_brings_is_reported() {
    require_privileges();
    let mut d = doc("vm-cd", "azureuser");
    d["extended"]["compute"]["hasCustomData"] = json!(true);
    let (net, root) = setup(d.clone(), json!([]), &[]);
    let (o, v) = provision(&net, &root, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        v["reason"],
        "failure to read customData that IMDS announces"
    );
    let posts = health_posts(&net);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["state"], "NotReady");
    let desc = posts[0]["description"].as_str().unwrap();
    assert!(
        desc.contains("reason=failure to read customData that IMDS announces|")
            && desc.contains("no provisioning media"),
        "{desc}"
    );
    assert!(!root.join("var/lib/azprov/provisioned").exists());
    // NotReady, but the admin can log in and see why: the user, the keys, the hostname
    assert!(text(root.join("etc/passwd")).contains("\nazureuser:"));
    assert!(text(root.join("home/azureuser/.ssh/authorized_keys")).contains(KEY_A));
    assert_eq!(text(root.join("etc/hostname")), "vm-cd\n");
    assert_eq!(v["stage"], "merge");
    // the OVF with its CustomData: Ready
    let (net, root) = setup(d, json!([]), &[]);
    let (o, v) = provision(&net, &root, &["--ovf", OVF]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn nothing_usable_reports_not_ready_with_both_causes() {
    require_privileges();
    let pb = json!([{"endpoint": "imds", "requests": "*", "status": 503}]);
    let (net, root) = setup(doc("unused", "unused"), pb, &[]);
    let (o, v) = provision(&net, &root, &["--timeout", "6"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(v["report"], "failure");
    assert_eq!(v["reason"], "failed to obtain provisioning data");
    let posts = health_posts(&net);
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["state"], "NotReady");
    assert_eq!(posts[0]["substatus"], "ProvisioningFailed");
    let d = posts[0]["description"].as_str().unwrap();
    assert!(
        d.starts_with("result=error|reason=failed to obtain provisioning data|agent=azprov/"),
        "{d}"
    );
    assert!(d.contains("|ovf=no provisioning media|"), "{d}");
    assert!(d.contains("|imds=http error querying IMDS"), "{d}");
    assert!(d.contains("|vm_id=") && d.contains("|timestamp="), "{d}");
    assert!(d.chars().count() <= 512);
    assert!(!root.join("var/lib/azprov/provisioned").exists());
    assert_eq!(text(root.join("etc/hostname")), "debian-image\n");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_stale_incarnation_gets_410_and_is_posted_again_fresh() {
    require_privileges();
    // the incarnation moves on right after the goal state fetched for the POST
    let (net, root) = setup(
        doc("vm-410", "azureuser"),
        json!([]),
        &["--bump-after-goalstate", "2"],
    );
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    let posts = health_posts(&net);
    let seen: Vec<(Value, Value)> = posts
        .iter()
        .map(|p| (p["incarnation"].clone(), p["status"].clone()))
        .collect();
    assert_eq!(seen, [(json!("1"), json!(410)), (json!("2"), json!(200))]);
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_symlinked_ssh_dir_is_refused() {
    require_privileges();
    let (net, root) = setup(doc("vm-link", "azureuser"), json!([]), &[]);
    fs::write(
        root.join("etc/passwd"),
        format!(
            "{}azureuser:x:1000:1000::/home/azureuser:/bin/bash\n",
            text(root.join("etc/passwd"))
        ),
    )
    .unwrap();
    fs::create_dir_all(root.join("home/azureuser")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("home/azureuser/.ssh")).unwrap();
    let etc_before = listing(&root.join("etc"));
    let host_etc_before = listing(Path::new("/etc"));
    let (o, v) = provision(&net, &root, &[]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(v["report"], "failure");
    assert_eq!(v["reason"], "failed to write authorized_keys");
    let posts = health_posts(&net);
    assert_eq!(posts[0]["state"], "NotReady");
    assert!(posts[0]["description"]
        .as_str()
        .unwrap()
        .contains("reason=failed to write authorized_keys|"));
    assert!(!root.join("etc/authorized_keys").exists());
    assert!(!Path::new("/etc/authorized_keys").exists());
    // nothing came through the symlink; the lock file lckpwdf (and so useradd) leaves is new
    let mut etc_after = listing(&root.join("etc"));
    etc_after.retain(|n| n != ".pwd.lock");
    assert_eq!(etc_after, etc_before);
    assert_eq!(listing(Path::new("/etc")), host_etc_before);
    assert!(!root.join("var/lib/azprov/provisioned").exists());
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `azprov provision` on `root` copied onto a tmpfs of its own (mounted with `opts`, not a
/// bind of the host's filesystem) in a private mount namespace of the VM namespace: `before`
/// runs after the copy, `after` once azprov exited (`$?` is its exit code).
fn on_own_tmpfs(net: &Net, root: &Path, opts: &str, before: &str, after: &str) -> Output {
    let r = root.to_str().unwrap();
    let script = format!(
        "cp -a {r} {r}.seed && mount -t tmpfs -o {opts} azroot {r} && cp -a {r}.seed/. {r}/ && \
         {before} && {} provision --root {r} --iface vm0 --json --timeout 20 --dmi {} --cmdline {}; {after}",
        common::bin(),
        net.azure_dmi(),
        net.cmdline("ro")
    );
    net.in_vm(&[
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ])
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_read_only_root_is_written_and_read_only_again_afterwards() {
    require_privileges();
    let (net, root) = setup(doc("vm-ro", "azureuser"), json!([]), &[]);
    let r = root.to_str().unwrap();
    // read-only as the frameworks mount it; the files are copied back out afterwards
    let o = on_own_tmpfs(
        &net,
        &root,
        "mode=0755",
        &format!("mount -o remount,ro {r}"),
        &format!("rc=$?; grep \" {r} \" /proc/self/mountinfo >&2; cp -a {r}/. {r}.seed/; exit $rc"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["report"], "ready");
    let err = stderr(&o);
    assert!(
        err.contains("remounted read-write for provisioning"),
        "{err}"
    );
    let mountinfo = err.lines().last().unwrap();
    assert!(
        mountinfo.split(' ').nth(5).unwrap().starts_with("ro"),
        "read-only again: {mountinfo}"
    );
    assert_eq!(health_posts(&net)[0]["state"], "Ready");
    let seed = format!("{r}.seed");
    assert_eq!(text(Path::new(&seed).join("etc/hostname")), "vm-ro\n");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_full_root_reports_not_ready() {
    require_privileges();
    let (net, root) = setup(doc("vm-full", "azureuser"), json!([]), &[]);
    let fill = format!(
        "dd if=/dev/zero of={}/fill bs=4k 2>/dev/null; true",
        root.display()
    );
    let o = on_own_tmpfs(&net, &root, "size=1m,mode=0755", &fill, "exit $?");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["report"], "failure");
    assert_eq!(v["reason"], "failed to write hostname");
    assert!(
        stderr(&o).contains("No space left on device"),
        "{}",
        stderr(&o)
    );
    let posts = health_posts(&net);
    assert_eq!(posts[0]["state"], "NotReady");
    assert!(posts[0]["description"]
        .as_str()
        .unwrap()
        .contains("reason=failed to write hostname|"));
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn hook_mode_follows_the_kernel_command_line() {
    require_privileges();
    let (net, root) = setup(doc("vm-cmdline", "azureuser"), json!([]), &[]);
    for off in ["azprov=0", "rd.azprov=0", "azprov.disable"] {
        let line = net.cmdline(&format!("root=/dev/sda1 ro {off}"));
        let (o, v) = provision(&net, &root, &["--cmdline", &line, "--iface", "vm0"]);
        assert!(o.status.success(), "{off}: {}", stderr(&o));
        assert_eq!(v["report"], "disabled", "{off}");
    }
    assert!(net.fabric_log().is_empty());
    assert_eq!(text(root.join("etc/hostname")), "debian-image\n");
    // the interface and the timeout from the command line alone
    let line = net.cmdline("ro azprov.iface=vm0 azprov.timeout=20 azprov.log=debug");
    let (o, v) = provision(&net, &root, &["--cmdline", &line]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    assert!(stderr(&o).contains("debug: "), "azprov.log=debug");
    assert_eq!(text(root.join("etc/hostname")), "vm-cmdline\n");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn off_azure_nothing_is_sent_unless_forced() {
    require_privileges();
    let (net, root) = setup(doc("vm-offazure", "azureuser"), json!([]), &[]);
    let plain = net.path("plain-dmi");
    fs::create_dir_all(&plain).unwrap();
    fs::write(plain.join("chassis_asset_tag"), "Default string\n").unwrap();
    let line = net.cmdline("root=/dev/sda1 ro");
    let args = |extra: &'static [&'static str]| {
        let mut a = vec![
            "provision",
            "--root",
            root.to_str().unwrap(),
            "--json",
            "--iface",
            "vm0",
            "--timeout",
            "20",
            "--cmdline",
            &line,
            "--dmi",
            plain.to_str().unwrap(),
        ];
        a.extend(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let t = std::time::Instant::now();
    let a = args(&[]);
    let o = net.azprov(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let took = t.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["report"], "not-azure");
    assert!(stderr(&o).contains("not an Azure VM"), "{}", stderr(&o));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(net.fabric_log().is_empty());
    assert_eq!(
        read(&net.path("dnsmasq.log"))
            .matches("DHCPDISCOVER")
            .count(),
        0,
        "no DHCP packet off Azure (took {took:?})"
    );
    assert!(!root.join("var/log/azprov.log").exists());
    // a root without host keys (a cleaned image) gets them off Azure too: sshd needs them
    for k in ["ed25519", "ecdsa"] {
        let key = root.join(format!("etc/ssh/ssh_host_{k}_key"));
        assert!(key.exists(), "no {k} host key off Azure");
    }
    let t = std::time::Instant::now();
    while !root.join("etc/ssh/ssh_host_rsa_key").exists() {
        assert!(t.elapsed().as_secs() < 180, "no rsa host key off Azure");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(stderr(&o).contains("BEGIN SSH HOST KEY FINGERPRINTS"));
    // --force still provisions
    let a = args(&["--force"]);
    let o = net.azprov(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(health_posts(&net)[0]["state"], "Ready");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_second_run_with_the_marker_makes_no_network_request() {
    require_privileges();
    let (net, root) = setup(doc("vm-twice", "azureuser"), json!([]), &[]);
    let (o, _) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let fabric_before = net.fabric_log().len();
    let dhcp_before = read(&net.path("dnsmasq.log"))
        .matches("DHCPDISCOVER")
        .count();
    // temporaries a run cut short late in its first boot left behind
    let stale = [
        "var/lib/azprov/.state.json.azprov-tmp",
        "var/log/.azprov.log.azprov-tmp",
        "etc/.passwd.azprov-tmp",
        "home/azureuser/.ssh/.authorized_keys.azprov-tmp",
    ];
    for t in stale {
        fs::write(root.join(t), "cut short\n").unwrap();
    }
    fs::create_dir(root.join("home/.bob.azprov-tmp")).unwrap();
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "skipped");
    assert!(stderr(&o).contains("already provisioned"));
    for t in stale.iter().chain(&["home/.bob.azprov-tmp"]) {
        assert!(!root.join(t).exists(), "{t} is still there");
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(net.fabric_log().len(), fabric_before);
    assert_eq!(
        read(&net.path("dnsmasq.log"))
            .matches("DHCPDISCOVER")
            .count(),
        dhcp_before
    );
    assert!(!net.vm_link()["flags"]
        .as_array()
        .unwrap()
        .contains(&json!("UP")));
    // --force provisions again
    let (o, v) = provision(&net, &root, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn bad_hostname_and_system_usernames_are_refused_with_a_reason() {
    require_privileges();
    for (host, user, reason) in [
        ("bad_host!", "azureuser", "invalid hostname"),
        ("vm-ok", "root", "invalid username"),
        ("vm-ok", "daemon", "invalid username"),
    ] {
        let (net, root) = setup(doc(host, user), json!([]), &[]);
        let (o, v) = provision(&net, &root, &[]);
        assert_eq!(o.status.code(), Some(1), "{host} {user}");
        assert_eq!(v["reason"], reason, "{host} {user}");
        let posts = health_posts(&net);
        assert_eq!(posts[0]["state"], "NotReady");
        assert!(posts[0]["description"]
            .as_str()
            .unwrap()
            .contains(&format!("reason={reason}|")));
        assert!(!root.join("var/lib/azprov/provisioned").exists());
        assert!(!text(root.join("etc/passwd")).contains(":1000:"));
        // the account chain stops at the user: no sudoers line for a refused name
        assert!(
            !root.join("etc/sudoers.d/90-azprov").exists(),
            "{host} {user}"
        );
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn no_dhcp_server_fails_with_the_lease_reason_and_leaves_the_root_alone() {
    require_privileges();
    let mut net = Net::new();
    net.fabric(&doc("vm-nodhcp", "azureuser"), &json!([]), &[]);
    let root = net.seed_root();
    let (o, v) = provision(&net, &root, &["--timeout", "4"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // no lease, so no WireServer: Azure was told nothing
    assert_eq!(v["report"], "pending");
    assert_eq!(v["reason"], "failure to obtain DHCP lease");
    assert_eq!(v["stage"], "dhcp");
    assert!(
        stderr(&o).contains("failure to obtain DHCP lease on vm0"),
        "{}",
        stderr(&o)
    );
    // no lease, no route: nothing reached the fabric, nothing was written but the log
    assert!(net.fabric_log().is_empty());
    assert_eq!(text(root.join("etc/hostname")), "debian-image\n");
    assert!(!root.join("var/lib/azprov/provisioned").exists());
    assert!(text(root.join("var/log/azprov.log")).contains("failure to obtain DHCP lease"));
    assert!(net.vm_addrs().is_empty());
}

fn azprov_json(net: &Net, args: &[&str]) -> (Output, Value) {
    let o = net.azprov(args);
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: no JSON ({e}): {}", stderr(&o)));
    (o, v)
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn host_keys_once_per_vm_then_status_and_clean_for_capture() {
    require_privileges();
    let (net, root) = setup(doc("vm-keys", "azureuser"), json!([]), &[]);
    let r = root.to_str().unwrap();
    let ssh = root.join("etc/ssh");
    fs::write(ssh.join("ssh_host_ed25519_key"), "image key\n").unwrap();
    fs::write(ssh.join("ssh_host_dsa_key.pub"), "image key\n").unwrap();
    fs::write(root.join("etc/resolv.conf"), "nameserver 168.63.129.16\n").unwrap();

    // --keep-host-keys: the image's keys stay
    let (o, v) = provision(&net, &root, &["--keep-host-keys"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["host_keys"], json!([]));
    assert_eq!(text(ssh.join("ssh_host_ed25519_key")), "image key\n");

    // a new VM: ecdsa and ed25519 keys before the run ends, the image's gone (its rsa key
    // too), the fingerprints on the console; the rsa key follows from a process of its own
    // (or is in already, when its search ended before the report)
    let (o, v) = provision(&net, &root, &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let fast = made_in_the_run(&v);
    let err = stderr(&o);
    let block = format!(
        "-----BEGIN SSH HOST KEY FINGERPRINTS-----\n{}\n-----END SSH HOST KEY FINGERPRINTS-----\n",
        fast.join("\n")
    );
    assert!(err.contains(&block), "{err}");
    assert!(text(root.join("var/log/azprov.log")).contains(&block));
    assert!(!ssh.join("ssh_host_dsa_key.pub").exists());
    let lines = rsa_key_added(&root);
    assert!(
        lines.ends_with(&fast),
        "the keys made first stay: {lines:?}"
    );
    for (kind, line) in ["rsa", "ecdsa", "ed25519"].iter().zip(&lines) {
        let key = ssh.join(format!("ssh_host_{kind}_key"));
        assert_eq!(mode_owner(&key), (0o600, 0, 0), "{kind}");
        assert_eq!(
            mode_owner(key.with_extension("pub")),
            (0o644, 0, 0),
            "{kind}"
        );
        // exactly what ssh-keygen -l prints, and the private half matches the public one
        let l = sh(&[
            "ssh-keygen",
            "-l",
            "-f",
            key.with_extension("pub").to_str().unwrap(),
        ]);
        assert_eq!(
            String::from_utf8_lossy(&l.stdout).trim_end(),
            line,
            "{kind}"
        );
        let y = sh(&["ssh-keygen", "-y", "-f", key.to_str().unwrap()]);
        let public = text(key.with_extension("pub"));
        assert!(
            y.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&y.stderr)
        );
        assert!(
            public.starts_with(String::from_utf8_lossy(&y.stdout).trim_end()),
            "{kind}"
        );
    }
    assert!(
        !err.contains("PRIVATE KEY")
            && !text(root.join("var/log/azprov.log")).contains("PRIVATE KEY"),
        "a private key reached a log"
    );
    let ed25519 = text(ssh.join("ssh_host_ed25519_key"));

    // status, from the root alone
    let (o, st) = azprov_json(&net, &["status", "--root", r, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut keys: Vec<&str> = st.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "cause",
            "hint",
            "host_keys",
            "hostname",
            "log",
            "msp",
            "provisioned",
            "provisioned_at",
            "reason",
            "report",
            "reported_at",
            "schema",
            "scripts",
            "stage",
            "state_unreadable",
            "this_boot",
            "timings_ms",
            "username",
            "version",
            "vm_id"
        ]
    );
    assert_eq!(st["schema"], 1);
    assert_eq!(st["schema"], v["schema"]);
    assert_eq!(st["provisioned"], true);
    assert_eq!(st["report"], "ready");
    assert_eq!(st["vm_id"], VM_ID);
    assert_eq!(st["username"], "azureuser");
    assert_eq!(st["host_keys"], json!(lines));
    assert!(st["reported_at"].as_str().unwrap().ends_with('Z'));

    // a reboot keeps the keys
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "skipped");
    assert_eq!(text(ssh.join("ssh_host_ed25519_key")), ed25519);

    // clean for capture: a dry run first, then for real
    let (o, dry) = azprov_json(
        &net,
        &[
            "clean",
            "--root",
            r,
            "--user",
            "--machine-id",
            "--dry-run",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(root.join("var/lib/azprov/provisioned").exists());
    let (o, c) = azprov_json(
        &net,
        &["clean", "--root", r, "--user", "--machine-id", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(dry["removed"], c["removed"]);
    assert_eq!(c["user"], "azureuser");
    assert!(!text(root.join("etc/passwd")).contains("azureuser"));
    assert!(!root.join("home/azureuser").exists());
    assert!(!root.join("var/lib/azprov").exists());
    assert!(!ssh.join("ssh_host_ed25519_key").exists());
    assert!(!root.join("etc/sudoers.d/90-azprov").exists());
    assert_eq!(text(root.join("etc/machine-id")), "uninitialized\n");
    assert_eq!(
        text(root.join("etc/resolv.conf")),
        "nameserver 168.63.129.16\n"
    );
    let o = net.azprov(&["status", "--root", r]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("provisioned:    no"));

    // the next boot provisions as a new VM
    let (o, v) = provision(&net, &root, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    made_in_the_run(&v);
    assert_ne!(text(ssh.join("ssh_host_ed25519_key")), ed25519);
    assert_eq!(rsa_key_added(&root).len(), 3);
}

/// The fingerprint lines of the keys a run's JSON says it made: ecdsa and ed25519 with the
/// rsa key pending (made after the run), or all three when the rsa search ended before the
/// report (a fast machine, a slow run), rsa first.
fn made_in_the_run(v: &Value) -> Vec<String> {
    let made: Vec<String> = v["host_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    if v["host_keys_pending"] == json!(["rsa"]) {
        assert_eq!(made.len(), 2, "{made:?}");
    } else {
        assert_eq!(made.len(), 3, "{made:?}");
        assert!(made[0].ends_with("(RSA)"), "{made:?}");
    }
    made
}

/// Waits (three minutes at most: it runs at idle priority beside the other tests) for the rsa host
/// key made after the run and its fingerprint in
/// state.json; the state's host key lines then, rsa first.
fn rsa_key_added(root: &Path) -> Vec<String> {
    let state = root.join("var/lib/azprov/state.json");
    let t = std::time::Instant::now();
    loop {
        let lines: Vec<String> = fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["host_keys"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect();
        if root.join("etc/ssh/ssh_host_rsa_key.pub").exists() && lines.len() == 3 {
            assert!(lines[0].ends_with("(RSA)"), "{lines:?}");
            return lines;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(180),
            "no rsa host key after three minutes: {lines:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_ready_not_acknowledged_is_sent_again_on_the_next_boot_and_only_it() {
    require_privileges();
    let down = json!([{"endpoint": "goalstate", "requests": "*", "status": 503}]);
    let (mut net, root) = setup(doc("vm-durable", "azureuser"), down, &[]);
    let r = root.to_str().unwrap();
    // first boot: provisioned, but the WireServer never answers
    let (o, v) = provision(&net, &root, &["--timeout", "6", "--keep-host-keys"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(v["reason"], "failed to report ready");
    assert!(root.join("var/lib/azprov/provisioned").exists());
    let (o, st) = azprov_json(&net, &["status", "--root", r, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        (st["provisioned"].clone(), st["report"].clone()),
        (json!(true), json!("pending"))
    );
    let passwd = text(root.join("etc/passwd"));
    let before = net.fabric_log().len();

    // second boot, the fabric healthy: Ready again, no IMDS request, no rewrite; with
    // azprov.keepnet the lease stays configured, as on a first boot
    net.restart_fabric(&doc("vm-durable", "azureuser"), &json!([]));
    assert!(net.vm_addrs().is_empty());
    let keepnet = net.cmdline("ro azprov.keepnet azprov.iface=vm0 azprov.timeout=20");
    let (o, v) = provision(&net, &root, &["--cmdline", &keepnet, "--keep-host-keys"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        net.vm_addrs().len(),
        1,
        "azprov.keepnet did not keep the lease"
    );
    assert_eq!(v["report"], "ready");
    assert!(stderr(&o).contains("reporting it again"), "{}", stderr(&o));
    let second: Vec<Value> = net.fabric_log().into_iter().skip(before).collect();
    assert!(second.iter().all(|e| e["endpoint"] != "imds"), "{second:?}");
    assert_eq!(health_posts(&net).last().unwrap()["state"], "Ready");
    assert_eq!(text(root.join("etc/passwd")), passwd);
    let (o, st) = azprov_json(&net, &["status", "--root", r, "--json"]);
    assert!(o.status.success());
    assert_eq!(st["report"], "ready");

    // acknowledged now: the third boot sends nothing
    let count = net.fabric_log().len();
    let (o, v) = provision(&net, &root, &["--keep-host-keys"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "skipped");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(net.fabric_log().len(), count);
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_slow_first_goal_state_does_not_hold_back_the_imds_result() {
    require_privileges();
    // the early goal-state probe answers after 3 s; the report's own fetch at once
    let slow = json!([{"endpoint": "goalstate", "requests": [1], "delay": 3}]);
    let (net, root) = setup(doc("vm-slowprobe", "azureuser"), slow, &[]);
    let (o, v) = provision(&net, &root, &["--keep-host-keys"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    // the fabric logs a request when it answers: Ready came before the probe's answer
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let order: Vec<(String, u64)> = net
        .fabric_log()
        .iter()
        .map(|e| {
            (
                e["endpoint"].as_str().unwrap_or("").to_string(),
                e["n"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let health = order.iter().position(|(e, _)| e == "health").unwrap();
    let probe = order
        .iter()
        .position(|(e, n)| e == "goalstate" && *n == 1)
        .unwrap();
    assert!(health < probe, "{order:?}");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_run_killed_between_the_marker_and_the_report_has_its_ready_sent_by_the_next_boot() {
    require_privileges();
    // the WireServer throttles: the run sits in its report stage with the marker on disk
    let down = json!([{"endpoint": "goalstate", "requests": "*", "status": 503}]);
    let (mut net, root) = setup(doc("vm-killed", "azureuser"), down, &[]);
    let r = root.to_str().unwrap();
    let dmi = net.azure_dmi();
    let cmdline = net.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro");
    let mut run = net.azprov_spawn(&[
        "provision",
        "--root",
        r,
        "--dmi",
        &dmi,
        "--cmdline",
        &cmdline,
        "--iface",
        "vm0",
        "--timeout",
        "30",
        "--keep-host-keys",
    ]);
    let marker = root.join("var/lib/azprov/provisioned");
    common::netns::wait_for(|| marker.exists(), "the marker");
    // the state that owes Ready was on disk before the marker
    let state: Value = serde_json::from_str(&text(root.join("var/lib/azprov/state.json"))).unwrap();
    assert_eq!(state["report"], "pending");
    assert_eq!(state["user_created"], true);
    // power cut: SIGKILL, no chance to write anything more
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(health_posts(&net).iter().all(|p| p["state"] != "Ready"));

    net.restart_fabric(&doc("vm-killed", "azureuser"), &json!([]));
    let (o, v) = provision(&net, &root, &["--keep-host-keys"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    assert!(stderr(&o).contains("reporting it again"), "{}", stderr(&o));
    assert_eq!(health_posts(&net).last().unwrap()["state"], "Ready");
    // and clean --user still knows the admin is azprov's
    let (o, c) = azprov_json(
        &net,
        &["clean", "--root", r, "--user", "--dry-run", "--json"],
    );
    assert!(o.status.success());
    assert_eq!(c["user"], "azureuser");
}

/// `status` tells the truth: this boot's outcome from /run's record (disabled and off Azure
/// exit 0), the cause, stage and what to check of a failure, and, for a user who cannot read
/// /var/lib/azprov, what the world-readable record says.
#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn status_tells_the_truth_after_disabled_off_azure_failed_and_ready_runs() {
    require_privileges();
    let (net, root) = setup(doc("vm-status", "azureuser"), json!([]), &[]);
    let r = root.to_str().unwrap();
    let run_dir = net.path("run-azprov");
    let rd = run_dir.to_str().unwrap();
    let status = |extra: &[&str]| {
        let mut a = vec!["status", "--root", r, "--run-dir", rd];
        a.extend(extra);
        net.azprov(&a)
    };
    // azprov=0: nothing done, recorded, exit 0
    let (o, v) = provision(
        &net,
        &root,
        &[
            "--run-dir",
            rd,
            "--cmdline",
            &net.cmdline("root=/dev/sda1 azprov=0"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "disabled");
    let o = status(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("this boot:      disabled on the kernel command line"),
        "{out}"
    );
    assert!(out.contains("azprov:         "), "{out}");
    // a failed run: the WireServer refuses, so Ready is pending; the cause, the stage and
    // what to check are shown
    let (o, v) = provision(
        &net,
        &root,
        &["--run-dir", rd, "--wireserver", "127.0.0.1:9"],
    );
    assert!(!o.status.success());
    assert_eq!(v["report"], "pending");
    assert_eq!(v["reason"], "failed to report ready");
    assert_eq!(v["stage"], "report");
    assert!(v["cause"]
        .as_str()
        .unwrap()
        .starts_with("failed to report ready: "));
    let o = status(&["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["this_boot"], "pending");
    assert_eq!(st["report"], "pending");
    assert_eq!(st["stage"], "report");
    assert!(st["hint"].as_str().unwrap().contains("168.63.129.16"));
    assert!(
        !stderr(&o).contains("(os error"),
        "errno numbers: {}",
        stderr(&o)
    );
    let o = status(&[]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("what to check:  the WireServer"), "{out}");
    assert!(out.contains("failed stage:   report"), "{out}");
    // the next boot sends the owed Ready; now a user without sudo can tell it worked
    let (o, v) = provision(&net, &root, &["--run-dir", rd]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready", "{v}");
    // the report's failure is mended: no reason left
    let o = status(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["reason"], Value::Null, "{st}");
    assert_eq!(st["report"], "ready");
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::bin())
        .args(["status", "--root", r, "--run-dir", rd, "--json"])
        .output()
        .unwrap();
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(o.status.success(), "{st} {}", stderr(&o));
    assert_eq!(st["provisioned"], true);
    assert_eq!(st["this_boot"], "ready");
    assert!(
        st["state_unreadable"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{st}"
    );
    // the same user with no record of this boot to go by: it cannot know, and says so
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::bin())
        .args(["status", "--root", r, "--json"])
        .output()
        .unwrap();
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(3), "{st} {}", stderr(&o));
    assert_eq!(st["provisioned"], "unknown", "{st}");
    assert!(st["state_unreadable"].is_string(), "{st}");
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::bin())
        .args(["status", "--root", r])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("provisioned:    unknown (the state is readable by root only"),
        "{out}"
    );
}

/// A DMI directory with Azure's asset tag and this VM id as product_uuid.
fn dmi_of(net: &Net, name: &str, uuid: &str) -> String {
    let d = net.path(name);
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("chassis_asset_tag"), format!("{AZURE_ASSET_TAG}\n")).unwrap();
    fs::write(d.join("product_uuid"), format!("{uuid}\n")).unwrap();
    d.display().to_string()
}

/// The disk of VM A booted as VM B, whose run fails before its writes (no NIC): A's custom
/// data, user data and IMDS document are gone all the same, and run-scripts runs nothing for B.
#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_new_vm_whose_run_fails_never_keeps_the_earlier_vms_data() {
    require_privileges();
    let (mut net, root) = setup(doc("vm-a", "azureuser"), json!([]), &[]);
    let r = root.to_str().unwrap().to_string();
    let cmdline = net.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro");
    let run = |net: &Net, dmi: &str, ovf: &str, iface: &str| {
        azprov_json(
            net,
            &[
                "provision",
                "--root",
                &r,
                "--json",
                "--dmi",
                dmi,
                "--cmdline",
                &cmdline,
                "--iface",
                iface,
                "--timeout",
                "20",
                "--ovf",
                ovf,
                "--keep-host-keys",
            ],
        )
    };
    let a = dmi_of(&net, "dmi-a", "aaaaaaaa-0000-4000-8000-00000000000a");
    let (_, v) = run(&net, &a, OVF, "vm0");
    assert_eq!(v["report"], "ready", "{v}");
    for f in ["customdata", "userdata", "imds.json"] {
        assert!(root.join("var/lib/azprov").join(f).exists(), "{f}");
    }
    let marker = text(root.join("var/lib/azprov/provisioned"));
    // VM B: its NIC is not there, so the run fails before anything is written
    net.restart_fabric(&doc("vm-b", "azureuser"), &json!([]));
    let minimal = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ovf/minimal.xml"
    );
    let b = dmi_of(&net, "dmi-b", "bbbbbbbb-0000-4000-8000-00000000000b");
    let (_, v) = run(&net, &b, minimal, "nosuch0");
    assert_eq!(v["reason"], "failure to find DHCP interface", "{v}");
    for f in ["customdata", "userdata", "imds.json"] {
        assert!(
            !root.join("var/lib/azprov").join(f).exists(),
            "{f} of VM A is left"
        );
    }
    assert_eq!(text(root.join("var/lib/azprov/provisioned")), marker);
    let o = net.azprov(&["run-scripts", "--root", &r]);
    assert!(stderr(&o).contains("no script runs"), "{}", stderr(&o));
}

/// `--run-config`: linuxkit's /run/config layout beside the root, from IMDS's user data, with a
/// hostile JSON document: what is well-formed is expanded with its modes, nothing lands outside
/// the layout, the run is Ready, and no log line quotes the document.
#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn run_config_layout_with_hostile_json_user_data() {
    use base64::Engine;
    require_privileges();
    let json = r#"{"ok": {"perm": "0600", "content": "SECRET-CONTENT"},
                   "dir": {"entries": {"f": {"content": "in a dir"}}},
                   "../escape": {"content": "x"}, "a/b": {"content": "x"}, "..": {"entries": {}},
                   "bad": {"perm": "9", "content": "x"}, "weird": [1, 2]}"#;
    let mut d = doc("vm-lk", "azureuser");
    d["compute"]["userData"] = json!(base64::engine::general_purpose::STANDARD.encode(json));
    let (net, root) = setup(d, json!([]), &[]);
    let rc = net.path("run/config");
    let (o, v) = provision(&net, &root, &["--run-config", rc.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["report"], "ready");
    assert_eq!(text(rc.join("hostname")), "vm-lk");
    assert_eq!(text(rc.join("provider")), "azure");
    let keys = text(rc.join("ssh/authorized_keys"));
    assert!(keys.contains(KEY_A) && keys.contains("bob@desk"), "{keys}");
    assert_eq!(mode_owner(rc.join("ssh/authorized_keys")).0, 0o600);
    assert_eq!(fs::read(rc.join("userdata")).unwrap(), json.as_bytes());
    assert_eq!(text(rc.join("ok")), "SECRET-CONTENT");
    assert_eq!(mode_owner(rc.join("ok")).0, 0o600);
    assert_eq!(text(rc.join("dir/f")), "in a dir");
    assert!(!net.path("run/escape").exists() && !rc.join("a").exists() && !rc.join("bad").exists());
    let err = stderr(&o);
    assert!(
        err.contains("3 entries of JSON user data expanded, 5 refused"),
        "{err}"
    );
    assert!(
        !err.contains("SECRET-CONTENT") && !err.contains("escape"),
        "{err}"
    );
}
