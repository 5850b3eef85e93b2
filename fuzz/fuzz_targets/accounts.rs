//! Account-file editing on hostile passwd/group contents: never a panic, and every line that
//! was there stays byte for byte (the new user is appended). Needs root (files are chowned).
#![no_main]
use azprov::root::values::Username;
use azprov::root::Sysroot;
use libfuzzer_sys::fuzz_target;
use std::fs;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("azprov-fuzz-accounts-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("etc")).unwrap();
    // the input split into passwd and group at the first NUL
    let (passwd, group) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    fs::write(dir.join("etc/passwd"), passwd).unwrap();
    fs::write(dir.join("etc/group"), group).unwrap();
    fs::write(dir.join("etc/shadow"), b"").unwrap();
    let root = Sysroot::new(&dir);
    if root
        .ensure_user(&Username::parse("azureuser").unwrap(), None)
        .is_ok()
    {
        for (file, before) in [("etc/passwd", passwd), ("etc/group", group)] {
            let after = fs::read(dir.join(file)).unwrap();
            let kept: Vec<&[u8]> = before
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .collect();
            for line in kept {
                assert!(
                    after.split(|b| *b == b'\n').any(|l| l == line),
                    "{file}: a line changed: {:?}",
                    String::from_utf8_lossy(line)
                );
            }
        }
    }
    let _ = fs::remove_dir_all(&dir);
});
