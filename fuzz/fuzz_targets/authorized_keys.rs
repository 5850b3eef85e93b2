//! An authorized_keys line, options field included: never a panic; a line accepted as a key
//! splits into its options field and a TYPE BASE64 identity that is itself a key, which parses
//! back to the same identity with no options.
#![no_main]
use azprov::root::values::SshKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let Ok(k) = SshKey::parse(&s) else {
        return;
    };
    let line = k.as_str();
    assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
    let id = k.identity();
    assert!(line.starts_with(k.options()), "{line:?}");
    // the identity is the two words after the options field
    let after: Vec<&str> = line
        .get(k.options().len()..)
        .unwrap_or("")
        .split_whitespace()
        .take(2)
        .collect();
    assert_eq!(after.join(" "), id, "{line:?}");
    let again = SshKey::parse(&id).unwrap_or_else(|e| panic!("{id:?}: {e}"));
    assert_eq!(again.identity(), id);
    assert_eq!(again.options(), "");
    // the options field is one word outside quotes
    if !k.options().is_empty() {
        let mut quoted = false;
        let mut escaped = false;
        for c in k.options().chars() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                c => assert!(quoted || !c.is_whitespace(), "{line:?}"),
            }
        }
        assert!(!quoted, "{line:?}");
    }
});
