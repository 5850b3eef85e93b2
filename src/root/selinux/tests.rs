use super::*;

const FC: &str = include_str!("../../../tests/fixtures/selinux/debian12-default/file_contexts");
const HOMEDIRS: &str =
    include_str!("../../../tests/fixtures/selinux/debian12-default/file_contexts.homedirs");
const SUBS_DIST: &str =
    include_str!("../../../tests/fixtures/selinux/debian12-default/file_contexts.subs_dist");

fn kind(k: &str) -> u32 {
    match k {
        "file" => libc::S_IFREG,
        "dir" => libc::S_IFDIR,
        "lnk_file" => libc::S_IFLNK,
        "chr_file" => libc::S_IFCHR,
        _ => 0,
    }
}

/// Debian 12's selinux-policy-default (2:2.20221101-9) as installed (file_contexts and
/// .homedirs are built by semodule at install time), and what libselinux 3.4's own
/// `matchpathcon -f file_contexts -m TYPE PATH` printed for each path on the same files.
const MATCHPATHCON: &[(&str, &str, &str)] = &[
    ("/etc/passwd", "file", "system_u:object_r:etc_t:s0"),
    ("/etc/group", "file", "system_u:object_r:etc_t:s0"),
    ("/etc/shadow", "file", "system_u:object_r:shadow_t:s0"),
    ("/etc/gshadow", "file", "system_u:object_r:shadow_t:s0"),
    ("/etc/subuid", "file", "system_u:object_r:etc_t:s0"),
    ("/etc/subgid", "file", "system_u:object_r:etc_t:s0"),
    (
        "/etc/.pwd.lock",
        "file",
        "system_u:object_r:shadow_lock_t:s0",
    ),
    ("/etc/passwd-", "file", "system_u:object_r:etc_t:s0"),
    ("/etc/hostname", "file", "system_u:object_r:net_conf_t:s0"),
    ("/etc/hosts", "file", "system_u:object_r:net_conf_t:s0"),
    ("/etc/machine-id", "file", "system_u:object_r:etc_t:s0"),
    ("/etc/sudoers", "file", "system_u:object_r:etc_t:s0"),
    ("/etc/sudoers.d", "dir", "system_u:object_r:etc_t:s0"),
    (
        "/etc/sudoers.d/90-azprov",
        "file",
        "system_u:object_r:etc_t:s0",
    ),
    ("/etc/ssh/sshd_config", "file", "system_u:object_r:etc_t:s0"),
    (
        "/etc/ssh/sshd_config.d",
        "dir",
        "system_u:object_r:etc_t:s0",
    ),
    (
        "/etc/ssh/sshd_config.d/50-azprov.conf",
        "file",
        "system_u:object_r:etc_t:s0",
    ),
    (
        "/etc/ssh/ssh_host_rsa_key",
        "file",
        "system_u:object_r:sshd_key_t:s0",
    ),
    (
        "/etc/ssh/ssh_host_ed25519_key.pub",
        "file",
        "system_u:object_r:sshd_key_t:s0",
    ),
    ("/home", "dir", "system_u:object_r:home_root_t:s0"),
    (
        "/home/azureuser",
        "dir",
        "unconfined_u:object_r:user_home_dir_t:s0",
    ),
    (
        "/home/azureuser/.bashrc",
        "file",
        "unconfined_u:object_r:user_home_t:s0",
    ),
    (
        "/home/azureuser/.ssh",
        "dir",
        "unconfined_u:object_r:ssh_home_t:s0",
    ),
    (
        "/home/azureuser/.ssh/authorized_keys",
        "file",
        "unconfined_u:object_r:ssh_home_t:s0",
    ),
    (
        "/home/azureuser/.config",
        "dir",
        "unconfined_u:object_r:xdg_config_t:s0",
    ),
    ("/var/lib/azprov", "dir", "system_u:object_r:var_lib_t:s0"),
    (
        "/var/lib/azprov/state.json",
        "file",
        "system_u:object_r:var_lib_t:s0",
    ),
    (
        "/var/lib/azprov/provisioned",
        "file",
        "system_u:object_r:var_lib_t:s0",
    ),
    (
        "/var/log/azprov.log",
        "file",
        "system_u:object_r:var_log_t:s0",
    ),
    ("/var/log", "dir", "system_u:object_r:var_log_t:s0"),
    ("/var/run/azprov", "file", "<<none>>"),
    ("/run/systemd", "dir", "system_u:object_r:init_runtime_t:s0"),
    (
        "/lib/systemd/system/ssh.service",
        "file",
        "system_u:object_r:sshd_unit_t:s0",
    ),
    ("/bin/bash", "file", "system_u:object_r:shell_exec_t:s0"),
    ("/usr/sbin/azprov", "file", "system_u:object_r:bin_t:s0"),
    (
        "/var/lib/private/x",
        "file",
        "system_u:object_r:var_lib_t:s0",
    ),
    ("/root", "dir", "unconfined_u:object_r:user_home_dir_t:s0"),
    (
        "/root/.ssh/authorized_keys",
        "file",
        "unconfined_u:object_r:ssh_home_t:s0",
    ),
    ("/tmp", "dir", "system_u:object_r:tmp_t:s0"),
    (
        "/dev/ttyS0",
        "chr_file",
        "system_u:object_r:tty_device_t:s0",
    ),
    (
        "/etc/ssh/ssh_host_rsa_key",
        "lnk_file",
        "system_u:object_r:etc_t:s0",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "file",
        "system_u:object_r:lib_t:s0",
    ),
    ("/var/spool/cron/crontabs/root", "file", "<<none>>"),
    (
        "/etc/selinux/default/contexts/files/file_contexts",
        "file",
        "system_u:object_r:file_context_t:s0",
    ),
];

#[test]
fn labels_are_those_libselinux_gives_on_a_real_policy() {
    let (fc, bad) = FileContexts::parse(&[FC, HOMEDIRS], "", SUBS_DIST);
    assert_eq!(bad, 0);
    assert!(fc.len() > 5000, "{}", fc.len());
    for (path, k, want) in MATCHPATHCON {
        let got = fc.lookup(path, kind(k)).unwrap_or("<<none>>");
        assert_eq!(got, *want, "{path} ({k})");
    }
}

#[test]
fn exact_paths_win_and_the_last_expression_wins() {
    let fc = "/a(/.*)?\tu:r:first:s0\n/a/b\tu:r:exact:s0\n/a/.*\tu:r:later:s0\n\
              /a/c\t-d\tu:r:dir_only:s0\n/n(/.*)?\t<<none>>\n";
    let (fc, bad) = FileContexts::parse(&[fc, "/a/b/c u:r:local:s0\nnot a spec at all\n"], "", "");
    assert_eq!(bad, 1);
    assert_eq!(fc.lookup("/a", libc::S_IFDIR), Some("u:r:first:s0"));
    assert_eq!(fc.lookup("/a/b", libc::S_IFREG), Some("u:r:exact:s0"));
    assert_eq!(fc.lookup("/a/x", libc::S_IFREG), Some("u:r:later:s0"));
    assert_eq!(fc.lookup("/a/b/c", libc::S_IFREG), Some("u:r:local:s0"));
    assert_eq!(fc.lookup("/a/c", libc::S_IFDIR), Some("u:r:dir_only:s0"));
    assert_eq!(fc.lookup("/a/c", libc::S_IFREG), Some("u:r:later:s0"));
    assert_eq!(fc.lookup("/a//x", libc::S_IFREG), Some("u:r:later:s0"));
    assert_eq!(fc.lookup("/n/x", 0), None);
    assert_eq!(fc.lookup("/elsewhere", 0), None);
}

#[test]
fn substitutions_apply_local_first_then_the_distributions() {
    let (fc, _) = FileContexts::parse(
        &["/run(/.*)? u:r:run:s0\n/srv/www(/.*)? u:r:www:s0\n"],
        "/web /var/www\n",
        "/var/run /run\n/var/www /srv/www\n",
    );
    assert_eq!(fc.lookup("/var/run/x", 0), Some("u:r:run:s0"));
    assert_eq!(fc.lookup("/web/index", 0), Some("u:r:www:s0"));
    assert_eq!(fc.lookup("/var/running", 0), None);
}

#[test]
fn literal_prefixes_never_exclude_a_match() {
    assert_eq!(literal_prefix("/etc/shadow.*"), b"/etc/shadow");
    assert_eq!(literal_prefix("/var/log/gdm(3)?"), b"/var/log/gdm");
    assert_eq!(literal_prefix("/dev/x?y"), b"/dev/");
    assert_eq!(literal_prefix("/a\\.b+"), b"/a.b");
    assert_eq!(literal_prefix("/a|/b"), b"");
    assert_eq!(literal_prefix("/(a|b)"), b"/");
    assert_eq!(literal_prefix("/a\\d"), b"/a");
    assert!(has_meta("/a.b") && !has_meta("/a\\.b") && !has_meta("/etc/passwd"));
}

#[test]
fn the_config_names_the_policy_only_when_selinux_is_on() {
    let on = Config::parse("# c\nSELINUX=enforcing\nSELINUXTYPE=default\n").unwrap();
    assert_eq!(on.policy, "default");
    assert_eq!(
        on.file_contexts(),
        "/etc/selinux/default/contexts/files/file_contexts"
    );
    assert_eq!(
        Config::parse("SELINUX=permissive\n").unwrap().policy,
        "targeted"
    );
    assert!(Config::parse("SELINUX=disabled\nSELINUXTYPE=default\n").is_none());
    assert!(Config::parse("SELINUXTYPE=default\n").is_none());
    assert!(Config::parse("SELINUX=enforcing\nSELINUXTYPE=../x\n").is_none());
}
