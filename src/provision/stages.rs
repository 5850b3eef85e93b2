//! The stages a first boot and a provisioned reboot share: the root made writable, the
//! network brought up and torn down, the health report, the host keys put in place.

use super::hostkeys;
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

/// Hook mode (`opts.remount`): the root as the framework mounted it, made writable when it
/// is read-only, until the guard drops. A failure is logged; the writes then fail and are
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

/// `--wireserver`, else the lease's option 245, else 168.63.129.16; port 80.
pub(super) fn wireserver_addr(
    opts: &Options,
    network: &Result<Option<Applied>, Failure>,
) -> SocketAddr {
    let lease_ws = match network {
        Ok(Some(applied)) => applied.lease().wireserver,
        _ => None,
    };
    opts.wireserver
        .unwrap_or_else(|| SocketAddr::from((lease_ws.unwrap_or(wireserver::DEFAULT_ADDR), 80)))
}

/// Picks the NIC, brings its link up, waits for carrier, opens the socket; sends nothing. None
/// with `--no-dhcp`.
pub(super) fn prepare_network(opts: &Options, deadline: Deadline) -> Option<NetStart> {
    if !opts.dhcp {
        return None;
    }
    // PID 1: the NIC's driver may be among the last to load
    opts.modules.wait();
    let t = Instant::now();
    let left = deadline.remaining();
    let deadline = deadline.min((left / DHCP_SHARE).max(left.saturating_sub(DHCP_RESERVE)));
    let prepared = dhclient::prepare(&opts.sys.join("class/net"), opts.iface.as_deref(), deadline);
    Some(NetStart {
        t,
        deadline,
        prepared,
    })
}

/// DHCP on the prepared NIC, sending the OVF HostName as option 12 (Azure DNS registers the
/// name the client sends), and the lease configured; Ok(None) with `--no-dhcp`.
pub(super) fn network(
    opts: &Options,
    start: Option<NetStart>,
    hostname: Option<&str>,
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
    match prepared.and_then(|p| p.bring_up(hostname, deadline)) {
        Ok((nic, applied)) => {
            let l = applied.lease();
            let ws = match (opts.wireserver, l.wireserver) {
                (Some(w), _) => format!("{w} (--wireserver)"),
                (None, Some(w)) => w.to_string(),
                (None, None) => format!("(none, using {})", wireserver::DEFAULT_ADDR),
            };
            log::info!(
                "dhcp: {} ms: {} {}/{} from {}, wireserver {ws}",
                ms(t.elapsed()),
                nic.name,
                l.address,
                l.prefix_len,
                l.server_id
            );
            Ok(Some(applied))
        }
        Err(e) => {
            log::error!("dhcp: {} ms: {e}", ms(t.elapsed()));
            let reason = match e {
                _ if e.no_interface() => Reason::NoDhcpInterface,
                DhcpError::Apply(_) => Reason::NetworkConfig,
                _ => Reason::DhcpLease,
            };
            Err(Failure::new(reason, e))
        }
    }
}

/// Ready, or NotReady with the failure's reason; a fresh goal state before each POST. True
/// when the WireServer acknowledged the report.
pub(super) fn report(
    ws: &WireServer,
    written: &Result<(), Failure>,
    s: &mut Summary,
    deadline: Deadline,
) -> bool {
    let t = Instant::now();
    let health = match written {
        Ok(()) => Health::Ready,
        Err(f) => {
            s.reason = Some(f.reason);
            let vm_id = s.vm_id.as_deref().unwrap_or("unknown");
            let description =
                wireserver::failure_description(f, vm_id, &crate::time::now_rfc3339());
            Health::Failed { description }
        }
    };
    let dl = if deadline.expired() {
        Deadline::after(REPORT_GRACE)
    } else {
        deadline
    };
    match ws.report(&health, dl) {
        Ok(r) => {
            s.report = if written.is_ok() {
                Report::Ready
            } else {
                Report::Failure
            };
            log::info!(
                "report: {} ms: {} to {} (incarnation {}, {} POST(s))",
                ms(t.elapsed()),
                if written.is_ok() { "Ready" } else { "NotReady" },
                ws.addr,
                r.incarnation,
                r.posts
            );
            true
        }
        Err(e) => {
            s.report = Report::Failure;
            s.reason.get_or_insert(Reason::ReportFailed);
            log::error!("report: {} ms: {e}", ms(t.elapsed()));
            false
        }
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
        Err(e) => log::error!("host keys: {e}; the image's keys stay"),
    }
}

/// After the report: the lease torn down (routes, address, MTU, link state as they were), or
/// left configured with `azprov.keepnet`.
pub(super) fn release_network(opts: &Options, network: Result<Option<Applied>, Failure>) {
    if let Ok(Some(applied)) = network {
        if opts.keep_network {
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
