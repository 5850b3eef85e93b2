//! Just enough NTFS to tell whether a resource disk is as Azure hands it over: the volume
//! label (`$Volume`'s VOLUME_NAME) and the names in the root directory (`$I30` index of MFT
//! record 5: INDEX_ROOT, then the INDEX_ALLOCATION nodes it points to). Read-only, no driver:
//! the kernels of Azure's cloud images (Debian's `cloud-amd64`) have no ntfs3 module.
//!
//! The disk is untrusted input: every offset is checked, the fixups verified, no field sizes
//! an allocation beyond [`RECORD_MAX`], and the walk stops after [`NODES_MAX`] index nodes.

use super::{le32, le64};

/// The largest MFT or index record taken (NTFS uses 1 KiB and 4 KiB).
const RECORD_MAX: usize = 64 * 1024;
/// The most index nodes visited: a fresh resource disk's root has one or two.
const NODES_MAX: usize = 256;
/// The most names listed: more than the few Azure puts there means "not pristine" anyway.
pub const NAMES_MAX: usize = 4096;

const MFT_VOLUME: u64 = 3;
const MFT_ROOT: u64 = 5;
const ATTR_END: u32 = 0xFFFF_FFFF;
const ATTR_VOLUME_NAME: u32 = 0x60;
const ATTR_INDEX_ROOT: u32 = 0x90;
const ATTR_INDEX_ALLOCATION: u32 = 0xA0;
/// An index entry's flags: it points to a child node; it is the node's last.
const ENTRY_SUBNODE: u8 = 0x01;
const ENTRY_LAST: u8 = 0x02;
/// FILE_NAME namespaces: the DOS 8.3 alias of a long name (skipped: the long one is listed).
const NAMESPACE_DOS: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NtfsError {
    /// No NTFS boot sector.
    NotNtfs,
    /// A read failed or came back short.
    Read(u64),
    /// A structure is inconsistent: what, where.
    Corrupt(&'static str),
}

impl std::fmt::Display for NtfsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NtfsError::NotNtfs => f.write_str("no NTFS boot sector"),
            NtfsError::Read(at) => write!(f, "cannot read at byte {at}"),
            NtfsError::Corrupt(what) => write!(f, "corrupt NTFS: {what}"),
        }
    }
}

impl std::error::Error for NtfsError {}

/// What the resource disk check needs of an NTFS volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub label: String,
    /// The root directory's names (long names; `$MFT` and the other metafiles included).
    pub root: Vec<String>,
}

/// Reads `len` bytes at a byte offset of the volume.
pub type ReadAt<'a> = dyn FnMut(u64, usize) -> Option<Vec<u8>> + 'a;

struct Geometry {
    cluster: u64,
    record: usize,
    index_record: usize,
    mft: u64,
}

/// Whether `boot` (the volume's first sector) is an NTFS boot sector.
pub fn is_ntfs(boot: &[u8]) -> bool {
    boot.get(3..11) == Some(b"NTFS    ")
}

/// The label and the root directory's names of the NTFS volume `read` reads.
pub fn read_volume(read: &mut ReadAt) -> Result<Volume, NtfsError> {
    let boot = read(0, 512).ok_or(NtfsError::Read(0))?;
    let g = geometry(&boot)?;
    let volume = mft_record(read, &g, MFT_VOLUME)?;
    let label = attributes(&volume)?
        .into_iter()
        .find(|a| a.kind == ATTR_VOLUME_NAME)
        .and_then(|a| a.resident)
        .map(|v| utf16(&v))
        .unwrap_or_default();
    let root = mft_record(read, &g, MFT_ROOT)?;
    let root = root_names(read, &g, &root)?;
    Ok(Volume { label, root })
}

/// Sizes from the boot sector (a negative "clusters per record" is 2^-n bytes).
fn geometry(boot: &[u8]) -> Result<Geometry, NtfsError> {
    if !is_ntfs(boot) {
        return Err(NtfsError::NotNtfs);
    }
    let bytes = |at: usize| boot.get(at).copied().ok_or(NtfsError::NotNtfs);
    let sector = u64::from(u16::from_le_bytes([bytes(0x0B)?, bytes(0x0C)?]));
    let spc = bytes(0x0D)?;
    let spc = if spc > 0x80 {
        1u64.checked_shl(256 - u32::from(spc)).unwrap_or(0)
    } else {
        u64::from(spc)
    };
    let cluster = sector * spc;
    if !(256..=4096).contains(&sector) || !sector.is_power_of_two() || cluster == 0 {
        return Err(NtfsError::Corrupt("boot sector geometry"));
    }
    let size = |v: u8| -> Result<usize, NtfsError> {
        let v = v as i8;
        let n = if v < 0 {
            1u64.checked_shl(u32::from(v.unsigned_abs())).unwrap_or(0)
        } else {
            cluster.saturating_mul(v as u64)
        };
        match usize::try_from(n) {
            Ok(n) if (512..=RECORD_MAX).contains(&n) && n % 512 == 0 => Ok(n),
            _ => Err(NtfsError::Corrupt("record size")),
        }
    };
    Ok(Geometry {
        cluster,
        record: size(bytes(0x40)?)?,
        index_record: size(bytes(0x44)?)?,
        mft: le64(boot, 0x30)
            .and_then(|lcn| lcn.checked_mul(cluster))
            .ok_or(NtfsError::NotNtfs)?,
    })
}

/// An MFT record of the first sixteen (always contiguous at the MFT's start), fixed up.
fn mft_record(read: &mut ReadAt, g: &Geometry, n: u64) -> Result<Vec<u8>, NtfsError> {
    let at = g.mft + n * g.record as u64;
    let mut rec = read(at, g.record)
        .filter(|r| r.len() == g.record)
        .ok_or(NtfsError::Read(at))?;
    fixup(&mut rec, b"FILE")?;
    Ok(rec)
}

/// Checks a multi-sector record's signature and update sequence and puts back the two bytes
/// each 512-byte stride lent it.
fn fixup(rec: &mut [u8], magic: &[u8; 4]) -> Result<(), NtfsError> {
    if rec.get(..4) != Some(magic) {
        return Err(NtfsError::Corrupt("record signature"));
    }
    let at = usize::from(u16_at(rec, 4)?);
    let count = usize::from(u16_at(rec, 6)?);
    if count == 0 || count - 1 != rec.len() / 512 {
        return Err(NtfsError::Corrupt("update sequence"));
    }
    let usn = u16_at(rec, at)?;
    for i in 1..count {
        let end = i * 512 - 2;
        if u16_at(rec, end)? != usn {
            return Err(NtfsError::Corrupt("torn record (update sequence mismatch)"));
        }
        let fix = u16_at(rec, at + 2 * i)?.to_le_bytes();
        rec.get_mut(end..end + 2)
            .ok_or(NtfsError::Corrupt("update sequence"))?
            .copy_from_slice(&fix);
    }
    Ok(())
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, NtfsError> {
    match b.get(at..at + 2) {
        Some(&[x, y]) => Ok(u16::from_le_bytes([x, y])),
        _ => Err(NtfsError::Corrupt("short record")),
    }
}

struct Attribute {
    kind: u32,
    name: String,
    /// A resident attribute's value.
    resident: Option<Vec<u8>>,
    /// A non-resident attribute's data runs: (cluster, clusters), in VCN order.
    runs: Vec<(u64, u64)>,
}

/// The attributes of a fixed-up MFT record.
fn attributes(rec: &[u8]) -> Result<Vec<Attribute>, NtfsError> {
    let corrupt = || NtfsError::Corrupt("attribute");
    let mut at = usize::from(u16_at(rec, 0x14)?);
    let mut out = Vec::new();
    while let Some(kind) = le32(rec, at) {
        if kind == ATTR_END {
            return Ok(out);
        }
        let len = le32(rec, at + 4).ok_or_else(corrupt)? as usize;
        let a = rec
            .get(at..at.checked_add(len).ok_or_else(corrupt)?)
            .ok_or_else(corrupt)?;
        if len < 0x18 || out.len() > 64 {
            return Err(corrupt());
        }
        let name_len = usize::from(*a.get(9).ok_or_else(corrupt)?);
        let name_at = usize::from(u16_at(a, 0x0A)?);
        let name = a
            .get(name_at..name_at + 2 * name_len)
            .map(utf16)
            .unwrap_or_default();
        let (resident, runs) = if a.get(8) == Some(&0) {
            let vlen = le32(a, 0x10).ok_or_else(corrupt)? as usize;
            let vat = usize::from(u16_at(a, 0x14)?);
            (
                Some(a.get(vat..vat + vlen).ok_or_else(corrupt)?.to_vec()),
                Vec::new(),
            )
        } else {
            let rat = usize::from(u16_at(a, 0x20)?);
            (None, runlist(a.get(rat..).ok_or_else(corrupt)?)?)
        };
        out.push(Attribute {
            kind,
            name,
            resident,
            runs,
        });
        at += len;
    }
    Err(corrupt())
}

/// A data run list: each run's header byte gives the sizes of its length and of its (signed,
/// relative) starting cluster; a zero byte ends the list. Sparse runs are refused.
fn runlist(b: &[u8]) -> Result<Vec<(u64, u64)>, NtfsError> {
    let corrupt = || NtfsError::Corrupt("data runs");
    let (mut at, mut lcn, mut out) = (0usize, 0i64, Vec::new());
    loop {
        let h = *b.get(at).ok_or_else(corrupt)?;
        if h == 0 {
            return Ok(out);
        }
        let (ls, os) = (usize::from(h & 0x0F), usize::from(h >> 4));
        if ls == 0 || ls > 8 || os == 0 || os > 8 || out.len() >= 256 {
            return Err(corrupt());
        }
        let field = |from: usize, n: usize, signed: bool| -> Option<i64> {
            let bytes = b.get(from..from + n)?;
            let mut v = [0u8; 8];
            v.get_mut(..n)?.copy_from_slice(bytes);
            if signed && bytes.last().is_some_and(|x| x & 0x80 != 0) {
                for x in v.get_mut(n..)? {
                    *x = 0xFF;
                }
            }
            Some(i64::from_le_bytes(v))
        };
        let len = field(at + 1, ls, false).ok_or_else(corrupt)?;
        let delta = field(at + 1 + ls, os, true).ok_or_else(corrupt)?;
        lcn = lcn
            .checked_add(delta)
            .filter(|l| *l >= 0)
            .ok_or_else(corrupt)?;
        out.push((lcn as u64, u64::try_from(len).map_err(|_| corrupt())?));
        at += 1 + ls + os;
    }
}

/// The root directory's names: the `$I30` index from its root node down through every child
/// node it points to.
fn root_names(read: &mut ReadAt, g: &Geometry, rec: &[u8]) -> Result<Vec<String>, NtfsError> {
    let attrs = attributes(rec)?;
    let i30 = |kind| attrs.iter().find(|a| a.kind == kind && a.name == "$I30");
    let root = i30(ATTR_INDEX_ROOT)
        .and_then(|a| a.resident.as_ref())
        .ok_or(NtfsError::Corrupt("no $I30 index root"))?;
    let alloc = i30(ATTR_INDEX_ALLOCATION)
        .map(|a| a.runs.as_slice())
        .unwrap_or(&[]);
    let mut names = Vec::new();
    let mut pending = Vec::new();
    // the node header follows the 16-byte INDEX_ROOT header
    entries(
        root.get(0x10..).ok_or(NtfsError::Corrupt("index root"))?,
        &mut names,
        &mut pending,
    )?;
    let mut visited = 0;
    while let Some(vcn) = pending.pop() {
        visited += 1;
        if visited > NODES_MAX {
            return Err(NtfsError::Corrupt("too many index nodes"));
        }
        let mut node = index_node(read, g, alloc, vcn)?;
        fixup(&mut node, b"INDX")?;
        entries(
            node.get(0x18..).ok_or(NtfsError::Corrupt("index node"))?,
            &mut names,
            &mut pending,
        )?;
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// The index node at `vcn` (in clusters, or in 512-byte blocks when a node is smaller than a
/// cluster) of the allocation's runs.
fn index_node(
    read: &mut ReadAt,
    g: &Geometry,
    runs: &[(u64, u64)],
    vcn: u64,
) -> Result<Vec<u8>, NtfsError> {
    let unit = if g.index_record as u64 >= g.cluster {
        g.cluster
    } else {
        512
    };
    let mut offset = vcn
        .checked_mul(unit)
        .ok_or(NtfsError::Corrupt("index VCN"))?;
    for &(lcn, len) in runs {
        let bytes = len
            .checked_mul(g.cluster)
            .ok_or(NtfsError::Corrupt("data runs"))?;
        if offset < bytes {
            let at = lcn
                .checked_mul(g.cluster)
                .and_then(|s| s.checked_add(offset))
                .ok_or(NtfsError::Corrupt("data runs"))?;
            return read(at, g.index_record)
                .filter(|b| b.len() == g.index_record)
                .ok_or(NtfsError::Read(at));
        }
        offset -= bytes;
    }
    Err(NtfsError::Corrupt("index VCN outside the allocation"))
}

/// The entries of one index node (`node` starts at its node header): names taken, child
/// nodes queued.
fn entries(node: &[u8], names: &mut Vec<String>, pending: &mut Vec<u64>) -> Result<(), NtfsError> {
    let corrupt = || NtfsError::Corrupt("index entry");
    let mut at = le32(node, 0).ok_or_else(corrupt)? as usize;
    let end = (le32(node, 4).ok_or_else(corrupt)? as usize).min(node.len());
    while at < end {
        let e = node.get(at..end).ok_or_else(corrupt)?;
        let len = usize::from(u16_at(e, 8)?);
        let key_len = usize::from(u16_at(e, 10)?);
        let flags = *e.get(12).ok_or_else(corrupt)?;
        if len < 16 || len > e.len() {
            return Err(corrupt());
        }
        if flags & ENTRY_SUBNODE != 0 {
            pending.push(le64(e, len - 8).ok_or_else(corrupt)?);
        }
        if flags & ENTRY_LAST != 0 {
            return Ok(());
        }
        // the key is the file's FILE_NAME attribute: name length at 0x40, namespace, UTF-16
        let key = e.get(16..16 + key_len).ok_or_else(corrupt)?;
        let chars = usize::from(*key.get(0x40).ok_or_else(corrupt)?);
        if *key.get(0x41).ok_or_else(corrupt)? != NAMESPACE_DOS {
            if names.len() >= NAMES_MAX {
                return Err(NtfsError::Corrupt("too many names"));
            }
            names.push(utf16(key.get(0x42..0x42 + 2 * chars).ok_or_else(corrupt)?));
        }
        at += len;
    }
    Ok(())
}

fn utf16(b: &[u8]) -> String {
    let units: Vec<u16> = b
        .chunks_exact(2)
        .filter_map(|c| <[u8; 2]>::try_from(c).ok().map(u16::from_le_bytes))
        .collect();
    String::from_utf16_lossy(&units)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;

    /// An NTFS volume made by mkntfs (ntfs-3g), with these files at its root (a directory's
    /// name is listed as a file's is), read into memory; None without mkntfs (scripts/setup
    /// installs it; CI requires it).
    pub(crate) fn volume(label: &str, files: &[&str]) -> Option<Vec<u8>> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let d = std::env::temp_dir().join(format!("azprov-ntfs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let img = d.join("ntfs.img");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(8 << 20).unwrap();
        let made = Command::new("mkntfs")
            .args(["-q", "-F", "-f", "-L", label])
            .arg(&img)
            .stderr(std::process::Stdio::null())
            .status();
        if !made.is_ok_and(|s| s.success()) {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "mkntfs (ntfs-3g) is needed"
            );
            return None;
        }
        for name in files {
            let src = d.join("src");
            std::fs::write(&src, b"Azure temporary storage\r\n").unwrap();
            let s = Command::new("ntfscp")
                .arg("-f")
                .arg(&img)
                .arg(&src)
                .arg(name)
                .stdout(std::process::Stdio::null())
                .status();
            assert!(s.is_ok_and(|s| s.success()), "ntfscp {name}");
        }
        let bytes = std::fs::read(&img).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        Some(bytes)
    }

    pub(crate) fn reader(b: &[u8]) -> impl FnMut(u64, usize) -> Option<Vec<u8>> + '_ {
        move |at, len| {
            let at = usize::try_from(at).ok()?;
            b.get(at..at.checked_add(len)?).map(<[u8]>::to_vec)
        }
    }

    fn user_names(v: &Volume) -> Vec<&str> {
        v.root
            .iter()
            .map(String::as_str)
            .filter(|n| !n.starts_with('$') && *n != ".")
            .collect()
    }

    #[test]
    fn the_label_and_the_root_of_a_volume_as_azure_hands_it_over() {
        let Some(img) = volume(
            "Temporary Storage",
            &["DATALOSS_WARNING_README.txt", "System Volume Information"],
        ) else {
            return;
        };
        let v = read_volume(&mut reader(&img)).unwrap();
        assert_eq!(v.label, "Temporary Storage");
        assert_eq!(
            user_names(&v),
            ["DATALOSS_WARNING_README.txt", "System Volume Information"]
        );
        assert!(v.root.iter().any(|n| n == "$MFT"), "{:?}", v.root);
    }

    #[test]
    fn a_root_with_many_files_is_read_through_its_index_nodes() {
        let names: Vec<String> = (0..120)
            .map(|i| format!("user file number {i:03}.dat"))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let Some(img) = volume("Temporary Storage", &refs) else {
            return;
        };
        let v = read_volume(&mut reader(&img)).unwrap();
        assert_eq!(user_names(&v).len(), 120);
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        assert_eq!(
            read_volume(&mut reader(&[0u8; 4096])),
            Err(NtfsError::NotNtfs)
        );
        let Some(img) = volume("Temporary Storage", &["a.txt"]) else {
            return;
        };
        // every byte of the first 64 KiB and of the MFT's first records flipped in turn, a
        // stride at a time: an error or a volume, never a panic
        let mft = {
            let g = geometry(&img).unwrap();
            usize::try_from(g.mft).unwrap()
        };
        for at in (0..65536)
            .step_by(7)
            .chain((mft..mft + 8 * 1024).step_by(3))
        {
            let mut bad = img.clone();
            bad[at] ^= 0xA5;
            let _ = read_volume(&mut reader(&bad));
        }
        // a torn MFT record (its update sequence does not match)
        let mut torn = img.clone();
        let root = mft + 5 * 1024 + 510;
        torn[root] ^= 0xFF;
        assert!(read_volume(&mut reader(&torn)).is_err());
    }
}
