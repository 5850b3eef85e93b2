//! Provisioning a root: the validated data (`data`), where it comes from (`merge`), the root
//! and its files (`sysroot`), writing the data in the contract's order (`write`). The flow that
//! ties them to the network is `run`.

pub mod clean;
pub mod data;
pub mod growroot;
pub mod hostkeys;
pub mod kvp;
pub mod merge;
pub mod msp;
pub mod network;
pub mod options;
pub mod reboot;
pub mod record;
pub mod report;
pub mod resource_disk;
pub mod run;
pub mod run_config;
pub mod scripts;
pub mod sources;
pub mod stage;
pub mod state;
pub mod status;
pub mod summary;
pub mod write;

pub use crate::azure::reason::{Failure, Reason};
