//! Flags after the subcommand: `--name VALUE`, `--name=VALUE`, switches, and positionals.

use super::{usage, CliError};
use std::collections::BTreeMap;
use std::time::Duration;

/// Flags after the subcommand: `--name VALUE`, `--name=VALUE`, switches, and positionals.
#[derive(Debug, Default)]
pub struct Args {
    pub positional: Vec<String>,
    values: BTreeMap<&'static str, Vec<String>>,
    switches: Vec<&'static str>,
}

impl Args {
    /// The flags of `command` as its help table lists them ([`super::help::COMMANDS`]).
    pub fn for_command(args: &[String], command: &str) -> Result<Args, CliError> {
        let c = super::help::command(command)
            .ok_or_else(|| CliError::Failed(format!("no help table entry for {command}")))?;
        Args::parse(args, &c.valued(), &c.switches())
    }

    pub fn parse(
        args: &[String],
        valued: &[&'static str],
        switches: &[&'static str],
    ) -> Result<Args, CliError> {
        let mut out = Args::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                out.positional.extend(it.by_ref().cloned());
                break;
            }
            let Some(name) = a.strip_prefix("--") else {
                out.positional.push(a.clone());
                continue;
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (name, None),
            };
            if let Some(flag) = valued.iter().find(|f| **f == name) {
                let v = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| usage(format!("--{name} needs a value")))?,
                };
                out.values.entry(flag).or_default().push(v);
            } else if let Some(flag) = switches.iter().find(|f| **f == name) {
                if inline.is_some() {
                    return Err(usage(format!("--{name} takes no value")));
                }
                out.switches.push(flag);
            } else {
                return Err(usage(format!("unknown option --{name}")));
            }
        }
        Ok(out)
    }

    pub fn value(&self, name: &str) -> Result<Option<&str>, CliError> {
        match self.values.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([v]) => Ok(Some(v)),
            Some(_) => Err(usage(format!("--{name} given more than once"))),
        }
    }

    pub fn values(&self, name: &str) -> &[String] {
        self.values.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn has(&self, name: &str) -> bool {
        self.switches.contains(&name)
    }

    pub fn timeout(&self, default: Duration) -> Result<Duration, CliError> {
        match self.value("timeout")? {
            None => Ok(default),
            Some(s) => crate::time::parse_secs(s)
                .ok_or_else(|| usage(format!("--timeout: not a number of seconds: {s:?}"))),
        }
    }

    pub fn no_positionals(&self) -> Result<(), CliError> {
        match self.positional.first() {
            Some(p) => Err(usage(format!("unexpected argument {p:?}"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn flags_in_both_forms() {
        let a = Args::parse(
            &s(&["ready", "--timeout=5", "--wireserver", "1.2.3.4"]),
            &["timeout", "wireserver"],
            &["json"],
        )
        .unwrap();
        assert_eq!(a.positional, ["ready"]);
        assert_eq!(a.value("timeout").unwrap(), Some("5"));
        assert_eq!(a.value("wireserver").unwrap(), Some("1.2.3.4"));
        assert!(!a.has("json"));
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for bad in [&["--nope"][..], &["--timeout"], &["--json=1"]] {
            let e = Args::parse(&s(bad), &["timeout"], &["json"]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        let a = Args::parse(&s(&["--timeout", "1", "--timeout", "2"]), &["timeout"], &[]).unwrap();
        assert!(a.value("timeout").is_err());
        assert!(a.timeout(Duration::from_secs(1)).is_err());
    }
}
