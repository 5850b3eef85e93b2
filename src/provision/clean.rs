//! `azprov clean`: prepares an image for capture, on the running system or on an offline root
//! an image builder mounted, so the next boot provisions as a new VM. It removes only what
//! makes the image one VM and what azprov wrote: azprov's state and log, the SSH host keys,
//! the DHCP leases of the common clients; with `user`, the user azprov created (as its state
//! records), the home, azprov's sudoers and sshd drop-ins; with `machine_id`, /etc/machine-id
//! becomes `uninitialized` (systemd's first-boot state; an empty file would skip first-boot
//! units). It never touches /etc/resolv.conf or anything else azprov did not write.

use super::hostkeys::SSH_DIR;
use super::state::State;
use crate::root::{Sysroot, WriteError, LOG_FILE, SSHD_DROP_IN, STATE_DIR, SUDOERS};
use serde::Serialize;
use std::fs;
use std::path::Path;

const MACHINE_ID: &str = "/etc/machine-id";

type IsLease = fn(&str) -> bool;

/// Directories where DHCP clients keep leases, and the file names that are leases there:
/// ISC dhclient (Debian, RHEL), NetworkManager, dhcpcd, wicked (SUSE), systemd-networkd (runtime).
const LEASE_DIRS: [(&str, IsLease); 7] = [
    ("/var/lib/dhcp", |n| {
        n.starts_with("dhclient") && n.contains(".lease")
    }),
    ("/var/lib/dhclient", |n| n.contains(".lease")),
    ("/var/lib/NetworkManager", |n| n.ends_with(".lease")),
    ("/var/lib/dhcpcd", |n| n.contains(".lease")),
    ("/var/lib/dhcpcd5", |n| n.contains(".lease")),
    ("/var/lib/wicked", |n| n.starts_with("lease-")),
    ("/run/systemd/netif/leases", |_| true),
];

#[derive(Debug, Clone, Copy, Default)]
pub struct CleanOptions {
    pub user: bool,
    pub machine_id: bool,
    pub dry_run: bool,
}

/// What `clean` removed (or, with `dry_run`, would remove): paths as the root sees them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cleaned {
    pub dry_run: bool,
    pub removed: Vec<String>,
    /// The user removed (with `--user`).
    pub user: Option<String>,
    /// /etc/machine-id set to `uninitialized`.
    pub machine_id: bool,
    /// What was left alone, and why.
    pub notes: Vec<String>,
}

/// Cleans `root` (see the module comment). Every path is resolved inside the root.
pub fn clean(root: &Sysroot, o: CleanOptions) -> Result<Cleaned, WriteError> {
    let mut c = Cleaned {
        dry_run: o.dry_run,
        ..Cleaned::default()
    };
    // read before the state directory goes
    let state = State::load(root);
    if o.user {
        clean_user(root, state.as_ref(), o.dry_run, &mut c)?;
    }
    remove(root, STATE_DIR, o.dry_run, &mut c)?;
    remove(root, LOG_FILE, o.dry_run, &mut c)?;
    // this boot's RSA helper, still searching, would put a key into the cleaned image
    if let Ok(ssh) = root.resolve_full(SSH_DIR) {
        for pid in super::hostkeys::later::stop_helpers(&ssh, o.dry_run) {
            c.notes.push(format!(
                "{} the RSA host key helper (pid {pid}) that would have written a key after the clean",
                if o.dry_run { "would stop" } else { "stopped" }
            ));
        }
    }
    for name in names_in(root, SSH_DIR)? {
        let stem = name
            .strip_suffix(".pub")
            .map(|s| s.strip_suffix("-cert").unwrap_or(s))
            .unwrap_or(&name);
        if stem.starts_with("ssh_host_") && stem.ends_with("_key") {
            remove(root, &format!("{SSH_DIR}/{name}"), o.dry_run, &mut c)?;
        }
    }
    for (dir, is_lease) in LEASE_DIRS {
        for name in names_in(root, dir)? {
            if is_lease(&name) {
                remove(root, &format!("{dir}/{name}"), o.dry_run, &mut c)?;
            }
        }
    }
    if o.machine_id {
        if !o.dry_run {
            root.write(MACHINE_ID, b"uninitialized\n", 0o444, (0, 0))?;
        }
        c.machine_id = true;
    }
    Ok(c)
}

/// The user azprov created, its home, and azprov's sudoers and sshd drop-ins.
fn clean_user(
    root: &Sysroot,
    state: Option<&State>,
    dry_run: bool,
    c: &mut Cleaned,
) -> Result<(), WriteError> {
    // the state's word, or the claim written before passwd named the user (a first boot cut
    // short before its state was saved)
    let owned = root.owned_user();
    let recorded = state.and_then(|s| s.username.as_deref().map(|u| (u, s.user_created)));
    let user = match (recorded, owned.as_deref()) {
        (Some((u, false)), Some(o)) if u == o => Some((u, true)),
        (None, Some(o)) => Some((o, true)),
        (r, _) => r,
    };
    match user {
        None => c
            .notes
            .push("no user recorded in azprov's state: no user removed".into()),
        Some((user, false)) => c.notes.push(format!(
            "user {user} existed before azprov provisioned it: kept"
        )),
        Some((user, true)) => {
            let home = if dry_run {
                root.user_home(user)?
            } else {
                root.remove_user(user)?
            };
            match home {
                None => c
                    .notes
                    .push(format!("user {user} is not in /etc/passwd any more")),
                Some(home) => {
                    c.user = Some(user.to_string());
                    // only a home of its own: never /, never a system directory
                    let own = Path::new(&home).starts_with("/home/")
                        || Path::new(&home).file_name() == Some(user.as_ref());
                    if own && home != "/" {
                        remove(root, &home, dry_run, c)?;
                    } else if !home.is_empty() {
                        c.notes
                            .push(format!("home {home} is not the user's own: kept"));
                    }
                }
            }
        }
    }
    remove(root, SUDOERS, dry_run, c)?;
    remove(root, SSHD_DROP_IN, dry_run, c)?;
    if root.remove_sshd_setting(dry_run)? {
        c.removed
            .push(format!("{} (azprov's two lines)", crate::root::SSHD_CONFIG));
    }
    Ok(())
}

/// The names in a directory of the root; none when it does not exist.
fn names_in(root: &Sysroot, dir: &str) -> Result<Vec<String>, WriteError> {
    let p = root.resolve_full(dir)?;
    Ok(if p.is_dir() {
        crate::sys::sorted_names(&p)
    } else {
        Vec::new()
    })
}

/// Removes `path` (a directory with its contents; a symlink itself, never its target) and
/// records it; nothing when it does not exist.
fn remove(root: &Sysroot, path: &str, dry_run: bool, c: &mut Cleaned) -> Result<(), WriteError> {
    let present = if dry_run {
        fs::symlink_metadata(root.resolve(path)?).is_ok()
    } else {
        root.remove(path)?
    };
    if present {
        c.removed.push(path.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("azprov-clean-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        for dir in [
            "etc/ssh/sshd_config.d",
            "etc/sudoers.d",
            "var/lib/azprov",
            "var/lib/dhcp",
            "var/log",
            "home/azureuser/.ssh",
            "home/other",
        ] {
            fs::create_dir_all(d.join(dir)).unwrap();
        }
        let w = |p: &str, t: &str| fs::write(d.join(p), t).unwrap();
        w("etc/passwd", "root:x:0:0::/root:/bin/bash\nother:x:1001:1001::/home/other:/bin/sh\nazureuser:x:1000:1000::/home/azureuser:/bin/bash\n");
        w(
            "etc/shadow",
            "root:*:1::::::\nother:!:1::::::\nazureuser:!:1:0:99999:7:::\n",
        );
        w(
            "etc/group",
            "root:x:0:\nsudo:x:27:other,azureuser\nother:x:1001:\nazureuser:x:1000:\n",
        );
        w(
            "etc/gshadow",
            "root:*::\nsudo:*::other,azureuser\nother:!::\nazureuser:!::\n",
        );
        w("etc/resolv.conf", "nameserver 168.63.129.16\n");
        w("etc/machine-id", "0123456789abcdef0123456789abcdef\n");
        w("etc/ssh/ssh_host_ed25519_key", "k");
        w("etc/ssh/ssh_host_ed25519_key.pub", "k");
        w("etc/ssh/ssh_host_rsa_key-cert.pub", "k");
        w("etc/ssh/sshd_config", "config\n");
        w(
            "etc/ssh/sshd_config.d/50-azprov.conf",
            "PasswordAuthentication no\n",
        );
        w("etc/ssh/sshd_config.d/60-admin.conf", "mine\n");
        w(
            "etc/sudoers.d/90-azprov",
            "azureuser ALL=(ALL) NOPASSWD:ALL\n",
        );
        w("var/lib/azprov/provisioned", "id\n");
        w(
            "var/lib/azprov/state.json",
            r#"{"username":"azureuser","user_created":true}"#,
        );
        w("var/lib/dhcp/dhclient.eth0.leases", "lease {}\n");
        w("var/log/azprov.log", "log\n");
        w("var/log/syslog", "other log\n");
        w("home/azureuser/.ssh/authorized_keys", "ssh-ed25519 AAAA\n");
        d
    }

    #[test]
    fn a_dry_run_lists_and_removes_nothing() {
        let d = tree("dry");
        let c = clean(
            &Sysroot::new(&d),
            CleanOptions {
                user: true,
                machine_id: true,
                dry_run: true,
            },
        )
        .unwrap();
        assert_eq!(
            c.removed,
            [
                "/home/azureuser",
                SUDOERS,
                SSHD_DROP_IN,
                STATE_DIR,
                LOG_FILE,
                "/etc/ssh/ssh_host_ed25519_key",
                "/etc/ssh/ssh_host_ed25519_key.pub",
                "/etc/ssh/ssh_host_rsa_key-cert.pub",
                "/var/lib/dhcp/dhclient.eth0.leases",
            ]
        );
        assert!(d.join("var/lib/azprov/provisioned").exists());
        assert!(d.join("home/azureuser").exists());
        assert!(fs::read_to_string(d.join("etc/passwd"))
            .unwrap()
            .contains("azureuser"));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn clean_with_user_and_machine_id_leaves_only_what_azprov_did_not_write() {
        let d = tree("full");
        let c = clean(
            &Sysroot::new(&d),
            CleanOptions {
                user: true,
                machine_id: true,
                dry_run: false,
            },
        )
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("azureuser"));
        let text = |p: &str| fs::read_to_string(d.join(p)).unwrap();
        assert_eq!(
            text("etc/passwd"),
            "root:x:0:0::/root:/bin/bash\nother:x:1001:1001::/home/other:/bin/sh\n"
        );
        assert_eq!(text("etc/shadow"), "root:*:1::::::\nother:!:1::::::\n");
        assert_eq!(
            text("etc/group"),
            "root:x:0:\nsudo:x:27:other\nother:x:1001:\n"
        );
        assert_eq!(text("etc/gshadow"), "root:*::\nsudo:*::other\nother:!::\n");
        assert_eq!(text("etc/machine-id"), "uninitialized\n");
        assert_eq!(text("etc/resolv.conf"), "nameserver 168.63.129.16\n");
        assert_eq!(text("etc/ssh/sshd_config"), "config\n");
        assert_eq!(text("etc/ssh/sshd_config.d/60-admin.conf"), "mine\n");
        assert_eq!(text("var/log/syslog"), "other log\n");
        for gone in [
            "home/azureuser",
            "var/lib/azprov",
            "var/log/azprov.log",
            "etc/ssh/ssh_host_ed25519_key",
            "etc/sudoers.d/90-azprov",
            "etc/ssh/sshd_config.d/50-azprov.conf",
            "var/lib/dhcp/dhclient.eth0.leases",
        ] {
            assert!(!d.join(gone).exists(), "{gone}");
        }
        assert!(d.join("home/other").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_existing_user_and_a_foreign_home_are_kept() {
        let d = tree("kept");
        fs::write(
            d.join("var/lib/azprov/state.json"),
            r#"{"username":"azureuser","user_created":false}"#,
        )
        .unwrap();
        let c = clean(
            &Sysroot::new(&d),
            CleanOptions {
                user: true,
                ..CleanOptions::default()
            },
        )
        .unwrap();
        assert_eq!(c.user, None);
        assert!(
            c.notes[0].contains("existed before azprov"),
            "{:?}",
            c.notes
        );
        assert!(fs::read_to_string(d.join("etc/passwd"))
            .unwrap()
            .contains("azureuser"));
        // a symlinked state directory is removed as a link, its target stays
        let outside = d.with_extension("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("keep"), "x").unwrap();
        assert!(!d.join("var/lib/azprov").exists(), "the state went");
        symlink(&outside, d.join("var/lib/azprov")).unwrap();
        let c = clean(&Sysroot::new(&d), CleanOptions::default()).unwrap();
        assert_eq!(c.removed, [STATE_DIR]);
        assert!(fs::symlink_metadata(d.join("var/lib/azprov")).is_err());
        assert!(outside.join("keep").exists());
        fs::remove_dir_all(&d).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    }
}
