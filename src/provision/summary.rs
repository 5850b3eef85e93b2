//! What a run did, as `provision --json` prints it and the exit code says it; never holds a
//! secret.

use super::data::ProvisioningData;
use super::state::Timings;
use super::Reason;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Report {
    Ready,
    Failure,
    /// Already provisioned: nothing done, nothing reported.
    Skipped,
    /// Disabled on the kernel command line: nothing done, no packet sent.
    Disabled,
    /// No Azure chassis asset tag: nothing done, no packet sent.
    #[serde(rename = "not-azure")]
    NotAzure,
}

/// The `--json` summary; never holds a secret.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub vm_id: Option<String>,
    pub hostname: Option<String>,
    pub username: Option<String>,
    pub ssh_keys: usize,
    pub custom_data: bool,
    pub user_data: bool,
    pub report: Report,
    pub reason: Option<Reason>,
    /// `ssh-keygen -l` lines of the host keys made in this run.
    pub host_keys: Vec<String>,
    pub timings_ms: Timings,
}

impl Summary {
    /// 0 when Ready was reported (or nothing was needed), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self.report {
            Report::Ready | Report::Skipped | Report::Disabled | Report::NotAzure => 0,
            Report::Failure => 1,
        }
    }
}

impl Summary {
    /// A run's summary before its first stage: only the VM id DMI gave, nothing reported yet.
    pub(super) fn new(vm_id: Option<String>) -> Self {
        Summary {
            vm_id,
            hostname: None,
            username: None,
            ssh_keys: 0,
            custom_data: false,
            user_data: false,
            report: Report::Failure,
            reason: None,
            host_keys: Vec::new(),
            timings_ms: Timings::default(),
        }
    }

    /// Fills in what the summary says about the data about to be written.
    pub(super) fn describe(&mut self, d: &ProvisioningData) {
        self.vm_id = self.vm_id.take().or_else(|| d.vm_id.clone());
        self.hostname = Some(d.hostname.0.to_string());
        self.username = Some(d.username.0.to_string());
        self.ssh_keys = d.keys.len();
        self.custom_data = d.custom_data.is_some();
        self.user_data = d.user_data.is_some();
    }
}
