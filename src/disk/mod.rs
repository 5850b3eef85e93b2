//! On-disk formats, read from untrusted bytes: the superblocks by their named fields (`superblock`)
//! and the partition tables the root and fstab's devices are found by (`block`), and the grown
//! partition table of growroot, planned as a list of writes in a safe order and put back from its
//! backup when a write was cut (`grow`). The parsers and the planner are pure (bytes in, a result
//! out; `block` also lists and opens block devices for its callers); both are fuzzed, neither needs
//! `unsafe`.

pub mod block;
pub mod grow;
pub mod names;
pub mod ntfs;
pub mod superblock;

/// `len` bytes of `b` from `at`, None past its end.
fn get(b: &[u8], at: usize, len: usize) -> Option<&[u8]> {
    b.get(at..at.checked_add(len)?)
}

/// Whether `b` holds `magic` at `at`.
fn has(b: &[u8], at: usize, magic: &[u8]) -> bool {
    get(b, at, magic.len()) == Some(magic)
}

/// The little-endian u32 at `at` of `b`.
fn le32(b: &[u8], at: usize) -> Option<u32> {
    match get(b, at, 4)? {
        &[a, b, c, d] => Some(u32::from_le_bytes([a, b, c, d])),
        _ => None,
    }
}

/// The little-endian u64 at `at` of `b`.
fn le64(b: &[u8], at: usize) -> Option<u64> {
    let lo = le32(b, at)?;
    let hi = le32(b, at + 4)?;
    Some(u64::from(lo) | (u64::from(hi) << 32))
}
