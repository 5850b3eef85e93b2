//! Is this an Azure VM? The DMI chassis asset tag says so: Hyper-V on Azure sets it to a fixed
//! string, and cloud-init's ds-identify checks the same. Without it azprov sends no packet.

use std::path::Path;

/// `/sys/class/dmi/id/chassis_asset_tag` on every Azure VM.
pub const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";

/// The chassis asset tag under `dmi` (normally `/sys/class/dmi/id`), trimmed; None when absent.
pub fn asset_tag(dmi: &Path) -> Option<String> {
    let raw = std::fs::read(dmi.join("chassis_asset_tag")).ok()?;
    Some(String::from_utf8_lossy(&raw).trim().to_string())
}

/// Whether DMI names this machine an Azure VM.
pub fn is_azure(dmi: &Path) -> bool {
    asset_tag(dmi).as_deref() == Some(AZURE_ASSET_TAG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_tag_counts() {
        let d = std::env::temp_dir().join(format!("azprov-tag-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(!is_azure(&d), "no file");
        for (content, want) in [
            ("7783-7084-3265-9085-8269-3286-77\n", true),
            ("7783-7084-3265-9085-8269-3286-77", true),
            ("7783-7084-3265-9085-8269-3286-78\n", false),
            ("\n", false),
            ("Default string\n", false),
        ] {
            std::fs::write(d.join("chassis_asset_tag"), content).unwrap();
            assert_eq!(is_azure(&d), want, "{content:?}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
