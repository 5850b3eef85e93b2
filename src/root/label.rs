//! SELinux labels on what azprov creates or replaces in a root whose policy is configured
//! (`/etc/selinux/config` enforcing or permissive, its file_contexts present): each file,
//! directory and symlink gets, before it is renamed into place, the `security.selinux` label
//! the root's own file_contexts give its final path (`root::selinux`), as `restorecon`
//! would set it. The kernel accepts a label before any policy is loaded (Linux 5.5, "selinux:
//! allow labeling before policy is loaded"), so this works in the initramfs with no policy
//! and no libselinux. A path no specification covers keeps the label of the file it replaces.
//! A root without SELinux gets no attribute at all.

use super::selinux::{Config, FileContexts};
use super::{io_err, Sysroot, WriteError};
use crate::sys::xattr;
use std::io;
use std::path::Path;

const XATTR: &str = "security.selinux";

/// The root's policy and its file contexts.
#[derive(Debug)]
pub struct Labels {
    pub config: Config,
    pub contexts: FileContexts,
}

impl Sysroot {
    /// The root's labels, read on first use; None when SELinux is off there.
    pub fn labels(&self) -> Option<&Labels> {
        self.labels.get_or_init(|| self.load_labels()).as_ref()
    }

    fn load_labels(&self) -> Option<Labels> {
        let text = |p: &str| {
            self.read(p)
                .ok()
                .flatten()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        let config = Config::parse(&text("/etc/selinux/config")?)?;
        let base = config.file_contexts();
        let Some(main) = text(&base) else {
            log::warn!(
                "selinux: /etc/selinux/config says {} but {base} is missing: what azprov writes \
                 gets no label, and the booted system may refuse it",
                config.mode
            );
            return None;
        };
        let extra = |suffix: &str| text(&format!("{base}.{suffix}")).unwrap_or_default();
        let (homedirs, local) = (extra("homedirs"), extra("local"));
        let (contexts, bad) = FileContexts::parse(
            &[&main, &homedirs, &local],
            &extra("subs"),
            &extra("subs_dist"),
        );
        log::info!(
            "selinux: {} with policy {}: {} file contexts{}",
            config.mode,
            config.policy,
            contexts.len(),
            if bad > 0 {
                format!(" ({bad} malformed lines skipped)")
            } else {
                String::new()
            }
        );
        Some(Labels { config, contexts })
    }

    /// The label (with libselinux's trailing NUL) for host path `target` inside the root, a
    /// file of type `kind` (`S_IFMT` bits): the policy's, else the label `target` has now.
    /// None without SELinux, or when neither gives one.
    pub(super) fn label_for(&self, target: &Path, kind: u32) -> Option<Vec<u8>> {
        let labels = self.labels()?;
        let view = Path::new("/").join(target.strip_prefix(&self.root).ok()?);
        match labels.contexts.lookup(&view.to_string_lossy(), kind) {
            Some(c) => {
                let mut v = c.as_bytes().to_vec();
                v.push(0);
                Some(v)
            }
            None => xattr::lget(target, XATTR).ok().flatten(),
        }
    }

    /// The label a file at `path` (as the root sees it) gets, for a writer that is not the
    /// sysroot (the RSA host key made after the handover). None without SELinux.
    pub fn label_of(&self, path: &str, kind: u32) -> Option<Vec<u8>> {
        let target = self.resolve(path).ok()?;
        self.label_for(&target, kind)
    }

    /// Gives `path` the label `label_for(as_path, kind)` (a temporary is labelled as the file
    /// it becomes).
    pub(super) fn label_as(
        &self,
        path: &Path,
        as_path: &Path,
        kind: u32,
    ) -> Result<(), WriteError> {
        match self.label_for(as_path, kind) {
            Some(label) => set(path, &label),
            None => Ok(()),
        }
    }

    /// Labels `path` as itself (a directory or symlink made in place).
    pub(super) fn label(&self, path: &Path, kind: u32) -> Result<(), WriteError> {
        self.label_as(path, path, kind)
    }
}

pub(super) fn set(path: &Path, label: &[u8]) -> Result<(), WriteError> {
    xattr::lset(path, XATTR, label)
        .map_err(|e| io_err("set the SELinux label of", path)(io::Error::from(e)))
}

/// The label a file has (tests, and `status`).
pub fn get(path: &Path) -> Option<String> {
    let v = xattr::lget(path, XATTR).ok().flatten()?;
    Some(
        String::from_utf8_lossy(&v)
            .trim_end_matches('\0')
            .to_string(),
    )
}
