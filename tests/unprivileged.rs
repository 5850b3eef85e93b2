//! A whole `provision` in-process, without root: the sysroot records the owners it would set
//! instead of setting them, the fabric is the scripted server on 127.0.0.1, the data comes
//! from an ovf-env.xml file and no DHCP runs. Needs no privilege, so it runs for every
//! `cargo test`, as root or not.

mod common;

use azprov::provision::run::{provision_in, MediaSource, Mode, Options, Report};
use azprov::root::{Owners, Sysroot};
use common::{answer, goal_state, Server};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// tests/fixtures, or a copy a user without access to the clone can read (scripts/test runs
/// this test as nobody too).
fn fixtures() -> PathBuf {
    std::env::var_os("AZPROV_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures").into())
}

fn imds_doc() -> String {
    std::fs::read_to_string(fixtures().join("imds/full.json")).unwrap()
}
const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("azprov-unpriv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The fabric: the goal state, a 200 for the health POST, and IMDS.
fn fabric() -> Server {
    Server::start_with(|r, _| {
        if r.path.starts_with("/metadata/instance") {
            answer(200, &imds_doc())
        } else if r.method == "POST" {
            answer(200, "")
        } else {
            goal_state(1)
        }
    })
}

#[test]
fn a_whole_provision_runs_unprivileged_with_the_owners_recorded_not_set() {
    let dir = scratch("run");
    let root_dir = dir.join("root");
    copy_tree(&fixtures().join("root"), &root_dir);
    let dmi = dir.join("dmi");
    std::fs::create_dir_all(&dmi).unwrap();
    std::fs::write(
        dmi.join("chassis_asset_tag"),
        format!("{AZURE_ASSET_TAG}\n"),
    )
    .unwrap();
    let server = fabric();
    // the run's lines, captured for the root's log
    azprov::logger::init(log::LevelFilter::Info);

    let (cfg, _) = azprov::config::load(None, "");
    let mut opts = Options::from_config(root_dir.clone(), &cfg, Mode::Hook);
    opts.remount = false;
    opts.dhcp = false;
    opts.host_keys = false;
    opts.media = MediaSource::File(fixtures().join("ovf/wala.xml"));
    opts.wireserver = Some(server.addr);
    opts.imds = format!("http://{}", server.addr);
    opts.dmi = dmi;
    opts.sys = dir.join("sys");
    opts.dev = dir.join("dev");
    opts.timeout = std::time::Duration::from_secs(20);
    // a KVP device whose host never reads the guest pool: the responder registers (it reads
    // its own REGISTER1 back from the FIFO) and waits its 5 s for a sweep
    opts.kvp_device = dir.join("hv_kvp");
    nix::unistd::mkfifo(
        &opts.kvp_device,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();

    let root = Sysroot::with_owners(&root_dir, Owners::recording());
    let s = provision_in(&opts, &root, None);
    assert_eq!(s.report, Report::Ready, "{s:?}");
    assert_eq!(s.username.as_deref(), Some("azureuser"));

    // Azure was told Ready
    let posts: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1);
    assert!(String::from_utf8_lossy(&posts[0].body).contains("<State>Ready</State>"));

    // the account and its key are written, as the process's own files
    let passwd = std::fs::read_to_string(root_dir.join("etc/passwd")).unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with("azureuser:"))
        .expect("azureuser in passwd");
    let f: Vec<&str> = line.split(':').collect();
    let (uid, gid): (u32, u32) = (f[2].parse().unwrap(), f[3].parse().unwrap());
    let keys = root_dir.join("home/azureuser/.ssh/authorized_keys");
    assert!(std::fs::read_to_string(&keys).unwrap().contains("ssh-rsa"));
    let me = std::fs::metadata(&dir).unwrap().uid();
    assert_eq!(
        std::fs::metadata(&keys).unwrap().uid(),
        me,
        "an owner was set"
    );

    // and the owners a real run sets are the ones recorded
    let owners = root.owners();
    assert_eq!(owners.owner_of(&keys), Some((uid, gid)));
    assert_eq!(
        owners.owner_of(&root_dir.join("home/azureuser/.ssh")),
        Some((uid, gid))
    );
    assert_eq!(
        owners.owner_of(&root_dir.join("var/lib/azprov")),
        Some((0, 0))
    );
    // a file rewritten in place keeps the owner the image gave it
    let image_owner = std::fs::metadata(root_dir.join("etc/group")).unwrap();
    assert_eq!(
        owners.owner_of(&root_dir.join("etc/passwd")),
        Some((image_owner.uid(), image_owner.gid()))
    );
    assert!(root_dir.join("var/lib/azprov/provisioned").exists());

    // the wait for the host's read of the report is in the log and the total
    let log = std::fs::read_to_string(root_dir.join("var/log/azprov.log")).unwrap();
    assert!(
        log.contains("kvp: the host did not read the guest pool within"),
        "{log}"
    );
    assert!(s.timings_ms.total >= 5000, "{:?}", s.timings_ms);
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root_dir.join("var/lib/azprov/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["timings_ms"]["total"], s.timings_ms.total);
    let _ = std::fs::remove_dir_all(&dir);
}
