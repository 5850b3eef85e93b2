//! The provisioning run of docs/DESIGN.md, "Bird's-eye view", from "already provisioned?" to
//! "teardown", shared by hook mode (`azprov provision --root`) and PID 1 mode.

use super::data::ProvisioningData;
use super::hostkeys::{self, Keygen};
use super::hostkeys::{finish_host_keys_later, install_host_keys};
use super::kvp::KvpReport;
use super::merge::merge;
use super::msp::{self, Msp};
use super::network::{bring_up_dhcp, prepare_network, Link, NetStart};
pub use super::options::{MediaSource, Mode, Options, CDROM_SETTLE};
use super::reboot::finish_provisioned;
use super::report::{record_report, report};
use super::sources::{describe_media, metadata, read_media, MEDIA_SHARE};
use super::stage::{ms, Stage};
use super::state::Written;
use super::state::{State, UNKNOWN_VM};
pub use super::summary::{Report, Summary};
use super::{Failure, Reason};
use crate::azure::ovf::OvfEnv;
use crate::azure::wireserver::{Reported, WireServer};
use crate::azure::{platform, vmid};
use crate::deadline::Deadline;
use crate::net::apply::Applied;
use crate::root::fstab;
use crate::root::{writable, Sysroot};
use crate::sys::mount::Mounted;
use std::path::Path;
use std::time::Instant;

/// Why the root counts as provisioned already, or None.
pub fn already_provisioned(root: &Sysroot, vm_id: Option<&str>) -> Option<String> {
    let marker = root.read_marker()?;
    match vm_id {
        Some(id) if id == marker => Some(format!("VM id {id} matches {}", crate::root::MARKER)),
        Some(id) => {
            log::info!(
                "{} holds {marker}, this VM is {id}: provisioning",
                crate::root::MARKER
            );
            None
        }
        None => Some(format!(
            "{} exists and DMI has no VM id",
            crate::root::MARKER
        )),
    }
}

/// What a run cut short left behind (a temporary of the state, the log, an account file) goes
/// on every run, a provisioned reboot's too; only then is a read-only root made writable.
fn remove_stale_temporaries(opts: &Options, root: &Sysroot) {
    let stale = root.stale_temporaries();
    if stale.is_empty() {
        return;
    }
    let _writable = writable(&opts.root, opts.remount);
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
/// ([`crate::root::Owners::recording`]) lets a whole run go without root in tests. The stages of
/// docs/DESIGN.md's diagram, in order; each is a method of [`Run`] below.
pub fn provision_in(opts: &Options, root: &Sysroot, keygen: Option<Keygen>) -> Summary {
    let capture = crate::logger::Capture::install();
    let mut run = Run::begin(opts, root);
    if let Some(report) = run.not_to_provision() {
        return run.end_elsewhere(report, keygen);
    }
    run.grow_root();
    // what fstab mounts on azprov's paths, unmounted on every way out (the marker may be on /var)
    let (_mounted, mount_failure) = run.mount_fstab();
    let fstab_ok = mount_failure.is_none();
    remove_stale_temporaries(opts, root);
    if let Some(why) = run.already_provisioned() {
        return run.end_provisioned(&why, keygen);
    }
    let deadline = Deadline::after(opts.timeout);
    root.set_deadline(deadline);
    let earlier = State::load(root);
    // read-only again when this run ends, whichever way
    let _writable = writable(&opts.root, opts.remount);
    run.drop_earlier_vms_data();
    // new host keys for the new VM, made beside the other stages
    let keygen = opts
        .host_keys
        .then(|| keygen.unwrap_or_else(|| Keygen::start(opts.sys.clone(), &opts.host_key_types)));
    let (ovf, net_start) = run.media_and_link(deadline);
    // an MSP VM: nothing is sent before the Guest Proxy Agent holds its key
    let msp_failure = match run.msp(&ovf) {
        Msp::Off if opts.after_proxy_agent => return run.end_not_msp(),
        Msp::Off | Msp::KeyHeld => None,
        Msp::Defer => return run.end_deferred(net_start, keygen, earlier.as_ref(), &capture),
        Msp::Fail(f) => Some(f),
    };
    let hashing = hash_beside(&ovf);
    let link = Link::new(opts.wireserver, run.dhcp(net_start, &ovf));
    let ws = link.wireserver();
    let data = match msp_failure {
        Some(f) => link.lease.as_ref().map_err(Clone::clone).and(Err(f)),
        None => run.imds_and_merge(&link.lease, &ws, &ovf, deadline),
    };
    let written = run.write(data, hashing, earlier.as_ref(), mount_failure);
    // never into /var when the filesystem fstab mounts there is missing
    let kvp = KvpReport::start(&opts.kvp_device, fstab_ok.then_some(root));
    let acked = run.report(&ws, &kvp, &written, link.report_deadline(deadline));
    link.release(opts.keep_network);
    if let Some(k) = keygen {
        install_host_keys(root, k.join(), &mut run.summary);
    }
    // the wait for the host's read of the report, and what it saw, go into the log and the total
    kvp.finish(deadline);
    run.save(&written, &acked, earlier.as_ref(), &capture);
    finish_host_keys_later(root, &run.summary, true);
    run.summary
}

/// One run into one root: what every stage reads (the options, the root) and the summary the
/// stages fill in, each stage one method.
struct Run<'a> {
    opts: &'a Options,
    root: &'a Sysroot,
    t0: Instant,
    /// What the run did, as `azprov status` and boot.json tell it.
    summary: Summary,
    /// When the writes finished, and when Azure acknowledged the report (RFC 3339).
    provisioned_at: Option<String>,
    reported_at: Option<String>,
}

impl<'a> Run<'a> {
    fn begin(opts: &'a Options, root: &'a Sysroot) -> Self {
        log::info!(
            "azprov {} ({}), root {}",
            crate::VERSION,
            if opts.remount { "hook" } else { "PID 1" },
            opts.root.display()
        );
        Run {
            opts,
            root,
            t0: Instant::now(),
            summary: Summary::new(vmid::read(&opts.dmi, &opts.sys)),
            provisioned_at: None,
            reported_at: None,
        }
    }

    /// Disabled on the command line, or not an Azure VM: the run ends here, with this report.
    fn not_to_provision(&self) -> Option<Report> {
        if self.opts.disable {
            log::info!("disabled on the kernel command line; not provisioning");
            return Some(Report::Disabled);
        }
        if !self.opts.force && !platform::is_azure(&self.opts.dmi) {
            let tag = platform::asset_tag(&self.opts.dmi);
            log::info!(
                "not an Azure VM (DMI chassis asset tag {}); nothing to do (azprov.force or --force provisions anyway)",
                tag.as_deref().map_or_else(|| "absent".into(), |t| format!("{t:?}"))
            );
            return Some(Report::NotAzure);
        }
        None
    }

    /// The end of a run that does not provision. Off Azure, a cleaned image (no host keys)
    /// still gets them: sshd needs them, and they need no packet.
    fn end_elsewhere(mut self, report: Report, keygen: Option<Keygen>) -> Summary {
        self.summary.report = report;
        if report == Report::Disabled {
            return self.summary;
        }
        if self.opts.host_keys && super::hostkeys::none_in(self.root) {
            log::info!("host keys: the root has none; making them (no network needed)");
            let _writable = writable(&self.opts.root, self.opts.remount);
            let generated = keygen.map_or_else(
                || hostkeys::generate(&self.opts.sys, &self.opts.host_key_types),
                Keygen::join,
            );
            install_host_keys(self.root, generated, &mut self.summary);
            finish_host_keys_later(self.root, &self.summary, false);
        }
        self.summary.timings_ms.total = ms(self.t0.elapsed());
        self.summary
    }

    /// The root grows to its disk on every boot, before anything is written into it; only a
    /// root that is a mount point of its own (never a directory of the host in tests).
    fn grow_root(&mut self) {
        let opts = self.opts;
        if opts.growroot && is_mount_point(&opts.root) {
            let grown = super::growroot::run(&opts.root, &opts.sys, &opts.dev, || {
                writable(&opts.root, opts.remount)
            });
            let line = grown.unwrap_or_else(|why| format!("skipped: {why}"));
            log::info!("growroot: {line}");
            self.summary.growroot = Some(line);
        }
    }

    /// What fstab mounts on azprov's paths (a separate /home, /var), mounted for the run; the
    /// failure, when one is missing, fails the writes later (after the network is up).
    fn mount_fstab(&self) -> (Mounted, Option<Failure>) {
        let block = self.opts.sys.join("class/block");
        match fstab::mount_for_writes(self.root, &block, &self.opts.dev) {
            Ok(m) => (m, None),
            Err(f) => {
                log::error!("{f}");
                (Mounted::default(), Some(f))
            }
        }
    }

    fn already_provisioned(&self) -> Option<String> {
        if self.opts.force {
            return None;
        }
        // the VM id the run read from DMI at its start
        already_provisioned(self.root, self.summary.vm_id.as_deref())
    }

    /// A new VM (the marker names another VM id): the earlier VM's custom data, user data and
    /// IMDS document go before anything can fail, so that no failure leaves them to be run
    /// or shown as this VM's.
    fn drop_earlier_vms_data(&self) {
        let (Some(marker), Some(id)) = (self.root.read_marker(), self.summary.vm_id.as_deref())
        else {
            return;
        };
        if marker == id {
            return;
        }
        for name in super::write::VM_DATA {
            match self
                .root
                .remove_file(&format!("{}/{name}", crate::root::STATE_DIR))
            {
                Ok(()) => {}
                Err(e) => log::warn!("cannot remove the earlier VM's {name}: {e}"),
            }
        }
        log::info!("the earlier VM's data ({marker}) removed: this is {id}");
    }

    /// A provisioned reboot: nothing, or what the first boot still owes (reboot.rs).
    fn end_provisioned(mut self, why: &str, keygen: Option<Keygen>) -> Summary {
        log::info!("already provisioned ({why}); nothing to do");
        self.summary.report = Report::Skipped;
        self.summary.vm_id = self
            .summary
            .vm_id
            .take()
            .or_else(|| self.root.read_marker());
        finish_provisioned(self.opts, self.root, &mut self.summary, keygen);
        self.summary.timings_ms.total = ms(self.t0.elapsed());
        self.summary
    }

    /// What MSP asks of this run, once the OVF says whether the VM was created with it.
    fn msp(&mut self, ovf: &Result<Option<OvfEnv>, Failure>) -> Msp {
        let flag = ovf_env(ovf).is_some_and(|o| o.provision_guest_proxy_agent);
        self.summary.msp = flag;
        match msp::decide(self.opts, self.root, flag) {
            Msp::Defer => {
                // the host keys' comment, as on any first boot
                self.summary.hostname = ovf_env(ovf).map(|o| o.hostname.clone());
                Msp::Defer
            }
            Msp::Fail(mut f) => {
                log::error!("msp: {f}");
                f.stage = Some("msp");
                Msp::Fail(f)
            }
            decision => decision,
        }
    }

    /// `azprov-msp.service` on a VM created without MSP: the initramfs provisions it.
    fn end_not_msp(mut self) -> Summary {
        log::info!(
            "msp: the VM was not created with the Metadata Security Protocol; the initramfs provisions it, nothing to do here"
        );
        self.summary.report = Report::Skipped;
        self.summary.timings_ms.total = ms(self.t0.elapsed());
        self.summary
    }

    /// An MSP VM in the initramfs: the link goes down unused, no packet was sent; the host keys
    /// are made here all the same (they need no network, and sshd waits for them), and the
    /// state says the rest is `azprov-msp.service`'s.
    fn end_deferred(
        mut self,
        net_start: Option<NetStart>,
        keygen: Option<Keygen>,
        earlier: Option<&State>,
        capture: &crate::logger::Capture,
    ) -> Summary {
        drop(net_start);
        self.summary.report = Report::Deferred;
        if let Some(k) = keygen {
            install_host_keys(self.root, k.join(), &mut self.summary);
        }
        self.summary.timings_ms.total = ms(self.t0.elapsed());
        if let Err(e) = State::deferred(&self.summary, earlier).save(self.root) {
            log::warn!("cannot write the state: {e}");
        }
        super::record::save_log(self.root, &capture.contents());
        finish_host_keys_later(self.root, &self.summary, true);
        self.summary
    }

    /// The media read and the NIC's link-up, carrier wait and socket overlap: DHCP's first
    /// packet carries the OVF's HostName, nothing before it needs the OVF.
    fn media_and_link(
        &mut self,
        deadline: Deadline,
    ) -> (Result<Option<OvfEnv>, Failure>, Option<NetStart>) {
        let (opts, root) = (self.opts, self.root);
        let media_ms = &mut self.summary.timings_ms.media;
        std::thread::scope(|sc| {
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
        })
    }

    fn dhcp(
        &mut self,
        net_start: Option<NetStart>,
        ovf: &Result<Option<OvfEnv>, Failure>,
    ) -> Result<Option<Applied>, Failure> {
        let hostname = ovf_env(ovf).map(|o| o.hostname.clone());
        bring_up_dhcp(
            self.opts.wireserver,
            net_start,
            hostname.as_deref(),
            &mut self.summary.timings_ms.dhcp,
        )
    }

    fn imds_and_merge(
        &mut self,
        network: &Result<Option<Applied>, Failure>,
        ws: &WireServer,
        ovf: &Result<Option<OvfEnv>, Failure>,
        deadline: Deadline,
    ) -> Result<ProvisioningData, Failure> {
        if let Err(f) = network {
            return Err(f.clone());
        }
        let imds = Stage::start("imds").recoverable().run(
            &mut self.summary.timings_ms.imds,
            || metadata(&self.opts.imds, ws, deadline),
            |m| format!("vmId {}, {} key(s)", m.vm_id, m.ssh_keys.len()),
        );
        let mut merge_ms = 0;
        Stage::start("merge").run(
            &mut merge_ms,
            || merge(ovf, &imds),
            |d| format!("hostname {} from {}", d.hostname.0, d.hostname.1),
        )
    }

    /// The writes of the file contract. A bug in them must still reach Azure as a reason while
    /// the network is up: the stage catches the panic, and the report says "internal error".
    fn write(
        &mut self,
        data: Result<ProvisioningData, Failure>,
        hashing: Option<Hashing>,
        earlier: Option<&State>,
        mount_failure: Option<Failure>,
    ) -> Result<Written, Failure> {
        let data = data?;
        self.summary.describe(&data);
        let vm_id = self
            .summary
            .vm_id
            .clone()
            .unwrap_or_else(|| UNKNOWN_VM.into());
        let owed = State::owed(&self.summary, earlier);
        let root = self.root;
        let write = || {
            // never into the directory a filesystem will be mounted over
            if let Some(f) = mount_failure {
                return Err(f);
            }
            let hash = hashing.map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(crate::root::WriteError::Corrupt("crypt panicked".into()))
                })
            });
            super::write::write_all(root, &data, hash, &vm_id, &owed)
        };
        let root_path = self.opts.root.display();
        let written = Stage::start("write").run(&mut self.summary.timings_ms.write, write, |_| {
            format!("{root_path} provisioned")
        });
        if let Some(rc) = &self.opts.run_config {
            match super::run_config::write(rc, &data) {
                Ok(w) => log::info!(
                    "run-config: {}: {} key(s), {}; {} entries of JSON user data expanded, {} refused",
                    rc.display(),
                    w.keys,
                    if w.userdata { "user data" } else { "no user data" },
                    w.expanded,
                    w.refused
                ),
                Err(e) => log::error!("run-config: cannot write {}: {e}", rc.display()),
            }
        }
        self.provisioned_at = written.is_ok().then(crate::time::now_rfc3339);
        // the booted system's unit: its hostname was set from the image's before this run
        // (only the running system's own root: never a directory a test provisions)
        let running =
            (self.opts.after_proxy_agent || self.opts.in_place) && self.opts.root == Path::new("/");
        if let (true, Ok(_), Some(name)) = (running, &written, &self.summary.hostname) {
            match crate::sys::set_hostname(name) {
                Ok(()) => log::info!("hostname: {name} set in the running system"),
                Err(e) => log::warn!("hostname: cannot set {name} in the running system: {e}"),
            }
        }
        written
    }

    /// Ready, or NotReady with the first failure's reason, to the WireServer, the KVP record
    /// on disk and served before the POST.
    fn report(
        &mut self,
        ws: &WireServer,
        kvp: &KvpReport,
        written: &Result<Written, Failure>,
        deadline: Deadline,
    ) -> Result<Reported, Failure> {
        let outcome = written.as_ref().map(|_| ()).map_err(Clone::clone);
        let acked = report(
            ws,
            kvp,
            &outcome,
            self.summary.vm_id.as_deref(),
            deadline,
            &mut self.summary.timings_ms.report,
        );
        record_report(&mut self.summary, &outcome, &acked);
        self.reported_at = acked.is_ok().then(crate::time::now_rfc3339);
        acked
    }

    /// state.json and the run's log, in the root.
    fn save(
        &mut self,
        written: &Result<Written, Failure>,
        acked: &Result<Reported, Failure>,
        earlier: Option<&State>,
        capture: &crate::logger::Capture,
    ) {
        self.summary.timings_ms.total = ms(self.t0.elapsed());
        log::info!("total: {} ms", self.summary.timings_ms.total);
        let state = State::after_run(
            &self.summary,
            (written, self.provisioned_at.take()),
            (acked, self.reported_at.take()),
            earlier,
        );
        if let Err(e) = state.save(self.root) {
            log::warn!("cannot write the state: {e}");
        }
        super::record::save_log(self.root, &capture.contents());
    }
}

/// A password's SHA-512 crypt on its own thread.
type Hashing =
    std::thread::JoinHandle<Result<crate::secret::Secret<String>, crate::root::WriteError>>;

/// The password's crypt (tens of ms of CPU under emulation), made while DHCP and IMDS are
/// waited for; merge takes the password from the OVF only.
fn hash_beside(ovf: &Result<Option<OvfEnv>, Failure>) -> Option<Hashing> {
    ovf_env(ovf)
        .and_then(|o| o.password.clone())
        .map(|pw| std::thread::spawn(move || crate::root::hash_password(&pw)))
}

fn ovf_env(ovf: &Result<Option<OvfEnv>, Failure>) -> Option<&OvfEnv> {
    ovf.as_ref().ok().and_then(Option::as_ref)
}

/// Whether `path` is the root of a filesystem of its own (or `/`).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata(path.join(".."))) {
        (Ok(a), Ok(b)) => a.dev() != b.dev() || a.ino() == b.ino(),
        _ => false,
    }
}
