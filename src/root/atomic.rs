//! Atomic writes into the root: a temporary beside the file it replaces, mode, owner and label
//! set, made durable, renamed into place, the directory synced; in a batch every temporary,
//! one syncfs, the renames, one syncfs ([`Sysroot::batch`]).

use super::{io_err, label, Owners, Sysroot, WriteError};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::PoisonError;

impl Sysroot {
    /// Until the returned batch is dropped, an atomic write leaves its temporary beside the file
    /// it replaces, unsynced; the next [`Sysroot::barrier`] or [`Batch::sync`] makes all of them
    /// durable with one syncfs, renames them into place and syncs again. Every file is still
    /// the old or the new one after a crash, and all are on disk once `sync` returns. Where an
    /// order on disk matters inside the batch, `barrier` in between. Reading a file back before
    /// the barrier gives its old contents.
    pub fn batch(&self) -> Batch<'_> {
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
        Batch(self)
    }

    pub(super) fn batched(&self) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// fsync of `dir` now, unless a batch's syncfs will do it.
    pub(super) fn sync_dir_unless_batched(&self, dir: &Path) -> Result<(), WriteError> {
        if self.batched() {
            return Ok(());
        }
        #[cfg(test)]
        self.dir_syncs
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        sync_dir(dir)
    }

    /// Whatever was written so far is on disk, in place, before anything written after:
    /// nothing to do outside a batch (each write is), inside one a syncfs, the renames waiting
    /// so far, and a syncfs.
    pub(super) fn barrier(&self) -> Result<(), WriteError> {
        let waiting = match self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            Some(list) => std::mem::take(list),
            None => return Ok(()),
        };
        self.syncfs()?;
        let mut renamed = waiting.into_iter();
        for (tmp, target) in renamed.by_ref() {
            let done = match &tmp {
                Some(tmp) => fs::rename(tmp, &target).map_err(io_err("rename", &target)),
                None => match fs::remove_file(&target) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        Err(io_err("unlink", &target)(e))
                    }
                    _ => Ok(()),
                },
            };
            if let Err(e) = done {
                for tmp in tmp.into_iter().chain(renamed.filter_map(|(t, _)| t)) {
                    let _ = fs::remove_file(&tmp);
                }
                return Err(e);
            }
        }
        self.syncfs()
    }

    /// Drops the batch's temporaries for `targets` (host paths) before any barrier renames
    /// them: files that must go into place together or not at all.
    pub(super) fn discard(&self, targets: &[PathBuf]) {
        if let Some(list) = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            list.retain(|(tmp, target)| {
                let drop = targets.contains(target);
                if let (true, Some(tmp)) = (drop, tmp) {
                    let _ = fs::remove_file(tmp);
                }
                !drop
            });
        }
    }

    /// syncfs(2) of the root's filesystem.
    pub(super) fn syncfs(&self) -> Result<(), WriteError> {
        #[cfg(test)]
        self.syncfs_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        crate::sys::mount::syncfs(&self.root)
            .map_err(|e| io_err("syncfs", &self.root)(io::Error::from_raw_os_error(e as i32)))
    }

    /// Writes `data` to `path` atomically with this mode and owner.
    pub fn write(
        &self,
        path: &str,
        data: &[u8],
        mode: u32,
        owner: (u32, u32),
    ) -> Result<(), WriteError> {
        #[cfg(test)]
        self.injected_fault(path)?;
        let p = self.resolve(path)?;
        self.replace(&p, data, mode, owner)
    }

    /// [`write_atomic`] and the directory's fsync; inside a batch the temporary only, renamed
    /// by the batch ([`Sysroot::batch`]).
    pub(super) fn replace(
        &self,
        p: &Path,
        data: &[u8],
        mode: u32,
        owner: (u32, u32),
    ) -> Result<(), WriteError> {
        let label = self.label_for(p, libc::S_IFREG);
        if !self.batched() {
            let tmp = write_temp(p, data, mode, (&self.owners, owner), true, label.as_deref())?;
            fs::rename(&tmp, p).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io_err("rename", p)(e)
            })?;
            return self.sync_dir_unless_batched(parent(p)?);
        }
        let tmp = write_temp(
            p,
            data,
            mode,
            (&self.owners, owner),
            false,
            label.as_deref(),
        )?;
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match pending.as_mut() {
            Some(list) => match list.iter_mut().find(|(_, t)| t == p) {
                // written twice in one batch: the one temporary holds the last contents
                Some((queued, _)) => *queued = Some(tmp),
                None => list.push((Some(tmp), p.to_path_buf())),
            },
            // the batch ended while this was written: in place at once, as outside one
            None => {
                drop(pending);
                File::open(&tmp)
                    .and_then(|f| f.sync_all())
                    .map_err(io_err("fsync", &tmp))?;
                fs::rename(&tmp, p).map_err(io_err("rename", p))?;
                return sync_dir(parent(p)?);
            }
        }
        Ok(())
    }

    /// Removes `path` (gone already is fine): at once and with its directory synced outside a
    /// batch, at the batch's next barrier inside one, after the renames queued before it.
    pub fn remove_file(&self, path: &str) -> Result<(), WriteError> {
        #[cfg(test)]
        self.injected_fault(path)?;
        let p = self.resolve(path)?;
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(list) = pending.as_mut() {
                match list.iter_mut().find(|(_, t)| *t == p) {
                    Some((queued, _)) => {
                        if let Some(tmp) = queued.take() {
                            let _ = fs::remove_file(tmp);
                        }
                    }
                    None => list.push((None, p)),
                }
                return Ok(());
            }
        }
        match fs::remove_file(&p) {
            Ok(()) => self.sync_dir_unless_batched(parent(&p)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("unlink", &p)(e)),
        }
    }

    /// Rewrites an existing file keeping its mode and owner (passwd, shadow, hosts…). A
    /// symlinked file (`/etc/passwd -> /usr/share/…`) is rewritten where it points inside the
    /// root, as a tool in a chroot would; the mode and owner come from that file, never from
    /// one outside the root.
    pub(super) fn rewrite(
        &self,
        path: &str,
        data: &[u8],
        default_mode: u32,
    ) -> Result<(), WriteError> {
        #[cfg(test)]
        self.injected_fault(path)?;
        let p = self.resolve_full(path)?;
        let (mode, owner) = match fs::symlink_metadata(&p) {
            Ok(md) => (md.mode() & 0o7777, (md.uid(), md.gid())),
            Err(_) => (default_mode, (0, 0)),
        };
        self.replace(&p, data, mode, owner)
    }
}

/// Atomic writes made durable and put in place together ([`Sysroot::batch`]).
pub struct Batch<'a>(&'a Sysroot);

impl Batch<'_> {
    /// [`Sysroot::barrier`]: every file written in the batch is in place and on disk when it
    /// returns Ok.
    pub fn sync(&self) -> Result<(), WriteError> {
        self.0.barrier()
    }
}

impl Drop for Batch<'_> {
    /// Ends the batch; temporaries no `sync` renamed (it failed, or never ran) are removed.
    fn drop(&mut self) {
        let left = self
            .0
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        for (tmp, _) in left.unwrap_or_default() {
            if let Some(tmp) = tmp {
                let _ = fs::remove_file(tmp);
            }
        }
    }
}

/// fsync of a directory, so a rename or a new entry in it is on disk.
pub(super) fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

pub(super) fn parent(p: &Path) -> Result<&Path, WriteError> {
    p.parent()
        .ok_or_else(|| WriteError::Corrupt(format!("{} has no parent", p.display())))
}

/// `data` into `.NAME.azprov-tmp` beside `p` (one left by an earlier run is replaced), mode,
/// owner and SELinux `label` set, fsynced when `durable`; its path. Nothing is left behind
/// when it fails.
pub(super) fn write_temp(
    p: &Path,
    data: &[u8],
    mode: u32,
    (owners, owner): (&Owners, (u32, u32)),
    durable: bool,
    label: Option<&[u8]>,
) -> Result<PathBuf, WriteError> {
    let dir = parent(p)?;
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.azprov-tmp"));
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.write_all(data).map_err(io_err("write", &tmp))?;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &tmp))?;
        owners.set(p, Some(&f), owner)?;
        if let Some(label) = label {
            label::set(&tmp, label)?;
        }
        if durable {
            f.sync_all().map_err(io_err("fsync", &tmp))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}
