//! Custom data and user data that are scripts, run once per VM in the booted system
//! (`azprov run-scripts`, from the unit `azprov-scripts.service` the package ships: after the
//! network is online and after multi-user.target, as cloud-init's final stage). What cloud-init and waagent do for `#!`
//! custom data, and nothing more: only data starting with `#!` runs; `#cloud-config` and other
//! formats are said to be left alone, in one line. A script runs as root, its output in the
//! journal under the unit's identifier `azprov`, its exit status recorded in
//! `/var/lib/azprov/scripts.json` (which `azprov status` shows). It never runs twice for one
//! VM id (the start is recorded, durably, before it runs, so a crash or a reboot during it does
//! not run it again), and never on a VM azprov did not provision. `/etc/azprov/no-scripts` in
//! the image turns it off.

use super::state::State;
use crate::root::{Sysroot, STATE_DIR};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const FILE: &str = "scripts.json";
/// The file whose presence in the image turns scripts off.
pub const OFF: &str = "/etc/azprov/no-scripts";
/// The data that may be scripts, in the order they run.
const SOURCES: [&str; 2] = ["customdata", "userdata"];

/// One run of one script.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ran {
    pub started_at: String,
    /// None: started, never seen to finish (the VM went down while it ran). A script killed by
    /// a signal has 128 + its number, as a shell says, and the signal's name in `signal`.
    pub exit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    pub finished_at: Option<String>,
}

/// How a script ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exit(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Ended {
    /// The exit status as a shell gives it: 128 + the signal for a killed script.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exit(c) => c,
            Ended::Signal(s) => 128 + s,
        }
    }

    /// The signal's name (SIGTERM), when a signal ended it.
    pub fn signal(self) -> Option<String> {
        match self {
            Ended::Exit(_) => None,
            Ended::Signal(s) => Some(
                nix::sys::signal::Signal::try_from(s)
                    .map_or_else(|_| format!("signal {s}"), |sig| sig.as_str().to_string()),
            ),
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.signal() {
            Some(name) => write!(f, "killed by {name} (exit {})", self.code()),
            None => write!(f, "exit {}", self.code()),
        }
    }
}

/// What ran for which VM.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    pub vm_id: Option<String>,
    pub ran: BTreeMap<String, Ran>,
}

impl Record {
    pub fn load(root: &Sysroot) -> Option<Record> {
        let bytes = root.read(&format!("{STATE_DIR}/{FILE}")).ok().flatten()?;
        serde_json::from_slice(&bytes).ok()
    }

    fn save(&self, root: &Sysroot) -> Result<(), ScriptError> {
        let json = serde_json::to_vec_pretty(self).unwrap_or_default();
        root.write_state(FILE, &json).map_err(ScriptError::Record)
    }
}

/// Why a script did not run, or its run could not be recorded; never quoting the data
/// (custom data is a secret).
#[derive(Debug)]
pub enum ScriptError {
    /// The script's file could not be read.
    Read(std::io::Error),
    /// Its `#!` line ends in a carriage return: CRLF line ends, which the kernel refuses.
    CrLf,
    NoInterpreter,
    /// The interpreter its `#!` names did not start.
    Start(std::io::Error),
    /// It ended with neither an exit code nor a signal.
    NoStatus(String),
    /// scripts.json could not be written, or the data's path resolved.
    Record(crate::root::WriteError),
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScriptError::Read(e) => write!(f, "it cannot be read: {e}"),
            ScriptError::CrLf => f.write_str(
                "its #! line ends in a carriage return (CRLF line ends: saved on Windows?); \
                 convert it to LF line ends",
            ),
            ScriptError::NoInterpreter => f.write_str("its #! names no interpreter"),
            ScriptError::Start(e) => write!(f, "the interpreter its #! names did not start: {e}"),
            ScriptError::NoStatus(s) => write!(f, "it ended as no exit status says: {s}"),
            ScriptError::Record(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ScriptError {}

/// What one source is.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    Script,
    CloudConfig,
    Other,
}

/// `#!` is a script; `#cloud-config` (and cloud-init's other `#` headers) is not ours.
pub fn kind(data: &[u8]) -> Kind {
    if data.starts_with(b"#!") {
        Kind::Script
    } else if data.starts_with(b"#cloud-config")
        || data.starts_with(b"#include")
        || data.starts_with(b"#cloud-boothook")
    {
        Kind::CloudConfig
    } else {
        Kind::Other
    }
}

/// Runs the scripts of this VM that have not run for it; `run` executes one (a path) and
/// returns its exit status. Returns what it did, one line each.
pub fn run_once(
    root: &Sysroot,
    run: &dyn Fn(&Path) -> Result<Ended, ScriptError>,
) -> Result<Vec<String>, ScriptError> {
    if root.exists(OFF) {
        return Ok(vec![format!("scripts are off ({OFF} exists)")]);
    }
    let Some(marker) = root.read_marker() else {
        return Ok(vec!["not provisioned by azprov: no script runs".into()]);
    };
    let state = State::load(root).unwrap_or_default();
    // the data is the marker's VM's; a later run for another VM that failed left no data of
    // its own (it removed the earlier VM's), and none of the earlier VM's runs for it
    if let Some(latest) = state.vm_id.as_deref().filter(|id| *id != marker) {
        return Ok(vec![format!(
            "the last run was for VM {latest} and did not finish; {STATE_DIR} holds no data of it: no script runs"
        )]);
    }
    let vm_id = marker.clone();
    let mut record = Record::load(root).unwrap_or_default();
    if record.vm_id.as_deref() != Some(vm_id.as_str()) {
        record = Record {
            vm_id: Some(vm_id.clone()),
            ran: BTreeMap::new(),
        };
    }
    let mut said = Vec::new();
    for source in SOURCES {
        let Some(data) = root.read(&format!("{STATE_DIR}/{source}")).ok().flatten() else {
            continue;
        };
        match kind(&data) {
            Kind::CloudConfig => {
                said.push(format!(
                    "{source}: cloud-init format, not interpreted (azprov runs only #! scripts)"
                ));
                continue;
            }
            Kind::Other => {
                said.push(format!("{source}: not a script (no #!), stored only"));
                continue;
            }
            Kind::Script => {}
        }
        if let Some(r) = record.ran.get(source) {
            said.push(format!(
                "{source}: ran for this VM already (started {}, exit {})",
                r.started_at,
                r.exit.map_or("unknown".into(), |e| e.to_string())
            ));
            continue;
        }
        // recorded before it runs: a VM that goes down while it runs never runs it again
        record.ran.insert(
            source.to_string(),
            Ran {
                started_at: crate::time::now_rfc3339(),
                ..Ran::default()
            },
        );
        record.save(root)?;
        let path = root
            .resolve(&format!("{STATE_DIR}/{source}"))
            .map_err(ScriptError::Record)?;
        let exit = run(&path);
        let ran = record.ran.entry(source.to_string()).or_default();
        ran.finished_at = Some(crate::time::now_rfc3339());
        match exit {
            Ok(ended) => {
                ran.exit = Some(ended.code());
                ran.signal = ended.signal();
                said.push(format!("{source}: script ran, {ended}"));
            }
            Err(e) => said.push(format!("{source}: script did not run: {e}")),
        }
        record.save(root)?;
    }
    if said.is_empty() {
        said.push("no custom data or user data".into());
    }
    Ok(said)
}

/// Executes the script at `path` as the kernel would (its `#!` names the interpreter), its
/// output this process's (the journal, under the unit). The file is 0600: it is given to the
/// interpreter as its argument. A `#!` line with a carriage return (a script saved with CRLF
/// line ends) is refused, as the kernel, cloud-init and waagent refuse it: `/bin/sh\r` names
/// no interpreter. The error never quotes the data (custom data is a secret).
pub fn execute(path: &Path) -> Result<Ended, ScriptError> {
    use std::os::unix::process::ExitStatusExt;
    let data = std::fs::read(path).map_err(ScriptError::Read)?;
    let first = data.split(|&b| b == b'\n').next().unwrap_or_default();
    if first.contains(&b'\r') {
        return Err(ScriptError::CrLf);
    }
    let line = String::from_utf8_lossy(first.get(2..).unwrap_or_default())
        .trim()
        .to_string();
    let mut words = line.split_whitespace();
    let interpreter = words.next().ok_or(ScriptError::NoInterpreter)?;
    let status = std::process::Command::new(interpreter)
        .args(words)
        .arg(path)
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(ScriptError::Start)?;
    match (status.code(), status.signal()) {
        (Some(code), _) => Ok(Ended::Exit(code)),
        (None, Some(sig)) => Ok(Ended::Signal(sig)),
        (None, None) => Err(ScriptError::NoStatus(status.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn root_with(data: &[(&str, &str)]) -> (std::path::PathBuf, Sysroot) {
        let d = std::env::temp_dir().join(format!(
            "azprov-scripts-{}-{}",
            std::process::id(),
            data.len()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("var/lib/azprov")).unwrap();
        std::fs::create_dir_all(d.join("etc/azprov")).unwrap();
        for (name, text) in data {
            std::fs::write(d.join("var/lib/azprov").join(name), text).unwrap();
        }
        (d.clone(), Sysroot::new(d))
    }

    #[test]
    #[cfg_attr(
        azprov_unprivileged,
        ignore = "needs root: the record is written root-owned (runs as root and under CI=true)"
    )]
    fn a_script_runs_once_per_vm_and_other_formats_are_named_not_run() {
        let (d, root) = root_with(&[
            ("provisioned", "vm-1\n"),
            ("customdata", "#!/bin/sh\necho hi\n"),
            ("userdata", "#cloud-config\npackages: [x]\n"),
        ]);
        let runs = RefCell::new(Vec::new());
        let run = |p: &Path| {
            runs.borrow_mut().push(p.to_path_buf());
            Ok(Ended::Exit(3))
        };
        let said = run_once(&root, &run).unwrap();
        assert_eq!(runs.borrow().len(), 1);
        assert!(
            said[0].contains("customdata: script ran, exit 3"),
            "{said:?}"
        );
        assert!(
            said[1].contains("userdata: cloud-init format, not interpreted"),
            "{said:?}"
        );
        let rec = Record::load(&root).unwrap();
        assert_eq!(rec.vm_id.as_deref(), Some("vm-1"));
        assert_eq!(rec.ran["customdata"].exit, Some(3));
        // a reboot: nothing runs again
        let said = run_once(&root, &run).unwrap();
        assert_eq!(runs.borrow().len(), 1);
        assert!(said[0].contains("ran for this VM already"), "{said:?}");
        // a new VM id whose deployment brought the same script (the run wrote it again): it
        // runs again
        std::fs::write(d.join("var/lib/azprov/provisioned"), "vm-2\n").unwrap();
        run_once(&root, &run).unwrap();
        assert_eq!(runs.borrow().len(), 2);
        // turned off in the image
        std::fs::write(d.join("var/lib/azprov/provisioned"), "vm-3\n").unwrap();
        std::fs::write(d.join("etc/azprov/no-scripts"), "").unwrap();
        let said = run_once(&root, &run).unwrap();
        assert_eq!(runs.borrow().len(), 2);
        assert!(said[0].contains("scripts are off"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn nothing_runs_on_a_vm_azprov_did_not_provision() {
        let (d, root) = root_with(&[("customdata", "#!/bin/sh\necho hi\n")]);
        let run = |_: &Path| -> Result<Ended, ScriptError> { panic!("ran") };
        let said = run_once(&root, &run).unwrap();
        assert!(said[0].contains("not provisioned by azprov"));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The disk of VM A booted as VM B, whose run failed before its writes: the marker still
    /// names A, state.json names B. A's script is not B's: nothing runs.
    #[test]
    fn an_earlier_vms_script_never_runs_for_a_vm_whose_run_did_not_finish() {
        let (d, root) = root_with(&[
            ("provisioned", "vm-a\n"),
            ("state.json", r#"{"vm_id": "vm-b", "report": "failure"}"#),
            ("customdata", "#!/bin/sh\necho A-SECRET\n"),
            ("x", ""),
        ]);
        let run = |_: &Path| -> Result<Ended, ScriptError> { panic!("an earlier VM's script ran") };
        let said = run_once(&root, &run).unwrap();
        assert!(said[0].contains("the last run was for VM vm-b"), "{said:?}");
        assert!(!said[0].contains("A-SECRET"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn kinds() {
        assert_eq!(kind(b"#!/bin/bash\n"), Kind::Script);
        assert_eq!(kind(b"#cloud-config\n"), Kind::CloudConfig);
        assert_eq!(kind(b"hello"), Kind::Other);
        assert_eq!(kind(b""), Kind::Other);
    }

    #[test]
    fn a_script_is_executed_by_its_interpreter_with_its_exit_status() {
        let d = std::env::temp_dir().join(format!("azprov-exec-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let s = d.join("s");
        std::fs::write(
            &s,
            "#!/bin/sh -e\necho \"$0\" > \"$(dirname \"$0\")/out\"\nexit 7\n",
        )
        .unwrap();
        assert_eq!(execute(&s).unwrap(), Ended::Exit(7));
        assert_eq!(
            std::fs::read_to_string(d.join("out")).unwrap().trim(),
            s.to_str().unwrap()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    fn script(name: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let d = std::env::temp_dir().join(format!("azprov-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let s = d.join("customdata");
        std::fs::write(&s, text).unwrap();
        (d, s)
    }

    #[test]
    fn a_crlf_script_is_refused_as_the_kernel_refuses_it_and_its_text_is_not_quoted() {
        let (d, s) = script("crlf", "#!/bin/sh\r\ntouch \"$(dirname \"$0\")/made\"\r\n");
        let e = execute(&s).unwrap_err().to_string();
        assert!(e.contains("carriage return"), "{e}");
        assert!(!e.contains("/bin/sh") && !e.contains("touch"), "{e}");
        assert!(!d.join("made").exists(), "it ran");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_interpreter_that_is_not_there_is_said_without_quoting_it() {
        let (d, s) = script("noint", "#!/nonexistent/SECRET-WORD -x\necho hi\n");
        let e = execute(&s).unwrap_err().to_string();
        assert!(
            e.starts_with("the interpreter its #! names did not start"),
            "{e}"
        );
        assert!(!e.contains("SECRET-WORD"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    #[cfg_attr(
        azprov_unprivileged,
        ignore = "needs root: the record is written root-owned (runs as root and under CI=true)"
    )]
    fn a_script_killed_by_a_signal_is_recorded_as_128_plus_it_with_its_name() {
        let (_, s) = script("sigterm", "#!/bin/sh\nkill -TERM $$\n");
        let ended = execute(&s).unwrap();
        assert_eq!(ended, Ended::Signal(15));
        assert_eq!(ended.to_string(), "killed by SIGTERM (exit 143)");
        let (d, root) = root_with(&[
            ("provisioned", "vm-1\n"),
            ("customdata", "#!/bin/sh\nkill -TERM $$\n"),
        ]);
        let said = run_once(&root, &execute).unwrap();
        assert_eq!(
            said,
            ["customdata: script ran, killed by SIGTERM (exit 143)"]
        );
        let rec = Record::load(&root).unwrap();
        assert_eq!(rec.ran["customdata"].exit, Some(143));
        assert_eq!(rec.ran["customdata"].signal.as_deref(), Some("SIGTERM"));
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(s.parent().unwrap());
    }
}
