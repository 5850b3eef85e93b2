//! Kernel modules in early boot, above the kernel calls of `sys` (the on-disk formats are
//! `crate::disk`'s): which listed drivers this VM's devices need ([`modalias`]), loading them in
//! dependency and lane order and on demand (here), and the `.ko.lz4` decoder ([`lz4`], fuzzed:
//! a module file is untrusted bytes).
//!
//! The list `scripts/mkinitramfs` wrote (`path: dep dep | alias
//! alias`, load order), loaded with finit_module on a few threads at once, each module once its
//! dependencies are in. Filesystem modules that a boot may not need, and the dependencies only
//! they need, are deferred until a filesystem of theirs is to be mounted: the root's (xfs,
//! btrfs, ext4 when modular: xfs, btrfs and raid6_pq's self-benchmark are most of an emulated
//! module stage, and a root needs at most one of them) and iso9660 (isofs), which
//! only a provisioning CD without UDF needs (Azure's is UDF; [`OnDemand`]). A `.ko.lz4` in the
//! list (how mkinitramfs stores those) is decompressed ([`lz4`]) and loaded with
//! init_module. Which listed drivers load at all is [`modalias`]'s call.
//!
//! Device names stay as a serial load gives them: the drivers whose devices share a kernel
//! name space (`eth%d`; SCSI hosts and so `sd%c` and `sr%d`; `vd%c`; `nvme%d`) load in list
//! order among themselves ([`Lane`]); the others (buses such as virtio_pci and hv_vmbus,
//! filesystems, libraries, a lane's own libraries such as scsi_mod and libata too) and the
//! other lanes overlap them. SCSI hosts scan
//! synchronously while PID 1 runs ([`SCSI_SCAN`]), so a host's drives exist once its driver
//! has bound to it, even when that happens outside any module load (Hyper-V's VMBus offers).

use crate::sys::{kmod, Errno};
use std::path::{Path, PathBuf};

/// The most a compressed module may decompress to (xfs, the largest, is 4.2 MB).
const MODULE_MAX: usize = 64 << 20;

/// finit_module(2) with `params` (`name=value …`, as modprobe passes them); a `.lz4` module
/// (an LZ4 legacy frame, see `lz4`) is decompressed here and loaded with init_module(2): the
/// kernel checks its signature the same way. Loaded already is success.
pub fn load_module(path: &Path, params: &str) -> Result<(), Errno> {
    if path.extension().is_some_and(|e| e == "lz4") {
        let data = std::fs::read(path).map_err(|e| crate::sys::errno_of(&e))?;
        let image = lz4::decompress(&data, MODULE_MAX).map_err(|e| {
            log::warn!("module {}: {e}", path.display());
            Errno::ENOEXEC
        })?;
        kmod::load_image(&image, params)
    } else {
        kmod::load_file(path, params)
    }
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
    /// `vmbus:…`), as modules.alias has them: what [`modalias::gate`] matches.
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

mod loader;
pub mod lz4;
pub mod modalias;
mod on_demand;

pub use loader::{Loader, SCSI_SCAN};
pub use on_demand::OnDemand;

#[cfg(test)]
mod tests;
