"""QEMU as the test VMs run it: the machine shapes (Gen1: -M pc, the CD on IDE, the root on
virtio; Gen2: q35, both on one virtio-scsi controller; NVMe), the kernel command line, a boot to
its power-off (`boot`), a boot cut by a power cut at a chosen write (`boot_cut`), and `VM`, a
Debian image running in the background that a test logs into over SSH. Every VM runs inside an
Azure's namespace (testbed/azure.py), its NIC on tap0.

TCG only, unless KVM proves usable (`kvm_usable`; on these machines /dev/kvm is a software
nested hypervisor that cannot boot a stock kernel). QEMU_TESTS_APPEND adds kernel
parameters to every boot of `boot` and `boot_cut` (e.g. azprov.log=debug).
"""
import json
import os
import socket
import subprocess
import time

from testbed.azure import GUEST_MAC
from testbed.images import ROOT_UUID

# QEMU's SMBIOS UUID; on -M pc (no EFI) azprov byte-swaps the first three fields (Gen1 rule).
DMI_UUID = "78563412-ab90-efcd-1234-567890abcdef"
VM_TIMEOUT = 150
# What Azure puts into the DMI chassis asset tag; without it azprov does nothing.
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
# the lines azprov frames its host key fingerprints with on the console (hostkeys::BEGIN, ::END),
# as cloud-init and waagent do for Azure's serial console
FINGERPRINTS_BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
FINGERPRINTS_END = "-----END SSH HOST KEY FINGERPRINTS-----"
# the admin the Debian images are provisioned with, and how long a Debian boot may take
USER = "azureuser"
BOOT_TIMEOUT = 240


def qemu_args(shape, kernel_img, initrd, root_img, cd, append, accel, on_azure=True, mem="384", disk_blockdev=None,
              nic="virtio-net-pci"):
    a = ["qemu-system-x86_64", "-accel", accel, "-m", mem, "-smp", "1", "-nodefaults", "-display", "none",
         "-no-reboot", "-uuid", DMI_UUID, "-kernel", kernel_img, "-initrd", initrd, "-append", append,
         "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", f"{nic},netdev=n0,mac={GUEST_MAC}"]
    # a .qcow2 root is an overlay on a shared raw image (qemu-tests/distro)
    fmt = "qcow2" if root_img and root_img.endswith(".qcow2") else "raw"
    if on_azure:
        a += ["-smbios", f"type=3,asset={AZURE_ASSET_TAG}"]
    if shape == "gen1":
        # no root_img: a system whose initramfs is the OS (azprov.inplace) has no disk
        a += ["-M", "pc"] + (["-drive", f"file={root_img},format={fmt},if=virtio"] if root_img else [])
        if cd:
            a += ["-drive", f"file={cd},format=raw,media=cdrom,if=ide,readonly=on"]
    elif shape == "nvme":  # the OS disk on NVMe, as Azure's v6 sizes and later have it
        a += ["-M", "q35", "-drive", f"file={root_img},format={fmt},if=none,id=nv0",
              "-device", "nvme,serial=azprovos0,drive=nv0"]
        if cd:
            a += ["-device", "virtio-scsi-pci,id=scsi0",
                  "-drive", f"file={cd},format=raw,if=none,media=cdrom,id=cd0,readonly=on",
                  "-device", "scsi-cd,drive=cd0,bus=scsi0.0"]
    else:  # gen2: everything on one SCSI controller, as Azure Gen2 VMs have it
        a += ["-M", "q35", "-device", "virtio-scsi-pci,id=scsi0"]
        if disk_blockdev:  # the disk through a -blockdev node of the caller's (blkdebug)
            a += ["-blockdev", json.dumps(disk_blockdev),
                  "-device", f"scsi-hd,drive={disk_blockdev['node-name']},bus=scsi0.0,werror=stop,rerror=stop"]
        else:
            # gen2-4kn: a disk of 4096-byte logical sectors (4Kn)
            lbs = ",logical_block_size=4096,physical_block_size=4096" if shape == "gen2-4kn" else ""
            a += ["-drive", f"file={root_img},format={fmt},if=none,id=hd0", "-device", f"scsi-hd,drive=hd0,bus=scsi0.0{lbs}"]
        if cd:
            a += ["-drive", f"file={cd},format=raw,if=none,media=cdrom,id=cd0,readonly=on",
                  "-device", "scsi-cd,drive=cd0,bus=scsi0.0"]
    return a


def kernel_append(shape, extra_append=""):
    """The test kernel's command line: the root by UUID on Gen2's SCSI disk, /dev/vda on Gen1,
    /dev/nvme0n1 on NVMe."""
    root = {"gen2": "root=UUID=" + ROOT_UUID, "gen2-4kn": "root=UUID=" + ROOT_UUID,
            "nvme": "root=/dev/nvme0n1"}.get(shape, "root=/dev/vda")
    return (f"console=ttyS0 loglevel=6 panic=-1 cryptomgr.notests {root} rw rootwait "
            f"azprov.timeout=60 azprov.onfail=poweroff {extra_append} "
            f"{os.environ.get('QEMU_TESTS_APPEND', '')}").strip()


def console_text(path):
    """What the serial console wrote so far ("" before QEMU opened it)."""
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def boot(azure, work, shape, kernel_img, initrd, root_img, cd, extra_append="", accel="tcg", timeout=VM_TIMEOUT,
         on_azure=True, qemu_extra=(), nic="virtio-net-pci", append=None):
    """A boot to its end (power-off, or `timeout`): when it started (time.time()), how long QEMU
    ran, the console (with QEMU's exit code and stderr when it failed) and the exit code.
    `append`: the whole kernel command line instead of the test kernel's."""
    append = append or kernel_append(shape, extra_append)
    console = os.path.join(work, "console.log")
    cmd = azure.inside("timeout", str(timeout),
                       *qemu_args(shape, kernel_img, initrd, root_img, cd, append, accel, on_azure, nic=nic),
                       "-serial", f"file:{console}", *qemu_extra)
    start = time.time()
    rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    took = time.time() - start
    out = console_text(console)
    if rc.returncode not in (0,):
        out += f"\n[qemu rc={rc.returncode}] {rc.stderr}"
    return start, took, out, rc.returncode


def qmp_status(sock):
    """The VM's run state from QEMU's QMP socket (e.g. "running", "io-error"), or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(sock)
            f = s.makefile("rw")
            f.readline()  # the greeting
            for cmd in ("qmp_capabilities", "query-status"):
                f.write(json.dumps({"execute": cmd}) + "\n")
                f.flush()
                while True:
                    msg = json.loads(f.readline())
                    if "return" in msg or "error" in msg:
                        break
            return msg.get("return", {}).get("status")
    except (OSError, ValueError):
        return None


def boot_cut(azure, work, kernel_img, initrd, disk, cd, sector=None, console_mark=None, timeout=VM_TIMEOUT,
             torn=False, append=None):
    """A Gen2 boot cut by a power cut: QEMU is killed (SIGKILL) when the guest's first write
    touching `sector` of `disk` reaches it (blkdebug fails it, werror=stop freezes the VM, so
    neither it nor anything after it is written), or when `console_mark` shows on the
    console. `torn`: the disk takes writes in pieces of 4 KiB, one after the other, so the
    pieces of a longer write before `sector` land and the rest does not (a write torn in its
    middle). Returns what happened ("write", "console", or "finished") and the console."""
    node = {"driver": "raw", "node-name": "hd0",
            "file": {"driver": "blkdebug", "image": {"driver": "file", "filename": disk}}}
    if torn:
        node["file"]["max-transfer"] = 4096
    if sector is not None:
        node["file"]["inject-error"] = [{"event": "write_aio", "sector": sector, "iotype": "write", "once": True}]
    console = os.path.join(work, "console.log")
    sock = os.path.join(work, "qmp.sock")
    for f in (console, sock):
        if os.path.exists(f):
            os.remove(f)
    cmd = azure.inside(*qemu_args("gen2", kernel_img, initrd, None, cd, append or kernel_append("gen2"), "tcg",
                                  disk_blockdev=node, mem="768" if append else "384"),
                       "-serial", f"file:{console}", "-qmp", f"unix:{sock},server=on,wait=off")
    q = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    how, end = "finished", time.time() + timeout
    try:
        while q.poll() is None:
            if time.time() > end:
                how = "timeout"
                break
            if console_mark and console_mark in console_text(console):
                how = "console"
                break
            if sector is not None and os.path.exists(sock) and qmp_status(sock) == "io-error":
                how = "write"
                break
            time.sleep(0.2)
    finally:
        q.kill()
        q.wait()
    out = console_text(console)
    if how == "finished":
        out += f"\n[qemu rc={q.returncode}] {q.stderr.read().decode(errors='replace')}"
    return how, out



def kvm_usable():
    """KVM when /dev/kvm opens and a VM with the host's CPU starts. A software-nested KVM
    (kvm_pvm) opens and starts too, then crawls through emulation and dies in the kernel's
    decompressor: taken as no KVM."""
    if os.path.exists("/sys/module/kvm_pvm"):
        return False
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError:
        return False
    r = subprocess.run(["timeout", "3", "qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-M", "pc", "-m", "64",
                        "-nodefaults", "-display", "none", "-S", "-monitor", "none"],
                       capture_output=True, stdin=subprocess.DEVNULL, check=False)
    return r.returncode == 124  # still running when timeout stopped it


class VM:
    """QEMU running a Debian image (Gen1, `cd` on IDE, `disks` on virtio after the root: qcow2
    overlays, raw `.img` files, or ("nvme", path) for an NVMe disk) in `azure`'s namespace, in
    the background, with the console in work/console-NAME.log; a context manager that stops it."""

    def __init__(self, azure, work, name, kernel, initrd, img, cd, extra="", on_azure=True, disks=()):
        self.azure, self.console = azure, os.path.join(work, f"console-{name}.log")
        append = f"root=UUID={ROOT_UUID} ro console=ttyS0 panic=-1 {extra}".strip()
        # a whole Debian userland needs more than azprov's test root
        args = qemu_args("gen1", kernel, initrd, img, cd, append, "tcg", on_azure, mem="768")
        for i, d in enumerate(disks):
            if isinstance(d, tuple):
                args += ["-drive", f"file={d[1]},format=raw,if=none,id=nvd{i}",
                         "-device", f"nvme,serial=azprovlocal{i},drive=nvd{i}"]
            else:
                fmt = "raw" if d.endswith(".img") else "qcow2"
                args += ["-drive", f"file={d},format={fmt},if=virtio"]
        self.start = time.time()
        self.proc = subprocess.Popen(azure.inside(*args, "-serial", f"file:{self.console}"),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def out(self):
        return console_text(self.console)

    def wait_console(self, text, timeout=BOOT_TIMEOUT):
        """Seconds from QEMU start until `text` is on the console, or None."""
        while time.time() - self.start < timeout and self.proc.poll() is None:
            if text in self.out():
                return time.time() - self.start
            time.sleep(0.5)
        return None

    def guest_addr(self):
        """The newest address dnsmasq handed out (the real OS's client may use another
        client id than azprov, and so get another address)."""
        addrs = [w[i + 1] for w in (l.split() for l in open(self.azure.dnsmasq_log))
                 for i in range(len(w) - 1) if w[i].startswith("DHCPACK(")]
        return addrs[-1] if addrs else None

    def ssh(self, key, command, timeout=5):
        addr = self.guest_addr()
        if not addr:
            return None
        # an attempt that hangs is a failed attempt
        r = self.azure.ssh(key, USER, addr, command, timeout=timeout + 10, connect_timeout=2)
        return r if r is not None and r.returncode == 0 else None

    def wait_ssh(self, key, command, timeout=BOOT_TIMEOUT):
        """The first SSH command that succeeds, and when (seconds from QEMU start)."""
        while time.time() - self.start < timeout and self.proc.poll() is None:
            r = self.ssh(key, command)
            if r is not None:
                return r, time.time() - self.start
            time.sleep(1)
        return None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self, key=None):
        """Powers the guest off over SSH when it can, else kills QEMU."""
        if key and self.proc.poll() is None:
            self.ssh(key, "sudo -n systemctl poweroff --no-block")
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


