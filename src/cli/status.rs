//! `azprov status [--root DIR] [--json] [--run-dir DIR]`: what azprov recorded. Without
//! `--root`, the running system: this boot's record in /run/azprov (readable by everyone, so
//! an admin without sudo learns whether provisioning succeeded) and the root's state in
//! /var/lib/azprov (root only), whose VM id must match DMI's. With `--root` only that root
//! counts (an offline image), and this boot's record only where `--run-dir` names it
//! (`provision::status` merges them). Exit 0 when provisioned and Ready was acknowledged, or
//! when this boot was not to provision (disabled, not Azure); 1 otherwise.

use super::{opt, print_json, Args, CliError};
use crate::provision::record::{self, BootRecord};
use crate::provision::state::Acked;
use crate::provision::status::{self, Provisioned, Status};
use crate::provision::summary::Report;
use crate::root::{Sysroot, STATE_DIR};

pub(super) fn cmd_status(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "status")?;
    a.no_positionals()?;
    let offline = a.value("root")?;
    // a root that is not there is a mistake in the command, not an unprovisioned VM
    if let Some(dir) = offline.filter(|d| !std::path::Path::new(d).is_dir()) {
        return Err(CliError::Usage(format!("--root {dir}: no such directory")));
    }
    let root = Sysroot::new(offline.unwrap_or("/"));
    // this boot's record counts for the running system, or where --run-dir names it
    let run_dir = a.value("run-dir")?;
    let boot: Option<BootRecord> = match (offline, run_dir) {
        (Some(_), None) => None,
        _ => record::load(&record::dir(run_dir)),
    };
    let st = status::read(&root, offline.is_some(), boot.as_ref());
    if a.has("json") {
        print_json(&st)?;
    } else {
        print_text(&st, boot.as_ref());
    }
    let not_to_provision = matches!(st.this_boot, Some(Report::Disabled | Report::NotAzure));
    match (st.provisioned, st.report) {
        (Provisioned::Yes, Some(Acked::Ready)) => Ok(()),
        (Provisioned::No, _) if not_to_provision => Ok(()),
        (Provisioned::No, _) => Err(CliError::Failed("not provisioned".into())),
        (Provisioned::Yes, _) => Err(CliError::Failed(
            "provisioned, but Ready was not acknowledged by Azure".into(),
        )),
        (Provisioned::Unknown, _) => Err(CliError::Unknown(
            "cannot tell whether this VM was provisioned: run as root".into(),
        )),
    }
}

fn print_text(st: &Status, boot: Option<&BootRecord>) {
    let report = st.report.map(|r| match r {
        Acked::Ready => "ready",
        Acked::Failure => "failure (NotReady acknowledged by Azure)",
        Acked::Pending => "pending (not acknowledged by Azure yet)",
    });
    let this_boot = st.this_boot.map(|b| match b {
        Report::Disabled => "disabled on the kernel command line (azprov=0): nothing done",
        Report::NotAzure => "not an Azure VM: nothing done (azprov.force provisions anyway)",
        Report::Skipped => "already provisioned: nothing done",
        Report::Ready => "provisioned, Ready acknowledged",
        Report::Failure => "provisioning failed, NotReady acknowledged",
        Report::Pending => "no report acknowledged by Azure",
        Report::Deferred => "created with MSP: the initramfs sent nothing; azprov-msp.service reports after azure-proxy-agent",
    });
    println!(
        "provisioned:    {}",
        match st.provisioned {
            Provisioned::Yes => "yes",
            Provisioned::No => "no",
            Provisioned::Unknown =>
                "unknown (the state is readable by root only, and this boot \
                                     left no record in /run/azprov)",
        }
    );
    println!(
        "this boot:      {}{}",
        opt(this_boot),
        boot.map_or(String::new(), |b| format!(" (at {})", b.at))
    );
    println!("vm id:          {}", opt(st.vm_id.as_deref()));
    println!("provisioned at: {}", opt(st.provisioned_at.as_deref()));
    println!("report:         {}", opt(report));
    println!("reported at:    {}", opt(st.reported_at.as_deref()));
    println!("reason:         {}", opt(st.reason.as_deref()));
    if st.reason.is_some() {
        println!("cause:          {}", opt(st.cause.as_deref()));
        println!("failed stage:   {}", opt(st.stage.as_deref()));
        println!("what to check:  {}", opt(st.hint));
    }
    if st.msp {
        println!(
            "msp:            yes: created with the Metadata Security Protocol; azprov asks IMDS \
             and reports only after azure-proxy-agent holds its key (azprov-msp.service)"
        );
    }
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
    for (source, r) in &st.scripts {
        println!(
            "script:         {source}: started {}, {}",
            r.started_at,
            match (r.exit, &r.signal) {
                (None, _) => "not seen to finish".to_string(),
                (Some(e), Some(sig)) => format!("killed by {sig} (exit {e})"),
                (Some(e), None) => format!("exit {e}"),
            }
        );
    }
    println!("log:            {} (and journalctl -t azprov -b)", st.log);
    println!("azprov:         {}", st.version);
    if let Some(e) = &st.state_unreadable {
        println!(
            "note:           the state in {STATE_DIR} could not be read ({e}); \
             run as root for all of it"
        );
    }
}
