"""The QEMU harness, importable (`import harness` with qemu-tests/ on the path): the simulated
fabric (`Fabric`, a context manager), the images and the boots, and the QEMU end-to-end tests: a Debian cloud kernel, an initramfs from scripts/mkinitramfs with
azprov as /init, a UDF provisioning CD, an ext4 root whose init reports what it finds, and the
simulated fabric reached over a tap device in a network namespace (dnsmasq with options 121 and
245, fabric.py on 168.63.129.16:80 and 169.254.169.254:80).

  qemu-tests/run [SCENARIO...]      (all scenarios when none is named; needs root)

QEMU_TESTS_APPEND adds kernel parameters to every boot (e.g. azprov.log=debug).

TCG only, unless a trial boot proves KVM works (on these machines /dev/kvm is a software
nested hypervisor that cannot boot a stock kernel). Two scenarios run at a time. Each prints
pass/fail and the time from QEMU start to the fabric receiving Ready.
"""
import base64
import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
# Downloaded kernels (and qemu-tests/distro's Debian roots) live outside the clone, keyed by
# what they contain, so a fresh clone reuses them.
CACHE = os.environ.get("AZPROV_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "azprov")
OUT = os.path.join(HERE, "out")
FIXTURES = os.path.join(TOP, "tests", "fixtures")
ROOT_UUID = "6f0c2a4e-1b3d-4c5e-8f70-9a1b2c3d4e5f"
# QEMU's SMBIOS UUID; on -M pc (no EFI) azprov byte-swaps the first three fields (Gen1 rule).
DMI_UUID = "78563412-ab90-efcd-1234-567890abcdef"
VM_ID = "12345678-90ab-cdef-1234-567890abcdef"
VM_TIMEOUT = 150
# What Azure puts into the DMI chassis asset tag; without it azprov does nothing.
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
# The guest's NIC: a MAC from Azure's range and the address Azure gives a subnet's first VM;
# dnsmasq binds the one to the other, and IMDS lists both as the VM's interface.
GUEST_MAC = "00:0d:3a:12:34:56"
GUEST_IP = "10.44.0.4"
# the lines azprov frames its host key fingerprints with on the console (hostkeys::BEGIN, ::END),
# as cloud-init and waagent do for Azure's serial console
FINGERPRINTS_BEGIN = "-----BEGIN SSH HOST KEY FINGERPRINTS-----"
FINGERPRINTS_END = "-----END SSH HOST KEY FINGERPRINTS-----"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl e2e@test"


def azure_dhcp_options(gateway):
    """tests/fixtures/azure-dhcp-options (the one definition) with the router filled in."""
    with open(os.path.join(HERE, "..", "tests", "fixtures", "azure-dhcp-options")) as f:
        return [l.strip().replace("GATEWAY", gateway) for l in f
                if l.strip() and not l.startswith("#")]


def sh(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- kernel and images
def fetch_deb(pkg, arch="amd64"):
    """Downloads and unpacks Debian package `pkg` once into the cache; its directory."""
    os.makedirs(CACHE, exist_ok=True)
    qualified = pkg if arch == "amd64" else f"{pkg}:{arch}"
    ver = subprocess.run(["apt-cache", "show", "--no-all-versions", qualified], capture_output=True, text=True,
                         check=True).stdout
    version = next(l.split(None, 1)[1].strip() for l in ver.splitlines() if l.startswith("Version:"))
    d = os.path.join(CACHE, f"{pkg}_{version}_{arch}".replace(":", "_"))
    if not os.path.isdir(d):
        tmp = d + ".dl"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        sh("apt-get", "download", "-q", qualified, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deb = [f for f in os.listdir(tmp) if f.endswith(".deb")][0]
        sh("dpkg-deb", "-x", os.path.join(tmp, deb), tmp + "/x")
        os.rename(tmp + "/x", d)
        shutil.rmtree(tmp)
    return d


def kernel(arch="amd64"):
    """Resolves linux-image-cloud-ARCH to its ABI package, fetches and unpacks it once."""
    meta = f"linux-image-cloud-{arch}" + ("" if arch == "amd64" else f":{arch}")
    dep = subprocess.run(["apt-cache", "depends", meta], capture_output=True, text=True, check=True).stdout
    pkg = next(l.split()[1].split(":")[0] for l in dep.splitlines()
               if l.strip().startswith("Depends: linux-image-") and l.split()[1][12:13].isdigit())
    kdir = fetch_deb(pkg, arch)
    kver = os.listdir(os.path.join(kdir, "lib", "modules"))[0]
    if not os.path.exists(os.path.join(kdir, "lib", "modules", kver, "modules.dep")):
        sh("depmod", "-b", kdir, kver)
    return os.path.join(kdir, "boot", f"vmlinuz-{kver}"), os.path.join(kdir, "lib", "modules", kver)


def xfs_protofile(tree, out):
    """mkfs.xfs's protofile (-p) for `tree`: each entry's name, type and mode, owner, and the
    source file or link target; a directory's entries end with `$`. Keeps modes and owners,
    so no loop mount is needed."""
    def spec(path):
        st = os.lstat(path)
        kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "-"
        mode = (kind + ("u" if st.st_mode & stat.S_ISUID else "-") + ("g" if st.st_mode & stat.S_ISGID else "-")
                + "%03o" % (st.st_mode & 0o777))
        return f"{mode} {st.st_uid} {st.st_gid}"

    lines = ["/dev/null", "0 0", spec(tree)]

    def walk(d, depth):
        for name in sorted(os.listdir(d)):
            path = os.path.join(d, name)
            line = " " * depth + f"{name} {spec(path)}"
            if os.path.islink(path):
                lines.append(f"{line} {os.readlink(path)}")
            elif os.path.isdir(path):
                lines.append(line)
                walk(path, depth + 1)
                lines.append(" " * depth + "$")
            else:
                lines.append(f"{line} {path}")

    walk(tree, 1)
    lines.append("$")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


def make_root(work, name="root.img", busybox=None, fs="ext4", size="48M", block=None):
    """An ext4 (or xfs, or btrfs) root made from the Debian-like fixture tree, with busybox (the host's,
    or `busybox` for another architecture) and the test init; an ext4 of `size`, with mke2fs's
    defaults for that size (1 KiB blocks for the 48 MiB default, 4 KiB from 512 MiB up) unless
    `block` says (a 4Kn disk needs blocks of at least 4 KiB)."""
    tree = os.path.join(work, "roottree")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(os.path.join(FIXTURES, "root"), tree, symlinks=True)
    for d in ("proc", "sys", "dev", "run", "tmp", "sbin", "root"):
        os.makedirs(os.path.join(tree, d), exist_ok=True)
    shutil.copy(busybox or shutil.which("busybox") or "/bin/busybox", os.path.join(tree, "bin", "busybox"))
    os.remove(os.path.join(tree, "bin", "bash"))
    for tool in ("sh", "cat", "wc", "cut", "tr", "grep", "ip", "mount"):
        os.symlink("busybox", os.path.join(tree, "bin", tool))
    os.symlink("/bin/sh", os.path.join(tree, "bin", "bash"))
    shutil.copy(os.path.join(HERE, "test-init"), os.path.join(tree, "sbin", "init"))
    os.chmod(os.path.join(tree, "sbin", "init"), 0o755)
    for f in ("etc/shadow", "etc/gshadow"):
        os.chown(os.path.join(tree, f), 0, 42)
        os.chmod(os.path.join(tree, f), 0o640)
    img = os.path.join(work, name)
    if fs == "xfs":
        # xfsprogs 6.1 refuses a filesystem under 300 MB; the file is sparse
        proto = os.path.join(work, "root.proto")
        xfs_protofile(tree, proto)
        with open(img, "wb") as f:
            f.truncate(320 << 20)
        sh("mkfs.xfs", "-q", "-f", "-L", "azroot", "-m", f"uuid={ROOT_UUID}", "-p", proto, img,
           stdout=subprocess.DEVNULL)
    elif fs == "btrfs":
        with open(img, "wb") as f:
            f.truncate(160 << 20)
        sh("mkfs.btrfs", "-q", "-f", "-L", "azroot", "-U", ROOT_UUID, "--rootdir", tree, img,
           stdout=subprocess.DEVNULL)
    else:
        sh("mkfs.ext4", "-q", "-F", "-L", "azroot", "-U", ROOT_UUID, "-E", "root_owner=0:0", "-d", tree,
           *(["-b", str(block)] if block else []), img, size, stdout=subprocess.DEVNULL)
    shutil.rmtree(tree)
    return img


def make_cd(work, hostname, fs="udf"):
    """The provisioning CD: UDF as Azure's, or iso9660 (Rock Ridge) as Azure Stack's may be."""
    with open(os.path.join(FIXTURES, "ovf", "wala.xml")) as f:
        ovf = f.read().replace("vm-wala", hostname)
    return write_cd(work, ovf, fs=fs)


def imds_interface(mac=GUEST_MAC, ip=GUEST_IP):
    """IMDS's network.interface for the guest's NIC: MAC upper-case without colons, every
    value a string."""
    return [{"ipv4": {"ipAddress": [{"privateIpAddress": ip, "publicIpAddress": ""}],
                      "subnet": [{"address": "10.44.0.0", "prefix": "24"}]},
             "ipv6": {"ipAddress": []},
             "macAddress": mac.replace(":", "").upper()}]


def ovf_env(hostname, user, keys=(), password=None, custom_data=None, disable_password=True):
    """ovf-env.xml as Azure writes it to the provisioning CD: the provisioning section with the
    keys inline (Value; Azure's Fingerprint needs the goal state's certificates) and the
    PlatformSettingsSection Azure always sends (cloud-init refuses an OVF without it)."""
    keys_xml = "".join(
        "<PublicKey><Fingerprint>{fp}</Fingerprint><Path>/home/{user}/.ssh/authorized_keys</Path>"
        "<Value>{key}</Value></PublicKey>".format(
            fp=hashlib.sha1(k.encode()).hexdigest().upper(), user=escape(user), key=escape(k.strip()))
        for k in keys)
    pw = f"<UserPassword>{escape(password)}</UserPassword>" if password else ""
    custom = f"<CustomData>{base64.b64encode(custom_data).decode()}</CustomData>" if custom_data else ""
    return f"""<?xml version="1.0" encoding="utf-8"?>
<Environment xmlns="http://schemas.dmtf.org/ovf/environment/1" xmlns:oe="http://schemas.dmtf.org/ovf/environment/1" xmlns:wa="http://schemas.microsoft.com/windowsazure" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">
  <wa:ProvisioningSection>
    <wa:Version>1.0</wa:Version>
    <LinuxProvisioningConfigurationSet xmlns="http://schemas.microsoft.com/windowsazure" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">
      <ConfigurationSetType>LinuxProvisioningConfiguration</ConfigurationSetType>
      <HostName>{escape(hostname)}</HostName>
      <UserName>{escape(user)}</UserName>
      {pw}
      <DisableSshPasswordAuthentication>{"true" if disable_password else "false"}</DisableSshPasswordAuthentication>
      <SSH><PublicKeys>{keys_xml}</PublicKeys></SSH>
      {custom}
    </LinuxProvisioningConfigurationSet>
  </wa:ProvisioningSection>
  <wa:PlatformSettingsSection>
    <wa:Version>1.0</wa:Version>
    <PlatformSettings xmlns="http://schemas.microsoft.com/windowsazure" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">
      <KmsServerHostname>kms.core.windows.net</KmsServerHostname>
      <ProvisionGuestAgent>true</ProvisionGuestAgent>
      <GuestAgentPackageName i:nil="true" />
      <RetainWindowsPEPassInUnattend>true</RetainWindowsPEPassInUnattend>
      <RetainOfflineServicingPassInUnattend>true</RetainOfflineServicingPassInUnattend>
      <PreprovisionedVm>false</PreprovisionedVm>
      <PreprovisionedVMType>None</PreprovisionedVMType>
      <EnableTrustedImageIdentifier>false</EnableTrustedImageIdentifier>
    </PlatformSettings>
  </wa:PlatformSettingsSection>
</Environment>
"""


def write_cd(work, ovf, custom_data=None, fs="udf"):
    """The provisioning CD as Azure makes it: UDF (or iso9660 with Rock Ridge), volume
    rd_rdfe_stable, ovf-env.xml and, with custom data, /CustomData.bin (the raw bytes, as
    Ignition reads them)."""
    d = os.path.join(work, "cd")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "ovf-env.xml"), "w") as f:
        f.write(ovf)
    if custom_data:
        with open(os.path.join(d, "CustomData.bin"), "wb") as f:
            f.write(custom_data)
    iso = os.path.join(work, "cd.iso")
    kind = ["-udf"] if fs == "udf" else ["-R"]
    sh("genisoimage", "-quiet", "-o", iso, *kind, "-V", "rd_rdfe_stable", "-input-charset", "utf-8", d)
    return iso


def imds_doc(computer, has_custom_data=True):
    """IMDS's document; `has_custom_data` as Azure sets it when the VM was given custom data
    (the CD of make_cd has some)."""
    return {
        "compute": {"location": "westeurope", "name": computer, "vmSize": "Standard_B1s",
                    "osProfile": {"adminUsername": "azureuser", "computerName": computer,
                                  "disablePasswordAuthentication": "true"},
                    "publicKeys": [{"keyData": KEY + "\r\n", "path": "/home/azureuser/.ssh/authorized_keys"}],
                    "userData": "", "customData": "", "vmId": VM_ID},
        "network": {"interface": imds_interface()},
        "extended": {"compute": {"hasCustomData": has_custom_data, "ppsType": "None"}},
    }


GRUB_MODULES = ["part_gpt", "part_msdos", "ext2", "normal", "linux", "search", "search_fs_uuid", "configfile",
                "echo", "test", "serial", "terminal", "gzio", "boot"]
BIOS_BOOT, ESP, LINUX_FS = ("21686148-6449-6E6F-744E-656564454649", "C12A7328-F81F-11D2-BA4B-00A0C93EC93B",
                            "0FC63DAF-8483-4772-8E79-3D69D8477DE4")


def bootable_disk(work, root_img, kver, initrd, out, append):
    """An image as an image builder uploads it, bootable by BIOS and UEFI through GRUB, as
    Debian's cloud images are: GPT with a BIOS boot partition (GRUB's core), an EFI system
    partition (BOOTX64.EFI) and the root last. `root_img` is an ext4 image (UUID ROOT_UUID)
    that holds /boot/vmlinuz-KVER and /boot/initrd.img-KVER (replaced by `initrd` when given);
    a grub.cfg booting them with `append` is written into a copy of it. GRUB comes from the host's grub-pc-bin and grub-efi-amd64-bin,
    installed without grub-install (which needs a block device): boot.img's first 440 bytes
    go to the MBR pointing at the core, the core's first sector points at its second."""
    os.makedirs(work, exist_ok=True)
    root = os.path.join(work, "root-boot.img")
    sh("cp", "--sparse=always", root_img, root)
    cfg = os.path.join(work, "grub.cfg")
    with open(cfg, "w") as f:
        f.write("serial --unit=0 --speed=115200\nterminal_input serial console\nterminal_output serial console\n"
                "set timeout=0\nset default=0\n"
                f"menuentry 'Debian GNU/Linux' {{\n  search --no-floppy --fs-uuid --set=root {ROOT_UUID}\n"
                f"  linux /boot/vmlinuz-{kver} root=UUID={ROOT_UUID} ro {append}\n"
                f"  initrd /boot/initrd.img-{kver}\n}}\n")
    cmds = ["mkdir /boot/grub", f"write {cfg} /boot/grub/grub.cfg"]
    if initrd:  # else the root's own
        cmds += [f"rm /boot/initrd.img-{kver}", f"write {initrd} /boot/initrd.img-{kver}"]
    for cmd in cmds:
        subprocess.run(["debugfs", "-w", "-R", cmd, root], capture_output=True, check=False)
    if debugfs_cat(root, "/boot/grub/grub.cfg") is None:
        raise RuntimeError("bootable_disk: could not write /boot/grub/grub.cfg into the root image")
    early = os.path.join(work, "early.cfg")
    with open(early, "w") as f:
        f.write(f"search --no-floppy --fs-uuid --set=root {ROOT_UUID}\nset prefix=($root)/boot/grub\n")
    core, efi = os.path.join(work, "core.img"), os.path.join(work, "BOOTX64.EFI")
    sh("grub-mkimage", "-O", "i386-pc", "-o", core, "-c", early, "-p", "/boot/grub", "biosdisk", *GRUB_MODULES)
    sh("grub-mkimage", "-O", "x86_64-efi", "-o", efi, "-c", early, "-p", "/boot/grub", "fat", "efi_gop",
       "all_video", *GRUB_MODULES)
    esp = os.path.join(work, "esp.img")
    if os.path.exists(esp):
        os.remove(esp)
    sh("mkfs.vfat", "-C", "-n", "ESP", esp, str(16 * 1024), stdout=subprocess.DEVNULL)
    sh("mmd", "-i", esp, "::/EFI", "::/EFI/BOOT")
    sh("mcopy", "-i", esp, efi, "::/EFI/BOOT/BOOTX64.EFI")
    # sectors: the core at 2048 (1 MiB), the ESP at 4096 (16 MiB), the root from 36864 to the end
    root_sectors = os.path.getsize(root) // 512
    total = (36864 + root_sectors + 34 + 2047) // 2048 * 2048
    if os.path.exists(out):
        os.remove(out)
    with open(out, "wb") as f:
        f.truncate(total * 512)
    table = (f"label: gpt\nfirst-lba: 34\nstart=2048, size=2048, type={BIOS_BOOT}, name=bios\n"
             f"start=4096, size=32768, type={ESP}, name=esp\n"
             f"start=36864, size={root_sectors}, type={LINUX_FS}, name=root\n")
    sh("sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", out, input=table.encode(), stdout=subprocess.DEVNULL)
    for src, sector in ((esp, 4096), (root, 36864)):
        sh("dd", f"if={src}", f"of={out}", "bs=1M", "conv=notrunc,sparse", "oflag=seek_bytes", f"seek={sector * 512}",
           "status=none")
    with open(core, "rb") as f:
        core_img = bytearray(f.read())
    if len(core_img) > 2048 * 512:
        raise RuntimeError(f"bootable_disk: GRUB's core is {len(core_img)} bytes, more than its 1 MiB partition")
    # diskboot's first blocklist (the last 12 bytes of the core's first sector): the sector
    # the rest of the core starts at; grub-mkimage filled in its length
    core_img[0x1F4:0x1FC] = (2048 + 1).to_bytes(8, "little")
    with open("/usr/lib/grub/i386-pc/boot.img", "rb") as f:
        boot_img = bytearray(f.read())
    # boot.img's kernel_sector: where the core starts
    boot_img[0x5C:0x64] = (2048).to_bytes(8, "little")
    with open(out, "r+b") as f:
        f.seek(0)
        f.write(boot_img[:440])  # the protective MBR's partition entries and signature stay
        f.seek(2048 * 512)
        f.write(core_img)
    os.remove(root)
    os.remove(esp)
    return out


def debugfs_cat(img, path):
    r = subprocess.run(["debugfs", "-R", f"cat {path}", img], capture_output=True, text=True, check=False)
    return r.stdout if r.returncode == 0 and "File not found" not in r.stderr else None


# ---------------------------------------------------------------- network namespace
class Fabric:
    """A namespace with tap0 for the guest, dnsmasq and the mock fabric."""

    def __init__(self, work, tag, doc, playbook=(), option245=True, fabric_args=()):
        self.ns = f"azq{os.getpid() % 10000}{tag}"
        self.work = work
        self.procs = []
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL, check=False)
        sh("ip", "netns", "add", self.ns)
        ip = lambda *a: sh("ip", "-n", self.ns, *a)
        ip("link", "set", "lo", "up")
        ip("addr", "add", "168.63.129.16/32", "dev", "lo")
        ip("addr", "add", "169.254.169.254/32", "dev", "lo")
        ip("tuntap", "add", "dev", "tap0", "mode", "tap")
        ip("addr", "add", "10.44.0.1/24", "dev", "tap0")
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
        fab = subprocess.Popen(["ip", "netns", "exec", self.ns, "python3", os.path.join(HERE, "fabric.py"),
                                "--log", self.fabric_log, "--imds-doc", os.path.join(work, "imds.json"),
                                "--playbook", os.path.join(work, "playbook.json"), "--vm-address", GUEST_IP,
                                *fabric_args],
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.procs.append(fab)
        assert fab.stdout.readline() == b"fabric ready\n"
        args = ["ip", "netns", "exec", self.ns, "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
                "--port=0", "--interface=tap0", "--bind-interfaces", "--user=root", "--no-ping",
                "--dhcp-authoritative", "--log-dhcp", f"--log-facility={self.dnsmasq_log}",
                f"--dhcp-leasefile={work}/dnsmasq.leases", f"--pid-file={work}/dnsmasq.pid",
                "--dhcp-range=10.44.0.10,10.44.0.50,255.255.255.0,infinite",
                f"--dhcp-host={GUEST_MAC},{GUEST_IP}"]
        # Azure's DHCP sends every option unasked (option 245 too, which few clients ask for)
        args += ["--dhcp-option-force=" + o for o in azure_dhcp_options("10.44.0.1")
                 if option245 or not o.startswith("245,")]
        self.procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL))
        for _ in range(200):
            if os.path.exists(self.dnsmasq_log) and "DHCP, IP range" in open(self.dnsmasq_log).read():
                break
            time.sleep(0.02)

    def requests(self):
        if not os.path.exists(self.fabric_log):
            return []
        with open(self.fabric_log) as f:
            return [json.loads(l) for l in f if l.strip()]

    def dhcp_discovers(self):
        return open(self.dnsmasq_log).read().count("DHCPDISCOVER") if os.path.exists(self.dnsmasq_log) else 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL, check=False)


# ---------------------------------------------------------------- QEMU
def qemu_args(shape, kernel_img, initrd, root_img, cd, append, accel, azure=True, mem="384", disk_blockdev=None,
              nic="virtio-net-pci"):
    a = ["qemu-system-x86_64", "-accel", accel, "-m", mem, "-smp", "1", "-nodefaults", "-display", "none",
         "-no-reboot", "-uuid", DMI_UUID, "-kernel", kernel_img, "-initrd", initrd, "-append", append,
         "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", f"{nic},netdev=n0,mac={GUEST_MAC}"]
    # a .qcow2 root is an overlay on a shared raw image (qemu-tests/distro)
    fmt = "qcow2" if root_img and root_img.endswith(".qcow2") else "raw"
    if azure:
        a += ["-smbios", f"type=3,asset={AZURE_ASSET_TAG}"]
    if shape == "gen1":
        a += ["-M", "pc", "-drive", f"file={root_img},format={fmt},if=virtio"]
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


def boot(fabric, work, shape, kernel_img, initrd, root_img, cd, extra_append="", accel="tcg", timeout=VM_TIMEOUT,
         azure=True, qemu_extra=(), nic="virtio-net-pci"):
    append = kernel_append(shape, extra_append)
    console = os.path.join(work, "console.log")
    cmd = ["ip", "netns", "exec", fabric.ns, "timeout", str(timeout)] + \
        qemu_args(shape, kernel_img, initrd, root_img, cd, append, accel, azure, nic=nic) + \
        ["-serial", f"file:{console}"] + list(qemu_extra)
    start = time.time()
    rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    took = time.time() - start
    out = console_text(console)
    if rc.returncode not in (0,):
        out += f"\n[qemu rc={rc.returncode}] {rc.stderr}"
    return start, took, out, rc.returncode


def qmp_status(sock):
    """The VM's run state from QEMU's QMP socket (e.g. "running", "io-error"), or None."""
    import socket
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


def boot_cut(fabric, work, kernel_img, initrd, disk, cd, sector=None, console_mark=None, timeout=VM_TIMEOUT,
             torn=False):
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
    cmd = ["ip", "netns", "exec", fabric.ns] + \
        qemu_args("gen2", kernel_img, initrd, None, cd, kernel_append("gen2"), "tcg", disk_blockdev=node) + \
        ["-serial", f"file:{console}", "-qmp", f"unix:{sock},server=on,wait=off"]
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


def gpt_primary(disk):
    """The primary GPT as the kernel reads it (header and array CRCs checked): the last LBA of
    partition 1 and the alternate header's LBA, or None when it is not sound."""
    import zlib
    with open(disk, "rb") as f:
        f.seek(512)
        hdr = f.read(512)
        if hdr[:8] != b"EFI PART":
            return None
        size = int.from_bytes(hdr[12:16], "little")
        check = bytearray(hdr[:size])
        check[16:20] = b"\0\0\0\0"
        if zlib.crc32(check) != int.from_bytes(hdr[16:20], "little"):
            return None
        lba, count, esize = (int.from_bytes(hdr[72:80], "little"), int.from_bytes(hdr[80:84], "little"),
                             int.from_bytes(hdr[84:88], "little"))
        f.seek(lba * 512)
        entries = f.read(count * esize)
        if zlib.crc32(entries) != int.from_bytes(hdr[88:92], "little"):
            return None
        return int.from_bytes(entries[40:48], "little"), int.from_bytes(hdr[32:40], "little")


def ext4_clean(work, disk, start_mib=1):
    """e2fsck of the partition at `start_mib` of `disk` (a sparse copy, its journal replayed
    first, as the kernel does at mount): its exit status and output."""
    part = os.path.join(work, "fsck.img")
    sh("dd", f"if={disk}", f"of={part}", "bs=1M", f"skip={start_mib}", "conv=sparse", "status=none")
    subprocess.run(["e2fsck", "-E", "journal_only", "-y", part], capture_output=True, check=False)
    r = subprocess.run(["e2fsck", "-fn", part], capture_output=True, text=True, check=False)
    os.remove(part)
    return r.returncode, r.stdout + r.stderr


def ready_after(fabric, start):
    for r in fabric.requests():
        if r.get("endpoint") == "health" and r.get("state") == "Ready" and r.get("status") == 200:
            return r["t"] - start
    return None


# ---------------------------------------------------------------- scenarios
class Check:
    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        if not ok:
            self.failures.append(what)


def scenario_happy(ctx, shape, hostname, with_cd=True, playbook=(), option245=True, extra="", fs="ext4",
                   cd_fs="udf"):
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc(hostname, has_custom_data=with_cd), playbook, option245)
    try:
        root = make_root(work, fs=fs)
        cd = make_cd(work, hostname + "-ovf", cd_fs) if with_cd else None
        start, took, out, rc = boot(fabric, work, shape, ctx["kernel"], ctx["initrd"], root, cd, extra, ctx["accel"])
        return fabric, root, start, took, out, rc
    except BaseException:
        fabric.close()
        raise


def common_checks(c, fabric, root, out, rc, hostname):
    c(rc == 0, f"qemu exit code {rc}")
    c("REALROOT-DONE" in out, "the real root's init did not run to the end")
    c(f"hostname={hostname}" in out, f"the real root does not see hostname {hostname}")
    c(debugfs_cat(root, "/etc/hostname") == hostname + "\n", "/etc/hostname on the disk")
    keys = debugfs_cat(root, "/home/azureuser/.ssh/authorized_keys") or ""
    c(KEY in keys, "the IMDS key is not in authorized_keys")
    c("REALROOT ipv4=0" in out, "the network was not torn down before handover")
    c("REALROOT modparams scan=async" in out, "scsi_mod's scan mode was not put back to async before handover")
    boot_log = debugfs_cat(root, "/var/log/azprov.log") or ""
    c("modules:" in boot_log and "report:" in boot_log, "/var/log/azprov.log lacks the boot's stages")
    c("S3cr3t" not in boot_log and "S3cr3t" not in out, "the password leaked into a log")
    # ed25519 and ECDSA before the handover; RSA after it, by a process that outlives it, with
    # a last block listing all three (unless its search had ended before the handover)
    blocks = [b.split(FINGERPRINTS_END)[0] for b in out.split(FINGERPRINTS_BEGIN + "\n")[1:]]
    c(bool(blocks) and "(ED25519)" in blocks[0] and "(ECDSA)" in blocks[0],
      "no fingerprint block with the ed25519 and ecdsa keys before the handover")
    c(bool(blocks) and blocks[-1].count(f"root@{hostname} (") == 3, "no fingerprint block with all three keys")
    c("REALROOT rsa=yes" in out, "the rsa host key never reached the real root")
    c("REALROOT rsa-pending" not in out or ("(RSA)" in out and out.index("REALROOT-INIT") < out.rindex("(RSA)")),
      "the rsa key's fingerprint did not follow the real init's start")
    pub = debugfs_cat(root, "/etc/ssh/ssh_host_ed25519_key.pub") or ""
    c(pub.startswith("ssh-ed25519 ") and pub.endswith(f" root@{hostname}\n"), "no new ed25519 host key in the root")
    c("PRIVATE KEY" not in out and "PRIVATE KEY" not in boot_log, "a private host key reached a log")
    posts = [r for r in fabric.requests() if r.get("endpoint") == "health"]
    c(any(p.get("state") == "Ready" and p.get("status") == 200 for p in posts), f"no Ready reached the fabric: {posts}")


def run_gen1(ctx):
    c = Check()
    fabric, root, start, took, out, rc = scenario_happy(ctx, "gen1", "e2e-gen1")
    try:
        common_checks(c, fabric, root, out, rc, "e2e-gen1")
        c("ovf-env.xml read from /dev/sr0 (udf)" in out, "the IDE CD was not read as udf")
        # isofs waits for a CD without UDF (no-option-245's)
        c(" for iso9660" not in out and "isofs" not in out, "isofs was loaded for a UDF CD")
        # only the drivers of this VM's devices: no Hyper-V under QEMU, no virtio-scsi here
        c("hv_vmbus (not Hyper-V)" in out and "pci_hyperv (not Hyper-V)" in out
          and "virtio_scsi (no device)" in out, "hv_vmbus, pci_hyperv or virtio_scsi was not left out")
        swapped = "12345678-90ab-cdef-1234-567890abcdef"
        c((debugfs_cat(root, "/var/lib/azprov/provisioned") or "").strip() == swapped, "marker holds the Gen1-swapped DMI id")
        # the VM id azprov reported and recorded is IMDS's, which the swapped DMI id must equal
        c(f"vmId {swapped}" in out, "IMDS's vmId was not logged as the Gen1-swapped DMI id")
        ctx["gen1_root"] = root
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_gen2(ctx):
    c = Check()
    # a module parameter on the command line reaches the module, as modprobe would pass it
    fabric, root, start, took, out, rc = scenario_happy(ctx, "gen2", "e2e-gen2", extra="virtio_net.csum=0")
    try:
        common_checks(c, fabric, root, out, rc, "e2e-gen2")
        c(" csum=N" in out, "virtio_net.csum=0 on the command line did not reach virtio_net")
        c(f"UUID={ROOT_UUID} is /dev/sda" in out, "root=UUID= did not resolve to the SCSI disk")
        c("ovf-env.xml read from /dev/sr0 (udf)" in out, "the SCSI CD was not read")
        # q35 has no PIIX IDE (its SATA is AHCI) and no virtio-blk: their drivers stay out
        c("ata_piix (no device)" in out and "libata (only skipped modules need it)" in out
          and "virtio_blk (no device)" in out, "ata_piix, libata or virtio_blk was not left out")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_xfs_root(ctx):
    """A RHEL-family layout: the root on xfs, found by UUID on the Gen2 SCSI disk. xfs is one
    of the modules the initramfs keeps LZ4-compressed (.ko.lz4): azprov decompresses it and
    loads it once the superblock says xfs. The root is read back through the real init's
    console lines (debugfs reads only ext4)."""
    c = Check()
    fabric, _root, start, took, out, rc = scenario_happy(ctx, "gen2", "e2e-xfs", fs="xfs")
    try:
        c(rc == 0, f"qemu exit code {rc}")
        c(f"UUID={ROOT_UUID} is /dev/sda (xfs)" in out, "root=UUID= did not find the xfs root")
        fs_line = next((l for l in out.splitlines() if "for the root filesystem" in l), "")
        c(fs_line.endswith(": libcrc32c xfs for the root filesystem"), f"not exactly xfs for the root: {fs_line!r}")
        c("hostname=e2e-xfs" in out, "the real root does not see the hostname")
        # SeaBIOS, as on Gen1: the DMI id byte-swapped
        c("REALROOT marker=12345678-90ab-cdef-1234-567890abcdef" in out, "no provisioned marker in the xfs root")
        c("REALROOT keys /home/azureuser=2" in out, "the OVF and IMDS keys are not in the xfs root")
        c("REALROOT-DONE" in out, "the real root's init did not run to the end")
        c("S3cr3t" not in out, "the password leaked into the console")
        posts = [r for r in fabric.requests() if r.get("endpoint") == "health"]
        c(any(p.get("state") == "Ready" and p.get("status") == 200 for p in posts), f"no Ready: {posts}")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_second_boot(ctx):
    """Boots a provisioned disk again: no DHCP, no fabric request, straight to the real init."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-second"))
    try:
        root = make_root(work)
        cd = make_cd(work, "e2e-second")
        _, _, out1, rc1 = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "", ctx["accel"])
        c(rc1 == 0 and "REALROOT-DONE" in out1, "the first boot failed")
        before, dhcp_before = len(fabric.requests()), fabric.dhcp_discovers()
        _start, took, out, rc = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "", ctx["accel"])
        time.sleep(0.3)
        c(rc == 0 and "REALROOT-DONE" in out, "the second boot did not reach the real init")
        c("already provisioned" in out, "azprov did not say it was already provisioned")
        c(len(fabric.requests()) == before, f"the fabric got {len(fabric.requests()) - before} request(s) on the second boot")
        c(fabric.dhcp_discovers() == dhcp_before, "DHCP ran on the second boot")
        return c, None, took, out
    finally:
        fabric.close()


@contextlib.contextmanager
def sectors_of(disk, sector):
    """`disk` as a block device with `sector`-byte logical sectors (a loop device for 4096,
    detached after), or the file itself for 512."""
    if sector == 512:
        yield disk
        return
    dev = subprocess.run(["losetup", "--find", "--show", "--sector-size", str(sector), disk],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def partitioned(work, fs_img, label, mib, after=None, sector=512):
    """A disk of `mib` MiB whose first partition (from 1 MiB) holds `fs_img`, with a `label`
    table (gpt or dos) made by sfdisk in `sector`-byte sectors; `after`: a second partition of
    that many MiB behind it."""
    disk = os.path.join(work, f"disk-{os.path.basename(fs_img)}")
    fs_mib = os.path.getsize(fs_img) >> 20
    with open(disk, "wb") as f:
        f.truncate((1 + fs_mib + (after or 0) + 1) << 20)
    per_mib = (1 << 20) // sector
    script = f"label: {label}\nstart={per_mib}, size={fs_mib * per_mib}\n" + \
        (f"size={after * per_mib}\n" if after else "")
    with sectors_of(disk, sector) as dev:
        subprocess.run(["sfdisk", "--quiet", dev], input=script.encode(), check=True)
    sh("dd", f"if={fs_img}", f"of={disk}", "bs=1M", "seek=1", "conv=notrunc,sparse", "status=none")
    with open(disk, "r+b") as f:
        f.truncate(mib << 20)   # Azure's OS disk is larger than the uploaded image
    return disk


def sfdisk_dump(disk, sector=512):
    with sectors_of(disk, sector) as dev:
        return subprocess.run(["sfdisk", "--dump", dev], capture_output=True, text=True, check=False).stdout


def run_growroot(ctx):
    """The OS disk is larger than the image: the root's GPT partition (Gen2's SCSI disk, found
    by UUID, with 4096-byte logical sectors: 4Kn) and its ext4 grow to the disk's end on the
    first boot, online; the second boot finds nothing to do."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-grow"))
    try:
        disk = partitioned(work, make_root(work, block=4096), "gpt", 256, sector=4096)
        cd = make_cd(work, "e2e-grow")
        _start, took, out, rc = boot(fabric, work, "gen2-4kn", ctx["kernel"], ctx["initrd"], disk, cd, "",
                                     ctx["accel"])
        c(rc == 0 and "REALROOT-DONE" in out, "the first boot did not reach the real init")
        c(re.search(r"growroot: partition sda1 \+2\d\d MiB \(GPT\) in \d+ ms; ext4 4\d MiB -> 25\d MiB", out)
          is not None, "growroot did not grow the GPT partition and ext4")
        size = re.search(r"REALROOT rootsize=(\d+)", out)
        c(size is not None and int(size.group(1)) > 200 * 1024, f"the real root is not ~256 MiB: {size and size.group(1)}")
        # in 4096-byte sectors: 65536 on the disk, less the backup's array (4) and header, less one
        dump = sfdisk_dump(disk, 4096)
        c("sector-size: 4096" in dump and "last-lba: 65530" in dump and "size=65275," in dump.replace(" ", ""),
          f"the table on disk: {dump}")
        _s, _t, out2, rc2 = boot(fabric, work, "gen2-4kn", ctx["kernel"], ctx["initrd"], disk, cd, "", ctx["accel"])
        c(rc2 == 0 and "growroot: skipped: sda1 fills its disk already" in out2,
          "the second boot did not find the root grown already")
        return c, ready_after(fabric, _start), took, out + out2
    finally:
        fabric.close()


def run_growroot_fs(ctx, fs):
    """growroot of an xfs or btrfs root (Gen2's SCSI disk, GPT, 256 MiB behind the image): the
    partition and the filesystem grow online by the filesystem's own ioctl; the second boot
    finds nothing to do."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc(f"e2e-grow-{fs}"))
    try:
        img = make_root(work, fs=fs)
        img_mib = os.path.getsize(img) >> 20
        disk = partitioned(work, img, "gpt", img_mib + 256)
        cd = make_cd(work, f"e2e-grow-{fs}")
        _start, took, out, rc = boot(fabric, work, "gen2", ctx["kernel"], ctx["initrd"], disk, cd, "", ctx["accel"])
        c(rc == 0 and "REALROOT-DONE" in out, "the first boot did not reach the real init")
        grew = re.search(rf"growroot: partition sda1 \+25\d MiB \(GPT\) in \d+ ms; {fs} (\d+) MiB -> (\d+) MiB in \d+ ms",
                         out)
        c(grew is not None and int(grew.group(1)) <= img_mib and int(grew.group(2)) >= img_mib + 250,
          f"growroot did not grow the GPT partition and {fs}: "
          f"{next((l for l in out.splitlines() if 'growroot' in l), None)!r}")
        # df counts what the filesystem can hold: xfs keeps its 64 MiB log out of it
        size = re.search(r"REALROOT rootsize=(\d+)", out)
        grown_mib = int(grew.group(2)) if grew else img_mib + 256
        c(size is not None and int(size.group(1)) > img_mib * 1024 and int(size.group(1)) >= (grown_mib - 80) * 1024,
          f"the real root's {fs} does not hold ~{grown_mib} MiB: {size and size.group(1)} KiB")
        if fs == "xfs":
            # the grow is written home, not only logged: a 6.1 kernel refuses to replay it from
            # the log after a power cut (EUCLEAN), so the superblock on disk must say the new size
            with open(disk, "rb") as f:
                f.seek((1 << 20) + 4)
                sb = f.read(12)
            on_disk = (int.from_bytes(sb[4:12], "big") * int.from_bytes(sb[0:4], "big")) >> 20
            c(grew is not None and on_disk == int(grew.group(2)),
              f"the xfs superblock on disk says {on_disk} MiB after the grow (the log holds the rest)")
        _s, _t, out2, rc2 = boot(fabric, work, "gen2", ctx["kernel"], ctx["initrd"], disk, cd, "", ctx["accel"])
        c(rc2 == 0 and "growroot: skipped: sda1 fills its disk already" in out2,
          "the second boot did not find the root grown already")
        return c, ready_after(fabric, _start), took, out + out2
    finally:
        fabric.close()


def run_growroot_powercut(ctx):
    """A power cut at each step of growroot's table rewrite (QEMU killed as the guest's write
    reaches the disk, so that write and all after it are lost), one that tears the backup
    array in its middle, and one after its last write, while the filesystem grows: after every
    cut the primary table the kernel reads is the old one, or (a cut between the primary's
    entry sector and its header) one that PID 1 puts back from the sound backup before it looks
    for the root, or the new one; the next boot grows what is left, and the filesystem is
    clean."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-cut"))
    out_all, took = "", 0
    try:
        cd = make_cd(work, "e2e-cut")
        sectors = 256 << 11
        # a cut at the first write touching each sector of the table, in growroot's order
        # (disk::grow): the protective MBR, the backup array (whole, and torn after 16 of its
        # 32 sectors) and header at the new end, the primary's entry sector, its header, and
        # last a cut after the table, while the filesystem grows. What the kernel then reads:
        # the old primary, none (until PID 1 puts it back), or the new one
        steps = [("the protective MBR", 0, False, "old"), ("the backup array", sectors - 33, False, "old"),
                 ("the backup array, torn in its middle", sectors - 33 + 16, True, "old"),
                 ("the backup header", sectors - 1, False, "old"), ("the primary entry sector", 2, False, "old"),
                 ("the primary header", 1, False, "unsound"), ("after the table", None, False, "new")]
        for i, (what, sector, torn, want) in enumerate(steps):
            disk = partitioned(work, make_root(work), "gpt", 256)
            old = gpt_primary(disk)
            how, out = boot_cut(fabric, work, ctx["kernel"], ctx["initrd"], disk, cd, sector=sector, torn=torn,
                                console_mark=None if sector is not None else "growroot: partition")
            out_all += f"\n==== cut {i} at {what}: {how}\n{out}"
            c(how == ("write" if sector is not None else "console"), f"cut {i} ({what}): the boot ended by {how}")
            after = gpt_primary(disk)
            seen = "unsound" if after is None else "old" if after == old else "new" if after[0] == 524254 else after
            c(seen == want, f"cut {i} ({what}): the primary GPT is {seen} ({after}), not {want} (was {old})")
            _start, took, out2, rc = boot(fabric, work, "gen2", ctx["kernel"], ctx["initrd"], disk, cd, "",
                                          ctx["accel"])
            out_all += f"\n==== boot after cut {i}\n{out2}"
            grew = re.search(r"growroot: partition sda1 \+2\d\d MiB \(GPT\) in \d+ ms; ext4 4\d MiB -> 25\d MiB", out2)
            fs_only = re.search(r"growroot: ext4 \d+ MiB -> 25\d MiB in \d+ ms", out2)
            done = "growroot: skipped: sda1 fills its disk already" in out2
            put_back = "growroot: sda's primary GPT was not sound (a cut during a grow); put back" in out2
            c(rc == 0 and "REALROOT-DONE" in out2, f"after cut {i} ({what}): the boot did not reach the real init")
            c(put_back == (want == "unsound"), f"after cut {i} ({what}): the primary was put back: {put_back}")
            c(grew is not None if want == "old" else (fs_only is not None or done),
              f"after cut {i} ({what}): growroot said "
              f"{next((l for l in out2.splitlines() if 'growroot:' in l), None)!r}")
            size = re.search(r"REALROOT rootsize=(\d+)", out2)
            c(size is not None and int(size.group(1)) > 200 * 1024, f"after cut {i}: the real root is {size and size.group(1)} KiB")
            dump = sfdisk_dump(disk)
            c("last-lba: 524254" in dump and "size=522207," in dump.replace(" ", ""), f"after cut {i}: the table: {dump}")
            rc_fsck, fsck = ext4_clean(work, disk)
            c(rc_fsck == 0, f"after cut {i}: e2fsck -fn says {rc_fsck}: {fsck[-400:]}")
        return c, None, took, out_all
    finally:
        fabric.close()


def run_growroot_mbr(ctx):
    """growroot on an MBR disk (Gen1's virtio disk): the root partition grows; with a partition
    behind it, it is left alone and the boot says why."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-growmbr"))
    try:
        disk = partitioned(work, make_root(work), "dos", 128)
        cd = make_cd(work, "e2e-growmbr")
        _start, took, out, rc = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], disk, cd, "root=/dev/vda1",
                                     ctx["accel"])
        c(rc == 0 and "REALROOT-DONE" in out, "the boot did not reach the real init")
        c(re.search(r"growroot: partition vda1 \+\d+ MiB \(MBR\) in \d+ ms; ext4 4\d MiB -> 12\d MiB", out)
          is not None, "growroot did not grow the MBR partition and ext4")
        blocked = partitioned(work, make_root(work, name="root2.img"), "dos", 128, after=8)
        _s, _t, out2, rc2 = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], blocked, cd,
                                 "root=/dev/vda1", ctx["accel"])
        c(rc2 == 0 and "growroot: skipped: vda1: partition 2 lies after it; not grown" in out2,
          "a partition that is not last was not left alone with its reason")
        return c, ready_after(fabric, _start), took, out + out2
    finally:
        fabric.close()


def run_no_cd(ctx):
    c = Check()
    fabric, root, start, took, out, rc = scenario_happy(ctx, "gen1", "e2e-nocd", with_cd=False)
    try:
        common_checks(c, fabric, root, out, rc, "e2e-nocd")
        c("no provisioning media" in out, "azprov did not note the missing media")
        # every controller was probed inside its module's load: nothing to wait out
        c("no CD-ROM drive after" not in out, "azprov waited out the CD settle time without a CD")
        c(" csum=Y" in out, "virtio_net's csum default changed without a parameter")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_nvme_mana(ctx):
    """Azure's current hardware: the OS disk on NVMe and, as the only NIC, one that is neither
    virtio nor hv_netvsc (vmxnet3 standing in for MANA, added with mkinitramfs --modules +NAME)."""
    c = Check()
    work = ctx["work"]
    initrd = os.path.join(work, "initrd.img")
    sh(os.path.join(TOP, "scripts", "mkinitramfs"), "--kernel-modules", ctx["moddir"], "--azprov", ctx["azprov"],
       "--modules", "+vmxnet3", "-o", initrd, stdout=subprocess.DEVNULL)
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-nvme"))
    try:
        root = make_root(work)
        cd = make_cd(work, "e2e-nvme-ovf")
        start, took, out, rc = boot(fabric, work, "nvme", ctx["kernel"], initrd, root, cd, "", ctx["accel"],
                                    nic="vmxnet3")
        common_checks(c, fabric, root, out, rc, "e2e-nvme")
        c("/dev/nvme0n1 is /dev/nvme0n1 (ext4), mounted at /sysroot" in out, "the root was not mounted from NVMe")
        # vmxnet3 loaded (a skipped module is named with why), virtio's NIC driver left out
        c("vmxnet3 (" not in out and "virtio_net (no device)" in out, "vmxnet3 was not loaded, or virtio_net was")
        c(re.search(r"azprov: dhcp: \d+ ms: eth0 10\.44\.0\.\d+/24", out) is not None, "no lease on the vmxnet3 NIC")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_missing_init(ctx):
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-noinit"))
    try:
        root = make_root(work)
        before = debugfs_cat(root, "/etc/hostname")
        cd = make_cd(work, "e2e-noinit")
        _start, took, out, rc = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "init=/sbin/nosuchinit", ctx["accel"])
        c("init=/sbin/nosuchinit is not an executable file" in out, "no clear error on the console")
        c("REALROOT-INIT" not in out, "something ran in the real root")
        c(debugfs_cat(root, "/etc/hostname") == before, "the real root was modified")
        c(debugfs_cat(root, "/var/lib/azprov/provisioned") is None, "a marker was written")
        c(fabric.requests() == [], "the fabric was contacted")
        c(rc == 0, f"azprov.onfail=poweroff did not power off (rc {rc})")
        return c, None, took, out
    finally:
        fabric.close()


def run_imds_down(ctx):
    c = Check()
    pb = [{"endpoint": "imds", "requests": "*", "status": 503}]
    fabric, _root, start, took, out, rc = scenario_happy(ctx, "gen1", "e2e-imdsdown", playbook=pb, extra="azprov.timeout=20")
    try:
        # hostname comes from the CD this time
        c(rc == 0 and "REALROOT-DONE" in out, "did not boot through")
        c("hostname=e2e-imdsdown-ovf" in out, "hostname was not taken from ovf-env.xml")
        posts = [r for r in fabric.requests() if r.get("endpoint") == "health"]
        c(any(p.get("state") == "Ready" for p in posts), "no Ready")
        c(sum(1 for r in fabric.requests() if r.get("server") == "imds") > 1, "IMDS was not retried")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_no_option_245(ctx):
    """No DHCP option 245, and a provisioning CD in iso9660 (Rock Ridge) without UDF, as Azure
    Stack's may be: isofs, which the initramfs holds back, is loaded for it on demand."""
    c = Check()
    fabric, root, start, took, out, rc = scenario_happy(ctx, "gen1", "e2e-no245", option245=False, cd_fs="iso9660")
    try:
        common_checks(c, fabric, root, out, rc, "e2e-no245")
        c("wireserver (none, using 168.63.129.16)" in out, "the fallback to 168.63.129.16 was not logged")
        c("ovf-env.xml read from /dev/sr0 (iso9660)" in out, "the iso9660 CD was not read as iso9660")
        c(re.search(r"modules: \d+ ms: isofs for iso9660", out) is not None, "isofs was not loaded for the iso9660 CD")
        c("UDF-fs" not in out, "the CD without UDF was tried as udf")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


def run_no_root(ctx):
    """root= names nothing: the wait is bounded, the reason repeats, azprov.onfail is followed."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-noroot"))
    try:
        root = make_root(work)
        _start, took, out, rc = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], root, None,
                                    "root=UUID=00000000-1111-2222-3333-444444444444 rootdelay=3", ctx["accel"])
        want = "cannot boot: root device UUID=00000000-1111-2222-3333-444444444444 did not appear within 3s"
        c(out.count(want) >= 3, "the reason was not repeated on the console")
        c(rc == 0, f"azprov.onfail=poweroff did not power off (rc {rc})")
        c(fabric.requests() == [], "the fabric was contacted")
        return c, None, took, out
    finally:
        fabric.close()


def run_not_azure(ctx):
    """No Azure chassis asset tag: straight to the real init, no packet, the root untouched."""
    c = Check()
    work = ctx["work"]
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-notazure"))
    try:
        root = make_root(work)
        before = debugfs_cat(root, "/etc/hostname")
        cd = make_cd(work, "e2e-notazure")
        _start, took, out, rc = boot(fabric, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "", ctx["accel"],
                                    azure=False)
        time.sleep(0.3)
        c(rc == 0 and "REALROOT-DONE" in out, "did not reach the real init")
        c("not an Azure VM" in out, "azprov did not say why it did nothing")
        c(fabric.requests() == [], "the fabric was contacted")
        c(fabric.dhcp_discovers() == 0, "DHCP ran")
        c(debugfs_cat(root, "/etc/hostname") == before, "the root was modified")
        c(debugfs_cat(root, "/var/lib/azprov/provisioned") is None, "a marker was written")
        return c, None, took, out
    finally:
        fabric.close()


def run_arm64(ctx):
    """Azure's Arm VMs (Cobalt, Ampere): Gen2 only, UEFI, SCSI. The aarch64 build of azprov in
    an initramfs of Debian's cloud-arm64 kernel, booted by QEMU's virt machine with UEFI
    firmware (which hands SMBIOS, so DMI, to the kernel) under TCG; virtio-scsi disk and CD."""
    c = Check()
    work = ctx["work"]
    kernel_img, moddir = kernel("arm64")
    azprov = subprocess.run([os.path.join(TOP, "scripts", "build"), "--target", "aarch64"], check=True,
                            stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    initrd = os.path.join(work, "initrd-arm64.img")
    # the test root is ext4: --root-fs leaves xfs and btrfs out of the image; zstd, so that the
    # other compression boots too (the x86_64 scenarios have the default, lz4)
    sh(os.path.join(TOP, "scripts", "mkinitramfs"), "--arch", "arm64", "--kernel-modules", moddir,
       "--azprov", azprov, "--root-fs", "ext4", "--compress", "zstd", "-o", initrd, stdout=subprocess.DEVNULL)
    listed = subprocess.run(f"zstd -dc {initrd} | cpio -i --quiet --to-stdout etc/azprov/modules", shell=True,
                            check=True, stdout=subprocess.PIPE, text=True).stdout
    c("/xfs.ko" not in listed and "/btrfs.ko" not in listed and "/udf.ko" in listed,
      "--root-fs ext4 did not leave exactly xfs and btrfs out")
    busybox = os.path.join(fetch_deb("busybox-static", "arm64"), "bin", "busybox")
    fabric = Fabric(work, ctx["tag"], imds_doc("e2e-arm64"))
    try:
        root = make_root(work, busybox=busybox)
        cd = make_cd(work, "e2e-arm64-ovf")
        append = (f"console=ttyAMA0 loglevel=6 panic=-1 root=UUID={ROOT_UUID} rw rootwait "
                  f"azprov.timeout=90 azprov.onfail=poweroff {os.environ.get('QEMU_TESTS_APPEND', '')}").strip()
        console = os.path.join(work, "console.log")
        cmd = ["ip", "netns", "exec", fabric.ns, "timeout", "400",
               "qemu-system-aarch64", "-M", "virt", "-cpu", "max", "-accel", "tcg", "-m", "512", "-smp", "1",
               "-nodefaults", "-display", "none", "-no-reboot", "-uuid", DMI_UUID,
               "-bios", "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd",
               "-smbios", f"type=3,asset={AZURE_ASSET_TAG}",
               "-kernel", kernel_img, "-initrd", initrd, "-append", append,
               "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", f"virtio-net-pci,netdev=n0,mac={GUEST_MAC}",
               "-device", "virtio-scsi-pci,id=scsi0",
               "-drive", f"file={root},format=raw,if=none,id=hd0", "-device", "scsi-hd,drive=hd0,bus=scsi0.0",
               "-drive", f"file={cd},format=raw,if=none,media=cdrom,id=cd0,readonly=on",
               "-device", "scsi-cd,drive=cd0,bus=scsi0.0",
               "-serial", f"file:{console}"]
        start = time.time()
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        took = time.time() - start
        out = console_text(console)
        if r.returncode:
            out += f"\n[qemu rc={r.returncode}] {r.stderr}"
        common_checks(c, fabric, root, out, r.returncode, "e2e-arm64")
        c("azprov " in out and "as PID 1" in out, "azprov did not run as PID 1")
        # UEFI: Gen2 rules, the DMI UUID as it is (no Gen1 byte swap)
        c((debugfs_cat(root, "/var/lib/azprov/provisioned") or "").strip() == DMI_UUID,
          "the marker is not the unswapped DMI UUID")
        c("ovf-env.xml read from /dev/sr0" in out, "the SCSI CD was not read")
        return c, ready_after(fabric, start), took, out
    finally:
        fabric.close()


SCENARIOS = {
    "gen1": run_gen1,
    "gen2": run_gen2,
    "xfs-root": run_xfs_root,
    "second-boot": run_second_boot,
    "no-cd": run_no_cd,
    "nvme-mana": run_nvme_mana,
    "missing-init": run_missing_init,
    "imds-down": run_imds_down,
    "no-option-245": run_no_option_245,
    "no-root": run_no_root,
    "not-azure": run_not_azure,
    "arm64": run_arm64,
    "growroot": run_growroot,
    "growroot-mbr": run_growroot_mbr,
    "growroot-powercut": run_growroot_powercut,
    "growroot-xfs": lambda ctx: run_growroot_fs(ctx, "xfs"),
    "growroot-btrfs": lambda ctx: run_growroot_fs(ctx, "btrfs"),
}


def kvm_works(kernel_img, initrd):
    """KVM only if a trial boot of this kernel reaches azprov and powers off within 20 s."""
    if not os.path.exists("/dev/kvm"):
        return False
    r = subprocess.run(["timeout", "20", "qemu-system-x86_64", "-accel", "kvm", "-M", "pc", "-m", "256", "-nodefaults",
                        "-display", "none", "-no-reboot", "-serial", "stdio", "-kernel", kernel_img, "-initrd", initrd,
                        "-append", "console=ttyS0 loglevel=6 panic=-1 azprov.onfail=poweroff"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    return "azprov" in r.stdout and r.returncode == 0


def main():
    names = sys.argv[1:] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario(s): {' '.join(unknown)}; known: {' '.join(SCENARIOS)}")
    if os.geteuid() != 0:
        sys.exit("qemu-tests/run needs root (network namespaces, tap devices)")
    t0 = time.time()
    kernel_img, moddir = kernel()
    os.makedirs(OUT, exist_ok=True)
    azprov = subprocess.run([os.path.join(TOP, "scripts", "build")], check=True, stdout=subprocess.PIPE, text=True).stdout.split()[-1]
    initrd = os.path.join(OUT, "initrd.img")
    r = subprocess.run([os.path.join(TOP, "scripts", "mkinitramfs"), "--kernel-modules", moddir, "--azprov", azprov, "-o", initrd],
                       check=True, stdout=subprocess.PIPE, text=True)
    log(r.stdout.strip())
    accel = "kvm" if kvm_works(kernel_img, initrd) else "tcg"
    log(f"kernel {os.path.basename(kernel_img)}, accel {accel}, setup {time.time() - t0:.1f}s")

    def one(i, name):
        work = os.path.join(OUT, name)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        ctx = {"work": work, "tag": str(i), "kernel": kernel_img, "initrd": initrd, "accel": accel,
               "moddir": moddir, "azprov": azprov}
        try:
            c, ready, took, out = SCENARIOS[name](ctx)
        except Exception as e:  # a broken scenario is a failed scenario
            return name, [f"{type(e).__name__}: {e}"], None, 0.0
        with open(os.path.join(work, "console.txt"), "w") as f:
            f.write(out)
        return name, c.failures, ready, took

    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for name, failures, ready, took in pool.map(lambda a: one(*a), enumerate(names)):
            ready_s = f"{ready:.2f}s" if ready is not None else "-"
            if failures:
                failed += 1
                log(f"FAIL {name}: qemu {took:.1f}s; " + "; ".join(failures) + f" (console: qemu-tests/out/{name}/console.txt)")
            else:
                passed += 1
                log(f"PASS {name}: QEMU start to Ready {ready_s} ({accel}), qemu {took:.1f}s")
    log(f"qemu-tests: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
