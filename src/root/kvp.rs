//! The KVP pool files in the root (`/var/lib/hyperv/.kvp_pool_N`), written in place as the
//! peers write them: hv_kvp_daemon holds an fcntl write lock while it reads or rewrites a
//! pool, cloud-init and azure-init take flock; the two kinds do not see each other, so both
//! are taken. After the handover the image's hv_kvp_daemon serves what is here.

use super::{io_err, Sysroot, WriteError};
use crate::azure::kvp::{self, Record};
use crate::deadline::{Backoff, Deadline};
use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How long a lock another writer holds is waited for: the peers hold theirs for one write.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// What a pool file is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The guest pool: records from before this boot are dropped (the peers' rule).
    ThisBoot,
    /// The host's pools: kept across boots, as the daemon keeps them.
    Any,
}

/// This boot's clock: now, and how long the machine has been up.
#[derive(Debug, Clone, Copy)]
pub struct BootClock {
    pub now: SystemTime,
    pub uptime: Duration,
}

impl BootClock {
    pub fn read() -> BootClock {
        let uptime = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map(Duration::from)
            .unwrap_or_default();
        BootClock {
            now: SystemTime::now(),
            uptime,
        }
    }
}

impl Sysroot {
    /// Pool `n`'s records (none when it is missing, unreadable or, under
    /// [`Freshness::ThisBoot`], older than this boot).
    pub fn read_kvp(&self, n: u8, fresh: Freshness, clock: BootClock) -> Vec<Record> {
        let Ok(p) = self.resolve(&kvp::pool_file(n)) else {
            return Vec::new();
        };
        let Ok(mut file) = open_pool(&p, false) else {
            return Vec::new();
        };
        let Ok(md) = file.metadata() else {
            return Vec::new();
        };
        if !md.is_file() {
            log::warn!("kvp: {} is not a regular file; not read", p.display());
            return Vec::new();
        }
        if fresh == Freshness::ThisBoot && stale(&md, clock) {
            return Vec::new();
        }
        read_pool(&mut file)
            .map(|b| kvp::parse_pool(&b))
            .unwrap_or_default()
    }

    /// Rewrites pool `n` in place under both locks, with `update` applied to its records;
    /// fsynced before it returns. The records as written.
    pub fn update_kvp(
        &self,
        n: u8,
        fresh: Freshness,
        clock: BootClock,
        update: impl FnOnce(&mut Vec<Record>),
    ) -> Result<Vec<Record>, WriteError> {
        let dir = self.mkdir(kvp::POOL_DIR, 0o755, (0, 0))?;
        let path = self.resolve(&kvp::pool_file(n))?;
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(WriteError::Symlink(kvp::pool_file(n)));
        }
        let created = !path.exists();
        let file = open_pool(&path, true).map_err(io_err("open", &path))?;
        // a FIFO would block the run, a device would be read without end
        let md = file.metadata().map_err(io_err("stat", &path))?;
        if !md.is_file() {
            return Err(WriteError::Corrupt(format!(
                "{} is not a regular file; not written",
                kvp::pool_file(n)
            )));
        }
        if created {
            self.owners().set(&path, Some(&file), (0, 0))?;
            self.label(&path, libc::S_IFREG)?;
        }
        let mut file = lock(file, &path, &kvp::pool_file(n))?;
        let md = file.metadata().map_err(io_err("stat", &path))?;
        let mut bytes = Vec::new();
        if !(fresh == Freshness::ThisBoot && stale(&md, clock)) {
            bytes = read_pool(&mut file).map_err(io_err("read", &path))?;
        }
        let mut records = kvp::parse_pool(&bytes);
        update(&mut records);
        let out = kvp::emit_pool(&records);
        file.rewind().map_err(io_err("seek", &path))?;
        file.write_all(&out).map_err(io_err("write", &path))?;
        file.set_len(out.len() as u64)
            .map_err(io_err("truncate", &path))?;
        file.sync_all().map_err(io_err("fsync", &path))?;
        if created {
            super::atomic::sync_dir(&dir)?;
        }
        Ok(records)
    }
}

/// The most of a pool file read: hv_kvp_daemon's pools hold a few records; this is 1,024.
const POOL_MAX: u64 = 1024 * kvp::RECORD_SIZE as u64;

/// A pool file opened without following a last symlink and without blocking (a FIFO there
/// would block the open for ever); `write` creates it 0644.
fn open_pool(path: &Path, write: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .create(write)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// At most [`POOL_MAX`] bytes of a pool file.
fn read_pool(file: &mut File) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(POOL_MAX).read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn stale(md: &std::fs::Metadata, clock: BootClock) -> bool {
    md.modified()
        .is_ok_and(|m| kvp::is_stale(m, clock.now, clock.uptime))
}

/// flock, then an fcntl write lock on the whole file; each tried without blocking until
/// [`LOCK_WAIT`] has passed.
fn lock(file: File, path: &Path, name: &str) -> Result<Flock<File>, WriteError> {
    let deadline = Deadline::after(LOCK_WAIT);
    let backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
    let mut file = file;
    let mut attempt = 0;
    let locked = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if !deadline.expired() => {
                file = f;
                deadline.sleep(backoff.delay(attempt, crate::deadline::jitter()));
                attempt += 1;
            }
            Err((_, e)) => return Err(io_err("flock", path)(e.into())),
        }
    };
    super::fcntl_lock(&*locked, name, deadline)?;
    Ok(locked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::kvp::REPORT_KEY;

    fn clock() -> BootClock {
        BootClock {
            now: SystemTime::now(),
            uptime: Duration::from_secs(60),
        }
    }

    fn pool(root: &Path) -> std::path::PathBuf {
        root.join("var/lib/hyperv/.kvp_pool_1")
    }

    /// A FIFO (whose open would block for ever) or a character device (read without end) at a
    /// pool's path: neither read nor written, at once.
    #[test]
    fn a_fifo_or_a_device_at_a_pool_path_is_refused_at_once() {
        use nix::sys::stat::{mknod, Mode, SFlag};
        let t = tempfile();
        let root = Sysroot::with_owners(&t, super::super::Owners::recording());
        std::fs::create_dir_all(pool(&t).parent().unwrap()).unwrap();
        nix::unistd::mkfifo(&pool(&t), Mode::from_bits_truncate(0o644)).unwrap();
        let start = std::time::Instant::now();
        assert_eq!(root.read_kvp(1, Freshness::Any, clock()), Vec::new());
        let err = root
            .update_kvp(1, Freshness::Any, clock(), |r| r.clear())
            .unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        std::fs::remove_file(pool(&t)).unwrap();
        // /dev/zero's numbers (root only: CI runs as root)
        let zero = nix::sys::stat::makedev(1, 5);
        if mknod(
            &pool(&t),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o644),
            zero,
        )
        .is_ok()
        {
            assert_eq!(root.read_kvp(1, Freshness::Any, clock()), Vec::new());
            assert!(root
                .update_kvp(1, Freshness::Any, clock(), |r| r.clear())
                .is_err());
        } else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "mknod needs root"
            );
        }
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn the_report_is_one_record_in_a_0644_file_of_a_0755_dir() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile();
        let root = Sysroot::with_owners(&t, super::super::Owners::recording());
        let put = |v: &str| {
            let v = v.to_string();
            root.update_kvp(1, Freshness::ThisBoot, clock(), move |r| {
                kvp::upsert(r, Record::new(REPORT_KEY, &v))
            })
            .unwrap()
        };
        put("result=error|first");
        let written = put("result=success|second");
        assert_eq!(
            written,
            vec![Record::new(REPORT_KEY, "result=success|second")]
        );
        let bytes = std::fs::read(pool(&t)).unwrap();
        assert_eq!(bytes.len(), 2560);
        assert_eq!(kvp::parse_pool(&bytes), written);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&pool(&t)), 0o644);
        assert_eq!(mode(&t.join("var/lib/hyperv")), 0o755);
        assert_eq!(root.owners().owner_of(&pool(&t)), Some((0, 0)));
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn a_pool_from_an_earlier_boot_is_dropped_one_from_this_boot_kept() {
        let t = tempfile();
        let root = Sysroot::with_owners(&t, super::super::Owners::recording());
        std::fs::create_dir_all(t.join("var/lib/hyperv")).unwrap();
        let old = kvp::emit_pool(&[Record::new("CLOUD_INIT|old", "{}")]);
        std::fs::write(pool(&t), &old).unwrap();
        // written two minutes ago, the machine up for one: an earlier boot's
        let f = File::options().write(true).open(pool(&t)).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(120))
            .unwrap();
        let report = |r: &mut Vec<Record>| kvp::upsert(r, Record::new(REPORT_KEY, "x"));
        let w = root
            .update_kvp(1, Freshness::ThisBoot, clock(), report)
            .unwrap();
        assert_eq!(w, vec![Record::new(REPORT_KEY, "x")]);
        // now it is this boot's: another writer's record and ours stay
        let mut both = kvp::parse_pool(&std::fs::read(pool(&t)).unwrap());
        both.insert(0, Record::new("azure-init|e", "Time: t"));
        std::fs::write(pool(&t), kvp::emit_pool(&both)).unwrap();
        let w = root
            .update_kvp(1, Freshness::ThisBoot, clock(), report)
            .unwrap();
        assert_eq!(w, both);
        assert_eq!(root.read_kvp(1, Freshness::ThisBoot, clock()), both);
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn both_locks_are_taken_and_a_held_one_is_waited_for() {
        let t = tempfile();
        let root = Sysroot::with_owners(&t, super::super::Owners::recording());
        root.update_kvp(1, Freshness::ThisBoot, clock(), |_| {})
            .unwrap();
        // a peer holding flock: the write waits for it, then goes through
        let held = Flock::lock(File::open(pool(&t)).unwrap(), FlockArg::LockExclusive).unwrap();
        let t0 = std::time::Instant::now();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        root.update_kvp(1, Freshness::ThisBoot, clock(), |r| {
            kvp::upsert(r, Record::new(REPORT_KEY, "after"))
        })
        .unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(300));
        release.join().unwrap();
        // while the write runs, a peer's flock and its fcntl lock (from another process:
        // POSIX locks never conflict within one) are both refused
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let p = pool(&t);
        let peer = std::thread::spawn(move || {
            rx.recv().unwrap();
            // first: closing any descriptor of the file drops this process's fcntl locks
            let fcntl_free = fcntl_lock_free(&p);
            let f = File::options().read(true).write(true).open(&p).unwrap();
            let flock_refused = Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err();
            go.send(()).unwrap();
            (flock_refused, fcntl_free)
        });
        root.update_kvp(1, Freshness::ThisBoot, clock(), |_| {
            tx.send(()).unwrap();
            wait.recv().unwrap();
        })
        .unwrap();
        assert_eq!(peer.join().unwrap(), (true, false));
        assert!(
            fcntl_lock_free(&pool(&t)),
            "the fcntl lock outlived the write"
        );
        std::fs::remove_dir_all(&t).unwrap();
    }

    /// Whether another process gets an fcntl write lock on `p` at once (Python's lockf is
    /// F_SETLK, hv_kvp_daemon's kind of lock).
    fn fcntl_lock_free(p: &Path) -> bool {
        std::process::Command::new("python3")
            .args([
                "-c",
                "import fcntl, sys; fcntl.lockf(open(sys.argv[1], 'r+'), fcntl.LOCK_EX | fcntl.LOCK_NB)",
            ])
            .arg(p)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    fn tempfile() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "azprov-kvp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
