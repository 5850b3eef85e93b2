//! The network of a run: DHCP's first half begun beside the media read, the lease, the
//! WireServer's address, and the lease undone at the end.

use super::options::Options;
use super::report::report_deadline;
use super::stage::Stage;
use super::{Failure, Reason};
use crate::azure::http::Client;
use crate::azure::wireserver::{self, WireServer};
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
pub(crate) const DHCP_RESERVE: Duration = Duration::from_secs(3);
/// DHCP's first half, begun while the media is read: when it began, its deadline, and the
/// NIC with link up, carrier and socket (or why not).
pub(crate) struct NetStart {
    t: Instant,
    deadline: Deadline,
    prepared: Result<Prepared, DhcpError>,
}

/// The network of one run or reboot: the DHCP stage's lease (or why there is none), the one
/// HTTP client, and the WireServer's address the two give; torn down, or kept with
/// `azprov.keepnet`, by [`Link::release`].
pub(crate) struct Link {
    pub(crate) lease: Result<Option<Applied>, Failure>,
    client: Client,
    addr: SocketAddr,
}

impl Link {
    /// The link the DHCP stage left, the WireServer at `--wireserver` (`flag`) or the lease's.
    pub(crate) fn new(flag: Option<SocketAddr>, lease: Result<Option<Applied>, Failure>) -> Link {
        let option_245 = match &lease {
            Ok(Some(applied)) => applied.lease().wireserver,
            _ => None,
        };
        Link {
            addr: wireserver::endpoint(flag, option_245),
            lease,
            client: Client::new(),
        }
    }

    pub(crate) fn wireserver(&self) -> WireServer<'_> {
        WireServer {
            client: &self.client,
            addr: self.addr,
        }
    }

    /// The health report's deadline: shorter without a lease ([`report_deadline`]).
    pub(crate) fn report_deadline(&self, deadline: Deadline) -> Deadline {
        report_deadline(&self.lease, deadline)
    }

    /// After the report: the lease torn down (routes, address, MTU, link state as they were),
    /// or left configured with `azprov.keepnet` (`keep`).
    pub(crate) fn release(self, keep: bool) {
        if let Ok(Some(applied)) = self.lease {
            if keep {
                applied.keep();
            } else if let Err(e) = applied.teardown() {
                log::warn!("teardown: {e}");
            }
        }
    }
}

/// Picks the NIC (`iface`, else the first that is not loopback), brings its link up, waits
/// for carrier, opens the socket; sends nothing. None with `--no-dhcp`.
pub(crate) fn prepare_network(opts: &Options, deadline: Deadline) -> Option<NetStart> {
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
pub(crate) fn bring_up_dhcp(
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
        let ws = wireserver::endpoint(flag, l.wireserver);
        let ws = match (flag, l.wireserver) {
            (Some(_), _) => format!("{ws} (--wireserver)"),
            (None, Some(_)) => ws.ip().to_string(),
            (None, None) => format!("(none, using {})", ws.ip()),
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
