//! Kernel modules for PID 1: the list `scripts/mkinitramfs` wrote (`path: dep dep | alias
//! alias`, load order), loaded with finit_module on a few threads at once, each module once its
//! dependencies are in. Filesystem modules that a boot may not need, and the dependencies only
//! they need, are deferred until a filesystem of theirs is to be mounted: the root's (xfs,
//! btrfs, ext4 when modular; under QEMU TCG xfs, btrfs and raid6_pq's self-benchmark cost 1.2 s
//! of a 2.1 s module stage, and a root needs at most one of them) and iso9660 (isofs), which
//! only a provisioning CD without UDF needs (Azure's is UDF; [`OnDemand`]). A `.ko.lz4` in the
//! list (how mkinitramfs stores those) is decompressed ([`super::lz4`]) and loaded with
//! init_module. Which listed drivers load at all is [`super::modalias`]'s call.
//!
//! Device names stay as a serial load gives them: the drivers whose devices share a kernel
//! name space (`eth%d`; SCSI hosts and so `sd%c` and `sr%d`; `vd%c`; `nvme%d`) load in list
//! order among themselves ([`Lane`]); the others (buses such as virtio_pci and hv_vmbus,
//! filesystems, libraries, a lane's own libraries such as scsi_mod and libata too) and the
//! other lanes overlap them. SCSI hosts scan
//! synchronously while PID 1 runs ([`SCSI_SCAN`]), so a host's drives exist once its driver
//! has bound to it, even when that happens outside any module load (Hyper-V's VMBus offers).

use nix::errno::Errno;
use nix::kmod::{finit_module, init_module, ModuleInitFlags};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

/// The most a compressed module may decompress to (xfs, the largest, is 4.2 MB).
const MODULE_MAX: usize = 64 << 20;

/// finit_module(2) with `params` (`name=value …`, as modprobe passes them); a `.lz4` module
/// (an LZ4 legacy frame, see `lz4`) is decompressed here and loaded with init_module(2): the
/// kernel checks its signature the same way. EEXIST (already loaded) is success.
pub fn load_module(path: &Path, params: &str) -> Result<(), Errno> {
    let params = CString::new(params).map_err(|_| Errno::EINVAL)?;
    let r = if path.extension().is_some_and(|e| e == "lz4") {
        let data = std::fs::read(path).map_err(|e| super::errno_of(&e))?;
        let image = super::lz4::decompress(&data, MODULE_MAX).map_err(|e| {
            log::warn!("module {}: {e}", path.display());
            Errno::ENOEXEC
        })?;
        init_module(&image, &params)
    } else {
        let f = std::fs::File::open(path).map_err(|e| super::errno_of(&e))?;
        finit_module(&f, &params, ModuleInitFlags::empty())
    };
    match r {
        Err(Errno::EEXIST) => Ok(()),
        r => r,
    }
}

/// How many finit_module calls run at once: one more than the CPUs, 2 to 4. A probe mostly
/// waits on the (virtual) hardware, so even one CPU gains from a second: under QEMU TCG with
/// one CPU the gen1 module stage took 833 ms serially, 584–608 ms with 2 threads, 643–671 ms
/// with 4 and 666–670 ms with 8 (the probes then compete for the one CPU).
fn threads() -> usize {
    let cpus = crate::sys::cpus();
    (cpus + 1).clamp(2, 4)
}

/// Filesystems that can hold the root; their modules wait for `load_for_fs`.
const ROOT_FS: [&str; 3] = ["ext4", "xfs", "btrfs"];
/// Filesystem modules that wait for `load_for_fs` too: iso9660, for a provisioning CD without
/// UDF (Azure Stack's); Azure's CD is UDF, so udf loads with the drivers.
const ON_DEMAND_FS: [&str; 1] = ["isofs"];

/// The module that brings filesystem type `fstype`.
fn fs_module(fstype: &str) -> &str {
    match fstype {
        "iso9660" => "isofs",
        t => t,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub path: PathBuf,
    pub name: String,
    pub deps: Vec<String>,
    /// The module's device aliases (`pci:v00008086d00007111sv*…`, `virtio:d00000001v*`,
    /// `vmbus:…`), as modules.alias has them: what [`super::modalias::gate`] matches.
    pub aliases: Vec<String>,
}

/// `name` as the kernel spells it: dashes become underscores.
pub fn norm(n: &str) -> String {
    n.replace('-', "_")
}

/// Parses /etc/azprov/modules: `PATH[: DEP DEP…][ | ALIAS ALIAS…]` per line, `#` comments.
pub fn parse_list(text: &str) -> Vec<Module> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (l, aliases) = l.split_once(" | ").unwrap_or((l, ""));
            let (path, deps) = l.split_once(':').unwrap_or((l, ""));
            let path = PathBuf::from(path.trim());
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name = norm(name.split('.').next().unwrap_or_default());
            Module {
                path,
                name,
                deps: deps.split_whitespace().map(norm).collect(),
                aliases: aliases.split_whitespace().map(str::to_string).collect(),
            }
        })
        .collect()
}

/// Splits the list into what loads now and what waits until a filesystem of its type is to be
/// mounted: the root filesystem modules and isofs, and their dependencies that nothing loaded
/// now needs.
pub fn split_deferred(list: Vec<Module>) -> (Vec<Module>, Vec<Module>) {
    let mut deferred: Vec<String> = list
        .iter()
        .filter(|m| ROOT_FS.contains(&m.name.as_str()) || ON_DEMAND_FS.contains(&m.name.as_str()))
        .map(|m| m.name.clone())
        .collect();
    let needed_now: Vec<&String> = list
        .iter()
        .filter(|m| !deferred.contains(&m.name))
        .flat_map(|m| m.deps.iter())
        .collect();
    let extra: Vec<String> = list
        .iter()
        .filter(|m| deferred.contains(&m.name))
        .flat_map(|m| m.deps.iter())
        .filter(|d| !needed_now.contains(d))
        .cloned()
        .collect();
    deferred.extend(extra);
    list.into_iter().partition(|m| !deferred.contains(&m.name))
}

/// The drivers that load in list order among themselves, because their devices share a kernel
/// name space: network drivers (`eth%d`); SCSI and ATA hosts (host numbers, then `sd%c` and
/// `sr%d` in scan order); `vd%c`; `nvme%d`. By where the module sits in the kernel's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Net,
    Scsi,
    Block,
    Nvme,
}

/// The lane of a module at `path` (`…/kernel/drivers/net/…` and so on); None: free to overlap.
pub fn lane(path: &Path) -> Option<Lane> {
    let path = path.to_str()?;
    let (_, rest) = path.split_once("/drivers/")?;
    match rest.split('/').next()? {
        "net" => Some(Lane::Net),
        "scsi" | "ata" => Some(Lane::Scsi),
        "block" => Some(Lane::Block),
        "nvme" => Some(Lane::Nvme),
        _ => None,
    }
}

/// A module parameter from a kernel command line word, as modprobe takes them:
/// `MODULE.PARAM[=VALUE]` (dashes in MODULE read as underscores) is `PARAM=VALUE` for MODULE.
pub fn cmdline_param(word: &str) -> Option<(String, String)> {
    let (key, value) = match word.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (word, None),
    };
    let (module, param) = key.split_once('.')?;
    if module.is_empty() || param.is_empty() || module.contains('/') {
        return None;
    }
    let param = match value {
        Some(v) if v.contains(char::is_whitespace) => format!("{param}=\"{v}\""),
        Some(v) => format!("{param}={v}"),
        None => param.to_string(),
    };
    Some((norm(module), param))
}

/// Where one module of a parallel load stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Waiting,
    Running,
    Loaded,
    /// Not loaded: why, in the kernel's words or the dependency that failed.
    Failed(String),
}

/// Loads modules and remembers what failed, so dependants are skipped, not tried.
#[derive(Debug, Default)]
pub struct Loader {
    pub deferred: Vec<Module>,
    /// `PARAM=VALUE` words per module name, from the kernel command line.
    params: Vec<(String, String)>,
    failed: Vec<String>,
    pub loaded: usize,
    pub skipped: Vec<String>,
    /// scsi_mod's `scan` before `load` made it "sync"; [`Loader::restore_scsi_scan`] puts it back.
    scsi_scan_was: Option<String>,
}

impl Loader {
    /// A loader holding `deferred` back for `load_for_fs`, passing `params` (module name,
    /// `PARAM=VALUE`; see [`cmdline_param`]) to the modules they name.
    pub fn new(deferred: Vec<Module>, params: Vec<(String, String)>) -> Self {
        Loader {
            deferred,
            params,
            ..Loader::default()
        }
    }

    /// Records modules left out of the list (no device needs them: `modalias::gate`) as
    /// skipped, so a listed module that depends on one is skipped too, never tried.
    pub fn leave_out(&mut self, unneeded: Vec<(String, &'static str)>) {
        for (name, why) in unneeded {
            self.skipped.push(format!("{name} ({why})"));
            self.failed.push(name);
        }
    }

    /// Puts back the SCSI scan mode `load` replaced, so the real system scans as it was built
    /// to. Called before handover.
    pub fn restore_scsi_scan(&mut self) {
        if let Some(was) = self.scsi_scan_was.take() {
            let param = Path::new("/sys").join(SCSI_SCAN);
            if let Err(e) = std::fs::write(&param, &was) {
                log::warn!("{}: cannot restore {was}: {e}", param.display());
            }
        }
    }

    /// The parameters for module `name`, space-separated.
    fn params_for(&self, name: &str) -> String {
        let words: Vec<&str> = self
            .params
            .iter()
            .filter(|(m, _)| m == name)
            .map(|(_, p)| p.as_str())
            .collect();
        words.join(" ")
    }

    /// Loads `list` with finit_module, up to [`threads`] at once. Absent hardware (ENODEV, as
    /// hv_vmbus on arm64 QEMU) or a failed dependency is logged and skipped, never fatal.
    pub fn load(&mut self, list: &[Module]) {
        // Synchronous SCSI scans while PID 1 runs (see SCSI_SCAN); `scsi_mod.scan=` on the
        // command line wins.
        let param = &Path::new("/sys").join(SCSI_SCAN);
        let ours = !self
            .params
            .iter()
            .any(|(m, p)| m == "scsi_mod" && p.starts_with("scan="));
        let mut was = Mutex::new(None);
        if ours && self.scsi_scan_was.is_none() {
            *was.get_mut().unwrap_or_else(PoisonError::into_inner) = scan_sync(param);
        }
        self.load_with(list, threads(), |m, params| {
            let r = load_module(&m.path, params);
            if ours && m.name == "scsi_mod" && r.is_ok() {
                let mut was = was.lock().unwrap_or_else(PoisonError::into_inner);
                if was.is_none() {
                    *was = scan_sync(param);
                }
            }
            r
        });
        let was = was.into_inner().unwrap_or_else(PoisonError::into_inner);
        self.scsi_scan_was = self.scsi_scan_was.take().or(was);
    }

    /// `load` with the loading function given, so the scheduling can be tested: a module
    /// starts once each dependency in `list` has loaded and the module before it in its lane
    /// is done; it is skipped when a dependency failed, here or in an earlier call.
    fn load_with<F>(&mut self, list: &[Module], threads: usize, load: F)
    where
        F: Fn(&Module, &str) -> Result<(), Errno> + Sync,
    {
        // a few dozen modules: a linear search is all the lookup needs
        let at = |name: &str| list.iter().position(|m| m.name == name);
        // a module another one needs (scsi_mod, libata, scsi_transport_fc, net_failover) is a
        // library: it makes no device names, so it holds no lane
        let needed = |m: &Module| list.iter().any(|o| o.deps.contains(&m.name));
        let lanes: Vec<Option<Lane>> = list
            .iter()
            .map(|m| lane(&m.path).filter(|_| !needed(m)))
            .collect();
        // what each module waits for: its dependencies in the list, then its lane's previous
        let waits: Vec<Vec<usize>> = list
            .iter()
            .zip(&lanes)
            .enumerate()
            .map(|(i, (m, l))| {
                let mut w: Vec<usize> = m
                    .deps
                    .iter()
                    .filter_map(|d| at(d))
                    .filter(|&j| j < i)
                    .collect();
                let before = lanes.get(..i).unwrap_or_default();
                if let Some(j) = l.and_then(|l| before.iter().rposition(|b| *b == Some(l))) {
                    w.push(j);
                }
                w
            })
            .collect();
        // one job per module: the module, what it waits for, its parameters
        let jobs: Vec<(&Module, Vec<usize>, String)> = list
            .iter()
            .zip(waits)
            .map(|(m, w)| (m, w, self.params_for(&m.name)))
            .collect();
        let failed_before = &self.failed;
        let steps = Mutex::new(vec![Step::Waiting; list.len()]);
        let changed = Condvar::new();
        let set = |st: &mut Vec<Step>, i: usize, step: Step| {
            if let Some(s) = st.get_mut(i) {
                *s = step;
            }
        };
        let worker = || {
            let mut st = steps.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                let done = |s: &Step| matches!(s, Step::Loaded | Step::Failed(_));
                let is_done = |st: &[Step], j: usize| st.get(j).is_some_and(done);
                let next = jobs.iter().enumerate().find(|(i, (_, waits, _))| {
                    st.get(*i) == Some(&Step::Waiting) && waits.iter().all(|&j| is_done(&st, j))
                });
                let Some((i, &(m, _, ref params))) = next else {
                    if st.iter().all(done) {
                        return;
                    }
                    st = changed.wait(st).unwrap_or_else(PoisonError::into_inner);
                    continue;
                };
                let missing = m.deps.iter().find(|d| {
                    failed_before.contains(d)
                        || at(d).is_some_and(|j| st.get(j) != Some(&Step::Loaded))
                });
                if let Some(d) = missing {
                    set(&mut st, i, Step::Failed(format!("needs {d}")));
                    changed.notify_all();
                    continue;
                }
                set(&mut st, i, Step::Running);
                drop(st);
                let t = Instant::now();
                let result = load(m, params);
                st = steps.lock().unwrap_or_else(PoisonError::into_inner);
                let step = match result {
                    Ok(()) => {
                        log::debug!("module {}: {} ms", m.name, t.elapsed().as_millis());
                        Step::Loaded
                    }
                    Err(e) => {
                        log::debug!("module {}: {e}", m.name);
                        // the kernel's words for the common cases; the errno name otherwise
                        Step::Failed(
                            match e {
                                Errno::ENODEV => "no device",
                                Errno::ENOENT => "missing symbol or dependency",
                                Errno::ENOEXEC => "bad format",
                                e => e.desc(),
                            }
                            .to_string(),
                        )
                    }
                };
                set(&mut st, i, step);
                changed.notify_all();
            }
        };
        std::thread::scope(|s| {
            for _ in 1..threads.clamp(1, list.len().max(1)) {
                s.spawn(worker);
            }
            worker();
        });
        let steps = steps.into_inner().unwrap_or_else(PoisonError::into_inner);
        for (m, step) in list.iter().zip(steps) {
            match step {
                Step::Loaded => self.loaded += 1,
                Step::Failed(why) => {
                    self.skipped.push(format!("{} ({why})", m.name));
                    self.failed.push(m.name.clone());
                }
                // not reached: the workers return once every module is done
                Step::Waiting | Step::Running => {
                    self.skipped.push(format!("{} (not tried)", m.name))
                }
            }
        }
    }

    /// Loads the deferred module for filesystem type `fstype` and what it needs; with no type
    /// (a root whose type is not known), every root filesystem module. `what` names the
    /// filesystem in the log line.
    pub fn load_for_fs(&mut self, fstype: Option<&str>, what: &str) {
        let wanted = self.take_deferred(fstype);
        if !wanted.is_empty() {
            let t = Instant::now();
            self.load(&wanted);
            let names: Vec<&str> = wanted.iter().map(|m| m.name.as_str()).collect();
            log::info!(
                "modules: {} ms: {} for {what}",
                t.elapsed().as_millis(),
                names.join(" ")
            );
        }
    }

    /// Takes the deferred modules `load_for_fs(fstype)` loads out of `deferred`.
    fn take_deferred(&mut self, fstype: Option<&str>) -> Vec<Module> {
        let names: Vec<String> = self
            .deferred
            .iter()
            .filter(|m| match fstype {
                Some(t) => m.name == fs_module(t),
                None => ROOT_FS.contains(&m.name.as_str()),
            })
            .flat_map(|m| m.deps.iter().chain([&m.name]).cloned())
            .collect();
        let (take, keep) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|m| names.contains(&m.name));
        self.deferred = keep;
        take
    }
}

/// PID 1's module loader, shared with the stages after the root, which may start while it
/// still loads the first round: `wait` joins it (the NIC's driver before the network), and
/// `ensure_fs` makes a filesystem type mountable, loading its deferred module on demand (the
/// media stage's iso9660). Hook mode has none (the default): udev loads the drivers there, and
/// the kernel's request_module what a mount needs.
#[derive(Clone, Default)]
pub struct OnDemand(Option<Arc<Mutex<Round>>>);

enum Round {
    Loading(std::thread::JoinHandle<Loader>),
    Done(Loader),
}

impl OnDemand {
    /// The first round still loading on `thread`.
    pub fn loading(thread: std::thread::JoinHandle<Loader>) -> Self {
        OnDemand(Some(Arc::new(Mutex::new(Round::Loading(thread)))))
    }

    /// Runs `f` on the loader once the first round is in (joining its thread).
    fn with_loader<R>(&self, f: impl FnOnce(&mut Loader) -> R) -> Option<R> {
        let mut round = self
            .0
            .as_ref()?
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Round::Loading(_) = &*round {
            if let Round::Loading(thread) =
                std::mem::replace(&mut *round, Round::Done(Loader::default()))
            {
                let loader = thread.join().unwrap_or_else(|_| {
                    log::error!("module loading panicked; going on with what loaded");
                    Loader::default()
                });
                *round = Round::Done(loader);
            }
        }
        match &mut *round {
            Round::Done(l) => Some(f(l)),
            Round::Loading(_) => None,
        }
    }

    /// Loads the deferred module for the root's filesystem type (all of them when it is not
    /// known), once the first round is in.
    pub fn load_root_fs(&self, fstype: Option<&str>) {
        self.with_loader(|l| l.load_for_fs(fstype, "the root filesystem"));
    }

    /// Waits until every module of the first round is in (or failed).
    pub fn wait(&self) {
        self.with_loader(|_| ());
    }

    /// Makes filesystem type `fstype` mountable: at once when the kernel has it already
    /// (/proc/filesystems), else once the first round is in and its deferred module, if there
    /// is one, loaded.
    pub fn ensure_fs(&self, fstype: &str) {
        if self.0.is_none() || has_filesystem(Path::new("/proc/filesystems"), fstype) {
            return;
        }
        self.with_loader(|l| l.load_for_fs(Some(fstype), fstype));
    }

    /// [`Loader::restore_scsi_scan`], once the first round is in.
    pub fn restore_scsi_scan(&self) {
        self.with_loader(Loader::restore_scsi_scan);
    }
}

/// Whether the kernel lists filesystem type `fstype` in `filesystems` (/proc/filesystems:
/// `[nodev]\tNAME` lines).
fn has_filesystem(filesystems: &Path, fstype: &str) -> bool {
    std::fs::read_to_string(filesystems).is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().last() == Some(fstype))
    })
}

impl std::fmt::Debug for OnDemand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "OnDemand(loader)"
        } else {
            "OnDemand(none)"
        })
    }
}

/// scsi_mod's `scan` parameter, below /sys. With "async" (Debian's default) a host's scan runs as async
/// work: a module load waits for it (finit_module returns after `async_synchronize_full`), but
/// a host whose driver binds outside any module load (a Hyper-V VMBus controller offered after
/// hv_storvsc loaded) scans on its own time, and nothing in sysfs says when it is done. With
/// "sync" the scan is part of the probe, so the drives exist once the `driver` link does
/// (measured under QEMU with `scsi_mod.scan=async`: sr0 attached before virtio_scsi's load
/// returned).
pub const SCSI_SCAN: &str = "module/scsi_mod/parameters/scan";

/// Sets scsi_mod's `scan` parameter (at `param`) to "sync" and returns the value it had; None
/// when it was "sync" already or cannot be read or written.
fn scan_sync(param: &Path) -> Option<String> {
    let was = std::fs::read_to_string(param).ok()?.trim().to_string();
    if was == "sync" {
        return None;
    }
    match std::fs::write(param, "sync") {
        Ok(()) => {
            log::debug!("scsi_mod scan: {was} -> sync until handover");
            Some(was)
        }
        Err(e) => {
            log::warn!("{}: cannot set sync: {e}", param.display());
            None
        }
    }
}

/// Finds `NAME.ko` below `dir` (for `azprov.modules=`).
pub fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    let want = norm(name);
    for e in std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            if let Some(found) = find(&p, name) {
                return Some(found);
            }
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".ko"))
            .is_some_and(|s| norm(s) == want)
        {
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = "\
# written by mkinitramfs
/lib/modules/k/kernel/drivers/scsi/scsi_common.ko:
/lib/modules/k/kernel/drivers/scsi/scsi_mod.ko: scsi_common
/lib/modules/k/kernel/lib/libcrc32c.ko:
/lib/modules/k/kernel/fs/xfs/xfs.ko: libcrc32c
/lib/modules/k/kernel/crypto/xor.ko:
/lib/modules/k/kernel/lib/raid6/raid6_pq.ko:
/lib/modules/k/kernel/lib/zstd/zstd_compress.ko:
/lib/modules/k/kernel/fs/btrfs/btrfs.ko: xor raid6_pq zstd_compress libcrc32c
/lib/modules/k/kernel/lib/crc-itu-t.ko:
/lib/modules/k/kernel/fs/udf/udf.ko: crc-itu-t
/lib/modules/k/kernel/drivers/md/raid456.ko: raid6_pq xor
/lib/modules/k/kernel/drivers/ata/ata_piix.ko: scsi_mod | pci:v00008086d00007111sv*sd*bc*sc*i* pci:v00008086d00007010sv*sd*bc*sc*i*
";

    fn names(v: &[Module]) -> Vec<&str> {
        v.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn parses_paths_names_and_deps() {
        let l = parse_list(LIST);
        assert_eq!(l.len(), 12);
        assert_eq!(l[11].name, "ata_piix");
        assert_eq!(l[11].deps, ["scsi_mod"]);
        assert_eq!(l[11].aliases.len(), 2);
        assert!(l[1].aliases.is_empty());
        assert_eq!(l[1].name, "scsi_mod");
        assert_eq!(l[1].deps, ["scsi_common"]);
        assert_eq!(l[8].name, "crc_itu_t");
        assert_eq!(l[9].deps, ["crc_itu_t"]);
    }

    #[test]
    fn root_filesystems_and_their_own_deps_wait() {
        let (now, later) = split_deferred(parse_list(LIST));
        // raid6_pq and xor are also needed by raid456, which loads now
        assert_eq!(
            names(&now),
            [
                "scsi_common",
                "scsi_mod",
                "xor",
                "raid6_pq",
                "crc_itu_t",
                "udf",
                "raid456",
                "ata_piix"
            ]
        );
        assert_eq!(
            names(&later),
            ["libcrc32c", "xfs", "zstd_compress", "btrfs"]
        );
    }

    #[test]
    fn iso9660_waits_until_a_cd_needs_it_and_an_unknown_root_type_leaves_it() {
        let list = "\
/k/drivers/cdrom/cdrom.ko:
/k/drivers/scsi/sr_mod.ko: cdrom
/k/fs/isofs/isofs.ko: cdrom
/k/lib/libcrc32c.ko:
/k/fs/xfs/xfs.ko: libcrc32c
";
        let (now, later) = split_deferred(parse_list(list));
        // cdrom is sr_mod's too: it loads now
        assert_eq!(names(&now), ["cdrom", "sr_mod"]);
        assert_eq!(names(&later), ["isofs", "libcrc32c", "xfs"]);
        let mut loader = Loader::new(later, Vec::new());
        // a root whose type is unknown takes every root filesystem, not the CD's
        assert_eq!(names(&loader.take_deferred(None)), ["libcrc32c", "xfs"]);
        assert_eq!(
            names(&loader.take_deferred(Some("udf"))),
            Vec::<&str>::new()
        );
        assert_eq!(names(&loader.take_deferred(Some("iso9660"))), ["isofs"]);
        assert!(loader.deferred.is_empty());
    }

    #[test]
    fn a_filesystem_type_is_there_when_the_kernel_lists_it() {
        let f = std::env::temp_dir().join(format!("azprov-filesystems-{}", std::process::id()));
        std::fs::write(&f, "nodev\tsysfs\nnodev\ttmpfs\n\text4\n\tudf\n").unwrap();
        assert!(has_filesystem(&f, "udf"));
        assert!(has_filesystem(&f, "tmpfs"));
        assert!(!has_filesystem(&f, "iso9660"));
        assert!(!has_filesystem(&f, "ext"));
        std::fs::remove_file(&f).unwrap();
        assert!(!has_filesystem(&f, "udf"));
    }

    #[test]
    fn a_loader_still_loading_is_joined_once_and_then_kept() {
        let list = "/k/fs/isofs/isofs.ko:\n";
        let (_, later) = split_deferred(parse_list(list));
        let thread = std::thread::spawn(move || Loader::new(later, Vec::new()));
        let shared = OnDemand::loading(thread);
        let other = shared.clone();
        other.wait();
        let names = shared.with_loader(|l| {
            l.deferred
                .iter()
                .map(|m| m.name.clone())
                .collect::<Vec<_>>()
        });
        assert_eq!(names, Some(vec!["isofs".to_string()]));
        assert!(OnDemand::default().with_loader(|_| ()).is_none());
    }

    #[test]
    fn nothing_deferred_without_root_filesystems() {
        let (now, later) = split_deferred(parse_list("/a/x.ko:\n/a/y.ko: x\n"));
        assert_eq!(names(&now), ["x", "y"]);
        assert!(later.is_empty());
    }

    /// Runs `load_with` on `list`, recording when each module starts and ends; `fail` names the
    /// modules whose load fails with ENODEV.
    fn run(loader: &mut Loader, list: &str, fail: &[&str]) -> Vec<(String, bool)> {
        let events = Mutex::new(Vec::new());
        loader.load_with(&parse_list(list), 4, |m, _| {
            events.lock().unwrap().push((m.name.clone(), true));
            std::thread::sleep(std::time::Duration::from_millis(2));
            events.lock().unwrap().push((m.name.clone(), false));
            if fail.contains(&m.name.as_str()) {
                Err(Errno::ENODEV)
            } else {
                Ok(())
            }
        });
        events.into_inner().unwrap()
    }

    fn ended_before(events: &[(String, bool)], first: &str, then: &str) -> bool {
        let at = |n: &str, start: bool| events.iter().position(|e| e.0 == n && e.1 == start);
        matches!((at(first, false), at(then, true)), (Some(a), Some(b)) if a < b)
    }

    const PARALLEL: &str = "\
/l/kernel/drivers/scsi/scsi_common.ko:
/l/kernel/drivers/scsi/scsi_mod.ko: scsi_common
/l/kernel/drivers/ata/libata.ko: scsi_mod
/l/kernel/drivers/ata/ata_piix.ko: libata scsi_mod
/l/kernel/drivers/scsi/sr_mod.ko: scsi_mod
/l/kernel/drivers/virtio/virtio.ko:
/l/kernel/drivers/virtio/virtio_pci.ko: virtio
/l/kernel/drivers/block/virtio_blk.ko: virtio
/l/kernel/drivers/net/hv_netvsc.ko: hv_vmbus
/l/kernel/drivers/net/virtio_net.ko: virtio
/l/kernel/fs/udf/udf.ko:
";

    #[test]
    fn a_module_starts_after_its_dependencies_and_its_lane() {
        let mut l = Loader::default();
        let ev = run(&mut l, PARALLEL, &[]);
        assert_eq!(l.loaded, 11);
        assert!(l.skipped.is_empty());
        for (dep, m) in [
            ("scsi_common", "scsi_mod"),
            ("scsi_mod", "libata"),
            ("libata", "ata_piix"),
            ("virtio", "virtio_pci"),
            ("virtio", "virtio_net"),
            // the lanes: SCSI hosts and the names they give, network drivers
            ("ata_piix", "sr_mod"),
            ("hv_netvsc", "virtio_net"),
        ] {
            assert!(
                ended_before(&ev, dep, m),
                "{m} started before {dep} ended: {ev:?}"
            );
        }
    }

    #[test]
    fn a_failed_dependency_skips_its_dependants_only() {
        let list = "/l/a.ko:\n/l/b.ko: a\n/l/c.ko: b\n/l/d.ko:\n";
        let mut l = Loader::default();
        let ev = run(&mut l, list, &["a"]);
        assert_eq!(l.loaded, 1);
        assert_eq!(l.skipped, ["a (no device)", "b (needs a)", "c (needs b)"]);
        // b and c were never tried
        assert!(!ev.iter().any(|e| e.0 == "b" || e.0 == "c"));
        // a later round (the root filesystem's modules) knows what failed before
        let ev = run(&mut l, "/l/e.ko: c\n/l/f.ko:\n", &[]);
        assert_eq!(l.skipped.last().unwrap(), "e (needs c)");
        assert_eq!(l.loaded, 2);
        assert!(!ev.iter().any(|e| e.0 == "e"));
    }

    /// A flag one module's load opens and another's waits for (at most 10 s), to see two loads
    /// overlap.
    #[derive(Default)]
    struct Gate(Mutex<bool>, Condvar);

    impl Gate {
        fn open(&self) {
            *self.0.lock().unwrap() = true;
            self.1.notify_all();
        }

        /// Whether the gate opened within 10 s.
        fn wait(&self) -> bool {
            let g = self.0.lock().unwrap();
            let (g, _) = self
                .1
                .wait_timeout_while(g, std::time::Duration::from_secs(10), |open| !*open)
                .unwrap();
            *g
        }
    }

    #[test]
    fn independent_modules_load_at_the_same_time() {
        // x blocks until y has started: a serial load would wait out the 10 s and see false
        let y_started = Gate::default();
        let saw_y = Mutex::new(false);
        let mut l = Loader::default();
        l.load_with(&parse_list("/l/x.ko:\n/l/y.ko:\n"), 4, |m, _| {
            if m.name == "y" {
                y_started.open();
            } else {
                *saw_y.lock().unwrap() = y_started.wait();
            }
            Ok(())
        });
        assert!(*saw_y.lock().unwrap(), "x and y did not overlap");
        assert_eq!(l.loaded, 2);
    }

    #[test]
    fn a_library_holds_no_lane() {
        // libata (drivers/ata, needed by ata_piix) starts while hv_storvsc, the lane's first
        // host, is still loading; ata_piix, a host, still waits for hv_storvsc
        let list = "\
/l/kernel/drivers/scsi/hv_storvsc.ko:
/l/kernel/drivers/ata/libata.ko:
/l/kernel/drivers/ata/ata_piix.ko: libata
";
        let libata_started = Gate::default();
        let saw_libata = Mutex::new(false);
        let events = Mutex::new(Vec::new());
        let mut l = Loader::default();
        l.load_with(&parse_list(list), 4, |m, _| {
            events.lock().unwrap().push((m.name.clone(), true));
            if m.name == "libata" {
                libata_started.open();
            } else if m.name == "hv_storvsc" {
                *saw_libata.lock().unwrap() = libata_started.wait();
            }
            events.lock().unwrap().push((m.name.clone(), false));
            Ok(())
        });
        assert!(*saw_libata.lock().unwrap(), "libata waited for the lane");
        let ev = events.into_inner().unwrap();
        assert!(ended_before(&ev, "hv_storvsc", "ata_piix"), "{ev:?}");
        assert_eq!(l.loaded, 3);
    }

    #[test]
    fn lanes_follow_the_kernel_tree() {
        let lane_of = |p: &str| lane(Path::new(p));
        assert_eq!(
            lane_of("/lib/modules/6.1/kernel/drivers/net/hyperv/hv_netvsc.ko"),
            Some(Lane::Net)
        );
        assert_eq!(
            lane_of("/lib/modules/6.1/kernel/drivers/scsi/hv_storvsc.ko"),
            Some(Lane::Scsi)
        );
        assert_eq!(
            lane_of("/lib/modules/6.1/kernel/drivers/ata/ata_piix.ko"),
            Some(Lane::Scsi)
        );
        assert_eq!(
            lane_of("/lib/modules/6.1/kernel/drivers/block/virtio_blk.ko"),
            Some(Lane::Block)
        );
        assert_eq!(
            lane_of("/lib/modules/6.1/kernel/drivers/nvme/host/nvme.ko"),
            Some(Lane::Nvme)
        );
        assert_eq!(
            lane_of("/lib/modules/6.1/kernel/drivers/hv/hv_vmbus.ko"),
            None
        );
        assert_eq!(lane_of("/lib/modules/6.1/kernel/fs/udf/udf.ko"), None);
    }

    #[test]
    fn parameters_reach_the_module_they_name() {
        let mut l = Loader::new(
            Vec::new(),
            vec![
                ("a".into(), "x=1".into()),
                ("b".into(), "y".into()),
                ("a".into(), "z=\"p q\"".into()),
            ],
        );
        let seen = Mutex::new(Vec::new());
        l.load_with(&parse_list("/l/a.ko:\n/l/b.ko:\n/l/c.ko:\n"), 1, |m, p| {
            seen.lock().unwrap().push(format!("{}:{p}", m.name));
            Ok(())
        });
        assert_eq!(*seen.lock().unwrap(), ["a:x=1 z=\"p q\"", "b:y", "c:"]);
    }

    #[test]
    fn scan_sync_remembers_what_it_replaced() {
        let d = std::env::temp_dir().join(format!("azprov-scan-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("scan");
        std::fs::write(&p, "async\n").unwrap();
        assert_eq!(scan_sync(&p).as_deref(), Some("async"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "sync");
        // already sync: nothing to put back
        assert_eq!(scan_sync(&p), None);
        assert_eq!(scan_sync(&d.join("absent")), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
