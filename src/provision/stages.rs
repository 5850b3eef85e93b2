//! The stages a first boot and a provisioned reboot share: the root made writable, the
//! network brought up and torn down, the health report, the host keys put in place.

use super::hostkeys;
use super::kvp::KvpReport;
use super::options::Options;
use super::summary::{Report, Summary};
use super::sysroot::Sysroot;
use super::{Failure, Reason};
use crate::azure::wireserver::{self, Health, WireServer};
use crate::deadline::Deadline;
use crate::net::apply::Applied;
use crate::net::dhclient::{self, DhcpError, Prepared};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// DHCP's share when the reserve below would leave it less: half of what is left.
const DHCP_SHARE: u32 = 2;
/// What the stages after DHCP need, kept back from its budget: IMDS, the writes and the report
/// take well under a second when the fabric answers, and the rest leaves IMDS room for a few
/// retries. A slow DHCP server can use everything else.
pub(super) const DHCP_RESERVE: Duration = Duration::from_secs(3);
/// Without a lease the WireServer is most likely unreachable: the report gets this long.
const REPORT_WITHOUT_LEASE: Duration = Duration::from_secs(10);
/// A failure that used up the deadline still gets this long to be reported: the run ends
/// within `--timeout` + 1 s whatever the fabric does.
const REPORT_GRACE: Duration = Duration::from_millis(500);

/// DHCP's first half, begun while the media is read: when it began, its deadline, and the
/// NIC with link up, carrier and socket (or why not).
pub(super) struct NetStart {
    t: Instant,
    deadline: Deadline,
    prepared: Result<Prepared, DhcpError>,
}

pub(super) fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// One named stage of the run. [`Stage::run`] times it, records its milliseconds, turns its
/// panic (a bug, most likely in a parser fed hostile input) into NotReady "internal error"
/// while the network is still up, and logs its one line: `NAME: MS ms: what it found`, or its
/// failure.
pub(super) struct Stage {
    name: &'static str,
    start: Instant,
    /// A failure the run goes on from (no media, no IMDS) is a warning, others errors.
    failure_level: log::Level,
}

impl Stage {
    pub(super) fn start(name: &'static str) -> Self {
        Self::since(name, Instant::now())
    }

    /// A stage whose time counts from `start` (DHCP from the link-up, begun with the media).
    pub(super) fn since(name: &'static str, start: Instant) -> Self {
        Stage {
            name,
            start,
            failure_level: log::Level::Error,
        }
    }

    /// Its failure is logged as a warning: the run goes on without what it did not find.
    pub(super) fn recoverable(mut self) -> Self {
        self.failure_level = log::Level::Warn;
        self
    }

    /// Runs `f`, stores its duration in `slot`, logs `found` of its result or its failure.
    pub(super) fn run<T>(
        self,
        slot: &mut u64,
        f: impl FnOnce() -> Result<T, Failure>,
        found: impl FnOnce(&T) -> String,
    ) -> Result<T, Failure> {
        let name = self.name;
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
                Err(Failure::new(
                    Reason::Internal,
                    format!("panic in the {name} stage"),
                ))
            });
        *slot = ms(self.start.elapsed());
        let result = result.map_err(|mut f| {
            f.stage.get_or_insert(name);
            f
        });
        match &result {
            Ok(v) => log::info!("{name}: {} ms: {}", *slot, found(v)),
            Err(e) => log::log!(self.failure_level, "{name}: {} ms: {e}", *slot),
        }
        result
    }
}

/// Hook mode (`Options::remount`): the root as the framework mounted it, made writable when
/// it is read-only, until the guard drops. A failure is logged; the writes then fail and are
/// reported with their reason.
pub(super) fn writable(opts: &Options) -> Option<crate::sys::mount::Writable> {
    if !opts.remount {
        return None;
    }
    let root = &opts.root;
    match crate::sys::mount::make_writable(root) {
        Ok(Some(w)) => {
            log::info!("{}: remounted read-write for provisioning", root.display());
            Some(w)
        }
        Ok(None) => None,
        Err(e) => {
            log::warn!(
                "{}: read-only and cannot remount read-write: {e}",
                root.display()
            );
            None
        }
    }
}

/// `--wireserver` (`flag`), else the lease's option 245, else 168.63.129.16; port 80.
pub(super) fn wireserver_addr(
    flag: Option<SocketAddr>,
    network: &Result<Option<Applied>, Failure>,
) -> SocketAddr {
    let lease_ws = match network {
        Ok(Some(applied)) => applied.lease().wireserver,
        _ => None,
    };
    flag.unwrap_or_else(|| SocketAddr::from((lease_ws.unwrap_or(wireserver::DEFAULT_ADDR), 80)))
}

/// Picks the NIC (`iface`, else the first that is not loopback), brings its link up, waits
/// for carrier, opens the socket; sends nothing. None with `--no-dhcp`.
pub(super) fn prepare_network(opts: &Options, deadline: Deadline) -> Option<NetStart> {
    let (sys, iface, modules) = (&opts.sys, opts.iface.as_deref(), &opts.modules);
    if !opts.dhcp {
        return None;
    }
    // PID 1: the NIC's driver may be among the last to load
    modules.wait();
    let t = Instant::now();
    let left = deadline.remaining();
    let deadline = deadline.min((left / DHCP_SHARE).max(left.saturating_sub(DHCP_RESERVE)));
    let prepared = dhclient::prepare(&sys.join("class/net"), iface, deadline);
    Some(NetStart {
        t,
        deadline,
        prepared,
    })
}

/// The DHCP stage: the prepared NIC's lease, sending the OVF HostName as option 12 (Azure
/// DNS registers the name the client sends), configured; Ok(None) with `--no-dhcp`. Timed
/// from the link-up, which began with the media read. `flag` is `--wireserver`, for the log.
pub(super) fn network(
    flag: Option<SocketAddr>,
    start: Option<NetStart>,
    hostname: Option<&str>,
    slot: &mut u64,
) -> Result<Option<Applied>, Failure> {
    let Some(NetStart {
        t,
        deadline,
        prepared,
    }) = start
    else {
        log::info!("dhcp: skipped (--no-dhcp)");
        return Ok(None);
    };
    let bring_up = || {
        prepared
            .and_then(|p| p.bring_up(hostname, deadline))
            .map_err(|e| {
                let reason = match e {
                    _ if e.no_interface() => Reason::NoDhcpInterface,
                    DhcpError::Apply(_) => Reason::NetworkConfig,
                    _ => Reason::DhcpLease,
                };
                Failure::new(reason, e)
            })
    };
    let found = |(nic, applied): &(crate::net::link::Nic, Applied)| {
        let l = applied.lease();
        let ws = match (flag, l.wireserver) {
            (Some(w), _) => format!("{w} (--wireserver)"),
            (None, Some(w)) => w.to_string(),
            (None, None) => format!("(none, using {})", wireserver::DEFAULT_ADDR),
        };
        format!(
            "{} {}/{} from {}, wireserver {ws}",
            nic.name, l.address, l.prefix_len, l.server_id
        )
    };
    Stage::since("dhcp", t)
        .run(slot, bring_up, found)
        .map(|(_, applied)| Some(applied))
}

/// The report stage: Ready, or NotReady with the failure's reason and cause; a fresh goal
/// state before each POST. The same outcome goes to KVP first (`kvp`), as cloud-init and
/// azure-init put it there: the host reads KVP when the POST arrives. Ok when the WireServer
/// acknowledged it.
pub(super) fn report(
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
pub(super) fn record_report(
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

/// Writes freshly made host keys into the root and shows their fingerprints on the console
/// and in the log file. A failure is logged: the keys are not worth a NotReady (the report is
/// out already); the state then holds none and the next boot makes them.
pub(super) fn install_host_keys(
    root: &Sysroot,
    generated: Result<hostkeys::Generated, hostkeys::HostKeyError>,
    s: &mut Summary,
) {
    let t = Instant::now();
    let hostname = s.hostname.clone().unwrap_or_else(|| "localhost".into());
    let result = generated.and_then(|g| {
        s.host_keys_pending = g.pending.iter().map(|k| k.name()).collect();
        let took: Vec<String> = g
            .took
            .iter()
            .map(|(k, d)| format!("{} {} ms", k.name(), d.as_millis()))
            .collect();
        log::info!(
            "host keys: made ({}; CRNG wait {} ms{})",
            took.join(", "),
            g.entropy_wait.as_millis(),
            g.seeded.map_or(String::new(), |n| format!(
                ", {n} bytes of OEM0 seed mixed in"
            ))
        );
        s.timings_ms.host_keys =
            g.took.iter().map(|(_, d)| ms(*d)).sum::<u64>() + ms(g.entropy_wait);
        hostkeys::install(root, g, &hostname)
    });
    match result {
        Ok(lines) if lines.is_empty() => {}
        Ok(lines) => {
            log::info!(
                "host keys: {} written to {} ({} ms)",
                lines.len(),
                hostkeys::SSH_DIR,
                ms(t.elapsed())
            );
            crate::logger::console_lines(&hostkeys::fingerprint_block(&lines));
            s.host_keys = lines;
        }
        Err(e) => {
            s.host_keys_pending.clear();
            log::error!("host keys: {e}; the image's keys stay");
        }
    }
}

/// The host keys left for after the handover (RSA, [`hostkeys::later`]): their process
/// started, once everything else of the run is on disk (`state`: it adds to state.json).
pub(super) fn finish_host_keys_later(root: &Sysroot, s: &Summary, state: bool) {
    if s.host_keys_pending.is_empty() {
        return;
    }
    let hostname = s.hostname.clone().unwrap_or_else(|| "localhost".into());
    match hostkeys::later::spawn(root, &hostname, &s.host_keys, state) {
        Ok(pid) => log::info!(
            "host keys: {} made after the handover (pid {pid}); nothing waits for it",
            s.host_keys_pending.join(", ")
        ),
        Err(e) => log::warn!(
            "host keys: cannot start making {} after the handover: {e}",
            s.host_keys_pending.join(", ")
        ),
    }
}

/// After the report: the lease torn down (routes, address, MTU, link state as they were), or
/// left configured with `azprov.keepnet` (`keep`).
pub(super) fn release_network(keep: bool, network: Result<Option<Applied>, Failure>) {
    if let Ok(Some(applied)) = network {
        if keep {
            applied.keep();
        } else if let Err(e) = applied.teardown() {
            log::warn!("teardown: {e}");
        }
    }
}

/// The WireServer report's deadline: without a lease the WireServer is most likely
/// unreachable, so the report gets [`REPORT_WITHOUT_LEASE`] at most.
pub(super) fn report_deadline(
    network: &Result<Option<Applied>, Failure>,
    deadline: Deadline,
) -> Deadline {
    if network.is_err() {
        deadline.min(REPORT_WITHOUT_LEASE)
    } else {
        deadline
    }
}
