//! The KVP responder: while the run lasts, azprov is the guest's KVP daemon. The host reads the
//! guest pool when the health report arrives, and in the initramfs nothing else serves it: the
//! kernel answers the host nothing until a daemon has registered on `/dev/vmbus/hv_kvp`. The
//! answers are `hv_kvp_daemon`'s (tools/hv/hv_kvp_daemon.c), so the host sees one behaviour
//! before the handover and after it; the device is closed before the handover so that the
//! booted system's daemon can open it (the device takes one opener at a time).

use super::{Record, KEY_SIZE, POOL_AUTO, POOL_COUNT, POOL_GUEST, VALUE_SIZE};
use crate::deadline::{Backoff, Deadline};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The device the hv_utils module makes when the host offers the KVP channel.
pub const DEVICE: &str = "/dev/vmbus/hv_kvp";
/// `sizeof(struct hv_kvp_msg)`: every read and write on the device is one whole message.
pub const MSG_SIZE: usize = 7432;
/// `HV_S_OK`, `HV_E_FAIL`, `HV_S_CONT` (uapi linux/hyperv.h).
pub const HV_S_OK: u32 = 0;
pub const HV_E_FAIL: u32 = 0x8000_4005;
pub const HV_S_CONT: u32 = 0x8007_0103;
/// How often the serving thread looks at its stop flag while the host is silent.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Reopens in a row without a message in between before the responder gives up.
const MAX_REOPENS: u32 = 5;

/// The operations of `struct hv_kvp_hdr` (`enum hv_kvp_exchg_op`, REGISTER1 from hv_kvp.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Get,
    Set,
    Delete,
    Enumerate,
    GetIpInfo,
    SetIpInfo,
    Register1,
    Unknown(u8),
}

impl Op {
    pub fn from_byte(b: u8) -> Op {
        match b {
            0 => Op::Get,
            1 => Op::Set,
            2 => Op::Delete,
            3 => Op::Enumerate,
            4 => Op::GetIpInfo,
            5 => Op::SetIpInfo,
            100 => Op::Register1,
            b => Op::Unknown(b),
        }
    }
}

/// Every pool's records, as the daemon keeps them in memory.
pub type Pools = [Vec<Record>; POOL_COUNT];

/// Byte offsets in `struct hv_kvp_msg` (packed, little-endian).
mod field {
    use std::ops::Range;
    pub const OP: usize = 0;
    pub const POOL: usize = 1;
    /// A reply's status overlays the header.
    pub const ERROR: Range<usize> = 0..4;
    pub const ENUM_INDEX: Range<usize> = 4..8;
    pub const ENUM_KEY: usize = 20;
    pub const ENUM_VALUE: usize = 532;
    pub const SET_KEY_SIZE: Range<usize> = 8..12;
    pub const SET_VALUE_SIZE: Range<usize> = 12..16;
    pub const SET_KEY: usize = 16;
    pub const SET_VALUE: usize = 528;
    pub const DELETE_KEY_SIZE: Range<usize> = 4..8;
    pub const DELETE_KEY: usize = 8;
}

fn u32_at(msg: &[u8], r: std::ops::Range<usize>) -> u32 {
    msg.get(r)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// The C string of at most `size` bytes at `at` (the kernel's sizes count the NUL).
fn cstr_at(msg: &[u8], at: usize, size: usize) -> Vec<u8> {
    let b = msg.get(at..at.saturating_add(size)).unwrap_or_default();
    b.split(|&c| c == 0).next().unwrap_or_default().to_vec()
}

/// Writes `s` NUL-padded into the `len` bytes at `at`.
fn put_cstr(msg: &mut [u8], at: usize, len: usize, s: &[u8]) {
    if let Some(dst) = msg.get_mut(at..at + len) {
        dst.fill(0);
        super::copy_cstr(dst, s);
    }
}

/// What one message from the kernel was, for the sweep's tracking and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    pub op: Op,
    pub pool: u8,
    /// ENUMERATE's index.
    pub index: Option<u32>,
    /// None: no reply (the kernel's REGISTER1 during the handshake).
    pub status: Option<u32>,
    /// A SET or DELETE changed a pool.
    pub changed: bool,
}

/// Answers one message in place as `hv_kvp_daemon` does: the reply is the message with its
/// status over the header. `handshake` is true until the kernel's REGISTER1 arrived.
pub fn answer(pools: &mut Pools, msg: &mut [u8], handshake: bool) -> Handled {
    let op = Op::from_byte(msg.get(field::OP).copied().unwrap_or(0));
    let pool = msg.get(field::POOL).copied().unwrap_or(0);
    let mut handled = Handled {
        op,
        pool,
        index: None,
        status: Some(HV_S_OK),
        changed: false,
    };
    if handshake && op == Op::Register1 {
        handled.status = None;
        return handled;
    }
    let records = pools.get_mut(usize::from(pool));
    let status = match (op, records) {
        (Op::Enumerate, _) if pool == POOL_AUTO => HV_S_CONT,
        (Op::Enumerate, Some(records)) => {
            let index = u32_at(msg, field::ENUM_INDEX);
            handled.index = Some(index);
            match records.get(index as usize) {
                Some(r) => {
                    let (key, value) = (r.key.clone(), r.value.clone());
                    put_cstr(msg, field::ENUM_KEY, KEY_SIZE, &key);
                    put_cstr(msg, field::ENUM_VALUE, VALUE_SIZE, &value);
                    HV_S_OK
                }
                None => HV_S_CONT,
            }
        }
        (Op::Set, Some(records)) => {
            let key_size = u32_at(msg, field::SET_KEY_SIZE) as usize;
            let value_size = u32_at(msg, field::SET_VALUE_SIZE) as usize;
            if key_size > KEY_SIZE || value_size > VALUE_SIZE {
                HV_S_CONT
            } else {
                let key = cstr_at(msg, field::SET_KEY, key_size);
                let value = cstr_at(msg, field::SET_VALUE, value_size);
                match records.iter_mut().find(|r| r.key == key) {
                    Some(r) => r.value = value,
                    None => records.push(Record { key, value }),
                }
                handled.changed = true;
                HV_S_OK
            }
        }
        (Op::Get, Some(records)) => {
            let key_size = u32_at(msg, field::SET_KEY_SIZE) as usize;
            let key = cstr_at(msg, field::SET_KEY, key_size.min(KEY_SIZE));
            match records
                .iter()
                .find(|r| r.key == key)
                .map(|r| r.value.clone())
            {
                Some(value) => {
                    put_cstr(msg, field::SET_VALUE, VALUE_SIZE, &value);
                    HV_S_OK
                }
                None => HV_S_CONT,
            }
        }
        (Op::Delete, Some(records)) => {
            let key_size = u32_at(msg, field::DELETE_KEY_SIZE) as usize;
            let key = cstr_at(msg, field::DELETE_KEY, key_size.min(KEY_SIZE));
            match records.iter().position(|r| r.key == key) {
                Some(i) => {
                    records.remove(i);
                    handled.changed = true;
                    HV_S_OK
                }
                None => HV_S_CONT,
            }
        }
        // the lease is azprov's and goes before the handover: no address to give or set
        (Op::GetIpInfo | Op::SetIpInfo, _) => HV_E_FAIL,
        (Op::Enumerate | Op::Set | Op::Get | Op::Delete, None) => HV_S_CONT,
        (Op::Register1 | Op::Unknown(_), _) => HV_S_OK,
    };
    if let Some(e) = msg.get_mut(field::ERROR) {
        e.copy_from_slice(&status.to_le_bytes());
    }
    handled.status = Some(status);
    handled
}

/// The REGISTER1 message a daemon opens the conversation with.
pub fn register_message() -> Vec<u8> {
    let mut m = vec![0u8; MSG_SIZE];
    if let Some(op) = m.get_mut(field::OP) {
        *op = 100;
    }
    m
}

/// Where the host's sweep of the guest pool stands relative to the report. The host reads the
/// pool when the health report arrives, which may be before the POST's answer comes back: a
/// sweep that begins once the report is published counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// No report published yet: a sweep now reads something else.
    Unpublished,
    /// Published at this instant; `posted` once the health POST went out (or failed).
    Published {
        at: Instant,
        posted: bool,
    },
    Running {
        at: Instant,
        posted: bool,
    },
    /// A sweep begun after the report was published reached its end this long after it was.
    Done(Duration),
}

impl Sweep {
    /// Whether `finish` waits: a report posted whose sweep has not ended.
    fn awaited(self) -> bool {
        matches!(
            self,
            Sweep::Published { posted: true, .. } | Sweep::Running { .. }
        )
    }
}

struct State {
    pools: Pools,
    sweep: Sweep,
    requests: u32,
    /// Pools the host changed, to be kept for the booted system's daemon.
    changed: [bool; POOL_COUNT],
}

struct Shared {
    state: Mutex<State>,
    swept: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Opens the device anew: the real one, or a test's stand-in.
pub type Opener = Box<dyn FnMut() -> io::Result<File> + Send>;

/// A registered responder serving from a thread of its own until [`Responder::finish`] (or
/// its drop) closes the device.
pub struct Responder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the host left in the pools it writes, once the responder is done.
#[derive(Debug, Default)]
pub struct Finished {
    /// (pool, its records) for each pool a SET or DELETE changed.
    pub changed: Vec<(u8, Vec<Record>)>,
    pub requests: u32,
}

impl Responder {
    /// Opens and registers on `path`, serving `pools`. None, with one line, when there is no
    /// KVP device (not Hyper-V, or hv_utils not loaded) or another daemon holds it.
    pub fn open(path: &std::path::Path, pools: Pools) -> Option<Responder> {
        let p = path.to_path_buf();
        let open = move || std::fs::OpenOptions::new().read(true).write(true).open(&p);
        match Responder::start(Box::new(open), pools) {
            Ok(r) => {
                log::info!("kvp: serving {} until the handover", path.display());
                Some(r)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                log::debug!("kvp: no {}; the pool file only", path.display());
                None
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                log::info!(
                    "kvp: {} is held by another daemon; the pool file only",
                    path.display()
                );
                None
            }
            Err(e) => {
                log::warn!("kvp: {}: {e}; the pool file only", path.display());
                None
            }
        }
    }

    /// Opens with `open`, registers and starts serving.
    pub fn start(mut open: Opener, pools: Pools) -> io::Result<Responder> {
        let device = register(&mut open)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                pools,
                sweep: Sweep::Unpublished,
                requests: 0,
                changed: [false; POOL_COUNT],
            }),
            swept: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kvp".into())
            .spawn(move || serve(&s, device, open))?;
        Ok(Responder {
            shared,
            thread: Some(thread),
        })
    }

    /// The guest pool as it is now on disk: what the host is answered from here on.
    pub fn publish(&self, guest: Vec<Record>) {
        let mut st = self.shared.lock();
        if let Some(p) = st.pools.get_mut(usize::from(POOL_GUEST)) {
            *p = guest;
        }
        st.sweep = Sweep::Published {
            at: Instant::now(),
            posted: false,
        };
    }

    /// The health report is out (or failed): `finish` waits for the host's sweep, which may
    /// have begun while the POST was in flight.
    pub fn posted(&self) {
        let mut st = self.shared.lock();
        st.sweep = match st.sweep {
            Sweep::Unpublished => Sweep::Published {
                at: Instant::now(),
                posted: true,
            },
            Sweep::Published { at, .. } => Sweep::Published { at, posted: true },
            Sweep::Running { at, .. } => Sweep::Running { at, posted: true },
            done @ Sweep::Done(_) => done,
        };
    }

    /// Serves until a sweep of the guest pool begun after the report has ended, or `deadline`;
    /// then closes the device. A report never posted waits for nothing.
    pub fn finish(mut self, deadline: Deadline) -> Finished {
        let mut st = self.shared.lock();
        while st.sweep.awaited() && !deadline.expired() {
            let wait = deadline.remaining().min(POLL_EVERY);
            st = match self.shared.swept.wait_timeout(st, wait) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        match st.sweep {
            Sweep::Done(after) => log::info!(
                "kvp: the host read the report {} ms after it was published ({} requests)",
                after.as_millis(),
                st.requests
            ),
            Sweep::Published { at, posted: true } | Sweep::Running { at, .. } => log::info!(
                "kvp: the host did not read the guest pool within {} ms of the report ({} requests)",
                at.elapsed().as_millis(),
                st.requests
            ),
            Sweep::Published { posted: false, .. } | Sweep::Unpublished => {}
        }
        let finished = Finished {
            changed: (0u8..)
                .zip(st.pools.iter())
                .filter(|(n, _)| st.changed.get(usize::from(*n)) == Some(&true))
                .map(|(n, p)| (n, p.clone()))
                .collect(),
            requests: st.requests,
        };
        drop(st);
        self.stop();
        finished
    }

    /// Serves on for the life of the process (PID 1 with no root to boot): the thread goes on
    /// with the device, and the drop that follows stops nothing.
    pub fn detach(mut self) {
        self.thread.take();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Responder {
    /// On every way out the device is closed, so that the booted system's daemon can open it;
    /// but for a detached responder, which serves until the machine halts.
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

/// The serving loop: one message in, its answer out; a failed read or write closes the device
/// and opens it again (as hv_kvp_daemon does since Linux 6.5: the device takes one opener, so
/// the old descriptor goes first), at most [`MAX_REOPENS`] times in a row.
fn serve(shared: &Shared, device: File, mut open: Opener) {
    let mut device = Some(device);
    let mut reopens = 0u32;
    let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    while let Some(d) = device.take() {
        let e = match exchange(shared, &d) {
            Exchange::Stopped => return,
            Exchange::Failed { error, served } => {
                if served {
                    reopens = 0;
                }
                error
            }
        };
        drop(d);
        if reopens >= MAX_REOPENS {
            log::warn!("kvp: {e}, {MAX_REOPENS} times in a row; no longer serving");
            return;
        }
        log::debug!("kvp: {e}; opening the device again");
        let pause = backoff.delay(reopens, crate::deadline::jitter());
        Deadline::after(pause).sleep(pause);
        reopens += 1;
        match register(&mut open) {
            Ok(d) => device = Some(d),
            Err(e) => log::warn!("kvp: cannot open the device again: {e}; no longer serving"),
        }
    }
}

/// How serving one opened device ended.
enum Exchange {
    /// The stop flag (or a poll that cannot go on): the device is closed, not reopened.
    Stopped,
    /// A read or write failed; `served`: a message was answered on this device before.
    Failed { error: io::Error, served: bool },
}

/// Answers messages on `device` from its REGISTER1 on, until the stop flag or an error.
fn exchange(shared: &Shared, mut device: &File) -> Exchange {
    let mut buf = vec![0u8; MSG_SIZE];
    let mut handshake = true;
    let mut served = false;
    while !shared.stop.load(Ordering::Relaxed) {
        match readable(device) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                log::warn!("kvp: poll: {e}; no longer serving");
                return Exchange::Stopped;
            }
        }
        let exchanged = match device.read(&mut buf) {
            Ok(MSG_SIZE) => {
                let reply = handle(shared, &mut buf, handshake);
                // the kernel's REGISTER1, the one message with no reply, ends the handshake
                handshake &= reply.is_some();
                match reply {
                    Some(()) => device.write_all(&buf),
                    None => Ok(()),
                }
            }
            Ok(n) => Err(io::Error::other(format!("a read of {n} bytes"))),
            Err(e) => Err(e),
        };
        match exchanged {
            Ok(()) => served = true,
            Err(error) => return Exchange::Failed { error, served },
        }
    }
    Exchange::Stopped
}

/// Opens the device and writes REGISTER1, as a daemon begins.
fn register(open: &mut Opener) -> io::Result<File> {
    let device = open()?;
    (&device).write_all(&register_message())?;
    Ok(device)
}

/// Answers one message under the lock and tracks the sweep; None when no reply is due.
fn handle(shared: &Shared, msg: &mut [u8], handshake: bool) -> Option<()> {
    let mut st = shared.lock();
    let h = answer(&mut st.pools, msg, handshake);
    if h.status.is_some() {
        st.requests = st.requests.saturating_add(1);
    }
    log::debug!(
        "kvp: {:?} pool {}{} -> {}",
        h.op,
        h.pool,
        h.index.map_or(String::new(), |i| format!(" index {i}")),
        h.status.map_or("(handshake)".into(), |s| format!("{s:#x}"))
    );
    if h.changed {
        if let Some(c) = st.changed.get_mut(usize::from(h.pool)) {
            *c = true;
        }
    }
    if h.op == Op::Enumerate && h.pool == POOL_GUEST {
        st.sweep = match (st.sweep, h.index, h.status) {
            (Sweep::Published { at, posted }, Some(0), _) => Sweep::Running { at, posted },
            (Sweep::Running { at, .. }, _, Some(HV_S_CONT)) => Sweep::Done(at.elapsed()),
            (s, _, _) => s,
        };
        if matches!(st.sweep, Sweep::Done(_)) {
            shared.swept.notify_all();
        }
    }
    h.status.map(|_| ())
}

/// Whether a message waits, within [`POLL_EVERY`].
fn readable(device: &File) -> nix::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(device.as_fd(), PollFlags::POLLIN)];
    let ms = POLL_EVERY.as_millis() as u16;
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
