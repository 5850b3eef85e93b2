//! Writing the provisioning data into the root in the order of the file contract.

use super::data::ProvisioningData;
use super::state::{Acked, State};
use super::sysroot::{hash_password, Sysroot, WriteError, SSHD_CONFIG};
use super::{Failure, Reason};
use crate::secret::Secret;

/// What the writes did that the state records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The admin user was created (not an existing account).
    pub user_created: bool,
}

/// Writes all of `data` into the root as docs/DESIGN.md §3 lists it, the marker last, in two
/// chains beside each other: the account (user, then its keys, then sudoers: no sudoers line
/// for a user name that was refused) and the system files (hostname, sshd, custom data, user
/// data, the IMDS document), in one batch ([`Sysroot::batch`]): every file is written to its
/// temporary, one syncfs makes them durable, they are renamed and synced again (after shadow
/// too, so passwd never names a missing group on disk), so every file is the old or the new one
/// after a crash and all are on disk before the marker says so. Two chains let the journal
/// commit both threads' changes together. When both fail, the reason is the
/// failed step that comes first in the contract's order. Each step's failure has its own
/// [`Reason`]; a failed syncfs is the marker's. `hash` is `data.password` hashed already
/// ([`hash_password`]); when it is None the password is hashed here.
///
/// Before the marker, `owed` is saved as the state with the report `pending`: from the moment
/// the marker says "provisioned", the state on disk says Ready is still owed, so a run cut
/// short before the health report is acknowledged is reported by the next boot.
pub fn write_all(
    root: &Sysroot,
    data: &ProvisioningData,
    hash: Option<Result<Secret<String>, WriteError>>,
    vm_id: &str,
    owed: &State,
) -> Result<Written, Failure> {
    let batch = root.batch();
    let (account, system) = std::thread::scope(|s| {
        let account = s.spawn(|| write_account(root, data, hash));
        let system = write_system(root, data);
        let account = account
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (account, system)
    });
    // what the chains wrote goes into place even when a step failed, as it would have one
    // file at a time: the VM boots on for debugging with the hostname, the user…
    let synced = batch.sync();
    drop(batch);
    let account = match (account, system) {
        (Ok(a), Ok(())) => a,
        (Err((i, e)), Err((j, f))) => return Err(if i < j { e } else { f }),
        (Err((_, e)), _) | (_, Err((_, e))) => return Err(e),
    };
    synced.map_err(|e| {
        supported(
            root,
            Failure::new(reason_for(&e, Reason::WriteMarker), &e),
            &e,
        )
    })?;
    let owed = State {
        vm_id: Some(vm_id.to_string()),
        provisioned_at: Some(crate::time::now_rfc3339()),
        report: Some(Acked::Pending),
        user_created: owed.user_created || account.created,
        ..owed.clone()
    };
    owed.save(root)
        .map_err(|e| Failure::new(Reason::WriteMarker, e))?;
    root.write_state("provisioned", format!("{vm_id}\n").as_bytes())
        .map_err(|e| Failure::new(Reason::WriteMarker, e))?;
    Ok(Written {
        user_created: account.created,
    })
}

/// A failed step: its place in the contract's order (docs/DESIGN.md §3), and the failure.
type Step = (u8, Failure);

/// The contract's steps in order, with the files each writes (as the end of a host path).
const STEPS: &[(Reason, &[&str])] = &[
    (Reason::WriteHostname, &["/etc/hostname", "/etc/hosts"]),
    (
        Reason::CreateUser,
        &[
            "/etc/passwd",
            "/etc/shadow",
            "/etc/group",
            "/etc/gshadow",
            "/etc/subuid",
            "/etc/subgid",
            "/var/lib/azprov/user",
        ],
    ),
    (Reason::WriteKeys, &["/authorized_keys"]),
    (
        Reason::WriteSudoers,
        &["/etc/sudoers.d/90-azprov", "/etc/sudoers"],
    ),
    (
        Reason::WriteSshd,
        &[
            "/etc/ssh/sshd_config.d/50-azprov.conf",
            "/etc/ssh/sshd_config",
        ],
    ),
    (Reason::WriteCustomData, &["/var/lib/azprov/customdata"]),
    (Reason::WriteUserData, &["/var/lib/azprov/userdata"]),
    (Reason::WriteImds, &["/var/lib/azprov/imds.json"]),
];

/// The step a failed write belongs to: the one whose file it names (a batch's barrier renames
/// every chain's files, so the step that ran it is not always the one that failed), else
/// `fallback`.
fn reason_for(e: &WriteError, fallback: Reason) -> Reason {
    let WriteError::Io { path, .. } = e else {
        return fallback;
    };
    STEPS
        .iter()
        .find(|(_, files)| files.iter().any(|f| path.ends_with(f)))
        .map_or(fallback, |(r, _)| *r)
}

/// `reason`'s failure for `e`, or the failure of the step whose file `e` names, with its place
/// in the contract's order.
fn fail(root: &Sysroot, reason: Reason) -> impl Fn(WriteError) -> Step + '_ {
    move |e| {
        let r = reason_for(&e, reason);
        let at = STEPS.iter().position(|(s, _)| *s == r).unwrap_or(0);
        (
            u8::try_from(at).unwrap_or(0),
            supported(root, Failure::new(r, &e), &e),
        )
    }
}

/// `f` with what a support engineer needs from `e` as the description's supporting data: the
/// path as the root sees it, the operation and the errno's name (never file contents).
fn supported(root: &Sysroot, f: Failure, e: &WriteError) -> Failure {
    match e {
        WriteError::Io { op, path, source } => {
            let view = std::path::Path::new(path)
                .strip_prefix(root.root())
                .map_or_else(|_| path.clone(), |p| format!("/{}", p.display()));
            let f = f.with("path", view).with("op", *op);
            match source.raw_os_error() {
                Some(n) => f.with("errno", format!("{:?}", crate::sys::Errno::from_raw(n))),
                None => f,
            }
        }
        WriteError::HomeOwned { home, .. } => f.with("path", home.clone()),
        _ => f,
    }
}

/// The account chain: the user (passwd, shadow, group, gshadow, home), its keys, sudoers.
fn write_account(
    root: &Sysroot,
    data: &ProvisioningData,
    hash: Option<Result<Secret<String>, WriteError>>,
) -> Result<super::sysroot::Account, Step> {
    let user = &data.username.0;
    let hash = match (&data.password, hash) {
        (None, _) => None,
        (Some(_), Some(h)) => Some(h),
        (Some(p), None) => Some(hash_password(p)),
    };
    let hash = hash.transpose().map_err(fail(root, Reason::CreateUser))?;
    let account = root.ensure_user(user, hash.as_ref()).map_err(|e| match e {
        WriteError::SystemAccount { .. }
        | WriteError::NoLogin { .. }
        | WriteError::SystemGroup { .. } => (1, Failure::new(Reason::InvalidUsername, e)),
        e => fail(root, Reason::CreateUser)(e),
    })?;
    log::info!(
        "user {user} (uid {}, {}) from {}",
        account.uid,
        if account.created {
            "created"
        } else {
            "existing"
        },
        data.username.1
    );
    if !data.keys.is_empty() {
        let files = root
            .write_keys(&account, user, &data.keys)
            .map_err(fail(root, Reason::WriteKeys))?;
        log::info!("{} SSH key(s) into {}", data.keys.len(), files.join(", "));
    }
    root.write_sudoers(user, data.password.is_some())
        .map_err(fail(root, Reason::WriteSudoers))?;
    Ok(account)
}

/// The system chain: hostname, sshd's password setting, custom data, user data, IMDS.
fn write_system(root: &Sysroot, data: &ProvisioningData) -> Result<(), Step> {
    root.write_hostname(&data.hostname.0)
        .map_err(fail(root, Reason::WriteHostname))?;
    let password_auth = match data.disable_password_auth {
        Some((disable, _)) => !disable,
        None => data.password.is_some(),
    };
    match root
        .write_sshd(password_auth)
        .map_err(fail(root, Reason::WriteSshd))?
    {
        Some(at) => log::info!(
            "sshd PasswordAuthentication {} in {at}{}",
            if password_auth { "yes" } else { "no" },
            if at == SSHD_CONFIG {
                " (it reads no drop-in of azprov's first)"
            } else {
                ""
            }
        ),
        None => log::info!("sshd: no /etc/ssh/sshd_config in the root; nothing written"),
    }
    if let Some(c) = &data.custom_data {
        root.write_state("customdata", c.expose())
            .map_err(fail(root, Reason::WriteCustomData))?;
    }
    if let Some(u) = &data.user_data {
        root.write_state("userdata", u.expose())
            .map_err(fail(root, Reason::WriteUserData))?;
    }
    if let Some(j) = &data.imds_json {
        root.write_state("imds.json", j.expose())
            .map_err(fail(root, Reason::WriteImds))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::data::{Hostname, KeyEntry, Source, SshKey, Username};
    use crate::provision::sysroot::tests::seeded;
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
                (
                    view,
                    crate::provision::sysroot::label::get(std::path::Path::new(p)),
                )
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
        root.write(crate::provision::sysroot::LOG_FILE, b"x\n", 0o640, (0, 0))
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
            let got = crate::provision::sysroot::label::get(&dir.join(&path[1..]));
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
}
