//! The provisioning run of docs/DESIGN.md, "Bird's-eye view", from "already provisioned?" to
//! "teardown", shared by hook mode (`azprov provision --root`) and PID 1 mode.

use super::fstab;
use super::hostkeys::{self, Keygen};
use super::kvp::KvpReport;
use super::merge::merge;
pub use super::options::{MediaSource, Mode, Options, CDROM_SETTLE};
use super::reboot::finish_provisioned;
use super::stages::{
    finish_host_keys_later, install_host_keys, ms, network, prepare_network, record_report,
    release_network, report, report_deadline, wireserver_addr, writable, Stage,
};
use super::state::{Acked, State, UNKNOWN_VM};
pub use super::summary::{Report, Summary};
use super::sysroot::{self, Sysroot};
use super::{Failure, Reason};
use crate::azure::http::{Client, HttpError, TransportKind};
use crate::azure::ovf::{self, OvfEnv};
use crate::azure::wireserver::WireServer;
use crate::azure::{imds, media, platform, vmid};
use crate::deadline::Deadline;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The share of the deadline each stage may use at most, as a divisor or fraction of what is
/// left when it starts: media 1/5 of the whole, DHCP all that remains but a reserve
/// (`stages::DHCP_RESERVE`, at least half of it), IMDS 2/3 of what is left then.
const MEDIA_SHARE: u32 = 5;
const IMDS_SHARE: (u32, u32) = (2, 3);
/// The first goal-state fetch, beside IMDS, only checks the WireServer early.
const PROBE_BUDGET: Duration = Duration::from_secs(10);

/// Why the root counts as provisioned already, or None.
pub fn already_provisioned(root: &Sysroot, dmi: &Path, sys: &Path) -> Option<String> {
    let marker = root.read_marker()?;
    match vmid::read(dmi, sys) {
        Some(id) if id == marker => Some(format!("VM id {id} matches {}", sysroot::MARKER)),
        Some(id) => {
            log::info!(
                "{} holds {marker}, this VM is {id}: provisioning",
                sysroot::MARKER
            );
            None
        }
        None => Some(format!("{} exists and DMI has no VM id", sysroot::MARKER)),
    }
}

/// What a run cut short left behind (a temporary of the state, the log, an account file) goes
/// on every run, a provisioned reboot's too; only then is a read-only root made writable.
fn remove_stale_temporaries(opts: &Options, root: &Sysroot) {
    let stale = root.stale_temporaries();
    if stale.is_empty() {
        return;
    }
    let _writable = writable(opts);
    for p in stale {
        let removed = if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        match removed {
            Ok(()) => log::info!("removed {}, left by an interrupted run", p.display()),
            Err(e) => log::warn!("cannot remove {}: {e}", p.display()),
        }
    }
}

/// The IMDS reason for the last cause behind `e`, with the whole error as detail.
fn imds_failure(e: &HttpError) -> Failure {
    fn reason(e: &HttpError) -> Reason {
        match e {
            HttpError::Deadline { last, .. } => reason(last),
            HttpError::Transport {
                kind: TransportKind::Timeout,
                ..
            } => Reason::ImdsTimeout,
            HttpError::Transport { .. } => Reason::ImdsConnection,
            HttpError::Status { .. } => Reason::ImdsHttp,
            HttpError::Invalid { .. } | HttpError::TooLarge { .. } => Reason::ImdsParse,
        }
    }
    Failure::new(reason(e), e)
}

fn read_media(opts: &Options, deadline: Deadline) -> Result<Option<OvfEnv>, Failure> {
    let (name, bytes) = match &opts.media {
        MediaSource::File(f) => {
            let b = std::fs::read(f)
                .map_err(|e| Failure::new(Reason::OvfRead, format!("{}: {e}", f.display())))?;
            (f.display().to_string(), b)
        }
        MediaSource::Devices(extra) => {
            // PID 1: a drive that is there while the last drivers load is read at once;
            // without one, the drivers that could bring one are waited for first
            let early = !media::cdrom_devices(&opts.dev).is_empty();
            if !early {
                opts.modules.wait();
            }
            let drives = media::wait_for_drives(&opts.dev, &opts.sys, opts.cdrom_settle);
            let mut found = media::read_ovf(&drives, extra, deadline, &opts.modules);
            if early && !matches!(found, Ok(Some(_))) {
                // nothing on the drives at hand: others may come with the last drivers
                opts.modules.wait();
                let later: Vec<PathBuf> =
                    media::wait_for_drives(&opts.dev, &opts.sys, opts.cdrom_settle)
                        .into_iter()
                        .filter(|d| !drives.contains(d))
                        .collect();
                if !later.is_empty() {
                    found = match (found, media::read_ovf(&later, &[], deadline, &opts.modules)) {
                        (_, Ok(Some(f))) => Ok(Some(f)),
                        (Err(e), _) => Err(e),
                        (_, r) => r,
                    };
                }
            }
            match found {
                Ok(Some(found)) => found,
                Ok(None) => return Ok(None),
                Err(e) => return Err(Failure::new(Reason::MediaRead, e)),
            }
        }
    };
    match ovf::parse(&bytes) {
        Ok(env) => Ok(Some(env)),
        // Some other XML document, not Azure's provisioning data: no OVF, not a broken one.
        Err(e @ ovf::OvfError::NotAzure) => {
            log::info!("{name}: {e}; ignored");
            Ok(None)
        }
        Err(e) => Err(Failure::new(e.reason(), format!("{name}: {e}"))),
    }
}

/// The host keys' generation, started before the root is mounted (PID 1, at its start) when
/// this run may make keys: they are wanted, provisioning is not disabled, and this is Azure or
/// forced. A provisioned reboot whose keys are made drops it, which stops it; until then it
/// had idle CPU only.
pub fn early_keygen(opts: &Options) -> Option<Keygen> {
    let may_provision = !opts.disable && (opts.force || platform::is_azure(&opts.dmi));
    (opts.host_keys && may_provision).then(|| Keygen::start(opts.sys.clone(), &opts.host_key_types))
}

/// Runs the whole provisioning into `opts.root` and reports to Azure: the stages of
/// docs/DESIGN.md, "Bird's-eye view", from "already provisioned?" to "teardown", one log
/// line each with its duration. The result is also the `--json` summary.
pub fn provision(opts: &Options) -> Summary {
    provision_with(opts, None)
}

/// `provision` with the host keys' generation already started (`early_keygen`); without it,
/// a new VM's run starts it beside the media stage.
pub fn provision_with(opts: &Options, keygen: Option<Keygen>) -> Summary {
    let s = provision_in(opts, &Sysroot::new(&opts.root), keygen);
    if let Some(dir) = &opts.record_dir {
        super::record::save(dir, &opts.root, &s);
    }
    s
}

/// `provision_with` into a given [`Sysroot`]: one whose owners are only recorded
/// ([`sysroot::Owners::recording`]) lets a whole run go without root in tests.
pub fn provision_in(opts: &Options, root: &Sysroot, mut keygen: Option<Keygen>) -> Summary {
    let t0 = Instant::now();
    let capture = crate::logger::Capture::install();
    log::info!(
        "azprov {} ({}), root {}",
        crate::VERSION,
        if opts.remount { "hook" } else { "PID 1" },
        opts.root.display()
    );
    let mut s = Summary::new(vmid::read(&opts.dmi, &opts.sys));
    if opts.disable {
        log::info!("disabled on the kernel command line; not provisioning");
        s.report = Report::Disabled;
        return s;
    }
    if !opts.force && !platform::is_azure(&opts.dmi) {
        let tag = platform::asset_tag(&opts.dmi);
        log::info!(
            "not an Azure VM (DMI chassis asset tag {}); nothing to do (azprov.force or --force provisions anyway)",
            tag.as_deref().map_or_else(|| "absent".into(), |t| format!("{t:?}"))
        );
        s.report = Report::NotAzure;
        // a cleaned image booted elsewhere: sshd needs host keys, and they need no packet
        if opts.host_keys && super::hostkeys::none_in(root) {
            log::info!("host keys: the root has none; making them (no network needed)");
            let _writable = writable(opts);
            let generated = keygen.map_or_else(
                || hostkeys::generate(&opts.sys, &opts.host_key_types),
                Keygen::join,
            );
            install_host_keys(root, generated, &mut s);
            finish_host_keys_later(root, &s, false);
        }
        s.timings_ms.total = ms(t0.elapsed());
        return s;
    }
    // the root grows to its disk on every boot, before anything is written into it; only a
    // root that is a mount point of its own (never a directory of the host in tests)
    if opts.growroot && is_mount_point(&opts.root) {
        let grown = super::growroot::run(&opts.root, &opts.sys, &opts.dev, || writable(opts));
        let line = grown.unwrap_or_else(|why| format!("skipped: {why}"));
        log::info!("growroot: {line}");
        s.growroot = Some(line);
    }
    // What fstab mounts on azprov's paths (a separate /home, /var), mounted for the run and
    // unmounted on every way out: the marker itself may live on /var.
    let (_mounted, mount_failure) =
        match fstab::mount_for_writes(root, &opts.sys.join("class/block"), &opts.dev) {
            Ok(m) => (m, None),
            Err(f) => {
                log::error!("{f}");
                (fstab::Mounted::default(), Some(f))
            }
        };
    let fstab_ok = mount_failure.is_none();
    remove_stale_temporaries(opts, root);
    if !opts.force {
        if let Some(why) = already_provisioned(root, &opts.dmi, &opts.sys) {
            log::info!("already provisioned ({why}); nothing to do");
            s.report = Report::Skipped;
            s.vm_id = s.vm_id.or_else(|| root.read_marker());
            finish_provisioned(opts, root, &mut s, keygen);
            s.timings_ms.total = ms(t0.elapsed());
            return s;
        }
    }
    let deadline = Deadline::after(opts.timeout);
    root.set_deadline(deadline);
    let earlier = State::load(root);
    let earlier = earlier.as_ref();
    // Read-only again when this run ends, whichever way.
    let _writable = writable(opts);
    // New host keys for the new VM, made beside the other stages.
    let keygen = opts.host_keys.then(|| {
        keygen
            .take()
            .unwrap_or_else(|| Keygen::start(opts.sys.clone(), &opts.host_key_types))
    });

    // The media read and the NIC's link-up, carrier wait and socket overlap: DHCP's first
    // packet carries the OVF's HostName, nothing before it needs the OVF.
    let timings = &mut s.timings_ms;
    let (ovf, net_start) = std::thread::scope(|sc| {
        let media_ms = &mut timings.media;
        let media = sc.spawn(|| {
            let dl = deadline.min(opts.timeout / MEDIA_SHARE);
            Stage::start("media").recoverable().run(
                media_ms,
                || read_media(opts, dl),
                describe_media,
            )
        });
        // an SELinux root's file contexts (thousands of lines) are read while the network
        // comes up, not when the first write needs them
        sc.spawn(|| root.labels().is_some());
        let net_start = prepare_network(opts, deadline);
        let ovf = media.join().unwrap_or_else(|_| {
            Err(Failure::new(
                Reason::Internal,
                "panic while reading the provisioning media",
            ))
        });
        (ovf, net_start)
    });
    let ovf_env = ovf.as_ref().ok().and_then(Option::as_ref);
    // The password's SHA-512 crypt (tens of ms of CPU under emulation) is made while DHCP and
    // IMDS are waited for; merge takes the password from the OVF only.
    let hashing = ovf_env
        .and_then(|o| o.password.clone())
        .map(|pw| std::thread::spawn(move || sysroot::hash_password(&pw)));
    let ovf_hostname = ovf_env.map(|o| o.hostname.clone());

    let network = network(
        opts.wireserver,
        net_start,
        ovf_hostname.as_deref(),
        &mut s.timings_ms.dhcp,
    );
    let client = Client::new();
    let ws = WireServer {
        client: &client,
        addr: wireserver_addr(opts.wireserver, &network),
    };

    let data = network.as_ref().map_err(Clone::clone).and_then(|_| {
        let imds = Stage::start("imds").recoverable().run(
            &mut s.timings_ms.imds,
            || metadata(&opts.imds, &ws, deadline),
            |m| format!("vmId {}, {} key(s)", m.vm_id, m.ssh_keys.len()),
        );
        let mut merge_ms = 0;
        Stage::start("merge").run(
            &mut merge_ms,
            || merge(&ovf, &imds),
            |d| format!("hostname {} from {}", d.hostname.0, d.hostname.1),
        )
    });

    // A bug in the writes must still reach Azure as a reason while the network is up: the
    // stage catches the panic, and the report says "internal error".
    let written = match data {
        Err(f) => Err(f),
        Ok(data) => {
            s.describe(&data);
            let vm_id = s.vm_id.clone().unwrap_or_else(|| UNKNOWN_VM.into());
            // what the state says once the marker is on disk, until the report's outcome
            // replaces it
            let owed = State {
                hostname: s.hostname.clone(),
                username: s.username.clone(),
                user_created: earlier.is_some_and(|e| e.user_created && e.username == s.username),
                host_keys: earlier.map(|e| e.host_keys.clone()).unwrap_or_default(),
                host_keys_vm_id: earlier.and_then(|e| e.host_keys_vm_id.clone()),
                ..State::default()
            };
            let write = || {
                // never into the directory a filesystem will be mounted over
                if let Some(f) = mount_failure {
                    return Err(f);
                }
                let hash = hashing.map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(sysroot::WriteError::Corrupt("crypt panicked".into()))
                    })
                });
                super::write::write_all(root, &data, hash, &vm_id, &owed)
            };
            Stage::start("write").run(&mut s.timings_ms.write, write, |_| {
                format!("{} provisioned", opts.root.display())
            })
        }
    };
    let provisioned_at = written.is_ok().then(crate::time::now_rfc3339);
    let outcome = written.as_ref().map(|_| ()).map_err(Clone::clone);
    // never into /var when the filesystem fstab mounts there is missing
    let kvp = KvpReport::start(&opts.kvp_device, fstab_ok.then_some(root));
    let acked = report(
        &ws,
        &kvp,
        &outcome,
        s.vm_id.as_deref(),
        report_deadline(&network, deadline),
        &mut s.timings_ms.report,
    );
    record_report(&mut s, &outcome, &acked);
    let reported_at = acked.is_ok().then(crate::time::now_rfc3339);

    release_network(opts.keep_network, network);
    if let Some(k) = keygen {
        install_host_keys(root, k.join(), &mut s);
    }
    s.timings_ms.total = ms(t0.elapsed());
    log::info!("total: {} ms", s.timings_ms.total);
    let state = State {
        vm_id: s.vm_id.clone(),
        provisioned_at,
        report: Some(match (&acked, &written) {
            (Err(_), _) => Acked::Pending,
            (Ok(_), Ok(_)) => Acked::Ready,
            (Ok(_), Err(_)) => Acked::Failure,
        }),
        reported_at,
        reason: s.reason.map(|r| r.as_str().to_string()),
        cause: s.cause.clone(),
        stage: s.stage.map(str::to_string),
        version: Some(crate::VERSION.to_string()),
        hostname: s.hostname.clone(),
        username: s.username.clone(),
        // a user azprov created on an earlier run (`--force`, a new VM id) is still its own
        user_created: written.as_ref().is_ok_and(|w| w.user_created)
            || earlier.is_some_and(|e| e.user_created && e.username == s.username),
        host_keys_vm_id: (!s.host_keys.is_empty()).then(|| s.vm_id.clone()).flatten(),
        host_keys: s.host_keys.clone(),
        timings_ms: s.timings_ms,
    };
    if let Err(e) = state.save(root) {
        log::warn!("cannot write the state: {e}");
    }
    let saved = root.mkdir("/var/log", 0o755, (0, 0)).and_then(|_| {
        let earlier = root
            .read(sysroot::LOG_FILE)
            .ok()
            .flatten()
            .unwrap_or_default();
        let log = appended(earlier, &capture.contents(), LOG_MAX);
        root.write(sysroot::LOG_FILE, &log, 0o640, (0, 0))
    });
    if let Err(e) = saved {
        log::warn!("cannot write {}: {e}", sysroot::LOG_FILE);
    }
    finish_host_keys_later(root, &s, true);
    kvp.finish(deadline);
    s
}

/// Whether `path` is the root of a filesystem of its own (or `/`).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata(path.join(".."))) {
        (Ok(a), Ok(b)) => a.dev() != b.dev() || a.ino() == b.ino(),
        _ => false,
    }
}

/// The log file keeps at most this much: the newest runs, whole lines.
const LOG_MAX: usize = 256 * 1024;

/// `earlier` runs' log with this run's lines after it, cut from the front at a line boundary
/// to at most `max` bytes.
fn appended(mut earlier: Vec<u8>, run: &[u8], max: usize) -> Vec<u8> {
    earlier.extend_from_slice(run);
    if earlier.len() <= max {
        return earlier;
    }
    let cut = earlier.len() - max;
    let start = earlier
        .iter()
        .skip(cut)
        .position(|&b| b == b'\n')
        .map_or(earlier.len(), |i| cut + i + 1);
    earlier.split_off(start)
}

/// The media stage's line: what the OVF names, or that there was none.
fn describe_media(ovf: &Option<OvfEnv>) -> String {
    match ovf {
        Some(o) => format!(
            "ovf-env.xml for {} / {}",
            o.hostname,
            o.username.as_deref().unwrap_or("(from IMDS)")
        ),
        None => "no provisioning media; IMDS only".into(),
    }
}

/// IMDS at `url`, beside a first goal-state fetch that checks the WireServer early (the report
/// fetches the goal state again right before posting). The probe runs on a thread of its own
/// and is never waited for: the IMDS result is used as soon as it arrives.
fn metadata(url: &str, ws: &WireServer, deadline: Deadline) -> Result<imds::Imds, Failure> {
    let dl = deadline.min(deadline.remaining() * IMDS_SHARE.0 / IMDS_SHARE.1);
    let (tx, rx) = std::sync::mpsc::channel();
    let addr = ws.addr;
    let probe_dl = dl.min(PROBE_BUDGET);
    std::thread::spawn(move || {
        let client = Client::new();
        let probe = WireServer {
            client: &client,
            addr,
        };
        let _ = tx.send(probe.fetch_goal_state(probe_dl));
    });
    let m = imds::fetch(ws.client, url, dl);
    match rx.try_recv() {
        Ok(Ok(g)) => log::info!(
            "wireserver {}: goal state incarnation {}",
            ws.addr,
            g.incarnation
        ),
        Ok(Err(e)) => log::warn!("wireserver {}: first goal state fetch: {e}", ws.addr),
        Err(_) => log::debug!(
            "wireserver {}: first goal state fetch still running; not waited for",
            ws.addr
        ),
    }
    m.map_err(|e| imds_failure(&e))
}

#[cfg(test)]
mod tests {
    use super::appended;

    #[test]
    fn the_log_keeps_the_newest_whole_lines_within_its_cap() {
        assert_eq!(appended(b"a\n".to_vec(), b"b\n", 10), b"a\nb\n");
        assert_eq!(
            appended(b"one\ntwo\n".to_vec(), b"three\n", 12),
            b"two\nthree\n"
        );
        assert_eq!(appended(b"one\ntwo\n".to_vec(), b"three\n", 9), b"three\n");
        assert_eq!(appended(b"one\ntwo\n".to_vec(), b"3\n", 7), b"two\n3\n");
    }
}
