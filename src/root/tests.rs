use super::accounts::crypt_sha512;
use super::*;
use crate::root::values::{Hostname, Username};
use crate::root::values::{KeyEntry, Source, SshKey};
use crate::secret::Secret;
use std::os::unix::fs::{symlink, MetadataExt};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/root");

/// A Debian-like root in a fresh temp dir, with shadow 0640 root:shadow as on Debian.
pub(crate) fn seeded(name: &str) -> (PathBuf, Sysroot) {
    assert!(is_root(), "sysroot tests need root (they chown files)");
    let dir = std::env::temp_dir().join(format!("azprov-sysroot-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(FIXTURE)
        .arg(&dir)
        .status()
        .unwrap();
    assert!(ok.success());
    for f in ["etc/shadow", "etc/gshadow"] {
        fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::chown(dir.join(f), Some(0), Some(42)).unwrap();
    }
    (dir.clone(), Sysroot::new(dir))
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

fn text(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}

fn key(s: &str) -> KeyEntry {
    KeyEntry {
        key: SshKey::parse(s).unwrap(),
        path: None,
        source: Source::Imds,
    }
}

const K1: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK2first one@a";
const K2: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABsecond two@b";

#[test]
fn crypt_matches_the_reference_vector() {
    // From the SHA-crypt specification (Drepper), rounds=5000 implied.
    assert_eq!(
        crypt_sha512("Hello world!", "saltstring").unwrap(),
        "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1"
    );
    let a = hash_password(&Secret::new("pw".into()))
        .unwrap()
        .expose()
        .clone();
    let b = hash_password(&Secret::new("pw".into()))
        .unwrap()
        .expose()
        .clone();
    assert!(a.starts_with("$6$") && a.len() > 90);
    assert_ne!(a, b, "salts are random");
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn resolve_stays_inside_the_root() {
    let (dir, root) = seeded("resolve");
    fs::create_dir_all(dir.join("var/home")).unwrap();
    fs::remove_dir_all(dir.join("home")).unwrap();
    symlink("/var/home", dir.join("home")).unwrap(); // absolute: the root's own /var/home
    assert_eq!(
        root.resolve("/home/u/.ssh").unwrap(),
        dir.join("var/home/u/.ssh")
    );
    symlink("../../../../../../..", dir.join("var/up")).unwrap();
    assert!(matches!(
        root.resolve("/var/up/etc/passwd"),
        Err(WriteError::Escape(_))
    ));
    assert!(matches!(
        root.resolve("/../etc/passwd"),
        Err(WriteError::Escape(_))
    ));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn hostname_and_hosts() {
    let (dir, root) = seeded("hostname");
    root.write_hostname(&Hostname::parse("vm-42").unwrap())
        .unwrap();
    assert_eq!(text(&dir.join("etc/hostname")), "vm-42\n");
    assert_eq!(mode(&dir.join("etc/hostname")), 0o644);
    let hosts = text(&dir.join("etc/hosts"));
    assert!(hosts.contains("127.0.1.1\tvm-42\n"), "{hosts}");
    assert!(!hosts.contains("debian-image"));
    assert!(hosts.starts_with("127.0.0.1\tlocalhost\n"));
    // no temp files left behind
    let leftovers: Vec<_> = fs::read_dir(dir.join("etc"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("azprov-tmp"))
        .collect();
    assert!(leftovers.is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn new_user_gets_accounts_home_and_locked_password() {
    let (dir, root) = seeded("user");
    let u = Username::parse("azureuser").unwrap();
    let a = root.ensure_user(&u, None).unwrap();
    assert_eq!(
        a,
        Account {
            uid: 1000,
            gid: 1000,
            home: "/home/azureuser".into(),
            created: true
        }
    );
    assert!(text(&dir.join("etc/passwd"))
        .ends_with("azureuser:x:1000:1000::/home/azureuser:/bin/bash\n"));
    assert!(text(&dir.join("etc/group")).ends_with("azureuser:x:1000:\n"));
    assert!(text(&dir.join("etc/gshadow")).ends_with("azureuser:!::\n"));
    let shadow = text(&dir.join("etc/shadow"));
    let line = shadow.lines().last().unwrap();
    assert!(line.starts_with("azureuser:!:"), "{line}");
    // modes and owners kept
    assert_eq!(
        (
            mode(&dir.join("etc/shadow")),
            owner(&dir.join("etc/shadow"))
        ),
        (0o640, (0, 42))
    );
    assert_eq!(mode(&dir.join("etc/passwd")), 0o644);
    assert_eq!(
        (
            mode(&dir.join("etc/gshadow")),
            owner(&dir.join("etc/gshadow"))
        ),
        (0o640, (0, 42))
    );
    // home from skel
    let home = dir.join("home/azureuser");
    assert_eq!((mode(&home), owner(&home)), (0o750, (1000, 1000)));
    assert_eq!(
        text(&home.join(".bashrc")),
        text(&dir.join("etc/skel/.bashrc"))
    );
    assert_eq!(owner(&home.join(".profile")), (1000, 1000));
    // a second run finds the user and adds nothing; it is still azprov's own
    let again = root.ensure_user(&u, None).unwrap();
    assert!(again.created);
    assert_eq!(root.owned_user().as_deref(), Some("azureuser"));
    assert_eq!(
        text(&dir.join("etc/passwd")).matches("azureuser").count(),
        2
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_home_is_filled_aside_and_renamed_into_place() {
    let (dir, root) = seeded("home");
    // what a run cut short in the middle of the skel copy left behind
    let tmp = dir.join("home/.azureuser.azprov-tmp");
    fs::create_dir_all(&tmp).unwrap();
    fs::write(tmp.join(".bashrc"), "half").unwrap();
    fs::write(tmp.join("junk"), "x").unwrap();
    let u = Username::parse("azureuser").unwrap();
    root.ensure_user(&u, None).unwrap();
    let home = dir.join("home/azureuser");
    assert_eq!(
        text(&home.join(".bashrc")),
        text(&dir.join("etc/skel/.bashrc"))
    );
    assert!(home.join(".profile").exists());
    assert!(
        !home.join("junk").exists(),
        "the old temporary's files came along"
    );
    assert!(!tmp.exists(), "the temporary is left");
    assert_eq!((mode(&home), owner(&home)), (0o750, (1000, 1000)));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn the_login_shell_is_looked_up_inside_the_root() {
    let (dir, root) = seeded("shell");
    // an absolute symlink means the root's own /bin/dash, not the host's
    fs::remove_file(dir.join("bin/bash")).unwrap();
    symlink("/bin/dash", dir.join("bin/bash")).unwrap();
    assert!(!root.exists("/bin/bash"));
    assert_eq!(root.login_shell(), "/bin/sh");
    // without bash, useradd's default (Debian 12's is /bin/sh)
    fs::create_dir_all(dir.join("etc/default")).unwrap();
    fs::write(dir.join("etc/default/useradd"), "SHELL=/bin/zsh\n").unwrap();
    assert_eq!(root.login_shell(), "/bin/zsh");
    // bash wins over useradd's default, as cloud-init and waagent give it
    fs::write(dir.join("etc/default/useradd"), "SHELL=/bin/sh\n").unwrap();
    fs::write(dir.join("bin/dash"), "").unwrap();
    assert!(root.exists("/bin/bash"));
    assert_eq!(root.login_shell(), "/bin/bash");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn subordinate_ranges_are_the_lowest_free_ones() {
    use super::accounts::free_range;
    assert_eq!(
        free_range(vec![], 100_000, 600_100_000, 65_536),
        Some(100_000)
    );
    let debian = vec![(100_000, 165_536), (165_536, 231_072)];
    assert_eq!(
        free_range(debian, 100_000, 600_100_000, 65_536),
        Some(231_072)
    );
    // a gap large enough, one too small, and a range that encloses the minimum
    let gaps = vec![(300_000, 400_000), (50_000, 150_000), (215_536, 250_000)];
    assert_eq!(
        free_range(gaps, 100_000, 600_100_000, 65_536),
        Some(150_000)
    );
    assert_eq!(
        free_range(vec![(100_000, 600_000)], 100_000, 600_000, 10),
        None
    );
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_new_user_gets_subordinate_ids_and_the_lock_useradd_takes() {
    let (dir, root) = seeded("subids");
    fs::write(dir.join("etc/subuid"), "alice:100000:65536\n").unwrap();
    fs::write(dir.join("etc/subgid"), "").unwrap();
    let u = Username::parse("azureuser").unwrap();
    let a = root.ensure_user(&u, None).unwrap();
    assert!(a.created);
    assert_eq!(
        text(&dir.join("etc/subuid")),
        "alice:100000:65536\nazureuser:165536:65536\n"
    );
    assert_eq!(text(&dir.join("etc/subgid")), "azureuser:100000:65536\n");
    let lock = dir.join("etc/.pwd.lock");
    assert_eq!((mode(&lock), owner(&lock)), (0o600, (0, 0)));
    // once only; an existing user gets nothing new
    root.ensure_user(&u, None).unwrap();
    assert_eq!(
        text(&dir.join("etc/subuid")).matches("azureuser").count(),
        1
    );
    // clean --user takes the lines out again
    root.remove_user("azureuser").unwrap();
    assert_eq!(text(&dir.join("etc/subuid")), "alice:100000:65536\n");
    assert_eq!(text(&dir.join("etc/subgid")), "");
    // a root without the files gets none
    let (dir2, root2) = seeded("subids-none");
    root2.ensure_user(&u, None).unwrap();
    assert!(!dir2.join("etc/subuid").exists());
    for d in [dir, dir2] {
        fs::remove_dir_all(d).unwrap();
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_held_account_lock_is_waited_for_not_broken() {
    let (dir, root) = seeded("pwdlock");
    let lock = dir.join("etc/.pwd.lock");
    let released = dir.join("released");
    fs::write(&lock, "").unwrap();
    // another process (flock(1) takes BSD locks; python's lockf takes the fcntl lock
    // lckpwdf takes) holds it for a moment, and says so in a file before it lets go
    let mut holder = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import fcntl,time,sys;f=open('{}','w');fcntl.lockf(f,fcntl.LOCK_EX);print('held',flush=True);\
             time.sleep(1);open('{}','w').close();fcntl.lockf(f,fcntl.LOCK_UN);time.sleep(1)",
            lock.display(),
            released.display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "held\n");
    root.ensure_user(&Username::parse("azureuser").unwrap(), None)
        .unwrap();
    // the order, not the time: the holder marked its release before it let go
    assert!(
        released.exists(),
        "the user was written while the lock was held"
    );
    holder.wait().unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn uid_range_comes_from_login_defs_and_ids_in_use_are_skipped() {
    let (dir, root) = seeded("uidmin");
    fs::write(dir.join("etc/login.defs"), "UID_MIN 2000\nGID_MIN 2000\n").unwrap();
    let mut p = text(&dir.join("etc/passwd"));
    p.push_str("taken:x:2000:2000::/home/taken:/bin/sh\n");
    fs::write(dir.join("etc/passwd"), p).unwrap();
    let mut g = text(&dir.join("etc/group"));
    g.push_str("taken:x:2000:\n");
    fs::write(dir.join("etc/group"), g).unwrap();
    let a = root
        .ensure_user(&Username::parse("bob").unwrap(), None)
        .unwrap();
    assert_eq!((a.uid, a.gid), (2001, 2001));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn password_is_stored_as_sha512_crypt() {
    let (dir, root) = seeded("password");
    root.ensure_user(
        &Username::parse("pw").unwrap(),
        Some(&hash_password(&Secret::new("S3cr3t&Pass".into())).unwrap()),
    )
    .unwrap();
    let shadow = text(&dir.join("etc/shadow"));
    let hash = shadow
        .lines()
        .last()
        .unwrap()
        .split(':')
        .nth(1)
        .unwrap()
        .to_string();
    assert!(hash.starts_with("$6$"), "{hash}");
    let salt = hash.split('$').nth(2).unwrap();
    assert_eq!(crypt_sha512("S3cr3t&Pass", salt).unwrap(), hash);
    assert!(!shadow.contains("S3cr3t"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn system_accounts_are_refused() {
    let (dir, root) = seeded("sysacct");
    let before = text(&dir.join("etc/passwd"));
    let e = root
        .ensure_user(&Username::parse("daemon").unwrap(), None)
        .unwrap_err();
    assert!(matches!(e, WriteError::SystemAccount { uid: 1, .. }), "{e}");
    assert_eq!(text(&dir.join("etc/passwd")), before);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn keys_are_merged_without_duplicates() {
    let (dir, root) = seeded("keys");
    let u = Username::parse("azureuser").unwrap();
    let a = root.ensure_user(&u, None).unwrap();
    let ssh = dir.join("home/azureuser/.ssh");
    fs::create_dir(&ssh).unwrap();
    fs::write(ssh.join("authorized_keys"), format!("# mine\n{K1}\n")).unwrap();
    let files = root.write_keys(&a, &u, &[key(K1), key(K2)]).unwrap();
    assert_eq!(files, ["/home/azureuser/.ssh/authorized_keys"]);
    assert_eq!(
        text(&ssh.join("authorized_keys")),
        format!("# mine\n{K1}\n{K2}\n")
    );
    assert_eq!((mode(&ssh), owner(&ssh)), (0o700, (1000, 1000)));
    let ak = ssh.join("authorized_keys");
    assert_eq!((mode(&ak), owner(&ak)), (0o600, (1000, 1000)));
    // again: nothing new
    root.write_keys(&a, &u, &[key(K2)]).unwrap();
    assert_eq!(text(&ak).lines().count(), 3);
    // an image's restricted line for the admin's key gives way to the metadata's line, in place
    fs::write(&ak, format!("# mine\ncommand=\"/bin/false\" {K1}\n{K2}\n")).unwrap();
    root.write_keys(&a, &u, &[key(K1)]).unwrap();
    assert_eq!(text(&ak), format!("# mine\n{K1}\n{K2}\n"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn key_paths_are_honoured_only_inside_the_home() {
    let (dir, root) = seeded("keypath");
    let u = Username::parse("azureuser").unwrap();
    let a = root.ensure_user(&u, None).unwrap();
    let mut inside = key(K1);
    inside.path = Some("/home/azureuser/.ssh/authorized_keys2".into());
    let mut outside = key(K2);
    outside.path = Some("/etc/ssh/authorized_keys".into());
    let mut sneaky = key(K2);
    sneaky.path = Some("/home/azureuser/../../etc/x".into());
    let files = root.write_keys(&a, &u, &[inside, outside, sneaky]).unwrap();
    assert_eq!(
        files,
        [
            "/home/azureuser/.ssh/authorized_keys2",
            "/home/azureuser/.ssh/authorized_keys"
        ]
    );
    assert!(!dir.join("etc/ssh/authorized_keys").exists());
    assert!(!dir.join("etc/x").exists());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_key_path_that_cannot_be_written_falls_back_to_the_default_file() {
    let (dir, root) = seeded("keyfallback");
    let u = Username::parse("azureuser").unwrap();
    let a = root.ensure_user(&u, None).unwrap();
    fs::create_dir_all(dir.join("home/azureuser/.ssh")).unwrap();
    // a symlink below the home that points out of it
    symlink("/etc/passwd", dir.join("home/azureuser/.ssh/keys")).unwrap();
    let mut trap = key(K1);
    trap.path = Some("/home/azureuser/.ssh/keys".into());
    let files = root.write_keys(&a, &u, &[trap]).unwrap();
    assert_eq!(files, ["/home/azureuser/.ssh/authorized_keys"]);
    let text = fs::read_to_string(dir.join("home/azureuser/.ssh/authorized_keys")).unwrap();
    assert!(text.contains(K1), "{text}");
    assert!(!fs::read_to_string(dir.join("etc/passwd"))
        .unwrap()
        .contains(K1));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_symlinked_ssh_dir_is_refused_and_its_target_untouched() {
    let (dir, root) = seeded("sshlink");
    let u = Username::parse("azureuser").unwrap();
    let a = root.ensure_user(&u, None).unwrap();
    symlink("/etc", dir.join("home/azureuser/.ssh")).unwrap();
    let before: Vec<_> = fs::read_dir(dir.join("etc"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let e = root.write_keys(&a, &u, &[key(K1)]).unwrap_err();
    assert!(matches!(e, WriteError::Symlink(_)), "{e}");
    let after: Vec<_> = fs::read_dir(dir.join("etc"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after);
    assert!(!dir.join("etc/authorized_keys").exists());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn sudoers_and_sshd_drop_ins() {
    let (dir, root) = seeded("sudo");
    let u = Username::parse("azureuser").unwrap();
    root.write_sudoers(&u, false).unwrap();
    let s = dir.join("etc/sudoers.d/90-azprov");
    assert_eq!((mode(&s), owner(&s)), (0o440, (0, 0)));
    assert!(text(&s).contains("azureuser ALL=(ALL) NOPASSWD:ALL\n"));
    root.write_sudoers(&u, true).unwrap();
    assert!(text(&s).contains("azureuser ALL=(ALL) ALL\n"));
    assert_eq!(
        root.write_sshd(false).unwrap(),
        Some("/etc/ssh/sshd_config.d/50-azprov.conf")
    );
    let d = dir.join("etc/ssh/sshd_config.d/50-azprov.conf");
    assert!(text(&d).contains("PasswordAuthentication no\n"));
    assert_eq!(mode(&d), 0o644);
    let config = text(&dir.join("etc/ssh/sshd_config"));
    // without the directory sshd reads nothing from it: the setting goes into sshd_config
    fs::remove_dir_all(dir.join("etc/ssh/sshd_config.d")).unwrap();
    assert_eq!(root.write_sshd(true).unwrap(), Some("/etc/ssh/sshd_config"));
    assert!(!dir.join("etc/ssh/sshd_config.d").exists());
    assert_eq!(
        text(&dir.join("etc/ssh/sshd_config")),
        format!(
            "{}\nPasswordAuthentication yes\n{config}",
            includes::SSHD_MARK
        )
    );
    // with it back, the drop-in again, and sshd_config as it was
    fs::create_dir(dir.join("etc/ssh/sshd_config.d")).unwrap();
    root.write_sshd(false).unwrap();
    assert_eq!(text(&dir.join("etc/ssh/sshd_config")), config);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn hardened_sshd_and_sudo_configs_are_edited_so_the_settings_count() {
    let (dir, root) = seeded("hardened-includes");
    // RHEL 8's shape: no Include, a PasswordAuthentication of its own, a Match block
    let sshd =
        "# hardened\nPasswordAuthentication yes\nMatch Group sftp\n  ForceCommand internal-sftp\n";
    fs::write(dir.join("etc/ssh/sshd_config"), sshd).unwrap();
    let sudoers = "Defaults env_reset\nroot ALL=(ALL:ALL) ALL\n";
    fs::write(dir.join("etc/sudoers"), sudoers).unwrap();
    fs::set_permissions(dir.join("etc/sudoers"), fs::Permissions::from_mode(0o440)).unwrap();
    let u = Username::parse("azureuser").unwrap();
    root.write_sudoers(&u, false).unwrap();
    assert_eq!(
        text(&dir.join("etc/sudoers")),
        format!("{sudoers}\n# added by azprov: read the drop-ins in /etc/sudoers.d\n#includedir /etc/sudoers.d\n")
    );
    assert_eq!(mode(&dir.join("etc/sudoers")), 0o440);
    // once is enough
    root.write_sudoers(&u, false).unwrap();
    assert_eq!(
        text(&dir.join("etc/sudoers"))
            .matches("#includedir")
            .count(),
        1
    );
    assert_eq!(
        root.write_sshd(false).unwrap(),
        Some("/etc/ssh/sshd_config")
    );
    assert!(!dir.join("etc/ssh/sshd_config.d/50-azprov.conf").exists());
    assert_eq!(
        text(&dir.join("etc/ssh/sshd_config")),
        format!("{}\nPasswordAuthentication no\n{sshd}", includes::SSHD_MARK)
    );
    assert!(root.remove_sshd_setting(false).unwrap());
    assert_eq!(text(&dir.join("etc/ssh/sshd_config")), sshd);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn state_files_are_private() {
    let (dir, root) = seeded("state");
    root.write_state("customdata", b"#cloud-config\n").unwrap();
    root.write_state("provisioned", b"vm-1\n").unwrap();
    assert_eq!(mode(&dir.join("var/lib/azprov")), 0o700);
    assert_eq!(mode(&dir.join("var/lib/azprov/customdata")), 0o600);
    assert_eq!(root.read_marker().as_deref(), Some("vm-1"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn accounts_outside_the_user_range_or_without_a_login_are_refused() {
    let (dir, root) = seeded("range");
    let mut passwd = text(&dir.join("etc/passwd"));
    passwd.push_str("svc:x:1500:1500::/home/svc:/usr/sbin/nologin\n");
    passwd.push_str("locked:x:1501:1501::/home/locked:/bin/false\n");
    passwd.push_str("high:x:70000:70000::/home/high:/bin/bash\n");
    fs::write(dir.join("etc/passwd"), &passwd).unwrap();
    for (name, want) in [
        ("nobody", "uid 65534"),
        ("high", "uid 70000"),
        ("svc", "cannot log in (/usr/sbin/nologin)"),
        ("locked", "cannot log in (/bin/false)"),
    ] {
        let e = root
            .ensure_user(&Username::parse(name).unwrap(), None)
            .unwrap_err();
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
    assert_eq!(text(&dir.join("etc/passwd")), passwd);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_group_named_like_the_user_becomes_its_primary_group_unless_a_system_one() {
    let (dir, root) = seeded("samegroup");
    let mut group = text(&dir.join("etc/group"));
    group.push_str("alice:x:1234:\nsysgrp:x:50:\n");
    fs::write(dir.join("etc/group"), &group).unwrap();
    let a = root
        .ensure_user(&Username::parse("alice").unwrap(), None)
        .unwrap();
    assert_eq!(a.gid, 1234);
    assert!(text(&dir.join("etc/passwd")).contains(":1234::/home/alice:"));
    assert_eq!(text(&dir.join("etc/group")).matches("alice:").count(), 1);
    let e = root
        .ensure_user(&Username::parse("sysgrp").unwrap(), None)
        .unwrap_err();
    assert!(matches!(e, WriteError::SystemGroup { gid: 50, .. }), "{e}");
    assert!(!text(&dir.join("etc/passwd")).contains("sysgrp"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn other_accounts_lines_stay_byte_for_byte() {
    let (dir, root) = seeded("bytes");
    let mut passwd = fs::read(dir.join("etc/passwd")).unwrap();
    // a Latin-1 GECOS (é = 0xE9), not UTF-8
    passwd.extend_from_slice(b"rene:x:1001:1001:Ren\xe9 Z:/home/rene:/bin/bash\n");
    fs::write(dir.join("etc/passwd"), &passwd).unwrap();
    root.ensure_user(&Username::parse("azureuser").unwrap(), None)
        .unwrap();
    let after = fs::read(dir.join("etc/passwd")).unwrap();
    assert!(after.starts_with(&passwd), "the old lines changed");
    assert!(after[passwd.len()..].starts_with(b"azureuser:x:"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_symlinked_passwd_is_read_and_edited_inside_the_root() {
    let (dir, root) = seeded("linkedpasswd");
    let real = dir.join("etc/passwd.real");
    fs::rename(dir.join("etc/passwd"), &real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o644)).unwrap();
    // absolute: means the root's /etc/passwd.real, never the host's
    symlink("/etc/passwd.real", dir.join("etc/passwd")).unwrap();
    let before = text(&real);
    root.ensure_user(&Username::parse("azureuser").unwrap(), None)
        .unwrap();
    assert!(fs::symlink_metadata(dir.join("etc/passwd"))
        .unwrap()
        .file_type()
        .is_symlink());
    let after = text(&real);
    assert!(
        after.starts_with(&before) && after.contains("\nazureuser:x:1000:"),
        "{after}"
    );
    assert_eq!(mode(&real), 0o644);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn an_interrupted_account_rewrite_is_completed_consistently_by_the_next_run() {
    use std::sync::atomic::Ordering;
    // group, gshadow, shadow, passwd: fail each in turn, then run again without the fault
    for n in 0..4 {
        let (dir, root) = seeded(&format!("interrupt{n}"));
        let user = Username::parse("azureuser").unwrap();
        root.writes_left.store(n, Ordering::SeqCst);
        let e = root.ensure_user(&user, None).unwrap_err();
        assert!(e.to_string().contains("No space left"), "{n}: {e}");
        root.writes_left.store(usize::MAX, Ordering::SeqCst);
        let a = root.ensure_user(&user, None).unwrap();
        for (file, want) in [
            (
                "etc/passwd",
                format!("azureuser:x:{}:{}::/home/azureuser:", a.uid, a.gid),
            ),
            ("etc/group", format!("azureuser:x:{}:", a.gid)),
            ("etc/shadow", "azureuser:!:".to_string()),
            ("etc/gshadow", "azureuser:!::".to_string()),
        ] {
            let t = text(&dir.join(file));
            let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("azureuser:")).collect();
            assert_eq!(lines.len(), 1, "{n} {file}: {t}");
            assert!(lines[0].starts_with(&want), "{n} {file}: {}", lines[0]);
        }
        assert!(dir.join("home/azureuser").is_dir(), "{n}");
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_batch_puts_its_files_in_place_at_the_barrier_and_drops_what_it_never_synced() {
    let (dir, root) = seeded("batch");
    let before = text(&dir.join("etc/hostname"));
    {
        let batch = root.batch();
        root.write("/etc/hostname", b"first\n", 0o644, (0, 0))
            .unwrap();
        root.write("/etc/hostname", b"second\n", 0o644, (0, 0))
            .unwrap();
        // not in place before the barrier: the old file, the new one beside it
        assert_eq!(text(&dir.join("etc/hostname")), before);
        assert_eq!(text(&dir.join("etc/.hostname.azprov-tmp")), "second\n");
        batch.sync().unwrap();
        assert_eq!(text(&dir.join("etc/hostname")), "second\n");
        assert!(!dir.join("etc/.hostname.azprov-tmp").exists());
        root.write("/etc/motd", b"never synced\n", 0o644, (0, 0))
            .unwrap();
    }
    // dropped without a sync: the temporary is gone, the file untouched
    assert!(!dir.join("etc/.motd.azprov-tmp").exists());
    assert!(!dir.join("etc/motd").exists());
    // after the batch a write is in place at once
    root.write("/etc/motd", b"now\n", 0o644, (0, 0)).unwrap();
    assert_eq!(text(&dir.join("etc/motd")), "now\n");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn the_account_files_go_into_place_together_or_not_at_all() {
    use std::sync::atomic::Ordering;
    let (dir, root) = seeded("accounts-together");
    let before: Vec<String> = ["etc/group", "etc/gshadow", "etc/shadow", "etc/passwd"]
        .iter()
        .map(|f| text(&dir.join(f)))
        .collect();
    // the claim on the user and group are written, gshadow's temporary hits a full disk
    root.writes_left.store(2, Ordering::SeqCst);
    let batch = root.batch();
    let e = root
        .ensure_user(&Username::parse("azureuser").unwrap(), None)
        .unwrap_err();
    assert!(e.to_string().contains("No space left"), "{e}");
    batch.sync().unwrap();
    drop(batch);
    let after: Vec<String> = ["etc/group", "etc/gshadow", "etc/shadow", "etc/passwd"]
        .iter()
        .map(|f| text(&dir.join(f)))
        .collect();
    assert_eq!(
        after, before,
        "a group went into place without its gshadow line"
    );
    assert!(root.stale_temporaries().is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn azprovs_state_directory_is_private_whatever_an_earlier_run_left() {
    let (dir, root) = seeded("state-mode");
    // a run cut between mkdir and chmod, under the usual umask
    fs::create_dir(dir.join("var/lib/azprov")).unwrap();
    fs::set_permissions(
        dir.join("var/lib/azprov"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    root.write_state("state.json", b"{}").unwrap();
    assert_eq!(mode(&dir.join("var/lib/azprov")), 0o700);
    // a new directory is never wider than its final mode, even before the chmod
    root.mkdir("/var/lib/new/deeper", 0o700, (0, 0)).unwrap();
    assert_eq!(mode(&dir.join("var/lib/new/deeper")), 0o700);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn stale_temporaries_are_found_where_azprov_writes_and_nowhere_else() {
    let (dir, root) = seeded("stale");
    fs::create_dir_all(dir.join("var/lib/azprov")).unwrap();
    fs::create_dir_all(dir.join("home/alice/.ssh")).unwrap();
    for f in [
        "etc/.passwd.azprov-tmp",
        "var/lib/azprov/.state.json.azprov-tmp",
        "var/log/.azprov.log.azprov-tmp",
        "home/alice/.ssh/.authorized_keys.azprov-tmp",
        // not azprov's: kept
        "etc/passwd.azprov-tmp",
        "etc/.passwd.tmp",
        "var/.x.azprov-tmp",
    ] {
        fs::write(dir.join(f), "x").unwrap();
    }
    fs::create_dir(dir.join("home/.bob.azprov-tmp")).unwrap();
    let mut found: Vec<String> = root
        .stale_temporaries()
        .iter()
        .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            "etc/.passwd.azprov-tmp",
            "home/.bob.azprov-tmp",
            "home/alice/.ssh/.authorized_keys.azprov-tmp",
            "var/lib/azprov/.state.json.azprov-tmp",
            "var/log/.azprov.log.azprov-tmp",
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_home_left_by_another_uid_is_taken_over_unless_an_account_owns_it() {
    let (dir, root) = seeded("home-owner");
    let u = Username::parse("azureuser").unwrap();
    // left by a removed user: uid 4242 is nobody's
    let home = dir.join("home/azureuser");
    fs::create_dir_all(home.join(".ssh")).unwrap();
    fs::write(home.join(".ssh/authorized_keys"), "").unwrap();
    for p in [
        &home,
        &home.join(".ssh"),
        &home.join(".ssh/authorized_keys"),
    ] {
        std::os::unix::fs::lchown(p, Some(4242), Some(4242)).unwrap();
    }
    let a = root.ensure_user(&u, None).unwrap();
    for p in [
        &home,
        &home.join(".ssh"),
        &home.join(".ssh/authorized_keys"),
    ] {
        assert_eq!(owner(p), (a.uid, a.gid), "{}", p.display());
    }
    // another account's home under that name: refused, naming the owner
    let (dir2, root2) = seeded("home-owner-2");
    let passwd = text(&dir2.join("etc/passwd"));
    fs::write(
        dir2.join("etc/passwd"),
        format!("{passwd}alice:x:1500:1500::/home/alice:/bin/bash\n"),
    )
    .unwrap();
    fs::create_dir_all(dir2.join("home/azureuser")).unwrap();
    std::os::unix::fs::lchown(dir2.join("home/azureuser"), Some(1500), Some(1500)).unwrap();
    let e = root2.ensure_user(&u, None).unwrap_err();
    assert!(
        e.to_string()
            .contains("/home/azureuser exists and belongs to the account alice"),
        "{e}"
    );
    for d in [dir, dir2] {
        fs::remove_dir_all(d).unwrap();
    }
}

#[test]
#[cfg_attr(
    azprov_unprivileged,
    ignore = "needs root (runs as root and under CI=true)"
)]
fn a_lock_held_past_the_runs_deadline_fails_the_user_instead_of_holding_the_boot() {
    let (dir, root) = seeded("pwdlock-deadline");
    let lock = dir.join("etc/.pwd.lock");
    fs::write(&lock, "").unwrap();
    let mut holder = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import fcntl,time;f=open('{}','w');fcntl.lockf(f,fcntl.LOCK_EX);print('held',flush=True);time.sleep(30)",
            lock.display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    root.set_deadline(crate::deadline::Deadline::after(
        std::time::Duration::from_millis(300),
    ));
    let e = root
        .ensure_user(&Username::parse("azureuser").unwrap(), None)
        .unwrap_err();
    assert!(e.to_string().contains("lock"), "{e}");
    // given up while the holder still holds it
    assert!(holder.try_wait().unwrap().is_none());
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(!text(&dir.join("etc/passwd")).contains("azureuser"));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_that_wrap_another_give_it_as_their_source() {
    use std::error::Error;
    let w = WriteError::Io {
        op: "rename",
        path: "/etc/hostname".into(),
        source: io::Error::from_raw_os_error(libc::EISDIR),
    };
    let src = w.source().unwrap().downcast_ref::<io::Error>().unwrap();
    assert_eq!(src.raw_os_error(), Some(libc::EISDIR));
    let h = crate::azure::http::HttpError::Deadline {
        url: "http://169.254.169.254/".into(),
        attempts: 3,
        last: Box::new(crate::azure::http::HttpError::Status {
            url: "http://169.254.169.254/".into(),
            status: 503,
        }),
    };
    let last = h.source().unwrap().to_string();
    assert!(last.ends_with("HTTP status 503"), "{last}");
    let k = crate::provision::hostkeys::HostKeyError::Write(w);
    assert!(k.source().unwrap().source().is_some());
    assert!(WriteError::NoFreeId.source().is_none());
}
