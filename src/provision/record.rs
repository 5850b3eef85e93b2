//! This boot's outcome in `/run/azprov/boot.json`, readable by everyone: whether provisioning
//! succeeded, was skipped, disabled or not needed off Azure, and why it failed, with no secret
//! in it. /run is a tmpfs the initramfs hands to the booted system (switch_root moves it; a
//! systemd initrd keeps it), so `azprov status` finds it without root and without anything
//! written into the root on a boot that must not write (`azprov=0`, not Azure).

use super::summary::{Report, Summary};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the record lives in PID 1, in hook mode and in the booted system.
pub const RUN_DIR: &str = "/run/azprov";
pub const FILE: &str = "boot.json";

/// What `boot.json` holds: the run's summary (`S`: the [`Summary`] written, the
/// [`BootSummary`] read back) and when and where its log went.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct BootRecord<S = BootSummary> {
    /// When the run ended (RFC 3339).
    pub at: String,
    /// The root the run provisioned, as the run saw it.
    pub root: String,
    /// The run's log in that root.
    pub log: String,
    pub summary: S,
}

/// What `azprov status` reads back of a boot's summary: the fields it merges with state.json
/// (the names and values [`Summary`] writes; a field missing reads as none).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct BootSummary {
    pub report: Option<Report>,
    pub vm_id: Option<String>,
    pub reason: Option<String>,
    pub cause: Option<String>,
    pub stage: Option<String>,
    pub hostname: Option<String>,
    pub username: Option<String>,
    pub msp: bool,
}

/// Writes `summary` as this boot's record under `dir` (0755, the file 0644), atomically.
/// A failure is a warning: the record helps `status`, it is no part of provisioning.
pub fn save(dir: &Path, root: &Path, summary: &Summary) {
    let record = BootRecord {
        at: crate::time::now_rfc3339(),
        root: root.display().to_string(),
        log: crate::root::LOG_FILE.to_string(),
        summary,
    };
    if let Err(e) = write(dir, &record) {
        log::warn!("cannot record this boot in {}: {e}", dir.display());
    }
}

fn write(dir: &Path, record: &BootRecord<&Summary>) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let tmp = dir.join(format!(".{FILE}.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(record).unwrap_or_default())?;
    std::fs::rename(&tmp, dir.join(FILE))
}

/// Appends this run's log lines (`run`) to the root's log file, keeping the newest
/// [`LOG_MAX`] bytes. A failure is a warning: the journal and the console have every line.
pub fn save_log(root: &crate::root::Sysroot, run: &[u8]) {
    use crate::root::LOG_FILE;
    let saved = root.mkdir("/var/log", 0o755, (0, 0)).and_then(|_| {
        let earlier = root.read(LOG_FILE).ok().flatten().unwrap_or_default();
        root.write(LOG_FILE, &appended(earlier, run, LOG_MAX), 0o640, (0, 0))
    });
    if let Err(e) = saved {
        log::warn!("cannot write {LOG_FILE}: {e}");
    }
}

/// The log file keeps at most this much: the newest runs, whole lines.
const LOG_MAX: usize = 256 * 1024;

/// `earlier` runs' log with this run's lines after it, cut from the front at a line boundary
/// to at most `max` bytes.
fn appended(mut earlier: Vec<u8>, run: &[u8], max: usize) -> Vec<u8> {
    earlier.extend_from_slice(run);
    if earlier.len() <= max {
        return earlier;
    }
    let cut = earlier.len() - max;
    let start = earlier
        .iter()
        .skip(cut)
        .position(|&b| b == b'\n')
        .map_or(earlier.len(), |i| cut + i + 1);
    earlier.split_off(start)
}

/// This boot's record under `dir`, if there is one that parses.
pub fn load(dir: &Path) -> Option<BootRecord> {
    let bytes = std::fs::read(dir.join(FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The default directory, or the one a test points at.
pub fn dir(over: Option<&str>) -> PathBuf {
    over.map_or_else(|| PathBuf::from(RUN_DIR), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_world_readable_and_reads_back() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("azprov-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let mut s = Summary::new(Some("vm-1".into()));
        s.report = super::super::summary::Report::Disabled;
        save(&d, Path::new("/sysroot"), &s);
        let md = std::fs::metadata(d.join(FILE)).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o644);
        let r = load(&d).unwrap();
        assert_eq!(
            r.summary.report,
            Some(super::super::summary::Report::Disabled)
        );
        assert_eq!(r.summary.vm_id.as_deref(), Some("vm-1"));
        assert_eq!(r.root, "/sysroot");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_log_keeps_the_newest_whole_lines_within_its_cap() {
        assert_eq!(appended(b"a\n".to_vec(), b"b\n", 10), b"a\nb\n");
        assert_eq!(
            appended(b"one\ntwo\n".to_vec(), b"three\n", 12),
            b"two\nthree\n"
        );
        assert_eq!(appended(b"one\ntwo\n".to_vec(), b"three\n", 9), b"three\n");
        assert_eq!(appended(b"one\ntwo\n".to_vec(), b"3\n", 7), b"two\n3\n");
    }
}
