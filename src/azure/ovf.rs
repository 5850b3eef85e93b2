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
    /// `ProvisionGuestProxyAgent`: the VM was created with the Metadata Security Protocol, so
    /// the Guest Proxy Agent must hold its key before anything asks the WireServer or IMDS
    /// (docs/contracts.md, "The Metadata Security Protocol").
    pub provision_guest_proxy_agent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvfError {
    NotXml(super::xml::XmlError),
    NotAzure,
    Missing(&'static str),
    Duplicate(String),
    PasswordTooLong(usize),
    /// A confidential VM's protected secret (a JWT sealed to the vTPM) in this element.
    ProtectedSecret(&'static str),
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
            OvfError::ProtectedSecret(el) => write!(
                f,
                "{el} is a confidential VM's protected secret (a JWT for secrets-provisioning, \
                 sealed to the vTPM), which azprov cannot unseal yet"
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
            OvfError::ProtectedSecret(_) => Reason::ProtectedSecret,
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
        // before the length: a sealed password is long, and its length is not the cause
        Some(p) if is_protected_secret(p.trim().as_bytes()) => {
            return Err(OvfError::ProtectedSecret("UserPassword"))
        }
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
        Some(v) if is_protected_secret(v.as_bytes()) => {
            return Err(OvfError::ProtectedSecret("CustomData"))
        }
        Some(v) => {
            let bytes = decode_base64("CustomData", &v)?;
            if is_protected_secret(bytes.trim_ascii()) {
                return Err(OvfError::ProtectedSecret("CustomData"));
            }
            Some(Secret::new(bytes))
        }
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
    let mut provision_guest_proxy_agent = false;
    if let Some(settings) = single_wa(&root, "PlatformSettingsSection")? {
        if let Some(ps) = unique(settings, "PlatformSettings")? {
            if let Some(v) = text(ps, "ProvisionGuestProxyAgent")? {
                provision_guest_proxy_agent = parse_bool("ProvisionGuestProxyAgent", &v)?;
            }
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
        provision_guest_proxy_agent,
    })
}

/// The header a confidential VM's protected secret carries (a JWS or JWE in compact form).
const PROTECTED_PURPOSE: (&str, &str) = ("x-az-cvm-purpose", "secrets-provisioning");

/// Whether `text` is a protected secret: a compact JWT (three parts, or five for an encrypted
/// one) of base64url parts whose header is a JSON object with `x-az-cvm-purpose:
/// secrets-provisioning`. Only the header is decoded; the rest is never looked into.
pub fn is_protected_secret(text: &[u8]) -> bool {
    let parts: Vec<&[u8]> = text.split(|b| *b == b'.').collect();
    let base64url = |p: &[u8]| {
        p.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'='))
    };
    let [header, ..] = parts.as_slice() else {
        return false;
    };
    if !matches!(parts.len(), 3 | 5) || header.is_empty() || !parts.iter().all(|p| base64url(p)) {
        return false;
    }
    let unpadded: Vec<u8> = header.iter().copied().filter(|b| *b != b'=').collect();
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(unpadded) else {
        return false;
    };
    let Ok(serde_json::Value::Object(header)) = serde_json::from_slice(&json) else {
        return false;
    };
    let (key, purpose) = PROTECTED_PURPOSE;
    header.get(key).and_then(|v| v.as_str()) == Some(purpose)
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
    fn the_metadata_security_protocol_flag() {
        let env = parse(fixture!("ovf", "msp.xml")).unwrap();
        assert!(env.provision_guest_proxy_agent);
        // absent, and false, in Azure's other samples
        for f in [&fixture!("ovf", "wala.xml")[..], fixture!("ovf", "ns1.xml")] {
            assert!(!parse(f).unwrap().provision_guest_proxy_agent);
        }
        let bad = String::from_utf8_lossy(fixture!("ovf", "msp.xml")).replace(">true<", ">yes<");
        assert!(matches!(
            parse(bad.as_bytes()),
            Err(OvfError::BadValue {
                element: "ProvisionGuestProxyAgent",
                ..
            })
        ));
    }

    /// A compact JWT with this header and opaque parts.
    fn jwt(header: &str, parts: usize) -> String {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut p = vec![URL_SAFE_NO_PAD.encode(header)];
        p.extend((1..parts).map(|i| URL_SAFE_NO_PAD.encode(vec![i as u8; 40])));
        p.join(".")
    }

    #[test]
    fn protected_secrets_are_recognised_by_their_header_only() {
        let purpose =
            r#"{"alg":"RSA-OAEP-256","enc":"A256GCM","x-az-cvm-purpose":"secrets-provisioning"}"#;
        assert!(is_protected_secret(jwt(purpose, 5).as_bytes()));
        assert!(is_protected_secret(jwt(purpose, 3).as_bytes()));
        // padding some encoders leave on
        assert!(is_protected_secret(
            format!("{}==", jwt(purpose, 3)).as_bytes()
        ));
        for not in [
            jwt(r#"{"alg":"RS256","typ":"JWT"}"#, 3),
            jwt(r#"{"x-az-cvm-purpose":"something-else"}"#, 3),
            jwt(r#"["x-az-cvm-purpose","secrets-provisioning"]"#, 3),
            jwt(purpose, 2),
            jwt(purpose, 4),
            format!("{}.a b.c", jwt(purpose, 1)),
            "correct.horse.battery".into(),
            "P@ss.w0rd.!".into(),
            "..".into(),
            String::new(),
        ] {
            assert!(!is_protected_secret(not.as_bytes()), "{not}");
        }
    }

    #[test]
    fn a_protected_password_is_named_not_measured() {
        let err = parse(fixture!("ovf", "protected-password.xml")).unwrap_err();
        assert_eq!(err, OvfError::ProtectedSecret("UserPassword"));
        assert_eq!(err.reason(), Reason::ProtectedSecret);
        let text = err.to_string();
        assert!(
            !text.contains("length") && text.contains("protected secret"),
            "{text}"
        );
        // a plain password over the limit keeps its reason
        assert_eq!(
            parse(fixture!("ovf", "long-password.xml"))
                .unwrap_err()
                .reason(),
            Reason::PasswordLength
        );
    }

    #[test]
    fn protected_custom_data_is_named_whether_or_not_base64_wraps_it() {
        use base64::engine::general_purpose::STANDARD;
        let purpose = r#"{"alg":"dir","enc":"A256GCM","x-az-cvm-purpose":"secrets-provisioning"}"#;
        let token = jwt(purpose, 5);
        let minimal = String::from_utf8_lossy(fixture!("ovf", "minimal.xml")).into_owned();
        for value in [token.clone(), STANDARD.encode(format!("{token}\n"))] {
            let doc = minimal.replace(
                "</wa:UserName>",
                &format!("</wa:UserName><wa:CustomData>{value}</wa:CustomData>"),
            );
            assert_eq!(
                parse(doc.as_bytes()).unwrap_err(),
                OvfError::ProtectedSecret("CustomData")
            );
        }
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
