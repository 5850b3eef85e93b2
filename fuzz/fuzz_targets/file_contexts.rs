//! SELinux file contexts from a hostile image: any file_contexts text parses without a panic,
//! and a lookup (every expression compiled and matched on the way) ends, whatever the
//! expressions are: the matcher's step budget turns a runaway one into no match.
#![no_main]
use azprov::root::selinux::FileContexts;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // the input split into file_contexts and a substitution file at the first NUL
    let (fc, subs) = text.split_once('\0').unwrap_or((&text, ""));
    let (contexts, _) = FileContexts::parse(&[fc], subs, subs);
    for path in [
        "/etc/passwd",
        "/home/azureuser/.ssh/authorized_keys",
        "/var/lib/azprov/state.json",
        "/",
        "//x//y",
    ] {
        for kind in [0, libc_reg(), libc_dir()] {
            let _ = contexts.lookup(path, kind);
        }
    }
});

fn libc_reg() -> u32 {
    0o100000
}

fn libc_dir() -> u32 {
    0o040000
}
