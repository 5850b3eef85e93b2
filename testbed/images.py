"""What a test VM boots from and what is read back from it afterwards: the Debian cloud
kernel (fetched once into the cache), the test roots (ext4, xfs or btrfs, with
qemu-tests/test-init as the real init), the provisioning CD (ovf-env.xml as Azure writes it,
UDF or iso9660), the IMDS document, disks partitioned as Azure's OS disk (GPT or MBR, 512 or
4096-byte sectors), a whole image bootable through GRUB, a fixed VHD, and the readers (debugfs,
the primary GPT, e2fsck)."""
import base64
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
from xml.sax.saxutils import escape

from testbed.azure import GUEST_IP, GUEST_MAC
from testbed.host import CACHE, FIXTURES, TOP, sh

ROOT_UUID = "6f0c2a4e-1b3d-4c5e-8f70-9a1b2c3d4e5f"
VM_ID = "12345678-90ab-cdef-1234-567890abcdef"
# the admin's key the IMDS document and the CD hand out
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl e2e@test"


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
    shutil.copy(os.path.join(TOP, "qemu-tests", "test-init"), os.path.join(tree, "sbin", "init"))
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


def ovf_env(hostname, user, keys=(), password=None, custom_data=None, disable_password=True, msp=False):
    """ovf-env.xml as Azure writes it to the provisioning CD: the provisioning section with the
    keys inline (Value; Azure's Fingerprint needs the goal state's certificates) and the
    PlatformSettingsSection Azure always sends (cloud-init refuses an OVF without it); with
    `msp`, the flag of a VM created with the Metadata Security Protocol."""
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
      <EnableTrustedImageIdentifier>false</EnableTrustedImageIdentifier>{"<ProvisionGuestProxyAgent>true</ProvisionGuestProxyAgent>" if msp else ""}
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


# What Azure puts on the SCSI resource disk's NTFS partition when it hands the disk over.
AZURE_NTFS_FILES = ("DATALOSS_WARNING_README.txt",)
AZURE_NTFS_DIRS = ("System Volume Information",)


def ntfs_resource_disk(path, extra_files=(), size_mb=64):
    """A disk as Azure hands its SCSI resource disk over: MBR, one NTFS partition (from 1 MiB)
    labelled "Temporary Storage" holding its readme and System Volume Information, and
    `extra_files` (a user's data) when given. Made with ntfs-3g's mkntfs and its FUSE mount."""
    fs, mnt = path + ".fs", path + ".mnt"
    with open(fs, "wb") as f:
        f.truncate((size_mb - 1) << 20)
    sh("mkntfs", "-q", "-F", "-f", "-L", "Temporary Storage", fs, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.makedirs(mnt, exist_ok=True)
    sh("ntfs-3g", fs, mnt)
    try:
        for name in AZURE_NTFS_FILES + tuple(extra_files):
            with open(os.path.join(mnt, name), "w") as f:
                f.write("WARNING: THIS IS A TEMPORARY DISK.\r\n")
        for name in AZURE_NTFS_DIRS:
            os.mkdir(os.path.join(mnt, name))
    finally:
        sh("umount", mnt)
        os.rmdir(mnt)
    with open(path, "wb") as f:
        f.truncate(size_mb << 20)
    subprocess.run(["sfdisk", "--quiet", path], input="label: dos\nstart=2048, type=7\n", text=True, check=True)
    sh("dd", f"if={fs}", f"of={path}", "bs=1M", "seek=1", "conv=notrunc", "status=none")
    os.remove(fs)
    return path


def debugfs_cat(img, path):
    r = subprocess.run(["debugfs", "-R", f"cat {path}", img], capture_output=True, text=True, check=False)
    return r.stdout if r.returncode == 0 and "File not found" not in r.stderr else None



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



def fixed_vhd(raw):
    """`raw` (a GPT disk) as Azure's upload takes it: a fixed VHD of a whole number of MiB
    beside it, force_size keeping the size exact. A disk over a whole MiB is grown to the next
    first, its backup GPT moved to the new end. Returns the VHD's path."""
    mib = 1 << 20
    size = -(-os.path.getsize(raw) // mib) * mib
    if size != os.path.getsize(raw):
        sh("qemu-img", "resize", "-q", "-f", "raw", raw, str(size))
        sh("sfdisk", "-q", "--relocate", "gpt-bak-std", raw, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    vhd = raw[:-len(".raw")] + ".vhd"
    sh("qemu-img", "convert", "-q", "-f", "raw", "-O", "vpc", "-o", "subformat=fixed,force_size=on", raw, vhd)
    return vhd


def root_files(overlay, *paths):
    """The files at `paths` in an overlay's root filesystem (None for a missing one): debugfs reads
    raw images only, so the overlay is flattened into a sparse raw file for the reading."""
    raw = overlay[:-len(".qcow2")] + "-flat.img"
    sh("qemu-img", "convert", "-q", "-O", "raw", overlay, raw)
    # the guest was killed, not shut down: its journal is replayed (and the bitmaps it left
    # behind mended) on this copy first, or debugfs may refuse to open it or miss a write
    subprocess.run(["e2fsck", "-fy", raw], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    try:
        return [debugfs_cat(raw, p) for p in paths]
    finally:
        os.remove(raw)

