//! The load itself: finit_module on a few threads, each module once its dependencies are in,
//! the lanes of device names in list order, what failed remembered so its dependants are
//! skipped; scsi_mod scanning synchronously while it runs.

use super::*;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

/// How many finit_module calls run at once: one more than the CPUs, 2 to 4. A probe mostly
/// waits on the (virtual) hardware, so even one CPU gains from a second; more than that only
/// compete for the CPU (docs/performance.md).
fn threads() -> usize {
    let cpus = crate::sys::cpus();
    (cpus + 1).clamp(2, 4)
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
    pub(super) fn params_for(&self, name: &str) -> String {
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
    pub(super) fn load_with<F>(&mut self, list: &[Module], threads: usize, load: F)
    where
        F: Fn(&Module, &str) -> Result<(), Errno> + Sync,
    {
        // a few dozen modules: a linear search is all the lookup needs
        let at = |name: &str| list.iter().position(|m| m.name == name);
        let waits = waits(list);
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
                        Step::Failed(failure_words(e).to_string())
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
        self.tally(
            list,
            steps.into_inner().unwrap_or_else(PoisonError::into_inner),
        );
    }

    /// Each module's last step counted: loaded, or skipped with why (and failed, so what
    /// needs it later is not tried).
    fn tally(&mut self, list: &[Module], steps: Vec<Step>) {
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
    pub(super) fn take_deferred(&mut self, fstype: Option<&str>) -> Vec<Module> {
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
pub(super) fn scan_sync(param: &Path) -> Option<String> {
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

/// What each module of `list` waits for (indices into it): its dependencies in the list, then
/// its lane's previous module. A module another one needs (scsi_mod, libata,
/// scsi_transport_fc, net_failover) is a library: it makes no device names, so it holds no
/// lane.
fn waits(list: &[Module]) -> Vec<Vec<usize>> {
    let at = |name: &str| list.iter().position(|m| m.name == name);
    let needed = |m: &Module| list.iter().any(|o| o.deps.contains(&m.name));
    let lanes: Vec<Option<Lane>> = list
        .iter()
        .map(|m| lane(&m.path).filter(|_| !needed(m)))
        .collect();
    list.iter()
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
        .collect()
}

/// Why a module did not load, in the kernel's words for the common cases; the errno's
/// description otherwise.
fn failure_words(e: Errno) -> &'static str {
    match e {
        Errno::ENODEV => "no device",
        Errno::ENOENT => "missing symbol or dependency",
        Errno::ENOEXEC => "bad format",
        e => e.desc(),
    }
}
