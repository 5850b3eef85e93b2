//! The provisioning run of docs/DESIGN.md §2, from "already provisioned?" to "teardown", shared by
//! hook mode (`azprov provision --root`) and PID 1 mode.

use super::data::ProvisioningData;
use super::fstab;
use super::hostkeys::{self, Keygen};
use super::merge::merge;
use super::state::{Acked, State};
use super::sysroot::{self, Sysroot};
use super::{Failure, Reason};
use crate::azure::http::{Client, HttpError, TransportKind};
use crate::azure::ovf::{self, OvfEnv};
use crate::azure::wireserver::{self, Health, WireServer};
use crate::azure::{imds, media, platform, vmid};
use crate::deadline::Deadline;
use crate::net::apply::Applied;
use crate::net::dhclient::{self, DhcpError, Prepared};
use crate::sys::modules::OnDemand;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the provisioning data may come from.
#[derive(Debug, Clone)]
pub enum MediaSource {
    /// CD-ROM drives under `/dev` plus these extra devices.
    Devices(Vec<PathBuf>),
    /// An ovf-env.xml file instead of a disc.
    File(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    pub iface: Option<String>,
    pub dhcp: bool,
    pub media: MediaSource,
    pub force: bool,
    /// `azprov.disable`, `azprov=0`, `rd.azprov=0`: do nothing at all.
    pub disable: bool,
    pub timeout: Duration,
    pub wireserver: Option<SocketAddr>,
    pub imds: String,
    pub keep_network: bool,
    /// Normally `/sys`, `/sys/class/dmi/id` and `/dev`; injected in tests (`--dmi`).
    pub sys: PathBuf,
    pub dmi: PathBuf,
    pub dev: PathBuf,
    /// How long to wait for a CD-ROM drive to appear when a CD-ROM driver is loaded but no
    /// drive is there yet (PID 1 right after loading modules; a hook while udev probes).
    pub cdrom_settle: Duration,
    /// Hook mode: a read-only root is remounted read-write for the run and read-only again
    /// afterwards (PID 1 mounts the root itself).
    pub remount: bool,
    /// New SSH host keys for a new VM (`azprov.hostkeys=keep` / `--keep-host-keys`: false).
    pub host_keys: bool,
    /// PID 1: the module loader, perhaps still loading (the network waits for it, the media
    /// stage when no CD drive is there yet), and loading a CD filesystem's module on demand
    /// (iso9660). Hook mode: none.
    pub modules: OnDemand,
}

/// How long to wait for a CD-ROM drive once its driver is loaded (SCSI and ATA scans finish
/// after their modules load).
pub const CDROM_SETTLE: Duration = Duration::from_secs(2);
/// The share of the deadline each stage may use at most, as a divisor or fraction of what is
/// left when it starts: media 1/5 of the whole, DHCP all that remains but `DHCP_RESERVE` (at
/// least half of it), IMDS 2/3 of what is left then.
const MEDIA_SHARE: u32 = 5;
const DHCP_SHARE: u32 = 2;
/// What the stages after DHCP need, kept back from its budget: IMDS, the writes and the report
/// take well under a second when the fabric answers (about 0.6 s under QEMU TCG), and the rest
/// leaves IMDS room for a few retries. A slow DHCP server can use everything else.
const DHCP_RESERVE: Duration = Duration::from_secs(3);
const IMDS_SHARE: (u32, u32) = (2, 3);
/// The first goal-state fetch, beside IMDS, only checks the WireServer early.
const PROBE_BUDGET: Duration = Duration::from_secs(10);
/// Without a lease the WireServer is most likely unreachable: the report gets this long.
const REPORT_WITHOUT_LEASE: Duration = Duration::from_secs(10);
/// A failure that used up the deadline still gets this long to be reported: the run ends
/// within `--timeout` + 1 s whatever the fabric does.
const REPORT_GRACE: Duration = Duration::from_millis(500);

impl Options {
    /// Hook and tool mode (`azprov provision --root DIR`): the system's /sys and /dev, CD-ROM
    /// drives and DHCP, the root made writable for the run, the network torn down afterwards.
    pub fn hook(root: PathBuf) -> Self {
        Options {
            root,
            iface: None,
            dhcp: true,
            media: MediaSource::Devices(Vec::new()),
            force: false,
            disable: false,
            timeout: crate::config::DEFAULT_TIMEOUT,
            wireserver: None,
            imds: imds::DEFAULT_BASE.to_string(),
            keep_network: false,
            sys: "/sys".into(),
            dmi: vmid::DMI_DIR.into(),
            dev: "/dev".into(),
            cdrom_settle: CDROM_SETTLE,
            remount: true,
            host_keys: true,
            modules: OnDemand::default(),
        }
    }

    /// PID 1 mode: the root at `root`, the kernel command line's settings, and the CD-ROM
    /// settle wait right after module loading.
    pub fn pid1(root: PathBuf, cfg: &crate::config::Config) -> Self {
        Options {
            iface: cfg.iface.clone(),
            force: cfg.force,
            disable: cfg.disable,
            timeout: cfg.timeout,
            wireserver: cfg.wireserver,
            imds: cfg.imds.clone(),
            keep_network: cfg.keepnet,
            remount: false,
            host_keys: cfg.host_keys,
            ..Options::hook(root)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Report {
    Ready,
    Failure,
    /// Already provisioned: nothing done, nothing reported.
    Skipped,
    /// Disabled on the kernel command line: nothing done, no packet sent.
    Disabled,
    /// No Azure chassis asset tag: nothing done, no packet sent.
    #[serde(rename = "not-azure")]
    NotAzure,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Timings {
    pub media: u64,
    pub dhcp: u64,
    pub imds: u64,
    pub write: u64,
    pub report: u64,
    /// Making the host keys, beside the stages above (not part of time to Ready).
    pub host_keys: u64,
    pub total: u64,
}

/// The `--json` summary; never holds a secret.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub vm_id: Option<String>,
    pub hostname: Option<String>,
    pub username: Option<String>,
    pub ssh_keys: usize,
    pub custom_data: bool,
    pub user_data: bool,
    pub report: Report,
    pub reason: Option<Reason>,
    /// `ssh-keygen -l` lines of the host keys made in this run.
    pub host_keys: Vec<String>,
    pub timings_ms: Timings,
}

impl Summary {
    /// 0 when Ready was reported (or nothing was needed), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self.report {
            Report::Ready | Report::Skipped | Report::Disabled | Report::NotAzure => 0,
            Report::Failure => 1,
        }
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

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

/// Hook mode (`opts.remount`): the root as the framework mounted it, made writable when it
/// is read-only, until the guard drops. A failure is logged; the writes then fail and are
/// reported with their reason.
fn writable(opts: &Options) -> Option<crate::sys::mount::Writable> {
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
    (opts.host_keys && may_provision).then(|| Keygen::start(opts.sys.clone()))
}

/// Runs the whole provisioning into `opts.root` and reports to Azure: the stages of
/// docs/DESIGN.md §2 from "already provisioned?" to "teardown", one log line each with its
/// duration. The result is also the `--json` summary.
pub fn provision(opts: &Options) -> Summary {
    provision_with(opts, None)
}

/// `provision` with the host keys' generation already started (`early_keygen`); without it,
/// a new VM's run starts it beside the media stage.
pub fn provision_with(opts: &Options, mut keygen: Option<Keygen>) -> Summary {
    let t0 = Instant::now();
    let capture = crate::logger::Capture::install();
    let root = Sysroot::new(&opts.root);
    let mut s = Summary {
        vm_id: vmid::read(&opts.dmi, &opts.sys),
        hostname: None,
        username: None,
        ssh_keys: 0,
        custom_data: false,
        user_data: false,
        report: Report::Failure,
        reason: None,
        host_keys: Vec::new(),
        timings_ms: Timings::default(),
    };
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
        s.timings_ms.total = ms(t0.elapsed());
        return s;
    }
    // What fstab mounts on azprov's paths (a separate /home, /var), mounted for the run and
    // unmounted on every way out: the marker itself may live on /var.
    let (_mounted, mount_failure) =
        match fstab::mount_for_writes(&root, &opts.sys.join("class/block"), &opts.dev) {
            Ok(m) => (m, None),
            Err(f) => {
                log::error!("{f}");
                (fstab::Mounted::default(), Some(f))
            }
        };
    remove_stale_temporaries(opts, &root);
    if !opts.force {
        if let Some(why) = already_provisioned(&root, &opts.dmi, &opts.sys) {
            log::info!("already provisioned ({why}); nothing to do");
            s.report = Report::Skipped;
            s.vm_id = s.vm_id.or_else(|| root.read_marker());
            finish_provisioned(opts, &root, &mut s, keygen);
            s.timings_ms.total = ms(t0.elapsed());
            return s;
        }
    }
    let deadline = Deadline::after(opts.timeout);
    root.set_deadline(deadline);
    let earlier = State::load(&root);
    let earlier = earlier.as_ref();
    // Read-only again when this run ends, whichever way.
    let _writable = writable(opts);
    // New host keys for the new VM, made beside the other stages.
    let keygen = opts.host_keys.then(|| {
        keygen
            .take()
            .unwrap_or_else(|| Keygen::start(opts.sys.clone()))
    });

    // The media read and the NIC's link-up, carrier wait and socket overlap: DHCP's first
    // packet carries the OVF's HostName, nothing before it needs the OVF.
    let t = Instant::now();
    let (ovf, net_start) = std::thread::scope(|sc| {
        // a panic in the media thread (a bug) is caught by its join, as `guarded` does
        let media = sc.spawn(|| read_media(opts, deadline.min(opts.timeout / MEDIA_SHARE)));
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
        s.timings_ms.media = ms(t.elapsed());
        (ovf, net_start)
    });
    let ms_media = s.timings_ms.media;
    match &ovf {
        Ok(Some(o)) => log::info!(
            "media: {ms_media} ms: ovf-env.xml for {} / {}",
            o.hostname,
            o.username.as_deref().unwrap_or("(from IMDS)")
        ),
        Ok(None) => log::info!("media: {ms_media} ms: no provisioning media; IMDS only"),
        Err(f) => log::warn!("media: {ms_media} ms: {f}"),
    }
    let ovf_env = ovf.as_ref().ok().and_then(Option::as_ref);
    // The password's SHA-512 crypt, 33 ms of CPU under QEMU TCG, is made while DHCP and IMDS
    // are waited for; merge takes the password from the OVF only.
    let hashing = ovf_env
        .and_then(|o| o.password.clone())
        .map(|pw| std::thread::spawn(move || sysroot::hash_password(&pw)));
    let ovf_hostname = ovf_env.map(|o| o.hostname.clone());

    let network = network(opts, net_start, ovf_hostname.as_deref());
    // from the link-up, which began with the media read
    s.timings_ms.dhcp = ms(t.elapsed());
    let client = Client::new();
    let ws = WireServer {
        client: &client,
        addr: wireserver_addr(opts, &network),
    };

    let data = match &network {
        Err(f) => Err(f.clone()),
        Ok(_) => {
            let t = Instant::now();
            let imds = guarded("fetching IMDS", || metadata(opts, &ws, deadline));
            s.timings_ms.imds = ms(t.elapsed());
            match &imds {
                Ok(m) => log::info!(
                    "imds: {} ms: vmId {}, {} key(s)",
                    s.timings_ms.imds,
                    m.vm_id,
                    m.ssh_keys.len()
                ),
                Err(f) => log::warn!("imds: {} ms: {f}", s.timings_ms.imds),
            }
            guarded("merging the metadata", || merge(&ovf, &imds))
        }
    };

    let t = Instant::now();
    // A bug in the writes must still reach Azure as a reason while the network is up: the
    // panic is caught here, and the report below says "internal error".
    let written = data.and_then(|data| {
        s.describe(&data);
        // never into the directory a filesystem will be mounted over
        if let Some(f) = mount_failure {
            return Err(f);
        }
        log::info!("hostname {} from {}", data.hostname.0, data.hostname.1);
        let vm_id = s.vm_id.clone().unwrap_or_else(|| "unknown".into());
        let hash = hashing.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(sysroot::WriteError::Corrupt("crypt panicked".into())))
        });
        // what the state says once the marker is on disk, until the report's outcome replaces it
        let owed = State {
            hostname: s.hostname.clone(),
            username: s.username.clone(),
            user_created: earlier.is_some_and(|e| e.user_created && e.username == s.username),
            host_keys: earlier.map(|e| e.host_keys.clone()).unwrap_or_default(),
            host_keys_vm_id: earlier.and_then(|e| e.host_keys_vm_id.clone()),
            ..State::default()
        };
        guarded("writing", || {
            super::write::write_all(&root, &data, hash, &vm_id, &owed)
        })
    });
    let provisioned_at = written.is_ok().then(crate::time::now_rfc3339);
    s.timings_ms.write = ms(t.elapsed());
    // Each failure is logged once: the DHCP stage logged its own; this is the line for a
    // merge or write failure.
    match &written {
        Ok(_) => log::info!(
            "write: {} ms: {} provisioned",
            s.timings_ms.write,
            opts.root.display()
        ),
        Err(f) if network.is_ok() => log::error!("provisioning failed: {f}"),
        Err(_) => {}
    }

    let t = Instant::now();
    let report_deadline = report_deadline(&network, deadline);
    let outcome = written.as_ref().map(|_| ()).map_err(Clone::clone);
    let acked = report(&ws, &outcome, &mut s, report_deadline);
    let reported_at = acked.then(crate::time::now_rfc3339);
    s.timings_ms.report = ms(t.elapsed());

    release_network(opts, network);
    if let Some(k) = keygen {
        install_host_keys(&root, k.join(), &mut s);
    }
    s.timings_ms.total = ms(t0.elapsed());
    log::info!("total: {} ms", s.timings_ms.total);
    let state = State {
        vm_id: s.vm_id.clone(),
        provisioned_at,
        report: Some(match (acked, &written) {
            (false, _) => Acked::Pending,
            (true, Ok(_)) => Acked::Ready,
            (true, Err(_)) => Acked::Failure,
        }),
        reported_at,
        reason: s.reason.map(|r| r.as_str().to_string()),
        hostname: s.hostname.clone(),
        username: s.username.clone(),
        // a user azprov created on an earlier run (`--force`, a new VM id) is still its own
        user_created: written.as_ref().is_ok_and(|w| w.user_created)
            || earlier.is_some_and(|e| e.user_created && e.username == s.username),
        host_keys_vm_id: (!s.host_keys.is_empty()).then(|| s.vm_id.clone()).flatten(),
        host_keys: s.host_keys.clone(),
        timings_ms: s.timings_ms,
    };
    if let Err(e) = state.save(&root) {
        log::warn!("cannot write the state: {e}");
    }
    let saved = root
        .mkdir("/var/log", 0o755, (0, 0))
        .and_then(|_| root.write(sysroot::LOG_FILE, &capture.contents(), 0o640, (0, 0)));
    if let Err(e) = saved {
        log::warn!("cannot write {}: {e}", sysroot::LOG_FILE);
    }
    s
}

impl Summary {
    /// Fills in what the summary says about the data about to be written.
    fn describe(&mut self, d: &ProvisioningData) {
        self.vm_id = self.vm_id.take().or_else(|| d.vm_id.clone());
        self.hostname = Some(d.hostname.0.to_string());
        self.username = Some(d.username.0.to_string());
        self.ssh_keys = d.keys.len();
        self.custom_data = d.custom_data.is_some();
        self.user_data = d.user_data.is_some();
    }
}

/// `--wireserver`, else the lease's option 245, else 168.63.129.16; port 80.
fn wireserver_addr(opts: &Options, network: &Result<Option<Applied>, Failure>) -> SocketAddr {
    let lease_ws = match network {
        Ok(Some(applied)) => applied.lease().wireserver,
        _ => None,
    };
    opts.wireserver
        .unwrap_or_else(|| SocketAddr::from((lease_ws.unwrap_or(wireserver::DEFAULT_ADDR), 80)))
}

/// DHCP's first half, begun while the media is read: when it began, its deadline, and the
/// NIC with link up, carrier and socket (or why not).
struct NetStart {
    t: Instant,
    deadline: Deadline,
    prepared: Result<Prepared, DhcpError>,
}

/// Picks the NIC, brings its link up, waits for carrier, opens the socket; sends nothing. None
/// with `--no-dhcp`.
fn prepare_network(opts: &Options, deadline: Deadline) -> Option<NetStart> {
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
fn network(
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

/// A stage whose panic (a bug, most likely in a parser fed hostile input) must still reach
/// Azure as NotReady "internal error" while the network is up, rather than end the run.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Failure::new(
            Reason::Internal,
            format!("panic while {what}"),
        ))
    })
}

/// IMDS, beside a first goal-state fetch that checks the WireServer early (the report fetches
/// the goal state again right before posting). The probe runs on a thread of its own and is
/// never waited for: the IMDS result is used as soon as it arrives.
fn metadata(opts: &Options, ws: &WireServer, deadline: Deadline) -> Result<imds::Imds, Failure> {
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
    let m = imds::fetch(ws.client, &opts.imds, dl);
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

/// Ready, or NotReady with the failure's reason; a fresh goal state before each POST. True
/// when the WireServer acknowledged the report.
fn report(
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
fn install_host_keys(
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
fn release_network(opts: &Options, network: Result<Option<Applied>, Failure>) {
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
fn report_deadline(network: &Result<Option<Applied>, Failure>, deadline: Deadline) -> Deadline {
    if network.is_err() {
        deadline.min(REPORT_WITHOUT_LEASE)
    } else {
        deadline
    }
}

/// A provisioned boot does nothing unless the first boot left work undone: a Ready the
/// WireServer never acknowledged (sent again), or no host keys made for this VM id yet (made,
/// without network). The state is read once and written once, if it changed.
fn finish_provisioned(opts: &Options, root: &Sysroot, s: &mut Summary, keygen: Option<Keygen>) {
    let mut state = State::load(root).unwrap_or_default();
    let vm_id = root.read_marker();
    let resend = state.report == Some(Acked::Pending) && state.provisioned_at.is_some();
    let keys =
        opts.host_keys && !(state.host_keys_vm_id.is_some() && state.host_keys_vm_id == vm_id);
    if !resend && !keys {
        return;
    }
    let before = state.clone();
    let _writable = writable(opts);
    if resend && resend_ready(opts, state.hostname.as_deref(), s) {
        state.report = Some(Acked::Ready);
        state.reported_at = Some(crate::time::now_rfc3339());
    }
    if keys {
        log::info!("host keys: none made for this VM yet; making them");
        s.hostname = state.hostname.clone();
        let generated = keygen.map_or_else(|| hostkeys::generate(&opts.sys), Keygen::join);
        install_host_keys(root, generated, s);
        if !s.host_keys.is_empty() {
            state.host_keys = s.host_keys.clone();
            state.host_keys_vm_id = vm_id;
        }
    }
    if state != before {
        if let Err(e) = state.save(root) {
            log::warn!("cannot write the state: {e}");
        }
    }
}

/// On a provisioned boot whose Ready was never acknowledged (the WireServer was down for the
/// whole first boot): DHCP and the report again, nothing else, so Azure sees Ready now rather
/// than OSProvisioningTimedOut. Once acknowledged, reboots send nothing. True when it was.
fn resend_ready(opts: &Options, hostname: Option<&str>, s: &mut Summary) -> bool {
    log::info!("the Ready of the first boot was not acknowledged; reporting it again");
    let deadline = Deadline::after(opts.timeout);
    let t = Instant::now();
    let network = network(opts, prepare_network(opts, deadline), hostname);
    s.timings_ms.dhcp = ms(t.elapsed());
    let client = Client::new();
    let ws = WireServer {
        client: &client,
        addr: wireserver_addr(opts, &network),
    };
    let t = Instant::now();
    let acked = report(&ws, &Ok(()), s, report_deadline(&network, deadline));
    if !acked {
        s.report = Report::Failure;
    }
    s.timings_ms.report = ms(t.elapsed());
    release_network(opts, network);
    acked
}
