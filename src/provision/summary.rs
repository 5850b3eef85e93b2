//! What a run did, as `provision --json` prints it and the exit code says it; never holds a
//! secret.

use super::data::ProvisioningData;
use super::Reason;
use serde::Serialize;

/// How long each stage of the run took, in milliseconds (`--json`, `status`, the state).
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Timings {
    pub media: u64,
    pub dhcp: u64,
    pub imds: u64,
    pub write: u64,
    pub report: u64,
    /// Making the host keys, beside the stages above (not part of time to Ready).
    pub host_keys: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Report {
    /// Ready acknowledged by Azure.
    Ready,
    /// NotReady acknowledged by Azure: provisioning failed, and Azure knows why.
    Failure,
    /// No report was acknowledged (the WireServer could not be reached): Azure knows nothing
    /// yet; the next boot sends a Ready that is owed.
    Pending,
    /// Already provisioned: nothing done, nothing reported.
    Skipped,
    /// Disabled on the kernel command line: nothing done, no packet sent.
    Disabled,
    /// No Azure chassis asset tag: nothing done, no packet sent.
    #[serde(rename = "not-azure")]
    NotAzure,
    /// An MSP VM in the initramfs: nothing sent; `azprov-msp.service` finishes the
    /// provisioning in the booted system, after the Guest Proxy Agent.
    Deferred,
}

/// The version of the JSON `provision --json` and `status --json` print (the same names for
/// the same things); raised when a field changes meaning or goes away.
pub const SCHEMA: u32 = 1;

/// The `--json` summary; never holds a secret.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub schema: u32,
    pub version: &'static str,
    pub vm_id: Option<String>,
    pub hostname: Option<String>,
    pub username: Option<String>,
    pub ssh_keys: usize,
    pub custom_data: bool,
    pub user_data: bool,
    pub report: Report,
    /// The VM was created with the Metadata Security Protocol (`ProvisionGuestProxyAgent`).
    pub msp: bool,
    pub reason: Option<Reason>,
    /// The reason with its cause (`failure to obtain DHCP lease: eth0: no answer after 20 s`),
    /// as logged; never a secret.
    pub cause: Option<String>,
    /// The stage the failure came from.
    pub stage: Option<&'static str>,
    /// What to check first ([`Reason::hint`]).
    pub hint: Option<&'static str>,
    /// `ssh-keygen -l` lines of the host keys made in this run.
    pub host_keys: Vec<String>,
    /// Host key types made after the handover (`rsa`), not in `host_keys` yet.
    pub host_keys_pending: Vec<&'static str>,
    /// What growroot did, or why it did nothing.
    pub growroot: Option<String>,
    pub timings_ms: Timings,
}

impl Summary {
    /// 0 when Ready was reported (or nothing was needed), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self.report {
            Report::Ready
            | Report::Skipped
            | Report::Disabled
            | Report::NotAzure
            | Report::Deferred => 0,
            Report::Failure | Report::Pending => 1,
        }
    }
}

impl Summary {
    /// A run's summary before its first stage: only the VM id DMI gave, nothing reported yet.
    pub(super) fn new(vm_id: Option<String>) -> Self {
        Summary {
            schema: SCHEMA,
            version: crate::VERSION,
            vm_id,
            hostname: None,
            username: None,
            ssh_keys: 0,
            custom_data: false,
            user_data: false,
            report: Report::Failure,
            msp: false,
            reason: None,
            cause: None,
            stage: None,
            hint: None,
            host_keys: Vec::new(),
            host_keys_pending: Vec::new(),
            growroot: None,
            timings_ms: Timings::default(),
        }
    }

    /// Records why the run failed: the first failure counts (the write's, not the report's
    /// that followed it). The hint is logged once, here.
    pub(super) fn fail(&mut self, f: &super::Failure) {
        if self.reason.is_some() {
            return;
        }
        self.reason = Some(f.reason);
        self.cause = Some(crate::logger::errno_names(&f.to_string()));
        self.stage = f.stage;
        self.hint = f.reason.hint();
        if let Some(h) = self.hint {
            log::warn!("what to check: {h}");
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
