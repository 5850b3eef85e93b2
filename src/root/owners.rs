//! Who owns what azprov writes: applied (the real run, as root), or recorded and left as the
//! process made it, so that a whole `provision` runs unprivileged in tests. The only place the
//! sysroot changes an owner.

use super::{io_err, WriteError};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The ownership policy of a [`super::Sysroot`].
#[derive(Debug, Default)]
pub enum Owners {
    /// chown every file and directory to the owner the write asks for (needs root).
    #[default]
    Apply,
    /// Change no owner; remember each (path, uid, gid) asked for, in order, for a test to read.
    Record(Mutex<Vec<(PathBuf, u32, u32)>>),
}

impl Owners {
    /// A policy that records instead of applying.
    pub fn recording() -> Self {
        Owners::Record(Mutex::new(Vec::new()))
    }

    /// Gives `path` (open as `file` when given, which is then used: no second lookup) to
    /// `owner`; never follows a symlink.
    pub(super) fn set(
        &self,
        path: &Path,
        file: Option<&File>,
        owner: (u32, u32),
    ) -> Result<(), WriteError> {
        match self {
            Owners::Apply => match file {
                Some(f) => std::os::unix::fs::fchown(f, Some(owner.0), Some(owner.1)),
                None => std::os::unix::fs::lchown(path, Some(owner.0), Some(owner.1)),
            }
            .map_err(io_err("chown", path)),
            Owners::Record(asked) => {
                let mut asked = asked.lock().unwrap_or_else(|e| e.into_inner());
                asked.push((path.to_path_buf(), owner.0, owner.1));
                Ok(())
            }
        }
    }

    /// What a recording policy was asked, in order (empty for `Apply`).
    pub fn recorded(&self) -> Vec<(PathBuf, u32, u32)> {
        match self {
            Owners::Apply => Vec::new(),
            Owners::Record(asked) => asked.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// The owner a write asked for `path` last, under a recording policy.
    pub fn owner_of(&self, path: &Path) -> Option<(u32, u32)> {
        self.recorded()
            .into_iter()
            .rev()
            .find(|(p, ..)| p == path)
            .map(|(_, u, g)| (u, g))
    }
}
