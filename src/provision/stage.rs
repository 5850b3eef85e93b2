//! The stage helper every stage of a run goes through: timed, its milliseconds recorded, its
//! panic turned into NotReady "internal error", one log line.

use super::{Failure, Reason};
use std::time::{Duration, Instant};

pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// One named stage of the run. [`Stage::run`] times it, records its milliseconds, turns its
/// panic (a bug, most likely in a parser fed hostile input) into NotReady "internal error"
/// while the network is still up, and logs its one line: `NAME: MS ms: what it found`, or its
/// failure.
pub(crate) struct Stage {
    name: &'static str,
    start: Instant,
    /// A failure the run goes on from (no media, no IMDS) is a warning, others errors.
    failure_level: log::Level,
}

impl Stage {
    pub(crate) fn start(name: &'static str) -> Self {
        Self::since(name, Instant::now())
    }

    /// A stage whose time counts from `start` (DHCP from the link-up, begun with the media).
    pub(crate) fn since(name: &'static str, start: Instant) -> Self {
        Stage {
            name,
            start,
            failure_level: log::Level::Error,
        }
    }

    /// Its failure is logged as a warning: the run goes on without what it did not find.
    pub(crate) fn recoverable(mut self) -> Self {
        self.failure_level = log::Level::Warn;
        self
    }

    /// Runs `f`, stores its duration in `slot`, logs `found` of its result or its failure.
    pub(crate) fn run<T>(
        self,
        slot: &mut u64,
        f: impl FnOnce() -> Result<T, Failure>,
        found: impl FnOnce(&T) -> String,
    ) -> Result<T, Failure> {
        let name = self.name;
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
                Err(Failure::new(
                    Reason::Internal,
                    format!("panic in the {name} stage"),
                ))
            });
        *slot = ms(self.start.elapsed());
        let result = result.map_err(|mut f| {
            f.stage.get_or_insert(name);
            f
        });
        match &result {
            Ok(v) => log::info!("{name}: {} ms: {}", *slot, found(v)),
            Err(e) => log::log!(self.failure_level, "{name}: {} ms: {e}", *slot),
        }
        result
    }
}
