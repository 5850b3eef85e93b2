//! `azprov clean [--root DIR] [--user] [--machine-id] [--dry-run] [--json]`: prepares an image
//! for capture (see `provision::clean`).

use super::{print_json, usage, Args, CliError};
use crate::provision::clean::{clean, CleanOptions};
use crate::root::Sysroot;
use std::path::Path;

pub(super) fn cmd_clean(args: &[String]) -> Result<(), CliError> {
    let a = Args::for_command(args, "clean")?;
    a.no_positionals()?;
    let root = a.value("root")?.unwrap_or("/");
    if !Path::new(root).is_dir() {
        return Err(usage(format!("--root {root}: not a directory")));
    }
    let o = CleanOptions {
        user: a.has("user"),
        machine_id: a.has("machine-id"),
        dry_run: a.has("dry-run"),
    };
    let c = clean(&Sysroot::new(root), o)
        .map_err(|e| CliError::Failed(format!("clean {root}: {e}")))?;
    if a.has("json") {
        return print_json(&c);
    }
    let verb = if o.dry_run { "would remove" } else { "removed" };
    for p in &c.removed {
        println!("{verb} {p}");
    }
    if c.machine_id {
        let verb = if o.dry_run { "would set" } else { "set" };
        println!("{verb} /etc/machine-id to uninitialized");
    }
    for n in &c.notes {
        println!("note: {n}");
    }
    if c.removed.is_empty() && !c.machine_id {
        println!("nothing to clean in {root}");
    }
    Ok(())
}
