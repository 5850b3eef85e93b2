//! The RSA host key, finished after the handover. ed25519 and ECDSA keys take milliseconds and
//! are in place before the real init starts; an RSA-3072 search takes seconds under emulation
//! and on small VMs, and no sshd needs it to start. So the real init never waits for it: a
//! process of its own (`azprov __host-key-rsa`, started here, argv[0] `@azprov-hostkey` so a
//! systemd initrd leaves it running across switch-root) makes it and writes it through
//! directory handles opened before the handover, which still name the real root's /etc/ssh
//! and /var/lib/azprov wherever switch_root moves them. Then:
//! - the booted system's start and a first login that comes with it do not share the CPU with
//!   it: it waits for the CPUs to be idle (at most a minute), then runs under SCHED_IDLE (a
//!   normal thread that wakes or is forked preempts it at once; on a machine that is never
//!   idle it still gets its share), its session (its own) weighed as nice 19 where the
//!   kernel's autogroups are on (they give every session one nice-0 weight whatever its
//!   threads' priorities);
//! - the key is only ever added: the keys a client may have seen stay (OpenSSH clients learn
//!   added host keys);
//! - a read-only root (the booted system remounts it read-write early) is waited for;
//! - an sshd already running is sent SIGHUP (it re-executes and loads every key); one that
//!   starts later reads it from the start. sshd never starts with no key: the fast ones are
//!   there;
//! - state.json gets its fingerprint, and the console a fingerprint block with every key;
//! - a boot cut short before it finished makes it on the next boot (the reboot path looks for
//!   the file).

use super::{fingerprint_block, fingerprint_line, rsa_now, KeyType, SSH_DIR};
use crate::provision::state::{self, State};
use crate::root::{Sysroot, STATE_DIR};
use ssh_key::LineEnding;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::fchown;
use std::path::Path;
use std::time::{Duration, Instant};

/// The hidden subcommand the helper runs as.
pub const COMMAND: &str = "__host-key-rsa";
const ARGV0: &str = "@azprov-hostkey";
/// The descriptors the helper gets: /etc/ssh, /run, and /var/lib/azprov when there is state.
const SSH_FD: i32 = 3;
const RUN_FD: i32 = 4;
const STATE_FD: i32 = 5;
/// /proc/stat, opened by the parent: the helper's own view of the filesystems is the
/// initramfs's, whose /proc the handover moves into the real root.
const STAT_FD: i32 = 6;
/// /proc itself, for the same reason: where sshd's command is read before it is signalled.
const PROC_FD: i32 = 7;
/// How long a read-only root is waited for, and how often it is tried.
const WRITABLE_WAIT: Duration = Duration::from_secs(900);
const WRITABLE_POLL: Duration = Duration::from_millis(250);
/// When sshd's pid file is looked for after the key is in place (an sshd that started in
/// between has read it, and a SIGHUP to it is harmless).
const SSHD_LOOKS: [u64; 3] = [0, 2, 10];
const KEY: &str = "ssh_host_rsa_key";
/// How long a key the system made is given to get its .pub beside it: 20 looks, 100 ms apart.
const PUB_LOOKS: u32 = 20;
const PUB_PAUSE: Duration = Duration::from_millis(100);
/// The search waits for the CPUs to be idle (`QUIET_IDLE` of their time, `QUIET_SPELLS`
/// spells of `QUIET_SPELL` in a row: the booted system's start, and a first login that comes
/// with it, are over), at most `QUIET_LIMIT`. Under QEMU's TCG with one vCPU, an RSA search
/// running beside that start, even at idle priority, delayed the first SSH login by seconds.
const QUIET_LIMIT: Duration = Duration::from_secs(60);
const QUIET_SPELL: Duration = Duration::from_millis(500);
const QUIET_SPELLS: u32 = 4;
const QUIET_IDLE: f64 = 0.8;

/// Whether the RSA key of this root is still to make: RSA wanted, an sshd config, no key file.
pub fn missing(root: &Sysroot) -> bool {
    root.exists(&format!("{SSH_DIR}/sshd_config")) && !root.exists(&format!("{SSH_DIR}/{KEY}"))
}

/// Starts the helper for `root` (comment `root@hostname`; `fast` are the fingerprint lines of
/// the keys in place already, for the block it prints; `state`: add the fingerprint to
/// state.json). Its pid.
pub fn spawn(root: &Sysroot, hostname: &str, fast: &[String], state: bool) -> std::io::Result<u32> {
    let open = |path: &str| {
        root.resolve_full(path)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(File::open)
    };
    let ssh = open(SSH_DIR)?;
    // where sshd's pid file is; without it, no reload (an sshd that starts later reads the key)
    let run = File::open("/run").ok();
    // state.json only where it lives on the root's own filesystem: a /var that fstab mounts
    // for the run must be unmounted before the handover, which a handle held on it prevents
    let same_fs = |path: &str| {
        use std::os::unix::fs::MetadataExt;
        let root_dev = std::fs::metadata(root.root()).ok().map(|m| m.dev());
        let dev = root
            .resolve_full(path)
            .ok()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.dev());
        root_dev.is_some() && root_dev == dev
    };
    let state_dir = if state && same_fs(STATE_DIR) {
        Some(open(STATE_DIR)?)
    } else {
        if state {
            log::info!("host keys: {STATE_DIR} is a filesystem of its own: the rsa fingerprint goes to the console only");
        }
        None
    };
    let console = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/console")
        .or_else(|_| File::options().write(true).open("/dev/null"))?;
    let hex = |label: Option<Vec<u8>>| {
        label.map(|l| l.iter().map(|b| format!("{b:02x}")).collect::<String>())
    };
    let mut args = vec![
        COMMAND.to_string(),
        "--comment".into(),
        format!("root@{hostname}"),
    ];
    let labels = [
        (
            "--label-key",
            root.label_of(&format!("{SSH_DIR}/{KEY}"), libc::S_IFREG),
        ),
        (
            "--label-pub",
            root.label_of(&format!("{SSH_DIR}/{KEY}.pub"), libc::S_IFREG),
        ),
        (
            "--label-state",
            root.label_of(&format!("{STATE_DIR}/{}", state::FILE), libc::S_IFREG),
        ),
    ];
    for (flag, label) in labels {
        if let Some(h) = hex(label) {
            args.extend([flag.to_string(), h]);
        }
    }
    for line in fast {
        args.extend(["--line".to_string(), line.clone()]);
    }
    let mut fds = vec![(&ssh, SSH_FD)];
    if let Some(r) = &run {
        fds.push((r, RUN_FD));
    }
    if let Some(d) = &state_dir {
        fds.push((d, STATE_FD));
    }
    let stat = File::open("/proc/stat").ok();
    if let Some(f) = &stat {
        fds.push((f, STAT_FD));
    }
    let proc = File::open("/proc").ok();
    if let Some(f) = &proc {
        fds.push((f, PROC_FD));
    }
    let exe = std::path::Path::new("/proc/self/exe");
    let pid = crate::sys::process::spawn_detached(exe, ARGV0, &args, console, &fds)?;
    // its session, its own, weighed as nice 19 beside the others (set from here: the helper
    // may find no /proc of its own once the handover has moved it)
    crate::sys::process::lowest_autogroup(pid);
    Ok(pid)
}

/// Stops this machine's helpers whose /etc/ssh handle is the directory `ssh` (a host path):
/// `azprov clean` must not leave an image that gets a key after it. Their pids; `dry_run`
/// only finds them.
pub fn stop_helpers(ssh: &Path, dry_run: bool) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(want) = std::fs::metadata(ssh) else {
        return Vec::new();
    };
    let mut stopped = Vec::new();
    for name in crate::sys::sorted_names(Path::new("/proc")) {
        let Ok(pid) = name.parse::<i32>() else {
            continue;
        };
        let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.split(|&b| b == 0).next() == Some(ARGV0.as_bytes()));
        let same = std::fs::metadata(format!("/proc/{pid}/fd/{SSH_FD}"))
            .is_ok_and(|m| (m.dev(), m.ino()) == (want.dev(), want.ino()));
        if !(ours && same) {
            continue;
        }
        if !dry_run {
            use nix::sys::signal::{kill, Signal};
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
            let gone = || {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                    s.rsplit(')').next().unwrap_or("").starts_with(" Z")
                })
            };
            let until = Instant::now() + Duration::from_secs(2);
            while !gone() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        stopped.push(pid);
    }
    stopped
}

/// Whether the root this helper writes into was cleaned since it started (`azprov clean`
/// removed the state directory its handle names).
fn cleaned(state: Option<&File>) -> bool {
    use std::os::unix::fs::MetadataExt;
    state.is_some_and(|d| d.metadata().is_ok_and(|m| m.nlink() == 0))
}

/// The helper's entry (`azprov __host-key-rsa`, started by [`spawn`]): the job from its
/// arguments, the directories from its descriptors.
pub fn main(job: &Job) -> Result<(), HelperError> {
    // the booted system's start (sshd, the first login) hardly shares the CPU with it: idle
    // priority (its session was weighed as nice 19 by the parent), and the search begins once
    // that start is over
    crate::sys::process::background_priority();
    let t = Instant::now();
    let quiet = match crate::sys::process::inherited(STAT_FD) {
        Some(stat) => wait_for_quiet(&stat, QUIET_LIMIT),
        None => false,
    };
    log::info!(
        "host keys: the rsa search begins {} s after the helper's start ({})",
        crate::time::secs(t.elapsed()),
        if quiet {
            "the CPUs were idle"
        } else {
            "the CPUs were not seen idle; it runs at idle priority"
        }
    );
    let ssh = crate::sys::process::inherited(SSH_FD).ok_or(HelperError::NoSshDir)?;
    let run_dir = crate::sys::process::inherited(RUN_FD);
    let proc = crate::sys::process::inherited(PROC_FD);
    let state = crate::sys::process::inherited(STATE_FD);
    let sshd = match (&run_dir, &proc) {
        (Some(run), Some(proc)) => Some(SshdDirs { run, proc }),
        _ => None,
    };
    run(job, &ssh, sshd, state.as_ref()).map(drop)
}

/// Where the running sshd is found, as handles the parent opened before the handover: /run
/// (its pid file) and /proc (its command). The helper keeps the initramfs's view of the
/// filesystems, whose /proc and /run the handover moves into the real root; a handle follows
/// the mount wherever it goes.
#[derive(Clone, Copy)]
pub struct SshdDirs<'a> {
    pub run: &'a File,
    pub proc: &'a File,
}

/// What the helper was told.
#[derive(Debug, Default)]
pub struct Job {
    pub comment: String,
    pub label_key: Option<Vec<u8>>,
    pub label_pub: Option<Vec<u8>>,
    pub label_state: Option<Vec<u8>>,
    pub lines: Vec<String>,
}

/// Why the helper put no key in place, or could not record or read one.
#[derive(Debug)]
pub enum HelperError {
    /// The parent handed down no /etc/ssh descriptor.
    NoSshDir,
    /// The key could not be made or encoded.
    Key(String),
    /// `azprov clean` ran while the key was made.
    Cleaned,
    /// A step on a file failed: the step, the file, why.
    File(&'static str, String, std::io::Error),
    /// state.json does not parse.
    State(serde_json::Error),
    /// The key's .pub is not an OpenSSH public key of a type the helper reads.
    UnknownPub,
}

impl std::fmt::Display for HelperError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelperError::NoSshDir => f.write_str("no /etc/ssh handle"),
            HelperError::Key(e) => write!(f, "the rsa key: {e}"),
            HelperError::Cleaned => write!(
                f,
                "the root was cleaned (azprov clean) while the rsa key was made: none written to {SSH_DIR}"
            ),
            HelperError::File(op, file, e) => write!(f, "{op} {file}: {e}"),
            HelperError::State(e) => write!(f, "state.json does not parse: {e}"),
            HelperError::UnknownPub => write!(f, "{KEY}.pub: not an OpenSSH public key of a type it knows"),
        }
    }
}

impl std::error::Error for HelperError {}

/// A failed step on `file` as a [`HelperError`].
fn file_err<'a, E: Into<std::io::Error>>(
    op: &'static str,
    file: &'a str,
) -> impl FnOnce(E) -> HelperError + 'a {
    move |e| HelperError::File(op, file.to_string(), e.into())
}

/// The helper: makes the key, writes it into `ssh` (a handle on the root's /etc/ssh), adds
/// its fingerprint to state.json in `state`, reloads the sshd `sshd` finds, and prints the
/// fingerprint block. Errors are logged; the image's other keys stay either way.
pub fn run(
    job: &Job,
    ssh: &File,
    sshd: Option<SshdDirs>,
    state: Option<&File>,
) -> Result<String, HelperError> {
    let t = Instant::now();
    let key = rsa_now().map_err(|e| HelperError::Key(e.to_string()))?;
    publish(job, key, t.elapsed(), ssh, sshd, state)
}

/// [`run`] once the key (made in `took`) is there: it goes into `ssh` unless a key appeared
/// there meanwhile, which then stays and is the one fingerprinted.
fn publish(
    job: &Job,
    mut key: ssh_key::PrivateKey,
    took: Duration,
    ssh: &File,
    sshd: Option<SshdDirs>,
    state: Option<&File>,
) -> Result<String, HelperError> {
    key.set_comment(&job.comment);
    if cleaned(state) {
        return Err(HelperError::Cleaned);
    }
    let private = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| HelperError::Key(e.to_string()))?;
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| HelperError::Key(e.to_string()))?;
    let ours = fingerprint_line(KeyType::Rsa, &key, &job.comment);
    let deadline = Instant::now() + WRITABLE_WAIT;
    // the key only if none is there: the booted system's own generator (Fedora's
    // sshd-keygen@rsa, SUSE's sshd-gen-keys-start, Arch's sshdgenkeys) may have made one
    // while ours was searched for, and sshd may be offering it already
    let published = write_at(
        ssh,
        KEY,
        private.as_bytes(),
        (0o600, job.label_key.as_deref()),
        Publish::IfAbsent,
        deadline,
    )?;
    let line = if published {
        write_at(
            ssh,
            &format!("{KEY}.pub"),
            format!("{public}\n").as_bytes(),
            (0o644, job.label_pub.as_deref()),
            Publish::Replace,
            deadline,
        )?;
        ssh.sync_all().map_err(file_err("fsync", SSH_DIR))?;
        log::info!(
            "host keys: rsa made in {} ms and written to {SSH_DIR}",
            took.as_millis()
        );
        ours
    } else {
        let there = present_line(ssh)
            .unwrap_or_else(|e| format!("? (the key there could not be read: {e})"));
        log::info!(
            "host keys: an rsa key appeared in {SSH_DIR} while ours was made (the system's \
             own generator): it stays, ours is dropped; {there}"
        );
        there
    };
    // the block first: the console is read as soon as the key is there
    let mut lines = job.lines.clone();
    lines.insert(0, line.clone());
    crate::logger::console_lines(&fingerprint_block(&lines));
    if let Some(dir) = state {
        if let Err(e) = add_to_state(dir, &line, job.label_state.as_deref(), deadline) {
            log::warn!("host keys: state.json: {e}");
        }
    }
    if let (true, Some(dirs)) = (published, sshd) {
        reload_sshd(dirs);
    }
    Ok(line)
}

/// Waits until the CPUs have been idle for `QUIET_SPELLS` spells in a row, or `limit` has
/// passed; true in the first case. `stat` is /proc/stat, read again from its start each time.
fn wait_for_quiet(stat: &File, limit: Duration) -> bool {
    let read = || {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; 512];
        let n = stat.read_at(&mut buf, 0).ok()?;
        idle_and_total(&String::from_utf8_lossy(buf.get(..n)?))
    };
    let start = Instant::now();
    let Some(mut last) = read() else {
        return false;
    };
    let mut spells = 0;
    while start.elapsed() < limit {
        std::thread::sleep(QUIET_SPELL);
        let Some(now) = read() else {
            return false;
        };
        let (idle, total) = (now.0.saturating_sub(last.0), now.1.saturating_sub(last.1));
        spells = if total > 0 && idle as f64 >= QUIET_IDLE * total as f64 {
            spells + 1
        } else {
            0
        };
        if spells == QUIET_SPELLS {
            return true;
        }
        last = now;
    }
    false
}

/// The idle time and the whole time of all CPUs, in ticks, from /proc/stat's first line
/// (`cpu  user nice system idle iowait irq softirq steal ...`; guest time is in user's).
fn idle_and_total(stat: &str) -> Option<(u64, u64)> {
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some((*ticks.get(3)?, ticks.iter().sum()))
}

/// Whether a write may replace a file of that name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publish {
    Replace,
    /// Only if there is none: a file there stays, and the write is dropped.
    IfAbsent,
}

/// `data` as `name` in `dir`, atomically (a temporary beside it, owner root, the mode and
/// SELinux label of `meta`, fsynced, renamed); a read-only filesystem is waited for until
/// `deadline`. Ok(false): `publish` is `IfAbsent` and a file `name` was there.
fn write_at(
    dir: &File,
    name: &str,
    data: &[u8],
    (mode, label): (u32, Option<&[u8]>),
    publish: Publish,
    deadline: Instant,
) -> Result<bool, HelperError> {
    let tmp = format!(".{name}.azprov-tmp");
    let _ = crate::sys::at::remove(dir, &tmp);
    let mut f = loop {
        match crate::sys::at::create_new(dir, &tmp, mode) {
            Ok(f) => break f,
            Err(nix::errno::Errno::EROFS) if Instant::now() < deadline => {
                std::thread::sleep(WRITABLE_POLL);
            }
            Err(e) => return Err(file_err("create", &tmp)(e)),
        }
    };
    let result = (|| {
        f.write_all(data).map_err(file_err("write", &tmp))?;
        fchown(&f, Some(0), Some(0)).map_err(file_err("chown", &tmp))?;
        if let Some(l) = label {
            crate::sys::xattr::fset(&f, "security.selinux", l).map_err(file_err("label", &tmp))?;
        }
        f.sync_all().map_err(file_err("fsync", &tmp))?;
        match publish {
            Publish::Replace => crate::sys::at::rename(dir, &tmp, name).map(|()| true),
            Publish::IfAbsent => crate::sys::at::rename_noreplace(dir, &tmp, name),
        }
        .map_err(file_err("rename", &tmp))
    })();
    if !matches!(result, Ok(true)) {
        let _ = crate::sys::at::remove(dir, &tmp);
    }
    result
}

/// The fingerprint line of the RSA key in `ssh` (as `ssh-keygen -l` prints it), from its
/// private key, or its .pub when the private key is in a format ssh-key does not read.
fn present_line(ssh: &File) -> Result<String, HelperError> {
    use nix::fcntl::OFlag;
    let read = |name: &str| -> Result<String, HelperError> {
        let mut text = String::new();
        crate::sys::at::open(ssh, name, OFlag::O_RDONLY, 0)
            .map_err(file_err("open", name))?
            .read_to_string(&mut text)
            .map_err(file_err("read", name))?;
        Ok(text)
    };
    // the public half the generator writes beside it, a moment after the private one (reading
    // the private key would take an OpenSSH private-key decoder, 20 KB of the binary, for one
    // informational line)
    let pub_name = format!("{KEY}.pub");
    let mut text = read(&pub_name);
    for _ in 0..PUB_LOOKS {
        if text.is_ok() {
            break;
        }
        std::thread::sleep(PUB_PAUSE);
        text = read(&pub_name);
    }
    super::public_fingerprint_line(text?.trim()).ok_or(HelperError::UnknownPub)
}

/// state.json with `line` among its host keys (once).
fn add_to_state(
    dir: &File,
    line: &str,
    label: Option<&[u8]>,
    deadline: Instant,
) -> Result<(), HelperError> {
    let mut bytes = Vec::new();
    crate::sys::at::open(dir, state::FILE, nix::fcntl::OFlag::O_RDONLY, 0)
        .map_err(file_err("open", state::FILE))?
        .read_to_end(&mut bytes)
        .map_err(file_err("read", state::FILE))?;
    let mut state: State = serde_json::from_slice(&bytes).map_err(HelperError::State)?;
    if state.host_keys.iter().any(|l| l == line) {
        return Ok(());
    }
    state.host_keys.insert(0, line.to_string());
    let json = state.to_json();
    let mode = (0o600, label);
    write_at(dir, state::FILE, &json, mode, Publish::Replace, deadline)?;
    dir.sync_all().map_err(file_err("fsync", state::FILE))
}

/// SIGHUP to the sshd whose pid /run/sshd.pid names, once /proc says that pid is sshd; looked
/// for a few times.
fn reload_sshd(dirs: SshdDirs) {
    let start = Instant::now();
    for at in SSHD_LOOKS {
        if let Some(wait) = Duration::from_secs(at).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let read = |dir: &File, name: &str| {
            let mut text = String::new();
            crate::sys::at::open(dir, name, nix::fcntl::OFlag::O_RDONLY, 0)
                .ok()?
                .read_to_string(&mut text)
                .ok()?;
            Some(text)
        };
        let Some(text) = read(dirs.run, "sshd.pid") else {
            continue;
        };
        let pid = match sshd_named(&text, |pid| read(dirs.proc, &format!("{pid}/comm"))) {
            Ok(pid) => pid,
            Err(why) => {
                log::warn!("host keys: sshd.pid: {why}; sshd not reloaded");
                return;
            }
        };
        match crate::sys::process::hangup(pid) {
            Ok(()) => log::info!("host keys: sshd (pid {pid}) reloaded to offer the rsa key"),
            Err(e) => log::warn!("host keys: SIGHUP to sshd (pid {pid}): {e}"),
        }
        return;
    }
}

/// The pid in sshd.pid's `text` when it names a running sshd: a pid above 1 (kill(2) takes -1
/// as every process and 0 as the caller's group) whose command (`comm` of a pid) is sshd.
fn sshd_named(text: &str, comm: impl Fn(i32) -> Option<String>) -> Result<i32, NotSshd> {
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| NotSshd::NoPid(text.trim().to_string()))?;
    if pid <= 1 {
        return Err(NotSshd::Reserved(pid));
    }
    match comm(pid) {
        Some(c) if c.trim() == "sshd" => Ok(pid),
        Some(c) => Err(NotSshd::Other(pid, c.trim().to_string())),
        None => Err(NotSshd::Gone(pid)),
    }
}

/// Why sshd.pid names no sshd to signal.
#[derive(Debug, PartialEq, Eq)]
enum NotSshd {
    NoPid(String),
    /// kill(2) takes -1 as every process and 0 as the caller's group, 1 is init.
    Reserved(i32),
    Other(i32, String),
    Gone(i32),
}

impl std::fmt::Display for NotSshd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotSshd::NoPid(t) => write!(f, "{t:?} is not a pid"),
            NotSshd::Reserved(pid) => write!(f, "{pid} is no sshd's pid"),
            NotSshd::Other(pid, comm) => write!(f, "pid {pid} is {comm:?}, not sshd"),
            NotSshd::Gone(pid) => write!(f, "no process {pid}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the handover the helper has no /proc of its own (it moved into the real root):
    /// sshd is found and signalled through the handles the parent opened. Here the handles
    /// are on stand-ins for /run and /proc, moved away before the helper looks, and the sshd
    /// is a child named sshd in the stand-in /proc.
    #[test]
    fn sshd_is_found_through_the_handles_after_proc_has_moved() {
        use std::os::unix::process::ExitStatusExt;
        let d = std::env::temp_dir().join(format!("azprov-sighup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("run")).unwrap();
        let mut sshd = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(d.join("run/sshd.pid"), format!("{}\n", sshd.id())).unwrap();
        std::fs::create_dir_all(d.join("proc").join(sshd.id().to_string())).unwrap();
        std::fs::write(
            d.join("proc").join(sshd.id().to_string()).join("comm"),
            "sshd\n",
        )
        .unwrap();
        let (run, proc) = (
            File::open(d.join("run")).unwrap(),
            File::open(d.join("proc")).unwrap(),
        );
        // the handover: both move into the real root
        std::fs::create_dir_all(d.join("newroot")).unwrap();
        std::fs::rename(d.join("proc"), d.join("newroot/proc")).unwrap();
        std::fs::rename(d.join("run"), d.join("newroot/run")).unwrap();
        reload_sshd(SshdDirs {
            run: &run,
            proc: &proc,
        });
        let status = sshd.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGHUP), "{status:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_a_pid_above_1_whose_process_is_sshd_is_signalled() {
        let comm = |pid: i32| match pid {
            1 => Some("systemd\n".to_string()),
            77 => Some("sshd\n".to_string()),
            78 => Some("bash\n".to_string()),
            _ => None,
        };
        assert_eq!(sshd_named("77\n", comm), Ok(77));
        for bad in ["-1", "0", "1", "78", "79", "", "x", "77 78"] {
            assert!(sshd_named(bad, comm).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_cpus_idle_and_whole_time_come_from_the_first_line_of_proc_stat() {
        let stat = "cpu  3564177 34608 631725 4849811 32332 0 8745 57276 25 0\n\
                    cpu0 1 2 3 4 5 6 7 8 0 0\nintr 1\n";
        assert_eq!(
            idle_and_total(stat),
            Some((
                4849811,
                3564177 + 34608 + 631725 + 4849811 + 32332 + 8745 + 57276
            ))
        );
        // a kernel older than steal time (2.6.11) gives seven
        assert_eq!(idle_and_total("cpu  1 2 3 4 5 6 7\n"), Some((4, 28)));
        assert_eq!(idle_and_total("cpu0 1 2 3 4\n"), None);
        assert_eq!(idle_and_total("cpu  1 2 x 4\n"), None);
        assert_eq!(idle_and_total(""), None);
        // this machine's
        let here = std::fs::read_to_string("/proc/stat").unwrap();
        let (idle, total) = idle_and_total(&here).unwrap();
        assert!(idle <= total && total > 0);
    }

    #[test]
    fn quiet_is_read_again_and_again_through_one_handle() {
        let stat = File::open("/proc/stat").unwrap();
        // idle or not, the wait ends: the CPUs quiet (four spells) or the limit
        let t = Instant::now();
        let quiet = wait_for_quiet(&stat, Duration::from_millis(2600));
        assert!(t.elapsed() >= QUIET_SPELL * QUIET_SPELLS);
        assert!(quiet || t.elapsed() >= Duration::from_millis(2600));
        // a handle that reads nothing gives up at once
        let empty = File::open("/dev/null").unwrap();
        assert!(!wait_for_quiet(&empty, Duration::from_secs(60)));
    }

    #[test]
    fn the_rsa_key_is_added_through_handles_and_the_state_gets_its_fingerprint() {
        let d = std::env::temp_dir().join(format!("azprov-later-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (ssh, state) = (d.join("etc/ssh"), d.join("var/lib/azprov"));
        std::fs::create_dir_all(&ssh).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(ssh.join("ssh_host_ed25519_key"), "ours\n").unwrap();
        let st = State {
            host_keys: vec!["256 SHA256:x root@vm (ED25519)".into()],
            ..State::default()
        };
        std::fs::write(state.join("state.json"), serde_json::to_vec(&st).unwrap()).unwrap();
        let job = Job {
            comment: "root@vm".into(),
            ..Job::default()
        };
        let (ssh_fd, state_fd) = (File::open(&ssh).unwrap(), File::open(&state).unwrap());
        // the directories move away, as switch_root moves the root: the handles still name them
        let moved = d.join("moved");
        std::fs::rename(d.join("etc"), &moved).unwrap();
        let line = run(&job, &ssh_fd, None, Some(&state_fd)).unwrap();
        assert!(
            line.starts_with("3072 SHA256:") && line.ends_with(" root@vm (RSA)"),
            "{line}"
        );
        let key = std::fs::read_to_string(moved.join("ssh/ssh_host_rsa_key")).unwrap();
        assert!(key.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
        let public = std::fs::read_to_string(moved.join("ssh/ssh_host_rsa_key.pub")).unwrap();
        assert!(public.starts_with("ssh-rsa ") && public.ends_with(" root@vm\n"));
        assert_eq!(
            std::fs::read_to_string(moved.join("ssh/ssh_host_ed25519_key")).unwrap(),
            "ours\n"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(moved.join("ssh/ssh_host_rsa_key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let after: State =
            serde_json::from_slice(&std::fs::read(state.join("state.json")).unwrap()).unwrap();
        assert_eq!(
            after.host_keys,
            [line.clone(), "256 SHA256:x root@vm (ED25519)".into()]
        );
        // nothing left behind
        let names: Vec<_> = std::fs::read_dir(moved.join("ssh"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.to_string_lossy().contains("azprov-tmp")),
            "{names:?}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_key_the_system_made_meanwhile_stays_and_is_the_one_fingerprinted() {
        let d = std::env::temp_dir().join(format!("azprov-later-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (ssh, state) = (d.join("etc/ssh"), d.join("var/lib/azprov"));
        std::fs::create_dir_all(&ssh).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("state.json"), b"{}").unwrap();
        // sshd-keygen@rsa made this one while the helper searched; sshd offers it already
        let mut theirs = rsa_now().unwrap();
        theirs.set_comment("root@image");
        let theirs_text = theirs.to_openssh(LineEnding::LF).unwrap().to_string();
        std::fs::write(ssh.join(KEY), &theirs_text).unwrap();
        // its .pub a moment later, as ssh-keygen writes it
        let pub_text = format!("{}\n", theirs.public_key().to_openssh().unwrap());
        let pub_path = ssh.join(format!("{KEY}.pub"));
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            std::fs::write(pub_path, pub_text).unwrap();
        });
        let their_line = fingerprint_line(KeyType::Rsa, &theirs, "root@image");
        let job = Job {
            comment: "root@vm".into(),
            ..Job::default()
        };
        let (ssh_fd, state_fd) = (File::open(&ssh).unwrap(), File::open(&state).unwrap());
        let ours = rsa_now().unwrap();
        let line = publish(&job, ours, Duration::ZERO, &ssh_fd, None, Some(&state_fd)).unwrap();
        writer.join().unwrap();
        assert_eq!(line, their_line, "the key that is there is the one said");
        assert_eq!(
            std::fs::read_to_string(ssh.join(KEY)).unwrap(),
            theirs_text,
            "the key sshd offers did not change"
        );
        assert_eq!(
            std::fs::read_to_string(ssh.join(format!("{KEY}.pub"))).unwrap(),
            format!("{}\n", theirs.public_key().to_openssh().unwrap()),
            "no .pub of ours beside their key"
        );
        assert_eq!(
            crate::sys::sorted_names(&ssh),
            [KEY.to_string(), format!("{KEY}.pub")],
            "no temporary"
        );
        let after: State =
            serde_json::from_slice(&std::fs::read(state.join("state.json")).unwrap()).unwrap();
        assert_eq!(after.host_keys, [their_line]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn clean_stops_the_helper_of_its_root_and_a_helper_of_a_cleaned_root_writes_nothing() {
        let d = std::env::temp_dir().join(format!("azprov-later-clean-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (ssh, other, state) = (d.join("etc/ssh"), d.join("other"), d.join("var/lib/azprov"));
        for dir in [&ssh, &other, &state] {
            std::fs::create_dir_all(dir).unwrap();
        }
        // a helper-to-be: its name and its /etc/ssh handle, as spawn gives them
        let handle = File::open(&ssh).unwrap();
        let stderr = File::create(d.join("err")).unwrap();
        let pid = crate::sys::process::spawn_detached(
            Path::new("/bin/sleep"),
            ARGV0,
            &["30".into()],
            stderr,
            &[(&handle, SSH_FD)],
        )
        .unwrap() as i32;
        // /proc shows the exec'd name once the child has exec'd
        let named = || {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"@azprov"))
        };
        let t = Instant::now();
        while !named() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            stop_helpers(&other, false),
            Vec::<i32>::new(),
            "another root's"
        );
        assert_eq!(stop_helpers(&ssh, true), [pid], "a dry run finds it");
        assert_eq!(stop_helpers(&ssh, false), [pid]);
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Signaled(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
                false
            )
        );

        // the state directory removed under a helper's handle: no key
        let state_fd = File::open(&state).unwrap();
        std::fs::remove_dir_all(&state).unwrap();
        let job = Job {
            comment: "root@vm".into(),
            ..Job::default()
        };
        let key = rsa_now().unwrap();
        let e = publish(&job, key, Duration::ZERO, &handle, None, Some(&state_fd)).unwrap_err();
        assert!(matches!(e, HelperError::Cleaned), "{e}");
        assert!(crate::sys::sorted_names(&ssh).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
