//! A provisioned reboot: no network, unless the first boot left work undone (a Ready never
//! acknowledged, host keys not made for this VM id).

use super::hostkeys::{self, Keygen};
use super::hostkeys::{finish_host_keys_later, install_host_keys};
use super::kvp::KvpReport;
use super::msp::Msp;
use super::network::{bring_up_dhcp, prepare_network, Link};
use super::options::Options;
use super::report::{record_report, report};
use super::state::{Acked, State};
use super::summary::{Report, Summary};
use super::Failure;
use crate::deadline::Deadline;
use crate::root::{writable, Sysroot};

/// A provisioned boot does nothing unless the first boot left work undone: a Ready the
/// WireServer never acknowledged (sent again), or no host keys made for this VM id yet (made,
/// without network). The state is read once and written once, if it changed.
pub(super) fn finish_provisioned(
    opts: &Options,
    root: &Sysroot,
    summary: &mut Summary,
    keygen: Option<Keygen>,
) {
    let mut state = State::load(root).unwrap_or_default();
    let vm_id = root.read_marker();
    summary.hostname = state.hostname.clone();
    summary.username = state.username.clone();
    let resend = state.report == Some(Acked::Pending) && state.provisioned_at.is_some();
    let keys =
        opts.host_keys && !(state.host_keys_vm_id.is_some() && state.host_keys_vm_id == vm_id);
    // keys made for this VM whose RSA key a boot cut short never finished
    let rsa_owed = opts.host_keys
        && !keys
        && opts.host_key_types.contains(&hostkeys::KeyType::Rsa)
        && hostkeys::later::missing(root);
    if rsa_owed {
        log::info!(
            "host keys: the rsa key of this VM was never finished; making it after the handover"
        );
        summary.hostname = state.hostname.clone();
        summary.host_keys = state.host_keys.clone();
        summary.host_keys_pending = vec![hostkeys::KeyType::Rsa.name()];
    }
    if !resend && !keys {
        if rsa_owed {
            finish_host_keys_later(root, summary, true);
        }
        return;
    }
    let before = state.clone();
    let _writable = writable(&opts.root, opts.remount);
    // an MSP VM's Ready goes after the Guest Proxy Agent, by azprov-msp.service; what keeps it
    // from going is reported instead
    summary.msp = state.msp;
    let outcome = match (resend, state.msp) {
        (false, _) => None,
        (true, true) => match super::msp::decide(opts, root, true) {
            Msp::Defer => {
                summary.report = Report::Deferred;
                None
            }
            Msp::Fail(mut f) => {
                log::error!("msp: {f}");
                f.stage = Some("msp");
                Some(Err(f))
            }
            Msp::Off | Msp::KeyHeld => Some(Ok(())),
        },
        (true, false) if opts.after_proxy_agent => {
            log::info!("msp: the VM was not created with MSP; the initramfs reports for it");
            None
        }
        (true, false) => Some(Ok(())),
    };
    if outcome
        .as_ref()
        .is_some_and(|o| resend_ready(opts, root, state.hostname.as_deref(), summary, o))
    {
        state.report = Some(Acked::Ready);
        state.reported_at = Some(crate::time::now_rfc3339());
        // the failure was the report's own, and it is mended
        state.reason = None;
        state.cause = None;
        state.stage = None;
    }
    if keys {
        log::info!("host keys: none made for this VM yet; making them");
        summary.hostname = state.hostname.clone();
        let generated = keygen.map_or_else(
            || hostkeys::generate(&opts.sys, &opts.host_key_types),
            Keygen::join,
        );
        install_host_keys(root, generated, summary);
        if !summary.host_keys.is_empty() {
            state.host_keys = summary.host_keys.clone();
            state.host_keys_vm_id = vm_id;
        }
    }
    if state != before {
        if let Err(e) = state.save(root) {
            log::warn!("cannot write the state: {e}");
        }
    }
    // after this run's own save: the helper adds to state.json too, through the same
    // temporary name
    if keys || rsa_owed {
        finish_host_keys_later(root, summary, true);
    }
}

/// On a provisioned boot whose Ready was never acknowledged (the WireServer was down for the
/// whole first boot): DHCP and the report again, nothing else, so Azure sees Ready now rather
/// than OSProvisioningTimedOut. Once acknowledged, reboots send nothing. True when Ready was.
/// `outcome`: Ready, or (an MSP VM whose Guest Proxy Agent is missing or failed) the failure.
fn resend_ready(
    opts: &Options,
    root: &Sysroot,
    hostname: Option<&str>,
    summary: &mut Summary,
    outcome: &Result<(), Failure>,
) -> bool {
    log::info!("the Ready of the first boot was not acknowledged; reporting it again");
    let deadline = Deadline::after(opts.timeout);
    let start = prepare_network(opts, deadline);
    let dhcp_ms = &mut summary.timings_ms.dhcp;
    let link = Link::new(
        opts.wireserver,
        bring_up_dhcp(opts.wireserver, start, hostname, dhcp_ms),
    );
    let kvp = KvpReport::start(&opts.kvp_device, Some(root));
    let acked = report(
        &link.wireserver(),
        &kvp,
        outcome,
        summary.vm_id.as_deref(),
        link.report_deadline(deadline),
        &mut summary.timings_ms.report,
    );
    record_report(summary, outcome, &acked);
    link.release(opts.keep_network);
    kvp.finish(deadline);
    acked.is_ok() && outcome.is_ok()
}
