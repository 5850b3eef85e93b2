//! Host and user names: never a panic; what is accepted is what the rules allow.
#![no_main]
use azprov::root::values::{Hostname, SshKey, Username};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Ok(h) = Hostname::parse(&s) {
        let h = h.as_str();
        assert!(!h.is_empty() && h.len() <= 64, "{h:?}");
        // RFC 1123 labels: letters, digits, hyphens, not at a label's ends
        for label in h.split('.') {
            assert!(!label.is_empty(), "{h:?}");
            assert!(
                label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{h:?}"
            );
            assert!(!label.starts_with('-') && !label.ends_with('-'), "{h:?}");
        }
    }
    if let Ok(u) = Username::parse(&s) {
        let u = u.as_str();
        assert!(!u.is_empty() && u.len() <= 32, "{u:?}");
        assert!(
            u.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
            "{u:?}"
        );
        assert!(!u.starts_with('-'), "{u:?}");
    }
    if let Ok(k) = SshKey::parse(&s) {
        assert!(!k.as_str().contains('\n'));
    }
});
