//! The only place with `unsafe`: thin, checked wrappers over Linux system calls.

pub mod block;
pub mod init;
pub mod mount;
pub mod netlink;
pub mod packet;

/// Fills `buf` from the kernel's random source (getrandom(2), blocking until the pool is
/// initialised, which on Hyper-V and QEMU happens early). Falls back to time-mixed bytes only if
/// the call itself is unavailable, which never happens on the kernels azprov supports.
pub fn random_bytes(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else {
            return;
        };
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n > 0 {
            filled += n as usize;
            continue;
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
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
