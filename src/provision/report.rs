//! The health report of a run: Ready or NotReady to the WireServer, with the KVP record
//! served first, and what the summary says once it is out.

use super::kvp::KvpReport;
use super::stage::Stage;
use super::summary::{Report, Summary};
use super::{Failure, Reason};
use crate::azure::wireserver::{self, Health, WireServer};
use crate::deadline::Deadline;
use crate::net::apply::Applied;
use std::time::Duration;

/// Without a lease the WireServer is most likely unreachable: the report gets this long.
const REPORT_WITHOUT_LEASE: Duration = Duration::from_secs(10);
/// A failure that used up the deadline still gets this long to be reported: the run ends
/// within `--timeout` + 1 s whatever the fabric does.
const REPORT_GRACE: Duration = Duration::from_millis(500);

/// The report stage: Ready, or NotReady with the failure's reason and cause; a fresh goal
/// state before each POST. The same outcome goes to KVP first (`kvp`), as cloud-init and
/// azure-init put it there: the host reads KVP when the POST arrives. Ok when the WireServer
/// acknowledged it.
pub(crate) fn report(
    ws: &WireServer,
    kvp: &KvpReport,
    written: &Result<(), Failure>,
    vm_id: Option<&str>,
    deadline: Deadline,
    slot: &mut u64,
) -> Result<wireserver::Reported, Failure> {
    let (vm_id, timestamp) = (vm_id.unwrap_or("unknown"), crate::time::now_rfc3339());
    kvp.report(written.as_ref().map(|_| ()), vm_id, &timestamp);
    let health = match written {
        Ok(()) => Health::Ready,
        Err(f) => Health::Failed {
            description: wireserver::failure_description(f, vm_id, &timestamp),
        },
    };
    let dl = if deadline.expired() {
        Deadline::after(REPORT_GRACE)
    } else {
        deadline
    };
    let post = || {
        ws.report(&health, dl)
            .map_err(|e| Failure::new(Reason::ReportFailed, e))
    };
    let found = |r: &wireserver::Reported| {
        format!(
            "{} to {} (incarnation {}, {} POST(s))",
            if written.is_ok() { "Ready" } else { "NotReady" },
            ws.addr,
            r.incarnation,
            r.posts
        )
    };
    let acked = Stage::start("report").run(slot, post, found);
    kvp.posted();
    acked
}

/// What the summary says once the report stage ended: Ready or Failure, and the reason Azure
/// was given (the write's), or why the report itself failed.
pub(crate) fn record_report(
    s: &mut Summary,
    written: &Result<(), Failure>,
    acked: &Result<wireserver::Reported, Failure>,
) {
    let failure = match (written, acked) {
        (Err(f), _) | (Ok(()), Err(f)) => Some(f),
        (Ok(()), Ok(_)) => None,
    };
    s.report = match (written, acked) {
        (Ok(()), Ok(_)) => Report::Ready,
        (Err(_), Ok(_)) => Report::Failure,
        (_, Err(_)) => Report::Pending,
    };
    // the report stage logged its own failure; the first failure is the cause
    if let Some(f) = failure {
        s.fail(f);
    }
}

/// The WireServer report's deadline: without a lease the WireServer is most likely
/// unreachable, so the report gets [`REPORT_WITHOUT_LEASE`] at most.
pub(crate) fn report_deadline(
    network: &Result<Option<Applied>, Failure>,
    deadline: Deadline,
) -> Deadline {
    if network.is_err() {
        deadline.min(REPORT_WITHOUT_LEASE)
    } else {
        deadline
    }
}
