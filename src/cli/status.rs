//! `azprov status [--root DIR] [--json]`: what azprov recorded in the root. With `--root`
//! only what is in that root counts (an offline image); without it the running system, whose
//! DMI VM id must match the marker. Exit 0 when provisioned and Ready was acknowledged.

use super::{opt, print_json, Args, CliError};
use crate::provision::state::Timings;
use crate::provision::state::{Acked, State};
use crate::provision::sysroot::Sysroot;
use serde::Serialize;

#[derive(Debug, Serialize)]
struct Status {
    provisioned: bool,
    vm_id: Option<String>,
    provisioned_at: Option<String>,
    report: Option<Acked>,
    reported_at: Option<String>,
    reason: Option<String>,
    hostname: Option<String>,
    username: Option<String>,
    host_keys: Vec<String>,
    timings_ms: Option<Timings>,
}

pub(super) fn cmd_status(args: &[String]) -> Result<(), CliError> {
    let a = Args::parse(args, &["root"], &["json"])?;
    a.no_positionals()?;
    let offline = a.value("root")?;
    let root = Sysroot::new(offline.unwrap_or("/"));
    let marker = root.read_marker();
    let state = State::load(&root).unwrap_or_default();
    let provisioned = match (&marker, offline) {
        (None, _) => false,
        (Some(_), Some(_)) => true,
        // the running system: a marker from another VM (an image not cleaned) does not count
        (Some(m), None) => crate::azure::vmid::read(
            std::path::Path::new(crate::azure::vmid::DMI_DIR),
            std::path::Path::new("/sys"),
        )
        .is_none_or(|id| &id == m),
    };
    let st = Status {
        provisioned,
        vm_id: state.vm_id.clone().or(marker),
        provisioned_at: state.provisioned_at.clone(),
        report: state.report,
        reported_at: state.reported_at.clone(),
        reason: state.reason.clone(),
        hostname: state.hostname.clone(),
        username: state.username.clone(),
        host_keys: state.host_keys.clone(),
        timings_ms: state.report.map(|_| state.timings_ms),
    };
    if a.has("json") {
        print_json(&st)?;
    } else {
        let report = st.report.map(|r| match r {
            Acked::Ready => "ready",
            Acked::Failure => "failure",
            Acked::Pending => "pending (not acknowledged by Azure yet)",
        });
        println!(
            "provisioned:    {}",
            if st.provisioned { "yes" } else { "no" }
        );
        println!("vm id:          {}", opt(st.vm_id.as_deref()));
        println!("provisioned at: {}", opt(st.provisioned_at.as_deref()));
        println!("report:         {}", opt(report));
        println!("reported at:    {}", opt(st.reported_at.as_deref()));
        println!("reason:         {}", opt(st.reason.as_deref()));
        println!("hostname:       {}", opt(st.hostname.as_deref()));
        println!("username:       {}", opt(st.username.as_deref()));
        println!("host keys:      {}", st.host_keys.len());
        for k in &st.host_keys {
            println!("  {k}");
        }
        if let Some(t) = st.timings_ms {
            println!(
                "timings (ms):   media {} dhcp {} imds {} write {} report {} host keys {} total {}",
                t.media, t.dhcp, t.imds, t.write, t.report, t.host_keys, t.total
            );
        }
    }
    match (st.provisioned, st.report) {
        (true, Some(Acked::Ready)) => Ok(()),
        (false, _) => Err(CliError::Failed("not provisioned".into())),
        (true, _) => Err(CliError::Failed(
            "provisioned, but Ready was not acknowledged by Azure".into(),
        )),
    }
}
