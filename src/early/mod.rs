//! Kernel modules in early boot, above the kernel calls of `sys`: which listed drivers this
//! VM's devices need (`modalias`), loading them in dependency and lane order and on demand
//! (`modules`), and the `.ko.lz4` decoder (`lz4`, fuzzed: a module file is untrusted bytes).
//! The on-disk formats are `crate::disk`'s.

pub mod lz4;
pub mod modalias;
pub mod modules;
