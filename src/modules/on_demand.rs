//! The loader handed from PID 1's root search to the provisioning run: joined when the network
//! needs its drivers, asked for a filesystem's deferred module when a mount needs it.

use super::Loader;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

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
    pub(super) fn with_loader<R>(&self, f: impl FnOnce(&mut Loader) -> R) -> Option<R> {
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
pub(super) fn has_filesystem(filesystems: &Path, fstype: &str) -> bool {
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
