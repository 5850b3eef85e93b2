//! What `azprov status` tells: the root's state.json merged with this boot's record
//! (`/run/azprov/boot.json`), typed; `cli/status.rs` prints it.

use super::record::{BootRecord, BootSummary};
use super::scripts::{Ran, Record};
use super::state::{Acked, State, Timings, FILE, UNKNOWN_VM};
use super::summary::{Report, SCHEMA};
use crate::azure::reason::Reason;
use crate::root::{Sysroot, LOG_FILE, STATE_DIR};
use serde::Serialize;

/// Whether the root was provisioned, as far as this user can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioned {
    Yes,
    No,
    /// The state cannot be read (not root) and this boot left no record that says.
    Unknown,
}

impl Serialize for Provisioned {
    /// true, false, or "unknown".
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Provisioned::Yes => s.serialize_bool(true),
            Provisioned::No => s.serialize_bool(false),
            Provisioned::Unknown => s.serialize_str("unknown"),
        }
    }
}

/// `azprov status --json` (schema 1, the run summary's names for the same things).
#[derive(Debug, Serialize)]
pub struct Status {
    pub schema: u32,
    pub version: &'static str,
    pub provisioned: Provisioned,
    /// What Azure acknowledged for the provisioning: ready, failure or pending (none yet).
    pub report: Option<Acked>,
    /// What this boot's run did: ready, failure, pending, skipped, disabled, not-azure, deferred.
    pub this_boot: Option<Report>,
    pub vm_id: Option<String>,
    pub provisioned_at: Option<String>,
    pub reported_at: Option<String>,
    pub reason: Option<String>,
    pub cause: Option<String>,
    pub stage: Option<String>,
    pub hint: Option<&'static str>,
    pub hostname: Option<String>,
    pub username: Option<String>,
    /// The VM was created with the Metadata Security Protocol (`ProvisionGuestProxyAgent`).
    pub msp: bool,
    pub host_keys: Vec<String>,
    pub timings_ms: Option<Timings>,
    pub log: String,
    /// The #! custom data / user data run for this VM (`azprov run-scripts`), by source.
    pub scripts: std::collections::BTreeMap<String, Ran>,
    /// Why the state could not be read (not root: /var/lib/azprov is 0700), if so.
    pub state_unreadable: Option<String>,
}

/// The status of `root` (`offline`: a root given with --root, where only its marker counts),
/// with this boot's record `boot` where there is one.
pub fn read(root: &Sysroot, offline: bool, boot: Option<&BootRecord>) -> Status {
    let this = boot.map(|b| &b.summary);
    let this_boot = this.and_then(|s| s.report);
    let field = |f: fn(&BootSummary) -> &Option<String>| this.and_then(|s| f(s).clone());
    let (state, state_unreadable) = match root.read(&format!("{STATE_DIR}/{FILE}")) {
        Err(e) => (None, Some(crate::logger::errno_names(&e.to_string()))),
        Ok(bytes) => (bytes.and_then(|b| State::parse(&b)), None),
    };
    let marker = root.read_marker();
    let provisioned = provisioned(
        marker.as_deref(),
        offline,
        state_unreadable.is_some(),
        this_boot,
    );
    let state = state.unwrap_or_default();
    let reason = state.reason.clone().or_else(|| field(|s| &s.reason));
    Status {
        schema: SCHEMA,
        version: crate::VERSION,
        provisioned,
        report: state.report.or(this_boot.and_then(Acked::from_report)),
        this_boot,
        // one vocabulary with the run's summary: no VM id known is null
        vm_id: state
            .vm_id
            .clone()
            .or(marker.clone())
            .or_else(|| field(|s| &s.vm_id))
            .filter(|id| id != UNKNOWN_VM),
        provisioned_at: state.provisioned_at.clone(),
        reported_at: state.reported_at.clone(),
        hint: reason
            .as_deref()
            .and_then(Reason::from_text)
            .and_then(Reason::hint),
        reason,
        cause: state.cause.clone().or_else(|| field(|s| &s.cause)),
        stage: state.stage.clone().or_else(|| field(|s| &s.stage)),
        hostname: state.hostname.clone().or_else(|| field(|s| &s.hostname)),
        username: state.username.clone().or_else(|| field(|s| &s.username)),
        msp: state.msp || this.is_some_and(|s| s.msp),
        host_keys: state.host_keys.clone(),
        timings_ms: state.report.map(|_| state.timings_ms),
        log: boot.map_or_else(|| LOG_FILE.to_string(), |b| b.log.clone()),
        state_unreadable,
        // the scripts of the VM the state is about, never an earlier VM's
        scripts: Record::load(root)
            .filter(|r| r.vm_id.is_some() && r.vm_id == state.vm_id.clone().or(marker.clone()))
            .map(|r| r.ran)
            .unwrap_or_default(),
    }
}

/// Whether the root was provisioned: its marker (`offline`: a root given with --root, where
/// only the marker counts), or, when the state cannot be read (not root), this boot's record
/// of the run (`report`), if there is one.
fn provisioned(
    marker: Option<&str>,
    offline: bool,
    state_unreadable: bool,
    report: Option<Report>,
) -> Provisioned {
    let yes = |b: bool| if b { Provisioned::Yes } else { Provisioned::No };
    match (marker, offline) {
        (None, _) if state_unreadable => match report {
            Some(r) => yes(matches!(r, Report::Ready | Report::Skipped)),
            None => Provisioned::Unknown,
        },
        (None, _) => Provisioned::No,
        (Some(_), true) => Provisioned::Yes,
        // the running system: a marker from another VM (an image not cleaned) does not count
        (Some(m), false) => yes(crate::azure::vmid::read(
            std::path::Path::new(crate::azure::vmid::DMI_DIR),
            std::path::Path::new("/sys"),
        )
        .is_none_or(|id| id == m)),
    }
}
