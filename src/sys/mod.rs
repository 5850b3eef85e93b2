//! The kernel interfaces: system calls through nix's safe wrappers, and raw libc only where
//! nix has none (each such block with its `// SAFETY:` line). The crate denies `unsafe` code
//! (Cargo.toml `[lints.rust]`); the files of this folder that hold it allow it, each at its
//! top, and no other file does.

pub mod at;
pub mod block;
pub mod kernel;
pub mod kmod;
pub mod mount;
pub mod netlink;
pub mod packet;
pub mod process;
mod random;
pub mod switch_root;
pub mod xattr;

pub use nix::errno::Errno;
pub use random::{random_bytes, secure_random_bytes};

/// sethostname(2): the running system's name (the booted system's unit; the initramfs
/// leaves it to the init that reads /etc/hostname).
pub fn set_hostname(name: &str) -> Result<(), Errno> {
    nix::unistd::sethostname(name)
}

/// The CPUs this process may run on (sched_getaffinity), at least 1. std's
/// `available_parallelism` also reads cgroup quotas, which an initramfs has none of, and costs
/// 5 KB of code.
pub fn cpus() -> usize {
    use nix::sched::{sched_getaffinity, CpuSet};
    let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return 1;
    };
    let n = (0..CpuSet::count())
        .filter(|&i| set.is_set(i).unwrap_or(false))
        .count();
    n.max(1)
}

/// Whether this is Microsoft's hypervisor: CPUID's hypervisor bit, then leaf 0x40000000's
/// vendor "Microsoft Hv", the test the kernel makes before it starts VMBus. None where CPUID
/// cannot tell (not x86_64).
pub fn hyperv() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        const HYPERVISOR_BIT: u32 = 1 << 31;
        if __cpuid(1).ecx & HYPERVISOR_BIT == 0 {
            return Some(false);
        }
        let r = __cpuid(0x4000_0000);
        let vendor: Vec<u8> = [r.ebx, r.ecx, r.edx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        Some(vendor == b"Microsoft Hv")
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The errno behind an I/O error from std (EIO when it carries none).
pub fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// The names in a directory, sorted; empty when it cannot be read (sysfs and /dev scans).
pub fn sorted_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
