//! The `log` facade's sink. Tool and hook mode write `azprov: LEVEL: message` lines to stderr.
//! As PID 1 the lines go to /dev/console until /dev/kmsg exists, then to kmsg with the
//! `azprov:` tag, so they land in the real system's journal. Extra sinks (the in-memory
//! capture for /var/log/azprov.log) get every line too.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::sync::Mutex;

/// Where lines go first.
pub enum Output {
    Stderr,
    /// /dev/console: plain lines.
    Console(std::fs::File),
    /// /dev/kmsg: one `<priority>azprov: message` record per write.
    Kmsg(std::fs::File),
}

struct Logger {
    level: Mutex<LevelFilter>,
    out: Mutex<Output>,
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
        let line = format!("azprov: {level}: {}\n", r.args());
        if let Ok(mut out) = self.out.lock() {
            match &mut *out {
                Output::Stderr => {
                    let _ = std::io::stderr().write_all(line.as_bytes());
                }
                Output::Console(f) => {
                    let _ = f.write_all(line.as_bytes());
                }
                Output::Kmsg(f) => {
                    // syslog priorities: err 3, warning 4, notice 5 (info lines stay visible
                    // on a `loglevel=6` console), debug 7
                    let pri = match r.level() {
                        Level::Error => 3,
                        Level::Warn => 4,
                        Level::Info => 5,
                        Level::Debug | Level::Trace => 7,
                    };
                    let rec = format!("<{pri}>azprov: {}\n", r.args());
                    let _ = f.write_all(rec.as_bytes());
                }
            }
        }
        if let Ok(mut sinks) = self.extra.lock() {
            for s in sinks.iter_mut() {
                let _ = s.write_all(line.as_bytes());
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

static LOGGER: std::sync::OnceLock<Logger> = std::sync::OnceLock::new();

/// Installs the logger once; a later call changes the level.
pub fn init(level: LevelFilter) {
    let logger = LOGGER.get_or_init(|| Logger {
        level: Mutex::new(level),
        out: Mutex::new(Output::Stderr),
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

/// A sink that keeps every line in memory, so the whole boot's log can be written into the
/// root once it is known to be writable (`/var/log/azprov.log`).
#[derive(Clone, Default)]
pub struct Capture(std::sync::Arc<Mutex<Vec<u8>>>);

static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();

impl Capture {
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
        self.0.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
