//! The VM id from DMI (docs/contracts.md, "Protocol rules"): `/sys/class/dmi/id/product_uuid`,
//! lower-case; Gen1 VMs (no `/sys/firmware/efi`) use SMBIOS 2.3, so the first three fields are
//! stored byte-swapped relative to IMDS `vmId`.

use std::path::Path;

/// Where the kernel shows the DMI tables.
pub const DMI_DIR: &str = "/sys/class/dmi/id";

/// Reads the VM id from `dmi` (normally `/sys/class/dmi/id`); `sys` (normally `/sys`) tells
/// Gen1 from Gen2. None when DMI has no usable id: the file is absent, unreadable, not a UUID,
/// or all zeros.
pub fn read(dmi: &Path, sys: &Path) -> Option<String> {
    let raw = std::fs::read_to_string(dmi.join("product_uuid")).ok()?;
    let gen1 = !sys.join("firmware/efi").exists();
    from_dmi(raw.trim(), gen1)
}

/// Normalises a DMI UUID string; `gen1` swaps the byte order of the first three fields.
pub fn from_dmi(uuid: &str, gen1: bool) -> Option<String> {
    let lower = uuid.trim().to_ascii_lowercase();
    let fields: Vec<&str> = lower.split('-').collect();
    let [a, b, c, d, e] = fields.as_slice() else {
        return None;
    };
    let shape_ok = fields.iter().map(|f| f.len()).eq([8, 4, 4, 4, 12])
        && fields
            .iter()
            .all(|f| f.bytes().all(|b| b.is_ascii_hexdigit()));
    if !shape_ok || lower.bytes().all(|b| b == b'0' || b == b'-') {
        return None;
    }
    if !gen1 {
        return Some(lower);
    }
    let swap = |f: &str| -> String {
        let pairs: Vec<&str> = (0..f.len())
            .step_by(2)
            .filter_map(|i| f.get(i..i + 2))
            .collect();
        pairs.into_iter().rev().collect()
    };
    Some(format!("{}-{}-{}-{d}-{e}", swap(a), swap(b), swap(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen2_is_lower_cased_only() {
        assert_eq!(
            from_dmi("12345678-90AB-CDEF-1234-567890ABCDEF\n", false).as_deref(),
            Some("12345678-90ab-cdef-1234-567890abcdef")
        );
    }

    #[test]
    fn gen1_swaps_the_first_three_fields() {
        assert_eq!(
            from_dmi("78563412-AB90-EFCD-1234-567890ABCDEF", true).as_deref(),
            Some("12345678-90ab-cdef-1234-567890abcdef")
        );
    }

    #[test]
    fn unusable_ids() {
        assert_eq!(from_dmi("00000000-0000-0000-0000-000000000000", true), None);
        assert_eq!(from_dmi("", false), None);
        assert_eq!(from_dmi("not-a-uuid", false), None);
        assert_eq!(
            from_dmi("1234567g-90ab-cdef-1234-567890abcdef", false),
            None
        );
    }

    #[test]
    fn reads_from_a_sys_tree() {
        let dir = std::env::temp_dir().join(format!("azprov-vmid-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("class/dmi/id")).unwrap();
        std::fs::write(
            dir.join("class/dmi/id/product_uuid"),
            "78563412-AB90-EFCD-1234-567890ABCDEF\n",
        )
        .unwrap();
        assert_eq!(
            read(&dir.join("class/dmi/id"), &dir).as_deref(),
            Some("12345678-90ab-cdef-1234-567890abcdef")
        );
        std::fs::create_dir_all(dir.join("firmware/efi")).unwrap();
        assert_eq!(
            read(&dir.join("class/dmi/id"), &dir).as_deref(),
            Some("78563412-ab90-efcd-1234-567890abcdef")
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read(&dir.join("class/dmi/id"), &dir), None);
    }
}
