//! growroot's partition-table rewrite on an untrusted disk: planning never panics, never asks
//! for more than a bounded read, and a plan applied to the disk leaves a table that plans
//! nothing more (the partition ends where the disk lets it). Every prefix of its writes (a
//! power cut) leaves a primary table that is sound, when the primary's array follows its
//! header and goes out with it in one write.
#![no_main]
use azprov::early::grow::{plan, Skip};
use libfuzzer_sys::fuzz_target;

const MAX_READ: usize = 1 << 20;

fuzz_target!(|input: &[u8]| {
    let Some((&n, rest)) = input.split_first() else {
        return;
    };
    let Some((size_bytes, data)) = rest.split_first_chunk::<2>() else {
        return;
    };
    if data.len() < 1024 {
        return;
    }
    // a disk of the input followed by zeros, up to a few MiB
    let disk_len = (data.len() as u64).max(u64::from(u16::from_le_bytes(*size_bytes)) << 10);
    let mut disk: Vec<u8> = data.to_vec();
    disk.resize(disk_len as usize, 0);
    let number = u32::from(n % 8) + 1;
    let read = |d: &Vec<u8>, at: u64, len: usize| -> Option<Vec<u8>> {
        assert!(len <= MAX_READ, "a read of {len} bytes");
        let at = usize::try_from(at).ok()?;
        d.get(at..at.checked_add(len)?).map(<[u8]>::to_vec)
    };
    let snapshot = disk.clone();
    let Ok(p) = plan(&mut |at, len| read(&snapshot, at, len), disk_len, number) else {
        return;
    };
    let one_commit = p.table == "GPT" && p.writes.last().is_some_and(|(at, _)| *at == 512);
    for (i, (at, bytes)) in p.writes.iter().enumerate() {
        if one_commit && i > 0 {
            let cut = plan(&mut |at, len| read(&disk, at, len), disk_len, number);
            assert!(!matches!(cut, Err(Skip::Corrupt(_))), "cut after {i}: {cut:?}");
        }
        let at = *at as usize;
        assert!(at + bytes.len() <= disk.len(), "a write past the disk's end");
        disk[at..at + bytes.len()].copy_from_slice(bytes);
    }
    let again = plan(&mut |at, len| read(&disk, at, len), disk_len, number);
    assert!(matches!(again, Err(Skip::Little(_))), "{again:?}");
});
