//! `azprov status [--root DIR] [--json] [--run-dir DIR]`: what azprov recorded. Without
//! `--root`, the running system: this boot's record in /run/azprov (readable by everyone, so
//! an admin without sudo learns whether provisioning succeeded) and the root's state in
//! /var/lib/azprov (root only), whose VM id must match DMI's. With `--root` only that root
//! counts (an offline image), and this boot's record only where `--run-dir` names it. Exit 0 when provisioned and Ready was acknowledged, or when
//! this boot was not to provision (disabled, not Azure); 1 otherwise.

use super::{opt, print_json, Args, CliError};
use crate::azure::reason::Reason;
use crate::provision::record::{self, BootRecord, BootSummary};
use crate::provision::state::{Acked, State, Timings};
use crate::provision::summary::{Report, SCHEMA};
use crate::root::{Sysroot, LOG_FILE, STATE_DIR};
use serde::Serialize;

/// Whether the root was provisioned, as far as this user can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provisioned {
    Yes,
    No,
    /// The state cannot be read (not root) and this boot left no record that says.
    Unknown,
}

impl Serialize for Provisioned {
    /// true, false, or "unknown".
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Provisioned::Yes => s.serialize_bool(true),
            Provisioned::No => s.serialize_bool(false),
            Provisioned::Unknown => s.serialize_str("unknown"),
        }
    }
}

#[derive(Debug, Serialize)]
struct Status {
    schema: u32,
    version: &'static str,
    provisioned: Provisioned,
    /// What Azure acknowledged for the provisioning: ready, failure or pending (none yet).
    report: Option<Acked>,
    /// What this boot's run did: ready, failure, pending, skipped, disabled, not-azure, deferred.
    this_boot: Option<Report>,
    vm_id: Option<String>,
    provisioned_at: Option<String>,
    reported_at: Option<String>,
    reason: Option<String>,
    cause: Option<String>,
    stage: Option<String>,
    hint: Option<&'static str>,
    hostname: Option<String>,
    username: Option<String>,
    /// The VM was created with the Metadata Security Protocol (`ProvisionGuestProxyAgent`).
    msp: bool,
    host_keys: Vec<String>,
    timings_ms: Option<Timings>,
    log: String,
    /// The #! custom data / user data run for this VM (`azprov run-scripts`), by source.
    scripts: std::collections::BTreeMap<String, crate::provision::scripts::Ran>,
    /// Why the state could not be read (not root: /var/lib/azprov is 0700), if so.
    state_unreadable: Option<String>,
}

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
    let this = boot.as_ref().map(|b| &b.summary);
    let this_boot = this.and_then(|s| s.report);
    let field = |f: fn(&BootSummary) -> &Option<String>| this.and_then(|s| f(s).clone());
    let (state, state_unreadable) =
        match root.read(&format!("{STATE_DIR}/{}", crate::provision::state::FILE)) {
            Err(e) => (None, Some(crate::logger::errno_names(&e.to_string()))),
            Ok(_) => (State::load(&root), None),
        };
    let marker = root.read_marker();
    let provisioned = provisioned(
        marker.as_deref(),
        offline.is_some(),
        state_unreadable.is_some(),
        this_boot,
    );
    let state = state.unwrap_or_default();
    let reason = state.reason.clone().or_else(|| field(|s| &s.reason));
    let st = Status {
        schema: SCHEMA,
        version: crate::VERSION,
        provisioned,
        report: state.report.or(this_boot.and_then(Acked::from_report)),
        this_boot,
        // one vocabulary with the run's summary: no VM id known is null
        vm_id: state
            .vm_id
            .clone()
            .or(marker.clone())
            .or_else(|| field(|s| &s.vm_id))
            .filter(|id| id != crate::provision::state::UNKNOWN_VM),
        provisioned_at: state.provisioned_at.clone(),
        reported_at: state.reported_at.clone(),
        hint: reason
            .as_deref()
            .and_then(Reason::from_text)
            .and_then(Reason::hint),
        reason,
        cause: state.cause.clone().or_else(|| field(|s| &s.cause)),
        stage: state.stage.clone().or_else(|| field(|s| &s.stage)),
        hostname: state.hostname.clone().or_else(|| field(|s| &s.hostname)),
        username: state.username.clone().or_else(|| field(|s| &s.username)),
        msp: state.msp || this.is_some_and(|s| s.msp),
        host_keys: state.host_keys.clone(),
        timings_ms: state.report.map(|_| state.timings_ms),
        log: boot
            .as_ref()
            .map_or_else(|| LOG_FILE.to_string(), |b| b.log.clone()),
        state_unreadable,
        // the scripts of the VM the state is about, never an earlier VM's
        scripts: crate::provision::scripts::Record::load(&root)
            .filter(|r| r.vm_id.is_some() && r.vm_id == state.vm_id.clone().or(marker.clone()))
            .map(|r| r.ran)
            .unwrap_or_default(),
    };
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

/// Whether the root was provisioned: its marker (`offline`: a root given with --root, where
/// only the marker counts), or, when the state cannot be read (not root), this boot's record
/// of the run (`report`), if there is one.
fn provisioned(
    marker: Option<&str>,
    offline: bool,
    state_unreadable: bool,
    report: Option<Report>,
) -> Provisioned {
    let yes = |b: bool| if b { Provisioned::Yes } else { Provisioned::No };
    match (marker, offline) {
        (None, _) if state_unreadable => match report {
            Some(r) => yes(matches!(r, Report::Ready | Report::Skipped)),
            None => Provisioned::Unknown,
        },
        (None, _) => Provisioned::No,
        (Some(_), true) => Provisioned::Yes,
        // the running system: a marker from another VM (an image not cleaned) does not count
        (Some(m), false) => yes(crate::azure::vmid::read(
            std::path::Path::new(crate::azure::vmid::DMI_DIR),
            std::path::Path::new("/sys"),
        )
        .is_none_or(|id| id == m)),
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
