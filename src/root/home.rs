//! The admin's home: a new one filled from /etc/skel under a temporary name and renamed into
//! place, each file labelled as it will be called; an existing one of another uid taken over.

use super::accounts::Account;
use super::passwd::Table;
use super::{io_err, write_temp, Owners, Sysroot, WriteError};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

impl Sysroot {
    /// A home that exists already and belongs to another uid than the user's or root's (left
    /// in the image by a user that was removed) is taken over, its whole tree given to the user, when
    /// no other account has that uid: sshd's StrictModes would refuse the keys in it
    /// otherwise. One that another account owns is refused, naming it.
    pub(super) fn claim_home(
        &self,
        account: &Account,
        name: &str,
        passwd: &Table,
    ) -> Result<(), WriteError> {
        let home = self.resolve(&account.home)?;
        let Ok(md) = fs::symlink_metadata(&home) else {
            return Ok(());
        };
        // root's ownership is one sshd's StrictModes accepts, as the user's own
        if md.file_type().is_symlink() || md.uid() == account.uid || md.uid() == 0 {
            return Ok(());
        }
        if let Some(owner) = passwd.name_of_uid(md.uid(), name) {
            return Err(WriteError::HomeOwned {
                home: account.home.clone(),
                owner,
                uid: md.uid(),
            });
        }
        log::warn!(
            "{} belonged to uid {}, which no account has: given to {name}",
            account.home,
            md.uid()
        );
        chown_tree(&self.owners, &home, (account.uid, account.gid))
    }

    /// A new home (0750, the user's) filled from /etc/skel under a temporary name beside it,
    /// made durable (each file and then each directory fsynced; in a batch one syncfs) and
    /// renamed into place, the parent fsynced (or with the batch): a run cut short leaves no
    /// half-filled home that the next run would take as done (it only fills a home that does
    /// not exist). A temporary left by such a run is removed first.
    pub(super) fn make_home(&self, account: &Account) -> Result<(), WriteError> {
        let owner = (account.uid, account.gid);
        let name = Path::new(&account.home)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| WriteError::Corrupt(format!("home {}", account.home)))?;
        let parent = Path::new(&account.home)
            .parent()
            .map_or_else(|| "/".to_string(), |p| p.to_string_lossy().into_owned());
        let tmp = format!("{}/.{name}.azprov-tmp", parent.trim_end_matches('/'));
        self.remove(&tmp)?;
        let tmp_path = self.mkdir(&tmp, 0o750, owner)?;
        let home = self.resolve(&account.home)?;
        // labelled as what they become once the directory is renamed
        self.label_as(&tmp_path, &home, libc::S_IFDIR)?;
        let skel = self.resolve("/etc/skel")?;
        // a real directory only: a symlinked skel could point anywhere on the host
        let batched = self.batched();
        if fs::symlink_metadata(&skel).is_ok_and(|m| m.is_dir()) {
            self.copy_tree(&skel, &tmp_path, &home, owner, !batched)?;
        }
        if batched {
            self.syncfs()?;
        }
        fs::rename(&tmp_path, &home).map_err(io_err("rename", &home))?;
        self.sync_dir_unless_batched(&self.resolve(&parent)?)
    }

    /// Copies `from` into `to` (files, directories, symlinks; owned by `owner`, modes kept),
    /// each labelled as it will be called under `final_to` once `to` is renamed there; when
    /// `durable`, each file fsynced before its rename and each directory once it is filled.
    fn copy_tree(
        &self,
        from: &Path,
        to: &Path,
        final_to: &Path,
        owner: (u32, u32),
        durable: bool,
    ) -> Result<(), WriteError> {
        for entry in fs::read_dir(from).map_err(io_err("read", from))? {
            let entry = entry.map_err(io_err("read", from))?;
            let src = entry.path();
            let dst = to.join(entry.file_name());
            let final_dst = final_to.join(entry.file_name());
            let md = fs::symlink_metadata(&src).map_err(io_err("stat", &src))?;
            if md.file_type().is_symlink() {
                let target = fs::read_link(&src).map_err(io_err("readlink", &src))?;
                std::os::unix::fs::symlink(&target, &dst).map_err(io_err("symlink", &dst))?;
                self.label_as(&dst, &final_dst, libc::S_IFLNK)?;
            } else if md.is_dir() {
                fs::create_dir(&dst).map_err(io_err("mkdir", &dst))?;
                fs::set_permissions(&dst, fs::Permissions::from_mode(md.mode() & 0o7777))
                    .map_err(io_err("chmod", &dst))?;
                self.label_as(&dst, &final_dst, libc::S_IFDIR)?;
            } else if md.is_file() {
                let data = fs::read(&src).map_err(io_err("read", &src))?;
                let label = self.label_for(&final_dst, libc::S_IFREG);
                let mode = md.mode() & 0o7777;
                let tmp = write_temp(
                    &dst,
                    &data,
                    mode,
                    (&self.owners, owner),
                    durable,
                    label.as_deref(),
                )?;
                fs::rename(&tmp, &dst).map_err(io_err("rename", &dst))?;
                continue;
            } else {
                continue;
            }
            self.owners.set(&dst, None, owner)?;
            if md.is_dir() {
                self.copy_tree(&src, &dst, &final_dst, owner, durable)?;
            }
        }
        if durable {
            super::sync_dir(to)?;
        }
        Ok(())
    }
}

/// `path` and everything below it (symlinks themselves, never their targets) given to `owner`.
fn chown_tree(owners: &Owners, path: &Path, owner: (u32, u32)) -> Result<(), WriteError> {
    owners.set(path, None, owner)?;
    let md = fs::symlink_metadata(path).map_err(io_err("stat", path))?;
    if md.is_dir() {
        for entry in fs::read_dir(path).map_err(io_err("read", path))? {
            let entry = entry.map_err(io_err("read", path))?;
            chown_tree(owners, &entry.path(), owner)?;
        }
    }
    Ok(())
}
