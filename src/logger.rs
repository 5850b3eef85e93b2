//! The `log` facade's sink. Tool mode writes `azprov: LEVEL: message` lines to stderr. Hook
//! mode ([`hook_output`]) puts each line once into the system's journal with the identifier
//! `azprov` (through /dev/log when a journald or syslog daemon listens, else /dev/kmsg inside
//! an initramfs) and also on stderr for the console. As PID 1 the lines go to /dev/console until
//! /dev/kmsg exists, then to kmsg with the `azprov:` tag, so they land in the real system's
//! journal. Extra sinks (the in-memory capture for /var/log/azprov.log) get every line too.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// The syslog identifier of every line azprov sends to the journal (`journalctl -t azprov`).
pub const IDENT: &str = "azprov";
const DEV_LOG: &str = "/dev/log";
const DEV_KMSG: &str = "/dev/kmsg";
const PRINTK_DEVKMSG: &str = "/proc/sys/kernel/printk_devkmsg";
/// `tee_from` when no line goes to stderr besides the main output.
const NO_TEE: u8 = u8::MAX;
/// syslog facility "daemon".
const LOG_DAEMON: u8 = 3;

/// Where lines go first.
pub enum Output {
    Stderr,
    /// /dev/console: plain lines.
    Console(std::fs::File),
    /// /dev/kmsg: one `<priority>azprov: message` record per write.
    Kmsg(std::fs::File),
    /// /dev/log: one `<facility*8+priority>azprov[PID]: message` datagram per line.
    Syslog(UnixDatagram),
    /// stderr, which systemd connected to the journal (a unit with `StandardError=journal`),
    /// and each line on /dev/console too, where the unit's output does not go.
    Journal(Option<std::fs::File>),
}

/// syslog severities: err 3, warning 4, notice 5 (info lines stay visible on a `loglevel=6`
/// console), debug 7.
fn severity(l: Level) -> u8 {
    match l {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 5,
        Level::Debug | Level::Trace => 7,
    }
}

/// One /dev/log datagram in the RFC 3164 shape journald and rsyslog parse (no timestamp:
/// the receiver stamps it).
pub fn syslog_record(level: Level, pid: u32, msg: &str) -> String {
    format!(
        "<{}>{IDENT}[{pid}]: {msg}",
        LOG_DAEMON * 8 + severity(level)
    )
}

struct Logger {
    level: Mutex<LevelFilter>,
    out: Mutex<Output>,
    /// Lines of this syslog severity and above (less urgent) go to stderr too (hook mode: the
    /// console), beside the journal; `NO_TEE` for none.
    tee_from: AtomicU8,
    extra: Mutex<Vec<Box<dyn Write + Send>>>,
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        self.level.lock().map(|l| m.level() <= *l).unwrap_or(true)
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let level = match r.level() {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        let msg = errno_names(&r.args().to_string());
        let line = format!("azprov: {level}: {msg}\n");
        if let Ok(mut out) = self.out.lock() {
            match &mut *out {
                Output::Stderr => {
                    let _ = std::io::stderr().write_all(line.as_bytes());
                }
                Output::Console(f) => {
                    let _ = f.write_all(line.as_bytes());
                }
                Output::Kmsg(f) => {
                    let rec = format!("<{}>{IDENT}: {msg}\n", severity(r.level()));
                    let _ = f.write_all(rec.as_bytes());
                }
                Output::Syslog(sock) => {
                    let rec = syslog_record(r.level(), std::process::id(), &msg);
                    let _ = sock.send(rec.as_bytes());
                }
                Output::Journal(console) => {
                    let _ = std::io::stderr().write_all(line.as_bytes());
                    if let Some(c) = console {
                        let _ = c.write_all(line.as_bytes());
                    }
                }
            }
        }
        if severity(r.level()) >= self.tee_from.load(Ordering::Relaxed) {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        if let Ok(mut sinks) = self.extra.lock() {
            if !sinks.is_empty() {
                // the log file: each line stamped
                let stamped = format!("{} {line}", crate::time::log_stamp());
                for s in sinks.iter_mut() {
                    let _ = s.write_all(stamped.as_bytes());
                }
            }
        }
    }

    fn flush(&self) {
        if let Ok(mut sinks) = self.extra.lock() {
            for s in sinks.iter_mut() {
                let _ = s.flush();
            }
        }
    }
}

/// `… (os error 2)` as `… (ENOENT)`: the errno's name, which a reader can search for.
pub fn errno_names(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find("(os error ") {
        let tail = &rest[i + "(os error ".len()..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        match (
            tail[..digits].parse::<i32>(),
            tail[digits..].starts_with(')'),
        ) {
            (Ok(n), true) => {
                out.push_str(&rest[..i]);
                out.push_str(&format!("({:?})", crate::sys::Errno::from_raw(n)));
                rest = &tail[digits + 1..];
            }
            _ => {
                out.push_str(&rest[..i + 1]);
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

static LOGGER: std::sync::OnceLock<Logger> = std::sync::OnceLock::new();

/// Installs the logger once; a later call changes the level.
pub fn init(level: LevelFilter) {
    let logger = LOGGER.get_or_init(|| Logger {
        level: Mutex::new(level),
        out: Mutex::new(Output::Stderr),
        tee_from: AtomicU8::new(NO_TEE),
        extra: Mutex::new(Vec::new()),
    });
    let _ = log::set_logger(logger);
    if let Ok(mut l) = logger.level.lock() {
        *l = level;
    }
    log::set_max_level(level);
}

/// Sends lines to `out` from now on (PID 1: the console, then kmsg).
pub fn set_output(out: Output) {
    if let Some(l) = LOGGER.get() {
        if let Ok(mut o) = l.out.lock() {
            *o = out;
        }
    }
}

/// Hook mode's outputs, chosen once per run; dropping it goes back to stderr alone (and
/// restores the kernel's rate limit on /dev/kmsg writers if it was lifted).
pub struct HookOutput {
    devkmsg: Option<String>,
}

/// Chooses hook mode's outputs: stderr when it already goes to the journal (a systemd unit:
/// `$JOURNAL_STREAM` names it, and the unit sets the identifier), and /dev/console beside it; /dev/log plus stderr
/// when a journald or syslog daemon listens; /dev/kmsg inside an initramfs without one
/// (initramfs-tools: the journal imports the kernel buffer later), plus stderr for the lines
/// the kernel does not print on the console itself; else stderr.
pub fn hook_output() -> HookOutput {
    let mut guard = HookOutput { devkmsg: None };
    let (out, tee) = if stderr_is_journal() {
        let console = std::fs::OpenOptions::new().write(true).open("/dev/console");
        (Output::Journal(console.ok()), NO_TEE)
    } else if let Some(sock) = syslog_socket(Path::new(DEV_LOG)) {
        (Output::Syslog(sock), 0)
    } else if in_initramfs() {
        match std::fs::OpenOptions::new().write(true).open(DEV_KMSG) {
            Ok(f) => {
                // the kernel drops a writer's lines past 10 per 5 s unless printk_devkmsg=on
                guard.devkmsg = std::fs::read_to_string(PRINTK_DEVKMSG)
                    .ok()
                    .filter(|v| v.trim() == "ratelimit")
                    .filter(|_| std::fs::write(PRINTK_DEVKMSG, "on\n").is_ok());
                // the kernel prints records more urgent than console_loglevel on the console
                // itself (stderr is the console here): only the others go to stderr too
                (Output::Kmsg(f), console_loglevel())
            }
            Err(_) => (Output::Stderr, NO_TEE),
        }
    } else {
        (Output::Stderr, NO_TEE)
    };
    set_output(out);
    if let Some(l) = LOGGER.get() {
        l.tee_from.store(tee, Ordering::Relaxed);
    }
    guard
}

impl Drop for HookOutput {
    fn drop(&mut self) {
        set_output(Output::Stderr);
        if let Some(l) = LOGGER.get() {
            l.tee_from.store(NO_TEE, Ordering::Relaxed);
        }
        if let Some(v) = self.devkmsg.take() {
            let _ = std::fs::write(PRINTK_DEVKMSG, v);
        }
    }
}

/// The first field of /proc/sys/kernel/printk: records with a severity below it reach the
/// console (the kernel's default 7 when unreadable).
fn console_loglevel() -> u8 {
    std::fs::read_to_string("/proc/sys/kernel/printk")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(7)
}

/// systemd sets `$JOURNAL_STREAM` to `DEV:INODE` of the stream it connected to the journal.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(m) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    v == format!("{}:{}", m.dev(), m.ino())
}

/// A datagram socket connected to a syslog socket such as /dev/log, if one listens there.
pub fn syslog_socket(path: &Path) -> Option<UnixDatagram> {
    let sock = UnixDatagram::unbound().ok()?;
    sock.connect(path).ok()?;
    Some(sock)
}

/// Whether `/` is an initramfs (rootfs: ramfs or tmpfs) rather than an installed system.
fn in_initramfs() -> bool {
    use nix::sys::statfs::{statfs, FsType, TMPFS_MAGIC};
    // linux/magic.h; nix names only tmpfs's
    const RAMFS_MAGIC: u32 = 0x8584_58f6;
    statfs("/").is_ok_and(|s| {
        let t = s.filesystem_type();
        t == TMPFS_MAGIC || t == FsType(RAMFS_MAGIC as _)
    })
}

/// Writes `lines` as they are, without the `azprov:` prefix, where a person or a tool reads
/// the console (Azure's boot diagnostics: the serial console): /dev/console as PID 1, stderr
/// in hook and tool mode; and to the extra sinks (the root's log file).
pub fn console_lines(lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    if let Some(l) = LOGGER.get() {
        if let Ok(mut out) = l.out.lock() {
            match &mut *out {
                Output::Console(f) => {
                    let _ = f.write_all(text.as_bytes());
                }
                Output::Kmsg(_) => {
                    let console = std::fs::OpenOptions::new().write(true).open("/dev/console");
                    let _ = match console {
                        Ok(mut f) => f.write_all(text.as_bytes()),
                        Err(_) => std::io::stderr().write_all(text.as_bytes()),
                    };
                }
                Output::Stderr | Output::Syslog(_) => {
                    let _ = std::io::stderr().write_all(text.as_bytes());
                }
                Output::Journal(console) => {
                    let _ = std::io::stderr().write_all(text.as_bytes());
                    if let Some(c) = console {
                        let _ = c.write_all(text.as_bytes());
                    }
                }
            }
        }
        if let Ok(mut sinks) = l.extra.lock() {
            for s in sinks.iter_mut() {
                let _ = s.write_all(text.as_bytes());
            }
        }
    }
}

/// Adds a sink that receives every line from now on (e.g. /var/log/azprov.log in the root).
pub fn add_sink(sink: Box<dyn Write + Send>) {
    if let Some(l) = LOGGER.get() {
        if let Ok(mut sinks) = l.extra.lock() {
            sinks.push(sink);
        }
    }
}

/// Parses `debug`, `info`, `warn` (the `azprov.log=` values).
pub fn parse_level(s: &str) -> Option<LevelFilter> {
    match s {
        "debug" => Some(LevelFilter::Debug),
        "info" => Some(LevelFilter::Info),
        "warn" => Some(LevelFilter::Warn),
        "error" => Some(LevelFilter::Error),
        _ => None,
    }
}

/// A sink that keeps the run's lines in memory, so they can be written into the root once it
/// is known to be writable (`/var/log/azprov.log`). Bounded whatever the run logs (a flood of
/// packets on the link must not fill the initramfs's memory): the first [`Capture::HEAD`]
/// bytes of lines (how the boot began), the newest [`Capture::TAIL`] bytes (how it ended), and
/// between them one line that counts what was dropped.
#[derive(Clone, Default)]
pub struct Capture(std::sync::Arc<Mutex<Kept>>);

#[derive(Default)]
struct Kept {
    head: Vec<u8>,
    tail: std::collections::VecDeque<Vec<u8>>,
    tail_bytes: usize,
    dropped_lines: u64,
    dropped_bytes: u64,
}

impl Kept {
    fn push(&mut self, line: &[u8]) {
        if self.tail.is_empty() && self.head.len() + line.len() <= Capture::HEAD {
            self.head.extend_from_slice(line);
            return;
        }
        self.tail.push_back(line.to_vec());
        self.tail_bytes += line.len();
        while self.tail_bytes > Capture::TAIL {
            let Some(old) = self.tail.pop_front() else {
                break;
            };
            self.tail_bytes -= old.len();
            self.dropped_lines += 1;
            self.dropped_bytes += old.len() as u64;
        }
    }

    fn contents(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        if self.dropped_lines > 0 {
            out.extend_from_slice(
                format!(
                    "{} azprov: warn: … {} lines ({} bytes) of this run not kept here; \
                     the journal has them\n",
                    crate::time::log_stamp(),
                    self.dropped_lines,
                    self.dropped_bytes
                )
                .as_bytes(),
            );
        }
        for line in &self.tail {
            out.extend_from_slice(line);
        }
        out
    }
}

static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();

impl Capture {
    /// How much of a run's beginning is kept.
    pub const HEAD: usize = 64 * 1024;
    /// How much of its end is kept.
    pub const TAIL: usize = 128 * 1024;

    /// The process's capture, installed as a sink on first use; PID 1 installs it right after
    /// the logger, so the root's log file also holds the module and root-mount lines.
    pub fn install() -> Capture {
        CAPTURE
            .get_or_init(|| {
                let c = Capture::default();
                add_sink(Box::new(c.clone()));
                c
            })
            .clone()
    }

    pub fn contents(&self) -> Vec<u8> {
        self.0.lock().map(|k| k.contents()).unwrap_or_default()
    }
}

impl Write for Capture {
    /// One write is one line (or a block of lines written together): kept or dropped whole.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut k) = self.0.lock() {
            k.push(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_numbers_become_errno_names() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(
            errno_names(&format!("open /x: {e}")),
            "open /x: No such file or directory (ENOENT)"
        );
        assert_eq!(
            errno_names("(os error x) (os error 28)"),
            "(os error x) (ENOSPC)"
        );
        assert_eq!(errno_names("plain"), "plain");
    }

    #[test]
    fn syslog_records_carry_the_identifier_and_the_daemon_facility() {
        assert_eq!(
            syslog_record(Level::Info, 42, "dhcp: 12 ms"),
            "<29>azprov[42]: dhcp: 12 ms"
        );
        assert_eq!(syslog_record(Level::Error, 1, "x"), "<27>azprov[1]: x");
    }

    #[test]
    fn a_listening_socket_receives_records() {
        let dir = std::env::temp_dir().join(format!("azprov-syslog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        assert!(syslog_socket(&path).is_none(), "nothing listens yet");
        let server = UnixDatagram::bind(&path).unwrap();
        let client = syslog_socket(&path).expect("connects");
        client.send(b"<29>azprov[1]: hi").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"<29>azprov[1]: hi");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_capture_keeps_the_beginning_and_the_end_and_counts_the_middle() {
        let mut c = Capture::default();
        let line = |i: usize| format!("line {i:07} {}\n", "x".repeat(80));
        let n = 100_000;
        for i in 0..n {
            c.write_all(line(i).as_bytes()).unwrap();
        }
        let text = String::from_utf8(c.contents()).unwrap();
        assert!(
            text.len() <= Capture::HEAD + Capture::TAIL + 200,
            "{}",
            text.len()
        );
        assert!(text.starts_with(&line(0)), "the run's first line");
        assert!(text.ends_with(&line(n - 1)), "its newest");
        let kept = text.lines().filter(|l| l.starts_with("line ")).count();
        let note = text.lines().find(|l| l.contains("not kept here")).unwrap();
        assert!(note.contains(&format!("… {} lines (", n - kept)), "{note}");
        // whole lines only, in order
        let numbers: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix("line ")?.get(..7)?.parse().ok())
            .collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]));
        // a run that logs little keeps it all, and says nothing of dropping
        let mut small = Capture::default();
        small.write_all(b"one\n").unwrap();
        small.write_all(b"two\n").unwrap();
        assert_eq!(small.contents(), b"one\ntwo\n");
    }
}
