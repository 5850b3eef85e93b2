//! The IMDS instance document (docs/contracts.md, "Protocol rules"). Every primitive arrives
//! as a string (`"true"`); keys may carry CR/LF; userData is base64.

use super::http::{Class, Client, HttpError, Method, Request};
use crate::deadline::Deadline;
use crate::secret::Secret;
use base64::Engine;
use serde::Deserialize;

pub const DEFAULT_BASE: &str = "http://169.254.169.254";
/// `extended=true` makes IMDS fail instead of answering partial data (azure-init #134).
pub const INSTANCE_PATH: &str = "/metadata/instance?api-version=2023-11-15&extended=true";
/// What an IMDS that answers 400 to the current api-version gets asked once more (cloud-init
/// falls back the same way); `extended` is newer than this version, so it is left out.
pub const FALLBACK_PATH: &str = "/metadata/instance?api-version=2021-02-01";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImdsKey {
    /// The OpenSSH key with every CR and LF removed.
    pub data: String,
    pub path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imds {
    pub vm_id: String,
    pub computer_name: Option<String>,
    pub admin_username: Option<String>,
    pub disable_password_auth: Option<bool>,
    pub ssh_keys: Vec<ImdsKey>,
    pub user_data: Option<Secret<Vec<u8>>>,
    pub location: Option<String>,
    pub vm_size: Option<String>,
    pub has_custom_data: Option<bool>,
    pub pps_type: Option<String>,
    /// The document as received, for /var/lib/azprov/imds.json (it may hold userData).
    pub raw: Secret<Vec<u8>>,
}

#[derive(Deserialize)]
struct Doc {
    compute: Compute,
    #[serde(default)]
    extended: Option<Extended>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Compute {
    #[serde(default)]
    vm_id: String,
    #[serde(default)]
    os_profile: Option<OsProfile>,
    #[serde(default)]
    public_keys: Vec<PublicKey>,
    #[serde(default)]
    user_data: Option<String>,
    #[serde(default)]
    location: Option<String>,
    #[serde(default)]
    vm_size: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OsProfile {
    #[serde(default)]
    admin_username: Option<String>,
    #[serde(default)]
    computer_name: Option<String>,
    #[serde(default)]
    disable_password_authentication: Option<Flag>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PublicKey {
    #[serde(default)]
    key_data: String,
    #[serde(default)]
    path: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Extended {
    #[serde(default)]
    compute: Option<ExtendedCompute>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExtendedCompute {
    #[serde(default)]
    has_custom_data: Option<Flag>,
    #[serde(default)]
    pps_type: Option<String>,
}

/// A boolean as IMDS sends it: `"true"`, `"false"`, `""`, or (in `extended`) a real bool.
#[derive(Deserialize)]
#[serde(untagged)]
enum Flag {
    Bool(bool),
    Text(String),
}

impl Flag {
    fn get(&self) -> Result<Option<bool>, &'static str> {
        match self {
            Flag::Bool(b) => Ok(Some(*b)),
            Flag::Text(t) if t.is_empty() => Ok(None),
            Flag::Text(t) if t.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Flag::Text(t) if t.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Flag::Text(_) => Err("expected \"true\" or \"false\""),
        }
    }
}

/// Why an IMDS document was refused. Never holds a value from it: userData could be one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImdsError {
    /// Not JSON of the expected shape, at this position.
    NotJson {
        line: usize,
        column: usize,
        class: serde_json::error::Category,
    },
    /// A key whose value is missing or malformed (`compute.vmId`, `userData`, …).
    BadKey {
        key: &'static str,
        why: &'static str,
    },
}

impl std::fmt::Display for ImdsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImdsError::NotJson {
                line,
                column,
                class,
            } => write!(
                f,
                "invalid IMDS document (line {line} column {column}): {class:?}"
            ),
            ImdsError::BadKey { key, why } => {
                write!(f, "invalid IMDS metadata for key={key}: {why}")
            }
        }
    }
}

impl std::error::Error for ImdsError {}

fn non_empty(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Parses the instance document.
pub fn parse(bytes: &[u8]) -> Result<Imds, ImdsError> {
    // serde_json's messages quote at most a token, never a whole value; but userData could be
    // that token, so the error keeps only its position.
    let doc: Doc = serde_json::from_slice(bytes).map_err(|e| ImdsError::NotJson {
        line: e.line(),
        column: e.column(),
        class: e.classify(),
    })?;
    let c = doc.compute;
    if c.vm_id.trim().is_empty() {
        return Err(ImdsError::BadKey {
            key: "compute.vmId",
            why: "empty",
        });
    }
    let (admin_username, computer_name, disable_password_auth) = match c.os_profile {
        Some(p) => (
            non_empty(p.admin_username),
            non_empty(p.computer_name),
            match p.disable_password_authentication {
                Some(f) => f.get().map_err(|why| ImdsError::BadKey {
                    key: "osProfile.disablePasswordAuthentication",
                    why,
                })?,
                None => None,
            },
        ),
        None => (None, None, None),
    };
    let ssh_keys = c
        .public_keys
        .into_iter()
        .map(|k| ImdsKey {
            data: k
                .key_data
                .chars()
                .filter(|c| *c != '\r' && *c != '\n')
                .collect::<String>()
                .trim()
                .to_string(),
            path: non_empty(k.path),
        })
        .filter(|k| !k.data.is_empty())
        .collect();
    let user_data = match non_empty(c.user_data) {
        Some(b64) => {
            let compact: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(compact.as_bytes())
                .map_err(|_| ImdsError::BadKey {
                    key: "userData",
                    why: "not base64",
                })?;
            Some(Secret::new(bytes))
        }
        None => None,
    };
    let ext = doc.extended.and_then(|e| e.compute);
    let (has_custom_data, pps_type) = match ext {
        Some(e) => (
            e.has_custom_data.and_then(|f| f.get().ok().flatten()),
            non_empty(e.pps_type),
        ),
        None => (None, None),
    };
    Ok(Imds {
        vm_id: c.vm_id.trim().to_ascii_lowercase(),
        computer_name,
        admin_username,
        disable_password_auth,
        ssh_keys,
        user_data,
        location: non_empty(c.location),
        vm_size: non_empty(c.vm_size),
        has_custom_data,
        pps_type,
        raw: Secret::new(bytes.to_vec()),
    })
}

/// GETs the instance document from `base` (e.g. `http://169.254.169.254`) with the IMDS retry
/// class, until it parses or the deadline passes.
pub fn fetch(client: &Client, base: &str, deadline: Deadline) -> Result<Imds, HttpError> {
    let base = base.trim_end_matches('/');
    let get = |path: &str| {
        let url = format!("{base}{path}");
        let req = Request {
            method: Method::Get,
            url: &url,
            headers: &[("Metadata", "true")],
            body: &[],
        };
        client.fetch(Class::Imds, &req, deadline, parse)
    };
    match get(INSTANCE_PATH) {
        Err(e) if e.status() == Some(400) => {
            log::info!("IMDS refused api-version 2023-11-15 (400); asking for 2021-02-01");
            get(FALLBACK_PATH)
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_document_with_string_booleans() {
        let m = parse(fixture!("imds", "full.json")).unwrap();
        assert_eq!(m.vm_id, "12345678-90ab-cdef-1234-567890abcdef");
        assert_eq!(m.computer_name.as_deref(), Some("temp-vm"));
        assert_eq!(m.admin_username.as_deref(), Some("azureuser"));
        assert_eq!(m.disable_password_auth, Some(true));
        assert_eq!(m.location.as_deref(), Some("eastus2"));
        assert_eq!(m.vm_size.as_deref(), Some("Standard_D2ds_v5"));
        assert_eq!(m.has_custom_data, Some(false));
        assert_eq!(m.pps_type.as_deref(), Some("None"));
        assert_eq!(
            m.user_data.unwrap().expose().as_slice(),
            b"#!/bin/sh\necho hello\n"
        );
        assert_eq!(m.ssh_keys.len(), 2);
        assert_eq!(
            m.ssh_keys[0].path.as_deref(),
            Some("/home/azureuser/.ssh/authorized_keys")
        );
    }

    #[test]
    fn keys_lose_trailing_and_embedded_crlf() {
        let m = parse(fixture!("imds", "full.json")).unwrap();
        assert_eq!(
            m.ssh_keys[0].data,
            "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7== azureuser@temp-vm"
        );
        assert_eq!(m.ssh_keys[1].data, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl second@laptop");
    }

    #[test]
    fn empty_user_data_and_missing_os_profile() {
        let m = parse(fixture!("imds", "no-osprofile.json")).unwrap();
        assert!(m.user_data.is_none());
        assert!(m.computer_name.is_none() && m.admin_username.is_none());
        assert_eq!(m.disable_password_auth, None);
        assert!(m.ssh_keys.is_empty());
        assert_eq!(m.vm_id, "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
    }

    #[test]
    fn refusals() {
        assert!(parse(b"").is_err());
        assert!(matches!(
            parse(b"{\"compute\": {}}").unwrap_err(),
            ImdsError::BadKey {
                key: "compute.vmId",
                ..
            }
        ));
        assert!(parse(b"{\"compute\": {\"vmId\": \"x\", \"osProfile\": {\"disablePasswordAuthentication\": \"maybe\"}}}").is_err());
        assert_eq!(
            parse(b"{\"compute\": {\"vmId\": \"x\", \"userData\": \"!!\"}}").unwrap_err(),
            ImdsError::BadKey {
                key: "userData",
                why: "not base64"
            }
        );
        // a truncated body (the fabric's fault playbook cuts bodies) is an error, not a panic
        let full = fixture!("imds", "full.json");
        assert!(parse(&full[..full.len() / 2]).is_err());
    }

    #[test]
    fn debug_hides_user_data_and_the_raw_document() {
        let m = parse(fixture!("imds", "full.json")).unwrap();
        let d = format!("{m:?}");
        assert!(!d.contains("echo hello") && !d.contains("IyEv"), "{d}");
    }
}
