//! Growing the root's partition to the end of its disk (growroot): the new partition table,
//! computed from the old one, as a list of writes in a safe order. Pure: `read_at` gives disk
//! bytes, the result says what to write where; the caller writes, tells the kernel and grows
//! the filesystem. Disks are untrusted input, as in `block`: sizes are checked before use.
//! Sectors are the disk's logical block size: 512 bytes, or 4096 on a 4Kn disk (where the
//! GPT header is at byte 4096 and the protective MBR fills the first 512 bytes of sector 0).
//!
//! GPT: the partition's last LBA moves to the new last usable LBA; the backup entry array and
//! header move to the disk's new end; both headers' CRCs are recomputed. The kernel reads only
//! the primary table (the backup only with `gpt` on its command line), and in hook mode the
//! framework looks for the root before azprov could mend anything: no cut may leave the
//! primary unsound. The primary header names where its array is (PartitionEntryLBA), and one
//! header sector is written whole by storage, so the array is swapped under it (staged):
//! the protective MBR's size (nobody reads it but as a marker); the new backup array and header
//! at the new end (unused while the primary is sound); the new array into the free sectors
//! between the primary array and the first partition (found zeroed, referenced by nothing);
//! the primary header pointing at that copy (the commit point: the new table); the new array
//! in its usual place (unreferenced now); the header pointing back at it; the copy zeroed
//! again. Every state a cut leaves, and every multi-sector write torn in its middle, is a sound
//! old or new table. Where the gap is too small or not zeroed (a boot loader's data), the
//! order is the old one: the primary's one entry sector, then its header; a cut between the
//! two leaves a primary whose array fails its header's CRC beside a sound new backup, which
//! [`restore`] puts back (PID 1 before it looks for the root, growroot before it plans; a
//! hook-mode VM cut there waits for the next PID-1 or growroot run). [`restore`] also mends a
//! header sector torn in its middle, which storage does not do. A hybrid MBR (real entries
//! beside the 0xEE one) is left as it is. MBR: the entry's sector count, one write of sector 0.

use super::{le32, le64};

/// Less than this to gain: left alone.
pub const MIN_GAIN: u64 = 1 << 20;

/// What growing needs written, in order, and what it gains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub table: &'static str,
    /// (byte offset on the disk, bytes), to be written in this order.
    pub writes: Vec<(u64, Vec<u8>)>,
    /// The logical sector size the plan counts in.
    pub sector: u64,
    /// The partition's first sector and its new sector count.
    pub start: u64,
    pub sectors: u64,
    /// Bytes gained.
    pub gain: u64,
    /// Something left alone on the way, to be said in one line.
    pub note: Option<&'static str>,
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

type ReadAt<'a> = &'a mut dyn FnMut(u64, usize) -> Option<Vec<u8>>;

/// The plan to grow partition `number` (1-based) to the end of a disk of `disk_bytes` whose
/// logical sectors are `sector` bytes (512 or 4096).
pub fn plan(read_at: ReadAt, disk_bytes: u64, number: u32, sector: u64) -> Result<Plan, Skip> {
    if !matches!(sector, 512 | 4096) {
        return Err(Skip::Corrupt("logical sector size"));
    }
    let head = read_at(0, 2 * sector as usize).ok_or(Skip::NoTable)?;
    let disk_sectors = disk_bytes / sector;
    let header_at = sector as usize;
    if head.get(header_at..header_at + 8) == Some(b"EFI PART") {
        return gpt(read_at, &head, disk_sectors, number, sector);
    }
    if head.get(510..512) == Some(&[0x55, 0xaa]) {
        return mbr(&head, disk_sectors, number, sector);
    }
    Err(Skip::NoTable)
}

/// A GPT header that passed its checks, with its entry array.
struct Header {
    bytes: Vec<u8>,
    size: usize,
    entries_lba: u64,
    entry_size: usize,
    entries: Vec<u8>,
}

/// The header at byte `at` (one sector of `sector` bytes) and its entry array, if both pass
/// their CRCs and sizes; else what failed.
fn header_at(read_at: ReadAt, at: u64, sector: u64) -> Result<Header, &'static str> {
    let bytes = read_at(at, sector as usize).ok_or("header unreadable")?;
    if bytes.get(..8) != Some(b"EFI PART") {
        return Err("no header");
    }
    let size = le32(&bytes, 12).ok_or("header")? as usize;
    if !(92..=sector as usize).contains(&size) {
        return Err("header size");
    }
    let mut check = bytes.get(..size).ok_or("header")?.to_vec();
    put32(&mut check, 16, 0);
    if le32(&bytes, 16) != Some(crc32(&check)) {
        return Err("header CRC");
    }
    let entries_lba = le64(&bytes, 72).ok_or("header")?;
    let count = le32(&bytes, 80).ok_or("header")?;
    let entry_size = le32(&bytes, 84).ok_or("header")?;
    if !(128..=4096).contains(&entry_size) || !entry_size.is_power_of_two() {
        return Err("entry size");
    }
    let len = u64::from(count) * u64::from(entry_size);
    if len > super::block::GPT_ENTRIES_MAX || len == 0 {
        return Err("entry array size");
    }
    let from = entries_lba.checked_mul(sector).ok_or("entry array LBA")?;
    let entries = read_at(from, len as usize).ok_or("entry array unreadable")?;
    if entries.len() as u64 != len || le32(&bytes, 88) != Some(crc32(&entries)) {
        return Err("entry array CRC");
    }
    Ok(Header {
        bytes,
        size,
        entries_lba,
        entry_size: entry_size as usize,
        entries,
    })
}

/// The header's own CRC, recomputed after a change.
fn seal(h: &mut [u8], size: usize) {
    put32(h, 16, 0);
    let crc = crc32(h.get(..size).unwrap_or_default());
    put32(h, 16, crc);
}

/// The writes that put a GPT's primary table back from its backup, when the primary fails its
/// checks (a cut between the primary's two writes) and the backup at the disk's last sector
/// passes them; None when the primary is sound, or there is no sound backup to take it from.
/// The array goes first and the header last, so a cut in between leaves what this restores
/// again.
pub fn restore(read_at: ReadAt, disk_bytes: u64, sector: u64) -> Option<Vec<(u64, Vec<u8>)>> {
    let head = read_at(sector, sector as usize)?;
    if head.get(..8) != Some(b"EFI PART") || header_at(read_at, sector, sector).is_ok() {
        return None;
    }
    let last_lba = (disk_bytes / sector).checked_sub(1)?;
    let backup = header_at(read_at, last_lba * sector, sector).ok()?;
    if le64(&backup.bytes, 24) != Some(last_lba) || le64(&backup.bytes, 32) != Some(1) {
        return None;
    }
    // the primary's array where its header said, when that header can still be read; the
    // layout every tool makes (LBA 2) otherwise
    let entries_lba = le64(&head, 72).filter(|&l| l >= 2).unwrap_or(2);
    let first_usable = le64(&backup.bytes, 40)?;
    let entry_sectors = (backup.entries.len() as u64).div_ceil(sector);
    if entries_lba + entry_sectors > first_usable {
        return None;
    }
    let mut primary = backup.bytes.clone();
    put64(&mut primary, 24, 1);
    put64(&mut primary, 32, last_lba);
    put64(&mut primary, 72, entries_lba);
    seal(&mut primary, backup.size);
    Some(vec![
        (entries_lba * sector, backup.entries),
        (sector, primary),
    ])
}

fn gpt(
    read_at: ReadAt,
    head: &[u8],
    disk_sectors: u64,
    number: u32,
    sector: u64,
) -> Result<Plan, Skip> {
    let corrupt = Skip::Corrupt;
    let Header {
        bytes: mut hdr,
        size: hdr_size,
        entries_lba,
        entry_size: size,
        mut entries,
    } = header_at(read_at, sector, sector).map_err(corrupt)?;
    let (entry_at, first, last) = last_entry(&entries, number, size)?;
    let entry_sectors = (entries.len() as u64).div_ceil(sector);
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
    let gain = (last_usable - last) * sector;
    if gain < MIN_GAIN {
        return Err(Skip::Little(gain));
    }
    put64(&mut entries, entry_at + 40, last_usable);
    // the primary header: the new alternate and last usable LBA, the entries' CRC, its own CRC
    put64(&mut hdr, 32, last_lba);
    put64(&mut hdr, 48, last_usable);
    put32(&mut hdr, 88, crc32(&entries));
    seal(&mut hdr, hdr_size);
    let mut backup = hdr.clone();
    put64(&mut backup, 24, last_lba);
    put64(&mut backup, 32, 1);
    put64(&mut backup, 72, backup_entries);
    seal(&mut backup, hdr_size);
    let (mbr, note) = protective_mbr(head, disk_sectors, sector)?;
    // the one sector of the primary array that holds the entry
    let changed = entry_at / sector as usize * sector as usize;
    let entry_sector = sector_at(&entries, changed, sector as usize);
    let mut writes = Vec::new();
    if let Some(mbr) = mbr {
        writes.push((0, mbr));
    }
    let primary_entry = (entries_lba * sector + changed as u64, entry_sector);
    // the lowest partition start: the copy must end before every partition
    let lowest = in_use(&entries, size)
        .filter_map(|(_, e)| le64(e, 32))
        .min()
        .unwrap_or(first);
    let stage = staging_area(
        read_at,
        &entries,
        entries_lba + entry_sectors,
        lowest,
        sector,
    );
    writes.extend([
        (backup_entries * sector, entries.clone()),
        (last_lba * sector, backup),
    ]);
    match stage {
        Some(scratch) => {
            let staged = staged_header(&hdr, hdr_size, scratch, entry_sectors);
            let len = entries.len();
            writes.extend([
                (scratch * sector, entries),
                (sector, staged),
                primary_entry,
                (sector, hdr),
                (scratch * sector, vec![0; len]),
            ]);
        }
        None => writes.extend([primary_entry, (sector, hdr)]),
    }
    Ok(Plan {
        table: "GPT",
        writes,
        sector,
        start: first,
        sectors: last_usable - first + 1,
        gain,
        note,
    })
}

/// The `sector` bytes of `bytes` from `at`, zero-padded.
fn sector_at(bytes: &[u8], at: usize, sector: usize) -> Vec<u8> {
    let mut out = bytes.get(at..).unwrap_or_default().to_vec();
    out.resize(sector, 0);
    out
}

/// The entries in use (a non-zero type GUID), with their index.
fn in_use(entries: &[u8], size: usize) -> impl Iterator<Item = (usize, &[u8])> {
    entries
        .chunks(size)
        .enumerate()
        .filter(|(_, e)| !e.iter().take(16).all(|&b| b == 0))
}

/// Partition `number`'s entry: its offset in the array, its first and last LBA; a skip when
/// it is missing or another partition starts after it.
fn last_entry(entries: &[u8], number: u32, size: usize) -> Result<(usize, u64, u64), Skip> {
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
    let first = le64(ours, 32).ok_or(Skip::Corrupt("entry"))?;
    let last = le64(ours, 40).ok_or(Skip::Corrupt("entry"))?;
    let later =
        in_use(entries, size).find(|&(i, e)| i != idx && le64(e, 32).is_some_and(|f| f > first));
    match later {
        Some((i, _)) => Err(Skip::NotLast(i as u32 + 1)),
        None => Ok((entry_at, first, last)),
    }
}

/// The primary header `hdr` pointing at the staged copy of its array at `scratch`. A table
/// whose first usable LBA follows its array at once (sgdisk's 34): the staged header moves it
/// behind the staged copy (before every partition), the final one puts it back.
fn staged_header(hdr: &[u8], hdr_size: usize, scratch: u64, entry_sectors: u64) -> Vec<u8> {
    let mut staged = hdr.to_vec();
    put64(&mut staged, 72, scratch);
    let stage_end = scratch + entry_sectors;
    if le64(&staged, 40).is_some_and(|f| f < stage_end) {
        put64(&mut staged, 40, stage_end);
    }
    seal(&mut staged, hdr_size);
    staged
}

/// The LBA where a copy of the new entry array can stand while the primary header is swapped
/// onto it: right after the primary array, wholly before every partition (the usual 1 MiB
/// alignment leaves the sectors up to 2048 free), and reading as zeros now (no boot loader
/// keeps data there). None where there is no such room.
fn staging_area(
    read_at: ReadAt,
    entries: &[u8],
    after_array: u64,
    lowest_partition: u64,
    sector: u64,
) -> Option<u64> {
    let sectors = (entries.len() as u64).div_ceil(sector);
    let end = after_array.checked_add(sectors)?;
    if end > lowest_partition {
        return None;
    }
    let now = read_at(after_array.checked_mul(sector)?, entries.len())?;
    (now.len() == entries.len() && now.iter().all(|b| *b == 0)).then_some(after_array)
}

/// Sector 0 of a GPT disk with its protective entry covering the whole disk (as far as 32
/// bits reach), or None and a note for a hybrid MBR, whose real entries a whole-disk 0xEE
/// entry would overlap.
fn protective_mbr(
    head: &[u8],
    disk_sectors: u64,
    sector: u64,
) -> Result<(Option<Vec<u8>>, Option<&'static str>), Skip> {
    let mut mbr = head
        .get(..sector as usize)
        .ok_or(Skip::Corrupt("MBR"))?
        .to_vec();
    let kind = |i: usize| mbr.get(446 + i * 16 + 4).copied().unwrap_or(0);
    let kinds: Vec<u8> = (0..4).map(kind).collect();
    if !kinds.contains(&0xee) {
        return Ok((
            None,
            Some("no protective MBR entry: sector 0 left as it is"),
        ));
    }
    if kinds.iter().any(|&k| k != 0 && k != 0xee) {
        return Ok((None, Some("a hybrid MBR: left as it is, the GPT grown")));
    }
    for (i, _) in kinds.iter().enumerate().filter(|(_, &k)| k == 0xee) {
        put32(
            &mut mbr,
            446 + i * 16 + 12,
            (disk_sectors - 1).min(u64::from(u32::MAX)) as u32,
        );
    }
    Ok((Some(mbr), None))
}

fn mbr(head: &[u8], disk_sectors: u64, number: u32, sector: u64) -> Result<Plan, Skip> {
    // an 0xEE entry is a GPT's protective one: a GPT whose header is not where this disk's
    // sector size puts it is not grown as if it were an MBR partition
    if (0..4).any(|i| head.get(446 + i * 16 + 4) == Some(&0xee)) {
        return Err(Skip::Corrupt("a protective MBR without its GPT header"));
    }
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
    let gain = (new - sectors) * sector;
    if gain < MIN_GAIN {
        return Err(Skip::Little(gain));
    }
    let mut sector0 = head
        .get(..sector as usize)
        .ok_or(Skip::Corrupt("MBR"))?
        .to_vec();
    put32(&mut sector0, at + 12, new as u32);
    Ok(Plan {
        table: "MBR",
        writes: vec![(0, sector0)],
        sector,
        start,
        sectors: new,
        gain,
        note: None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn crc32_is_ieee() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    /// `script` given to sfdisk (Debian's util-linux) for the disk or image at `target`.
    pub(crate) fn sfdisk(target: &str, script: &str) {
        let mut c = std::process::Command::new("sfdisk")
            .args(["--quiet", target])
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
    }

    /// A disk image made by sfdisk, grown, planned, written, and checked by sfdisk again.
    fn sfdisk_disk(label: &str, script: &str, mib: u64) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!(
            "azprov-grow-{label}-{}-{}",
            std::process::id(),
            script.len()
        ));
        std::fs::File::create(&p)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        sfdisk(p.to_str().unwrap(), script);
        p
    }

    fn apply(p: &std::path::Path, grow_to_mib: u64, number: u32) -> Result<Plan, Skip> {
        apply_first(p, grow_to_mib, number, usize::MAX, 512)
    }

    /// Reads `f` as a disk.
    pub(crate) fn reader(f: &std::fs::File) -> impl FnMut(u64, usize) -> Option<Vec<u8>> + '_ {
        move |at, len| {
            use std::os::unix::fs::FileExt;
            let mut b = vec![0; len];
            f.read_exact_at(&mut b, at).ok()?;
            Some(b)
        }
    }

    /// Writes `writes` to `p`, the last one torn after `torn` bytes when given.
    fn write_to(f: &std::fs::File, writes: &[(u64, Vec<u8>)], torn: Option<usize>) {
        use std::os::unix::fs::FileExt;
        let n = writes.len();
        for (i, (at, bytes)) in writes.iter().enumerate() {
            let len = match torn {
                Some(t) if i + 1 == n => t.min(bytes.len()),
                _ => bytes.len(),
            };
            f.write_all_at(&bytes[..len], *at).unwrap();
        }
    }

    /// The disk at `p` grown to `grow_to_mib`, and the first `writes` of the plan for
    /// partition `number` made (all of them: `apply`; fewer: a power cut after them).
    fn apply_first(
        p: &std::path::Path,
        grow_to_mib: u64,
        number: u32,
        writes: usize,
        sector: u64,
    ) -> Result<Plan, Skip> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        f.set_len(grow_to_mib << 20).unwrap();
        let plan = plan(&mut reader(&f), grow_to_mib << 20, number, sector)?;
        let n = writes.min(plan.writes.len());
        write_to(&f, &plan.writes[..n], None);
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

    /// The disk of `cut_test`: 32 MiB, two partitions from 1 MiB, grown to 64 MiB.
    fn cut_disk(layout: &str) -> (std::path::PathBuf, std::fs::File, Plan) {
        let p = sfdisk_disk("cut", layout, 32);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(64 << 20).unwrap();
        let plan = super::plan(&mut reader(&f), 64 << 20, 2, 512).unwrap();
        (p, f, plan)
    }

    #[test]
    fn a_power_cut_or_a_torn_write_anywhere_leaves_a_sound_primary_with_no_repair() {
        // every prefix of the writes, and every multi-sector write torn in its middle: the
        // primary table (all the kernel reads without `gpt` on its command line, and what a
        // hook-mode framework looks for the root in, before azprov runs) is sound as it is,
        // the old one or the new one; sfdisk agrees, and the next run plans what is left
        // sfdisk's first usable LBA (2048), and sgdisk's (34, right after the array)
        for layout in [
            "label: gpt\nstart=2048,size=8M\nsize=8M\n",
            "label: gpt\nfirst-lba: 34\nstart=2048,size=8M\nsize=8M\n",
        ] {
            every_cut_leaves_a_sound_primary(layout);
        }
    }

    fn every_cut_leaves_a_sound_primary(layout: &str) {
        let (_, _, plan) = cut_disk(layout);
        let n = plan.writes.len();
        assert_eq!(
            n, 8,
            "MBR, backup array and header, the staged array, the header on it, the array, \
             the header back, the stage zeroed"
        );
        // the header swaps are single sectors, which storage writes whole
        for i in [4, 6] {
            assert_eq!((plan.writes[i].0, plan.writes[i].1.len()), (512, 512));
        }
        let mut new = 0;
        for cut in 0..=n {
            for torn in [None, Some(4096)] {
                let multi = cut > 0 && plan.writes[cut - 1].1.len() > 4096;
                if torn.is_some() && !multi {
                    continue;
                }
                let (p, f, plan) = cut_disk(layout);
                write_to(&f, &plan.writes[..cut], torn);
                let what = format!("cut after {cut} writes, torn {torn:?}");
                assert_eq!(
                    restore(&mut reader(&f), 64 << 20, 512),
                    None,
                    "{what}: unsound"
                );
                let again = super::plan(&mut reader(&f), 64 << 20, 2, 512);
                new += usize::from(matches!(again, Err(Skip::Little(_))));
                assert!(
                    matches!(again, Ok(_) | Err(Skip::Little(_))),
                    "{what}: {again:?}"
                );
                let v = std::process::Command::new("sfdisk")
                    .args(["--dump", p.to_str().unwrap()])
                    .output()
                    .unwrap();
                assert!(
                    v.status.success(),
                    "{what}: {}",
                    String::from_utf8_lossy(&v.stderr)
                );
                let _ = std::fs::remove_file(&p);
            }
        }
        // from the header's first swap on, the table is the new one
        assert!(new >= 4, "{new}");
        // the stage is zeroed again at the end (a later grow finds it free), and the header
        // has its own first usable LBA back
        let (p, f, plan) = cut_disk(layout);
        let first_usable = |f: &std::fs::File| le64(&reader(f)(512, 512).unwrap(), 40);
        let before = first_usable(&f);
        write_to(&f, &plan.writes, None);
        let mut read = reader(&f);
        assert!(read(34 * 512, 32 * 512).unwrap().iter().all(|b| *b == 0));
        assert_eq!(first_usable(&f), before);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn without_a_free_gap_the_old_order_is_mended_by_restore() {
        // a partition right after the primary array: no room to stage the array, so the
        // entry sector and then the header; a cut between them (or a header torn, which
        // storage does not do) leaves an unsound primary that restore puts back
        let layout = "label: gpt\nfirst-lba: 34\nstart=34,size=8M\nsize=8M\n";
        let (_, _, plan) = cut_disk(layout);
        assert_eq!(
            plan.writes.len(),
            5,
            "MBR, backup array and header, entry sector, header"
        );
        let mut restored = 0;
        for cut in 0..=plan.writes.len() {
            for torn in [None, Some(256)] {
                if cut == 0 && torn.is_some() {
                    continue;
                }
                let (p, f, plan) = cut_disk(layout);
                write_to(&f, &plan.writes[..cut], torn);
                if let Some(fix) = restore(&mut reader(&f), 64 << 20, 512) {
                    restored += 1;
                    write_to(&f, &fix, None);
                }
                assert_eq!(restore(&mut reader(&f), 64 << 20, 512), None, "sound now");
                let again = super::plan(&mut reader(&f), 64 << 20, 2, 512);
                assert!(
                    matches!(again, Ok(_) | Err(Skip::Little(_))),
                    "cut {cut} torn {torn:?}"
                );
                let _ = std::fs::remove_file(&p);
            }
        }
        // between the entry sector and the header, and with the header torn
        assert_eq!(restored, 2);
    }

    #[test]
    fn a_hybrid_mbr_is_left_as_it_is_and_a_gpt_without_its_header_is_not_grown_as_mbr() {
        let p = sfdisk_disk("hybrid", "label: gpt\n,8M\n,8M\n", 32);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        // sector 0 as gdisk's hybrid MBR makes it: 0xEE for the GPT, then partition 1 as 0x83
        use std::os::unix::fs::FileExt;
        let mut mbr = vec![0u8; 512];
        f.read_exact_at(&mut mbr, 0).unwrap();
        let entry = |mbr: &mut Vec<u8>, i: usize, kind: u8, start: u32, len: u32| {
            let o = 446 + i * 16;
            mbr[o + 4] = kind;
            mbr[o + 8..o + 12].copy_from_slice(&start.to_le_bytes());
            mbr[o + 12..o + 16].copy_from_slice(&len.to_le_bytes());
        };
        entry(&mut mbr, 0, 0xee, 1, 2047);
        entry(&mut mbr, 1, 0x83, 2048, 16384);
        f.write_all_at(&mbr, 0).unwrap();
        let plan = apply(&p, 64, 2).unwrap();
        assert_eq!(
            plan.note,
            Some("a hybrid MBR: left as it is, the GPT grown")
        );
        assert!(
            plan.writes.iter().all(|(at, _)| *at != 0),
            "sector 0 not written"
        );
        let mut after = vec![0u8; 512];
        f.read_exact_at(&mut after, 0).unwrap();
        assert_eq!(after, mbr);
        // the same disk read as if its sectors were 4096 bytes: no GPT header at 4096, and the
        // protective entry is not an MBR partition to grow
        assert_eq!(
            plan_of(&f, 96, 1, 4096),
            Err(Skip::Corrupt("a protective MBR without its GPT header"))
        );
        let _ = std::fs::remove_file(&p);
    }

    fn plan_of(f: &std::fs::File, mib: u64, number: u32, sector: u64) -> Result<Plan, Skip> {
        f.set_len(mib << 20).unwrap();
        plan(&mut reader(f), mib << 20, number, sector)
    }

    /// A loop device with 4096-byte logical sectors over `p`; detached when dropped.
    struct Loop(String);

    impl Loop {
        fn attach(p: &std::path::Path) -> Loop {
            let o = std::process::Command::new("losetup")
                .args(["--find", "--show", "--sector-size", "4096"])
                .arg(p)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "losetup: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            Loop(String::from_utf8(o.stdout).unwrap().trim().to_string())
        }
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &self.0])
                .status();
        }
    }

    #[test]
    #[cfg_attr(
        azprov_unprivileged,
        ignore = "needs root for a loop device (runs as root and under CI=true)"
    )]
    fn a_4kn_disk_grows_in_its_own_sectors_and_sfdisk_agrees() {
        let p = std::env::temp_dir().join(format!("azprov-grow-4kn-{}", std::process::id()));
        std::fs::File::create(&p)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        sfdisk(&Loop::attach(&p).0, "label: gpt\n,8M\n,8M\n");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        // read as 512-byte sectors (the old code's view) it is no table to grow
        assert_eq!(
            plan_of(&f, 64, 2, 512),
            Err(Skip::Corrupt("a protective MBR without its GPT header"))
        );
        let plan = plan_of(&f, 64, 2, 4096).unwrap();
        assert_eq!((plan.table, plan.sector), ("GPT", 4096));
        assert!(plan
            .writes
            .iter()
            .all(|(at, b)| at % 4096 == 0 && b.len() % 4096 == 0));
        // to the new last usable LBA: 64 MiB of 4096-byte sectors less the backup's 5 and one
        assert_eq!(plan.start + plan.sectors - 1, (64 << 8) - 6);
        write_to(&f, &plan.writes, None);
        let dev = Loop::attach(&p);
        let v = std::process::Command::new("sfdisk")
            .args(["--verify", &dev.0])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&v.stdout);
        assert!(
            v.status.success() && out.contains("No errors detected"),
            "{out}"
        );
        let dump = std::process::Command::new("sfdisk")
            .args(["--dump", &dev.0])
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&dump.stdout).replace(' ', "");
        assert!(dump.contains("sector-size:4096"), "{dump}");
        assert!(dump.contains(&format!("size={},", plan.sectors)), "{dump}");
        drop(dev);
        let _ = std::fs::remove_file(&p);
    }
}
