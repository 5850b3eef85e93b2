use super::*;

#[test]
fn keys_are_written_over_the_image_s_and_fingerprinted() {
    let d = std::env::temp_dir().join(format!("azprov-hostkeys-{}", std::process::id()));
    let ssh = d.join("etc/ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    for f in [
        "ssh_host_rsa_key",
        "ssh_host_rsa_key.pub",
        "ssh_host_dsa_key",
        "ssh_host_dsa_key.pub",
        "ssh_host_ed25519_key-cert.pub",
        "sshd_config",
    ] {
        std::fs::write(ssh.join(f), "image\n").unwrap();
    }
    let g = generate(Path::new("/nonexistent"), &KeyType::ALL).unwrap();
    assert_eq!(g.seeded, None);
    // RSA is left for after the handover
    assert_eq!(g.pending, [KeyType::Rsa]);
    let lines = install(&Sysroot::new(&d), g, "vm-1").unwrap();
    assert_eq!(lines.len(), 2);
    let re_shape = |l: &str, bits: &str, label: &str| {
        l.starts_with(&format!("{bits} SHA256:")) && l.ends_with(&format!(" root@vm-1 ({label})"))
    };
    assert!(re_shape(&lines[0], "256", "ECDSA"), "{}", lines[0]);
    assert!(re_shape(&lines[1], "256", "ED25519"), "{}", lines[1]);
    use std::os::unix::fs::MetadataExt;
    let names = crate::sys::sorted_names(&ssh);
    // the image's keys are gone, its rsa key too: sshd starts with the new ones only
    assert_eq!(
        names,
        [
            "ssh_host_ecdsa_key",
            "ssh_host_ecdsa_key.pub",
            "ssh_host_ed25519_key",
            "ssh_host_ed25519_key.pub",
            "sshd_config"
        ]
    );
    for kind in [KeyType::Ecdsa, KeyType::Ed25519] {
        let p = ssh.join(format!("ssh_host_{}_key", kind.name()));
        let private = std::fs::read_to_string(&p).unwrap();
        assert!(private.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n"));
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        let public = std::fs::read_to_string(p.with_extension("pub")).unwrap();
        assert!(public.ends_with(" root@vm-1\n"), "{public}");
        assert_eq!(
            std::fs::metadata(p.with_extension("pub")).unwrap().mode() & 0o777,
            0o644
        );
    }
    assert_eq!(
        std::fs::read_to_string(ssh.join("sshd_config")).unwrap(),
        "image\n"
    );
    let block = fingerprint_block(&lines);
    assert_eq!(block.first().map(String::as_str), Some(BEGIN));
    assert_eq!(block.last().map(String::as_str), Some(END));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_generation_dropped_before_its_keys_stops() {
    let r = generate_with(
        Path::new("/nonexistent"),
        &Control::new(Control::STOP),
        &KeyType::ALL,
        None,
    );
    assert!(matches!(r, Err(HostKeyError::Stopped)), "{:?}", r.err());

    let mut k = Keygen::start("/nonexistent".into(), &KeyType::ALL);
    let thread = k.thread.take().unwrap();
    drop(k);
    let r = thread.join().unwrap();
    assert!(matches!(r, Err(HostKeyError::Stopped)), "{:?}", r.err());
}

#[test]
fn join_takes_the_fast_keys_without_waiting_for_rsa() {
    let k = Keygen::start("/nonexistent".into(), &KeyType::ALL);
    let g = k.join().unwrap();
    let kinds: Vec<KeyType> = g.keys.iter().map(|(k, _)| *k).collect();
    // either the search ended already (then RSA is there) or it is pending, never both
    match g.pending.as_slice() {
        [KeyType::Rsa] => assert_eq!(kinds, [KeyType::Ecdsa, KeyType::Ed25519]),
        // RSA first, as a generation on the calling thread orders them
        [] => assert_eq!(kinds, [KeyType::Rsa, KeyType::Ecdsa, KeyType::Ed25519]),
        other => panic!("{other:?}"),
    }
    // an image that wants no RSA key gets none, and none is pending
    let g = Keygen::start("/nonexistent".into(), &[KeyType::Ed25519])
        .join()
        .unwrap();
    assert_eq!(g.keys.len(), 1);
    assert!(g.pending.is_empty());
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root to leave SCHED_IDLE (runs as root and under CI=true)"
)]
fn an_awaited_generation_leaves_idle_priority() {
    use crate::sys::process::{background_priority, policy};
    let control = Control::new(Control::BACKGROUND);
    let theirs = control.clone();
    let seen = std::thread::spawn(move || {
        background_priority();
        let raised = Cell::new(false);
        assert!(!theirs.stop_here(&raised));
        let background = policy();
        theirs.set(Control::AWAITED);
        assert!(!theirs.stop_here(&raised));
        (background, policy())
    })
    .join()
    .unwrap();
    assert_eq!(seen, (libc::SCHED_IDLE as u32, libc::SCHED_OTHER as u32));
    // a generation that does not start in the background (`generate`, awaited from the
    // start) leaves its caller's priority alone; stopped, so it ends before any search
    std::thread::spawn(|| {
        background_priority();
        let r = generate_with(
            Path::new("/nonexistent"),
            &Control::new(Control::STOP),
            &KeyType::ALL,
            None,
        );
        assert!(matches!(r, Err(HostKeyError::Stopped)));
        assert_eq!(policy(), libc::SCHED_IDLE as u32);
    })
    .join()
    .unwrap();
}

#[test]
fn a_root_without_sshd_gets_no_keys() {
    let d = std::env::temp_dir().join(format!("azprov-nossh-{}", std::process::id()));
    std::fs::create_dir_all(d.join("etc")).unwrap();
    let g = generate(Path::new("/nonexistent"), &KeyType::ALL).unwrap();
    assert!(install(&Sysroot::new(&d), g, "vm").unwrap().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_etc_ssh_that_is_an_absolute_symlink_is_followed_inside_the_root() {
    let d = std::env::temp_dir().join(format!("azprov-sshlink-{}", std::process::id()));
    // /etc/ssh -> /srv/azprov-sshlink-PID/ssh: an absolute link, followed inside the root only
    // (nothing of that name exists on this machine, as in the initramfs)
    let target = format!("/srv/azprov-sshlink-{}/ssh", std::process::id());
    assert!(!Path::new(&target).exists());
    let real = d.join(&target[1..]);
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(d.join("etc")).unwrap();
    std::os::unix::fs::symlink(&target, d.join("etc/ssh")).unwrap();
    for f in ["ssh_host_dsa_key", "ssh_host_dsa_key.pub", "sshd_config"] {
        std::fs::write(real.join(f), "image\n").unwrap();
    }
    let root = Sysroot::new(&d);
    assert!(!none_in(&root), "the image has a key");
    let g = generate(Path::new("/nonexistent"), &[KeyType::Ed25519]).unwrap();
    let lines = install(&root, g, "vm-1").unwrap();
    assert_eq!(lines.len(), 1, "keys written into the root's /etc/ssh");
    assert_eq!(
        crate::sys::sorted_names(&real),
        [
            "ssh_host_ed25519_key",
            "ssh_host_ed25519_key.pub",
            "sshd_config"
        ],
        "the new key beside sshd_config, the image's dsa key gone"
    );
    assert!(!Path::new(&target).exists(), "nothing outside the root");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The fingerprint line of a key azprov did not make, read from its .pub line without
/// ssh-key's decoder: what ssh-key (and ssh-keygen -l) says of each type.
#[test]
fn a_pub_lines_fingerprint_is_ssh_keys() {
    for kind in [KeyType::Ed25519, KeyType::Ecdsa] {
        let g = generate(Path::new("/nonexistent-sys"), &[kind]).unwrap();
        let (_, key) = &g.keys[0];
        let public = key.public_key().to_openssh().unwrap();
        let want = fingerprint_line(kind, key, "root@image");
        assert_eq!(
            public_fingerprint_line(&format!("{public} root@image")).as_deref(),
            Some(want.as_str())
        );
    }
    let rsa = rsa_now().unwrap();
    let line = rsa.public_key().to_openssh().unwrap();
    assert_eq!(
        public_fingerprint_line(&format!("{line} root@image")),
        Some(fingerprint_line(KeyType::Rsa, &rsa, "root@image"))
    );
    assert!(public_fingerprint_line(&line)
        .unwrap()
        .contains(" no comment (RSA)"));
    for bad in [
        "",
        "ssh-rsa",
        "ssh-rsa AAAA",
        "ssh-ed25519 !!!",
        "ssh-dss AAAAB3NzaC1kc3MAAAA=",
    ] {
        assert_eq!(public_fingerprint_line(bad), None, "{bad}");
    }
}
