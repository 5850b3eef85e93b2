//! Hyper-V KVP (key-value pair exchange), the channel through which the Azure host reads the
//! guest's `PROVISIONING_REPORT` even when the WireServer cannot be reached: the pool file's
//! records as `hv_kvp_daemon` reads them, and the messages of `/dev/vmbus/hv_kvp` (uapi
//! `linux/hyperv.h`) with the daemon's answers. Pure: the file write is
//! `root::kvp`'s, the device's I/O [`responder`]'s.

pub mod responder;

use std::time::{Duration, SystemTime};

/// `struct kvp_record`: a NUL-padded key, then a NUL-padded value.
pub const KEY_SIZE: usize = 512;
pub const VALUE_SIZE: usize = 2048;
pub const RECORD_SIZE: usize = KEY_SIZE + VALUE_SIZE;
/// The kernel converts each to UTF-16 capped at 255 / 1,023 units with the NUL and fails the
/// host's whole sweep of a pool when a conversion fails (`kvp_respond_to_host`): keys and
/// values stay within these many bytes of valid UTF-8 (bytes ≥ UTF-16 units).
pub const SAFE_KEY_BYTES: usize = 254;
pub const SAFE_VALUE_BYTES: usize = 1022;
/// The pools (`enum hv_kvp_exchg_pool`): 0 host → guest, 1 guest → host, 2 made up by the
/// daemon on the fly, 3 host → guest (host name and such).
pub const POOL_COUNT: usize = 5;
pub const POOL_EXTERNAL: u8 = 0;
pub const POOL_GUEST: u8 = 1;
pub const POOL_AUTO: u8 = 2;
pub const POOL_AUTO_EXTERNAL: u8 = 3;
/// The guest pool's file, as hv_kvp_daemon, cloud-init and azure-init name it.
pub const POOL_DIR: &str = "/var/lib/hyperv";
/// cloud-init's and azure-init's key for the provisioning outcome.
pub const REPORT_KEY: &str = "PROVISIONING_REPORT";

/// The file of pool `n` under [`POOL_DIR`].
pub fn pool_file(n: u8) -> String {
    format!("{POOL_DIR}/.kvp_pool_{n}")
}

/// One record: the key and value as C strings (without their NUL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl Record {
    /// A record whose key and value are cut, on a character boundary, to what every reader
    /// takes whole ([`SAFE_KEY_BYTES`], [`SAFE_VALUE_BYTES`]); a NUL ends them early, as it
    /// would for every C reader.
    pub fn new(key: &str, value: &str) -> Record {
        let field = |s: &str, max| {
            let s = s.split('\0').next().unwrap_or_default();
            super::wireserver::Limit::Bytes(max)
                .cut(s)
                .as_bytes()
                .to_vec()
        };
        Record {
            key: field(key, SAFE_KEY_BYTES),
            value: field(value, SAFE_VALUE_BYTES),
        }
    }

    /// The 2,560-byte record, NUL-padded.
    pub fn emit(&self) -> [u8; RECORD_SIZE] {
        let mut out = [0u8; RECORD_SIZE];
        copy_cstr(&mut out[..KEY_SIZE], &self.key);
        copy_cstr(&mut out[KEY_SIZE..], &self.value);
        out
    }
}

/// Copies `s` into `dst`, leaving at least one NUL at its end.
fn copy_cstr(dst: &mut [u8], s: &[u8]) {
    let n = s.len().min(dst.len().saturating_sub(1));
    if let (Some(d), Some(s)) = (dst.get_mut(..n), s.get(..n)) {
        d.copy_from_slice(s);
    }
}

/// The bytes of `field` up to its first NUL.
fn cstr(field: &[u8]) -> Vec<u8> {
    field.split(|&b| b == 0).next().unwrap_or_default().to_vec()
}

/// A pool file's records: whole 2,560-byte records only (a partial last one is ignored, as
/// `fread` in the daemon ignores it).
pub fn parse_pool(bytes: &[u8]) -> Vec<Record> {
    bytes
        .chunks_exact(RECORD_SIZE)
        .map(|r| {
            let (key, value) = r.split_at(KEY_SIZE);
            Record {
                key: cstr(key),
                value: cstr(value),
            }
        })
        .collect()
}

pub fn emit_pool(records: &[Record]) -> Vec<u8> {
    records.iter().flat_map(|r| r.emit()).collect()
}

/// `record` in place of every earlier one with its key, at the end.
pub fn upsert(records: &mut Vec<Record>, record: Record) {
    records.retain(|r| r.key != record.key);
    records.push(record);
}

/// The peers' rule for a guest pool left by an earlier boot (cloud-init's
/// `_truncate_guest_pool_file`, azure-init's `truncate_guest_pool_file`): last written before
/// this boot began.
pub fn is_stale(mtime: SystemTime, now: SystemTime, uptime: Duration) -> bool {
    now.checked_sub(uptime).is_some_and(|boot| mtime < boot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::reason::{Failure, Reason};
    use crate::azure::wireserver::{encode_failure, Limit};

    #[test]
    fn a_record_is_2560_bytes_key_then_value_nul_padded() {
        let r = Record::new(REPORT_KEY, "result=success");
        let b = r.emit();
        assert_eq!(b.len(), 2560);
        assert_eq!(&b[..19], b"PROVISIONING_REPORT");
        assert!(b[19..512].iter().all(|&c| c == 0));
        assert_eq!(&b[512..526], b"result=success");
        assert!(b[526..].iter().all(|&c| c == 0));
        let pool = emit_pool(&[r.clone(), Record::new("k", "v")]);
        assert_eq!(pool.len(), 5120);
        assert_eq!(parse_pool(&pool), vec![r, Record::new("k", "v")]);
    }

    #[test]
    fn values_are_cut_to_1022_bytes_on_a_character_boundary() {
        // é is 2 bytes, 🦀 4: 1,021 ASCII bytes then é would end at 1,023
        let v = format!("{}é", "a".repeat(1021));
        let r = Record::new("k", &v);
        assert_eq!(r.value.len(), 1021);
        assert!(std::str::from_utf8(&r.value).is_ok());
        let v = format!("{}🦀🦀", "a".repeat(1019));
        let r = Record::new("k", &v);
        assert_eq!(r.value.len(), 1019);
        let v = "é".repeat(600);
        let r = Record::new("k", &v);
        assert_eq!(r.value.len(), 1022);
        assert_eq!(std::str::from_utf8(&r.value).unwrap(), "é".repeat(511));
        let r = Record::new(&"🦀".repeat(100), "v");
        assert_eq!(r.key.len(), 252);
        assert!(std::str::from_utf8(&r.key).is_ok());
    }

    #[test]
    fn a_long_failure_report_keeps_its_tail_within_1022_bytes() {
        let mut f = Failure::new(Reason::Operator, "");
        f.extra = vec![("detail", format!("x|y'z\nw {}", "é".repeat(2000)))];
        let v = encode_failure(&f, "vm-1", "2026-12-05T10:00:00Z", Limit::Bytes(1022));
        assert!(v.len() <= 1022 && v.len() > 1000, "{}", v.len());
        assert!(v.starts_with("result=error|reason=reported by operator|agent=azprov/"));
        // the field holding |, ' and a newline is quoted as cloud-init's csv writer quotes it
        assert!(v.contains("|'detail=x|y''z\nw é"), "{v}");
        assert!(v.ends_with(
            "|vm_id=vm-1|timestamp=2026-12-05T10:00:00Z|documentation_url=https://aka.ms/linuxprovisioningerror"
        ));
        assert_eq!(Record::new(REPORT_KEY, &v).value, v.as_bytes());
    }

    #[test]
    fn one_report_replaces_earlier_ones() {
        let mut pool = vec![
            Record::new(REPORT_KEY, "result=error|old"),
            Record::new("CLOUD_INIT|1|start|x", "{}"),
            Record::new(REPORT_KEY, "result=error|older"),
        ];
        upsert(&mut pool, Record::new(REPORT_KEY, "result=success"));
        assert_eq!(
            pool,
            vec![
                Record::new("CLOUD_INIT|1|start|x", "{}"),
                Record::new(REPORT_KEY, "result=success")
            ]
        );
    }

    #[test]
    fn a_partial_record_and_text_after_a_nul_are_ignored() {
        let mut b = emit_pool(&[Record::new("a", "1")]).to_vec();
        b.extend_from_slice(&[b'z'; 23]);
        assert_eq!(parse_pool(&b), vec![Record::new("a", "1")]);
        assert_eq!(Record::new("a\0b", "1\0junk"), Record::new("a", "1"));
    }

    #[test]
    fn a_pool_from_before_this_boot_is_stale() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let up = Duration::from_secs(30);
        assert!(is_stale(now - Duration::from_secs(31), now, up));
        assert!(!is_stale(now - Duration::from_secs(29), now, up));
        // written later than now (a clock set back): kept, as the peers keep it
        assert!(!is_stale(now + Duration::from_secs(3600), now, up));
    }
}
