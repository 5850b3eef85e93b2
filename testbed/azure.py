"""The simulated Azure one VM meets: a network namespace that holds Azure's addresses
(168.63.129.16 and 169.254.169.254 on its loopback), the guest's link, Azure's DHCP (dnsmasq,
every option unasked, option 245 too) and the fabric (testbed/fabric.py: the WireServer and
IMDS) serving on those addresses.

    with Azure(work, "t1", images.imds_doc("vm1")) as azure:
        ... boot a VM in azure.ns on tap0 ...
        azure.requests(), azure.ready_after(start), azure.dhcp_discovers()

The guest's link is a tap device (tap0, for QEMU), or with guest="veth" a veth pair whose
end vm0 sits in a second namespace, `azure.guest_ns`, for running azprov itself as a process
(the bench). The guest's MAC gets GUEST_IP, as Azure gives a subnet's first VM.
"""
import json
import os
import subprocess
import time

from testbed.host import FIXTURES, TOP, sh

# The guest's NIC: a MAC from Azure's range and the address Azure gives a subnet's first VM;
# dnsmasq binds the one to the other, and IMDS lists both as the VM's interface.
GUEST_MAC = "00:0d:3a:12:34:56"
GUEST_IP = "10.44.0.4"
GATEWAY = "10.44.0.1"
FABRIC = os.path.join(TOP, "testbed", "fabric.py")


def azure_dhcp_options(gateway):
    """tests/fixtures/azure-dhcp-options (the one definition) with the router filled in."""
    with open(os.path.join(FIXTURES, "azure-dhcp-options")) as f:
        return [l.strip().replace("GATEWAY", gateway) for l in f
                if l.strip() and not l.startswith("#")]


class Azure:
    """A namespace with the guest's link, dnsmasq and the fabric; a context manager that stops
    them and removes the namespaces."""

    def __init__(self, work, tag, doc, playbook=(), option245=True, fabric_args=(), guest="tap"):
        self.ns = f"azq{os.getpid() % 10000}{tag}"
        self.guest_ns = self.ns + "v" if guest == "veth" else None
        self.work = work
        self.procs = []
        try:
            self._start(doc, playbook, option245, fabric_args)
        except BaseException:
            self.close()
            raise

    def _start(self, doc, playbook, option245, fabric_args):
        work = self.work
        for ns in filter(None, (self.ns, self.guest_ns)):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, check=False)
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        ip = lambda *a: sh("ip", "-n", self.ns, *a)
        ip("addr", "add", "168.63.129.16/32", "dev", "lo")
        ip("addr", "add", "169.254.169.254/32", "dev", "lo")
        if self.guest_ns:
            sh("ip", "-n", self.guest_ns, "link", "add", "vm0", "address", GUEST_MAC, "type", "veth",
               "peer", "name", "tap0", "netns", self.ns)
        else:
            ip("tuntap", "add", "dev", "tap0", "mode", "tap")
        ip("addr", "add", f"{GATEWAY}/24", "dev", "tap0")
        ip("link", "set", "tap0", "up")
        with open(os.path.join(work, "imds.json"), "w") as f:
            json.dump(doc, f)
        with open(os.path.join(work, "playbook.json"), "w") as f:
            json.dump(list(playbook), f)
        self.fabric_log = os.path.join(work, "fabric.jsonl")
        self.dnsmasq_log = os.path.join(work, "dnsmasq.log")
        # a work directory used again (the second boot of a scenario, try-image --work) starts
        # with empty logs and no old lease
        for stale in (self.fabric_log, self.dnsmasq_log, os.path.join(work, "dnsmasq.leases")):
            if os.path.exists(stale):
                os.remove(stale)
        fab = subprocess.Popen(self.inside("python3", FABRIC, "--log", self.fabric_log,
                                           "--imds-doc", os.path.join(work, "imds.json"),
                                           "--playbook", os.path.join(work, "playbook.json"), "--vm-address", GUEST_IP,
                                           *fabric_args),
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.procs.append(fab)
        if fab.stdout.readline() != b"fabric ready\n":
            raise RuntimeError(f"the fabric did not start (exit {fab.poll()})")
        args = self.inside("dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--port=0",
                           "--interface=tap0", "--bind-interfaces", "--user=root", "--no-ping",
                           "--dhcp-authoritative", "--log-dhcp", f"--log-facility={self.dnsmasq_log}",
                           f"--dhcp-leasefile={work}/dnsmasq.leases", f"--pid-file={work}/dnsmasq.pid",
                           "--dhcp-range=10.44.0.10,10.44.0.50,255.255.255.0,infinite",
                           f"--dhcp-host={GUEST_MAC},{GUEST_IP}")
        # Azure's DHCP sends every option unasked (option 245 too, which few clients ask for)
        args += ["--dhcp-option-force=" + o for o in azure_dhcp_options(GATEWAY)
                 if option245 or not o.startswith("245,")]
        self.procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL))
        for _ in range(200):
            if os.path.exists(self.dnsmasq_log) and "DHCP, IP range" in open(self.dnsmasq_log).read():
                break
            time.sleep(0.02)

    def inside(self, *args):
        """`args` as a command line run in the namespace."""
        return ["ip", "netns", "exec", self.ns, *args]

    def ssh(self, key, user, addr, command, timeout=20, connect_timeout=3):
        """`command` over SSH as `user`@`addr` with `key` (no host key kept): the finished ssh
        (whatever its exit), or None when it took over `timeout` s."""
        try:
            return subprocess.run(self.inside("ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                                              "-o", "UserKnownHostsFile=/dev/null", "-o",
                                              f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR",
                                              f"{user}@{addr}", command),
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            return None

    def keyscan(self, addr, kinds="ed25519,ecdsa,rsa", timeout=2):
        """The host keys sshd at `addr` offers (ssh-keyscan's lines; "" when none)."""
        return subprocess.run(self.inside("ssh-keyscan", "-T", str(timeout), "-t", kinds, addr), capture_output=True,
                              text=True, check=False).stdout

    def requests(self):
        """What the fabric received so far, one dict per request (fabric.py's log)."""
        if not os.path.exists(self.fabric_log):
            return []
        with open(self.fabric_log) as f:
            return [json.loads(l) for l in f if l.strip()]

    def dhcp_discovers(self):
        return open(self.dnsmasq_log).read().count("DHCPDISCOVER") if os.path.exists(self.dnsmasq_log) else 0

    def ready_after(self, start):
        """Seconds from `start` (time.time()) to the fabric's taking Ready, or None."""
        for r in self.requests():
            if r.get("endpoint") == "health" and r.get("state") == "Ready" and r.get("status") == 200:
                return r["t"] - start
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()
        for ns in filter(None, (self.ns, self.guest_ns)):
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, check=False)
