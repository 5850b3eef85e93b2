use super::*;
use crate::root::tests::seeded;
use crate::root::values::{Hostname, KeyEntry, Source, SshKey, Username};
use std::sync::atomic::Ordering;

fn data(user: &str) -> ProvisioningData {
    ProvisioningData {
        vm_id: Some("vm-1".into()),
        hostname: (Hostname::parse("vm-chains").unwrap(), Source::Imds),
        username: (Username::parse(user).unwrap(), Source::Imds),
        keys: vec![KeyEntry {
            key: SshKey::parse("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGt0ZXN0 a@b").unwrap(),
            path: None,
            source: Source::Imds,
        }],
        password: None,
        disable_password_auth: None,
        custom_data: Some(Secret::new(b"#!/bin/sh\n".to_vec())),
        user_data: None,
        imds_json: None,
        incomplete: None,
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn both_chains_write_and_the_marker_comes_last() {
    let (dir, root) = seeded("chains-ok");
    let w = write_all(&root, &data("azureuser"), None, "vm-1", &State::default()).unwrap();
    assert!(w.user_created);
    for f in [
        "etc/hostname",
        "etc/sudoers.d/90-azprov",
        "home/azureuser/.ssh/authorized_keys",
        "var/lib/azprov/customdata",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("var/lib/azprov/provisioned")).unwrap(),
        "vm-1\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_new_vm_without_custom_or_user_data_keeps_nothing_of_the_previous_vms() {
    let (dir, root) = seeded("stale-data");
    let first = ProvisioningData {
        user_data: Some(Secret::new(b"A-USERDATA\n".to_vec())),
        imds_json: Some(Secret::new(b"{}".to_vec())),
        ..data("azureuser")
    };
    write_all(&root, &first, None, "vm-a", &State::default()).unwrap();
    let state = dir.join("var/lib/azprov");
    for f in ["customdata", "userdata", "imds.json"] {
        assert!(state.join(f).exists(), "{f}");
    }
    // the disk boots as VM B, whose deployment has no custom data, user data or IMDS document
    let second = ProvisioningData {
        custom_data: None,
        vm_id: Some("vm-b".into()),
        ..data("azureuser")
    };
    write_all(&root, &second, None, "vm-b", &State::default()).unwrap();
    for f in ["customdata", "userdata", "imds.json"] {
        assert!(!state.join(f).exists(), "{f} of VM A is still there");
    }
    assert_eq!(
        std::fs::read_to_string(state.join("provisioned")).unwrap(),
        "vm-b\n"
    );
    // and a third run with nothing to remove is as happy; with no VM id known, the state
    // says none (null), as the run's summary does, and the marker still says something
    use crate::provision::state::UNKNOWN_VM;
    write_all(&root, &second, None, UNKNOWN_VM, &State::default()).unwrap();
    assert_eq!(State::load(&root).unwrap().vm_id, None);
    assert_eq!(root.read_marker().as_deref(), Some(UNKNOWN_VM));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn the_files_reach_the_disk_by_syncfs_before_passwd_the_home_and_the_marker() {
    let (dir, root) = seeded("chains-batch");
    write_all(&root, &data("azureuser"), None, "vm-1", &State::default()).unwrap();
    // inside the batch no rename fsynced its directory; the owed state and the marker,
    // after it, did. syncfs: before and after the group/shadow renames, before the home's
    // rename, before and after the last renames
    assert_eq!(root.dir_syncs.load(Ordering::SeqCst), 2);
    assert_eq!(root.syncfs_calls.load(Ordering::SeqCst), 5);
    assert!(dir.join("var/lib/azprov/provisioned").exists());
    let left = std::process::Command::new("find")
        .arg(&dir)
        .args(["-name", "*.azprov-tmp"])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "temporaries left: {left:?}");
    // the batch ended with write_all: a later write syncs its directory again
    root.write("/etc/motd", b"hi\n", 0o644, (0, 0)).unwrap();
    assert_eq!(root.dir_syncs.load(Ordering::SeqCst), 3);
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_refused_user_gets_no_sudoers_line_and_no_marker() {
    let (dir, root) = seeded("chains-daemon");
    let e = write_all(&root, &data("daemon"), None, "vm-1", &State::default()).unwrap_err();
    assert_eq!(e.reason, Reason::InvalidUsername);
    assert!(!dir.join("etc/sudoers.d/90-azprov").exists());
    assert!(!dir.join("var/lib/azprov/provisioned").exists());
    // the other chain's files are in place all the same
    assert_eq!(
        std::fs::read_to_string(dir.join("etc/hostname")).unwrap(),
        "vm-chains\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn when_both_chains_fail_the_first_step_in_the_contract_is_the_reason() {
    // no write succeeds: the hostname (system chain) and the user (account chain) fail
    let (dir, root) = seeded("chains-full");
    root.writes_left.store(0, Ordering::SeqCst);
    let e = write_all(&root, &data("azureuser"), None, "vm-1", &State::default()).unwrap_err();
    assert_eq!(e.reason, Reason::WriteHostname);
    assert!(e.detail.contains("No space left"), "{}", e.detail);
    // one write allowed: whichever chain takes it, a later step fails and no marker is
    // written
    let (dir2, root2) = seeded("chains-one");
    root2.writes_left.store(1, Ordering::SeqCst);
    assert!(write_all(&root2, &data("azureuser"), None, "vm-1", &State::default()).is_err());
    assert!(!dir2.join("var/lib/azprov/provisioned").exists());
    for d in [dir, dir2] {
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// The root `seeded` makes, with Debian 12's refpolicy configured (enforcing).
fn selinux_root(name: &str) -> (std::path::PathBuf, Sysroot) {
    let (dir, _) = seeded(name);
    let files = dir.join("etc/selinux/default/contexts/files");
    std::fs::create_dir_all(&files).unwrap();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/selinux/debian12-default"
    );
    for f in [
        "file_contexts",
        "file_contexts.homedirs",
        "file_contexts.subs_dist",
    ] {
        std::fs::copy(format!("{fixture}/{f}"), files.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("etc/selinux/config"),
        "SELINUX=enforcing\nSELINUXTYPE=default\n",
    )
    .unwrap();
    (dir.clone(), Sysroot::new(dir))
}

/// Every path below `dir` with its label, skipping the fixture's own files.
fn labels_below(dir: &std::path::Path, rel: &str) -> Vec<(String, Option<String>)> {
    let out = std::process::Command::new("find")
        .arg(dir.join(rel.trim_start_matches('/')))
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|p| {
            let view = format!(
                "/{}",
                p.strip_prefix(dir.to_str().unwrap())
                    .unwrap()
                    .trim_start_matches('/')
            );
            (view, crate::root::label::get(std::path::Path::new(p)))
        })
        .collect()
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn on_an_selinux_root_everything_written_has_the_policys_label() {
    let (dir, root) = selinux_root("chains-selinux");
    write_all(&root, &data("azureuser"), None, "vm-1", &State::default()).unwrap();
    root.write_state("state.json", b"{}").unwrap();
    root.mkdir("/var/log", 0o755, (0, 0)).unwrap();
    root.write(crate::root::LOG_FILE, b"x\n", 0o640, (0, 0))
        .unwrap();
    // what libselinux's matchpathcon gives these paths under this policy
    // (provision::selinux::tests::MATCHPATHCON)
    let etc = "system_u:object_r:etc_t:s0";
    let want = [
        ("/etc/passwd", etc),
        ("/etc/group", etc),
        ("/etc/shadow", "system_u:object_r:shadow_t:s0"),
        ("/etc/gshadow", "system_u:object_r:shadow_t:s0"),
        ("/etc/hostname", "system_u:object_r:net_conf_t:s0"),
        ("/etc/hosts", "system_u:object_r:net_conf_t:s0"),
        ("/etc/sudoers.d/90-azprov", etc),
        ("/etc/ssh/sshd_config.d/50-azprov.conf", etc),
        (
            "/home/azureuser",
            "unconfined_u:object_r:user_home_dir_t:s0",
        ),
        (
            "/home/azureuser/.bashrc",
            "unconfined_u:object_r:user_home_t:s0",
        ),
        (
            "/home/azureuser/.profile",
            "unconfined_u:object_r:user_home_t:s0",
        ),
        (
            "/home/azureuser/.ssh",
            "unconfined_u:object_r:ssh_home_t:s0",
        ),
        (
            "/home/azureuser/.ssh/authorized_keys",
            "unconfined_u:object_r:ssh_home_t:s0",
        ),
        ("/var/lib/azprov", "system_u:object_r:var_lib_t:s0"),
        (
            "/var/lib/azprov/customdata",
            "system_u:object_r:var_lib_t:s0",
        ),
        (
            "/var/lib/azprov/provisioned",
            "system_u:object_r:var_lib_t:s0",
        ),
        (
            "/var/lib/azprov/state.json",
            "system_u:object_r:var_lib_t:s0",
        ),
        ("/var/log/azprov.log", "system_u:object_r:var_log_t:s0"),
    ];
    for (path, label) in want {
        let got = crate::root::label::get(&dir.join(&path[1..]));
        assert_eq!(got.as_deref(), Some(label), "{path}");
    }
    // and nothing below the home or the state directory went unlabelled
    for (path, label) in labels_below(&dir, "/home/azureuser")
        .into_iter()
        .chain(labels_below(&dir, "/var/lib/azprov"))
    {
        assert!(label.is_some(), "{path} has no label");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_root_without_selinux_gets_no_label_and_a_disabled_one_neither() {
    let (dir, root) = seeded("chains-no-selinux");
    write_all(&root, &data("azureuser"), None, "vm-1", &State::default()).unwrap();
    let (dir2, _) = selinux_root("chains-selinux-off");
    std::fs::write(dir2.join("etc/selinux/config"), "SELINUX=disabled\n").unwrap();
    let root2 = Sysroot::new(&dir2);
    write_all(&root2, &data("azureuser"), None, "vm-1", &State::default()).unwrap();
    for d in [&dir, &dir2] {
        for rel in ["/etc/passwd", "/home/azureuser", "/var/lib/azprov"] {
            for (path, label) in labels_below(d, rel) {
                assert_eq!(label, None, "{path}");
            }
        }
    }
    for d in [dir, dir2] {
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_rename_that_fails_in_a_barrier_is_reported_as_its_own_files_step() {
    // /etc/hostname is a directory with something in it: its temporary is written, and
    // the rename fails in whichever barrier runs first (the account chain's, after shadow)
    let (dir, root) = seeded("chains-rename");
    std::fs::remove_file(dir.join("etc/hostname")).unwrap();
    std::fs::create_dir_all(dir.join("etc/hostname/x")).unwrap();
    let e = write_all(&root, &data("azureuser"), None, "vm-1", &State::default()).unwrap_err();
    assert_eq!(e.reason, Reason::WriteHostname, "{}", e.detail);
    assert!(e.detail.contains("etc/hostname"), "{}", e.detail);
    // Azure's description gets the path as the root sees it, the operation and the errno
    assert_eq!(
        e.extra,
        [
            ("path", "/etc/hostname".to_string()),
            ("op", "rename".to_string()),
            ("errno", "EISDIR".to_string())
        ]
    );
    assert!(!dir.join("var/lib/azprov/provisioned").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn the_state_owing_ready_is_on_disk_with_the_marker() {
    let (dir, root) = seeded("chains-owed");
    let owed = State {
        hostname: Some("vm-chains".into()),
        username: Some("azureuser".into()),
        ..State::default()
    };
    write_all(&root, &data("azureuser"), None, "vm-1", &owed).unwrap();
    let st = State::load(&root).unwrap();
    assert_eq!(st.report, Some(Acked::Pending));
    assert_eq!(st.vm_id.as_deref(), Some("vm-1"));
    assert!(st.provisioned_at.is_some() && st.user_created);
    assert_eq!(st.username.as_deref(), Some("azureuser"));
    assert_eq!(root.owned_user().as_deref(), Some("azureuser"));
    std::fs::remove_dir_all(&dir).unwrap();
}
