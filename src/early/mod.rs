//! Early boot's policy and the parsers of what it reads, above the kernel calls of `sys`: which
//! listed drivers this VM's devices need (`modalias`), loading them in dependency and lane
//! order and on demand (`modules`), the `.ko.lz4` decoder (`lz4`), and the superblocks and
//! partition tables the root and fstab's devices are found by (`block`). Every parser here
//! reads untrusted bytes (a data disk, a module file) and is fuzzed; none needs `unsafe`.

pub mod block;
pub mod grow;
pub mod lz4;
pub mod modalias;
pub mod modules;
