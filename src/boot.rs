//! PID 1 mode: the boot flow of DESIGN.md §2 as a list of stages. Provisioning itself is the
//! same code as `azprov provision --root`; this file adds what only an init does: early
//! mounts, modules, finding and mounting the root, and switch_root into the real init.

use crate::config::{self, Config, OnFail, RootSpec};
use crate::modules;
use crate::provision::run::{provision, MediaSource, Options, Report};
use crate::provision::sysroot::Sysroot;
use crate::sys::block;
use crate::sys::init::{self as sysinit, Power};
use crate::sys::mount;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const SYSROOT: &str = "/sysroot";
const MODULES_LIST: &str = "/etc/azprov/modules";
const CMDLINE_DEFAULTS: &str = "/etc/azprov/cmdline";
const INIT_CANDIDATES: [&str; 4] = ["/sbin/init", "/etc/init", "/bin/init", "/bin/sh"];
const ROOT_WAIT_DEFAULT: Duration = Duration::from_secs(60);
const DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";

/// An early mount: what, where, type, flags, data. Printed when it fails.
struct EarlyMount {
    source: &'static str,
    target: &'static str,
    fstype: &'static str,
    flags: libc::c_ulong,
    data: Option<&'static str>,
}

const EARLY_MOUNTS: [EarlyMount; 4] = [
    EarlyMount {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: libc::MS_NOSUID,
        data: Some("mode=0755"),
    },
    EarlyMount {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: None,
    },
    EarlyMount {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: None,
    },
    EarlyMount {
        source: "tmpfs",
        target: "/run",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: Some("mode=0755"),
    },
];

/// The whole boot. Never returns: it execs the real init or follows `azprov.onfail`.
pub fn main() -> ! {
    let t0 = Instant::now();
    let devkmsg = early_mounts();
    let cfg = load_config();
    crate::log::init(cfg.log_level);
    crate::log::Capture::install();
    log::info!("azprov {} as PID 1", crate::VERSION);

    let mut loader = load_modules(&cfg);
    let root = match mount_root(&cfg, &mut loader) {
        Ok(r) => r,
        Err(reason) => fail_forever(&reason, cfg.onfail),
    };
    // Check the handover target before provisioning writes anything into the root.
    let init = match find_init(&cfg) {
        Ok(i) => i,
        Err(reason) => fail_forever(&reason, cfg.onfail),
    };
    if cfg.disable {
        log::info!("azprov.disable: not provisioning");
    } else {
        let opts = Options {
            root: PathBuf::from(SYSROOT),
            iface: cfg.iface.clone(),
            dhcp: true,
            media: MediaSource::Devices(Vec::new()),
            force: cfg.force,
            timeout: cfg.timeout,
            wireserver: cfg.wireserver,
            imds: cfg.imds.clone(),
            keep_network: cfg.keepnet,
            sys: "/sys".into(),
            dev: "/dev".into(),
            // SCSI and ATA scans finish after their modules load
            cdrom_settle: Duration::from_secs(2),
        };
        // A panic while provisioning is a failure like any other: the VM still boots.
        match std::panic::catch_unwind(|| provision(&opts)) {
            Ok(s) if s.report == Report::Failure => {
                log::error!(
                    "provisioning failed ({}); booting the real root for debugging",
                    s.reason.unwrap_or_default()
                )
            }
            Ok(_) => {}
            Err(_) => log::error!("provisioning panicked; booting the real root"),
        }
    }
    sysinit::reap();
    if cfg.read_only {
        if let Err(e) = mount::mount(
            Path::new(&root),
            Path::new(SYSROOT),
            "",
            libc::MS_REMOUNT | libc::MS_RDONLY,
            None,
        ) {
            log::warn!("remount {SYSROOT} read-only: {e}");
        }
    }
    log::info!(
        "handing over to {init} after {} ms",
        t0.elapsed().as_millis()
    );
    let _ = fs::write(DEVKMSG, devkmsg);
    let err = switch_root(&init);
    fail_forever(&format!("switch_root to {init} failed: {err}"), cfg.onfail)
}

/// Sets up /dev, /proc, /sys, /run and the logger; returns the printk_devkmsg value found.
fn early_mounts() -> String {
    for m in &EARLY_MOUNTS {
        let _ = fs::create_dir_all(m.target);
        match mount::mount(
            Path::new(m.source),
            Path::new(m.target),
            m.fstype,
            m.flags,
            m.data,
        ) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => eprintln!(
                "azprov: mount {} on {} ({}): {e}",
                m.source, m.target, m.fstype
            ),
        }
    }
    // Console until kmsg is there; then kmsg, so the lines reach the real system's journal.
    // Userspace writes to kmsg are rate-limited (10 per 5 s) unless printk_devkmsg is "on",
    // as systemd sets it; the old value is restored before handover.
    let devkmsg = fs::read_to_string(DEVKMSG).unwrap_or_else(|_| "ratelimit\n".into());
    let _ = fs::write(DEVKMSG, "on\n");
    match fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        Ok(k) => crate::log::set_output(crate::log::Output::Kmsg(k)),
        Err(_) => {
            if let Ok(c) = fs::OpenOptions::new().write(true).open("/dev/console") {
                crate::log::set_output(crate::log::Output::Console(c));
            }
        }
    }
    devkmsg
}

fn load_config() -> Config {
    let defaults = fs::read_to_string(CMDLINE_DEFAULTS).ok();
    let cmdline = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let (cfg, errors) = config::load(defaults.as_deref(), &cmdline);
    for e in errors {
        log::error!("kernel command line: {e} (ignored)");
    }
    cfg
}

/// Loads the modules listed in the initramfs and `azprov.modules=`; root filesystem modules
/// wait in the returned loader until the root's type is known.
fn load_modules(cfg: &Config) -> modules::Loader {
    let t = Instant::now();
    let mut list = modules::parse_list(&fs::read_to_string(MODULES_LIST).unwrap_or_default());
    for name in &cfg.modules {
        match modules::find(Path::new("/lib/modules"), name) {
            Some(path) => list.push(modules::Module {
                path,
                name: name.replace('-', "_"),
                deps: Vec::new(),
            }),
            None => log::warn!("module {name}: not in the initramfs"),
        }
    }
    let (now, later) = modules::split_deferred(list);
    let mut loader = modules::Loader::new(later);
    loader.load(&now);
    log::info!(
        "modules: {} ms: {} loaded, {} skipped {}",
        t.elapsed().as_millis(),
        loader.loaded,
        loader.skipped.len(),
        loader.skipped.join(" ")
    );
    loader
}

/// The device for `root=`, once it exists.
fn find_root_device(spec: &RootSpec) -> Option<(PathBuf, Option<&'static str>)> {
    if let RootSpec::Dev(d) = spec {
        let p = PathBuf::from(d);
        if !p.exists() {
            return None;
        }
        let fstype = block::probe_device(&p).map(|i| i.fstype);
        return Some((p, fstype));
    }
    block::scan(Path::new("/sys/class/block"), Path::new("/dev"))
        .into_iter()
        .find_map(|d| {
            let hit = match spec {
                RootSpec::Uuid(u) => d.fs.as_ref().is_some_and(|f| f.uuid == *u),
                RootSpec::Label(l) => d.fs.as_ref().is_some_and(|f| f.label == *l),
                RootSpec::PartUuid(u) => d.part.as_ref().is_some_and(|p| p.partuuid == *u),
                RootSpec::PartLabel(l) => d.part.as_ref().is_some_and(|p| p.partlabel == *l),
                RootSpec::Dev(_) => false,
            };
            hit.then(|| (d.node.clone(), d.fs.as_ref().map(|f| f.fstype)))
        })
}

/// Waits for the root device (bounded), mounts it read-write at /sysroot. Returns the device.
fn mount_root(cfg: &Config, loader: &mut modules::Loader) -> Result<String, String> {
    let spec = cfg
        .root
        .as_ref()
        .ok_or("no root= on the kernel command line")?;
    let t = Instant::now();
    let bound = cfg.rootdelay.unwrap_or(ROOT_WAIT_DEFAULT);
    let deadline = crate::deadline::Deadline::after(bound);
    let (dev, probed) = loop {
        if let Some(found) = find_root_device(spec) {
            break found;
        }
        if !deadline.sleep(Duration::from_millis(50)) {
            return Err(format!(
                "root device {spec} did not appear within {}s",
                bound.as_secs()
            ));
        }
    };
    let _ = fs::create_dir_all(SYSROOT);
    loader.load_for_fs(cfg.rootfstype.as_deref().or(probed));
    let types: Vec<&str> = match (&cfg.rootfstype, probed) {
        (Some(t), _) => vec![t.as_str()],
        (None, Some(p)) => vec![p],
        (None, None) => vec!["ext4", "xfs", "btrfs"],
    };
    let mut errors = Vec::new();
    for fstype in &types {
        match mount::mount(
            &dev,
            Path::new(SYSROOT),
            fstype,
            0,
            cfg.rootflags.as_deref(),
        ) {
            Ok(()) => {
                log::info!(
                    "root: {} ms: {spec} is {} ({fstype}), mounted at {SYSROOT}",
                    t.elapsed().as_millis(),
                    dev.display()
                );
                return Ok(dev.display().to_string());
            }
            Err(e) => errors.push(format!("{fstype}: {e}")),
        }
    }
    Err(format!(
        "cannot mount root {} ({spec}): {}",
        dev.display(),
        errors.join(", ")
    ))
}

/// The init to exec, checked in the new root before anything is destroyed.
fn find_init(cfg: &Config) -> Result<String, String> {
    let root = Sysroot::new(SYSROOT);
    let executable = |p: &str| {
        root.resolve_full(p)
            .ok()
            .and_then(|h| fs::metadata(h).ok())
            .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    match &cfg.init {
        Some(i) if executable(i) => Ok(i.clone()),
        Some(i) => Err(format!(
            "init={i} is not an executable file in the root filesystem"
        )),
        None => INIT_CANDIDATES
            .iter()
            .find(|c| executable(c))
            .map(|c| c.to_string())
            .ok_or_else(|| {
                format!(
                    "no init in the root filesystem (tried {})",
                    INIT_CANDIDATES.join(", ")
                )
            }),
    }
}

/// u-root's switch_root as named steps. Returns only on failure.
fn switch_root(init: &str) -> std::io::Error {
    let new = Path::new(SYSROOT);
    match (sysinit::device_of(new), sysinit::device_of(Path::new("/"))) {
        (Ok(a), Ok(b)) if a != b => {}
        (Ok(_), Ok(_)) => return std::io::Error::other(format!("{SYSROOT} is not a mount point")),
        (Err(e), _) | (_, Err(e)) => return e,
    }
    for dir in ["/dev", "/proc", "/sys", "/run"] {
        let target = new.join(dir.trim_start_matches('/'));
        if target.is_dir() {
            if let Err(e) = mount::mount(Path::new(dir), &target, "", libc::MS_MOVE, None) {
                log::warn!("move {dir} into the root: {e}");
            }
        } else {
            log::warn!("{} is missing; unmounting {dir}", target.display());
            let _ = mount::umount(Path::new(dir), libc::MNT_DETACH);
        }
    }
    if let Err(e) = sysinit::chdir(new) {
        return e;
    }
    // Free the initramfs memory: delete its files, never crossing into another filesystem.
    if let Ok(rootdev) = sysinit::device_of(Path::new("/")) {
        delete_tree(Path::new("/"), rootdev);
    }
    if let Err(e) = mount::mount(Path::new("."), Path::new("/"), "", libc::MS_MOVE, None) {
        return e;
    }
    if let Err(e) = sysinit::chroot(Path::new(".")) {
        return e;
    }
    if let Err(e) = sysinit::chdir(Path::new("/")) {
        return e;
    }
    // The kernel hands init's own arguments (words it did not recognise) to us: pass them on.
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::Command::new(init)
        .arg0(init)
        .args(args)
        .exec()
}

fn delete_tree(dir: &Path, dev: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        let Ok(md) = fs::symlink_metadata(&p) else {
            continue;
        };
        if std::os::unix::fs::MetadataExt::dev(&md) != dev {
            continue; // a mount point: /sysroot and the moved API filesystems
        }
        if md.is_dir() {
            delete_tree(&p, dev);
            let _ = fs::remove_dir(&p);
        } else {
            let _ = fs::remove_file(&p);
        }
    }
}

/// No root to boot: say why, every few seconds, then follow `azprov.onfail`.
pub fn fail_forever(reason: &str, onfail: OnFail) -> ! {
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
                let e = sysinit::power(how);
                log::error!("{how:?}: {e}");
            }
        }
        sysinit::reap();
        let pause = Duration::from_secs(if round < 3 { 3 } else { 30 });
        crate::deadline::Deadline::after(pause).sleep(pause);
        round = round.saturating_add(1);
    }
}
