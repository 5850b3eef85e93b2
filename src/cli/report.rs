//! `azprov report ready | failure --reason TEXT`: one health report to the WireServer.

use super::{network_failure, usage, wireserver_flag, Args, CliError};
use crate::azure::http::Client;
use crate::azure::reason::{Failure, Reason};
use crate::azure::vmid;
use crate::azure::wireserver::{self, Health, WireServer};
use crate::deadline::Deadline;
use std::path::Path;
use std::time::Duration;

pub(super) fn cmd_report(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "report")?;
    let health = match a.positional.as_slice() {
        [k] if k == "ready" => {
            if a.value("reason")?.is_some() {
                return Err(usage("--reason goes with `report failure`"));
            }
            Health::Ready
        }
        [k] if k == "failure" => {
            let reason = a
                .value("reason")?
                .filter(|r| !r.trim().is_empty())
                .ok_or_else(|| usage("report failure: --reason TEXT is required"))?;
            let vm_id = vmid::read(Path::new(vmid::DMI_DIR), Path::new("/sys"))
                .unwrap_or_else(|| "unknown".into());
            // The reason Azure shows is fixed; the operator's words follow as detail=.
            let mut failure = Failure::new(Reason::Operator, reason);
            failure.extra = vec![("detail", reason.to_string())];
            Health::Failed {
                description: wireserver::failure_description(
                    &failure,
                    &vm_id,
                    &crate::time::now_rfc3339(),
                ),
            }
        }
        _ => {
            return Err(usage(
                "azprov report: say `ready` or `failure --reason TEXT`",
            ))
        }
    };
    let addr = wireserver::endpoint(wireserver_flag(&a)?, None);
    let timeout = a.timeout(Duration::from_secs(60))?;
    let client = Client::new();
    let ws = WireServer {
        client: &client,
        addr,
    };
    let r = ws
        .report(&health, Deadline::after(timeout))
        .map_err(|e| network_failure("health report", timeout, &e))?;
    let state = if health == Health::Ready {
        "Ready"
    } else {
        "NotReady"
    };
    println!(
        "reported {state} to {addr} (incarnation {}, {} POST(s))",
        r.incarnation, r.posts
    );
    Ok(())
}
