use super::*;
use crate::sys::kernel::fake::Recorder;

#[test]
fn rootdelay_bounds_the_root_wait_and_rootwait_alone_lifts_the_bound() {
    let wait = |line: &str| root_wait(&crate::config::load(None, line).0);
    assert_eq!(wait("root=/dev/vda1"), Some(ROOT_WAIT_DEFAULT));
    assert_eq!(wait("root=/dev/vda1 rootwait"), None);
    assert_eq!(
        wait("root=/dev/vda1 rootwait rootdelay=7"),
        Some(Duration::from_secs(7))
    );
}

#[test]
fn the_early_filesystems_mount_in_order_and_a_mounted_one_is_fine() {
    let k = Recorder {
        fail: vec![
            ("mount proc".into(), Errno::EBUSY),
            ("mount sysfs".into(), Errno::ENODEV),
        ],
        ..Recorder::default()
    };
    let failed = mount_early(&k);
    assert_eq!(failed, [("/sys", Errno::ENODEV)]);
    let calls = k.calls();
    let mounts: Vec<&str> = calls
        .iter()
        .filter(|c| c.starts_with("mount"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        mounts,
        [
            "mount devtmpfs /dev devtmpfs 0x2 mode=0755",
            "mount proc /proc proc 0xe -",
            "mount sysfs /sys sysfs 0xe -",
            "mount tmpfs /run tmpfs 0x6 mode=0755",
        ]
    );
    // each directory made before its mount
    assert_eq!(calls[0], "mkdir /dev");
}

#[test]
fn the_root_takes_the_first_type_that_mounts_and_names_every_refusal() {
    let k = Recorder {
        fail: vec![("mount /dev/vda1 /sysroot ext4".into(), Errno::EINVAL)],
        ..Recorder::default()
    };
    let dev = Path::new("/dev/vda1");
    assert_eq!(
        mount_first(&k, dev, &["ext4", "xfs", "btrfs"], Some("noatime")),
        Ok("xfs")
    );
    assert_eq!(
        k.calls(),
        [
            "mount /dev/vda1 /sysroot ext4 0x0 noatime",
            "mount /dev/vda1 /sysroot xfs 0x0 noatime"
        ]
    );
    let none = Recorder {
        fail: vec![("mount".into(), Errno::EINVAL)],
        ..Recorder::default()
    };
    assert_eq!(
        mount_first(&none, dev, &["ext4", "xfs"], None),
        Err(vec![
            ("ext4".to_string(), Errno::EINVAL),
            ("xfs".to_string(), Errno::EINVAL)
        ])
    );
}

#[test]
fn ro_remounts_the_root_read_only_with_no_type() {
    let k = Recorder::default();
    remount_read_only(&k, Path::new("/dev/vda1"));
    assert_eq!(k.calls(), ["mount /dev/vda1 /sysroot  0x21 -"]);
}

/// azprov.inplace: /run is detached first (its files land in the RAM root the OS's init
/// carries along); at the handover /sys, /proc and /dev are detached too, then the init is
/// exec'd in place: no chroot, no switch_root.
#[test]
fn in_place_detaches_the_early_mounts_and_execs_the_init_as_it_is() {
    let k = Recorder::default();
    run_in_ram_root(&k);
    let e = exec_in_place(&k, "/init.os", &["quiet".to_string()]);
    assert_eq!(e, Errno::ENOEXEC);
    assert_eq!(
        k.calls(),
        [
            "umount /run 0x2",
            "umount /sys 0x2",
            "umount /proc 0x2",
            "umount /dev 0x2",
            "exec /init.os quiet",
        ]
    );
}
