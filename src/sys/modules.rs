//! Kernel modules for PID 1: the list `scripts/mkinitramfs` wrote (`path: dep dep`, load
//! order), loaded with finit_module. Root filesystem modules (xfs, btrfs, ext4 when modular)
//! and the dependencies only they need are deferred until the root's type is known: under QEMU
//! TCG xfs, btrfs and raid6_pq's self-benchmark cost 1.2 s of a 2.1 s module stage, and a root
//! needs at most one of them.

use nix::errno::Errno;
use nix::kmod::{finit_module, ModuleInitFlags};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// finit_module(2) with no parameters. EEXIST (already loaded) is success.
pub fn load_module(path: &Path) -> Result<(), Errno> {
    let f = std::fs::File::open(path).map_err(|e| super::errno_of(&e))?;
    match finit_module(&f, c"", ModuleInitFlags::empty()) {
        Err(Errno::EEXIST) => Ok(()),
        r => r,
    }
}

/// Filesystems that can hold the root; their modules wait for `load_for_fs`.
const ROOT_FS: [&str; 3] = ["ext4", "xfs", "btrfs"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    pub path: PathBuf,
    pub name: String,
    pub deps: Vec<String>,
}

/// `name` as the kernel spells it: dashes become underscores.
fn norm(n: &str) -> String {
    n.replace('-', "_")
}

/// Parses /etc/azprov/modules: `PATH[: DEP DEP…]` per line, `#` comments.
pub fn parse_list(text: &str) -> Vec<Module> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
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
            }
        })
        .collect()
}

/// Splits the list into what loads now and what waits for the root's filesystem type: the
/// root filesystem modules, and their dependencies that nothing loaded now needs.
pub fn split_deferred(list: Vec<Module>) -> (Vec<Module>, Vec<Module>) {
    let mut deferred: Vec<String> = list
        .iter()
        .filter(|m| ROOT_FS.contains(&m.name.as_str()))
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

/// Loads modules and remembers what failed, so dependants are skipped, not tried.
#[derive(Debug, Default)]
pub struct Loader {
    pub deferred: Vec<Module>,
    failed: Vec<String>,
    pub loaded: usize,
    pub skipped: Vec<String>,
}

impl Loader {
    /// A loader holding `deferred` back for `load_for_fs`.
    pub fn new(deferred: Vec<Module>) -> Self {
        Loader {
            deferred,
            ..Loader::default()
        }
    }

    /// Loads `list` in order. Absent hardware (ENODEV, as hv_vmbus in QEMU) or a failed
    /// dependency is logged and skipped, never fatal.
    pub fn load(&mut self, list: &[Module]) {
        for m in list {
            if let Some(d) = m.deps.iter().find(|d| self.failed.contains(d)) {
                self.skipped.push(format!("{} (needs {d})", m.name));
                self.failed.push(m.name.clone());
                continue;
            }
            let t = Instant::now();
            match load_module(&m.path) {
                Ok(()) => {
                    self.loaded += 1;
                    log::debug!("module {}: {} ms", m.name, t.elapsed().as_millis());
                }
                Err(e) => {
                    log::debug!("module {}: {e}", m.name);
                    // the kernel's words for the common cases; the errno name otherwise
                    let why = match e {
                        Errno::ENODEV => "no device",
                        Errno::ENOENT => "missing symbol or dependency",
                        Errno::ENOEXEC => "bad format",
                        e => e.desc(),
                    };
                    self.skipped.push(format!("{} ({why})", m.name));
                    self.failed.push(m.name.clone());
                }
            }
        }
    }

    /// Loads the deferred module for `fstype` and what it needs; with no type, all of them.
    pub fn load_for_fs(&mut self, fstype: Option<&str>) {
        let wanted: Vec<Module> = match fstype {
            None => std::mem::take(&mut self.deferred),
            Some(t) => {
                let Some(m) = self.deferred.iter().find(|m| m.name == t) else {
                    return;
                };
                let mut names = m.deps.clone();
                names.push(m.name.clone());
                let (take, keep): (Vec<Module>, Vec<Module>) = std::mem::take(&mut self.deferred)
                    .into_iter()
                    .partition(|m| names.contains(&m.name));
                self.deferred = keep;
                take
            }
        };
        if !wanted.is_empty() {
            let t = Instant::now();
            self.load(&wanted);
            let names: Vec<&str> = wanted.iter().map(|m| m.name.as_str()).collect();
            log::info!(
                "modules: {} ms: {} for the root filesystem",
                t.elapsed().as_millis(),
                names.join(" ")
            );
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
";

    fn names(v: &[Module]) -> Vec<&str> {
        v.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn parses_paths_names_and_deps() {
        let l = parse_list(LIST);
        assert_eq!(l.len(), 11);
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
                "raid456"
            ]
        );
        assert_eq!(
            names(&later),
            ["libcrc32c", "xfs", "zstd_compress", "btrfs"]
        );
    }

    #[test]
    fn nothing_deferred_without_root_filesystems() {
        let (now, later) = split_deferred(parse_list("/a/x.ko:\n/a/y.ko: x\n"));
        assert_eq!(names(&now), ["x", "y"]);
        assert!(later.is_empty());
    }
}
