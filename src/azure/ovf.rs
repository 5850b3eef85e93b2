//! ovf-env.xml from the provisioning CD (docs/contracts.md, "Protocol rules").
//!
//! Matched by namespace URI and local name: real files use `wa:`, `ns1:`, the default
//! namespace, and mixes of them. The password is held as a [`Secret`] and never printed.

use super::reason::Reason;
use super::xml::{self, Element};
use super::WA_NS;
use crate::secret::Secret;
use base64::Engine;
use std::fmt;

/// Azure refuses longer passwords too (cloud-init `MAX_PASSWORD_LENGTH`).
pub const MAX_PASSWORD_CHARS: usize = 72;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvfKey {
    pub fingerprint: Option<String>,
    pub path: Option<String>,
    /// The inline OpenSSH public key; absent when only a certificate fingerprint is given.
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvfEnv {
    pub hostname: String,
    pub username: Option<String>,
    pub password: Option<Secret<String>>,
    pub disable_ssh_password_auth: Option<bool>,
    pub ssh_keys: Vec<OvfKey>,
    pub custom_data: Option<Secret<Vec<u8>>>,
    pub preprovisioned_vm: bool,
    pub pps_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvfError {
    NotXml(super::xml::XmlError),
    NotAzure,
    Missing(&'static str),
    Duplicate(String),
    PasswordTooLong(usize),
    BadValue {
        element: &'static str,
        detail: String,
    },
}

impl fmt::Display for OvfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OvfError::NotXml(e) => write!(f, "ovf-env.xml is not well-formed XML: {e}"),
            OvfError::NotAzure => {
                write!(f, "ovf-env.xml has no Azure ProvisioningSection ({WA_NS})")
            }
            OvfError::Missing(el) => write!(f, "ovf-env.xml has no {el}"),
            OvfError::Duplicate(el) => write!(f, "ovf-env.xml has more than one {el}"),
            OvfError::PasswordTooLong(n) => write!(
                f,
                "unsupported password length={n} max={MAX_PASSWORD_CHARS}"
            ),
            OvfError::BadValue { element, detail } => {
                write!(f, "ovf-env.xml has an invalid {element}: {detail}")
            }
        }
    }
}

impl std::error::Error for OvfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OvfError::NotXml(e) => Some(e),
            _ => None,
        }
    }
}

impl OvfError {
    /// What Azure is told.
    pub fn reason(&self) -> Reason {
        match self {
            OvfError::PasswordTooLong(_) => Reason::PasswordLength,
            _ => Reason::OvfParse,
        }
    }
}

/// Parses ovf-env.xml bytes.
pub fn parse(bytes: &[u8]) -> Result<OvfEnv, OvfError> {
    let root = xml::parse(bytes).map_err(OvfError::NotXml)?;
    let prov = single_wa(&root, "ProvisioningSection")?.ok_or(OvfError::NotAzure)?;
    let set = unique(prov, "LinuxProvisioningConfigurationSet")?
        .ok_or(OvfError::Missing("LinuxProvisioningConfigurationSet"))?;

    let hostname = text(set, "HostName")?.ok_or(OvfError::Missing("HostName"))?;
    // IMDS carries adminUsername too: the merge fails only when no source names a user.
    let username = text(set, "UserName")?;
    let password = match raw_text(set, "UserPassword")? {
        Some(p) if p.chars().count() > MAX_PASSWORD_CHARS => {
            return Err(OvfError::PasswordTooLong(p.chars().count()))
        }
        Some(p) => Some(Secret::new(p)),
        None => None,
    };
    let disable_ssh_password_auth = match text(set, "DisableSshPasswordAuthentication")? {
        Some(v) => Some(parse_bool("DisableSshPasswordAuthentication", &v)?),
        None => None,
    };
    let custom_data = match text(set, "CustomData")? {
        Some(v) => Some(Secret::new(decode_base64("CustomData", &v)?)),
        None => None,
    };
    let ssh_keys = match unique(set, "SSH")?
        .map(|s| unique(s, "PublicKeys"))
        .transpose()?
    {
        Some(Some(keys)) => keys
            .children_named("PublicKey")
            .map(|k| {
                Ok(OvfKey {
                    fingerprint: text(k, "Fingerprint")?,
                    path: text(k, "Path")?,
                    value: text(k, "Value")?,
                })
            })
            .collect::<Result<_, OvfError>>()?,
        _ => Vec::new(),
    };

    let (mut preprovisioned_vm, mut pps_type) = (false, None);
    if let Some(settings) = single_wa(&root, "PlatformSettingsSection")? {
        if let Some(ps) = unique(settings, "PlatformSettings")? {
            if let Some(v) = text(ps, "PreprovisionedVm")? {
                preprovisioned_vm = parse_bool("PreprovisionedVm", &v)?;
            }
            // cloud-init reads `PreprovisionedVMType`; azure-init's samples spell it `Vm`.
            let a = text(ps, "PreprovisionedVMType")?;
            let b = text(ps, "PreprovisionedVmType")?;
            if a.is_some() && b.is_some() {
                return Err(OvfError::Duplicate("PreprovisionedVMType".into()));
            }
            pps_type = a.or(b);
        }
    }

    Ok(OvfEnv {
        hostname,
        username,
        password,
        disable_ssh_password_auth,
        ssh_keys,
        custom_data,
        preprovisioned_vm,
        pps_type,
    })
}

/// The one section with this local name directly under the root, in the Azure namespace.
fn single_wa<'a>(root: &'a Element, local: &str) -> Result<Option<&'a Element>, OvfError> {
    let mut found = root.children.iter().filter(|c| c.is(WA_NS, local));
    let first = found.next();
    if found.next().is_some() {
        return Err(OvfError::Duplicate(local.to_string()));
    }
    Ok(first)
}

/// The one child with this local name (any namespace: PlatformSettings come in either).
fn unique<'a>(parent: &'a Element, local: &str) -> Result<Option<&'a Element>, OvfError> {
    let mut found = parent.children.iter().filter(|c| c.local == local);
    let first = found.next();
    if found.next().is_some() {
        return Err(OvfError::Duplicate(local.to_string()));
    }
    Ok(first)
}

/// The trimmed text of a unique child; an empty element counts as absent.
fn text(parent: &Element, local: &str) -> Result<Option<String>, OvfError> {
    Ok(unique(parent, local)?
        .map(|e| e.trimmed().to_string())
        .filter(|t| !t.is_empty()))
}

/// The exact text of a unique child (UserPassword: spaces at the ends are part of it).
fn raw_text(parent: &Element, local: &str) -> Result<Option<String>, OvfError> {
    Ok(unique(parent, local)?
        .map(|e| e.text.clone())
        .filter(|t| !t.is_empty()))
}

fn parse_bool(element: &'static str, v: &str) -> Result<bool, OvfError> {
    match v.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(OvfError::BadValue {
            element,
            detail: format!("expected true or false, got {v:?}"),
        }),
    }
}

/// Standard base64 with any whitespace inside (line-wrapped CustomData is common).
pub fn decode_base64(element: &'static str, v: &str) -> Result<Vec<u8>, OvfError> {
    let compact: String = v.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|_| OvfError::BadValue {
            element,
            detail: "not valid base64".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(env: &OvfEnv) -> Vec<&str> {
        env.ssh_keys
            .iter()
            .filter_map(|k| k.value.as_deref())
            .collect()
    }

    #[test]
    fn wala_sample_with_wa_prefix_and_default_namespace_children() {
        let env = parse(fixture!("ovf", "wala.xml")).unwrap();
        assert_eq!(env.hostname, "vm-wala");
        assert_eq!(env.username.as_deref(), Some("azureuser"));
        assert_eq!(env.password.as_ref().unwrap().expose(), "S3cr3t&Pass");
        assert_eq!(env.disable_ssh_password_auth, Some(false));
        assert_eq!(values(&env), ["ssh-rsa AAAANOTAREALKEY== foo@bar.local"]);
        assert_eq!(env.ssh_keys.len(), 2);
        assert_eq!(env.ssh_keys[1].value, None);
        assert_eq!(
            env.ssh_keys[0].fingerprint.as_deref(),
            Some("EB0C0AB4B2D5FC35F2F0658D19F44C8283E2DD62")
        );
        assert_eq!(
            env.custom_data.unwrap().expose().as_slice(),
            b"#cloud-config\nruncmd: [echo, hi]\n"
        );
        assert!(!env.preprovisioned_vm);
        assert_eq!(env.pps_type, None);
    }

    #[test]
    fn ns1_prefix_everywhere_with_pps() {
        let env = parse(fixture!("ovf", "ns1.xml")).unwrap();
        assert_eq!(env.hostname, "vm-ns1");
        assert_eq!(env.username.as_deref(), Some("myuser"));
        assert!(env.password.is_none());
        assert_eq!(env.disable_ssh_password_auth, Some(true));
        assert_eq!(
            values(&env),
            [
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2 first",
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK3 second"
            ]
        );
        assert!(env.preprovisioned_vm);
        assert_eq!(env.pps_type.as_deref(), Some("Savable"));
    }

    #[test]
    fn bom_crlf_mixed_namespaces_empty_password_wrapped_base64() {
        let env = parse(fixture!("ovf", "mixed-crlf-bom.xml")).unwrap();
        assert_eq!(env.hostname, "vm-mixed");
        assert_eq!(env.username.as_deref(), Some("mixeduser"));
        assert!(
            env.password.is_none(),
            "an empty <UserPassword/> is no password"
        );
        assert_eq!(env.disable_ssh_password_auth, None);
        assert_eq!(
            env.custom_data.unwrap().expose().as_slice(),
            b"Hello, world!"
        );
        assert_eq!(env.pps_type.as_deref(), Some("None"));
        assert!(env.ssh_keys.is_empty());
    }

    #[test]
    fn minimal_document() {
        let env = parse(fixture!("ovf", "minimal.xml")).unwrap();
        assert_eq!(
            (
                env.hostname.as_str(),
                env.username.as_deref().unwrap_or_default()
            ),
            ("vm-min", "minuser")
        );
        assert!(env.custom_data.is_none());
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            parse(fixture!("ovf", "not-xml.xml")),
            Err(OvfError::NotXml(_))
        ));
        assert_eq!(
            parse(fixture!("ovf", "not-azure.xml")),
            Err(OvfError::NotAzure)
        );
        assert_eq!(
            parse(fixture!("ovf", "no-hostname.xml")),
            Err(OvfError::Missing("HostName"))
        );
        assert_eq!(
            parse(fixture!("ovf", "no-username.xml")).unwrap().username,
            None
        );
        assert_eq!(
            parse(fixture!("ovf", "duplicate-hostname.xml")),
            Err(OvfError::Duplicate("HostName".into()))
        );
        assert_eq!(
            parse(fixture!("ovf", "long-password.xml")),
            Err(OvfError::PasswordTooLong(73))
        );
        assert!(matches!(
            parse(fixture!("ovf", "bad-customdata.xml")),
            Err(OvfError::BadValue {
                element: "CustomData",
                ..
            })
        ));
        assert!(matches!(parse(b"<Environment/>"), Err(OvfError::NotAzure)));
    }

    #[test]
    fn password_of_exactly_72_chars_is_accepted() {
        let doc =
            String::from_utf8_lossy(fixture!("ovf", "long-password.xml")).replacen("pp", "p", 1);
        let env = parse(doc.as_bytes()).unwrap();
        assert_eq!(env.password.unwrap().expose().chars().count(), 72);
    }

    #[test]
    fn errors_and_debug_never_show_the_password() {
        let env = parse(fixture!("ovf", "wala.xml")).unwrap();
        let dbg = format!("{env:?}");
        assert!(!dbg.contains("S3cr3t"));
        assert!(!dbg.contains("cloud-config"));
        let err = parse(fixture!("ovf", "long-password.xml"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("ppp"), "{err}");
    }
}
