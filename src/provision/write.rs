//! Writing the provisioning data into the root in the order of the file contract.

use super::data::ProvisioningData;
use super::sysroot::{hash_password, Sysroot, WriteError};
use super::{Failure, Reason};
use crate::secret::Secret;

/// What the writes did that the state records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The admin user was created (not an existing account).
    pub user_created: bool,
}

/// Writes all of `data` into the root in the order of docs/DESIGN.md §3, the marker last.
/// Each step's failure has its own [`Reason`]. `hash` is `data.password` hashed already
/// ([`hash_password`]); when it is None the password is hashed here.
pub fn write_all(
    root: &Sysroot,
    data: &ProvisioningData,
    hash: Option<Result<Secret<String>, WriteError>>,
    vm_id: &str,
) -> Result<Written, Failure> {
    let fail = |reason: Reason| move |e: WriteError| Failure::new(reason, e);
    let user = &data.username.0;
    root.write_hostname(&data.hostname.0)
        .map_err(fail(Reason::WriteHostname))?;
    let hash = match (&data.password, hash) {
        (None, _) => None,
        (Some(_), Some(h)) => Some(h),
        (Some(p), None) => Some(hash_password(p)),
    };
    let hash = hash.transpose().map_err(fail(Reason::CreateUser))?;
    let account = root.ensure_user(user, hash.as_ref()).map_err(|e| match e {
        WriteError::SystemAccount { .. }
        | WriteError::NoLogin { .. }
        | WriteError::SystemGroup { .. } => Failure::new(Reason::InvalidUsername, e),
        e => Failure::new(Reason::CreateUser, e),
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
            .map_err(fail(Reason::WriteKeys))?;
        log::info!("{} SSH key(s) into {}", data.keys.len(), files.join(", "));
    }
    root.write_sudoers(user, data.password.is_some())
        .map_err(fail(Reason::WriteSudoers))?;
    let password_auth = match data.disable_password_auth {
        Some((disable, _)) => !disable,
        None => data.password.is_some(),
    };
    if root
        .write_sshd(password_auth)
        .map_err(fail(Reason::WriteSshd))?
    {
        log::info!(
            "sshd PasswordAuthentication {}",
            if password_auth { "yes" } else { "no" }
        );
    }
    if let Some(c) = &data.custom_data {
        root.write_state("customdata", c.expose())
            .map_err(fail(Reason::WriteCustomData))?;
    }
    if let Some(u) = &data.user_data {
        root.write_state("userdata", u.expose())
            .map_err(fail(Reason::WriteUserData))?;
    }
    if let Some(j) = &data.imds_json {
        root.write_state("imds.json", j.expose())
            .map_err(fail(Reason::WriteImds))?;
    }
    root.write_state("provisioned", format!("{vm_id}\n").as_bytes())
        .map_err(fail(Reason::WriteMarker))?;
    Ok(Written {
        user_created: account.created,
    })
}
