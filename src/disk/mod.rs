//! On-disk formats, read from untrusted bytes: the superblocks by their named fields
//! (`superblock`) and partition tables the root and fstab's devices are found by (`block`), and the grown partition table of growroot,
//! planned as a list of writes in a safe order and put back from its backup when a write was
//! cut (`grow`). The parsers and the planner are pure (bytes in, a result out; `block` also
//! lists and opens block devices for its callers); both are fuzzed, neither needs `unsafe`.

pub mod block;
pub mod grow;
pub mod names;
pub mod ntfs;
pub mod superblock;
