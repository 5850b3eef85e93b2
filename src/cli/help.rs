//! Each subcommand's flags with one line each: what `azprov COMMAND --help` prints, what the
//! parser accepts (`Args::for_command`: a flag missing here is refused, so the help cannot
//! fall behind the code), and what the man page azprov(8) says (`man_page`, checked against
//! docs/azprov.8 by a test).

/// A flag: its name without `--`, the value's placeholder (None for a switch), one line.
pub struct Flag {
    pub name: &'static str,
    pub value: Option<&'static str>,
    pub about: &'static str,
}

pub struct Command {
    pub name: &'static str,
    /// The synopsis lines, as in the usage text.
    pub synopsis: &'static [&'static str],
    pub about: &'static str,
    pub flags: &'static [Flag],
}

const fn v(name: &'static str, value: &'static str, about: &'static str) -> Flag {
    Flag {
        name,
        value: Some(value),
        about,
    }
}

const fn s(name: &'static str, about: &'static str) -> Flag {
    Flag {
        name,
        value: None,
        about,
    }
}

const JSON: Flag = s(
    "json",
    "print the result as JSON (schema 1), never a secret",
);
const TIMEOUT: Flag = v(
    "timeout",
    "SECS",
    "give up after SECS seconds (default 300, or azprov.timeout=)",
);
const WIRESERVER: Flag = v(
    "wireserver",
    "IP[:PORT]",
    "the WireServer (default: DHCP option 245, else 168.63.129.16:80)",
);
const IMDS: Flag = v(
    "imds",
    "URL",
    "the IMDS base URL (default http://169.254.169.254)",
);

pub const COMMANDS: &[Command] = &[
    Command {
        name: "provision",
        synopsis: &["azprov provision --root DIR [OPTION]..."],
        about:
            "Provision the root mounted at DIR and report to Azure: what the framework hooks run. \
                Reads the kernel command line's azprov.* settings as PID 1 does; a flag wins.",
        flags: &[
            v("root", "DIR", "the mounted root to provision (required)"),
            v(
                "iface",
                "IF",
                "the NIC to configure (default: the first Ethernet NIC, hv_netvsc first)",
            ),
            s("no-dhcp", "do not configure the network (it is up already)"),
            v("media", "DEV", "read ovf-env.xml from DEV too (repeatable)"),
            v("ovf", "FILE", "read ovf-env.xml from FILE instead of a CD"),
            s(
                "force",
                "provision even when already provisioned or not on Azure",
            ),
            TIMEOUT,
            JSON,
            WIRESERVER,
            IMDS,
            s(
                "keep-host-keys",
                "keep the image's SSH host keys (as azprov.hostkeys=keep)",
            ),
            v(
                "dmi",
                "DIR",
                "where the DMI ids are read (default /sys/class/dmi/id)",
            ),
            v(
                "cmdline",
                "FILE",
                "the kernel command line to read (default /proc/cmdline)",
            ),
            v(
                "run-dir",
                "DIR",
                "where this boot's record goes (default /run/azprov)",
            ),
            v(
                "run-config",
                "PATH",
                "also write linuxkit's /run/config layout at PATH (hostname, keys, user data and its JSON files)",
            ),
            s(
                "after-proxy-agent",
                "azprov-msp.service: an MSP VM's run after azure-proxy-agent holds its key (the system's network; no growroot, no host keys)",
            ),
        ],
    },
    Command {
        name: "status",
        synopsis: &["azprov status [--root DIR] [--json] [--run-dir DIR]"],
        about:
            "What azprov recorded: provisioned?, what Azure acknowledged, this boot's outcome, \
                a failure's cause, stage and what to check. Exit 0 when provisioned and Ready was \
                acknowledged, or when this boot was not to provision (disabled, not Azure); else 1.",
        flags: &[
            v(
                "root",
                "DIR",
                "an offline root instead of the running system",
            ),
            JSON,
            v(
                "run-dir",
                "DIR",
                "read this boot's record from DIR (default /run/azprov)",
            ),
        ],
    },
    Command {
        name: "clean",
        synopsis: &["azprov clean [--root DIR] [--user] [--machine-id] [--dry-run] [--json]"],
        about: "Prepare the image for capture: remove azprov's state and log, the SSH host keys \
                and DHCP leases, so the next boot provisions as a new VM.",
        flags: &[
            v("root", "DIR", "clean the root at DIR (default /)"),
            s(
                "user",
                "also remove the user azprov created, its home and azprov's drop-ins",
            ),
            s("machine-id", "set /etc/machine-id to uninitialized"),
            s("dry-run", "list what would be removed, remove nothing"),
            JSON,
        ],
    },
    Command {
        name: "run-scripts",
        synopsis: &["azprov run-scripts [--root DIR]"],
        about:
            "Run custom data and user data that start with #! once per VM, as root, in the booted \
                system (azprov-scripts.service does, after the network is online); other formats \
                are left alone. /etc/azprov/no-scripts turns it off.",
        flags: &[v("root", "DIR", "the root whose data runs (default /)")],
    },
    Command {
        name: "disks",
        synopsis: &["azprov disks [--sys DIR] [--json] [--udev NAME] [--cmdline FILE]"],
        about: "List Azure's disks (OS, resource, data by LUN, local NVMe) with the \
                /dev/disk/azure names of WALinuxAgent and azure-vm-utils; nothing for the CD or \
                disks that are not Azure's. The packages' udev rule imports --udev.",
        flags: &[
            v("sys", "DIR", "the sysfs tree to read (default /sys)"),
            JSON,
            v(
                "udev",
                "NAME",
                "print udev's KEY=value lines for the block device NAME (links, resource disk)",
            ),
            v(
                "cmdline",
                "FILE",
                "the kernel command line to read (default /proc/cmdline)",
            ),
        ],
    },
    Command {
        name: "resource-disk",
        synopsis: &["azprov resource-disk NAME [--sys DIR] [--dev DIR] [--cmdline FILE]"],
        about: "Format the resource disk NAME when Azure handed it over blank (one NTFS \
                'Temporary Storage' partition holding only its readme; a raw local NVMe disk), \
                mount it (azprov.resourcemount=, default /mnt); anything else is left alone. \
                Run by azprov-resource-disk@NAME.service.",
        flags: &[
            v("sys", "DIR", "the sysfs tree to read (default /sys)"),
            v("dev", "DIR", "where the device nodes are (default /dev)"),
            v(
                "cmdline",
                "FILE",
                "the kernel command line to read (default /proc/cmdline)",
            ),
        ],
    },
    Command {
        name: "ovf",
        synopsis: &["azprov ovf FILE | --device DEV [--json]"],
        about:
            "Parse and check ovf-env.xml as provision would (the host name, user name and keys); \
                the password is never printed. Exit 2 when provision would refuse it.",
        flags: &[
            v(
                "device",
                "DEV",
                "mount DEV (a CD) read-only and read its ovf-env.xml",
            ),
            JSON,
        ],
    },
    Command {
        name: "imds",
        synopsis: &["azprov imds [--imds URL] [--timeout SECS] [--json]"],
        about: "Fetch and print the instance metadata from IMDS.",
        flags: &[IMDS, TIMEOUT, JSON],
    },
    Command {
        name: "dhcp",
        synopsis: &[
            "azprov dhcp [--iface IF] [--hostname NAME] [--timeout SECS] [--json] [--keep]",
        ],
        about:
            "Run azprov's DHCP client on one NIC, configure the lease and print it; the lease is \
                removed again unless --keep.",
        flags: &[
            v(
                "iface",
                "IF",
                "the NIC (default: the first Ethernet NIC, hv_netvsc first)",
            ),
            v("hostname", "NAME", "send NAME as option 12"),
            TIMEOUT,
            JSON,
            s("keep", "leave the lease configured"),
        ],
    },
    Command {
        name: "report",
        synopsis: &[
            "azprov report ready [--wireserver IP[:PORT]] [--timeout SECS]",
            "azprov report failure --reason TEXT [--wireserver IP[:PORT]] [--timeout SECS]",
        ],
        about: "Report Ready, or NotReady with the operator's TEXT, to the WireServer.",
        flags: &[
            WIRESERVER,
            TIMEOUT,
            v(
                "reason",
                "TEXT",
                "with failure: the text Azure shows (as detail=)",
            ),
        ],
    },
    Command {
        name: "version",
        synopsis: &["azprov version"],
        about: "Print azprov's version (also -V, --version).",
        flags: &[],
    },
];

/// The table entry of `name`.
pub fn command(name: &str) -> Option<&'static Command> {
    COMMANDS.iter().find(|c| c.name == name)
}

impl Command {
    pub fn valued(&self) -> Vec<&'static str> {
        self.flags
            .iter()
            .filter(|f| f.value.is_some())
            .map(|f| f.name)
            .collect()
    }

    pub fn switches(&self) -> Vec<&'static str> {
        self.flags
            .iter()
            .filter(|f| f.value.is_none())
            .map(|f| f.name)
            .collect()
    }

    /// `azprov COMMAND --help`.
    pub fn help(&self) -> String {
        let mut out = format!(
            "usage: {}\n\n{}\n",
            self.synopsis.join("\n       "),
            self.about
        );
        if !self.flags.is_empty() {
            out.push_str("\noptions:\n");
            for f in self.flags {
                let left = match f.value {
                    Some(v) => format!("--{} {v}", f.name),
                    None => format!("--{}", f.name),
                };
                out.push_str(&format!("  {left:<24} {}\n", f.about));
            }
        }
        out.push_str("  -h, --help               this help\n");
        out
    }
}

/// azprov(8) in roff, from the table above and the exit codes.
pub fn man_page() -> String {
    let esc = |t: &str| t.replace('\\', "\\\\").replace('-', "\\-");
    let mut m = String::new();
    m.push_str(&format!(
        ".TH AZPROV 8 \"\" \"azprov {}\" \"System Administration\"\n",
        crate::VERSION
    ));
    m.push_str(
        ".SH NAME\nazprov \\- provision Azure Linux VMs from the initramfs, with no agent\n",
    );
    m.push_str(".SH SYNOPSIS\n");
    for c in COMMANDS {
        for line in c.synopsis {
            m.push_str(&format!(".B {}\n.br\n", esc(line)));
        }
    }
    m.push_str(
        ".SH DESCRIPTION\nazprov runs as PID 1 of an initramfs or from an initramfs-tools, dracut \
         or mkinitcpio hook. It configures the network with its own DHCP client, reads the \
         provisioning CD (ovf\\-env.xml) and the instance metadata (IMDS), writes the hostname, \
         the admin user, SSH keys, password and custom data into the root, reports Ready (or \
         NotReady with the reason) to the WireServer, and hands over to the real init.\n",
    );
    m.push_str(".SH COMMANDS\n");
    for c in COMMANDS {
        m.push_str(&format!(".SS {}\n{}\n", c.name, esc(c.about)));
        for f in c.flags {
            let left = match f.value {
                Some(v) => format!("\\-\\-{} {}", esc(f.name), esc(v)),
                None => format!("\\-\\-{}", esc(f.name)),
            };
            m.push_str(&format!(".TP\n.B {left}\n{}\n", esc(f.about)));
        }
    }
    m.push_str(
        ".SH KERNEL COMMAND LINE\n\
         .B azprov=0\n(or rd.azprov=0, azprov.disable) skips provisioning for one boot;\n\
         .B azprov.timeout=SECS, azprov.iface=IF, azprov.log=debug|info|warn, \
         azprov.hostkeys=keep, azprov.hostkeytypes=ed25519,ecdsa,rsa, azprov.keepnet, azprov.force, azprov.wireserver=IP, azprov.imds=URL, \
         azprov.onfail=halt|reboot|poweroff, azprov.modules=a,b, azprov.growroot=0\n.PP\n\
         The resource disk (azprov\\-resource\\-disk@.service, every boot):\n\
         .B azprov.resourcedisk=off|NAME, azprov.resourcemount=PATH (default /mnt), \
         azprov.resourcefs=ext4|xfs.\n\
         It is formatted only as Azure hands it over blank (one NTFS \"Temporary Storage\" \
         partition holding only its readme and System Volume Information, or a raw local NVMe \
         disk) and mounted; a disk azprov formatted before is mounted as it is; any other disk, \
         and any disk in another state, is never written to.\n.PP\n\
         .B azprov.inplace:\n\
         the initramfs is the OS (linuxkit): PID 1 provisions it, writes /run/config and execs \
         init= in place.\n",
    );
    m.push_str(
        ".SH DISKS\nThe udev rule 66\\-azprov\\-disks.rules names Azure's disks as WALinuxAgent \
         does (/dev/disk/azure/root, resource, scsiN/lunL) and as azure\\-vm\\-utils does \
         (os, resource, data/by\\-lun/L, local/by\\-serial/S), \\-partN for partitions;\n\
         .B azprov disks\nlists them.\n",
    );
    m.push_str(
        ".SH EXIT STATUS\n0 ok (or already provisioned, disabled, not on Azure); 1 provisioning or \
         the network failed; 2 usage or bad input; 3 status cannot tell (the state is readable by \
         root only and this boot left no record).\n",
    );
    m.push_str(
        ".SH FILES\n/var/lib/azprov/ (state, marker, custom data), /var/log/azprov.log, /run/config (azprov.inplace, \\-\\-run\\-config), \
         /run/azprov/boot.json (this boot's outcome, readable by all)\n",
    );
    m.push_str(".SH SEE ALSO\n.BR journalctl (1),\n.BR dracut (8),\n.BR update\\-initramfs (8)\n");
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/azprov.8 is what man_page() makes (regenerate: AZPROV_WRITE_MAN=1 cargo test
    /// man_page), and every subcommand of the usage text has a table entry.
    #[test]
    fn the_man_page_and_the_usage_text_follow_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/azprov.8");
        if std::env::var_os("AZPROV_WRITE_MAN").is_some() {
            std::fs::write(path, man_page()).unwrap();
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == man_page(),
            "docs/azprov.8 is not man_page()'s output: AZPROV_WRITE_MAN=1 cargo test man_page"
        );
        for c in COMMANDS {
            assert!(
                super::super::USAGE.contains(&format!("azprov {}", c.name)),
                "{} is not in the usage text",
                c.name
            );
            for f in c.flags {
                assert!(
                    c.synopsis
                        .iter()
                        .any(|l| l.contains(&format!("--{}", f.name)))
                        || c.synopsis.iter().any(|l| l.contains("[OPTION]")),
                    "{} --{} is not in its synopsis",
                    c.name,
                    f.name
                );
            }
        }
    }
}
