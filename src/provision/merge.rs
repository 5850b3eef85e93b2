//! Merging ovf-env.xml and IMDS into one validated [`ProvisioningData`], keeping where each
//! value came from. IMDS wins where both have a value (docs/contracts.md, "The file
//! contract"); the password and custom data exist only in ovf-env.xml, user data only in IMDS.

use super::data::{
    Hostname, Invalid, KeyEntry, ProvisioningData, Source, SshKey, Username, SSH_KEYS_MAX,
};
use super::{Failure, Reason};
use crate::azure::imds::Imds;
use crate::azure::ovf::OvfEnv;

/// `ovf`: Ok(None) when there was no provisioning media. Causes are already Failures.
pub fn merge(
    ovf: &Result<Option<OvfEnv>, Failure>,
    imds: &Result<Imds, Failure>,
) -> Result<ProvisioningData, Failure> {
    let ovf_env = match ovf {
        Ok(o) => o.as_ref(),
        // An Azure ovf-env.xml that does not parse (or holds a password Azure cannot apply)
        // fails the run, as in cloud-init: going on with IMDS alone would drop the password
        // and the custom data silently. A disc that could not be read is only a missing source.
        Err(f)
            if matches!(
                f.reason,
                Reason::OvfParse | Reason::PasswordLength | Reason::ProtectedSecret
            ) =>
        {
            return Err(f.clone())
        }
        Err(_) => None,
    };
    let imds = imds.as_ref();
    if imds.is_err() && ovf_env.is_none() {
        let ovf_cause = match ovf {
            Ok(_) => "no provisioning media".to_string(),
            Err(f) => f.to_string(),
        };
        let imds_cause = imds.err().map(|f| f.to_string()).unwrap_or_default();
        let mut f = Failure::new(
            Reason::NoProvisioningData,
            format!("ovf-env.xml: {ovf_cause}; IMDS: {imds_cause}"),
        );
        f.extra = vec![("ovf", ovf_cause), ("imds", imds_cause)];
        return Err(f);
    }
    let m = imds.ok();

    let hostname = pick(
        m.and_then(|m| m.computer_name.as_deref()),
        ovf_env.map(|o| o.hostname.as_str()),
        (Reason::NoHostname, Reason::InvalidHostname),
        Hostname::parse,
    )?;
    let username = pick(
        m.and_then(|m| m.admin_username.as_deref()),
        ovf_env.and_then(|o| o.username.as_deref()),
        (Reason::NoUsername, Reason::InvalidUsername),
        Username::parse,
    )?;

    let mut keys: Vec<KeyEntry> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut over = 0usize;
    let imds_keys = m.map(|m| {
        m.ssh_keys
            .iter()
            .map(|k| (k.data.as_str(), k.path.clone(), Source::Imds))
    });
    let ovf_keys = ovf_env.map(|o| {
        o.ssh_keys
            .iter()
            .filter_map(|k| k.value.as_deref().map(|v| (v, k.path.clone(), Source::Ovf)))
    });
    for (text, path, source) in imds_keys
        .into_iter()
        .flatten()
        .chain(ovf_keys.into_iter().flatten())
    {
        match SshKey::parse(text) {
            Ok(key) if !seen.insert(key.identity()) => {}
            Ok(_) if keys.len() >= SSH_KEYS_MAX => over += 1,
            Ok(key) => keys.push(KeyEntry { key, path, source }),
            Err(e) => log::warn!("skipping an SSH key from {source}: {e}"),
        }
    }
    if over > 0 {
        log::warn!("{over} SSH key(s) over the limit of {SSH_KEYS_MAX} left out");
    }

    let disable_password_auth = match (
        m.and_then(|m| m.disable_password_auth),
        ovf_env.and_then(|o| o.disable_ssh_password_auth),
    ) {
        (Some(v), _) => Some((v, Source::Imds)),
        (None, Some(v)) => Some((v, Source::Ovf)),
        (None, None) => None,
    };

    let custom_data = ovf_env.and_then(|o| o.custom_data.clone());
    // without its custom data the VM is not what was asked for: NotReady, but the admin can
    // still log in and see why
    let incomplete = (custom_data.is_none() && m.and_then(|m| m.has_custom_data) == Some(true))
        .then(|| missing_custom_data(ovf));

    Ok(ProvisioningData {
        vm_id: m.map(|m| m.vm_id.clone()),
        hostname,
        username,
        keys,
        password: ovf_env.and_then(|o| o.password.clone()),
        disable_password_auth,
        custom_data,
        user_data: m.and_then(|m| m.user_data.clone()),
        imds_json: m.map(|m| m.raw.clone()),
        incomplete,
    })
}

/// IMDS's extended.compute.hasCustomData says Azure has custom data for this VM and none came:
/// without it the VM would come up with its configuration silently missing (cloud-init's
/// experimental_fail_on_missing_customdata). The failure says where the OVF stood.
fn missing_custom_data(ovf: &Result<Option<OvfEnv>, Failure>) -> Failure {
    let why = match ovf {
        Ok(None) => "no provisioning media".to_string(),
        Ok(Some(_)) => "ovf-env.xml has no CustomData".to_string(),
        Err(f) => f.to_string(),
    };
    let mut f = Failure::new(
        Reason::MissingCustomData,
        format!("IMDS says hasCustomData=true; {why}"),
    );
    f.stage = Some("merge");
    f
}

/// IMDS's value, else ovf-env.xml's, validated by `parse`; `reasons` are (missing, invalid).
fn pick<T>(
    imds: Option<&str>,
    ovf: Option<&str>,
    reasons: (Reason, Reason),
    parse: impl Fn(&str) -> Result<T, Invalid>,
) -> Result<(T, Source), Failure> {
    let (value, source) = match (imds, ovf) {
        (Some(v), _) => (v, Source::Imds),
        (None, Some(v)) => (v, Source::Ovf),
        (None, None) => {
            return Err(Failure::new(
                reasons.0,
                "neither IMDS nor ovf-env.xml has one",
            ))
        }
    };
    Ok((
        parse(value).map_err(|e| Failure::new(reasons.1, e))?,
        source,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::{imds, ovf};

    const OVF: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ovf/wala.xml"
    ));
    const IMDS: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/imds/full.json"
    ));

    fn both() -> (Result<Option<OvfEnv>, Failure>, Result<Imds, Failure>) {
        (
            Ok(Some(ovf::parse(OVF).unwrap())),
            Ok(imds::parse(IMDS).unwrap()),
        )
    }

    #[test]
    fn imds_wins_and_ovf_adds_password_custom_data_and_keys() {
        let (o, m) = both();
        let d = merge(&o, &m).unwrap();
        assert_eq!(d.hostname.0.as_str(), "temp-vm");
        assert_eq!(d.hostname.1, Source::Imds);
        assert_eq!(d.username.0.as_str(), "azureuser");
        assert_eq!(d.disable_password_auth, Some((true, Source::Imds)));
        assert_eq!(d.password.unwrap().expose(), "S3cr3t&Pass");
        assert!(d.custom_data.is_some() && d.user_data.is_some());
        let sources: Vec<Source> = d.keys.iter().map(|k| k.source).collect();
        assert_eq!(sources, [Source::Imds, Source::Imds, Source::Ovf]);
        assert_eq!(
            d.vm_id.as_deref(),
            Some("12345678-90ab-cdef-1234-567890abcdef")
        );
    }

    #[test]
    fn duplicate_keys_are_merged() {
        let (o, mut m) = both();
        let mut env = o.unwrap().unwrap();
        env.ssh_keys[0].value = Some(
            m.as_ref().unwrap().ssh_keys[0]
                .data
                .replace("azureuser@temp-vm", "other comment"),
        );
        if let Ok(m) = &mut m {
            m.ssh_keys.push(m.ssh_keys[0].clone());
        }
        let d = merge(&Ok(Some(env)), &m).unwrap();
        assert_eq!(d.keys.len(), 2);
    }

    #[test]
    fn thousands_of_keys_are_merged_in_one_pass_and_capped() {
        let (_, mut m) = both();
        if let Ok(m) = &mut m {
            let template = m.ssh_keys[0].clone();
            m.ssh_keys = (0..10_000)
                .map(|i| {
                    let mut k = template.clone();
                    // every key distinct, every second one twice
                    k.data = format!("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA{:012} k{i}", i / 2);
                    k
                })
                .collect();
        }
        let d = merge(&Ok(None), &m).unwrap();
        assert_eq!(d.keys.len(), SSH_KEYS_MAX);
        let mut ids: Vec<String> = d.keys.iter().map(|k| k.key.identity()).collect();
        ids.dedup();
        assert_eq!(ids.len(), SSH_KEYS_MAX);
    }

    #[test]
    fn ovf_alone_when_imds_fails() {
        let (o, _) = both();
        let d = merge(&o, &Err(Failure::new(Reason::ImdsHttp, "503"))).unwrap();
        assert_eq!(
            d.hostname,
            (Hostname::parse("vm-wala").unwrap(), Source::Ovf)
        );
        assert_eq!(d.username.1, Source::Ovf);
        assert_eq!(d.disable_password_auth, Some((false, Source::Ovf)));
        assert_eq!(d.keys.len(), 1);
        assert!(d.user_data.is_none() && d.vm_id.is_none());
    }

    #[test]
    fn imds_alone_without_media() {
        let (_, m) = both();
        let d = merge(&Ok(None), &m).unwrap();
        assert!(d.password.is_none() && d.custom_data.is_none());
        assert_eq!(d.keys.len(), 2);
    }

    #[test]
    fn custom_data_that_imds_announces_must_arrive() {
        let (o, m) = both();
        let mut m = m.unwrap();
        m.has_custom_data = Some(true);
        // the data to log in with comes all the same, the failure beside it
        let missing = |ovf: &Result<Option<OvfEnv>, Failure>| {
            merge(ovf, &Ok(m.clone())).unwrap().incomplete.unwrap()
        };
        let d = merge(&Ok(None), &Ok(m.clone())).unwrap();
        assert_eq!(d.username.0.to_string(), "azureuser");
        let e = d.incomplete.unwrap();
        assert_eq!(e.reason, Reason::MissingCustomData);
        assert_eq!(
            e.reason.as_str(),
            "failure to read customData that IMDS announces"
        );
        assert!(e.to_string().contains("no provisioning media"), "{e}");
        let mut bare = o.clone().unwrap().unwrap();
        bare.custom_data = None;
        let e = missing(&Ok(Some(bare)));
        assert!(
            e.to_string().contains("ovf-env.xml has no CustomData"),
            "{e}"
        );
        let e = missing(&Err(Failure::new(Reason::MediaRead, "sr0: EIO")));
        assert_eq!(e.reason, Reason::MissingCustomData);
        assert!(e.to_string().contains("sr0: EIO"), "{e}");
        // with the custom data, or with IMDS silent about it, the run goes on
        assert!(merge(&o, &Ok(m.clone())).unwrap().incomplete.is_none());
        m.has_custom_data = None;
        assert!(merge(&Ok(None), &Ok(m)).unwrap().incomplete.is_none());
    }

    #[test]
    fn nothing_usable_names_both_causes() {
        let e = merge(
            &Ok(None),
            &Err(Failure::new(Reason::ImdsConnection, "refused")),
        )
        .unwrap_err();
        assert_eq!(e.reason, Reason::NoProvisioningData);
        assert_eq!(e.extra[0], ("ovf", "no provisioning media".to_string()));
        assert_eq!(
            e.extra[1],
            (
                "imds",
                "connection error querying IMDS: refused".to_string()
            )
        );
    }

    #[test]
    fn a_broken_ovf_fails_even_when_imds_answers() {
        let (_, m) = both();
        let broken = Err(Failure::new(
            Reason::OvfParse,
            "CustomData: not valid base64",
        ));
        assert_eq!(merge(&broken, &m).unwrap_err().reason, Reason::OvfParse);
        // an unreadable disc is a missing source: IMDS alone provisions
        let unread = Err(Failure::new(Reason::MediaRead, "sr0: EIO"));
        assert!(merge(&unread, &m).is_ok());
    }

    #[test]
    fn missing_values_have_their_own_reasons() {
        let mut m = both().1.unwrap();
        m.computer_name = None;
        assert_eq!(
            merge(&Ok(None), &Ok(m.clone())).unwrap_err().reason,
            Reason::NoHostname
        );
        m.computer_name = Some("vm".into());
        m.admin_username = None;
        assert_eq!(
            merge(&Ok(None), &Ok(m)).unwrap_err().reason,
            Reason::NoUsername
        );
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        let (o, m) = both();
        let mut bad = m.clone().unwrap();
        bad.computer_name = Some("bad_name!".into());
        assert_eq!(
            merge(&o, &Ok(bad)).unwrap_err().reason,
            Reason::InvalidHostname
        );
        let mut bad = m.unwrap();
        bad.admin_username = Some("root".into());
        assert_eq!(
            merge(&o, &Ok(bad)).unwrap_err().reason,
            Reason::InvalidUsername
        );
        let long = Err(Failure::new(Reason::PasswordLength, "73"));
        assert_eq!(
            merge(&long, &both().1).unwrap_err().reason,
            Reason::PasswordLength
        );
    }
}
