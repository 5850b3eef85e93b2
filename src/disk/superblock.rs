//! The superblocks azprov reads: where each lies on its device and its fields by name, offsets
//! from the superblock's own start (the kernel's `struct ext4_super_block`, `struct xfs_dsb`,
//! `struct btrfs_super_block`). `block` reads identity (type, UUID, label) from them, growroot
//! the size.

use super::{has, le32, le64};

/// ext2/3/4 (fs/ext4/ext4.h).
pub mod ext4 {
    /// The superblock's place on the device, and its length.
    pub const AT: usize = 1024;
    pub const LEN: usize = 1024;
    pub const BLOCKS_COUNT_LO: usize = 0x04;
    /// The block size is 1024 << this.
    pub const LOG_BLOCK_SIZE: usize = 0x18;
    pub const MAGIC: usize = 0x38;
    pub const MAGIC_BYTES: [u8; 2] = [0x53, 0xef];
    pub const FEATURE_COMPAT: usize = 0x5c;
    pub const FEATURE_INCOMPAT: usize = 0x60;
    pub const UUID: usize = 0x68;
    pub const VOLUME_NAME: usize = 0x78;
    pub const VOLUME_NAME_LEN: usize = 16;
    pub const BLOCKS_COUNT_HI: usize = 0x150;
    pub const COMPAT_HAS_JOURNAL: u32 = 0x04;
    pub const INCOMPAT_EXTENTS: u32 = 0x40;
    pub const INCOMPAT_64BIT: u32 = 0x80;
    pub const INCOMPAT_FLEX_BG: u32 = 0x200;
}

/// xfs (fs/xfs/libxfs/xfs_format.h).
pub mod xfs {
    pub const AT: usize = 0;
    pub const MAGIC: usize = 0;
    pub const MAGIC_BYTES: &[u8; 4] = b"XFSB";
    pub const UUID: usize = 32;
    pub const FNAME: usize = 108;
    pub const FNAME_LEN: usize = 12;
}

/// btrfs (fs/btrfs/accessors.h, include/uapi/linux/btrfs_tree.h): the primary copy at 64 KiB.
pub mod btrfs {
    pub const AT: usize = 0x10000;
    pub const LEN: usize = 4096;
    pub const FSID: usize = 0x20;
    pub const MAGIC: usize = 0x40;
    pub const MAGIC_BYTES: &[u8; 8] = b"_BHRfS_M";
    pub const NUM_DEVICES: usize = 0x88;
    /// The embedded dev_item: its devid, then total_bytes.
    pub const DEV_ITEM_DEVID: usize = 0xc9;
    pub const DEV_ITEM_TOTAL_BYTES: usize = 0xd1;
    pub const LABEL: usize = 0x12b;
    pub const LABEL_LEN: usize = 256;
}

/// ext4's block size and block count from its superblock `sb` (64-bit counts when the
/// feature is on); None when the block size is not one ext4 makes.
pub fn ext4_size(sb: &[u8]) -> Option<(u64, u64)> {
    let log = le32(sb, ext4::LOG_BLOCK_SIZE)?;
    if log > 6 {
        return None;
    }
    let lo = u64::from(le32(sb, ext4::BLOCKS_COUNT_LO)?);
    let hi = match le32(sb, ext4::FEATURE_INCOMPAT)? & ext4::INCOMPAT_64BIT {
        0 => 0,
        _ => u64::from(le32(sb, ext4::BLOCKS_COUNT_HI)?),
    };
    Some((1024 << log, (hi << 32) | lo))
}

/// A single-device btrfs's size on its device (its dev_item's total_bytes) from its
/// superblock `sb`; None for another filesystem or one spanning several devices.
pub fn btrfs_single_device_bytes(sb: &[u8]) -> Option<u64> {
    let is_btrfs = has(sb, btrfs::MAGIC, btrfs::MAGIC_BYTES);
    let one = le64(sb, btrfs::NUM_DEVICES)? == 1 && le64(sb, btrfs::DEV_ITEM_DEVID)? == 1;
    if !(is_btrfs && one) {
        return None;
    }
    le64(sb, btrfs::DEV_ITEM_TOTAL_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext4_and_btrfs_sizes_from_their_fields() {
        let mut sb = vec![0u8; ext4::LEN];
        sb[ext4::LOG_BLOCK_SIZE] = 2; // 4096
        sb[ext4::BLOCKS_COUNT_LO..][..4].copy_from_slice(&12288u32.to_le_bytes());
        sb[ext4::BLOCKS_COUNT_HI] = 1; // ignored without 64bit
        assert_eq!(ext4_size(&sb), Some((4096, 12288)));
        sb[ext4::FEATURE_INCOMPAT] = ext4::INCOMPAT_64BIT as u8;
        assert_eq!(ext4_size(&sb), Some((4096, (1 << 32) | 12288)));
        sb[ext4::LOG_BLOCK_SIZE] = 7;
        assert_eq!(ext4_size(&sb), None);

        let mut sb = vec![0u8; btrfs::LEN];
        sb[btrfs::MAGIC..][..8].copy_from_slice(btrfs::MAGIC_BYTES);
        sb[btrfs::NUM_DEVICES] = 1;
        sb[btrfs::DEV_ITEM_DEVID] = 1;
        sb[btrfs::DEV_ITEM_TOTAL_BYTES..][..8].copy_from_slice(&(48u64 << 20).to_le_bytes());
        assert_eq!(btrfs_single_device_bytes(&sb), Some(48 << 20));
        sb[btrfs::NUM_DEVICES] = 2;
        assert_eq!(btrfs_single_device_bytes(&sb), None);
        assert_eq!(btrfs_single_device_bytes(&[]), None);
    }
}
