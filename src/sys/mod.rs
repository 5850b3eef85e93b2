//! The kernel interfaces: system calls through nix's safe wrappers, and raw libc only where
//! nix has none (each such block with its `// SAFETY:` line). The crate denies `unsafe` code
//! everywhere else (Cargo.toml `[lints.rust]`); this module alone allows it.
#![allow(unsafe_code)]

pub mod block;
pub mod modules;
pub mod mount;
pub mod netlink;
pub mod packet;
pub mod process;
pub mod switch_root;

pub use nix::errno::Errno;

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
        // nix has no getrandom(2) wrapper.
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), flags) };
        if n > 0 {
            filled += n as usize;
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // kernels before 5.6: the non-blocking read, which may still be unseeded
            Some(libc::EINVAL) if flags == GRND_INSECURE => {
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

#[cfg(test)]
mod tests {
    #[test]
    fn random_bytes_fill_the_buffer() {
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        super::random_bytes(&mut a);
        super::random_bytes(&mut b);
        assert_ne!(a, b);
    }
}
