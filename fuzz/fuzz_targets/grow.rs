//! growroot's partition-table rewrite on an untrusted disk: planning never panics, never asks
//! for more than a bounded read, and a plan applied to the disk leaves a table that plans
//! nothing more (the partition ends where the disk lets it). After every prefix of a GPT
//! plan's writes (a power cut), the next boot's `restore` (when it finds the primary unsound)
//! and plan find no corrupt table. Sectors of 512 or 4096 bytes.
#![no_main]
use azprov::disk::grow::{plan, restore, Skip};
use libfuzzer_sys::fuzz_target;

const MAX_READ: usize = 1 << 20;

fn read(d: &[u8], at: u64, len: usize) -> Option<Vec<u8>> {
    assert!(len <= MAX_READ, "a read of {len} bytes");
    let at = usize::try_from(at).ok()?;
    d.get(at..at.checked_add(len)?).map(<[u8]>::to_vec)
}

fn apply(disk: &mut [u8], writes: &[(u64, Vec<u8>)]) {
    for (at, bytes) in writes {
        let at = *at as usize;
        assert!(at + bytes.len() <= disk.len(), "a write past the disk's end");
        disk[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&n, rest)) = input.split_first() else {
        return;
    };
    let Some((size_bytes, data)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let sector: u64 = if n & 0x80 != 0 { 4096 } else { 512 };
    if data.len() < 2 * sector as usize {
        return;
    }
    // a disk of the input followed by zeros, up to a few MiB, in whole sectors
    let len = (data.len() as u64).max(u64::from(u16::from_le_bytes(*size_bytes)) << 10);
    let disk_len = len.div_ceil(sector) * sector;
    let mut disk: Vec<u8> = data.to_vec();
    disk.resize(disk_len as usize, 0);
    let number = u32::from(n % 8) + 1;
    let snapshot = disk.clone();
    let Ok(p) = plan(&mut |at, len| read(&snapshot, at, len), disk_len, number, sector) else {
        return;
    };
    for cut in 1..p.writes.len() {
        if p.table != "GPT" {
            break;
        }
        let mut after = snapshot.clone();
        apply(&mut after, &p.writes[..cut]);
        if let Some(fix) = restore(&mut |at, len| read(&after, at, len), disk_len, sector) {
            apply(&mut after, &fix);
        }
        let next = plan(&mut |at, len| read(&after, at, len), disk_len, number, sector);
        assert!(!matches!(next, Err(Skip::Corrupt(_))), "cut after {cut}: {next:?}");
    }
    apply(&mut disk, &p.writes);
    let again = plan(&mut |at, len| read(&disk, at, len), disk_len, number, sector);
    assert!(matches!(again, Err(Skip::Little(_))), "{again:?}");
});
