//! Growing the root's partition to the end of its disk (growroot): the new partition table,
//! computed from the old one, as a list of writes in a safe order. Pure: `read_at` gives disk
//! bytes, the result says what to write where; the caller writes, tells the kernel and grows
//! the filesystem. Disks are untrusted input, as in `block`: sizes are checked before use.
//!
//! GPT: the partition's last LBA moves to the new last usable LBA; the backup entry array and
//! header move to the disk's new end; both headers' CRCs are recomputed. The kernel reads only
//! the primary table (the backup only with `gpt` on its command line), so the primary must be
//! whole at every instant: the protective MBR's size goes first (nobody reads it but as a
//! marker), then the new backup array and header at the new end (unused while the primary is
//! sound), and last the primary header and its array together in one write, the commit point.
//! A power cut before it leaves the old table whole, and the next boot plans it all again;
//! after it, the new one. MBR: the entry's sector count, one 512-byte write.

use super::block::{le32, le64};

const SECTOR: u64 = 512;
/// Less than this to gain: left alone.
pub const MIN_GAIN: u64 = 1 << 20;

/// What growing needs written, in order, and what it gains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub table: &'static str,
    /// (byte offset on the disk, bytes), to be written in this order.
    pub writes: Vec<(u64, Vec<u8>)>,
    /// The partition's first sector and its new sector count.
    pub start: u64,
    pub sectors: u64,
    /// Bytes gained.
    pub gain: u64,
}

/// Why the partition is left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    NoTable,
    NoPartition(u32),
    NotLast(u32),
    Extended,
    Little(u64),
    Corrupt(&'static str),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::NoTable => write!(f, "no GPT or MBR partition table on the disk"),
            Skip::NoPartition(n) => write!(f, "the table has no partition {n}"),
            Skip::NotLast(n) => write!(f, "partition {n} lies after it"),
            Skip::Extended => write!(f, "a logical or extended MBR partition"),
            Skip::Little(b) => write!(f, "only {} KiB to gain", b / 1024),
            Skip::Corrupt(what) => write!(f, "the partition table is not sound: {what}"),
        }
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// CRC-32 (IEEE 802.3, reflected), as GPT uses it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// The plan to grow partition `number` (1-based) to the end of a disk of `disk_bytes`.
pub fn plan(
    read_at: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    disk_bytes: u64,
    number: u32,
) -> Result<Plan, Skip> {
    let head = read_at(0, 1024).ok_or(Skip::NoTable)?;
    let disk_sectors = disk_bytes / SECTOR;
    if head.get(512..520) == Some(b"EFI PART") {
        return gpt(read_at, &head, disk_sectors, number);
    }
    if head.get(510..512) == Some(&[0x55, 0xaa]) {
        return mbr(&head, disk_sectors, number);
    }
    Err(Skip::NoTable)
}

fn gpt(
    read_at: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    head: &[u8],
    disk_sectors: u64,
    number: u32,
) -> Result<Plan, Skip> {
    let corrupt = Skip::Corrupt;
    let mut hdr = head.get(512..1024).ok_or(corrupt("short header"))?.to_vec();
    let hdr_size = le32(&hdr, 12).ok_or(corrupt("header"))? as usize;
    if !(92..=512).contains(&hdr_size) {
        return Err(corrupt("header size"));
    }
    let mut check = hdr.get(..hdr_size).ok_or(corrupt("header"))?.to_vec();
    put32(&mut check, 16, 0);
    if le32(&hdr, 16) != Some(crc32(&check)) {
        return Err(corrupt("primary header CRC"));
    }
    let entries_lba = le64(&hdr, 72).ok_or(corrupt("header"))?;
    let count = le32(&hdr, 80).ok_or(corrupt("header"))?;
    let size = le32(&hdr, 84).ok_or(corrupt("header"))?;
    if !(128..=4096).contains(&size) || !size.is_power_of_two() {
        return Err(corrupt("entry size"));
    }
    let bytes = u64::from(count) * u64::from(size);
    if bytes > super::block::GPT_ENTRIES_MAX || bytes == 0 {
        return Err(corrupt("entry array size"));
    }
    let at = entries_lba
        .checked_mul(SECTOR)
        .ok_or(corrupt("entry array LBA"))?;
    let mut entries = read_at(at, bytes as usize).ok_or(corrupt("entry array unreadable"))?;
    if entries.len() as u64 != bytes || le32(&hdr, 88) != Some(crc32(&entries)) {
        return Err(corrupt("entry array CRC"));
    }
    let size = size as usize;
    let idx = (number as usize)
        .checked_sub(1)
        .ok_or(Skip::NoPartition(number))?;
    let entry_at = idx
        .checked_mul(size)
        .filter(|a| a + size <= entries.len())
        .ok_or(Skip::NoPartition(number))?;
    let ours = entries
        .get(entry_at..entry_at + size)
        .ok_or(Skip::NoPartition(number))?;
    if ours.iter().take(16).all(|&b| b == 0) {
        return Err(Skip::NoPartition(number));
    }
    let first = le64(ours, 32).ok_or(corrupt("entry"))?;
    let last = le64(ours, 40).ok_or(corrupt("entry"))?;
    for (i, e) in entries.chunks(size).enumerate() {
        if i != idx && !e.iter().take(16).all(|&b| b == 0) && le64(e, 32).is_some_and(|f| f > first)
        {
            return Err(Skip::NotLast(i as u32 + 1));
        }
    }
    let entry_sectors = bytes.div_ceil(SECTOR);
    // the layout every GPT has: the array after the header, the partition after the array
    if entries_lba < 2 || first < entries_lba + entry_sectors || last < first {
        return Err(corrupt("layout"));
    }
    let last_lba = disk_sectors.checked_sub(1).ok_or(corrupt("disk size"))?;
    let backup_entries = last_lba
        .checked_sub(entry_sectors)
        .ok_or(corrupt("disk size"))?;
    let last_usable = backup_entries.checked_sub(1).ok_or(corrupt("disk size"))?;
    if last_usable <= last {
        return Err(Skip::Little(0));
    }
    // the new backup array lies wholly behind the primary one and the partition
    if backup_entries <= entries_lba + entry_sectors {
        return Err(corrupt("disk too small"));
    }
    let gain = (last_usable - last) * SECTOR;
    if gain < MIN_GAIN {
        return Err(Skip::Little(gain));
    }
    put64(&mut entries, entry_at + 40, last_usable);
    // the primary header: the new alternate and last usable LBA, the entries' CRC, its own CRC
    put64(&mut hdr, 32, last_lba);
    put64(&mut hdr, 48, last_usable);
    put32(&mut hdr, 88, crc32(&entries));
    let seal = |h: &mut Vec<u8>| {
        put32(h, 16, 0);
        let crc = crc32(h.get(..hdr_size).unwrap_or_default());
        put32(h, 16, crc);
    };
    seal(&mut hdr);
    let mut backup = hdr.clone();
    put64(&mut backup, 24, last_lba);
    put64(&mut backup, 32, 1);
    put64(&mut backup, 72, backup_entries);
    seal(&mut backup);
    // the protective MBR's partition covers the whole disk (as far as 32 bits reach)
    let mut mbr = head.get(..512).ok_or(corrupt("MBR"))?.to_vec();
    for i in 0..4 {
        if mbr.get(446 + i * 16 + 4) == Some(&0xee) {
            put32(
                &mut mbr,
                446 + i * 16 + 12,
                (disk_sectors - 1).min(u64::from(u32::MAX)) as u32,
            );
        }
    }
    let pad = |mut v: Vec<u8>| {
        v.resize(SECTOR as usize, 0);
        v
    };
    // the primary header and its array in one write when the array follows the header (as
    // every tool lays it out); otherwise the array, then the header (a header naming an array
    // not yet written would fail its CRC), and a cut between the two leaves the primary unsound
    let primary = if entries_lba == 2 {
        vec![(SECTOR, [pad(hdr), entries.clone()].concat())]
    } else {
        vec![(entries_lba * SECTOR, entries.clone()), (SECTOR, pad(hdr))]
    };
    Ok(Plan {
        table: "GPT",
        writes: [
            vec![
                (0, mbr),
                (backup_entries * SECTOR, entries),
                (last_lba * SECTOR, pad(backup)),
            ],
            primary,
        ]
        .concat(),
        start: first,
        sectors: last_usable - first + 1,
        gain,
    })
}

fn mbr(head: &[u8], disk_sectors: u64, number: u32) -> Result<Plan, Skip> {
    if !(1..=4).contains(&number) {
        return Err(Skip::Extended);
    }
    let at = 446 + (number as usize - 1) * 16;
    let kind = *head.get(at + 4).ok_or(Skip::Corrupt("MBR"))?;
    if kind == 0 {
        return Err(Skip::NoPartition(number));
    }
    if matches!(kind, 0x05 | 0x0f | 0x85) {
        return Err(Skip::Extended);
    }
    let start = u64::from(le32(head, at + 8).ok_or(Skip::Corrupt("MBR"))?);
    let sectors = u64::from(le32(head, at + 12).ok_or(Skip::Corrupt("MBR"))?);
    for i in 0..4usize {
        let o = 446 + i * 16;
        if i + 1 != number as usize
            && head.get(o + 4).is_some_and(|t| *t != 0)
            && le32(head, o + 8).is_some_and(|s| u64::from(s) > start)
        {
            return Err(Skip::NotLast(i as u32 + 1));
        }
    }
    let end = disk_sectors.min(u64::from(u32::MAX) + 1);
    let new = end.saturating_sub(start).min(u64::from(u32::MAX));
    if new <= sectors {
        return Err(Skip::Little(0));
    }
    let gain = (new - sectors) * SECTOR;
    if gain < MIN_GAIN {
        return Err(Skip::Little(gain));
    }
    let mut sector0 = head.get(..512).ok_or(Skip::Corrupt("MBR"))?.to_vec();
    put32(&mut sector0, at + 12, new as u32);
    Ok(Plan {
        table: "MBR",
        writes: vec![(0, sector0)],
        start,
        sectors: new,
        gain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_ieee() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    /// A disk image made by sfdisk (the tool is Debian's util-linux), grown, planned, written,
    /// and checked by sfdisk again.
    fn sfdisk_disk(label: &str, script: &str, mib: u64) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!(
            "azprov-grow-{label}-{}-{}",
            std::process::id(),
            script.len()
        ));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(mib << 20).unwrap();
        let mut c = std::process::Command::new("sfdisk")
            .args(["--quiet", p.to_str().unwrap()])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sfdisk (util-linux) is needed");
        use std::io::Write;
        c.stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(c.wait().unwrap().success());
        p
    }

    fn apply(p: &std::path::Path, grow_to_mib: u64, number: u32) -> Result<Plan, Skip> {
        apply_first(p, grow_to_mib, number, usize::MAX)
    }

    /// The disk at `p` grown to `grow_to_mib`, and the first `writes` of the plan for
    /// partition `number` made (all of them: `apply`; fewer: a power cut after them).
    fn apply_first(
        p: &std::path::Path,
        grow_to_mib: u64,
        number: u32,
        writes: usize,
    ) -> Result<Plan, Skip> {
        use std::io::{Read, Seek, SeekFrom, Write};
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        f.set_len(grow_to_mib << 20).unwrap();
        let mut read = |at: u64, len: usize| {
            let mut f = &f;
            f.seek(SeekFrom::Start(at)).ok()?;
            let mut b = vec![0; len];
            f.read_exact(&mut b).ok()?;
            Some(b)
        };
        let plan = plan(&mut read, grow_to_mib << 20, number)?;
        for (at, bytes) in plan.writes.iter().take(writes) {
            let mut f = &f;
            f.seek(SeekFrom::Start(*at)).unwrap();
            f.write_all(bytes).unwrap();
        }
        Ok(plan)
    }

    fn sfdisk_dump(p: &std::path::Path) -> String {
        let o = std::process::Command::new("sfdisk")
            .args(["--dump", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }

    #[test]
    fn a_gpt_root_that_is_last_grows_to_the_end_and_sfdisk_agrees() {
        let p = sfdisk_disk("gpt", "label: gpt\n,8M\n,16M\n", 32);
        let plan = apply(&p, 64, 2).unwrap();
        assert_eq!(plan.table, "GPT");
        // to the new last usable LBA: 64 MiB less the backup's 33 sectors and the last
        assert_eq!(plan.start + plan.sectors - 1, (64 << 11) - 34);
        let dump = sfdisk_dump(&p);
        // the backup header is at the new end (sfdisk warns otherwise), the partition fills it
        assert!(dump.contains("last-lba: 131038"), "{dump}");
        let size = plan.sectors;
        assert!(
            dump.replace(' ', "").contains(&format!("size={size},")),
            "{dump}"
        );
        let v = std::process::Command::new("sfdisk")
            .args(["--verify", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            v.status.success() && String::from_utf8_lossy(&v.stdout).contains("No errors detected"),
            "{}",
            String::from_utf8_lossy(&v.stdout)
        );
        // a second run finds nothing to gain
        assert!(matches!(apply(&p, 64, 2), Err(Skip::Little(_))));
        // a partition that is not last is left alone
        assert_eq!(apply(&p, 96, 1), Err(Skip::NotLast(2)));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn an_mbr_root_grows_and_one_not_last_does_not() {
        let p = sfdisk_disk("mbr", "label: dos\n,8M\n,8M\n", 32);
        assert_eq!(apply(&p, 64, 1), Err(Skip::NotLast(2)));
        let plan = apply(&p, 64, 2).unwrap();
        assert_eq!(plan.table, "MBR");
        let dump = sfdisk_dump(&p);
        assert!(
            dump.replace(' ', "")
                .contains(&format!("size={},", plan.sectors)),
            "{dump}"
        );
        assert_eq!((plan.start + plan.sectors) * 512, 64 << 20);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_power_cut_between_the_writes_leaves_a_sound_primary_table() {
        // every prefix of the writes: the primary table alone (all the kernel reads without
        // `gpt` on its command line) is sound, the old one or the new one, and sfdisk agrees
        let writes = apply(&sfdisk_disk("cut", "label: gpt\n,8M\n,8M\n", 32), 64, 2)
            .unwrap()
            .writes
            .len();
        assert_eq!(writes, 4, "MBR, backup array, backup header, primary");
        for cut in 0..=writes {
            let p = sfdisk_disk("cut", "label: gpt\n,8M\n,8M\n", 32);
            apply_first(&p, 64, 2, cut).unwrap();
            // the same disk planned again, as the next boot does: the old table grows again,
            // the new one has nothing left to gain; never a corrupt primary
            let again = apply_first(&p, 64, 2, 0);
            match (cut < writes, &again) {
                (true, Ok(_)) | (false, Err(Skip::Little(_))) => {}
                _ => panic!("cut after {cut} writes: {again:?}"),
            }
            let o = std::process::Command::new("sfdisk")
                .args(["--dump", p.to_str().unwrap()])
                .output()
                .unwrap();
            let dump = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success() && dump.contains("label: gpt"),
                "cut after {cut} writes: {dump}"
            );
            let _ = std::fs::remove_file(&p);
        }
    }
}
