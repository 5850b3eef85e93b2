//! PID 1 duties: reaping children, powering off or rebooting.

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

/// Back to the normal policy and nice 0 for the calling thread: what it does is now awaited
/// (the host keys once the run joins their thread), and other work must not starve it.
pub fn normal_priority() {
    set_policy(libc::SCHED_OTHER);
    set_nice(0);
}

/// sched_setscheduler(2) for the calling thread, priority 0; false when refused.
fn set_policy(policy: libc::c_int) -> bool {
    // SAFETY: sched_param is plain integers (musl adds timespecs), so all zeroes is a valid
    // value: priority 0, which SCHED_IDLE and SCHED_OTHER require.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // The raw system call: musl's sched_setscheduler() returns ENOSYS by design (POSIX makes
    // the policy process-wide, Linux keeps it per thread).
    // SAFETY: plain syscall on the calling thread (pid 0) with a valid sched_param that
    // outlives it; the result is checked.
    let set = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            policy,
            &param as *const libc::sched_param,
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
}
