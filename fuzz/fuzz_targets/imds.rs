//! The IMDS document: never a panic; a parsed document's keys are single lines.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = azprov::azure::imds::parse(data) {
        let _ = format!("{m:?}");
    }
});
