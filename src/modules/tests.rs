use super::loader::scan_sync;
use super::on_demand::has_filesystem;
use super::*;
use std::sync::{Condvar, Mutex};

const LIST: &str = "\
# written by mkinitramfs
/lib/modules/k/kernel/drivers/scsi/scsi_common.ko:
/lib/modules/k/kernel/drivers/scsi/scsi_mod.ko: scsi_common
/lib/modules/k/kernel/lib/libcrc32c.ko:
/lib/modules/k/kernel/fs/xfs/xfs.ko: libcrc32c
/lib/modules/k/kernel/crypto/xor.ko:
/lib/modules/k/kernel/lib/raid6/raid6_pq.ko:
/lib/modules/k/kernel/lib/zstd/zstd_compress.ko:
/lib/modules/k/kernel/fs/btrfs/btrfs.ko: xor raid6_pq zstd_compress libcrc32c
/lib/modules/k/kernel/lib/crc-itu-t.ko:
/lib/modules/k/kernel/fs/udf/udf.ko: crc-itu-t
/lib/modules/k/kernel/drivers/md/raid456.ko: raid6_pq xor
/lib/modules/k/kernel/drivers/ata/ata_piix.ko: scsi_mod | pci:v00008086d00007111sv*sd*bc*sc*i* pci:v00008086d00007010sv*sd*bc*sc*i*
";

fn names(v: &[Module]) -> Vec<&str> {
    v.iter().map(|m| m.name.as_str()).collect()
}

#[test]
fn parses_paths_names_and_deps() {
    let l = parse_list(LIST);
    assert_eq!(l.len(), 12);
    assert_eq!(l[11].name, "ata_piix");
    assert_eq!(l[11].deps, ["scsi_mod"]);
    assert_eq!(l[11].aliases.len(), 2);
    assert!(l[1].aliases.is_empty());
    assert_eq!(l[1].name, "scsi_mod");
    assert_eq!(l[1].deps, ["scsi_common"]);
    assert_eq!(l[8].name, "crc_itu_t");
    assert_eq!(l[9].deps, ["crc_itu_t"]);
}

#[test]
fn root_filesystems_and_their_own_deps_wait() {
    let (now, later) = split_deferred(parse_list(LIST));
    // raid6_pq and xor are also needed by raid456, which loads now
    assert_eq!(
        names(&now),
        [
            "scsi_common",
            "scsi_mod",
            "xor",
            "raid6_pq",
            "crc_itu_t",
            "udf",
            "raid456",
            "ata_piix"
        ]
    );
    assert_eq!(
        names(&later),
        ["libcrc32c", "xfs", "zstd_compress", "btrfs"]
    );
}

#[test]
fn iso9660_waits_until_a_cd_needs_it_and_an_unknown_root_type_leaves_it() {
    let list = "\
/k/drivers/cdrom/cdrom.ko:
/k/drivers/scsi/sr_mod.ko: cdrom
/k/fs/isofs/isofs.ko: cdrom
/k/lib/libcrc32c.ko:
/k/fs/xfs/xfs.ko: libcrc32c
";
    let (now, later) = split_deferred(parse_list(list));
    // cdrom is sr_mod's too: it loads now
    assert_eq!(names(&now), ["cdrom", "sr_mod"]);
    assert_eq!(names(&later), ["isofs", "libcrc32c", "xfs"]);
    let mut loader = Loader::new(later, Vec::new());
    // a root whose type is unknown takes every root filesystem, not the CD's
    assert_eq!(names(&loader.take_deferred(None)), ["libcrc32c", "xfs"]);
    assert_eq!(
        names(&loader.take_deferred(Some("udf"))),
        Vec::<&str>::new()
    );
    assert_eq!(names(&loader.take_deferred(Some("iso9660"))), ["isofs"]);
    assert!(loader.deferred.is_empty());
}

#[test]
fn a_filesystem_type_is_there_when_the_kernel_lists_it() {
    let f = std::env::temp_dir().join(format!("azprov-filesystems-{}", std::process::id()));
    std::fs::write(&f, "nodev\tsysfs\nnodev\ttmpfs\n\text4\n\tudf\n").unwrap();
    assert!(has_filesystem(&f, "udf"));
    assert!(has_filesystem(&f, "tmpfs"));
    assert!(!has_filesystem(&f, "iso9660"));
    assert!(!has_filesystem(&f, "ext"));
    std::fs::remove_file(&f).unwrap();
    assert!(!has_filesystem(&f, "udf"));
}

#[test]
fn a_loader_still_loading_is_joined_once_and_then_kept() {
    let list = "/k/fs/isofs/isofs.ko:\n";
    let (_, later) = split_deferred(parse_list(list));
    let thread = std::thread::spawn(move || Loader::new(later, Vec::new()));
    let shared = OnDemand::loading(thread);
    let other = shared.clone();
    other.wait();
    let names = shared.with_loader(|l| {
        l.deferred
            .iter()
            .map(|m| m.name.clone())
            .collect::<Vec<_>>()
    });
    assert_eq!(names, Some(vec!["isofs".to_string()]));
    assert!(OnDemand::default().with_loader(|_| ()).is_none());
}

#[test]
fn nothing_deferred_without_root_filesystems() {
    let (now, later) = split_deferred(parse_list("/a/x.ko:\n/a/y.ko: x\n"));
    assert_eq!(names(&now), ["x", "y"]);
    assert!(later.is_empty());
}

/// Runs `load_with` on `list`, recording when each module starts and ends; `fail` names the
/// modules whose load fails with ENODEV.
fn run(loader: &mut Loader, list: &str, fail: &[&str]) -> Vec<(String, bool)> {
    let events = Mutex::new(Vec::new());
    loader.load_with(&parse_list(list), 4, |m, _| {
        events.lock().unwrap().push((m.name.clone(), true));
        std::thread::sleep(std::time::Duration::from_millis(2));
        events.lock().unwrap().push((m.name.clone(), false));
        if fail.contains(&m.name.as_str()) {
            Err(Errno::ENODEV)
        } else {
            Ok(())
        }
    });
    events.into_inner().unwrap()
}

fn ended_before(events: &[(String, bool)], first: &str, then: &str) -> bool {
    let at = |n: &str, start: bool| events.iter().position(|e| e.0 == n && e.1 == start);
    matches!((at(first, false), at(then, true)), (Some(a), Some(b)) if a < b)
}

const PARALLEL: &str = "\
/l/kernel/drivers/scsi/scsi_common.ko:
/l/kernel/drivers/scsi/scsi_mod.ko: scsi_common
/l/kernel/drivers/ata/libata.ko: scsi_mod
/l/kernel/drivers/ata/ata_piix.ko: libata scsi_mod
/l/kernel/drivers/scsi/sr_mod.ko: scsi_mod
/l/kernel/drivers/virtio/virtio.ko:
/l/kernel/drivers/virtio/virtio_pci.ko: virtio
/l/kernel/drivers/block/virtio_blk.ko: virtio
/l/kernel/drivers/net/hv_netvsc.ko: hv_vmbus
/l/kernel/drivers/net/virtio_net.ko: virtio
/l/kernel/fs/udf/udf.ko:
";

#[test]
fn a_module_starts_after_its_dependencies_and_its_lane() {
    let mut l = Loader::default();
    let ev = run(&mut l, PARALLEL, &[]);
    assert_eq!(l.loaded, 11);
    assert!(l.skipped.is_empty());
    for (dep, m) in [
        ("scsi_common", "scsi_mod"),
        ("scsi_mod", "libata"),
        ("libata", "ata_piix"),
        ("virtio", "virtio_pci"),
        ("virtio", "virtio_net"),
        // the lanes: SCSI hosts and the names they give, network drivers
        ("ata_piix", "sr_mod"),
        ("hv_netvsc", "virtio_net"),
    ] {
        assert!(
            ended_before(&ev, dep, m),
            "{m} started before {dep} ended: {ev:?}"
        );
    }
}

#[test]
fn a_failed_dependency_skips_its_dependants_only() {
    let list = "/l/a.ko:\n/l/b.ko: a\n/l/c.ko: b\n/l/d.ko:\n";
    let mut l = Loader::default();
    let ev = run(&mut l, list, &["a"]);
    assert_eq!(l.loaded, 1);
    assert_eq!(l.skipped, ["a (no device)", "b (needs a)", "c (needs b)"]);
    // b and c were never tried
    assert!(!ev.iter().any(|e| e.0 == "b" || e.0 == "c"));
    // a later round (the root filesystem's modules) knows what failed before
    let ev = run(&mut l, "/l/e.ko: c\n/l/f.ko:\n", &[]);
    assert_eq!(l.skipped.last().unwrap(), "e (needs c)");
    assert_eq!(l.loaded, 2);
    assert!(!ev.iter().any(|e| e.0 == "e"));
}

/// A flag one module's load opens and another's waits for (at most 10 s), to see two loads
/// overlap.
#[derive(Default)]
struct Gate(Mutex<bool>, Condvar);

impl Gate {
    fn open(&self) {
        *self.0.lock().unwrap() = true;
        self.1.notify_all();
    }

    /// Whether the gate opened within 10 s.
    fn wait(&self) -> bool {
        let g = self.0.lock().unwrap();
        let (g, _) = self
            .1
            .wait_timeout_while(g, std::time::Duration::from_secs(10), |open| !*open)
            .unwrap();
        *g
    }
}

#[test]
fn independent_modules_load_at_the_same_time() {
    // x blocks until y has started: a serial load would wait out the 10 s and see false
    let y_started = Gate::default();
    let saw_y = Mutex::new(false);
    let mut l = Loader::default();
    l.load_with(&parse_list("/l/x.ko:\n/l/y.ko:\n"), 4, |m, _| {
        if m.name == "y" {
            y_started.open();
        } else {
            *saw_y.lock().unwrap() = y_started.wait();
        }
        Ok(())
    });
    assert!(*saw_y.lock().unwrap(), "x and y did not overlap");
    assert_eq!(l.loaded, 2);
}

#[test]
fn a_library_holds_no_lane() {
    // libata (drivers/ata, needed by ata_piix) starts while hv_storvsc, the lane's first
    // host, is still loading; ata_piix, a host, still waits for hv_storvsc
    let list = "\
/l/kernel/drivers/scsi/hv_storvsc.ko:
/l/kernel/drivers/ata/libata.ko:
/l/kernel/drivers/ata/ata_piix.ko: libata
";
    let libata_started = Gate::default();
    let saw_libata = Mutex::new(false);
    let events = Mutex::new(Vec::new());
    let mut l = Loader::default();
    l.load_with(&parse_list(list), 4, |m, _| {
        events.lock().unwrap().push((m.name.clone(), true));
        if m.name == "libata" {
            libata_started.open();
        } else if m.name == "hv_storvsc" {
            *saw_libata.lock().unwrap() = libata_started.wait();
        }
        events.lock().unwrap().push((m.name.clone(), false));
        Ok(())
    });
    assert!(*saw_libata.lock().unwrap(), "libata waited for the lane");
    let ev = events.into_inner().unwrap();
    assert!(ended_before(&ev, "hv_storvsc", "ata_piix"), "{ev:?}");
    assert_eq!(l.loaded, 3);
}

#[test]
fn lanes_follow_the_kernel_tree() {
    let lane_of = |p: &str| lane(Path::new(p));
    assert_eq!(
        lane_of("/lib/modules/6.1/kernel/drivers/net/hyperv/hv_netvsc.ko"),
        Some(Lane::Net)
    );
    assert_eq!(
        lane_of("/lib/modules/6.1/kernel/drivers/scsi/hv_storvsc.ko"),
        Some(Lane::Scsi)
    );
    assert_eq!(
        lane_of("/lib/modules/6.1/kernel/drivers/ata/ata_piix.ko"),
        Some(Lane::Scsi)
    );
    assert_eq!(
        lane_of("/lib/modules/6.1/kernel/drivers/block/virtio_blk.ko"),
        Some(Lane::Block)
    );
    assert_eq!(
        lane_of("/lib/modules/6.1/kernel/drivers/nvme/host/nvme.ko"),
        Some(Lane::Nvme)
    );
    assert_eq!(
        lane_of("/lib/modules/6.1/kernel/drivers/hv/hv_vmbus.ko"),
        None
    );
    assert_eq!(lane_of("/lib/modules/6.1/kernel/fs/udf/udf.ko"), None);
}

#[test]
fn parameters_reach_the_module_they_name() {
    let mut l = Loader::new(
        Vec::new(),
        vec![
            ("a".into(), "x=1".into()),
            ("b".into(), "y".into()),
            ("a".into(), "z=\"p q\"".into()),
        ],
    );
    let seen = Mutex::new(Vec::new());
    l.load_with(&parse_list("/l/a.ko:\n/l/b.ko:\n/l/c.ko:\n"), 1, |m, p| {
        seen.lock().unwrap().push(format!("{}:{p}", m.name));
        Ok(())
    });
    assert_eq!(*seen.lock().unwrap(), ["a:x=1 z=\"p q\"", "b:y", "c:"]);
}

#[test]
fn scan_sync_remembers_what_it_replaced() {
    let d = std::env::temp_dir().join(format!("azprov-scan-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("scan");
    std::fs::write(&p, "async\n").unwrap();
    assert_eq!(scan_sync(&p).as_deref(), Some("async"));
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "sync");
    // already sync: nothing to put back
    assert_eq!(scan_sync(&p), None);
    assert_eq!(scan_sync(&d.join("absent")), None);
    std::fs::remove_dir_all(&d).unwrap();
}
