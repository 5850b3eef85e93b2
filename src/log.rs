//! The `log` facade's sink. Tool and hook mode write `azprov: LEVEL message` lines to stderr;
//! more sinks (kmsg, a file in the root) are added as the boot flow gains them.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::sync::Mutex;

struct Logger {
    level: LevelFilter,
    extra: Mutex<Vec<Box<dyn Write + Send>>>,
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= self.level
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
        let _ = std::io::stderr().write_all(line.as_bytes());
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

/// Installs the logger once; later calls only change nothing.
pub fn init(level: LevelFilter) {
    let logger = LOGGER.get_or_init(|| Logger {
        level,
        extra: Mutex::new(Vec::new()),
    });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
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

impl Capture {
    /// Installs a new capture as a sink and returns a handle to read it.
    pub fn install() -> Capture {
        let c = Capture::default();
        add_sink(Box::new(c.clone()));
        c
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
