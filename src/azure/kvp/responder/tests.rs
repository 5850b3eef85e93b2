use super::*;
use crate::azure::kvp::{Record, POOL_AUTO_EXTERNAL, POOL_EXTERNAL};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::sync::mpsc;

/// A message from the host through the kernel, as hv_kvp.c fills it in.
fn msg(op: u8, pool: u8) -> Vec<u8> {
    let mut m = vec![0u8; MSG_SIZE];
    m[0] = op;
    m[1] = pool;
    m
}

fn enumerate(pool: u8, index: u32) -> Vec<u8> {
    let mut m = msg(3, pool);
    m[4..8].copy_from_slice(&index.to_le_bytes());
    m
}

/// SET: the kernel's sizes count the NUL.
fn set(pool: u8, key: &str, value: &str) -> Vec<u8> {
    let mut m = msg(1, pool);
    m[8..12].copy_from_slice(&(key.len() as u32 + 1).to_le_bytes());
    m[12..16].copy_from_slice(&(value.len() as u32 + 1).to_le_bytes());
    m[16..16 + key.len()].copy_from_slice(key.as_bytes());
    m[528..528 + value.len()].copy_from_slice(value.as_bytes());
    m
}

fn delete(pool: u8, key: &str) -> Vec<u8> {
    let mut m = msg(2, pool);
    m[4..8].copy_from_slice(&(key.len() as u32 + 1).to_le_bytes());
    m[8..8 + key.len()].copy_from_slice(key.as_bytes());
    m
}

fn status(m: &[u8]) -> u32 {
    u32::from_le_bytes(m[0..4].try_into().unwrap())
}

fn c(b: &[u8]) -> &[u8] {
    b.split(|&x| x == 0).next().unwrap()
}

fn pools_with_report() -> Pools {
    let mut p: Pools = Default::default();
    p[1] = vec![
        Record::new("PROVISIONING_REPORT", "result=success|agent=azprov/0.1.0"),
        Record::new("k2", "v2"),
    ];
    p
}

#[test]
fn enumerate_answers_each_record_then_s_cont() {
    let mut p = pools_with_report();
    let mut m = enumerate(1, 0);
    let h = answer(&mut p, &mut m, false);
    assert_eq!(h.status, Some(HV_S_OK));
    assert_eq!(status(&m), HV_S_OK);
    assert_eq!(c(&m[20..532]), b"PROVISIONING_REPORT");
    assert_eq!(c(&m[532..2580]), b"result=success|agent=azprov/0.1.0");
    let mut m = enumerate(1, 1);
    answer(&mut p, &mut m, false);
    assert_eq!((c(&m[20..532]), c(&m[532..2580])), (&b"k2"[..], &b"v2"[..]));
    let mut m = enumerate(1, 2);
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_CONT));
    assert_eq!(status(&m), HV_S_CONT);
    // the daemon's intrinsics are not azprov's to make up
    let mut m = enumerate(POOL_AUTO, 0);
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_CONT));
    // a pool number past the last one
    let mut m = enumerate(9, 0);
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_CONT));
}

#[test]
fn set_get_and_delete_keep_the_host_pools() {
    let mut p: Pools = Default::default();
    let mut m = set(POOL_AUTO_EXTERNAL, "HostName", "host-1");
    let h = answer(&mut p, &mut m, false);
    assert!(h.changed);
    assert_eq!(status(&m), HV_S_OK);
    let mut m = set(POOL_AUTO_EXTERNAL, "HostName", "host-2");
    answer(&mut p, &mut m, false);
    assert_eq!(p[3], vec![Record::new("HostName", "host-2")]);
    let mut m = msg(0, POOL_AUTO_EXTERNAL);
    m[8..12].copy_from_slice(&9u32.to_le_bytes());
    m[16..24].copy_from_slice(b"HostName");
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_OK));
    assert_eq!(c(&m[528..]), b"host-2");
    let mut m = delete(POOL_AUTO_EXTERNAL, "HostName");
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_OK));
    assert!(p[3].is_empty());
    let mut m = delete(POOL_AUTO_EXTERNAL, "HostName");
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_CONT));
    // sizes past the record's fields are refused, as the daemon refuses them
    let mut m = set(POOL_EXTERNAL, "k", "v");
    m[12..16].copy_from_slice(&4000u32.to_le_bytes());
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_S_CONT));
    let mut m = msg(4, 0);
    assert_eq!(answer(&mut p, &mut m, false).status, Some(HV_E_FAIL));
}

#[test]
fn the_kernels_register1_during_the_handshake_gets_no_reply() {
    let mut p: Pools = Default::default();
    let mut m = msg(100, 0);
    m[4..7].copy_from_slice(b"3.1");
    let before = m.clone();
    assert_eq!(answer(&mut p, &mut m, true).status, None);
    assert_eq!(m, before);
}

/// A connected pair standing for the device: the responder's end and the kernel's.
fn pair() -> (File, File) {
    let (a, b) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    (File::from(a), File::from(b))
}

/// The kernel's side of one exchange: `m` sent, the reply read.
fn ask(kernel: &mut File, m: &[u8]) -> Vec<u8> {
    kernel.write_all(m).unwrap();
    let mut r = vec![0u8; MSG_SIZE + 1];
    let n = kernel.read(&mut r).unwrap();
    assert_eq!(n, MSG_SIZE);
    r.truncate(n);
    r
}

fn registered(kernel: &mut File) {
    let mut r = vec![0u8; MSG_SIZE + 1];
    assert_eq!(kernel.read(&mut r).unwrap(), MSG_SIZE);
    assert_eq!(r[0], 100, "REGISTER1 first");
    let mut echo = msg(100, 0);
    echo[4..7].copy_from_slice(b"3.1");
    kernel.write_all(&echo).unwrap();
}

/// The responder with devices handed out from a channel: each open takes the next.
fn responder(pools: Pools) -> (Responder, mpsc::Sender<File>, File) {
    let (tx, rx) = mpsc::channel::<File>();
    let (dev, kernel) = pair();
    tx.send(dev).unwrap();
    let open: Opener = Box::new(move || {
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| io::Error::from(io::ErrorKind::NotFound))
    });
    (Responder::start(open, pools).unwrap(), tx, kernel)
}

#[test]
fn a_sweep_after_the_post_ends_the_wait_and_host_sets_are_kept() {
    let (r, _tx, mut kernel) = responder(Pools::default());
    registered(&mut kernel);
    // before the report: the guest pool is empty
    assert_eq!(status(&ask(&mut kernel, &enumerate(1, 0))), HV_S_CONT);
    r.publish(pools_with_report()[1].clone());
    assert_eq!(status(&ask(&mut kernel, &set(3, "HostName", "h"))), HV_S_OK);
    r.posted();
    let a = ask(&mut kernel, &enumerate(1, 0));
    assert_eq!(c(&a[20..532]), b"PROVISIONING_REPORT");
    ask(&mut kernel, &enumerate(1, 1));
    assert_eq!(status(&ask(&mut kernel, &enumerate(1, 2))), HV_S_CONT);
    let t = Instant::now();
    let done = r.finish(Deadline::after(Duration::from_secs(30)));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(done.changed, vec![(3, vec![Record::new("HostName", "h")])]);
    assert_eq!(done.requests, 5);
    // the device is closed: the kernel's end reads the end of the stream
    let mut b = [0u8; 16];
    assert_eq!(kernel.read(&mut b).unwrap(), 0);
}

#[test]
fn without_a_sweep_finish_waits_for_the_deadline_only() {
    let (r, _tx, mut kernel) = responder(pools_with_report());
    registered(&mut kernel);
    r.posted();
    let t = Instant::now();
    let done = r.finish(Deadline::after(Duration::from_millis(300)));
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(done.changed.is_empty());
}

#[test]
fn a_lost_device_is_opened_again_and_registered_anew() {
    let (r, tx, mut kernel) = responder(pools_with_report());
    registered(&mut kernel);
    drop(kernel);
    let (dev, mut kernel) = pair();
    tx.send(dev).unwrap();
    registered(&mut kernel);
    let a = ask(&mut kernel, &enumerate(1, 1));
    assert_eq!(c(&a[532..2580]), b"v2");
    drop(r);
    let mut b = [0u8; 16];
    assert_eq!(kernel.read(&mut b).unwrap(), 0);
}

/// PID 1 with no root serves its failure until the machine halts: a detached responder still
/// answers the host long after `detach` (its drop used to stop the thread 100 ms later).
#[test]
fn a_detached_responder_keeps_serving() {
    let (r, _tx, mut kernel) = responder(pools_with_report());
    registered(&mut kernel);
    r.detach();
    std::thread::sleep(POLL * 5);
    let a = ask(&mut kernel, &enumerate(1, 0));
    assert_eq!(c(&a[20..532]), b"PROVISIONING_REPORT");
}

const POLL: Duration = Duration::from_millis(100);

/// The device takes one opener, as the kernel's hv_utils_transport does (EBUSY while the
/// previous descriptor is open): after a failed read the responder closes before it opens
/// again, so the second open succeeds and it registers anew.
#[test]
fn the_old_descriptor_is_closed_before_the_device_is_opened_again() {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    use std::sync::{Arc, Mutex};
    let kernels: Arc<Mutex<Vec<File>>> = Arc::new(Mutex::new(Vec::new()));
    let opens: Arc<Mutex<Vec<&'static str>>> = Arc::new(Mutex::new(Vec::new()));
    let (k, o) = (kernels.clone(), opens.clone());
    let open: Opener = Box::new(move || {
        let mut ends = k.lock().unwrap();
        if let Some(prev) = ends.last() {
            let mut fds = [PollFd::new(prev.as_fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::ZERO).unwrap();
            if !fds[0].revents().unwrap().contains(PollFlags::POLLHUP) {
                o.lock().unwrap().push("EBUSY");
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
        }
        let (dev, kernel) = pair();
        ends.push(kernel);
        o.lock().unwrap().push("ok");
        Ok(dev)
    });
    let r = Responder::start(open, pools_with_report()).unwrap();
    let mut kernel = kernels.lock().unwrap()[0].try_clone().unwrap();
    registered(&mut kernel);
    // a message of the wrong size: the read fails, the responder opens the device again
    kernel.write_all(&[3u8; 16]).unwrap();
    let start = Instant::now();
    while kernels.lock().unwrap().len() < 2 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut again = kernels.lock().unwrap()[1].try_clone().unwrap();
    registered(&mut again);
    let a = ask(&mut again, &enumerate(1, 0));
    assert_eq!(c(&a[20..532]), b"PROVISIONING_REPORT");
    drop(r);
    assert_eq!(*opens.lock().unwrap(), ["ok", "ok"]);
}

/// The host reads the guest pool when the health report reaches it, which may be before the
/// POST's answer comes back: a sweep begun once the report was published counts, and finish
/// does not wait for another.
#[test]
fn a_sweep_begun_while_the_post_is_in_flight_counts() {
    let (r, _tx, mut kernel) = responder(Pools::default());
    registered(&mut kernel);
    // a sweep before the report: not the one for it
    assert_eq!(status(&ask(&mut kernel, &enumerate(1, 0))), HV_S_CONT);
    r.publish(pools_with_report()[1].clone());
    let a = ask(&mut kernel, &enumerate(1, 0));
    assert_eq!(c(&a[20..532]), b"PROVISIONING_REPORT");
    ask(&mut kernel, &enumerate(1, 1));
    assert_eq!(status(&ask(&mut kernel, &enumerate(1, 2))), HV_S_CONT);
    r.posted();
    let t = Instant::now();
    r.finish(Deadline::after(Duration::from_secs(5)));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}
