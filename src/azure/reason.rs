//! Every reason Azure can be told in a NotReady report, in one enum (azure-init's `error.rs`,
//! cloud-init's `ReportableError`): a fixed string per variant, so the set is reviewable in
//! one place and the portal shows the same words for the same cause. The detail that goes
//! with a reason (path, errno, status) travels beside it in a [`Failure`]; decisions are taken
//! on the variant, never on text. docs/contracts.md, "What Azure is told", lists the table;
//! the test below pins it.

use std::fmt;

macro_rules! reasons {
    ($($variant:ident => $text:literal, $doc:literal;)*) => {
        /// Why provisioning failed, as Azure is told it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $(#[doc = $doc] $variant,)*
        }

        impl Reason {
            /// Every reason, in the order of the table.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The fixed string in `reason=…` of the NotReady description.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $text,)*
                }
            }

            /// When this reason is given (the reason table in docs/contracts.md).
            pub const fn when(self) -> &'static str {
                match self {
                    $(Reason::$variant => $doc,)*
                }
            }
        }
    };
}

reasons! {
    NoDhcpInterface => "failure to find DHCP interface",
        "no Ethernet interface to configure, or `--iface`/`azprov.iface=` names none";
    DhcpLease => "failure to obtain DHCP lease",
        "no lease within the deadline (no carrier, no answer, NAKs), or the raw socket failed";
    NetworkConfig => "failure to configure network",
        "the kernel refused the lease's address, route or MTU over rtnetlink";
    MediaRead => "failure to read provisioning media",
        "a CD-ROM with a disc could not be mounted (udf, iso9660) or its ovf-env.xml not read";
    OvfRead => "error reading ovf-env.xml",
        "the ovf-env.xml file given with `--ovf` cannot be read";
    OvfParse => "error parsing ovf-env.xml",
        "ovf-env.xml is not well-formed or misses a required element";
    PasswordLength => "unsupported password length",
        "UserPassword is longer than 72 characters";
    ProtectedSecret => "confidential VM protected secret not supported",
        "the admin password or the custom data is a confidential VM's protected secret (a JWT whose header has `x-az-cvm-purpose: secrets-provisioning`, sealed to the vTPM), which azprov cannot unseal yet; nothing is written from it";
    ProxyAgentNotFound => "azure-proxy-agent not found",
        "the VM was created with the Metadata Security Protocol (`ProvisionGuestProxyAgent`) and the root has no `/usr/sbin/azure-proxy-agent` or `/usr/bin/azure-proxy-agent`; sent from the initramfs, before any IMDS request";
    ProxyAgentStatus => "azure-proxy-agent status failure",
        "`azure-proxy-agent --status --wait 120` exited non-zero (2: the Guest Proxy Agent failed; 1: not done after 120 s); its exit code and message follow";
    ProxyAgentUnit => "azprov-msp.service not found",
        "the VM was created with the Metadata Security Protocol and the root has the Guest Proxy Agent but not azprov's `azprov-msp.service`, which finishes the provisioning after it (PID 1 mode with azprov not installed in the root)";
    ImdsTimeout => "connection timeout querying IMDS",
        "IMDS did not answer in time until the deadline";
    ImdsConnection => "connection error querying IMDS",
        "IMDS could not be reached (refused, unreachable, reset) until the deadline";
    ImdsHttp => "http error querying IMDS",
        "IMDS answered with a status that is fatal (400, 401, 403) or retried until the deadline";
    ImdsParse => "error parsing IMDS metadata",
        "IMDS answered 200 with a document that does not parse or is too large";
    NoProvisioningData => "failed to obtain provisioning data",
        "neither ovf-env.xml nor IMDS gave provisioning data (both causes follow as ovf= and imds=)";
    MissingCustomData => "failure to read customData that IMDS announces",
        "IMDS says the VM has custom data (`extended.compute.hasCustomData`) and ovf-env.xml brought none (no CD, a CD without CustomData, or one that could not be read)";
    NoHostname => "failed to determine hostname",
        "neither IMDS computerName nor ovf-env.xml HostName is set";
    InvalidHostname => "invalid hostname",
        "the hostname is not a valid host name";
    NoUsername => "failed to determine username",
        "neither IMDS adminUsername nor ovf-env.xml UserName is set";
    InvalidUsername => "invalid username",
        "the user name is not valid or names an existing system account";
    MountFstab => "failed to mount a filesystem from fstab",
        "a filesystem the root's /etc/fstab mounts on a path azprov writes under (/home, /var, /var/log) could not be found or mounted";
    WriteHostname => "failed to write hostname",
        "/etc/hostname or /etc/hosts could not be written";
    CreateUser => "failed to create user",
        "the account files, the home or the password could not be written";
    WriteKeys => "failed to write authorized_keys",
        "the user's authorized_keys could not be written";
    WriteSudoers => "failed to write sudoers",
        "/etc/sudoers.d/90-azprov, or the includedir /etc/sudoers needs, could not be written";
    WriteSshd => "failed to write sshd configuration",
        "/etc/ssh/sshd_config.d/50-azprov.conf, or sshd_config where it reads no drop-in first, could not be written";
    WriteCustomData => "failed to write custom data",
        "/var/lib/azprov/customdata could not be written";
    WriteUserData => "failed to write user data",
        "/var/lib/azprov/userdata could not be written";
    WriteImds => "failed to write instance metadata",
        "/var/lib/azprov/imds.json could not be written";
    WriteMarker => "failed to write provisioned marker",
        "/var/lib/azprov/provisioned could not be written";
    ReportFailed => "failed to report ready",
        "the health report itself failed; Azure cannot be told, so this appears only locally";
    Internal => "internal error",
        "a bug: azprov panicked while provisioning";
    BootRoot => "failed to boot the root filesystem",
        "PID 1 found no root device, could not mount it, or found no init in it; told over KVP only (no network is brought up without a root)";
    Operator => "reported by operator",
        "`azprov report failure --reason TEXT`; the operator's text follows as detail=";
}

impl Reason {
    /// The reason whose fixed string is `text` (the state file keeps the string).
    pub fn from_text(text: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == text)
    }

    /// What to check first, one line: the log, `azprov status` and the troubleshooting table
    /// of README.md show it. None where the reason says it all.
    pub const fn hint(self) -> Option<&'static str> {
        Some(match self {
            Reason::NoDhcpInterface => "check that the initramfs has the NIC's driver (hv_netvsc on Azure) and that azprov.iface= names a NIC that exists",
            Reason::DhcpLease => "check the NIC's link and driver; with Accelerated Networking the synthetic hv_netvsc NIC must be there beside the VF; a firewall in the initramfs must let DHCP (UDP 67/68) through",
            Reason::NetworkConfig => "the kernel refused the lease's address, route or MTU: check azprov.log=debug for the rtnetlink error",
            Reason::MediaRead => "check that the initramfs has the CD drivers and filesystems (sr_mod, cdrom, udf, isofs; ata_piix on Gen1)",
            Reason::OvfRead | Reason::OvfParse => "validate the file with `azprov ovf FILE`",
            Reason::PasswordLength => "choose an admin password of at most 72 characters",
            Reason::ProtectedSecret => "create the VM without protected secrets (SSH keys instead of the sealed password, plain custom data)",
            Reason::ProxyAgentNotFound => "put the Guest Proxy Agent (azure-proxy-agent) into the image, or create the VM without MSP and enable it afterwards",
            Reason::ProxyAgentStatus => "journalctl -u azure-proxy-agent: the Guest Proxy Agent could not get its key from the host; check the VM's proxyAgentSettings",
            Reason::ProxyAgentUnit => "install azprov's package into the root (it ships azprov-msp.service), or create the VM without MSP",
            Reason::ImdsTimeout | Reason::ImdsConnection | Reason::ImdsHttp => "IMDS (169.254.169.254) must be reachable directly: no proxy, and no firewall or route in the image that diverts link-local traffic",
            Reason::ImdsParse => "IMDS answered with a document azprov cannot read: run `azprov imds --json` for the parse error",
            Reason::NoProvisioningData => "neither the provisioning CD nor IMDS was readable: see the ovf= and imds= causes",
            Reason::NoHostname | Reason::InvalidHostname => "set a valid computer name (letters, digits, hyphens; at most 64 characters) when creating the VM",
            Reason::NoUsername | Reason::InvalidUsername => "choose an admin user name that is valid and not a system account of the image (root, daemon, …)",
            Reason::MountFstab => "a filesystem in the image's /etc/fstab (e.g. /home or /var) was not found: activate its volume in the initramfs (dracut: rd.lvm.lv=VG/LV) or fix the fstab line",
            Reason::WriteHostname | Reason::CreateUser | Reason::WriteKeys | Reason::WriteSudoers | Reason::WriteSshd | Reason::WriteCustomData | Reason::WriteUserData | Reason::WriteImds | Reason::WriteMarker => "check the path and errno in the cause: a read-only or full root filesystem, or a file the image made immutable",
            Reason::ReportFailed => "the WireServer (168.63.129.16:80) must be reachable: a firewall, proxy or missing route in the image is the usual cause",
            Reason::MissingCustomData => "the VM has custom data: the initramfs needs the CD's drivers and udf (or isofs), and the CD must be readable",
            Reason::BootRoot => "check root= on the kernel command line and that the initramfs has the disk's driver (nvme, hv_storvsc) and filesystem",
            Reason::Internal => "a bug in azprov: please report it with /var/log/azprov.log",
            Reason::Operator => return None,
        })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Why provisioning failed: the [`Reason`] Azure is told, the detail for the log (never a
/// secret), and key=value pairs that go into the description as supporting data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub detail: String,
    pub extra: Vec<(&'static str, String)>,
    /// The stage of the run it came from (`media`, `dhcp`, `write` …), once one is known.
    pub stage: Option<&'static str>,
}

impl Failure {
    pub fn new(reason: Reason, detail: impl fmt::Display) -> Self {
        Failure {
            reason,
            detail: detail.to_string(),
            extra: Vec::new(),
            stage: None,
        }
    }

    /// This failure with one more key=value of supporting data for the description.
    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.extra.push((key, value.into()));
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(self.reason.as_str())
        } else {
            write!(f, "{}: {}", self.reason, self.detail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole set Azure can receive. Changing a string changes what users see in the
    /// portal and what their tooling matches: do it here, on purpose, and in docs/contracts.md.
    #[test]
    fn the_reason_table() {
        let table: Vec<(Reason, &str)> = Reason::ALL.iter().map(|r| (*r, r.as_str())).collect();
        assert_eq!(
            table,
            [
                (Reason::NoDhcpInterface, "failure to find DHCP interface"),
                (Reason::DhcpLease, "failure to obtain DHCP lease"),
                (Reason::NetworkConfig, "failure to configure network"),
                (Reason::MediaRead, "failure to read provisioning media"),
                (Reason::OvfRead, "error reading ovf-env.xml"),
                (Reason::OvfParse, "error parsing ovf-env.xml"),
                (Reason::PasswordLength, "unsupported password length"),
                (
                    Reason::ProtectedSecret,
                    "confidential VM protected secret not supported"
                ),
                (Reason::ProxyAgentNotFound, "azure-proxy-agent not found"),
                (Reason::ProxyAgentStatus, "azure-proxy-agent status failure"),
                (Reason::ProxyAgentUnit, "azprov-msp.service not found"),
                (Reason::ImdsTimeout, "connection timeout querying IMDS"),
                (Reason::ImdsConnection, "connection error querying IMDS"),
                (Reason::ImdsHttp, "http error querying IMDS"),
                (Reason::ImdsParse, "error parsing IMDS metadata"),
                (
                    Reason::NoProvisioningData,
                    "failed to obtain provisioning data"
                ),
                (
                    Reason::MissingCustomData,
                    "failure to read customData that IMDS announces"
                ),
                (Reason::NoHostname, "failed to determine hostname"),
                (Reason::InvalidHostname, "invalid hostname"),
                (Reason::NoUsername, "failed to determine username"),
                (Reason::InvalidUsername, "invalid username"),
                (
                    Reason::MountFstab,
                    "failed to mount a filesystem from fstab"
                ),
                (Reason::WriteHostname, "failed to write hostname"),
                (Reason::CreateUser, "failed to create user"),
                (Reason::WriteKeys, "failed to write authorized_keys"),
                (Reason::WriteSudoers, "failed to write sudoers"),
                (Reason::WriteSshd, "failed to write sshd configuration"),
                (Reason::WriteCustomData, "failed to write custom data"),
                (Reason::WriteUserData, "failed to write user data"),
                (Reason::WriteImds, "failed to write instance metadata"),
                (Reason::WriteMarker, "failed to write provisioned marker"),
                (Reason::ReportFailed, "failed to report ready"),
                (Reason::Internal, "internal error"),
                (Reason::BootRoot, "failed to boot the root filesystem"),
                (Reason::Operator, "reported by operator"),
            ]
        );
    }

    #[test]
    fn reason_strings_fit_the_description_syntax() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            let s = r.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(!s.contains(['|', '\'', '=', '\n']), "{s}");
            assert!(!r.when().is_empty());
            assert_eq!(Reason::from_text(s), Some(*r));
            if let Some(h) = r.hint() {
                assert!(!h.contains('\n') && h.len() < 200, "{s}: one short line");
            }
        }
    }

    /// README.md's troubleshooting table carries every hint beside its reason.
    #[test]
    fn the_readme_says_what_to_check_for_every_reason() {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"));
        for r in Reason::ALL {
            let Some(h) = r.hint() else { continue };
            let row = readme
                .lines()
                .find(|l| l.starts_with("| ") && l.contains(&format!("`{}`", r.as_str())))
                .unwrap_or_else(|| panic!("README.md has no row for {r}"));
            assert!(row.contains(h), "README.md's row for {r} lacks: {h}");
        }
    }

    /// docs/contracts.md carries the same table; it must not drift from the enum.
    #[test]
    fn the_design_document_lists_every_reason() {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/contracts.md"));
        for r in Reason::ALL {
            let row = format!("| `{}` | {} |", r.as_str(), r.when());
            assert!(doc.contains(&row), "docs/contracts.md lacks the row: {row}");
        }
    }
}
