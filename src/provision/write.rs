//! Writing the provisioning data into the root in the order of the file contract.

use super::data::ProvisioningData;
use super::state::{Acked, State, Written};
use super::{Failure, Reason};
use crate::root::{
    hash_password, Sysroot, WriteError, SSHD_CONFIG, SSHD_DROP_IN, STATE_DIR, SUDOERS,
};
use crate::secret::Secret;

/// Writes all of `data` into the root as docs/contracts.md, "The file contract", lists it, the
/// marker last, in two chains beside each other: the account (user, then its keys, then sudoers: no
/// sudoers line for a user name that was refused) and the system files (hostname, sshd, custom
/// data, user data, the IMDS document), in one batch ([`Sysroot::batch`]): every file is written to
/// its temporary, one syncfs makes them durable, they are renamed and synced again (after shadow
/// too, so passwd never names a missing group on disk), so every file is the old or the new one
/// after a crash and all are on disk before the marker says so. Two chains let the journal commit
/// both threads' changes together. When both fail, the reason is the failed step that comes first
/// in the contract's order. Each step's failure has its own [`Reason`]; a failed syncfs is the
/// marker's. `hash` is `data.password` hashed already ([`hash_password`]); when it is None the
/// password is hashed here.
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
        (Err(a), Err(b)) => return Err(if a.order < b.order { a } else { b }.failure),
        (Err(step), _) | (_, Err(step)) => return Err(step.failure),
    };
    synced.map_err(|e| {
        supported(
            root,
            Failure::new(reason_for(&e, Reason::WriteMarker), &e),
            &e,
        )
    })?;
    // written so the admin can log in and look; not provisioned: no marker, NotReady
    if let Some(f) = &data.incomplete {
        log::warn!(
            "the user, keys and hostname are written so the admin can log in and see why; no marker: {f}"
        );
        return Err(f.clone());
    }
    let owed = State {
        vm_id: (vm_id != super::state::UNKNOWN_VM).then(|| vm_id.to_string()),
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

/// A step that failed: its place in the contract's order (docs/contracts.md, "The file
/// contract"), so the earlier of two concurrent failures is the one reported, and the failure.
struct FailedStep {
    order: u8,
    failure: Failure,
}

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
    (Reason::WriteSudoers, &[SUDOERS, "/etc/sudoers"]),
    (Reason::WriteSshd, &[SSHD_DROP_IN, SSHD_CONFIG]),
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
fn fail(root: &Sysroot, reason: Reason) -> impl Fn(WriteError) -> FailedStep + '_ {
    move |e| {
        let r = reason_for(&e, reason);
        let at = STEPS.iter().position(|(s, _)| *s == r).unwrap_or(0);
        FailedStep {
            order: u8::try_from(at).unwrap_or(0),
            failure: supported(root, Failure::new(r, &e), &e),
        }
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
) -> Result<crate::root::Account, FailedStep> {
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
        | WriteError::SystemGroup { .. } => FailedStep {
            order: 1,
            failure: Failure::new(Reason::InvalidUsername, e),
        },
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

/// The files in /var/lib/azprov that hold one VM's data.
pub const VM_DATA: [&str; 3] = ["customdata", "userdata", "imds.json"];

/// The system chain: hostname, sshd's password setting, custom data, user data, IMDS.
fn write_system(root: &Sysroot, data: &ProvisioningData) -> Result<(), FailedStep> {
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
    // what this VM's data does not replace goes: an earlier VM's script must never run here
    // (VM_DATA, also removed at the start of a new VM's run)
    let state = [
        ("customdata", &data.custom_data, Reason::WriteCustomData),
        ("userdata", &data.user_data, Reason::WriteUserData),
        ("imds.json", &data.imds_json, Reason::WriteImds),
    ];
    for (name, value, reason) in state {
        match value {
            Some(v) => root.write_state(name, v.expose()),
            None => root.remove_file(&format!("{STATE_DIR}/{name}")),
        }
        .map_err(fail(root, reason))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
