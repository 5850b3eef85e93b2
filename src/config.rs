//! The kernel command line (and `/etc/azprov/cmdline` defaults in the initramfs) parsed into a
//! typed [`Config`] for PID 1 mode. Unknown parameters belong to the kernel or the real init
//! and are ignored; a malformed `azprov.*` value is an error naming the parameter.

use std::net::SocketAddr;
use std::time::Duration;

/// The whole provisioning run's bound unless `azprov.timeout=`/`--timeout` says otherwise.
/// The SSH host key types azprov can make.
pub const HOST_KEY_TYPES: [&str; 3] = ["ed25519", "ecdsa", "rsa"];

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A command line word azprov refused; the word is skipped and the boot goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// `KEY` alone where `KEY=VALUE` is needed.
    NeedsValue(String),
    /// `KEY=VALUE` with a value of the wrong form; `expected` says the right one.
    BadValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    /// An `azprov.` parameter azprov does not know.
    Unknown(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::NeedsValue(k) => write!(f, "{k} needs a value"),
            ConfigError::BadValue {
                key,
                value,
                expected,
            } => write!(f, "{key}={value}: expected {expected}"),
            ConfigError::Unknown(k) => write!(f, "unknown parameter {k}"),
        }
    }
}

impl std::error::Error for ConfigError {}

fn bad(key: &str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSpec {
    Dev(String),
    Uuid(String),
    PartUuid(String),
    Label(String),
    PartLabel(String),
}

impl std::fmt::Display for RootSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootSpec::Dev(d) => write!(f, "{d}"),
            RootSpec::Uuid(u) => write!(f, "UUID={u}"),
            RootSpec::PartUuid(u) => write!(f, "PARTUUID={u}"),
            RootSpec::Label(l) => write!(f, "LABEL={l}"),
            RootSpec::PartLabel(l) => write!(f, "PARTLABEL={l}"),
        }
    }
}

impl RootSpec {
    pub fn parse(v: &str) -> Result<RootSpec, ConfigError> {
        const FORMS: &str = "/dev/NAME, UUID=, PARTUUID=, LABEL= or PARTLABEL=";
        let (kind, val) = match v.split_once('=') {
            Some((k, val)) => (k, val),
            None if v.starts_with('/') => return Ok(RootSpec::Dev(v.to_string())),
            None => return Err(bad("root", v, FORMS)),
        };
        if val.is_empty() {
            return Err(bad("root", v, "a value after the kind"));
        }
        Ok(match kind {
            "UUID" => RootSpec::Uuid(val.to_ascii_lowercase()),
            "PARTUUID" => RootSpec::PartUuid(val.to_ascii_lowercase()),
            "LABEL" => RootSpec::Label(val.to_string()),
            "PARTLABEL" => RootSpec::PartLabel(val.to_string()),
            _ => return Err(bad("root", v, FORMS)),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFail {
    Halt,
    Reboot,
    Poweroff,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub root: Option<RootSpec>,
    pub rootfstype: Option<String>,
    pub rootflags: Option<String>,
    /// `ro` on the command line: the root is remounted read-only before handover.
    pub read_only: bool,
    pub init: Option<String>,
    pub rootwait: bool,
    pub rootdelay: Option<Duration>,
    pub iface: Option<String>,
    pub timeout: Duration,
    pub wireserver: Option<SocketAddr>,
    pub imds: String,
    pub force: bool,
    pub disable: bool,
    pub keepnet: bool,
    /// New SSH host keys for a new VM; `azprov.hostkeys=keep` leaves the image's alone.
    pub host_keys: bool,
    /// `azprov.hostkeytypes=ed25519,ecdsa,rsa`: the host key types a new VM gets (all three
    /// by default; an image that wants no RSA key leaves it out).
    pub host_key_types: Vec<String>,
    /// `azprov.growroot=0`: leave the root's partition and filesystem at their size.
    pub growroot: bool,
    pub log_level: log::LevelFilter,
    pub onfail: OnFail,
    pub modules: Vec<String>,
    /// `MODULE.PARAM=VALUE` words: what PID 1 passes to the modules it loads, as modprobe would.
    pub module_params: Vec<(String, String)>,
    /// `azprov.resourcedisk=`, `azprov.resourcemount=`, `azprov.resourcefs=`.
    pub resource: ResourceDisk,
    /// `azprov.inplace`: PID 1 provisions the initramfs itself, which is the OS (linuxkit and
    /// the systems built like it), and execs its init in place.
    pub inplace: bool,
}

/// Which disk azprov formats (when Azure hands it over pristine) and mounts on every boot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResourceDevice {
    /// The one Azure names: the SCSI resource disk, else the first local NVMe disk.
    #[default]
    Auto,
    /// `azprov.resourcedisk=off`: none.
    Off,
    /// `azprov.resourcedisk=DEVICE` (`/dev/sdb` or `sdb`), where azprov does not recognise it.
    Named(String),
}

/// The resource disk's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDisk {
    pub device: ResourceDevice,
    /// `azprov.resourcemount=PATH` (default `/mnt`, as cloud-init and azure-vm-utils).
    pub mount: String,
    /// `azprov.resourcefs=ext4|xfs` (default ext4).
    pub fstype: &'static str,
}

impl Default for ResourceDisk {
    fn default() -> Self {
        ResourceDisk {
            device: ResourceDevice::Auto,
            mount: "/mnt".into(),
            fstype: "ext4",
        }
    }
}

impl ResourceDisk {
    /// One `azprov.resource*` word; None for any other key.
    fn apply(&mut self, key: &str, value: Option<&str>) -> Option<Result<(), ConfigError>> {
        if !matches!(
            key,
            "azprov.resourcedisk" | "azprov.resourcemount" | "azprov.resourcefs"
        ) {
            return None;
        }
        let Some(v) = value.filter(|v| !v.is_empty()) else {
            return Some(Err(ConfigError::NeedsValue(key.to_string())));
        };
        match (key, v) {
            ("azprov.resourcedisk", "off") => self.device = ResourceDevice::Off,
            ("azprov.resourcedisk", d) if valid_device(d) => {
                self.device = ResourceDevice::Named(d.trim_start_matches("/dev/").to_string())
            }
            ("azprov.resourcedisk", d) => {
                return Some(Err(bad(key, d, "off or a device such as /dev/sdb")))
            }
            ("azprov.resourcemount", p)
                if p.starts_with('/') && p != "/" && !p.split('/').any(|c| c == "..") =>
            {
                self.mount = p.trim_end_matches('/').to_string()
            }
            ("azprov.resourcemount", p) => {
                return Some(Err(bad(key, p, "an absolute path other than /")))
            }
            (_, "ext4") => self.fstype = "ext4",
            (_, "xfs") => self.fstype = "xfs",
            (_, f) => return Some(Err(bad(key, f, "ext4 or xfs"))),
        }
        Some(Ok(()))
    }
}

/// A kernel device name under /dev: no other directory, nothing but [A-Za-z0-9_-].
fn valid_device(d: &str) -> bool {
    let name = d.strip_prefix("/dev/").unwrap_or(d);
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root: None,
            rootfstype: None,
            rootflags: None,
            read_only: false,
            init: None,
            rootwait: false,
            rootdelay: None,
            iface: None,
            timeout: DEFAULT_TIMEOUT,
            wireserver: None,
            imds: crate::azure::imds::DEFAULT_BASE.to_string(),
            force: false,
            disable: false,
            keepnet: false,
            host_keys: true,
            host_key_types: HOST_KEY_TYPES.iter().map(|t| t.to_string()).collect(),
            growroot: true,
            log_level: log::LevelFilter::Info,
            onfail: OnFail::Halt,
            modules: Vec::new(),
            module_params: Vec::new(),
            resource: ResourceDisk::default(),
            inplace: false,
        }
    }
}

/// Splits a command line into words; double quotes group (`a="b c"`), as the kernel does.
pub fn split(cmdline: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in cmdline.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

impl Config {
    /// Applies the words of one command line on top of `self` (later words win, so the
    /// defaults file goes first and /proc/cmdline second). A bad word is reported and skipped:
    /// a typo in one parameter must not make the VM unbootable.
    pub fn apply(&mut self, cmdline: &str) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        for word in split(cmdline) {
            if word == "--" {
                break; // the rest belongs to init
            }
            if let Err(e) = self.apply_word(&word) {
                errors.push(e);
            }
        }
        errors
    }

    fn apply_word(&mut self, word: &str) -> Result<(), ConfigError> {
        {
            let (key, value) = match word.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (word, None),
            };
            if let Some(done) = self.resource.apply(key, value) {
                return done;
            }
            if let Some(field) = self.switch(key) {
                *field = flag(key, value)?;
                return Ok(());
            }
            let need = |v: Option<&str>| {
                v.map(str::to_string)
                    .ok_or_else(|| ConfigError::NeedsValue(key.to_string()))
            };
            match key {
                "root" => self.root = Some(RootSpec::parse(&need(value)?)?),
                "rootfstype" => self.rootfstype = Some(need(value)?),
                "rootflags" => self.rootflags = Some(need(value)?),
                "ro" if value.is_none() => self.read_only = true,
                "rw" if value.is_none() => self.read_only = false,
                "init" => self.init = Some(need(value)?),
                "rootwait" if value.is_none() => self.rootwait = true,
                "rootdelay" => {
                    let v = need(value)?;
                    self.rootdelay = Some(Duration::from_secs(
                        v.parse().map_err(|_| bad(key, &v, "whole seconds"))?,
                    ));
                }
                "azprov.iface" => self.iface = Some(need(value)?),
                "azprov.timeout" => {
                    let v = need(value)?;
                    self.timeout =
                        crate::time::parse_secs(&v).ok_or_else(|| bad(key, &v, "seconds"))?;
                }
                "azprov.wireserver" => {
                    let v = need(value)?;
                    self.wireserver = Some(
                        crate::azure::wireserver::parse_endpoint(&v)
                            .map_err(|_| bad(key, &v, "IP or IP:PORT"))?,
                    );
                }
                "azprov.imds" => {
                    let v = need(value)?;
                    if !v.starts_with("http://") {
                        return Err(bad(key, &v, "an http:// URL"));
                    }
                    self.imds = v;
                }
                // dracut's and the other frameworks' convention: `rd.azprov=0`, `azprov=0`
                "azprov" | "rd.azprov" => self.disable = !flag(key, value)?,
                "azprov.hostkeys" => {
                    self.host_keys = match need(value)?.as_str() {
                        "regenerate" => true,
                        "keep" => false,
                        v => return Err(bad(key, v, "keep or regenerate")),
                    }
                }
                "azprov.hostkeytypes" => {
                    let v = need(value)?;
                    self.host_key_types = host_key_types(&v)
                        .ok_or_else(|| bad(key, &v, "a list of ed25519, ecdsa, rsa"))?;
                }
                "azprov.log" => {
                    let v = need(value)?;
                    self.log_level = crate::logger::parse_level(&v)
                        .ok_or_else(|| bad(key, &v, "debug, info or warn"))?;
                }
                "azprov.onfail" => {
                    self.onfail = match need(value)?.as_str() {
                        "halt" => OnFail::Halt,
                        "reboot" => OnFail::Reboot,
                        "poweroff" => OnFail::Poweroff,
                        v => return Err(bad(key, v, "halt, reboot or poweroff")),
                    }
                }
                "azprov.modules" => {
                    self.modules.extend(
                        need(value)?
                            .split(',')
                            .filter(|m| !m.is_empty())
                            .map(str::to_string),
                    );
                }
                k if k.starts_with("azprov.") => return Err(ConfigError::Unknown(k.to_string())),
                _ => self
                    .module_params
                    .extend(crate::modules::cmdline_param(word)),
            }
        }
        Ok(())
    }
}

impl Config {
    /// The field an `azprov.*` switch sets (`azprov.force`, `azprov.force=0`, ...).
    fn switch(&mut self, key: &str) -> Option<&mut bool> {
        Some(match key {
            "azprov.force" => &mut self.force,
            "azprov.disable" => &mut self.disable,
            "azprov.keepnet" => &mut self.keepnet,
            "azprov.growroot" => &mut self.growroot,
            "azprov.inplace" => &mut self.inplace,
            _ => return None,
        })
    }
}

/// `azprov.hostkeytypes`: a comma list of known types, None when empty or one is unknown.
fn host_key_types(v: &str) -> Option<Vec<String>> {
    let types: Vec<String> = v
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    let known = types.iter().all(|t| HOST_KEY_TYPES.contains(&t.as_str()));
    (known && !types.is_empty()).then_some(types)
}

/// `azprov.force` alone, or `=1/0/yes/no/true/false`.
fn flag(key: &str, value: Option<&str>) -> Result<bool, ConfigError> {
    match value {
        None | Some("1" | "yes" | "true" | "on") => Ok(true),
        Some("0" | "no" | "false" | "off") => Ok(false),
        Some(v) => Err(bad(key, v, "a boolean")),
    }
}

/// Reads the defaults file (PID 1's `/etc/azprov/cmdline`, when given and present) and the
/// kernel command line at `cmdline` (normally /proc/cmdline; missing: the defaults alone), and
/// logs each refused word. PID 1 and hook mode read their settings the same way.
pub fn read(defaults: Option<&std::path::Path>, cmdline: &std::path::Path) -> Config {
    let defaults = defaults.and_then(|p| std::fs::read_to_string(p).ok());
    let line = std::fs::read_to_string(cmdline).unwrap_or_default();
    let (cfg, errors) = load(defaults.as_deref(), &line);
    for e in errors {
        log::error!("kernel command line: {e} (ignored)");
    }
    cfg
}

/// The defaults file, then the kernel's command line; with the words that were refused.
pub fn load(defaults: Option<&str>, cmdline: &str) -> (Config, Vec<ConfigError>) {
    let mut c = Config::default();
    let mut errors = Vec::new();
    if let Some(d) = defaults {
        // comment lines are allowed in the defaults file
        let joined: Vec<&str> = d
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        errors.extend(c.apply(&joined.join(" ")));
    }
    errors.extend(c.apply(cmdline));
    (c, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typical_line() {
        let (c, _) = load(None, "BOOT_IMAGE=/vmlinuz root=UUID=0A1B-C2 ro console=ttyS0 quiet rootwait rootdelay=5 init=/lib/systemd/systemd azprov.timeout=90 azprov.onfail=poweroff azprov.modules=virtio_net,,sd_mod\n");
        assert_eq!(c.root, Some(RootSpec::Uuid("0a1b-c2".into())));
        assert!(c.read_only && c.rootwait);
        assert_eq!(c.rootdelay, Some(Duration::from_secs(5)));
        assert_eq!(c.init.as_deref(), Some("/lib/systemd/systemd"));
        assert_eq!(c.timeout, Duration::from_secs(90));
        assert_eq!(c.onfail, OnFail::Poweroff);
        assert_eq!(c.modules, ["virtio_net", "sd_mod"]);
        assert!(!c.force && !c.disable && !c.keepnet);
    }

    #[test]
    fn root_forms() {
        let table = [
            ("root=/dev/vda1", RootSpec::Dev("/dev/vda1".into())),
            (
                "root=PARTUUID=ABCD-01",
                RootSpec::PartUuid("abcd-01".into()),
            ),
            ("root=LABEL=my quiet", RootSpec::Label("my".into())),
            ("root=\"LABEL=my root\"", RootSpec::Label("my root".into())),
            ("root=PARTLABEL=linux", RootSpec::PartLabel("linux".into())),
        ];
        for (line, want) in table {
            assert_eq!(load(None, line).0.root, Some(want), "{line}");
        }
    }

    #[test]
    fn near_misses_are_errors_or_ignored() {
        for bad in [
            "root=",
            "root=vda",
            "root=FOO=x",
            "rootdelay=x",
            "azprov.timeout=0",
            "azprov.onfail=explode",
            "azprov.log=loud",
            "azprov.frobnicate=1",
            "azprov.force=maybe",
            "azprov.hostkeys=some",
            "azprov.imds=ftp://x",
            "azprov.wireserver=host",
            "azprov.resourcedisk=",
            "azprov.resourcedisk=/dev/../etc/passwd",
            "azprov.resourcemount=mnt",
            "azprov.resourcemount=/",
            "azprov.resourcemount=/mnt/../etc",
            "azprov.resourcefs=btrfs",
        ] {
            let (c, errors) = load(Some("azprov.timeout=7"), bad);
            assert_eq!(errors.len(), 1, "{bad}");
            // the bad word is skipped, the rest stands
            assert_eq!(c.timeout, Duration::from_secs(7), "{bad}");
        }
        // not ours: ignored, but for a module's parameter (xazprov's, as modprobe would)
        let (c, errors) = load(None, "rootfoo=1 ro=1 azprovx=1 xazprov.force");
        assert!(errors.is_empty());
        assert_eq!(
            c,
            Config {
                module_params: vec![("xazprov".into(), "force".into())],
                ..Config::default()
            }
        );
    }

    #[test]
    fn the_resource_disk_words() {
        let d = load(None, "").0.resource;
        assert_eq!(
            (d.device, d.mount.as_str(), d.fstype),
            (ResourceDevice::Auto, "/mnt", "ext4")
        );
        let d = load(None, "azprov.resourcedisk=/dev/sdb azprov.resourcemount=/mnt/resource/ azprov.resourcefs=xfs").0.resource;
        assert_eq!(
            (d.device, d.mount.as_str(), d.fstype),
            (ResourceDevice::Named("sdb".into()), "/mnt/resource", "xfs")
        );
        assert_eq!(
            load(None, "azprov.resourcedisk=nvme0n1").0.resource.device,
            ResourceDevice::Named("nvme0n1".into())
        );
        assert_eq!(
            load(None, "azprov.resourcedisk=off").0.resource.device,
            ResourceDevice::Off
        );
    }

    #[test]
    fn module_parameters_are_collected_as_modprobe_reads_them() {
        let (c, errors) = load(
            Some("scsi-mod.scan=sync"),
            "hv_storvsc.storvsc_ringbuffer_size=0x40000 \"foo.bar=a b\" console=ttyS0 .x=1 y.=2",
        );
        assert!(errors.is_empty());
        assert_eq!(
            c.module_params,
            [
                ("scsi_mod".to_string(), "scan=sync".to_string()),
                (
                    "hv_storvsc".into(),
                    "storvsc_ringbuffer_size=0x40000".into()
                ),
                ("foo".into(), "bar=\"a b\"".into()),
            ]
        );
    }

    #[test]
    fn the_command_line_overrides_the_defaults_file() {
        let (c, _) = load(
            Some("# defaults\nazprov.timeout=30 azprov.keepnet\nro\n"),
            "rw azprov.keepnet=0",
        );
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert!(!c.keepnet && !c.read_only);
    }

    #[test]
    fn words_after_a_double_dash_are_for_init() {
        let (c, _) = load(None, "ro -- azprov.force root=/dev/x");
        assert!(!c.force && c.root.is_none());
    }

    #[test]
    fn the_frameworks_disable_conventions() {
        for line in ["azprov=0", "rd.azprov=0", "azprov.disable", "rd.azprov=no"] {
            assert!(load(None, line).0.disable, "{line}");
        }
        for line in ["azprov=1", "rd.azprov", "azprov.disable=0", ""] {
            assert!(!load(None, line).0.disable, "{line}");
        }
        assert_eq!(load(None, "azprov=maybe").1.len(), 1);
    }

    #[test]
    fn flags() {
        let (c, _) = load(None, "azprov.force azprov.disable=1 azprov.keepnet=yes azprov.log=debug azprov.wireserver=10.0.0.9:8080 azprov.iface=eth1");
        assert!(c.force && c.disable && c.keepnet);
        assert!(c.host_keys);
        assert!(!load(None, "azprov.hostkeys=keep").0.host_keys);
        assert_eq!(c.host_key_types, ["ed25519", "ecdsa", "rsa"]);
        assert!(c.growroot && !load(None, "azprov.growroot=0").0.growroot);
        assert_eq!(
            load(None, "azprov.hostkeytypes=ed25519,ecdsa")
                .0
                .host_key_types,
            ["ed25519", "ecdsa"]
        );
        let (c2, errs) = load(None, "azprov.hostkeytypes=dsa");
        assert_eq!(c2.host_key_types.len(), 3);
        assert_eq!(errs.len(), 1);
        assert_eq!(c.log_level, log::LevelFilter::Debug);
        assert_eq!(c.wireserver.unwrap().to_string(), "10.0.0.9:8080");
        assert_eq!(c.iface.as_deref(), Some("eth1"));
    }
}
