//! One deadline per operation, and the capped exponential backoff every retry loop uses.

use std::time::{Duration, Instant};

/// A point in time after which an operation gives up. Stages split one overall deadline.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    end: Instant,
}

/// The furthest a deadline reaches: a huge `rootdelay=` or `--timeout` saturates here instead
/// of overflowing the clock (about 31 years; nothing waits that long in practice).
pub const FOREVER: Duration = Duration::from_secs(1_000_000_000);

fn later(budget: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(budget.min(FOREVER)).unwrap_or(now)
}

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Deadline { end: later(budget) }
    }

    pub fn remaining(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The earlier of this deadline and `budget` from now.
    pub fn min(&self, budget: Duration) -> Self {
        let other = later(budget);
        Deadline {
            end: self.end.min(other),
        }
    }

    /// Sleeps for `wanted`, or until the deadline, whichever comes first. Returns false when
    /// the deadline has passed, so callers write `while deadline.sleep(..) { .. }`.
    pub fn sleep(&self, wanted: Duration) -> bool {
        let d = wanted.min(self.remaining());
        if !d.is_zero() {
            std::thread::sleep(d);
        }
        !self.expired()
    }
}

/// Capped exponential backoff with jitter: attempt n waits a random time in
/// [delay/2, delay] where delay = min(cap, base * 2^n).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap }
    }

    /// The wait before retry number `attempt` (0-based), with `jitter` in [0, 1).
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        let full = self.base.saturating_mul(factor).min(self.cap);
        let j = jitter.clamp(0.0, 1.0);
        full.mul_f64(0.5 + 0.5 * j)
    }
}

/// A jitter value in [0, 1) from the kernel's random source.
pub fn jitter() -> f64 {
    let mut b = [0u8; 4];
    crate::sys::random_bytes(&mut b);
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_budgets_saturate() {
        let d = Deadline::after(Duration::from_secs(u64::MAX));
        assert!(d.remaining() > Duration::from_secs(1 << 20));
        assert!(d.min(Duration::MAX).remaining() <= FOREVER);
    }

    #[test]
    fn backoff_doubles_then_caps() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(
            b.delay(0, 0.999_999),
            Duration::from_millis(100) - Duration::from_nanos(50)
        );
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(50));
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(400));
        assert_eq!(b.delay(4, 0.0), Duration::from_millis(500));
        assert_eq!(b.delay(40, 0.0), Duration::from_millis(500));
    }

    #[test]
    fn jitter_is_in_range() {
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j));
        }
    }

    #[test]
    fn deadline_sleep_stops_at_the_deadline() {
        let d = Deadline::after(Duration::from_millis(20));
        let start = Instant::now();
        assert!(!d.sleep(Duration::from_secs(5)));
        assert!(start.elapsed() < Duration::from_secs(4));
    }
}
