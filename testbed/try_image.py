"""Test your image before you upload it: boots an Azure image in QEMU, through its own
bootloader, against a simulated Azure (DHCP, WireServer, IMDS, the provisioning CD) in a
network namespace of its own, and reports whether it provisions: Ready or NotReady (with the
reason, as Azure shows it) and when, the first SSH login as the admin and what it finds, and
every request the fabric received.

  scripts/try-image IMAGE [OPTIONS]          (needs root: network namespace, tap device)

IMAGE is the disk as it will be uploaded: qcow2, raw, fixed VHD or VHDX. It is never
modified: the VM writes to an overlay. Exit status 0 only when Azure was told Ready and the
admin logged in over SSH (--ssh-only: the login alone; --reboot: and again after a reboot);
otherwise 1 and a one-line cause (2 for a usage error).
"""
import argparse
import base64
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from testbed.azure import GUEST_IP, GUEST_MAC, Azure
from testbed.images import imds_interface, ovf_env, write_cd
from testbed.vm import AZURE_ASSET_TAG, FINGERPRINTS_END, console_text, kvm_usable

OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
# How long after the VM's sshd answers, with a lease and still no fabric request, the run
# ends early: an agent that runs asks the fabric before sshd is up, or soon after it.
SILENT_FABRIC = 60
# vCPUs and memory (MiB) of the sizes people try small images on; --cpus/--memory override
VM_SIZES = {"Standard_B1s": (1, 1024), "Standard_B1ms": (1, 2048), "Standard_B2s": (2, 4096),
            "Standard_B2ms": (2, 8192), "Standard_D2s_v5": (2, 8192), "Standard_D2ds_v5": (2, 8192),
            "Standard_D4s_v5": (4, 16384)}


# admin user names Azure's API refuses (the "adminUsername" rules of Microsoft.Compute)
RESERVED_USERS = {"administrator", "admin", "user", "user1", "test", "user2", "test1", "user3", "admin1", "1",
                  "123", "a", "actuser", "adm", "admin2", "aspnet", "backup", "console", "david", "guest", "john",
                  "owner", "root", "server", "sql", "support", "support_388945a0", "sys", "test2", "test3",
                  "user4", "user5"}


class UsageError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/try-image", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("image", help="the image: qcow2, raw, fixed VHD or VHDX")
    vm = p.add_argument_group("the VM, as set when creating it on Azure")
    vm.add_argument("--gen", choices=("1", "2"), default="1",
                    help="1: BIOS, the CD on IDE; 2: UEFI (OVMF), the CD on SCSI (default 1)")
    vm.add_argument("--user", default="azureuser", help="the admin user (default azureuser)")
    vm.add_argument("--ssh-key", metavar="FILE.pub",
                    help="the admin's public key; its private key beside it logs in (default: a new ed25519 key)")
    vm.add_argument("--password", help="the admin's password (password login is then left on)")
    vm.add_argument("--custom-data", metavar="FILE", help="custom data (on the CD, base64 in ovf-env.xml)")
    vm.add_argument("--user-data", metavar="FILE", help="user data (IMDS compute.userData)")
    vm.add_argument("--vm-name", default="try-image", help="the VM's name (IMDS compute.name)")
    vm.add_argument("--hostname", help="the computer name (OVF HostName; default: the VM's name)")
    vm.add_argument("--vm-size", default="Standard_B2s",
                    help=f"IMDS compute.vmSize, and vCPUs and memory for {', '.join(VM_SIZES)} (default Standard_B2s)")
    vm.add_argument("--cpus", type=int, help="vCPUs (default: the size's)")
    vm.add_argument("--memory", type=int, metavar="MiB", help="memory (default: the size's, else 4096)")
    vm.add_argument("--disk-size", metavar="SIZE",
                    help="the OS disk's size, e.g. 32G (default: the image's, as Azure makes it)")
    vm.add_argument("--disk-bus", choices=("scsi", "virtio", "ide"), default="scsi",
                    help="how the OS disk is attached: scsi (virtio-scsi, /dev/sda as on Azure), virtio or ide")
    run = p.add_argument_group("the run")
    run.add_argument("--timeout", type=int, default=600, help="seconds from QEMU start to give up (default 600)")
    run.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                     help="KVM when /dev/kvm is usable, else TCG (default auto)")
    run.add_argument("--work", metavar="DIR", help="where the console log, the fabric's log and the overlay go "
                                                   "(default: a new directory under $TMPDIR)")
    run.add_argument("--keep-disk", action="store_true",
                     help="keep the overlay the VM wrote (os-disk.qcow2 in the work directory) to look into")
    run.add_argument("--reboot", action="store_true",
                     help="after the first boot's login (and azprov's RSA host key, when it makes one after the "
                          "handover), power the VM off from inside and boot it again (the same disk and CD, as "
                          "Azure's restart): report when SSH answers and what reached the fabric")
    run.add_argument("--ssh-only", action="store_true",
                     help="success is the SSH login alone; no health report is waited for (an image with no "
                          "provisioning agent, its admin and key baked in)")
    run.add_argument("--json", action="store_true", help="print the report as one JSON object")
    run.add_argument("--quiet", action="store_true", help="no progress lines while it boots")
    faults = p.add_argument_group("faults the fabric plays")
    faults.add_argument("--goalstate-delay", type=float, metavar="SECS", help="every goal state answered this late")
    faults.add_argument("--goalstate-fail", type=int, metavar="N", help="the first N goal states answered 503")
    faults.add_argument("--incarnation-change", action="store_true",
                        help="the incarnation moves on after the first goal state (boot diagnostics toggled)")
    faults.add_argument("--imds-429", type=int, metavar="N", help="the first N IMDS requests answered 429")
    faults.add_argument("--imds-down", action="store_true", help="IMDS drops every connection")
    faults.add_argument("--no-cd", action="store_true", help="no provisioning CD")
    a = p.parse_args(argv)
    if not os.path.isfile(a.image):
        raise UsageError(f"{a.image}: no such file")
    for f in (a.custom_data, a.user_data, a.ssh_key):
        if f and (os.path.isdir(f) or not os.access(f, os.R_OK)):
            raise UsageError(f"{f}: no such file")
    if a.ssh_key and not os.path.isfile(private_key(a.ssh_key)):
        raise UsageError(f"{a.ssh_key}: the private key {private_key(a.ssh_key)} must be beside it to log in")
    if a.password and len(a.password) > 72:
        raise UsageError("the password is longer than Azure's 72 characters")
    if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,63}", a.user) or a.user in RESERVED_USERS:
        raise UsageError(f"{a.user!r} is not an admin user name Azure accepts")
    return a


def private_key(pub):
    return pub[:-len(".pub")] if pub.endswith(".pub") else pub


# ---------------------------------------------------------------- the image
def image_format(path):
    """qemu's name for the image's format. A fixed VHD is a raw disk with a 512-byte footer
    (cookie "conectix") that qemu's probe does not look at: found here instead."""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 512))
        if f.read(8) == b"conectix":
            return "vpc"
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", path], capture_output=True, text=True,
                                     check=True).stdout)
    return info["format"]


def upload_problems(path, fmt):
    """What Azure's disk upload would refuse in the image, one line each (none: it takes it).
    Azure takes a fixed VHD only: a raw disk whose size is a whole number of MiB, then the
    512-byte footer (cookie "conectix", disk type 2: fixed, the current size equal to the data
    before it, the checksum the one's complement of the footer's other bytes)."""
    if fmt != "vpc":
        return [f"a {fmt} image, not a fixed VHD: Azure's upload takes a fixed VHD "
                f"(qemu-img convert -f {fmt} -O vpc -o subformat=fixed,force_size IMAGE IMAGE.vhd, "
                f"its size first rounded up to a whole number of MiB)"]
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(size - 512)
        footer = f.read(512)
    data = size - 512
    problems = []
    if data % (1 << 20):
        problems.append(f"{size:,} bytes: the disk before the footer ({data:,} bytes) is not a whole number of "
                        f"MiB, which Azure requires (resize the raw disk to {-(-data // (1 << 20)):,} MiB, then "
                        f"convert with force_size)")
    if int.from_bytes(footer[60:64], "big") != 2:
        problems.append(f"the VHD's disk type is {int.from_bytes(footer[60:64], 'big')}, not 2 (fixed): "
                        f"Azure takes no dynamic or differencing VHD")
    if int.from_bytes(footer[48:56], "big") != data:
        problems.append(f"the footer's current size ({int.from_bytes(footer[48:56], 'big'):,}) is not the "
                        f"disk's ({data:,} bytes)")
    checksum = (~sum(footer[:64] + footer[68:])) & 0xFFFFFFFF
    if int.from_bytes(footer[64:68], "big") != checksum:
        problems.append("the VHD footer's checksum is wrong")
    return problems


def virtual_size(path, fmt):
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", "-f", fmt, path], capture_output=True,
                                     text=True, check=True).stdout)
    return info["virtual-size"]


def image_host_keys(path, fmt, work):
    """The SSH host key fingerprints in the image's root filesystems (ext2/3/4 read by debugfs),
    or None when they cannot be read. A raw copy is made for qcow2 and VHDX."""
    raw = path
    if fmt not in ("raw", "vpc"):
        raw = os.path.join(work, "image-flat.raw")
        if subprocess.run(["qemu-img", "convert", "-q", "-f", fmt, "-O", "raw", path, raw], check=False).returncode:
            return None
    try:
        table = json.loads(subprocess.run(["sfdisk", "-J", raw], capture_output=True, text=True,
                                          check=True).stdout)["partitiontable"]
        sector = table.get("sectorsize", 512)
        found, readable = set(), False
        for part in table["partitions"]:
            spec = f"{raw}?offset={part['start'] * sector}"
            ls = subprocess.run(["debugfs", "-R", "ls -l /etc/ssh", spec], capture_output=True, text=True, check=False)
            if ls.returncode or "ssh_config" not in ls.stdout:
                continue
            readable = True
            for name in re.findall(r"(ssh_host_\w+_key\.pub)", ls.stdout):
                key = subprocess.run(["debugfs", "-R", f"cat /etc/ssh/{name}", spec], capture_output=True,
                                     check=False).stdout
                fp = fingerprint(key)
                if fp:
                    found.add(fp)
        return found if readable else None
    except (subprocess.CalledProcessError, KeyError, ValueError):
        return None
    finally:
        if raw != path:
            os.remove(raw)


def fingerprint(pubkey):
    r = subprocess.run(["ssh-keygen", "-l", "-f", "-"], input=pubkey, capture_output=True, check=False)
    return r.stdout.split()[1].decode() if r.returncode == 0 and r.stdout else None


# ---------------------------------------------------------------- the VM
def dmi_uuid(vm_id, gen):
    """QEMU's -uuid for an IMDS vmId, so the guest's /sys/class/dmi/id/product_uuid is what an
    Azure VM of that generation shows: on Gen2 (UEFI) the vmId itself; on Gen1 (Hyper-V's BIOS,
    SMBIOS 2.3) the vmId with its first three fields byte-swapped, which agents swap back
    (azprov's vmid.rs, cloud-init's). QEMU's firmware hands the kernel -uuid as it is on both."""
    if gen == "2":
        return vm_id
    b = uuid.UUID(vm_id).bytes
    return str(uuid.UUID(bytes=b[3::-1] + b[5:3:-1] + b[7:5:-1] + b[8:]))


def qemu_command(a, p, console="console.log"):
    """QEMU's command line for the prepared try `p`; the UEFI variables are copied fresh for the first boot of a run
    (console.log) and kept for a reboot, as the VM's NVRAM is."""
    # Azure's CPUs have RDRAND, which the kernel trusts to seed its CRNG at boot: TCG's default
    # model lacks it, and a young guest would wait for entropy as no Azure VM does
    cpu = "host" if p.accel == "kvm" else "qemu64,+rdrand"
    cmd = ["qemu-system-x86_64", "-accel", p.accel, "-cpu", cpu, "-smp", str(p.cpus),
           "-m", str(p.memory), "-nodefaults",
           "-display", "none", "-uuid", dmi_uuid(a.vm_id, a.gen),
           "-serial", f"file:{os.path.join(p.work, console)}",
           "-smbios", "type=1,manufacturer=Microsoft Corporation,product=Virtual Machine,version=7.0",
           "-smbios", f"type=3,manufacturer=Microsoft Corporation,asset={AZURE_ASSET_TAG}",
           "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
           "-device", f"virtio-net-pci,netdev=n0,mac={GUEST_MAC}"]
    if a.gen == "2":
        vars_copy = os.path.join(p.work, "OVMF_VARS.fd")
        if console == "console.log" or not os.path.exists(vars_copy):
            shutil.copy(OVMF_VARS, vars_copy)
        cmd += ["-M", "q35", "-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
                "-drive", f"if=pflash,format=raw,unit=1,file={vars_copy}"]
    else:
        cmd += ["-M", "pc"]
    scsi = a.disk_bus == "scsi" or a.gen == "2"
    if scsi:
        cmd += ["-device", "virtio-scsi-pci,id=scsi0"]
    disk = f"file={p.overlay},format=qcow2,if=none,id=hd0"
    if a.disk_bus == "scsi":
        cmd += ["-drive", disk, "-device", "scsi-hd,drive=hd0,bus=scsi0.0,bootindex=0"]
    elif a.disk_bus == "virtio":
        cmd += ["-drive", disk, "-device", "virtio-blk-pci,drive=hd0,bootindex=0"]
    else:
        cmd += ["-drive", disk, "-device", "ide-hd,drive=hd0,bus=ide.0,bootindex=0"]
    if p.cd:
        cdrive = f"file={p.cd},format=raw,if=none,media=cdrom,id=cd0,readonly=on"
        if a.gen == "2":  # Gen2: the CD is on the SCSI controller
            cmd += ["-drive", cdrive, "-device", "scsi-cd,drive=cd0,bus=scsi0.0"]
        else:  # Gen1: on IDE, as Azure's
            cmd += ["-drive", cdrive, "-device", f"ide-cd,drive=cd0,bus=ide.{1 if a.disk_bus == 'ide' else 0}"]
    return cmd


def playbook(a):
    rules = []
    if a.goalstate_fail:
        rules.append({"endpoint": "goalstate", "requests": list(range(1, a.goalstate_fail + 1)), "status": 503})
    if a.goalstate_delay:
        rules.append({"endpoint": "goalstate", "requests": "*", "delay": a.goalstate_delay})
    if a.imds_down:
        rules.append({"endpoint": "imds", "requests": "*", "drop": True})
    elif a.imds_429:
        rules.append({"endpoint": "imds", "requests": list(range(1, a.imds_429 + 1)), "status": 429,
                      "body": '{"error": "Too many requests"}'})
    return rules


def imds_doc(a, key_pub):
    user_data = open(a.user_data, "rb").read() if a.user_data else b""
    return {
        "compute": {
            "azEnvironment": "AzurePublicCloud", "customData": "", "location": "westeurope", "name": a.vm_name,
            "offer": "", "osType": "Linux", "platformFaultDomain": "0", "provider": "Microsoft.Compute",
            "osProfile": {"adminUsername": a.user, "computerName": a.hostname,
                          "disablePasswordAuthentication": "false" if a.password else "true"},
            "publicKeys": [{"keyData": key_pub + "\n", "path": f"/home/{a.user}/.ssh/authorized_keys"}],
            "resourceId": f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/try-image/providers/"
                          f"Microsoft.Compute/virtualMachines/{a.vm_name}",
            "securityProfile": {"secureBootEnabled": "false", "securityType": "", "virtualTpmEnabled": "false"},
            "userData": base64.b64encode(user_data).decode(), "vmId": a.vm_id, "vmSize": a.vm_size, "zone": "",
        },
        "network": {"interface": imds_interface()},
        "extended": {"compute": {"hasCustomData": bool(a.custom_data), "ppsType": "None"}},
    }


# ---------------------------------------------------------------- watching it
class Progress:
    """Prints what happened since the last call: the DHCP lease, each fabric request, and the
    console's last line once in a while."""

    def __init__(self, azure, start, quiet):
        self.azure, self.start, self.quiet = azure, start, quiet
        self.seen_requests = 0
        self.leased = False

    def say(self, t, what):
        if not self.quiet:
            print(f"  {t:6.1f}s  {what}", file=sys.stderr, flush=True)

    def poll(self):
        reqs = self.azure.requests()
        if not self.leased and os.path.exists(self.azure.dnsmasq_log):
            acks = re.findall(r"DHCPACK\(tap0\) (\S+)", open(self.azure.dnsmasq_log).read())
            if acks:
                self.leased = True
                # dnsmasq's log has whole seconds only: the lease came before the first request
                t = min([time.time()] + [r["t"] for r in reqs[self.seen_requests:]]) - self.start
                self.say(t, f"DHCP: {acks[0]} leased to the VM")
        for r in reqs[self.seen_requests:]:
            self.say(r["t"] - self.start, describe(r))
        self.seen_requests = len(reqs)
        return reqs


def describe(r):
    server = {"imds": "IMDS", "hostgaplugin": "HostGAPlugin"}.get(r["server"], "WireServer")
    what = f"{server}: {r['method']} {r['path']} -> {r.get('status') or 'dropped'}"
    if r.get("endpoint") == "health":
        what += f" ({r.get('state')}" + (f": {r.get('description')}" if r.get("description") else "") + ")"
    return what


def report_state(requests, start):
    """The first final health report Azure acknowledged: (ready, reason, seconds from QEMU
    start). NotReady with substatus Provisioning is progress (waagent sends "Starting"), not
    an outcome."""
    for r in requests:
        if r.get("endpoint") == "health" and r.get("status") == 200 and r.get("state"):
            if r["state"] == "Ready":
                return True, None, r["t"] - start
            if r.get("substatus") == "Provisioning":
                continue
            reason = r.get("description") or "(no description)"
            return False, f"NotReady ({r.get('substatus') or 'no substatus'}): {reason}", r["t"] - start
    return None, None, None


# An agent that makes new host keys (waagent) deletes the image's first: a login in between
# finds none, so it waits up to 10 s for one to be there.
LOGIN = ("echo HOSTNAME=$(hostname); if sudo -n true 2>/dev/null; then echo SUDO=yes; else echo SUDO=no; fi; "
         "i=0; while ! ls /etc/ssh/ssh_host_*_key.pub >/dev/null 2>&1 && [ $i -lt 20 ]; do sleep 0.5; i=$((i+1)); done; "
         "for f in /etc/ssh/ssh_host_*_key.pub; do ssh-keygen -l -f \"$f\"; done; "
         "echo AZPROV-STATUS-BEGIN; sudo -n azprov status --json 2>/dev/null; echo AZPROV-STATUS-END")
# Once the boot has finished (a #! custom data script runs after multi-user.target): what azprov
# recorded then, its scripts' outcome among it
STATUS_AFTER_BOOT = ("systemctl is-system-running --wait >/dev/null 2>&1; echo AZPROV-STATUS-BEGIN; "
                     "sudo -n azprov status --json 2>/dev/null; echo AZPROV-STATUS-END")


def azprov_status(out):
    """What `azprov status --json` printed inside a login's output: its VM id and scripts, or
    None (no azprov in the image, or no answer)."""
    m = re.search(r"AZPROV-STATUS-BEGIN\n(.*?)AZPROV-STATUS-END", out or "", re.S)
    try:
        st = json.loads(m.group(1)) if m and m.group(1).strip() else None
    except ValueError:
        return None
    return {"vm_id": st.get("vm_id"), "scripts": st.get("scripts", {})} if isinstance(st, dict) else None


# Run in the fabric's namespace: tries to connect to the guest's port 22 every 0.2 s (0.5 s
# at most each) and exits 0 once sshd sends its banner. A connection that is taken waits for
# the banner as long as a client would (sshd forks and re-executes for it, slowly under TCG:
# hanging up sooner made it start over and over, a load on the guest). The login itself is
# tried only then, so the time of the first login does not depend on where a 3 s connect
# timeout happened to fall.
SSHD_PROBE = """
import socket, sys, time
while True:
    try:
        with socket.create_connection((sys.argv[1], 22), timeout=0.5) as s:
            s.settimeout(20)
            if s.recv(4) == b"SSH-":
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
"""


class SshdWatch:
    """Whether the guest's sshd has answered yet (it is asked from QEMU's start on)."""

    def __init__(self, azure):
        self.start = time.time()
        self.proc = subprocess.Popen(azure.inside(sys.executable, "-c", SSHD_PROBE, GUEST_IP), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.t_answered = None  # seconds from the watch's start until sshd's banner was seen
        self.last_refusal = None  # what ssh printed when the last login failed

    def answered(self):
        if self.t_answered is None and self.proc.poll() == 0:
            self.t_answered = round(time.time() - self.start, 1)
        return self.t_answered is not None

    def why_not(self):
        """Why no login came, in a few words, for a run's cause."""
        if self.t_answered is None:
            return "sshd never answered on port 22"
        said = (self.last_refusal or "").strip().splitlines()
        return f"sshd answered at {self.t_answered} s; the last login failed: {said[-1] if said else 'timed out'}"

    def login(self, azure, key, user, command):
        """`command` run over SSH as `user` once sshd has answered, else None; a refused
        login waits a second before the next is asked (each costs the guest a key exchange:
        an agent still writing the admin's key is not to be slowed more than a user's client
        would)."""
        if not self.answered():
            return None
        r = azure.ssh(key, user, GUEST_IP, command)
        if r is not None and r.returncode == 0:
            return r
        self.last_refusal = r.stderr if r is not None else None
        time.sleep(0.75)
        return None

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def ssh(azure, key, user, command, timeout=20):
    """`command` over SSH as `user`: the ssh that succeeded, or None."""
    r = azure.ssh(key, user, GUEST_IP, command, timeout)
    return r if r is not None and r.returncode == 0 else None


def power_off(azure, key, user, qemu, within=120):
    """Powers the VM off from inside; True once QEMU has exited. Asked again every 15 s: an sshd
    reloading to offer a new host key may drop the first asking."""
    give_up = time.time() + within
    while time.time() < give_up:
        ssh(azure, key, user, "sudo -n systemctl poweroff --no-block")
        try:
            qemu.wait(max(0.0, min(15.0, give_up - time.time())))
            return True
        except subprocess.TimeoutExpired:
            pass
    return False


def wait_for_late_host_key(console, start, timeout, qemu):
    """When azprov said on the console that it makes the RSA host key after the handover: the
    seconds from QEMU start until the fingerprint block that follows that line (the key is
    written by then), or None when it said no such thing or the block did not come in time."""
    later = "made after the handover"
    if later not in console_text(console):
        return None
    while time.time() - start < timeout and qemu.poll() is None:
        text = console_text(console)
        if FINGERPRINTS_END in text[text.index(later):]:
            return round(time.time() - start, 1)
        time.sleep(0.25)
    return None


def marked(out, key):
    return next((l[len(key) + 1:] for l in out.splitlines() if l.startswith(key + "=")), None)


# ---------------------------------------------------------------- the run
@dataclasses.dataclass
class Prepared:
    """What a try is made of before QEMU starts: the image and its overlay, the VM's shape,
    the admin's key and the provisioning CD."""
    image: str
    work: str
    fmt: str
    size: int
    disk_size: int
    overlay: str
    image_keys: object
    key: str
    key_pub: str
    custom: object
    cd: object
    accel: str
    cpus: int
    memory: int
    firmware: str


def prepare(a):
    """The image checked, its overlay (the OS disk), the key and the CD; a usage error for an
    image or a shape Azure would not take."""
    a.hostname = a.hostname or a.vm_name
    a.vm_id = str(uuid.uuid4())
    image = os.path.abspath(a.image)
    work = os.path.abspath(a.work) if a.work else tempfile.mkdtemp(prefix="azprov-try-")
    os.makedirs(work, exist_ok=True)
    fmt = image_format(image)
    if fmt not in ("raw", "qcow2", "vpc", "vhdx"):
        raise UsageError(f"{a.image}: a {fmt} image; Azure takes a fixed VHD (qcow2, raw and VHDX are tried too)")
    if a.gen == "2" and not os.path.exists(OVMF_CODE):
        raise UsageError(f"Gen2 needs OVMF ({OVMF_CODE}: apt-get install ovmf)")
    cpus, memory = VM_SIZES.get(a.vm_size, (2, 4096))
    cpus, memory = a.cpus or cpus, a.memory or memory
    accel = a.accel
    if accel == "auto":
        accel = "kvm" if kvm_usable() else "tcg"
    size = virtual_size(image, fmt)
    overlay = os.path.join(work, "os-disk.qcow2")
    create = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", image, "-F", fmt, overlay]
    if a.disk_size:
        create.append(a.disk_size)
    subprocess.run(create, check=True)
    disk_size = virtual_size(overlay, "qcow2")
    if disk_size < size:
        raise UsageError(f"--disk-size {a.disk_size} is smaller than the image ({size} bytes)")
    image_keys = image_host_keys(image, fmt, work)
    if a.ssh_key:
        key, key_pub = private_key(a.ssh_key), open(a.ssh_key).read().strip()
    else:
        key = os.path.join(work, "id_ed25519")
        if os.path.exists(key):
            os.remove(key)
            os.remove(key + ".pub")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "try-image", "-f", key], check=True)
        key_pub = open(key + ".pub").read().strip()
    custom = open(a.custom_data, "rb").read() if a.custom_data else None
    cd = None
    if not a.no_cd:
        ovf = ovf_env(a.hostname, a.user, keys=[key_pub], password=a.password, custom_data=custom,
                      disable_password=not a.password)
        cd = write_cd(work, ovf, custom)
    firmware = "UEFI, OVMF" if a.gen == "2" else "BIOS, SeaBIOS"
    return Prepared(image, work, fmt, size, disk_size, overlay, image_keys, key, key_pub, custom, cd, accel, cpus,
                    memory, firmware)


def first_result(a, p):
    """The report before the boot: what was tried, nothing seen yet."""
    return {"image": a.image, "format": p.fmt, "gen": int(a.gen), "firmware": p.firmware, "accel": p.accel,
            "cpus": p.cpus, "memory_mib": p.memory, "vm_id": a.vm_id, "user": a.user,
            "ready": False, "reason": None, "t_ready_s": None, "ssh": False, "t_ssh_s": None, "hostname": None,
            "hostname_expected": a.hostname, "key_login": False, "sudo": False, "host_keys": [],
            "host_keys_from_image": None, "console_log": os.path.join(p.work, "console.log"),
            "fabric_log": None, "requests": [], "cause": None, "ssh_only": a.ssh_only, "sshd": None,
            "upload": upload_problems(p.image, p.fmt), "azprov": None}


def watch(a, p, azure, qemu, start, result):
    """The boot watched until Ready (or NotReady) and the first login, or the timeout, a silent
    fabric, QEMU's end; then a #! script's outcome and, with --reboot, the power-off. Returns
    the login and azprov's status read after the boot (either None)."""
    progress = Progress(azure, start, a.quiet)
    progress.say(0.0, "QEMU started")
    sshd = SshdWatch(azure)
    login = status_out = None
    try:
        while time.time() - start < a.timeout and qemu.poll() is None:
            reqs = progress.poll()
            ready, reason, t = report_state(reqs, start)
            if ready is False:
                result["reason"], result["t_ready_s"] = reason, round(t, 1)
                break
            # leased and sshd up, yet nothing ever asked the fabric: no agent runs, and
            # waiting out the timeout would only say so later
            if not reqs and progress.leased and not a.ssh_only and sshd.answered() and \
                    time.time() - sshd.start - sshd.t_answered > SILENT_FABRIC:
                result["silent"] = round(time.time() - start, 1)
                break
            # the login is tried once sshd answers (an image may start sshd before it reports)
            if login is None:
                login = sshd.login(azure, p.key, a.user, LOGIN)
                if login is not None:
                    result["ssh"], result["t_ssh_s"] = True, round(time.time() - start, 1)
                    progress.say(result["t_ssh_s"], f"SSH: logged in as {a.user}@{GUEST_IP}")
            if login is not None and (ready or a.ssh_only):
                break
            time.sleep(0.25)
        # an image that takes SSH before it reports Ready: wait for the report too
        while result["ssh"] and not a.ssh_only and report_state(progress.poll(), start)[0] is None \
                and time.time() - start < a.timeout and qemu.poll() is None:
            time.sleep(1)
        progress.poll()
        # a #! custom data script runs once the boot has finished: its outcome then
        if login is not None and p.custom and p.custom.startswith(b"#!") and qemu.poll() is None:
            after = azure.ssh(p.key, a.user, GUEST_IP, STATUS_AFTER_BOOT, timeout=180)
            if after is not None and azprov_status(after.stdout) is not None:
                status_out = after.stdout
        if a.reboot and login is not None and qemu.poll() is None:
            # the reboot is a provisioned VM's: azprov's RSA host key, made after the
            # handover, is waited for (powered off sooner, the VM would make it again)
            t_rsa = wait_for_late_host_key(result["console_log"], start, a.timeout, qemu)
            if t_rsa is not None:
                result["t_rsa_s"] = t_rsa
                progress.say(t_rsa, "host keys: azprov's RSA key is in (made after the handover)")
            if not power_off(azure, p.key, a.user, qemu):
                progress.say(time.time() - start, "the VM did not power off within 120 s: QEMU killed")
    finally:
        sshd.close()
        if login is None:
            result["sshd"] = sshd.why_not()
        if qemu.poll() is None:
            qemu.kill()
        qemu.wait()
    return login, status_out


def login_findings(result, p, login, status_out):
    """What the first login found: the hostname, sudo, the host keys (and which are the
    image's), azprov's status."""
    result["hostname"] = marked(login.stdout, "HOSTNAME")
    result["key_login"] = True
    result["sudo"] = marked(login.stdout, "SUDO") == "yes"
    result["azprov"] = azprov_status(status_out or login.stdout)
    result["host_keys"] = [{"type": l.split()[-1].strip("()"), "fingerprint": l.split()[1]}
                           for l in login.stdout.splitlines() if l.endswith(")") and "SHA256:" in l]
    if p.image_keys is not None:
        result["host_keys_from_image"] = sorted(k["type"] for k in result["host_keys"]
                                                if k["fingerprint"] in p.image_keys)


def sayer(quiet):
    """A progress line to stderr, or nothing when `quiet`."""
    return (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def run(a):
    """One try: prepared, booted against a simulated Azure and watched, the report made."""
    p = prepare(a)
    fabric_args = ["--bump-after-goalstate", "1"] if a.incarnation_change else []
    say = sayer(a.quiet)
    say(f"try-image: {a.image} ({p.fmt}, {p.size / 2**30:.1f} GiB; OS disk {p.disk_size / 2**30:.1f} GiB on "
        f"{a.disk_bus}), Gen{a.gen}: {p.firmware}, {p.accel}, {p.cpus} vCPU, {p.memory} MiB; work: {p.work}")
    result = first_result(a, p)
    tag = f"t{os.getpid() % 1000}"
    with Azure(p.work, tag, imds_doc(a, p.key_pub), playbook(a), fabric_args=fabric_args) as azure:
        result["fabric_log"] = azure.fabric_log
        cmd = azure.inside(*qemu_command(a, p))
        with open(os.path.join(p.work, "qemu.cmd"), "w") as f:
            f.write(" ".join(cmd) + "\n")
        start = time.time()
        qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(p.work, "qemu.stderr"), "w"))
        login, status_out = watch(a, p, azure, qemu, start, result)
        first_requests = len(azure.requests())
        if a.reboot and login is not None:
            result["reboot"] = reboot(a, p, azure, first_requests)
        reqs = azure.requests()[:first_requests]
        ready, reason, t = report_state(reqs, start)
        result["ready"] = bool(ready)
        if ready is not None:
            result["reason"], result["t_ready_s"] = reason, round(t, 1)
        result["requests"] = request_rows(reqs, start)
    if login is not None:
        login_findings(result, p, login, status_out)
    result["cause"] = cause(result, a, qemu.returncode)
    if not a.keep_disk:
        os.remove(p.overlay)
    return result


def reboot(a, p, azure, before):
    """The second boot of the VM's disk: when SSH answered, and what reached the fabric (a
    provisioned reboot needs nothing from it)."""
    cmd = azure.inside(*qemu_command(a, p, console="console-reboot.log"))
    say = sayer(a.quiet)
    say("try-image: rebooting (powered off from inside, QEMU started again on the same disk)")
    start = time.time()
    qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(p.work, "qemu-reboot.stderr"), "w"))
    sshd = SshdWatch(azure)
    t_ssh = None
    try:
        while time.time() - start < a.timeout and qemu.poll() is None:
            if sshd.login(azure, p.key, a.user, "true") is not None:
                t_ssh = round(time.time() - start, 1)
                say(f"  {t_ssh:6.1f}s  SSH: logged in again")
                break
            time.sleep(0.25)
    finally:
        sshd.close()
        if qemu.poll() is None:
            qemu.kill()
        qemu.wait()
    reqs = azure.requests()[before:]
    return {"ssh": t_ssh is not None, "t_ssh_s": t_ssh, "sshd": None if t_ssh is not None else sshd.why_not(),
            "console_log": os.path.join(p.work, "console-reboot.log"), "requests": request_rows(reqs, start)}


def request_rows(reqs, start):
    """The fabric's log of `reqs` as the report lists them, timed from QEMU's `start`."""
    return [{"t_s": round(r["t"] - start, 2), "server": r["server"], "method": r["method"], "path": r["path"],
             "status": r.get("status"), **({"state": r.get("state")} if r.get("endpoint") == "health" else {})}
            for r in reqs]


def cause(r, a, qemu_rc):
    """None when the VM was reported Ready and the admin logged in (with --ssh-only: when the
    admin logged in; with --reboot: again after the reboot); else why not, in one line."""
    if "reboot" in r and not r["reboot"]["ssh"]:
        return (f"no SSH login within {a.timeout} s of the reboot: {r['reboot']['sshd']} "
                f"(console: {r['reboot']['console_log']})")
    if a.ssh_only:
        return None if r["ssh"] else (f"no SSH login as {a.user} within {a.timeout} s: {r['sshd']}"
                                      f"{exited(qemu_rc)} (console: {r['console_log']})")
    if r["ready"] is False and r["reason"]:
        return f"Azure was told {r['reason']}"
    if not r["ready"]:
        if r.get("silent"):
            return (f"the VM got a lease and its sshd answered, but in the {SILENT_FABRIC} s after nothing "
                    f"asked the fabric (no WireServer or IMDS request): no provisioning agent runs in the "
                    f"image, or it cannot reach 168.63.129.16 (ended at {r['silent']} s; console: "
                    f"{r['console_log']})")
        if qemu_rc not in (None, 0, -9):
            return f"QEMU exited with {qemu_rc} before any report (see {r['console_log']})"
        seen = {q["server"] for q in r["requests"]}
        if not r["requests"]:
            hint = "the image never reached the fabric: no agent ran, or it has no network"
        elif "wireserver" not in seen:
            hint = "the image asked IMDS but never the WireServer"
        else:
            hint = "no health report reached the WireServer"
        return f"no Ready within {a.timeout} s: {hint} (console: {r['console_log']})"
    if not r["ssh"]:
        return (f"Ready at {r['t_ready_s']} s, but no SSH login as {a.user} within {a.timeout} s: {r['sshd']}"
                f"{exited(qemu_rc)}")
    if r["hostname"] != a.hostname:
        return f"the hostname is {r['hostname']!r}, not {a.hostname!r}"
    seen = (r.get("azprov") or {}).get("vm_id")
    if seen and seen != r["vm_id"]:
        return f"azprov recorded the VM id {seen}, IMDS says {r['vm_id']}: the DMI UUID was read in the wrong byte order"
    if r["format"] == "vpc" and r["upload"]:
        return f"it provisions here, but Azure would refuse the VHD: {'; '.join(r['upload'])}"
    return None


def exited(qemu_rc):
    """What a cause adds when QEMU ended by itself (the guest powered off or QEMU failed)."""
    return "" if qemu_rc in (None, -9) else f"; QEMU exited with {qemu_rc}"


def print_report(r):
    out = [f"try-image: {r['image']}, Gen{r['gen']} ({r['firmware']}), {r['accel']}, {r['cpus']} vCPU, "
           f"{r['memory_mib']} MiB"]
    if r["ready"]:
        out.append(f"  Ready        at {r['t_ready_s']} s from QEMU start (acknowledged by the WireServer)")
    elif r["reason"]:
        out.append(f"  NotReady     at {r['t_ready_s']} s: {r['reason']}")
    else:
        out.append("  Ready        never reported")
    if r["ssh"]:
        keys = ", ".join(k["type"].lower() for k in r["host_keys"]) or "none listed"
        fresh = {None: "the image's own could not be read",
                 (): "none of them the image's"}.get(
            tuple(r["host_keys_from_image"]) if r["host_keys_from_image"] is not None else None,
            f"the image's own: {', '.join(r['host_keys_from_image'] or [])}")
        out.append(f"  SSH          at {r['t_ssh_s']} s as {r['user']}@{GUEST_IP} with the key: hostname "
                   f"{r['hostname']}, sudo {'works' if r['sudo'] else 'refused'}")
        out.append(f"  host keys    {keys}; {fresh}")
        if r.get("t_rsa_s") is not None:
            out.append(f"               and rsa at {r['t_rsa_s']} s (azprov made it after the handover)")
    else:
        out.append("  SSH          no login")
    counts = {}
    for q in r["requests"]:
        name = q["path"].split("?")[0] if q["server"] != "wireserver" else \
            (re.search(r"comp=(\w+)", q["path"]) or re.search(r"()", "")).group(1) or q["path"]
        counts[f"{q['server']} {name}"] = counts.get(f"{q['server']} {name}", 0) + 1
    out.append(f"  requests     {len(r['requests'])}: " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    if "reboot" in r:
        b = r["reboot"]
        out.append(f"  reboot       SSH at {b['t_ssh_s']} s from QEMU start; {len(b['requests'])} fabric request(s)"
                   if b["ssh"] else "  reboot       no SSH login")
    if r.get("azprov"):
        az = r["azprov"]
        same = "IMDS's" if az["vm_id"] == r["vm_id"] else f"not IMDS's {r['vm_id']}"
        ran = "; ".join(f"{k}: {'exit ' + str(v.get('exit')) if v.get('exit') is not None else 'not finished'}"
                        for k, v in sorted((az.get("scripts") or {}).items())) or "none ran"
        out.append(f"  azprov       VM id {az['vm_id']} ({same}); custom data scripts: {ran}")
    out.append("  upload       " + ("a fixed VHD Azure takes" if not r["upload"] else "; ".join(r["upload"])))
    out.append(f"  console log  {r['console_log']}")
    out.append(f"  fabric log   {r['fabric_log']} (every request, one JSON line each)")
    good = "SSH" if r.get("ssh_only") else "provisioned: Ready and SSH"
    out.append("result: " + (good if r["cause"] is None else f"FAILED: {r['cause']}"))
    print("\n".join(out), flush=True)


def main(argv=None):
    try:
        a = parse_args(argv if argv is not None else sys.argv[1:])
        if os.geteuid() != 0:
            raise UsageError("needs root (a network namespace and a tap device for the simulated Azure)")
        r = run(a)
    except UsageError as e:
        print(f"try-image: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print_report(r)
    if r["cause"] is not None:
        print(f"try-image: {r['cause']}", file=sys.stderr)
        return 1
    return 0


def command():
    """scripts/try-image: a SIGTERM (timeout, kill) unwinds like ^C: QEMU, the fabric and its
    namespace are stopped and the work files removed by the same finally blocks."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
