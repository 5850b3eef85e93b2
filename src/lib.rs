//! azprov: provision an Azure Linux VM from the initramfs with no agent in the image.
//!
//! Layers, bottom up: `sys` (kernel calls only), `disk` (on-disk formats: superblocks, partition
//! tables, growroot's plan), `modules` (kernel module loading), `net` (DHCP and
//! the link), `azure` (wire formats and the one HTTP client), `root` (a Linux root and how
//! azprov writes into it), `provision` (the data, the run and its records), `boot` (PID 1) and
//! `cli` (the subcommands). A layer never imports one above it. docs/DESIGN.md, "Code map", has the map.

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

/// The bytes of `tests/fixtures/DIR/NAME`, for unit tests.
#[cfg(test)]
macro_rules! fixture {
    ($dir:literal, $name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/",
            $dir,
            "/",
            $name
        ))
    };
}

pub mod azure;
pub mod boot;
pub mod cli;
pub mod config;
pub mod deadline;
pub mod disk;
pub mod glob;
pub mod logger;
pub mod modules;
pub mod net;
pub mod provision;
pub mod root;
pub mod secret;
pub mod sys;
pub mod time;

/// The version reported to Azure in `agent=azprov/VERSION` and by `azprov version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
