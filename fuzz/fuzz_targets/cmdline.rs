//! The kernel command line: never a panic, whatever the words; the deadline is bounded.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let (c, _errors) = azprov::config::load(Some(&line), &line);
    // a huge azprov.timeout= saturates instead of overflowing a deadline
    let _ = azprov::deadline::Deadline::after(c.timeout).remaining();
});
