//! Test hosts in network namespaces: a "fabric" namespace with a bridge (10.42.0.1/24) and a
//! "vm" namespace whose `vm0` is cabled to it. More server namespaces can join the bridge.
//! Needs root: see `require_privileges`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn sh(args: &[&str]) -> Output {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Fails the test unless it runs as root with the namespace tools installed. Outside CI an
/// unprivileged build marks these tests ignored (build.rs), so they never pass by skipping.
pub fn require_privileges() {
    // SAFETY-free check: root is uid 0
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let tools = ["ip", "dnsmasq", "python3"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    });
    assert!(root, "namespace tests need root");
    assert!(
        tools,
        "namespace tests need ip, dnsmasq and python3 (scripts/setup installs them)"
    );
}

/// tests/fixtures/azure-dhcp-options with the router address filled in.
pub fn azure_dhcp_options(gateway: &str) -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/azure-dhcp-options"
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.replace("GATEWAY", gateway))
        .collect()
}

pub struct Net {
    pub fabric: String,
    pub vm: String,
    pub dir: PathBuf,
    extra: Vec<String>,
    children: Vec<Child>,
}

/// What Azure puts into the DMI chassis asset tag; without it azprov does nothing.
pub const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";

impl Net {
    pub fn new() -> Net {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}{}", std::process::id() % 100_000, n);
        let fabric = format!("azpf{tag}");
        let vm = format!("azpv{tag}");
        let dir = std::env::temp_dir().join(format!("azprov-net-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        sh(&["ip", "netns", "add", &fabric]);
        sh(&["ip", "netns", "add", &vm]);
        let net = Net {
            fabric,
            vm,
            dir,
            extra: Vec::new(),
            children: Vec::new(),
        };
        let f = net.fabric.as_str();
        sh(&["ip", "-n", f, "link", "set", "lo", "up"]);
        sh(&["ip", "-n", &net.vm, "link", "set", "lo", "up"]);
        sh(&[
            "ip",
            "-n",
            f,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "forward_delay",
            "0",
        ]);
        sh(&["ip", "-n", f, "addr", "add", "10.42.0.1/24", "dev", "br0"]);
        sh(&["ip", "-n", f, "link", "set", "br0", "up"]);
        // the VM's cable: vm0 in the VM namespace, its peer on the bridge
        sh(&[
            "ip", "-n", &net.vm, "link", "add", "vm0", "type", "veth", "peer", "name", "p0",
            "netns", f,
        ]);
        sh(&["ip", "-n", f, "link", "set", "p0", "master", "br0", "up"]);
        // the fabric's well-known addresses, reachable only through the routes DHCP hands out
        sh(&[
            "ip",
            "-n",
            f,
            "addr",
            "add",
            "168.63.129.16/32",
            "dev",
            "lo",
        ]);
        sh(&[
            "ip",
            "-n",
            f,
            "addr",
            "add",
            "169.254.169.254/32",
            "dev",
            "lo",
        ]);
        net
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The VM's DMI directory for `--dmi`: Azure's chassis asset tag and no product_uuid, so
    /// the VM id comes from IMDS and the tests do not depend on the host's own DMI tables.
    pub fn azure_dmi(&self) -> String {
        let d = self.path("dmi");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("chassis_asset_tag"), format!("{AZURE_ASSET_TAG}\n")).unwrap();
        d.display().to_string()
    }

    /// The VM's kernel command line for `--cmdline`, so the host's own does not count.
    pub fn cmdline(&self, line: &str) -> String {
        let f = self.path("cmdline");
        std::fs::write(&f, format!("{line}\n")).unwrap();
        f.display().to_string()
    }

    /// dnsmasq on the bridge, serving options 121, 245 and 26 the way Azure does.
    pub fn dnsmasq(&mut self, extra: &[&str]) {
        let log = self.path("dnsmasq.log");
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            self.fabric.clone(),
            "dnsmasq".into(),
            "--keep-in-foreground".into(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--port=0".into(),
            "--interface=br0".into(),
            "--bind-interfaces".into(),
            "--user=root".into(),
            "--dhcp-range=10.42.0.10,10.42.0.50,255.255.255.0,infinite".into(),
            "--no-ping".into(),
            "--dhcp-authoritative".into(),
            "--log-dhcp".into(),
            format!("--log-facility={}", log.display()),
            format!("--dhcp-leasefile={}", self.path("dnsmasq.leases").display()),
            format!("--pid-file={}", self.path("dnsmasq.pid").display()),
        ];
        let own_245 =
            extra.iter().any(|e| e.starts_with("--dhcp-option=245")) || extra.contains(&"no-245");
        args.extend(
            azure_dhcp_options("10.42.0.1")
                .into_iter()
                .filter(|o| !(own_245 && o.starts_with("245,")))
                .map(|o| format!("--dhcp-option={o}")),
        );
        args.extend(
            extra
                .iter()
                .filter(|e| **e != "no-245")
                .map(|s| s.to_string()),
        );
        let child = Command::new("ip")
            .args(&args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
        wait_for(
            || {
                std::fs::read_to_string(&log)
                    .map(|l| l.contains("DHCP, IP range"))
                    .unwrap_or(false)
            },
            "dnsmasq to start",
        );
    }

    /// `cmd` run in the fabric's namespace until the Net is dropped.
    pub fn spawn_in_fabric(&mut self, cmd: &[&str]) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.fabric])
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    /// A scripted server (tests/dhcp_server.py) in its own namespace on the bridge.
    pub fn script_server(&mut self, server_ip: &str, offer_ip: &str, flags: &[&str]) -> PathBuf {
        let ns = format!("{}s{}", self.fabric, self.extra.len());
        let port = format!("q{}", self.extra.len());
        sh(&["ip", "netns", "add", &ns]);
        self.extra.push(ns.clone());
        sh(&[
            "ip",
            "-n",
            &ns,
            "link",
            "add",
            "srv0",
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.fabric,
        ]);
        sh(&[
            "ip",
            "-n",
            &self.fabric,
            "link",
            "set",
            &port,
            "master",
            "br0",
            "up",
        ]);
        sh(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{server_ip}/24"),
            "dev",
            "srv0",
        ]);
        sh(&["ip", "-n", &ns, "link", "set", "srv0", "up"]);
        let log = self.path(&format!("server-{server_ip}.log"));
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dhcp_server.py");
        let mut args = vec![
            "netns",
            "exec",
            &ns,
            "python3",
            script,
            "--iface",
            "srv0",
            "--server-ip",
            server_ip,
            "--offer-ip",
            offer_ip,
            "--router",
            "10.42.0.1",
        ];
        let log_s = log.display().to_string();
        args.extend(["--log", &log_s]);
        args.extend(flags);
        self.children.push(spawn_ready(
            &args, b"ready
",
        ));
        log
    }

    /// Runs a command in the VM namespace (ip netns exec gives it its own /sys).
    pub fn in_vm(&self, cmd: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.vm])
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// azprov started in the VM namespace, not waited for (a test that cuts it short).
    pub fn azprov_spawn(&self, args: &[&str]) -> std::process::Child {
        Command::new("ip")
            .args(["netns", "exec", &self.vm, &super::bin()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    pub fn azprov(&self, args: &[&str]) -> Output {
        let bin = super::bin();
        let mut cmd = vec![bin.as_str()];
        cmd.extend(args);
        self.in_vm(&cmd)
    }

    pub fn ip_json(&self, args: &[&str]) -> serde_json::Value {
        let mut cmd = vec!["ip", "-j", "-n", self.vm.as_str()];
        cmd.extend(args);
        serde_json::from_slice(&sh(&cmd).stdout).unwrap()
    }

    /// IPv4 addresses on vm0.
    pub fn vm_addrs(&self) -> Vec<String> {
        let v = self.ip_json(&["-4", "addr", "show", "dev", "vm0"]);
        v.as_array()
            .unwrap()
            .iter()
            .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .collect()
    }

    /// IPv4 routes in the VM's main table as "dst via gw".
    pub fn vm_routes(&self) -> Vec<String> {
        let v = self.ip_json(&["-4", "route", "show", "table", "main"]);
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{} via {}",
                    r["dst"].as_str().unwrap(),
                    r["gateway"].as_str().unwrap_or("-")
                )
            })
            .collect()
    }

    pub fn vm_link(&self) -> serde_json::Value {
        self.ip_json(&["link", "show", "dev", "vm0"])[0].clone()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // dnsmasq runs as a grandchild of `ip netns exec`? No: exec replaces; killing is enough.
        for ns in self.extra.iter().chain([&self.vm, &self.fabric]) {
            let _ = Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .map(|o| {
                    for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                        let _ = Command::new("kill").arg(pid).status();
                    }
                });
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a server and waits for the line it prints once it listens.
fn spawn_ready(args: &[&str], ready: &[u8]) -> Child {
    let mut child = Command::new("ip")
        .args(args)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; ready.len()];
    std::io::Read::read_exact(&mut out, &mut buf).unwrap();
    assert_eq!(buf, ready, "{args:?}");
    child
}

pub fn wait_for(mut f: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

impl Net {
    /// The mock fabric (testbed/fabric.py) on 168.63.129.16:80 and 169.254.169.254:80 in
    /// the fabric namespace. `doc` is the IMDS document, `playbook` its fault list.
    pub fn fabric(
        &mut self,
        doc: &serde_json::Value,
        playbook: &serde_json::Value,
        extra: &[&str],
    ) {
        let doc_path = self.path("imds.json");
        let pb_path = self.path("playbook.json");
        std::fs::write(&doc_path, serde_json::to_vec(doc).unwrap()).unwrap();
        std::fs::write(&pb_path, serde_json::to_vec(playbook).unwrap()).unwrap();
        let log = self.path("fabric.jsonl");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/testbed/fabric.py");
        let (d, p, l) = (
            doc_path.display().to_string(),
            pb_path.display().to_string(),
            log.display().to_string(),
        );
        let mut args = vec![
            "netns",
            "exec",
            &self.fabric,
            "python3",
            script,
            "--wireserver",
            "168.63.129.16:80",
            "--imds",
            "169.254.169.254:80",
            "--log",
            &l,
            "--imds-doc",
            &d,
            "--playbook",
            &p,
        ];
        args.extend(extra);
        self.children.push(spawn_ready(
            &args,
            b"fabric ready
",
        ));
    }

    /// Stops the fabric started last and starts it again with another playbook (a fabric that
    /// was down on one boot and is healthy on the next). The request log goes on.
    pub fn restart_fabric(&mut self, doc: &serde_json::Value, playbook: &serde_json::Value) {
        if let Some(mut old) = self.children.pop() {
            let _ = old.kill();
            let _ = old.wait();
        }
        self.fabric(doc, playbook, &[]);
    }

    /// `restart_fabric` with the fabric's own flags (`--msp`, ...).
    pub fn restart_fabric_with(
        &mut self,
        doc: &serde_json::Value,
        playbook: &serde_json::Value,
        extra: &[&str],
    ) {
        if let Some(mut old) = self.children.pop() {
            let _ = old.kill();
            let _ = old.wait();
        }
        self.fabric(doc, playbook, extra);
    }

    /// Every request the fabric received, in order.
    pub fn fabric_log(&self) -> Vec<serde_json::Value> {
        read(&self.path("fabric.jsonl"))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// A Debian-like root (tests/fixtures/root) under this test's directory.
    pub fn seed_root(&self) -> PathBuf {
        let root = self.path("root");
        sh(&[
            "cp",
            "-a",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/root"),
            root.to_str().unwrap(),
        ]);
        for f in ["etc/shadow", "etc/gshadow"] {
            let p = root.join(f);
            sh(&["chown", "root:42", p.to_str().unwrap()]);
            sh(&["chmod", "0640", p.to_str().unwrap()]);
        }
        root
    }
}
