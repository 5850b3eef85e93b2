//! RFC 3339 timestamps without a date crate, and seconds as the CLI and the kernel command
//! line write them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds as `30` or `2.5`: digits with at most one decimal point and nine places (read
/// exactly, no float), positive and below 10^9 (about 31 years).
pub fn parse_secs(s: &str) -> Option<Duration> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + frac.len() == 0 || frac.len() > 9 || !digits(whole) || !digits(frac) {
        return None;
    }
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let nanos: u32 = format!("{frac:0<9}").parse().ok()?;
    let d = Duration::new(secs, nanos);
    (secs < 1_000_000_000 && !d.is_zero()).then_some(d)
}

/// `30` or `2.5`: whole milliseconds, as `parse_secs` reads them back.
pub fn secs(d: Duration) -> String {
    let ms = d.as_millis();
    match ms % 1000 {
        0 => format!("{}", ms / 1000),
        frac => format!(
            "{}.{}",
            ms / 1000,
            format!("{frac:03}").trim_end_matches('0')
        ),
    }
}

/// `2026-11-30T15:19:55Z` for the given time (UTC).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// The stamp of a line in azprov's log file: RFC 3339 with milliseconds
/// (`2026-11-30T15:19:55.123Z`) when the clock is set, else seconds since boot (`[5.123]`),
/// as early in an initramfs without an RTC the wall clock may read 1970.
pub fn log_stamp() -> String {
    let now = SystemTime::now();
    match now.duration_since(UNIX_EPOCH) {
        // after 2020: a clock someone set
        Ok(d) if d.as_secs() > 1_577_836_800 => {
            let s = rfc3339(now);
            format!("{}.{:03}Z", &s[..s.len() - 1], d.subsec_millis())
        }
        _ => {
            let up = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
            format!("[{}]", up.split_whitespace().next().unwrap_or("?"))
        }
    }
}

/// Days since 1970-01-01 to (year, month, day); Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn seconds_are_read_exactly() {
        assert_eq!(parse_secs("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_secs("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(parse_secs(".25"), Some(Duration::from_millis(250)));
        assert_eq!(parse_secs("5."), Some(Duration::from_secs(5)));
        assert_eq!(parse_secs("0.000000001"), Some(Duration::from_nanos(1)));
        assert_eq!(
            parse_secs("999999999.5"),
            Some(Duration::new(999_999_999, 500_000_000))
        );
        for bad in [
            "",
            ".",
            "0",
            "0.0",
            "-1",
            "+1",
            "1e3",
            "inf",
            "NaN",
            "1.2.3",
            " 1",
            "1s",
            "0.0000000001",
            "1000000000",
        ] {
            assert_eq!(parse_secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn seconds_are_written_as_they_are_read() {
        assert_eq!(secs(Duration::from_secs(30)), "30");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5");
        assert_eq!(secs(Duration::from_millis(1050)), "1.05");
        assert_eq!(secs(Duration::from_millis(7)), "0.007");
        for s in ["30", "2.5", "1.05", "0.007"] {
            assert_eq!(secs(parse_secs(s).unwrap()), s);
        }
    }

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_051_995);
        assert_eq!(rfc3339(t), "2026-11-30T15:19:55Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }
}
