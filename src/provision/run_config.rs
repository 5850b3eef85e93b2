//! `/run/config` as linuxkit's `metadata` package writes it (docs/contracts.md, "Stateless
//! images"), for systems whose initramfs is the OS (linuxkit, k3OS, appliances that run from
//! RAM) and whose services read it: `provider`, `hostname` (and k3OS's `local_hostname`),
//! `ssh/authorized_keys`, `userdata` (IMDS's user data, else the OVF's custom data), and, when
//! the user data is JSON of linuxkit's shape, its files and directories expanded under the
//! layout. Written through directory handles (openat, O_NOFOLLOW), so nothing lands outside
//! it; a hostile document is refused entry by entry, each with a log line that does not quote
//! it (user data is a secret).

use super::data::ProvisioningData;
use crate::sys::at;
use nix::fcntl::OFlag;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Where a linuxkit system reads it.
pub const DEFAULT: &str = "/run/config";
/// The provider's name in `provider`.
pub const PROVIDER: &str = "azure";
/// The expansion's bounds: nesting, entries, and bytes of file content in all.
const DEPTH_MAX: usize = 8;
const ENTRIES_MAX: usize = 1024;
const BYTES_MAX: usize = 1 << 20;
const NAME_MAX: usize = 255;

/// What was written, for the log line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    pub keys: usize,
    pub userdata: bool,
    /// Files and directories the JSON user data expanded into.
    pub expanded: usize,
    /// Entries of it refused.
    pub refused: usize,
}

/// Writes the layout at `path` (made 0755 if missing; refused if it is a symlink).
pub fn write(path: &Path, data: &ProvisioningData) -> std::io::Result<Written> {
    std::fs::create_dir_all(path)?;
    if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(std::io::Error::other(format!(
            "{} is a symlink",
            path.display()
        )));
    }
    let dir = File::open(path)?;
    dir.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    let mut w = Written::default();
    let hostname = data.hostname.0.to_string();
    file(&dir, "provider", PROVIDER.as_bytes(), 0o644)?;
    file(&dir, "hostname", hostname.as_bytes(), 0o644)?;
    file(&dir, "local_hostname", hostname.as_bytes(), 0o644)?;
    let ssh = subdir(&dir, "ssh", 0o755)?;
    let keys: String = data
        .keys
        .iter()
        .map(|k| format!("{}\n", k.key.as_str()))
        .collect();
    w.keys = data.keys.len();
    file(&ssh, "authorized_keys", keys.as_bytes(), 0o600)?;
    let userdata = data.user_data.as_ref().or(data.custom_data.as_ref());
    if let Some(u) = userdata {
        file(&dir, "userdata", u.expose(), 0o644)?;
        w.userdata = true;
        if let Ok(serde_json::Value::Object(tree)) = serde_json::from_slice(u.expose()) {
            let mut budget = Budget {
                entries: ENTRIES_MAX,
                bytes: BYTES_MAX,
            };
            expand(&dir, &tree, 1, &mut budget, &mut w);
        }
    }
    Ok(w)
}

/// `name` in `dir` with `bytes`, its mode `mode` whatever the umask; never through a symlink.
fn file(dir: &File, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = at::open(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
        mode,
    )?;
    f.write_all(bytes)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// The directory `name` in `dir` (made if missing), its mode `mode`, opened without following
/// a symlink.
fn subdir(dir: &File, name: &str, mode: u32) -> std::io::Result<File> {
    match at::mkdir(dir, name, mode) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let d = at::open_dir(dir, name)?;
    d.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(d)
}

struct Budget {
    entries: usize,
    bytes: usize,
}

/// Why an entry of the JSON user data is refused (said without quoting it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Name,
    Mode,
    Shape,
    TooDeep,
    TooMany,
    TooLarge,
    Write,
}

impl Refused {
    fn why(self) -> &'static str {
        match self {
            Refused::Name => {
                "its name is empty, `.`, `..`, longer than 255 bytes or holds `/` or NUL"
            }
            Refused::Mode => "its perm is not an octal mode of at most 4 digits",
            Refused::Shape => "it is not an object with a string `content` or an object `entries`",
            Refused::TooDeep => "it is nested deeper than 8 levels",
            Refused::TooMany => "the document has more than 1,024 entries",
            Refused::TooLarge => "the files' contents pass 1 MiB in all",
            Refused::Write => "it could not be written (a symlink or a file in its place)",
        }
    }
}

/// linuxkit's expansion: `{name: {"perm"?, "content": "…"}}` a file (default 0644),
/// `{name: {"perm"?, "entries": {…}}}` a directory (default 0755) with its entries.
fn expand(
    dir: &File,
    tree: &serde_json::Map<String, serde_json::Value>,
    depth: usize,
    budget: &mut Budget,
    w: &mut Written,
) {
    for (i, (name, spec)) in tree.iter().enumerate() {
        match entry(dir, name, spec, depth, budget, w) {
            Ok(()) => w.expanded += 1,
            Err(r) => {
                w.refused += 1;
                log::warn!(
                    "run-config: user data entry {} at depth {depth} refused: {}",
                    i + 1,
                    r.why()
                );
            }
        }
    }
}

fn entry(
    dir: &File,
    name: &str,
    spec: &serde_json::Value,
    depth: usize,
    budget: &mut Budget,
    w: &mut Written,
) -> Result<(), Refused> {
    if depth > DEPTH_MAX {
        return Err(Refused::TooDeep);
    }
    budget.entries = budget.entries.checked_sub(1).ok_or(Refused::TooMany)?;
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > NAME_MAX
        || name.contains(['/', '\0'])
    {
        return Err(Refused::Name);
    }
    let spec = spec.as_object().ok_or(Refused::Shape)?;
    let perm = match spec.get("perm") {
        None => None,
        Some(serde_json::Value::String(p)) => Some(mode(p).ok_or(Refused::Mode)?),
        Some(_) => return Err(Refused::Mode),
    };
    match (spec.get("content"), spec.get("entries")) {
        (Some(serde_json::Value::String(content)), None) => {
            budget.bytes = budget
                .bytes
                .checked_sub(content.len())
                .ok_or(Refused::TooLarge)?;
            file(dir, name, content.as_bytes(), perm.unwrap_or(0o644)).map_err(|_| Refused::Write)
        }
        (None, Some(serde_json::Value::Object(entries))) => {
            let sub = subdir(dir, name, perm.unwrap_or(0o755)).map_err(|_| Refused::Write)?;
            expand(&sub, entries, depth + 1, budget, w);
            Ok(())
        }
        _ => Err(Refused::Shape),
    }
}

/// An octal mode as linuxkit's `perm` gives it ("0600", "755"), at most 0o7777.
fn mode(text: &str) -> Option<u32> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return None;
    }
    u32::from_str_radix(digits, 8).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::root::values::{Hostname, KeyEntry, Source, SshKey, Username};
    use crate::secret::Secret;
    use std::os::unix::fs::MetadataExt;

    fn data(user_data: Option<&[u8]>, custom: Option<&[u8]>) -> ProvisioningData {
        let key = |k: &str| KeyEntry {
            key: SshKey::parse(k).unwrap(),
            path: None,
            source: Source::Imds,
        };
        ProvisioningData {
            vm_id: None,
            hostname: (Hostname::parse("lk-vm").unwrap(), Source::Imds),
            username: (Username::parse("azureuser").unwrap(), Source::Imds),
            keys: vec![
                key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGt0ZXN0 a@b"),
                key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGt0ZXN1 c@d"),
            ],
            password: None,
            disable_password_auth: None,
            custom_data: custom.map(|c| Secret::new(c.to_vec())),
            user_data: user_data.map(|u| Secret::new(u.to_vec())),
            imds_json: None,
            incomplete: None,
        }
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("azprov-runconfig-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn the_layout_linuxkit_writes() {
        let d = tmp("layout");
        let rc = d.join("run/config");
        let json = br#"{"etc": {"entries": {"motd": {"content": "hi\n"}, "secret": {"perm": "0600", "content": "s"}}},
                        "app.conf": {"perm": "0640", "content": "x=1"}}"#;
        let w = write(&rc, &data(Some(json), Some(b"custom"))).unwrap();
        assert_eq!(
            w,
            Written {
                keys: 2,
                userdata: true,
                expanded: 4,
                refused: 0
            }
        );
        let read = |p: &str| std::fs::read_to_string(rc.join(p)).unwrap();
        assert_eq!(read("provider"), "azure");
        assert_eq!(
            (read("hostname"), read("local_hostname")),
            ("lk-vm".into(), "lk-vm".into())
        );
        assert_eq!(read("ssh/authorized_keys").lines().count(), 2);
        assert_eq!(std::fs::read(rc.join("userdata")).unwrap(), json);
        assert_eq!(read("etc/motd"), "hi\n");
        for (p, m) in [
            ("", 0o755),
            ("provider", 0o644),
            ("ssh", 0o755),
            ("ssh/authorized_keys", 0o600),
            ("userdata", 0o644),
            ("etc", 0o755),
            ("etc/motd", 0o644),
            ("etc/secret", 0o600),
            ("app.conf", 0o640),
        ] {
            assert_eq!(mode_of(&rc.join(p)), m, "{p}");
        }
        // without IMDS user data, the OVF's custom data
        let w = write(&d.join("b"), &data(None, Some(b"#!/bin/sh\necho hi\n"))).unwrap();
        assert!(w.userdata && w.expanded == 0);
        assert_eq!(
            std::fs::read(d.join("b/userdata")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_hostile_document_writes_nothing_outside_and_never_crashes() {
        let d = tmp("hostile");
        let rc = d.join("config");
        std::fs::create_dir_all(&rc).unwrap();
        // a symlink planted where an entry goes: not followed
        std::os::unix::fs::symlink(d.join("outside"), rc.join("planted")).unwrap();
        let deep = (0..20).fold(r#"{"content": "x"}"#.to_string(), |inner, i| {
            format!(r#"{{"entries": {{"d{i}": {inner}}}}}"#)
        });
        let doc = format!(
            r#"{{"..": {{"content": "x"}}, "../escape": {{"content": "x"}}, "a/b": {{"content": "x"}},
                "": {{"content": "x"}}, ".": {{"entries": {{}}}}, "nul\u0000": {{"content": "x"}},
                "badperm": {{"perm": "0999", "content": "x"}}, "setuid": {{"perm": "14755", "content": "x"}},
                "numperm": {{"perm": 420, "content": "x"}}, "both": {{"content": "x", "entries": {{}}}},
                "neither": {{}}, "notobj": 5, "planted": {{"content": "x"}},
                "big": {{"content": "{}"}}, "deep": {deep}, "ok": {{"content": "fine"}}}}"#,
            "y".repeat(BYTES_MAX + 1)
        );
        let w = write(&rc, &data(Some(doc.as_bytes()), None)).unwrap();
        assert_eq!(std::fs::read_to_string(rc.join("ok")).unwrap(), "fine");
        assert!(!d.join("escape").exists() && !d.join("outside").exists());
        assert!(!rc.join("a").exists() && !rc.join("big").exists());
        // fourteen refused at the top, and the deep chain's entry at depth 9
        assert_eq!(w.refused, 15, "{w:?}");
        // the deep chain is written down to the bound (depth 8: deep/d19/…/d13), no further
        let mut p = rc.join("deep");
        for i in (13..20).rev() {
            p = p.join(format!("d{i}"));
        }
        assert!(p.is_dir(), "{}", p.display());
        assert!(!p.join("d12").exists());
        // many entries: refused past the bound
        let many: String = (0..ENTRIES_MAX + 10)
            .map(|i| format!(r#""f{i}": {{"content": ""}}"#))
            .collect::<Vec<_>>()
            .join(",");
        let w = write(
            &d.join("many"),
            &data(Some(format!("{{{many}}}").as_bytes()), None),
        )
        .unwrap();
        assert_eq!((w.expanded, w.refused), (ENTRIES_MAX, 10));
        // not JSON, or JSON that is not an object: userdata only
        for raw in [&b"#cloud-config\n"[..], b"[1,2]", b"{\"a\":", &[0xff, 0xfe]] {
            let w = write(&d.join("raw"), &data(Some(raw), None)).unwrap();
            assert_eq!((w.expanded, w.refused), (0, 0));
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn modes() {
        assert_eq!(mode("0600"), Some(0o600));
        assert_eq!(mode("755"), Some(0o755));
        assert_eq!(mode("0o644"), Some(0o644));
        for bad in ["", "0999", "12345", "-1", "rw", "0x1ff"] {
            assert_eq!(mode(bad), None, "{bad}");
        }
    }
}
