//! PID 1 duties: reaping children, powering off or rebooting.
#![allow(unsafe_code)]

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

/// Reaps every exited child without blocking; returns how many.
pub fn reap() -> usize {
    let mut n = 0;
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
        n += 1;
    }
    n
}

#[derive(Debug, Clone, Copy)]
pub enum Power {
    Reboot,
    PowerOff,
}

/// Syncs and reboots or powers off. Returns only on failure.
pub fn power(how: Power) -> Errno {
    use nix::sys::reboot::{reboot, RebootMode};
    nix::unistd::sync();
    let mode = match how {
        Power::Reboot => RebootMode::RB_AUTOBOOT,
        Power::PowerOff => RebootMode::RB_POWER_OFF,
    };
    match reboot(mode) {
        Err(e) => e,
        Ok(never) => match never {},
    }
}

pub fn getpid() -> u32 {
    std::process::id()
}

/// Idle CPU only (SCHED_IDLE) for the calling thread and the threads it starts: on a one-vCPU
/// VM the RSA search must not take CPU time from the stages before Ready, which it now runs
/// beside from PID 1's start. SCHED_IDLE weighs 3 against a nice-0 thread's 1024 (nice 19
/// weighs 15) and a woken normal thread preempts it. Linux keeps the policy per thread and new
/// threads inherit it. Where the policy is refused, nice 19.
pub fn background_priority() {
    if set_policy(libc::SCHED_IDLE) {
        return;
    }
    set_nice(19);
}

/// The session of process `pid` weighed as nice 19 (weight 15) beside other sessions. Where
/// the kernel's autogroups are on (CONFIG_SCHED_AUTOGROUP and kernel.sched_autogroup_enabled)
/// the scheduler first shares the CPU between sessions, each weighed as one nice-0 thread
/// whatever its threads' policy and nice, then within each: a process of a session of its
/// own would take as much CPU as any busy session however low its own priority. Only for a
/// process that leads a session of its own (all of the session is lowered). Nothing to do
/// where the kernel has no autogroups.
pub fn lowest_autogroup(pid: u32) {
    let path = format!("/proc/{pid}/autogroup");
    if let Err(e) = std::fs::write(&path, "19") {
        log::debug!("{path}: {e}");
    }
}

/// Starts `program` as a process of its own session with `argv0`, `args`, stdin and stdout
/// on /dev/null, stderr on `stderr`, and each `(file, n)` of `fds` as its descriptor `n`
/// (n >= 3). Nothing waits for it: it outlives this process (and PID 1's exec of the real
/// init). Its pid.
pub fn spawn_detached(
    program: &std::path::Path,
    argv0: &str,
    args: &[String],
    stderr: std::fs::File,
    fds: &[(&std::fs::File, i32)],
) -> std::io::Result<u32> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    // each source first to a descriptor above any target (and close-on-exec), so that the
    // child's dup2 never finds its source already overwritten by an earlier one, and never
    // dups a descriptor onto itself (which would leave FD_CLOEXEC set)
    const ABOVE: i32 = 100;
    let mut held = Vec::new();
    for (f, n) in fds {
        let high = nix::fcntl::fcntl(*f, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(ABOVE))
            .map_err(std::io::Error::from)?;
        // SAFETY: fcntl just made this descriptor, which nothing else owns.
        held.push((unsafe { OwnedFd::from_raw_fd(high) }, *n));
    }
    let pairs: Vec<(i32, i32)> = held.iter().map(|(f, n)| (f.as_raw_fd(), *n)).collect();
    let top = pairs.iter().map(|&(_, to)| to).max().unwrap_or(2);
    let mut cmd = std::process::Command::new(program);
    cmd.arg0(argv0)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    // SAFETY: the closure runs in the child between fork and exec and calls only setsid,
    // dup2, fcntl, close_range and getrlimit, which are async-signal-safe system calls, on
    // descriptors of its own; it allocates nothing. dup2 leaves the new descriptor without
    // FD_CLOEXEC, so it survives the exec; every other descriptor the caller left open (a
    // framework shell's pipes) is marked close-on-exec, so the helper holds none of them
    // (closing them outright would close std's own pipe that reports a failed exec).
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            for &(from, to) in &pairs {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for fd in 3..=top {
                if !pairs.iter().any(|&(_, to)| to == fd) {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            let first = (top + 1) as libc::c_uint;
            let flags = libc::CLOSE_RANGE_CLOEXEC;
            if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, flags) < 0 {
                // before Linux 5.11: one by one, up to the descriptor limit
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                let last = limit.rlim_cur.clamp(1024, 65536) as i32;
                for fd in top + 1..last {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map(|c| c.id());
    drop(held);
    child
}

/// Descriptor `n` as handed down by the process that started this one ([`spawn_detached`]),
/// when it is open; taken over (closed when the File drops). Call once per descriptor.
pub fn inherited(n: i32) -> Option<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl(F_GETFD) only asks whether the descriptor is open.
    if unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor is open and was handed to this process for this use only; the
    // caller takes it once, so nothing else owns it.
    Some(unsafe { std::fs::File::from_raw_fd(n) })
}

/// SIGHUP to `pid` (a daemon's reload: sshd re-executes and reads its host keys again).
pub fn hangup(pid: i32) -> Result<(), Errno> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
}

/// Back to the normal policy and nice 0 for the calling thread: what it does is now awaited
/// (the host keys once the run joins their thread), and other work must not starve it.
pub fn normal_priority() {
    set_policy(libc::SCHED_OTHER);
    set_nice(0);
}

/// sched_setscheduler(2) for the calling thread, priority 0; false when refused.
fn set_policy(policy: libc::c_int) -> bool {
    /// The kernel's struct sched_param (include/uapi/linux/sched/types.h): one int. musl's
    /// libc::sched_param adds fields the system call never reads.
    #[repr(C)]
    struct SchedParam {
        sched_priority: libc::c_int,
    }
    // priority 0, which SCHED_IDLE and SCHED_OTHER require
    let param = SchedParam { sched_priority: 0 };
    // The raw system call: musl's sched_setscheduler() returns ENOSYS by design (POSIX makes
    // the policy process-wide, Linux keeps it per thread).
    // SAFETY: plain syscall on the calling thread (pid 0) with the kernel's sched_param, which
    // outlives it; the result is checked.
    let set = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            policy,
            &param as *const SchedParam,
        )
    };
    if set != 0 {
        log::debug!("sched_setscheduler {policy}: {}", Errno::last());
    }
    set == 0
}

/// The calling thread's nice value (Linux keeps it per thread: setpriority with its id).
fn set_nice(nice: libc::c_int) {
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: plain syscall on the calling thread's own id; the result is checked.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } != 0 {
        log::debug!("setpriority {nice}: {}", Errno::last());
    }
}

/// The calling thread's scheduling policy: field 41 of /proc/thread-self/stat.
#[cfg(test)]
pub fn policy() -> u32 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after_comm = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 2..))
        .unwrap_or("");
    after_comm
        .split(' ')
        .nth(38)
        .and_then(|p| p.parse().ok())
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::policy;

    #[test]
    fn a_detached_process_holds_only_the_descriptors_it_is_handed() {
        use std::os::fd::AsRawFd;
        // what a framework shell leaves open: a pipe without close-on-exec, low and high
        let (read, write) = nix::unistd::pipe().unwrap();
        let high = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_DUPFD(200)).unwrap();
        let handed = std::fs::File::open("/").unwrap();
        let pid = super::spawn_detached(
            std::path::Path::new("/bin/sleep"),
            "sleep",
            &["30".into()],
            std::fs::File::create("/dev/null").unwrap(),
            &[(&handed, 3)],
        )
        .unwrap();
        // once it has exec'd, its descriptors are the ones it keeps
        let exec_done =
            || std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep"));
        let t = std::time::Instant::now();
        while !exec_done() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut held: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        held.sort_unstable();
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        assert_eq!(
            held,
            [0, 1, 2, 3],
            "the pipe at {} and {high} is not held",
            write.as_raw_fd()
        );
        drop(read);
        nix::unistd::close(high).unwrap();
    }

    #[test]
    #[cfg_attr(
        azprov_unprivileged,
        ignore = "needs root to leave SCHED_IDLE (runs as root and under CI=true)"
    )]
    fn background_threads_get_idle_cpu_only() {
        let (own, inherited, back) = std::thread::spawn(|| {
            assert_eq!(policy(), libc::SCHED_OTHER as u32);
            super::background_priority();
            let own = policy();
            let inherited = std::thread::spawn(policy).join().unwrap();
            super::normal_priority();
            (own, inherited, policy())
        })
        .join()
        .unwrap();
        assert_eq!(own, libc::SCHED_IDLE as u32);
        assert_eq!(inherited, libc::SCHED_IDLE as u32, "a thread it starts");
        assert_eq!(back, libc::SCHED_OTHER as u32, "normal_priority");
        assert_eq!(
            policy(),
            libc::SCHED_OTHER as u32,
            "the other threads keep theirs"
        );
    }

    #[test]
    fn a_session_of_its_own_is_weighed_as_nice_19() {
        if !std::path::Path::new("/proc/self/autogroup").exists() {
            // a kernel without autogroups: nothing to weigh
            return;
        }
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("10");
        // SAFETY: setsid is async-signal-safe and touches no memory of this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        super::lowest_autogroup(child.id());
        let theirs = std::fs::read_to_string(format!("/proc/{}/autogroup", child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        let theirs = theirs.unwrap();
        assert!(theirs.trim_end().ends_with("nice 19"), "{theirs}");
        let ours = std::fs::read_to_string("/proc/self/autogroup").unwrap();
        assert!(
            !ours.trim_end().ends_with("nice 19"),
            "this session's too: {ours}"
        );
    }
}
