//! Azure's wire formats and endpoints: the provisioning CD's ovf-env.xml, IMDS, the
//! WireServer's goal state and health reports, and the one HTTP client they share.

pub mod http;
pub mod imds;
pub mod kvp;
pub mod media;
pub mod ovf;
pub mod platform;
pub mod reason;
pub mod vmid;
pub mod wireserver;
mod xml;

/// The namespace of `ProvisioningSection` and friends in ovf-env.xml.
pub const WA_NS: &str = "http://schemas.microsoft.com/windowsazure";
