//! PID 1 mode: docs/DESIGN.md, "The boot flow in PID 1", as a list of stages. Provisioning itself
//! is the same code as `azprov provision --root`; this file adds what only an init does: early
//! mounts, modules, finding and mounting the root, and switch_root into the real init.

use crate::config::{self, Config, OnFail, RootSpec};
use crate::modules::{self, modalias};
use crate::provision::hostkeys::Keygen;
use crate::provision::run::{early_keygen, provision_with, Mode, Options, Report};
use crate::root::Sysroot;
use crate::sys::kernel::{Kernel, Linux};
use crate::sys::mount::MsFlags;
use crate::sys::process::{self, Power};
use crate::sys::switch_root::{switch_root, SwitchRootError};
use crate::sys::Errno;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const SYSROOT: &str = "/sysroot";
const MODULES_LIST: &str = "/etc/azprov/modules";
const CMDLINE_DEFAULTS: &str = "/etc/azprov/cmdline";
const INIT_CANDIDATES: [&str; 4] = ["/sbin/init", "/etc/init", "/bin/init", "/bin/sh"];
/// How long to wait for the root device without `rootdelay=`.
const ROOT_WAIT_DEFAULT: Duration = Duration::from_secs(60);
/// With `rootwait` (no bound), how often the wait is said on the console.
const ROOT_WAIT_NOTICE: Duration = Duration::from_secs(30);
/// How often the root device scan runs while waiting.
const ROOT_POLL: Duration = Duration::from_millis(50);
/// Filesystems tried, in order, when neither `rootfstype=` nor the superblock names one.
const ROOT_FS_FALLBACK: [&str; 3] = ["ext4", "xfs", "btrfs"];
const DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";
/// `fail_forever` repeats the reason this often: quickly at first, then every 30 s.
const FAIL_REPEAT_FIRST: Duration = Duration::from_secs(3);
const FAIL_REPEAT_LATER: Duration = Duration::from_secs(30);

/// Why PID 1 cannot hand over to a real init.
#[derive(Debug)]
pub enum BootError {
    NoRootParam,
    RootTimeout {
        spec: RootSpec,
        waited: Duration,
    },
    /// The root device exists but no filesystem type mounted it.
    RootMount {
        dev: PathBuf,
        spec: RootSpec,
        errors: Vec<(String, Errno)>,
    },
    InitNotExecutable(String),
    NoInit,
    SwitchRoot {
        init: String,
        error: SwitchRootError,
    },
}

impl std::fmt::Display for BootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootError::NoRootParam => write!(f, "no root= on the kernel command line"),
            BootError::RootTimeout { spec, waited } => write!(
                f,
                "root device {spec} did not appear within {}s",
                waited.as_secs()
            ),
            BootError::RootMount { dev, spec, errors } => {
                write!(f, "cannot mount root {} ({spec}):", dev.display())?;
                for (fstype, e) in errors {
                    write!(f, " {fstype}: {e}")?;
                }
                Ok(())
            }
            BootError::InitNotExecutable(i) => {
                write!(
                    f,
                    "init={i} is not an executable file in the root filesystem"
                )
            }
            BootError::NoInit => write!(
                f,
                "no init in the root filesystem (tried {})",
                INIT_CANDIDATES.join(", ")
            ),
            BootError::SwitchRoot { init, error } => {
                write!(f, "switch_root to {init} failed: {error}")
            }
        }
    }
}

/// An early mount: what, where, type, flags, data. Printed when it fails.
struct EarlyMount {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: MsFlags,
    data: Option<&'static str>,
}

const EARLY_MOUNTS: [EarlyMount; 4] = [
    EarlyMount {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: MsFlags::MS_NOSUID,
        data: Some("mode=0755"),
    },
    EarlyMount {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: MsFlags::MS_NOSUID
            .union(MsFlags::MS_NODEV)
            .union(MsFlags::MS_NOEXEC),
        data: None,
    },
    EarlyMount {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: MsFlags::MS_NOSUID
            .union(MsFlags::MS_NODEV)
            .union(MsFlags::MS_NOEXEC),
        data: None,
    },
    EarlyMount {
        source: "tmpfs",
        target: "/run",
        fstype: "tmpfs",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: Some("mode=0755"),
    },
];

/// The whole boot, as the stages of docs/DESIGN.md, "The boot flow in PID 1". Never returns:
/// it execs the real init or follows `azprov.onfail`.
pub fn main() -> ! {
    let t0 = Instant::now();
    let devkmsg = early_mounts();
    let cfg = config::read(
        Some(Path::new(CMDLINE_DEFAULTS)),
        Path::new("/proc/cmdline"),
    );
    crate::logger::init(cfg.log_level);
    crate::logger::Capture::install();
    log::info!("azprov {} as PID 1", crate::VERSION);

    // A new VM's host keys are made from here on, on idle CPU only: the RSA search takes a
    // fraction of a second natively, and the module stage mostly waits on devices.
    let mut opts = Options::from_config(PathBuf::from(SYSROOT), &cfg, Mode::Pid1);
    let keygen = early_keygen(&opts);
    // The modules load on threads of their own while the root is looked for: the root's disk
    // driver is seldom the last one in.
    let modules = Modules::start(&cfg);
    if cfg.inplace {
        in_place(&cfg, opts, keygen, modules, &devkmsg, t0);
    }
    let root = mount_root(&cfg, &modules).unwrap_or_else(|e| no_root(&opts, &modules, &e, &cfg));
    // Check the handover target before provisioning writes anything into the root.
    let init = find_init(&cfg, SYSROOT).unwrap_or_else(|e| no_root(&opts, &modules, &e, &cfg));
    // Provisioning starts while the last drivers load: the media stage reads a CD drive that is
    // there already (else it waits for them), the network waits for them (the NIC's driver),
    // and iso9660 loads on demand.
    let loader = modules.loader;
    opts.modules = loader.clone();
    provision_root(&opts, keygen);
    process::reap();
    if cfg.read_only {
        remount_read_only(&Linux, &root);
    }
    log::info!(
        "handing over to {init} after {} ms",
        t0.elapsed().as_millis()
    );
    loader.restore_scsi_scan();
    let _ = fs::write(DEVKMSG, devkmsg);
    // The kernel hands init's own arguments (words it did not recognise) to us: pass them on.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let error = switch_root(Path::new(SYSROOT), &init, &args);
    fail_forever(&BootError::SwitchRoot { init, error }, cfg.onfail)
}

/// `azprov.inplace`: the initramfs is the OS (linuxkit and the systems built like it). No root
/// is looked for and none switched to: the initramfs itself is provisioned (its RAM root, the
/// /run/config layout its services read, the hostname set), Ready reported, and the init that
/// `init=` names (default /sbin/init) is exec'd in place, as PID 1. Every boot starts from a
/// fresh RAM root, so every boot is a first boot (docs/contracts.md, "Stateless images").
fn in_place(
    cfg: &Config,
    opts: Options,
    keygen: Option<Keygen>,
    modules: Modules,
    devkmsg: &str,
    t0: Instant,
) -> ! {
    log::info!("azprov.inplace: the initramfs is the OS; provisioning it in place");
    drop(keygen);
    let init = find_init(cfg, "/").unwrap_or_else(|e| fail_forever(&e, cfg.onfail));
    // /run/config and /run/azprov go into the RAM root's own /run, which the OS's init carries
    // along (linuxkit's, like most, copies the initramfs into a tmpfs and switches to it)
    run_in_ram_root(&Linux);
    let loader = modules.loader;
    let opts = Options {
        root: PathBuf::from("/"),
        in_place: true,
        growroot: false,
        // the system's sshd makes its own keys in its RAM root, as linuxkit's does
        host_keys: false,
        run_config: Some(PathBuf::from(crate::provision::run_config::DEFAULT)),
        modules: loader.clone(),
        ..opts
    };
    provision_root(&opts, None);
    process::reap();
    log::info!(
        "handing over to {init} in place after {} ms",
        t0.elapsed().as_millis()
    );
    loader.restore_scsi_scan();
    let _ = fs::write(DEVKMSG, devkmsg);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let error = exec_in_place(&Linux, &init, &args);
    fail_forever(
        &BootError::SwitchRoot {
            init,
            error: SwitchRootError {
                step: "exec",
                path: PathBuf::from("/"),
                errno: error,
            },
        },
        cfg.onfail,
    )
}

/// The tmpfs the early mounts put on /run, detached: what is written under /run from here on
/// lands in the RAM root itself.
fn run_in_ram_root(k: &impl Kernel) {
    if let Err(e) = k.umount(Path::new("/run"), crate::sys::mount::MntFlags::MNT_DETACH) {
        log::warn!("azprov.inplace: cannot detach the tmpfs on /run: {e}");
    }
}

/// The init in place, as PID 1, with the early filesystems detached first: it starts from what
/// the kernel gave PID 1, as if azprov had not run (its own init mounts them, often with
/// `set -e`). Returns only when the exec failed.
fn exec_in_place(k: &impl Kernel, init: &str, args: &[String]) -> Errno {
    for m in EARLY_MOUNTS.iter().rev().filter(|m| m.target != "/run") {
        if let Err(e) = k.umount(Path::new(m.target), crate::sys::mount::MntFlags::MNT_DETACH) {
            log::warn!("azprov.inplace: cannot detach {}: {e}", m.target);
        }
    }
    k.exec(init, args)
}

/// No root to boot: on Azure, unless provisioning is disabled, the failure is served over KVP
/// (the only way it can reach the host: no network comes up without a root) for as long as
/// PID 1 says why, until `azprov.onfail` halts or reboots.
fn no_root(opts: &Options, modules: &Modules, e: &BootError, cfg: &Config) -> ! {
    if !opts.disable && (opts.force || crate::azure::platform::is_azure(&opts.dmi)) {
        // hv_utils makes the KVP device
        modules.loader.wait();
        let failure = crate::azure::reason::Failure::new(crate::azure::reason::Reason::BootRoot, e);
        let vm_id = crate::azure::vmid::read(&opts.dmi, &opts.sys);
        crate::provision::kvp::serve_failure(
            &opts.kvp_device,
            &failure,
            vm_id.as_deref().unwrap_or("unknown"),
        );
    }
    fail_forever(e, cfg.onfail)
}

/// Provisions the mounted root (unless disabled or not on Azure). A failure (a panic too) is reported and
/// logged; the boot goes on into the real root so the VM stays reachable for debugging.
fn provision_root(opts: &Options, keygen: Option<Keygen>) {
    let run = std::panic::AssertUnwindSafe(|| provision_with(opts, keygen));
    match std::panic::catch_unwind(run) {
        Ok(s) if matches!(s.report, Report::Failure | Report::Pending) => log::error!(
            "provisioning failed: {}; booting the real root for debugging",
            s.cause.as_deref().unwrap_or("unknown")
        ),
        Ok(_) => {}
        Err(_) => log::error!("provisioning panicked; booting the real root"),
    }
}

/// `ro` on the command line: the root goes back to read-only before handover.
fn remount_read_only(k: &impl Kernel, dev: &Path) {
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    if let Err(e) = k.mount(dev, Path::new(SYSROOT), "", flags, None) {
        log::warn!("remount {SYSROOT} read-only: {e}");
    }
}

/// Mounts the table of early filesystems, each on a directory made first; one mounted already
/// (EBUSY) is fine, another failure is said on stderr (no logger yet) and the next one tried.
/// What failed, for the tests.
fn mount_early(k: &impl Kernel) -> Vec<(&'static str, Errno)> {
    let mut failed = Vec::new();
    for m in &EARLY_MOUNTS {
        k.mkdir_all(Path::new(m.target));
        match k.mount(
            Path::new(m.source),
            Path::new(m.target),
            m.fstype,
            m.flags,
            m.data,
        ) {
            Ok(()) | Err(Errno::EBUSY) => {}
            Err(e) => {
                eprintln!(
                    "azprov: mount {} on {} ({}): {e}",
                    m.source, m.target, m.fstype
                );
                failed.push((m.target, e));
            }
        }
    }
    failed
}

/// Sets up /dev, /proc, /sys, /run and the logger; returns the printk_devkmsg value found.
fn early_mounts() -> String {
    mount_early(&Linux);
    // Console until kmsg is there; then kmsg, so the lines reach the real system's journal.
    // Userspace writes to kmsg are rate-limited (10 per 5 s) unless printk_devkmsg is "on",
    // as systemd sets it; the old value is restored before handover.
    let devkmsg = fs::read_to_string(DEVKMSG).unwrap_or_else(|_| "ratelimit\n".into());
    let _ = fs::write(DEVKMSG, "on\n");
    match fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        Ok(k) => crate::logger::set_output(crate::logger::Output::Kmsg(k)),
        Err(_) => {
            if let Ok(c) = fs::OpenOptions::new().write(true).open("/dev/console") {
                crate::logger::set_output(crate::logger::Output::Console(c));
            }
        }
    }
    devkmsg
}

/// The module load: on its thread until the root or a later stage waits for it.
struct Modules {
    loader: modules::OnDemand,
    /// The deferred root filesystem modules' names, to know without waiting whether the root's
    /// type needs one.
    deferred: Vec<String>,
}

impl Modules {
    /// Starts loading the modules listed in the initramfs and `azprov.modules=`; root
    /// filesystem modules wait in the loader until the root's type is known.
    fn start(cfg: &Config) -> Modules {
        let mut list = modules::parse_list(&fs::read_to_string(MODULES_LIST).unwrap_or_default());
        let wanted: Vec<String> = cfg.modules.iter().map(|m| modules::norm(m)).collect();
        for name in &wanted {
            if list.iter().any(|m| &m.name == name) {
                continue; // listed already: `wanted` exempts it from the device check
            }
            match modules::find(Path::new("/lib/modules"), name) {
                Some(path) => list.push(modules::Module {
                    path,
                    name: name.clone(),
                    deps: Vec::new(),
                    aliases: Vec::new(),
                }),
                None => log::warn!("module {name}: not in the initramfs"),
            }
        }
        // only the drivers a device of this VM needs (Azure's or QEMU's)
        let devices = modalias::Devices::scan(Path::new("/sys"), crate::sys::hyperv(), &list);
        let (list, unneeded) = modalias::gate(list, &devices, &wanted);
        let (now, later) = modules::split_deferred(list);
        let deferred = later.iter().map(|m| m.name.clone()).collect();
        let params = cfg.module_params.clone();
        let thread = std::thread::spawn(move || {
            let t = Instant::now();
            let mut loader = modules::Loader::new(later, params);
            loader.leave_out(unneeded);
            loader.load(&now);
            log::info!(
                "modules: {} ms: {} loaded, {} skipped {}",
                t.elapsed().as_millis(),
                loader.loaded,
                loader.skipped.len(),
                loader.skipped.join(" ")
            );
            loader
        });
        Modules {
            loader: modules::OnDemand::loading(thread),
            deferred,
        }
    }

    /// Whether mounting a root of `fstype` needs a deferred module (and so the loader).
    fn needed_for(&self, fstype: Option<&str>) -> bool {
        match fstype {
            Some(t) => self.deferred.iter().any(|d| d == t),
            None => self
                .deferred
                .iter()
                .any(|d| ROOT_FS_FALLBACK.contains(&d.as_str())),
        }
    }
}

/// The device for `root=`, once it exists.
fn find_root_device(spec: &RootSpec) -> Option<(PathBuf, Option<&'static str>)> {
    crate::root::fstab::find(spec, Path::new("/sys/class/block"), Path::new("/dev"))
}

/// How long to wait for the root device: `rootdelay=`, else without bound with `rootwait` (as
/// the kernel does), else [`ROOT_WAIT_DEFAULT`]. None: no bound.
fn root_wait(cfg: &Config) -> Option<Duration> {
    match (cfg.rootdelay, cfg.rootwait) {
        (Some(d), _) => Some(d),
        (None, true) => None,
        (None, false) => Some(ROOT_WAIT_DEFAULT),
    }
}

/// Waits for the root device (bounded unless `rootwait`), mounts it read-write at /sysroot.
/// Returns the device.
fn mount_root(cfg: &Config, modules: &Modules) -> Result<PathBuf, BootError> {
    let spec = cfg.root.as_ref().ok_or(BootError::NoRootParam)?;
    let t = Instant::now();
    let bound = root_wait(cfg);
    let deadline = bound.map(crate::deadline::Deadline::after);
    let mut told = Instant::now();
    let mut checked = std::collections::BTreeSet::new();
    let (dev, probed) = loop {
        if let Some(found) = find_root_device(spec) {
            break found;
        }
        // a disk whose primary GPT a cut during a grow left unsound shows no partition
        if cfg.growroot {
            crate::provision::growroot::restore_tables(
                Path::new("/sys"),
                Path::new("/dev"),
                &mut checked,
            );
        }
        match (deadline, bound) {
            (Some(d), Some(waited)) if !d.sleep(ROOT_POLL) => {
                return Err(BootError::RootTimeout {
                    spec: spec.clone(),
                    waited,
                })
            }
            (Some(_), _) => {}
            (None, _) => {
                std::thread::sleep(ROOT_POLL);
                if told.elapsed() >= ROOT_WAIT_NOTICE {
                    log::warn!("rootwait: still waiting for the root device {spec}");
                    told = Instant::now();
                }
            }
        }
    };
    let _ = fs::create_dir_all(SYSROOT);
    let fstype = cfg.rootfstype.as_deref().or(probed);
    if modules.needed_for(fstype) {
        modules.loader.load_root_fs(fstype);
    }
    let types: Vec<&str> = match (&cfg.rootfstype, probed) {
        (Some(t), _) => vec![t.as_str()],
        (None, Some(p)) => vec![p],
        (None, None) => ROOT_FS_FALLBACK.to_vec(),
    };
    match mount_first(&Linux, &dev, &types, cfg.rootflags.as_deref()) {
        Ok(fstype) => {
            log::info!(
                "root: {} ms: {spec} is {} ({fstype}), mounted at {SYSROOT}",
                t.elapsed().as_millis(),
                dev.display()
            );
            Ok(dev)
        }
        Err(errors) => Err(BootError::RootMount {
            dev,
            spec: spec.clone(),
            errors,
        }),
    }
}

/// Mounts `dev` read-write at /sysroot with the first of `types` that takes it; the error of
/// each type when none does.
fn mount_first<'t>(
    k: &impl Kernel,
    dev: &Path,
    types: &[&'t str],
    flags: Option<&str>,
) -> Result<&'t str, Vec<(String, Errno)>> {
    let mut errors = Vec::new();
    for fstype in types {
        match k.mount(dev, Path::new(SYSROOT), fstype, MsFlags::empty(), flags) {
            Ok(()) => return Ok(fstype),
            Err(e) => errors.push((fstype.to_string(), e)),
        }
    }
    Err(errors)
}

/// The init to exec, checked in the new root before anything is destroyed.
fn find_init(cfg: &Config, root: &str) -> Result<String, BootError> {
    let root = Sysroot::new(root);
    let executable = |p: &str| {
        root.resolve_full(p)
            .ok()
            .and_then(|h| fs::metadata(h).ok())
            .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    match &cfg.init {
        Some(i) if executable(i) => Ok(i.clone()),
        Some(i) => Err(BootError::InitNotExecutable(i.clone())),
        None => INIT_CANDIDATES
            .iter()
            .find(|c| executable(c))
            .map(|c| c.to_string())
            .ok_or(BootError::NoInit),
    }
}

/// No root to boot: say why, every few seconds, then follow `azprov.onfail`.
pub fn fail_forever(reason: &dyn std::fmt::Display, onfail: OnFail) -> ! {
    let mut round = 0u32;
    loop {
        // kmsg records at error priority reach the console whatever the loglevel
        log::error!("cannot boot: {reason}");
        if round >= 2 {
            let how = match onfail {
                OnFail::Halt => None,
                OnFail::Reboot => Some(Power::Reboot),
                OnFail::Poweroff => Some(Power::PowerOff),
            };
            if let Some(how) = how {
                let e = process::power(how);
                log::error!("{how:?}: {e}");
            }
        }
        process::reap();
        let pause = if round < 3 {
            FAIL_REPEAT_FIRST
        } else {
            FAIL_REPEAT_LATER
        };
        crate::deadline::Deadline::after(pause).sleep(pause);
        round = round.saturating_add(1);
    }
}

#[cfg(test)]
mod tests;
