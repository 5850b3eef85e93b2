//! What azprov remembers in the root about its last run (`/var/lib/azprov/state.json`): what
//! was provisioned, whether Azure acknowledged the report, the host keys it made. `azprov
//! status` shows it, `azprov clean` uses it to find the user azprov created, and the next boot
//! uses it to finish what an interrupted run left (host keys not yet made for this VM id).
//! Never holds a secret.

use super::summary::Summary;
pub use super::summary::Timings;
use super::Failure;
use crate::azure::wireserver::Reported;
use crate::root::{Sysroot, STATE_DIR};
use serde::{Deserialize, Serialize};

pub const FILE: &str = "state.json";

/// What the writes did that the state records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The admin user was created (not an existing account).
    pub user_created: bool,
}

/// What Azure was told, as far as azprov knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Acked {
    /// Ready was acknowledged (2xx).
    Ready,
    /// NotReady was acknowledged.
    Failure,
    /// No report was acknowledged (yet).
    Pending,
}

impl Acked {
    /// What a run's report says Azure acknowledged, if it reported at all.
    pub fn from_report(r: super::summary::Report) -> Option<Acked> {
        use super::summary::Report;
        match r {
            Report::Ready => Some(Acked::Ready),
            Report::Failure => Some(Acked::Failure),
            Report::Pending => Some(Acked::Pending),
            Report::Skipped | Report::Disabled | Report::NotAzure | Report::Deferred => None,
        }
    }
}

/// What the marker holds when no VM id was known (it must hold something); read back, it is
/// no VM id (`null` in JSON), as in the run's own summary.
pub const UNKNOWN_VM: &str = "unknown";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    pub vm_id: Option<String>,
    /// When the writes finished (RFC 3339); None when they failed.
    pub provisioned_at: Option<String>,
    pub report: Option<Acked>,
    pub reported_at: Option<String>,
    pub reason: Option<String>,
    /// The reason with its cause, as logged (never a secret).
    pub cause: Option<String>,
    /// The stage the failure came from.
    pub stage: Option<String>,
    /// The azprov that wrote this state.
    pub version: Option<String>,
    pub hostname: Option<String>,
    pub username: Option<String>,
    /// Whether azprov created the user (`azprov clean --user` removes only such a user).
    pub user_created: bool,
    /// `ssh-keygen -l` lines of the host keys azprov made.
    pub host_keys: Vec<String>,
    /// The VM id the host keys were made for: a reboot keeps them, a new VM id replaces them.
    pub host_keys_vm_id: Option<String>,
    /// The VM was created with the Metadata Security Protocol: a Ready owed is sent after the
    /// Guest Proxy Agent, by `azprov-msp.service`, never from the initramfs.
    pub msp: bool,
    pub timings_ms: Timings,
}

impl State {
    /// What the state says once the marker is on disk, until the report's outcome replaces it:
    /// the report owed, the user, and the host keys an earlier run made.
    pub fn owed(s: &Summary, earlier: Option<&State>) -> State {
        State {
            hostname: s.hostname.clone(),
            username: s.username.clone(),
            user_created: earlier.is_some_and(|e| e.user_created && e.username == s.username),
            host_keys: earlier.map(|e| e.host_keys.clone()).unwrap_or_default(),
            host_keys_vm_id: earlier.and_then(|e| e.host_keys_vm_id.clone()),
            msp: s.msp,
            ..State::default()
        }
    }

    /// What an MSP VM's initramfs leaves for `azprov-msp.service`: nothing reported, the host
    /// keys it made for this VM id (the unit makes none), the user an earlier run created.
    pub fn deferred(s: &Summary, earlier: Option<&State>) -> State {
        State {
            vm_id: s.vm_id.clone(),
            version: Some(crate::VERSION.to_string()),
            hostname: s.hostname.clone(),
            msp: true,
            timings_ms: s.timings_ms,
            ..State::owed(s, earlier)
        }
        .with_host_keys(s, earlier)
    }

    /// The host keys this run made for its VM id, else those an earlier run made for the
    /// same VM id (the initramfs's, when `azprov-msp.service` finishes the run).
    fn with_host_keys(mut self, s: &Summary, earlier: Option<&State>) -> State {
        if !s.host_keys.is_empty() {
            self.host_keys = s.host_keys.clone();
            self.host_keys_vm_id = s.vm_id.clone();
        } else if let Some(e) =
            earlier.filter(|e| e.host_keys_vm_id.is_some() && e.host_keys_vm_id == s.vm_id)
        {
            self.host_keys = e.host_keys.clone();
            self.host_keys_vm_id = e.host_keys_vm_id.clone();
        } else {
            self.host_keys = Vec::new();
            self.host_keys_vm_id = None;
        }
        self
    }

    /// The state a first boot's run leaves: what was written and when, what Azure
    /// acknowledged and when, the failure with its cause and stage, the user, the host keys
    /// made for this VM id, the timings.
    pub fn after_run(
        s: &Summary,
        (written, provisioned_at): (&Result<Written, Failure>, Option<String>),
        (acked, reported_at): (&Result<Reported, Failure>, Option<String>),
        earlier: Option<&State>,
    ) -> State {
        State {
            vm_id: s.vm_id.clone(),
            provisioned_at,
            report: Some(match (acked, written) {
                (Err(_), _) => Acked::Pending,
                (Ok(_), Ok(_)) => Acked::Ready,
                (Ok(_), Err(_)) => Acked::Failure,
            }),
            reported_at,
            reason: s.reason.map(|r| r.as_str().to_string()),
            cause: s.cause.clone(),
            stage: s.stage.map(str::to_string),
            version: Some(crate::VERSION.to_string()),
            hostname: s.hostname.clone(),
            username: s.username.clone(),
            // a user azprov created on an earlier run (`--force`, a new VM id) is still its own
            user_created: written.as_ref().is_ok_and(|w| w.user_created)
                || earlier.is_some_and(|e| e.user_created && e.username == s.username),
            host_keys_vm_id: None,
            host_keys: Vec::new(),
            msp: s.msp,
            timings_ms: s.timings_ms,
        }
        .with_host_keys(s, earlier)
    }

    /// The state in `root`, or None when there is none (or it does not parse: a log line).
    pub fn load(root: &Sysroot) -> Option<State> {
        let bytes = root.read(&format!("{STATE_DIR}/{FILE}")).ok().flatten()?;
        State::parse(&bytes)
    }

    /// The state in the file's `bytes`; None, with a warning, when they do not parse.
    pub fn parse(bytes: &[u8]) -> Option<State> {
        serde_json::from_slice(bytes)
            .map_err(|e| log::warn!("{STATE_DIR}/{FILE}: {e}; ignored"))
            .ok()
    }

    pub fn save(&self, root: &Sysroot) -> Result<(), crate::root::WriteError> {
        root.write_state(FILE, &self.to_json())
    }

    /// The file's bytes: pretty JSON and a newline (the RSA helper writes them through its
    /// descriptors after the handover, `save` through the root before it).
    pub fn to_json(&self) -> Vec<u8> {
        let mut json = serde_json::to_vec_pretty(self).unwrap_or_default();
        json.push(b'\n');
        json
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_missing_fields() {
        let d = std::env::temp_dir().join(format!("azprov-state-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let root = Sysroot::new(&d);
        assert_eq!(State::load(&root), None);
        let s = State {
            vm_id: Some("id".into()),
            report: Some(Acked::Pending),
            host_keys: vec!["256 SHA256:x root@vm (ED25519)".into()],
            ..State::default()
        };
        s.save(&root).unwrap();
        assert_eq!(State::load(&root), Some(s));
        std::fs::write(d.join("var/lib/azprov/state.json"), r#"{"report":"ready"}"#).unwrap();
        assert_eq!(State::load(&root).unwrap().report, Some(Acked::Ready));
        std::fs::write(d.join("var/lib/azprov/state.json"), "{").unwrap();
        assert_eq!(State::load(&root), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
