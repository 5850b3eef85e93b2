//! Provisioning a root: the validated data (`data`), where it comes from (`merge`), and every
//! write into the root (`sysroot`). The flow that ties them to the network is `run`.

pub mod data;
pub mod merge;
pub mod run;
pub mod sysroot;

use std::fmt;

/// Why provisioning failed: a fixed `reason` for the NotReady description (one string per
/// cause, as azure-init's `reason()`), the details for the log, and extra key=value pairs for
/// the description's supporting data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub detail: String,
    pub extra: Vec<(&'static str, String)>,
}

impl Failure {
    pub fn new(reason: &'static str, detail: impl Into<String>) -> Self {
        Failure {
            reason,
            detail: detail.into(),
            extra: Vec::new(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(self.reason)
        } else {
            write!(f, "{}: {}", self.reason, self.detail)
        }
    }
}
