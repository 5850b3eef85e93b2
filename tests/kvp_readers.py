#!/usr/bin/env python3
"""KVP readers no one on the project wrote, for the tests of what azprov writes and serves
(tests/netns_kvp.rs):

  kvp_readers.py cloud-init POOL_FILE      cloud-init's HyperVKvpReportingHandler reads the pool
  kvp_readers.py daemon POOL_DIR           Debian's hv_kvp_daemon serves POOL_DIR to the fake
                                           kernel's transcript
  kvp_readers.py kernel SOCKET             the fake kernel's transcript against whatever
                                           connects to SOCKET (azprov's responder)

Each prints JSON. The packages are Debian 12's (cloud-init, hyperv-daemons), fetched and
unpacked once into the project's cache, never installed. The daemon's open of
/dev/vmbus/hv_kvp is sent to a SOCK_SEQPACKET socket by an LD_PRELOAD shim (message
boundaries kept, as the device keeps them); its /var/lib/hyperv is POOL_DIR, bind-mounted in
a mount namespace of its own (needs root)."""
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from testbed.host import CACHE, sh  # noqa: E402
from testbed.images import fetch_deb  # noqa: E402

MSG = 7432
HV_S_OK, HV_E_FAIL, HV_S_CONT = 0, 0x80004005, 0x80070103
GET, SET, DELETE, ENUMERATE, REGISTER1 = 0, 1, 2, 3, 100

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* /dev/vmbus/hv_kvp becomes a connection to $KVP_SOCK; every other open is the real one */
static int kvp(void) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    strncpy(a.sun_path, getenv("KVP_SOCK"), sizeof(a.sun_path) - 1);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) { close(fd); return -1; }
    return fd;
}
#define WRAP(name) \
int name(const char *p, int flags, ...) { \
    va_list ap; va_start(ap, flags); int mode = va_arg(ap, int); va_end(ap); \
    if (strcmp(p, "/dev/vmbus/hv_kvp") == 0) return kvp(); \
    int (*real)(const char *, int, ...) = dlsym(RTLD_NEXT, #name); \
    return real(p, flags, mode); \
}
WRAP(open)
WRAP(open64)
"""


def shim():
    """The shim, built once into the cache."""
    out = os.path.join(CACHE, "kvp-shim.so")
    if not os.path.exists(out):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "shim.c")
            with open(src, "w") as f:
                f.write(SHIM)
            sh("cc", "-shared", "-fPIC", "-O2", "-o", out + ".tmp", src, "-ldl")
        os.rename(out + ".tmp", out)
    return out


# ---------------------------------------------------------------- the fake kernel
def message(op, pool, body=b""):
    m = bytearray(MSG)
    m[0], m[1] = op, pool
    m[4:4 + len(body)] = body
    return bytes(m)


def cstr(b):
    return b.split(b"\0", 1)[0].decode("utf-8")


def exchange(conn, m):
    conn.send(m)
    r = conn.recv(MSG + 1)
    assert len(r) == MSG, f"a reply of {len(r)} bytes"
    return r


def handshake(conn):
    r = conn.recv(MSG + 1)
    assert len(r) == MSG and r[0] == REGISTER1, "no REGISTER1 first"
    conn.send(message(REGISTER1, 0, b"3.1\0"))


def enumerate_pool(conn, pool):
    """Every record of `pool`, then the status that ended the sweep."""
    out = []
    for i in range(10000):
        r = exchange(conn, message(ENUMERATE, pool, struct.pack("<I", i)))
        status = struct.unpack("<I", r[0:4])[0]
        if status != HV_S_OK:
            return out, status
        out.append([cstr(r[20:532]), cstr(r[532:2580])])
    raise AssertionError("a sweep that never ends")


def set_msg(pool, key, value):
    k, v = key.encode() + b"\0", value.encode() + b"\0"
    body = struct.pack("<III", 1, len(k), len(v)) + k.ljust(512, b"\0") + v
    return message(SET, pool, body)


def get_msg(pool, key):
    k = key.encode() + b"\0"
    return message(GET, pool, struct.pack("<III", 1, len(k), 2048) + k)


def delete_msg(pool, key):
    k = key.encode() + b"\0"
    return message(DELETE, pool, struct.pack("<I", len(k)) + k)


def transcript(listener):
    """What the host would ask: the pools swept, SET, GET and DELETE, then the device lost
    and registered anew. Each step's status and answer."""
    steps = []
    conn, _ = listener.accept()
    with conn:
        handshake(conn)
        for pool in (1, 0, 3):
            recs, end = enumerate_pool(conn, pool)
            steps.append([f"enumerate {pool}", recs, end])
        for pool, key, value in ((0, "HostKey", "v0"), (3, "HostName", "host-a"), (3, "HostName", "host-b")):
            r = exchange(conn, set_msg(pool, key, value))
            steps.append([f"set {pool} {key}", struct.unpack("<I", r[0:4])[0]])
        for pool in (0, 3):
            steps.append([f"enumerate {pool} after set", *enumerate_pool(conn, pool)])
        r = exchange(conn, get_msg(3, "HostName"))
        steps.append(["get 3 HostName", struct.unpack("<I", r[0:4])[0], cstr(r[528:2576])])
        for key in ("HostKey", "missing"):
            r = exchange(conn, delete_msg(0, key))
            steps.append([f"delete 0 {key}", struct.unpack("<I", r[0:4])[0]])
        steps.append(["enumerate 0 after delete", *enumerate_pool(conn, 0)])
    # the device goes away (a host reset): the daemon opens it again and registers anew
    listener.settimeout(20)
    conn, _ = listener.accept()
    with conn:
        handshake(conn)
        steps.append(["enumerate 1 after re-registration", *enumerate_pool(conn, 1)])
    return steps


def listening(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    s.listen(1)
    s.settimeout(60)
    return s


# ---------------------------------------------------------------- the readers
def read_cloud_init(pool_file):
    """cloud-init's own reader of the guest pool (Debian 12's package, unpacked)."""
    root = fetch_deb("cloud-init")
    code = ("import json, sys\n"
            "from cloudinit.reporting.handlers import HyperVKvpReportingHandler as H\n"
            "H._already_truncated_pool_file = True\n"
            "h = H(kvp_file_path=sys.argv[1])\n"
            "print(json.dumps([[r['key'], r['value']] for r in h._iterate_kvps(0)]))\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "usr", "lib", "python3", "dist-packages"))
    out = subprocess.run([sys.executable, "-c", code, pool_file], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def run_daemon(pool_dir):
    """Debian's hv_kvp_daemon with POOL_DIR as its /var/lib/hyperv, under the transcript."""
    daemon = os.path.join(fetch_deb("hyperv-daemons"), "usr", "sbin", "hv_kvp_daemon")
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "kvp.sock")
        listener = listening(sock)
        script = ('mkdir -p /var/lib/hyperv && mount --bind "$1" /var/lib/hyperv && '
                  'exec env LD_PRELOAD="$2" KVP_SOCK="$3" "$4" -n')
        p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                              os.path.abspath(pool_dir), shim(), sock, daemon],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            return transcript(listener)
        finally:
            p.kill()
            p.wait()
            listener.close()


def run_kernel(sock):
    """The transcript against whatever connects to SOCK (azprov's responder)."""
    listener = listening(sock)
    print("listening", flush=True)
    try:
        return transcript(listener)
    finally:
        listener.close()


def main():
    what, arg = sys.argv[1], sys.argv[2]
    result = {"cloud-init": read_cloud_init, "daemon": run_daemon, "kernel": run_kernel}[what](arg)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
