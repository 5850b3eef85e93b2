//! Finding the root device without udev or blkid: ext4, xfs and btrfs superblocks give UUID
//! and LABEL; GPT and MBR partition tables give PARTUUID and PARTLABEL. Parsing is pure and
//! works on byte buffers; the scan reads devices listed in /sys/class/block.

use super::{get, has, le32, le64};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsInfo {
    pub fstype: &'static str,
    pub uuid: String,
    pub label: String,
}

/// A 16-byte UUID in the byte order filesystems store it (big-endian fields).
fn uuid_be(b: &[u8]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    let h = h.concat();
    match (
        h.get(0..8),
        h.get(8..12),
        h.get(12..16),
        h.get(16..20),
        h.get(20..32),
    ) {
        (Some(a), Some(b), Some(c), Some(d), Some(e)) => format!("{a}-{b}-{c}-{d}-{e}"),
        _ => String::new(),
    }
}

/// A GUID as GPT stores it: the first three fields little-endian.
fn guid_le(b: &[u8]) -> String {
    match <[u8; 16]>::try_from(b) {
        Ok(g) => uuid_be(&[
            g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], g[8], g[9], g[10], g[11], g[12], g[13],
            g[14], g[15],
        ]),
        Err(_) => String::new(),
    }
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(b.get(..end).unwrap_or(&[]))
        .trim()
        .to_string()
}

/// Needs the first 68 KiB of a device (btrfs keeps its superblock at 64 KiB).
pub const PROBE_BYTES: usize = super::superblock::btrfs::AT + super::superblock::btrfs::LEN;

/// Recognises ext2/3/4, xfs and btrfs from the start of a device.
pub fn probe_fs(b: &[u8]) -> Option<FsInfo> {
    use super::superblock::{btrfs, ext4, xfs};
    if let Some(sb) = b
        .get(ext4::AT..)
        .filter(|sb| has(sb, ext4::MAGIC, &ext4::MAGIC_BYTES))
    {
        let compat_journal =
            le32(sb, ext4::FEATURE_COMPAT).is_some_and(|f| f & ext4::COMPAT_HAS_JOURNAL != 0);
        let incompat = le32(sb, ext4::FEATURE_INCOMPAT).unwrap_or(0);
        let ext4_only = ext4::INCOMPAT_EXTENTS | ext4::INCOMPAT_64BIT | ext4::INCOMPAT_FLEX_BG;
        let fstype = if incompat & ext4_only != 0 {
            "ext4"
        } else if compat_journal {
            "ext3"
        } else {
            "ext2"
        };
        return Some(FsInfo {
            fstype,
            uuid: uuid_be(get(sb, ext4::UUID, 16)?),
            label: text(get(sb, ext4::VOLUME_NAME, ext4::VOLUME_NAME_LEN)?),
        });
    }
    let sb = b.get(xfs::AT..)?;
    if has(sb, xfs::MAGIC, xfs::MAGIC_BYTES) {
        return Some(FsInfo {
            fstype: "xfs",
            uuid: uuid_be(get(sb, xfs::UUID, 16)?),
            label: text(get(sb, xfs::FNAME, xfs::FNAME_LEN)?),
        });
    }
    let sb = b.get(btrfs::AT..)?;
    if has(sb, btrfs::MAGIC, btrfs::MAGIC_BYTES) {
        return Some(FsInfo {
            fstype: "btrfs",
            uuid: uuid_be(get(sb, btrfs::FSID, 16)?),
            label: text(get(sb, btrfs::LABEL, btrfs::LABEL_LEN)?),
        });
    }
    None
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    /// 1-based partition number.
    pub number: u32,
    pub partuuid: String,
    pub partlabel: String,
}

/// The largest GPT entry array read (the usual one is 128 × 128 bytes = 16 KiB).
pub const GPT_ENTRIES_MAX: u64 = 1 << 20;
/// Reads from a device go in pieces of at most this many bytes.
const READ_CHUNK: usize = 64 * 1024;

/// Partitions from a GPT (LBA 1 header, at byte 512 or, on a disk of 4096-byte sectors, at
/// 4096; `read_at` reads disk bytes) or an MBR.
pub fn probe_table(read_at: &mut dyn FnMut(u64, usize) -> Option<Vec<u8>>) -> Vec<PartInfo> {
    let Some(mbr) = read_at(0, 1024) else {
        return Vec::new();
    };
    let gpt = if get(&mbr, 512, 8) == Some(b"EFI PART") {
        mbr.get(512..).map(|h| (512, h.to_vec()))
    } else {
        read_at(4096, 512)
            .filter(|h| h.get(..8) == Some(b"EFI PART"))
            .map(|h| (4096, h))
    };
    if let Some((sector, h)) = gpt {
        let h = h.as_slice();
        let (Some(lba), Some(n), Some(size)) = (le64(h, 72), le32(h, 80), le32(h, 84)) else {
            return Vec::new();
        };
        // Disks are untrusted input: a sane entry size (UEFI: 128 × 2^k), an entry array of at
        // most GPT_ENTRIES_MAX bytes, and checked arithmetic, so no header field sizes an
        // allocation or wraps an offset.
        if !(128..=4096).contains(&size) || !size.is_power_of_two() {
            return Vec::new();
        }
        let Some(bytes) = u64::from(n)
            .checked_mul(u64::from(size))
            .filter(|b| *b <= GPT_ENTRIES_MAX)
        else {
            return Vec::new();
        };
        let Some(at) = lba.checked_mul(sector) else {
            return Vec::new();
        };
        let Some(entries) = read_at(at, bytes as usize) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, e) in entries.chunks(size as usize).enumerate() {
            if e.iter().take(16).all(|&x| x == 0) {
                continue; // unused entry
            }
            let name: Vec<u16> = e
                .get(56..128)
                .unwrap_or(&[])
                .chunks_exact(2)
                .filter_map(|c| match c {
                    &[a, b] => Some(u16::from_le_bytes([a, b])),
                    _ => None,
                })
                .take_while(|&c| c != 0)
                .collect();
            out.push(PartInfo {
                number: i as u32 + 1,
                partuuid: guid_le(e.get(16..32).unwrap_or(&[])),
                partlabel: String::from_utf16_lossy(&name),
            });
        }
        return out;
    }
    if get(&mbr, 510, 2) == Some(&[0x55, 0xaa]) {
        let sig = le32(&mbr, 440).unwrap_or(0);
        return (0..4)
            .filter(|i| mbr.get(446 + i * 16 + 4).is_some_and(|t| *t != 0))
            .map(|i| PartInfo {
                number: i as u32 + 1,
                partuuid: format!("{sig:08x}-{:02x}", i + 1),
                partlabel: String::new(),
            })
            .collect();
    }
    Vec::new()
}

/// The filesystem on a device node or image file, if azprov recognises it.
pub fn probe_device(path: &Path) -> Option<FsInfo> {
    read_at(path, 0, PROBE_BYTES).and_then(|b| probe_fs(&b))
}

/// One block device as seen in /sys/class/block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDev {
    pub name: String,
    pub node: PathBuf,
    pub fs: Option<FsInfo>,
    pub part: Option<PartInfo>,
}

/// The size in bytes of a device node or image file (its end, as a seek finds it).
pub fn size_of(path: &Path) -> Option<u64> {
    File::open(path).ok()?.seek(SeekFrom::End(0)).ok()
}

/// Writes `len` zero bytes at the start of a device node or image file, and syncs them.
pub fn zero_start(path: &Path, len: usize) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(&vec![0u8; len])?;
    f.sync_all()
}

/// Up to `len` bytes at `off` of a device node or image file (fewer at its end).
pub fn read_at(path: &Path, off: u64, len: usize) -> Option<Vec<u8>> {
    let mut f = File::open(path).ok()?;
    f.seek(SeekFrom::Start(off)).ok()?;
    // grows by what the device actually returns, so a short device never costs `len` bytes
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK.min(len)];
    while buf.len() < len {
        let want = (len - buf.len()).min(chunk.len());
        match f.read(chunk.get_mut(..want)?) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(chunk.get(..n)?),
            Err(_) => return None,
        }
    }
    Some(buf)
}

/// Every block device under `sys_block` (normally /sys/class/block) with its filesystem and,
/// for partitions, its GPT/MBR identity. Device nodes are `dev/NAME`.
pub fn scan(sys_block: &Path, dev: &Path) -> Vec<BlockDev> {
    let names = crate::sys::sorted_names(sys_block);
    let mut out = Vec::new();
    for name in names {
        if name.starts_with("loop") || name.starts_with("ram") {
            continue;
        }
        let node = dev.join(&name);
        let fs = probe_device(&node);
        let part = std::fs::read_to_string(sys_block.join(&name).join("partition"))
            .ok()
            .and_then(|n| n.trim().parse::<u32>().ok())
            .and_then(|number| {
                // the parent disk is the directory above the partition's in sysfs
                let real = std::fs::canonicalize(sys_block.join(&name)).ok()?;
                let parent = real.parent()?.file_name()?.to_string_lossy().into_owned();
                let disk = dev.join(parent);
                probe_table(&mut |off, len| read_at(&disk, off, len))
                    .into_iter()
                    .find(|p| p.number == number)
            });
        out.push(BlockDev {
            name,
            node,
            fs,
            part,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext4_superblock() {
        let mut b = vec![0u8; PROBE_BYTES];
        b[1024 + 56] = 0x53;
        b[1024 + 57] = 0xef;
        b[1024 + 96] = 0x40; // extents
        let uuid = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        b[1024 + 104..1024 + 120].copy_from_slice(&uuid);
        b[1024 + 120..1024 + 124].copy_from_slice(b"root");
        let fs = probe_fs(&b).unwrap();
        assert_eq!(
            fs,
            FsInfo {
                fstype: "ext4",
                uuid: "01234567-89ab-cdef-0123-456789abcdef".into(),
                label: "root".into()
            }
        );
    }

    #[test]
    fn xfs_and_btrfs_superblocks() {
        let mut b = vec![0u8; PROBE_BYTES];
        b[0..4].copy_from_slice(b"XFSB");
        b[32..48].copy_from_slice(&[0xaa; 16]);
        b[108..112].copy_from_slice(b"data");
        let fs = probe_fs(&b).unwrap();
        assert_eq!((fs.fstype, fs.label.as_str()), ("xfs", "data"));
        assert_eq!(fs.uuid, "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa");

        let mut b = vec![0u8; PROBE_BYTES];
        b[0x10000 + 64..0x10000 + 72].copy_from_slice(b"_BHRfS_M");
        b[0x10000 + 32..0x10000 + 48].copy_from_slice(&[0x11; 16]);
        b[0x10000 + 299..0x10000 + 302].copy_from_slice(b"btr");
        let fs = probe_fs(&b).unwrap();
        assert_eq!((fs.fstype, fs.label.as_str()), ("btrfs", "btr"));
        assert!(probe_fs(&vec![0u8; PROBE_BYTES]).is_none());
        assert!(probe_fs(&[]).is_none());
    }

    fn gpt_disk() -> Vec<u8> {
        let mut d = vec![0u8; 512 * 40];
        d[512..520].copy_from_slice(b"EFI PART");
        d[512 + 72..512 + 80].copy_from_slice(&2u64.to_le_bytes());
        d[512 + 80..512 + 84].copy_from_slice(&4u32.to_le_bytes());
        d[512 + 84..512 + 88].copy_from_slice(&128u32.to_le_bytes());
        // entry 2 (index 1) used
        let e = 1024 + 128;
        d[e..e + 16].copy_from_slice(&[0x0f; 16]); // type GUID
        let unique = [
            0x78, 0x56, 0x34, 0x12, 0xbc, 0x9a, 0xf0, 0xde, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
            0x07, 0x08,
        ];
        d[e + 16..e + 32].copy_from_slice(&unique);
        for (i, c) in "rootfs".encode_utf16().enumerate() {
            d[e + 56 + 2 * i..e + 58 + 2 * i].copy_from_slice(&c.to_le_bytes());
        }
        d
    }

    #[test]
    fn gpt_partitions() {
        let d = gpt_disk();
        let parts = probe_table(&mut |off, len| {
            d.get(off as usize..off as usize + len).map(<[u8]>::to_vec)
        });
        assert_eq!(
            parts,
            [PartInfo {
                number: 2,
                partuuid: "12345678-9abc-def0-0102-030405060708".into(),
                partlabel: "rootfs".into()
            }]
        );
    }

    #[test]
    fn hostile_gpt_headers_are_refused_without_a_large_read() {
        for (n, size) in [
            (u32::MAX, 4096u32),
            (1024, 100),
            (4, 129),
            (4, 8192),
            (16384, 128),
        ] {
            let mut d = gpt_disk();
            d[512 + 80..512 + 84].copy_from_slice(&n.to_le_bytes());
            d[512 + 84..512 + 88].copy_from_slice(&size.to_le_bytes());
            let mut asked = 0usize;
            let parts = probe_table(&mut |off, len| {
                asked = asked.max(len);
                d.get(off as usize..(off as usize).saturating_add(len))
                    .map(<[u8]>::to_vec)
            });
            assert!(parts.is_empty(), "n={n} size={size}");
            assert!(
                asked as u64 <= GPT_ENTRIES_MAX,
                "n={n} size={size}: read {asked}"
            );
        }
        // an entry LBA that would wrap the byte offset
        let mut d = gpt_disk();
        d[512 + 72..512 + 80].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(probe_table(&mut |off, len| d
            .get(off as usize..(off as usize).saturating_add(len))
            .map(<[u8]>::to_vec))
        .is_empty());
    }

    #[test]
    fn mbr_partitions() {
        let mut d = vec![0u8; 1024];
        d[440..444].copy_from_slice(&0xdead_beefu32.to_le_bytes());
        d[446 + 4] = 0x83;
        d[446 + 16 + 4] = 0x83;
        d[510] = 0x55;
        d[511] = 0xaa;
        let parts = probe_table(&mut |off, len| {
            d.get(off as usize..off as usize + len).map(<[u8]>::to_vec)
        });
        let ids: Vec<&str> = parts.iter().map(|p| p.partuuid.as_str()).collect();
        assert_eq!(ids, ["deadbeef-01", "deadbeef-02"]);
        let empty = vec![0u8; 1024];
        assert!(probe_table(&mut |off, len| empty
            .get(off as usize..off as usize + len)
            .map(<[u8]>::to_vec))
        .is_empty());
        assert!(probe_table(&mut |_, _| None).is_empty());
    }

    /// A real filesystem made by mkfs.ext4 (scripts/setup installs e2fsprogs).
    #[test]
    fn a_real_ext4_image() {
        let img = std::env::temp_dir().join(format!("azprov-probe-{}.img", std::process::id()));
        let made = std::process::Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-L",
                "azroot",
                "-U",
                "6f0c2a4e-1b3d-4c5e-8f70-9a1b2c3d4e5f",
            ])
            .arg(&img)
            .arg("8M")
            .status();
        // scripts/setup installs e2fsprogs: a missing mkfs.ext4 fails, it does not skip
        assert!(
            made.is_ok_and(|s| s.success()),
            "mkfs.ext4 failed or is missing"
        );
        let fs = probe_device(&img).unwrap();
        assert_eq!(
            fs,
            FsInfo {
                fstype: "ext4",
                uuid: "6f0c2a4e-1b3d-4c5e-8f70-9a1b2c3d4e5f".into(),
                label: "azroot".into()
            }
        );
        std::fs::remove_file(&img).unwrap();
    }
}
