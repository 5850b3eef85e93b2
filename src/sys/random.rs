//! Random bytes from the kernel: getrandom(2), which nix does not wrap.
#![allow(unsafe_code)]

use nix::errno::Errno;

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
