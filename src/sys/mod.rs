//! The kernel interfaces: system calls through nix's safe wrappers, and raw libc only where
//! nix has none (each such block with its `// SAFETY:` line). The crate denies `unsafe` code
//! everywhere else (Cargo.toml `[lints.rust]`); this module alone allows it.
#![allow(unsafe_code)]

pub mod at;
pub mod kernel;
pub mod kmod;
pub mod mount;
pub mod netlink;
pub mod packet;
pub mod process;
pub mod switch_root;
pub mod xattr;

pub use nix::errno::Errno;

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

/// GRND_INSECURE (Linux 5.6): never blocks, even before the CRNG is seeded.
const GRND_INSECURE: libc::c_uint = 0x0004;

/// getrandom(2) into `buf` with `flags`: the number of bytes written.
fn getrandom(buf: &mut [u8], flags: libc::c_uint) -> Result<usize, Errno> {
    // nix has no getrandom(2) wrapper.
    // SAFETY: `buf` is a valid, writable buffer of `buf.len()` bytes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// Fills `buf` from the kernel's random source without waiting for the CRNG to be seeded:
/// early in an initramfs a blocking getrandom(2) stalls for up to a second (measured under
/// QEMU), and what azprov needs (DHCP xids, retry jitter, password salts) must be unpredictable
/// and unique, not secret key material. Falls back to time-mixed bytes only if the call itself
/// is unavailable.
pub fn random_bytes(buf: &mut [u8]) {
    let mut filled = 0;
    let mut flags = GRND_INSECURE;
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else {
            return;
        };
        match getrandom(rest, flags) {
            Ok(n) if n > 0 => {
                filled += n;
                continue;
            }
            Err(Errno::EINTR) => continue,
            // kernels before 5.6: the non-blocking read, which may still be unseeded
            Err(Errno::EINVAL) if flags == GRND_INSECURE => {
                flags = libc::GRND_NONBLOCK;
                continue;
            }
            _ => {}
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for (i, b) in rest.iter_mut().enumerate() {
            *b = (nanos >> ((i % 16) * 8)) as u8 ^ (i as u8).wrapping_mul(151);
        }
        return;
    }
}

/// Fills `buf` from the kernel's CRNG, waiting until it is seeded (getrandom(2) without
/// flags): for key material. Never falls back to anything weaker.
pub fn secure_random_bytes(buf: &mut [u8]) -> Result<(), Errno> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..).filter(|r| !r.is_empty()) {
        match getrandom(rest, 0) {
            Ok(n) => filled += n,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_bytes_fill_the_buffer() {
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        super::random_bytes(&mut a);
        super::random_bytes(&mut b);
        assert_ne!(a, b);
        super::secure_random_bytes(&mut a).unwrap();
        assert_ne!(a, b);
    }
}
