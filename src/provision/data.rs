//! What a run writes into the root, validated: the value types are the root's
//! (`crate::root::values`).

use super::Failure;
pub use crate::root::values::{
    Hostname, Invalid, KeyEntry, Source, SshKey, Username, SSH_KEYS_MAX,
};
use crate::secret::Secret;

/// Everything that is written into the root, validated.
#[derive(Debug, Clone)]
pub struct ProvisioningData {
    pub vm_id: Option<String>,
    pub hostname: (Hostname, Source),
    pub username: (Username, Source),
    pub keys: Vec<KeyEntry>,
    pub password: Option<Secret<String>>,
    /// `PasswordAuthentication no` when true.
    pub disable_password_auth: Option<(bool, Source)>,
    pub custom_data: Option<Secret<Vec<u8>>>,
    pub user_data: Option<Secret<Vec<u8>>>,
    pub imds_json: Option<Secret<Vec<u8>>>,
    /// The data lets the admin log in, but provisioning failed for this reason: written all
    /// the same, with no marker, and reported (custom data IMDS announces that never came).
    pub incomplete: Option<Failure>,
}
