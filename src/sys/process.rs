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

/// Lowest CPU priority (nice 19) for the calling thread and the threads it starts: on a
/// one-vCPU VM the RSA search must not take CPU time from the stages before Ready. Linux keeps
/// the nice value per thread; setpriority with the thread id sets this one's.
pub fn background_priority() {
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: plain syscall on the calling thread's own id; the result is checked.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) } != 0 {
        log::debug!("setpriority: {}", Errno::last());
    }
}
