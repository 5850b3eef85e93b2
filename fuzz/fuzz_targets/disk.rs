//! Disk probing on an untrusted disk: superblocks, partition tables and an NTFS volume's label
//! and root directory never panic, and never ask for more than a bounded read whatever a
//! header claims.
#![no_main]
use azprov::disk::block::{probe_fs, probe_table};
use azprov::disk::ntfs::read_volume;
use azprov::disk::superblock::{btrfs_single_device_bytes, ext4_size};
use libfuzzer_sys::fuzz_target;

/// The largest single read the probes may ask for (the GPT entry array bound).
const MAX_READ: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let _ = probe_fs(data);
    let _ = ext4_size(data);
    let _ = btrfs_single_device_bytes(data);
    let mut read_at = |off: u64, len: usize| -> Option<Vec<u8>> {
        assert!(len <= MAX_READ, "a read of {len} bytes");
        let off = usize::try_from(off).ok()?;
        let end = off.checked_add(len)?;
        // the disk is the input repeated, so headers can point far
        let disk_len = data.len().max(1) * 64;
        if end > disk_len || data.is_empty() {
            return None;
        }
        Some((off..end).map(|i| data[i % data.len()]).collect())
    };
    let _ = probe_table(&mut read_at);
    let _ = read_volume(&mut read_at);
});
