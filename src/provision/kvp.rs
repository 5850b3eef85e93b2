//! The run's KVP report (docs/contracts.md, "KVP"): the `PROVISIONING_REPORT` record written
//! into the root's guest pool and served from the initramfs, before the health POST, so that the
//! host can read why provisioning failed even when the WireServer cannot be reached.

use super::Failure;
use crate::azure::kvp::responder::{Pools, Responder};
use crate::azure::kvp::{self, Record, POOL_AUTO_EXTERNAL, POOL_EXTERNAL, POOL_GUEST};
use crate::azure::wireserver::{encode_failure, encode_success, Limit};
use crate::deadline::Deadline;
use crate::root::kvp::{BootClock, Freshness};
use crate::root::Sysroot;
use std::path::Path;
use std::time::Duration;

/// How long the handover waits, after the report, for the host to read the guest pool: the
/// host's sweep is not documented, and the wait delays the first login by as much.
pub const SWEEP_WAIT: Duration = Duration::from_secs(5);

/// The report's two ways to the host: the pool file in the root (`root`, when it may be
/// written) and the responder on the KVP device (when there is one).
pub struct KvpReport<'a> {
    root: Option<&'a Sysroot>,
    responder: Option<Responder>,
    clock: BootClock,
}

impl<'a> KvpReport<'a> {
    /// The responder opened on `device`, serving the root's pools as the daemon would load
    /// them. `root` None: nothing is read from or written into a root (none, or a directory
    /// a filesystem should be mounted over).
    pub fn start(device: &Path, root: Option<&'a Sysroot>) -> KvpReport<'a> {
        let clock = BootClock::read();
        let mut pools = Pools::default();
        if let Some(r) = root {
            for (n, fresh) in [
                (POOL_EXTERNAL, Freshness::Any),
                (POOL_GUEST, Freshness::ThisBoot),
                (POOL_AUTO_EXTERNAL, Freshness::Any),
            ] {
                if let Some(p) = pools.get_mut(usize::from(n)) {
                    *p = r.read_kvp(n, fresh, clock);
                }
            }
        }
        KvpReport {
            root,
            responder: Responder::open(device, pools),
            clock,
        }
    }

    /// Puts the outcome into the guest pool (the file fsynced) and hands the pool to the
    /// responder; called right before the health POST.
    pub fn report(&self, outcome: Result<(), &Failure>, vm_id: &str, timestamp: &str) {
        let value = match outcome {
            Ok(()) => encode_success(vm_id, timestamp),
            Err(f) => encode_failure(f, vm_id, timestamp, Limit::Bytes(kvp::SAFE_VALUE_BYTES)),
        };
        let record = Record::new(kvp::REPORT_KEY, &value);
        let written = self.root.and_then(|root| {
            let r = record.clone();
            root.update_kvp(POOL_GUEST, Freshness::ThisBoot, self.clock, |p| {
                kvp::upsert(p, r)
            })
            .map_err(|e| log::warn!("kvp: {e}"))
            .ok()
        });
        // no root to write into, or the write failed: the host still gets the report
        let pool = written.unwrap_or_else(|| vec![record]);
        log::debug!("kvp: {} = {value}", kvp::REPORT_KEY);
        if let Some(r) = &self.responder {
            r.publish(pool);
        }
    }

    /// The health POST is out (or failed): the host's next sweep is the one to wait for.
    pub fn posted(&self) {
        if let Some(r) = &self.responder {
            r.posted();
        }
    }

    /// Before the handover: waits up to [`SWEEP_WAIT`] (within `deadline`) for the host to
    /// read the guest pool, closes the device, and keeps what the host set into its pools
    /// for the booted system's daemon.
    pub fn finish(self, deadline: Deadline) {
        let Some(r) = self.responder else { return };
        let done = r.finish(deadline.min(SWEEP_WAIT));
        let Some(root) = self.root else { return };
        for (n, records) in done.changed {
            let kept = root.update_kvp(n, Freshness::Any, self.clock, |p| *p = records);
            match kept {
                Ok(r) => log::info!("kvp: {} record(s) the host set kept in pool {n}", r.len()),
                Err(e) => log::warn!("kvp: the host's pool {n}: {e}"),
            }
        }
    }
}

/// PID 1 with no root to boot: the failure served from memory for as long as the process
/// lives (the device stays open until the machine halts).
pub fn serve_failure(device: &Path, failure: &Failure, vm_id: &str) {
    let k = KvpReport::start(device, None);
    k.report(Err(failure), vm_id, &crate::time::now_rfc3339());
    if let Some(r) = k.responder {
        r.detach();
    }
}
