"""The distribution images the distro tier and the bench boot: Debian 12 roots from Debian's
packages (mmdebstrap with the host's apt sources, cached as a tarball in the cache keyed by
the package list), azprov installed from its .deb (the trigger rebuilds the initramfs-tools
initrd; a dracut initrd beside it), from the RHEL-family RPM (rpm -i --root), or with
mkinitcpio built from upstream; the hardened variant (SELinux enforcing, split /home and /var,
no drop-ins); Debian's cloud-init and waagent images; the examples/mkosi recipes built by mkosi;
each as a root filesystem or as a whole disk an image builder would upload. `Images` builds
each image once, when the first scenario that needs it starts, and removes it after the last.
"""
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time

from testbed.host import CACHE, OUT as TIERS_OUT, TOP, log, sh
from testbed.images import ROOT_UUID, bootable_disk, debugfs_cat, fixed_vhd
from testbed.vm import USER

OUT = os.path.join(TIERS_OUT, "distro")
# The host's apt sources, handed to mmdebstrap as its MIRROR (the repo never names a mirror).
SOURCES = next((f for f in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list") if os.path.exists(f)),
               "/etc/apt/sources.list.d/debian.sources")
PACKAGES = ["systemd-sysv", "dbus", "libpam-systemd", "udev", "kmod", "iproute2", "openssh-server", "sudo",
            "initramfs-tools", "dracut-core", "zstd", "linux-image-cloud-amd64", "e2fsprogs", "netbase", "procps"]
# The hardened image: SELinux enforcing with Debian's reference policy, labelled at build time.
HARDENED_PACKAGES = PACKAGES + ["selinux-basics", "selinux-policy-default", "policycoreutils", "attr"]
# Debian 12 with cloud-init configured as Debian's Azure images are (debian-cloud-images: the
# AZURE class's debconf answer leaves `datasource_list: [ Azure ]` in 90_dpkg.cfg; ifupdown and
# dhclient for the network cloud-init renders), initramfs-tools, no azprov.
CLOUD_INIT_PACKAGES = [p for p in PACKAGES if p != "dracut-core"] + ["cloud-init", "isc-dhcp-client", "ifupdown"]
# The kernel command line of Debian's Azure images (less rootdelay=300)
AZURE_APPEND = "console=tty0 console=ttyS0,115200n8 earlyprintk=ttyS0,115200"
# Debian 12 with waagent alone (Provisioning.Agent=auto provisions with waagent when there is
# no cloud-init; it ejects the CD with eject(1), which its package does not depend on)
WAAGENT_PACKAGES = [p for p in PACKAGES if p != "dracut-core"] + ["waagent", "isc-dhcp-client", "eject"]


def debian_tarball(packages=PACKAGES):
    """mmdebstrap's root as a tarball, built once per package list and apt sources."""
    with open(SOURCES, "rb") as f:
        sources = f.read()
    key = hashlib.sha256(b"\n".join([b"bookworm minbase main"] + [p.encode() for p in packages] + [sources])).hexdigest()[:16]
    tar = os.path.join(CACHE, f"debian-bookworm-{key}.tar")
    if os.path.exists(tar):
        return tar, "cached"
    os.makedirs(CACHE, exist_ok=True)
    t = time.time()
    # the host's sources file as MIRROR: mmdebstrap pastes it into the root's sources.list
    partial = tar[:-len(".tar")] + "-partial.tar"
    shutil.rmtree(partial, ignore_errors=True)
    sh("mmdebstrap", "--quiet", "--format=tar", "--variant=minbase", "--components=main",
       "--include=" + ",".join(packages), "bookworm", partial, SOURCES, stdout=subprocess.DEVNULL)
    os.rename(partial, tar)
    return tar, f"built in {time.time() - t:.0f}s"


def in_root(tree, script):
    """Runs a shell script chrooted in `tree`, in a private mount namespace with /proc, /sys,
    /dev and /dev/pts bound in (never the host's mounts themselves)."""
    binds = " && ".join(f"mount --bind /{d} {tree}/{d}" for d in ("proc", "sys", "dev", "dev/pts"))
    sh("unshare", "-m", "--propagation", "private", "sh", "-c",
       f"{binds} && exec chroot {tree} /bin/sh -ec '{script}'", stdout=subprocess.DEVNULL)


def extract_root(work, tar, networkd=True):
    """The root from `tar` extracted under work/tree, with what mmdebstrap copied from the
    build host (its name, its resolver) reset and the fstab naming the root by UUID; with
    `networkd`, systemd-networkd configured for DHCP on the NIC (enabled by the caller's
    chroot step). Returns the tree and the kernel version in its /boot."""
    tree = os.path.join(work, "tree")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    sh("tar", "-xpf", tar, "-C", tree, "--numeric-owner")
    w = lambda rel, text: open(os.path.join(tree, rel), "w").write(text)
    w("etc/hostname", "debian-image\n")
    w("etc/hosts", "127.0.0.1 localhost\n")
    w("etc/resolv.conf", "")
    w("etc/fstab", f"UUID={ROOT_UUID} / ext4 errors=remount-ro 0 1\n")
    if networkd:
        os.makedirs(os.path.join(tree, "etc/systemd/network"), exist_ok=True)
        w("etc/systemd/network/50-dhcp.network", "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n")
    kver = sorted(f[len("vmlinuz-"):] for f in os.listdir(os.path.join(tree, "boot")) if f.startswith("vmlinuz-"))[-1]
    return tree, kver


def root_image(work, tree):
    """The ext4 root filesystem made from `tree` (labelled and named as the fstab names it)."""
    img = os.path.join(work, "disk.img")
    sh("mkfs.ext4", "-q", "-F", "-L", "azroot", "-U", ROOT_UUID, "-E", "root_owner=0:0", "-d", tree, img, "2G",
       stdout=subprocess.DEVNULL)
    return img


# The hardened image's /home and /var filesystems (fstab mounts them by these UUIDs).
HOME_UUID = "3c1d0e2f-4a5b-4c6d-8e7f-0a1b2c3d4e51"
VAR_UUID = "3c1d0e2f-4a5b-4c6d-8e7f-0a1b2c3d4e52"
SELINUX_APPEND = "security=selinux selinux=1 enforcing=1"


def harden(tree):
    """Makes the tree what an enterprise image builder makes: SELinux enforcing with Debian's
    reference policy, /home and /var on filesystems of their own, an sshd_config that includes no
    drop-ins and keeps password login on, a sudoers that reads no /etc/sudoers.d."""
    w = lambda rel, text: open(os.path.join(tree, rel), "w").write(text)
    w("etc/selinux/config", "SELINUX=enforcing\nSELINUXTYPE=default\n")
    w("etc/fstab", f"UUID={ROOT_UUID} / ext4 errors=remount-ro 0 1\n"
                   f"UUID={HOME_UUID} /home ext4 defaults,nodev,nosuid 0 2\n"
                   f"UUID={VAR_UUID} /var ext4 defaults,nodev 0 2\n")
    sshd = os.path.join(tree, "etc/ssh/sshd_config")
    lines = [l for l in open(sshd).read().splitlines() if not l.startswith("Include ")]
    w("etc/ssh/sshd_config", "\n".join(["PasswordAuthentication yes"] + lines) + "\n")
    sudoers = os.path.join(tree, "etc/sudoers")
    w("etc/sudoers", "".join(l for l in open(sudoers).readlines() if "includedir" not in l))
    # the booted system makes a missing RSA host key itself before sshd starts, as Fedora's
    # sshd-keygen@rsa.service (SUSE's sshd-gen-keys-start, Arch's sshdgenkeys) does
    w("etc/systemd/system/sshd-keygen-rsa.service",
      "[Unit]\nDescription=OpenSSH rsa server key (as Fedora's sshd-keygen@rsa)\n"
      "ConditionFileNotEmpty=!/etc/ssh/ssh_host_rsa_key\nBefore=ssh.service\n\n"
      "[Service]\nType=oneshot\nExecStart=/usr/bin/ssh-keygen -q -t rsa -f /etc/ssh/ssh_host_rsa_key -C '' -N ''\n")
    os.makedirs(os.path.join(tree, "etc/systemd/system/ssh.service.wants"), exist_ok=True)
    os.symlink("/etc/systemd/system/sshd-keygen-rsa.service",
               os.path.join(tree, "etc/systemd/system/ssh.service.wants/sshd-keygen-rsa.service"))


def build_images(work, tar, deb, hardened=False):
    """Extracts the root, installs azprov's .deb (the trigger rebuilds the initramfs-tools initrd),
    builds the dracut initrd, and writes the disk image. Returns the kernel, the three initrds
    (stock, initramfs-tools with azprov, dracut with azprov), the image and, for the hardened
    image (labelled with the policy's setfiles after everything is installed), the /home and
    /var images by name."""
    t = time.time()
    tree, kver = extract_root(work, tar)
    # in a chroot initramfs-tools cannot detect the root's type (no fsck.ext4 otherwise)
    with open(os.path.join(tree, "etc/initramfs-tools/conf.d/fstype"), "w") as f:
        f.write("FSTYPE=ext4\n")
    stock = os.path.join(work, "initrd-stock.img")
    shutil.copy(os.path.join(tree, "boot", f"initrd.img-{kver}"), stock)
    shutil.copy(deb, os.path.join(tree, "tmp", "azprov.deb"))
    if hardened:
        harden(tree)
    in_root(tree, f"systemctl enable -q systemd-networkd; dpkg -i /tmp/azprov.deb; rm /tmp/azprov.deb; "
                  f"dracut --quiet --force --no-hostonly --kver {kver} /boot/initrd-dracut.img")
    extra = {}
    if hardened:
        # labelled last, as an image builder labels (the initrds are built by then; they
        # leave the tree with the rest)
        in_root(tree, "setfiles -F -e /proc -e /sys -e /dev /etc/selinux/default/contexts/files/file_contexts /")
        for name, uuid in (("home", HOME_UUID), ("var", VAR_UUID)):
            extra[name] = os.path.join(work, f"{name}.img")
            sh("mkfs.ext4", "-q", "-F", "-U", uuid, "-L", name, "-d", os.path.join(tree, name), extra[name], "1G",
               stdout=subprocess.DEVNULL)
            # the root filesystem keeps the empty mount point (and its label)
            for entry in os.listdir(os.path.join(tree, name)):
                path = os.path.join(tree, name, entry)
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    prep = time.time() - t
    kernel = os.path.join(work, "vmlinuz")
    shutil.copy(os.path.join(tree, "boot", f"vmlinuz-{kver}"), kernel)
    initrds = {"stock": stock}
    for name, f in (("initramfs-tools", f"initrd.img-{kver}"), ("dracut", "initrd-dracut.img")):
        initrds[name] = os.path.join(work, f"initrd-{name}.img")
        shutil.move(os.path.join(tree, "boot", f), initrds[name])
    img = root_image(work, tree)
    if not hardened:
        package_checks(tree, kver, initrds["initramfs-tools"])
    shutil.rmtree(tree)
    return kernel, initrds, img, prep, extra


def build_agent_image(work, tar, agent, key_pub=None):
    """An image with Debian's `agent` (cloud-init or waagent) as an image builder uploads it:
    GPT, GRUB for BIOS and UEFI, the root last. Returns its path (raw). `agent` "none": no
    agent at all, the admin (USER, sudo without a password) and `key_pub` baked in, the host
    keys the image's own: what an image gives when nothing provisions it."""
    # cloud-init renders the network itself (ifupdown); waagent configures none
    tree, kver = extract_root(work, tar, networkd=agent != "cloud-init")
    w = lambda rel, text: open(os.path.join(tree, rel), "w").write(text)
    if agent == "cloud-init":
        w("etc/cloud/cloud.cfg.d/90_dpkg.cfg",
          "# to update this file, run dpkg-reconfigure cloud-init\ndatasource_list: [ Azure ]\n")
    elif agent == "none":
        w("etc/sudoers.d/90-admin", f"{USER} ALL=(ALL) NOPASSWD:ALL\n")
        in_root(tree, f"systemctl enable -q systemd-networkd; useradd -m -s /bin/bash -G sudo {USER}; "
                      f"install -d -m 700 -o {USER} -g {USER} /home/{USER}/.ssh")
        # written from here: in_root's script is single-quoted
        w(f"home/{USER}/.ssh/authorized_keys", key_pub + "\n")
        in_root(tree, f"chown {USER}:{USER} /home/{USER}/.ssh/authorized_keys; "
                      f"chmod 600 /home/{USER}/.ssh/authorized_keys")
    else:
        # waagent configures no network: the image's own systemd-networkd does, as in the
        # azprov image
        in_root(tree, "systemctl enable -q systemd-networkd")
        # Debian's waagent.conf leaves provisioning to cloud-init; without it, waagent provisions
        conf = os.path.join(tree, "etc/waagent.conf")
        w("etc/waagent.conf", open(conf).read().replace("Provisioning.Agent=cloud-init", "Provisioning.Agent=waagent"))
        # the unit runs only where systemd detects Hyper-V; under QEMU's TCG, CPUID says TCG and
        # wins over DMI's "Microsoft Corporation": the condition is lifted for the test
        os.makedirs(os.path.join(tree, "etc/systemd/system/walinuxagent.service.d"), exist_ok=True)
        w("etc/systemd/system/walinuxagent.service.d/qemu.conf", "[Unit]\nConditionVirtualization=\n")
    root = root_image(work, tree)
    shutil.rmtree(tree)
    out = bootable_disk(work, root, kver, None, os.path.join(work, f"debian-{agent}.raw"), AZURE_APPEND)
    os.remove(root)
    return out


GPA = os.path.join(TOP, "testbed", "gpa")


def with_gpa(img):
    """Writes the Guest Proxy Agent's stand-in into the ext4 image `img` as its package would:
    /usr/sbin/azure-proxy-agent (0755) and its unit, enabled for multi-user.target."""
    unit = "/usr/lib/systemd/system/azure-proxy-agent.service"
    script = "\n".join([
        "cd /usr/sbin", f"write {GPA}/azure-proxy-agent azure-proxy-agent",
        "sif /usr/sbin/azure-proxy-agent mode 0100755",
        "cd /usr/lib/systemd/system", f"write {GPA}/azure-proxy-agent.service azure-proxy-agent.service",
        "sif " + unit + " mode 0100644",
        "symlink /etc/systemd/system/multi-user.target.wants/azure-proxy-agent.service " + unit, ""])
    cmds = img + ".debugfs"
    with open(cmds, "w") as f:
        f.write(script)
    sh("debugfs", "-w", "-f", cmds, img, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.remove(cmds)
    if debugfs_cat(img, "/usr/sbin/azure-proxy-agent") is None:
        raise RuntimeError("debugfs did not write the Guest Proxy Agent's stand-in")


def azprov_bootable(work, img, initrds):
    """The azprov image (`img`, its root filesystem) as an image builder uploads it: GPT,
    GRUB for BIOS and UEFI, the initramfs-tools initrd with azprov. Returns its path (raw)."""
    kver = next(l.split("vmlinuz-", 1)[1].split()[0] for l in
                subprocess.run(["debugfs", "-R", "ls -l /boot", img], capture_output=True, text=True,
                               check=True).stdout.splitlines() if "vmlinuz-" in l)
    return bootable_disk(work, img, kver, initrds["initramfs-tools"], os.path.join(work, "debian-azprov.raw"),
                            AZURE_APPEND)


def package_checks(tree, kver, initrd):
    """The .deb as Debian expects, on the image's tree once the disk is made from it: its files
    match their md5sums, the man page is there, and a purge regenerates the initramfs without
    azprov and takes its state and log with it."""
    t = time.time()
    shutil.copy(initrd, os.path.join(tree, "boot", f"initrd.img-{kver}"))
    check = os.path.join(tree, "tmp", "package-checks")
    in_root(tree, "dpkg --verify azprov; test -s /usr/share/man/man8/azprov.8.gz; "
                  "lsinitramfs /boot/initrd.img-" + kver + " | grep -q usr/sbin/azprov; "
                  "mkdir -p /var/lib/azprov; echo {} >/var/lib/azprov/state.json; echo x >/var/log/azprov.log; "
                  "dpkg --purge azprov >/dev/null 2>&1; "
                  "test ! -e /var/lib/azprov && test ! -e /var/log/azprov.log; "
                  "if lsinitramfs /boot/initrd.img-" + kver + " | grep -q azprov; then exit 1; fi; "
                  "touch /tmp/package-checks")
    if not os.path.exists(check):
        raise RuntimeError("distro: the package checks failed (dpkg --verify, man page, purge)")
    log(f"distro: package: dpkg --verify clean, man page installed; purge removed /var/lib/azprov and "
        f"/var/log/azprov.log and rebuilt the initramfs without azprov ({time.time() - t:.0f}s)")


def rpm_in_root(tree, args):
    """The host's rpm on `tree` (`--root`; the caller adds `--nodeps`: the root is Debian, not a
    RHEL-family system) in a private mount namespace with /proc, /sys, /dev and /dev/pts bound in, so its
    scriptlets run chrooted in the tree as they run on an image being built."""
    binds = " && ".join(f"mount --bind /{d} {tree}/{d}" for d in ("proc", "sys", "dev", "dev/pts"))
    sh("unshare", "-m", "--propagation", "private", "sh", "-c",
       f"{binds} && exec rpm --root {tree} {args}", stdout=subprocess.DEVNULL)


def directories(tree):
    """Every directory under `tree` (relative), /var/lib/rpm's database and /proc aside."""
    out = set()
    for top, dirs, _ in os.walk(tree):
        rel = os.path.relpath(top, tree)
        if rel.startswith(("var/lib/rpm", "proc", "sys", "dev")):
            dirs[:] = []
            continue
        out.add(rel)
    return out


def build_rpm_image(work, tar, rpm):
    """The Debian root with azprov installed from the RHEL-family RPM instead of the .deb: the
    RPM's files and its %post (the unit enabled, `dracut --regenerate-all --force`) are all
    that makes the image provision. Checks what a user of the RPM relies on, and that `rpm -e`
    undoes both. Returns the kernel, {"rpm": the initrd %post made}, the image."""
    t = time.time()
    tree, kver = extract_root(work, tar)
    initrd = os.path.join(tree, "boot", f"initrd.img-{kver}")
    stock = open(initrd, "rb").read()
    in_root(tree, "systemctl enable -q systemd-networkd")
    rpm_in_root(tree, "--initdb")
    dirs_before = directories(tree)
    # the package file is read from the host; its scriptlets run chrooted in the tree
    rpm_in_root(tree, f"-i --nodeps {rpm}")
    wants = os.path.join(tree, "etc/systemd/system/multi-user.target.wants/azprov-scripts.service")
    if not os.path.islink(wants):
        raise RuntimeError("distro: the RPM's %post did not enable azprov-scripts.service")
    if open(initrd, "rb").read() == stock:
        raise RuntimeError(f"distro: the RPM's %post did not regenerate /boot/initrd.img-{kver}")
    prep = time.time() - t
    kernel = os.path.join(work, "vmlinuz")
    shutil.copy(os.path.join(tree, "boot", f"vmlinuz-{kver}"), kernel)
    initrds = {"rpm": os.path.join(work, "initrd-rpm.img")}
    shutil.copy(initrd, initrds["rpm"])
    img = root_image(work, tree)
    # rpm -e: the unit disabled, every initramfs made again without the module
    t = time.time()
    in_root(tree, f"lsinitrd /boot/initrd.img-{kver} >/tmp/with.txt")
    rpm_in_root(tree, "-e --nodeps azprov")
    in_root(tree, f"lsinitrd /boot/initrd.img-{kver} >/tmp/without.txt")
    with_, without = (open(os.path.join(tree, "tmp", f)).read() for f in ("with.txt", "without.txt"))
    if "usr/sbin/azprov" not in with_ or "azprov" in without or os.path.lexists(wants):
        raise RuntimeError("distro: rpm -e left azprov in the initramfs or its unit enabled")
    # every directory the package made goes with it, but for those the RHEL family's own
    # packages own there and this Debian root lacks: /usr/share/licenses (filesystem's),
    # /usr/lib/dracut/dracut.conf.d (dracut's; Debian's dracut-core reads /etc's only)
    left = sorted(directories(tree) - dirs_before - {"usr/share/licenses", "usr/lib/dracut/dracut.conf.d", "tmp"})
    if left:
        raise RuntimeError(f"distro: rpm -e left the directories it made: {left}")
    log(f"distro: RPM installed with its scriptlets (unit enabled, dracut --regenerate-all) in {prep:.0f}s; "
        f"rpm -e disabled the unit and rebuilt the initramfs without azprov ({time.time() - t:.0f}s)")
    shutil.rmtree(tree)
    return kernel, initrds, img


# mkinitcpio (Arch's) is not packaged for Debian: its upstream v39 source and four ports to a
# Debian root, vendored as a test fixture with its GPL-2.0 licence (tests/vendor/mkinitcpio)
MKINITCPIO_VENDOR = os.path.join(TOP, "tests", "vendor", "mkinitcpio")
# bsdtar makes mkinitcpio's archive; busybox-static is the busybox image's shell and tools
MKINITCPIO_PACKAGES = PACKAGES + ["libarchive-tools", "busybox-static"]
# the two styles of image an Arch user builds: busybox init with runtime hooks, systemd with units
MKINITCPIO_HOOKS = {"mkinitcpio": "base udev modconf block filesystems fsck azprov",
                    "mkinitcpio-systemd": "base systemd modconf block filesystems fsck sd-azprov"}


def build_mkinitcpio_image(work, tar, deb):
    """The Debian root with mkinitcpio built from upstream (make install, as Arch's package
    does) and azprov laid out by scripts/install with the binary from the .deb, as an Arch
    package of azprov would lay it out; then one initramfs per MKINITCPIO_HOOKS entry, made by
    mkinitcpio itself in a chroot. Returns the kernel, the initrds by scenario, the image."""
    t = time.time()
    tree, kver = extract_root(work, tar)
    src = os.path.join(work, "mkinitcpio-src")
    os.makedirs(src)
    sh("tar", "-xzf", os.path.join(MKINITCPIO_VENDOR, "mkinitcpio-39.tar.gz"), "-C", src, "--strip-components=1")
    sh("patch", "-s", "-p1", "-d", src, "-i", os.path.join(MKINITCPIO_VENDOR, "debian12.patch"))
    # the man pages are made with asciidoctor, which the build needs no more than this test does
    for page in ("mkinitcpio.8", "mkinitcpio.conf.5", "lsinitcpio.1"):
        open(os.path.join(src, "man", page), "w").close()
    # VERSION given: the Makefile would ask git, and the tree is not mkinitcpio's clone
    sh("make", "-s", "-C", src, "install", "VERSION=39", f"DESTDIR={tree}", stdout=subprocess.DEVNULL)
    # mkinitcpio's base hook takes busybox from here (Arch's mkinitcpio-busybox package)
    shutil.copy(os.path.join(tree, "bin", "busybox"), os.path.join(tree, "usr/lib/initcpio/busybox"))
    unpacked = os.path.join(work, "deb")
    sh("dpkg-deb", "-x", deb, unpacked)
    sh(os.path.join(TOP, "scripts", "install"), "--destdir", tree, "--bin",
       os.path.join(unpacked, "usr/sbin/azprov"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    in_root(tree, "systemctl enable -q systemd-networkd azprov-scripts.service")
    for name, hooks in MKINITCPIO_HOOKS.items():
        with open(os.path.join(tree, "etc", f"{name}.conf"), "w") as f:
            f.write(f"MODULES=()\nBINARIES=()\nFILES=()\nHOOKS=({hooks})\nCOMPRESSION=zstd\n")
        in_root(tree, f"mkinitcpio --nocolor -k {kver} -c /etc/{name}.conf -g /boot/initramfs-{name}.img")
    prep = time.time() - t
    kernel = os.path.join(work, "vmlinuz")
    shutil.copy(os.path.join(tree, "boot", f"vmlinuz-{kver}"), kernel)
    initrds = {}
    for name in MKINITCPIO_HOOKS:
        initrds[name] = os.path.join(work, f"initrd-{name}.img")
        shutil.move(os.path.join(tree, "boot", f"initramfs-{name}.img"), initrds[name])
    img = root_image(work, tree)
    shutil.rmtree(tree)
    shutil.rmtree(src)
    shutil.rmtree(unpacked)
    sizes = ", ".join(f"{n} {os.path.getsize(p) / 1e6:.1f} MB" for n, p in initrds.items())
    log(f"distro: mkinitcpio v39 built from upstream, azprov laid out by scripts/install, initrds made in "
        f"{prep:.0f}s: {sizes}")
    return kernel, initrds, img


MKOSI_RECIPES = os.path.join(TOP, "examples", "mkosi")
# mount, umount and systemd-nspawn for a host whose kernel has no vfat (this tier's machines):
# mkosi mounts the ESP it makes (see host-shims/mount)
HOST_SHIMS = os.path.join(TOP, "qemu-tests", "host-shims")


def vfat_mountable():
    subprocess.run(["modprobe", "-q", "vfat"], check=False)
    with open("/proc/filesystems") as f:
        return any(l.split()[-1] == "vfat" for l in f if l.strip())


def shipped_checks(raw, variant):
    """What the image ships, read from its root partition: no kernel-install plugin of the
    build's left (a kernel update must reach the ESP), and Hyper-V's KVP daemon enabled."""
    parts = json.loads(subprocess.run(["sfdisk", "--json", raw], capture_output=True, text=True,
                                      check=True).stdout)["partitiontable"]
    root = next(p for p in parts["partitions"] if p.get("name") == "Root Partition" or p["type"].upper() in
                ("4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709", "0FC63DAF-8483-4772-8E79-3D69D8477DE4"))
    fs = f"{raw}?offset={root['start'] * parts.get('sectorsize', 512)}"
    ls = lambda d: subprocess.run(["debugfs", "-R", f"ls {d}", fs], capture_output=True, text=True,
                                  check=False).stdout
    plugins = ls("/etc/kernel/install.d")
    if ".install" in plugins:
        raise RuntimeError(f"mkosi-{variant}: the build's kernel-install plugins are left in the image: {plugins.split()}")
    # hyperv-daemons' udev rule starts hv-kvp-daemon.service when /dev/vmbus/hv_kvp appears
    if "hv_kvp_daemon" not in ls("/usr/sbin") or "60-hyperv-daemons.rules" not in ls("/usr/lib/udev/rules.d"):
        raise RuntimeError(f"mkosi-{variant}: no Hyper-V KVP daemon (hyperv-daemons) in the image")


def build_mkosi_image(work, variant, deb):
    """examples/mkosi/VARIANT built by mkosi as its README tells a user (the .deb in
    mkosi.extra/var/cache/azprov/), then made what Azure's upload takes: a fixed VHD of a whole
    number of MiB. mkosi's incremental cache (the image once its packages are in, before the
    extra tree and mkosi.postinst) is kept in the cache, keyed by mkosi.default and the apt
    sources. Returns the VHD."""
    t = time.time()
    recipe = os.path.join(work, "recipe")
    # symlinks followed: the variant's mkosi.extra and mkosi.postinst are the common ones
    shutil.copytree(os.path.join(MKOSI_RECIPES, variant), recipe)
    os.makedirs(os.path.join(recipe, "mkosi.extra/var/cache/azprov"))
    shutil.copy(deb, os.path.join(recipe, "mkosi.extra/var/cache/azprov"))
    with open(os.path.join(recipe, "mkosi.default"), "rb") as f, open(SOURCES, "rb") as g:
        key = hashlib.sha256(f.read() + g.read()).hexdigest()[:16]
    out = os.path.join(CACHE, f"mkosi-{variant}-{key}")
    for old in os.listdir(CACHE):
        if old.startswith(f"mkosi-{variant}-") and old != os.path.basename(out):
            shutil.rmtree(os.path.join(CACHE, old), ignore_errors=True)
    cached = os.path.isdir(out)
    # a package cache per variant: apt locks it, and the two variants build at the same time
    args = ["mkosi", "--force", "--incremental", "--cache", os.path.join(CACHE, f"mkosi-packages-{variant}"),
            "--output-dir", out]
    if not os.path.isdir("/run/systemd/system"):
        # no systemd as PID 1 (a container): nspawn cannot ask it for a scope
        args.append("--nspawn-keep-unit")
    env = dict(os.environ)
    if not vfat_mountable():
        env.update(PATH=f"{HOST_SHIMS}:{env['PATH']}", VFAT_STANDIN_STATE=os.path.join(work, "vfat-standins"))
    build_log = os.path.join(work, "mkosi.log")
    with open(build_log, "w") as f:
        r = subprocess.run(args + ["build"], cwd=recipe, env=env, stdout=f, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, check=False)
    if r.returncode != 0:
        tail = open(build_log, errors="replace").read().strip().splitlines()[-3:]
        raise RuntimeError(f"mkosi build exited {r.returncode} (qemu-tests/out/distro/mkosi-{variant}-image/mkosi.log): "
                           + " | ".join(tail))
    built = os.path.join(out, "debian~bookworm")
    raw = os.path.join(work, f"azure-debian12-{variant}.raw")
    os.rename(os.path.join(built, f"azure-debian12-{variant}.raw"), raw)
    for f in os.listdir(built):
        if not f.endswith(".cache-pre-inst"):
            os.remove(os.path.join(built, f))
    shipped_checks(raw, variant)
    # mkosi's disk is its partitions and the GPT, 40 KiB over a whole MiB
    vhd = fixed_vhd(raw)
    os.remove(raw)
    log(f"distro: examples/mkosi/{variant} built by mkosi {'from its cache ' if cached else ''}in "
        f"{time.time() - t:.0f}s: a fixed VHD of {(os.path.getsize(vhd) - 512) >> 20} MiB")
    return vhd



# Where each image's files are (removed once no scenario left needs it), and the image an
# image is made from.
IMAGE_DIR = {"plain": "plain", "cleaned": "plain/cleaned.img", "gpa": "plain/gpa.img", "bootable": "bootable", "cloud-init": "cloud-init",
             "waagent": "waagent", "rpm": "rpm", "mkinitcpio": "mkinitcpio-root", "hardened": "hardened",
             "mkosi-initramfs-tools": "mkosi-initramfs-tools-image", "mkosi-dracut": "mkosi-dracut-image"}
IMAGE_BASE = {"cleaned": "plain", "gpa": "plain", "bootable": "plain"}


class Images:
    """Each image built once, by the first scenario that needs it, while the other scenario
    that runs at the same time builds its own or boots: the builds (one core each: tar, dpkg,
    dracut, mkfs) overlap the boots instead of coming before them all. A build that failed
    fails every scenario that needs it, with its error. An image is removed once every
    scenario that needs it has ended (the tier's images take 5.6 GB together). `needs`: the
    image of each scenario that will run."""

    def __init__(self, builders, needs):
        self.builders, self.built, self.locks = builders, {}, {}
        self.guard = threading.Lock()
        self.users = {}
        for image in needs:
            self.users[image] = self.users.get(image, 0) + 1
            base = IMAGE_BASE.get(image)
            if base and self.users[image] == 1:
                self.users[base] = self.users.get(base, 0) + 1

    def release(self, name):
        """One scenario (or image) that needed `name` has ended."""
        with self.guard:
            self.users[name] -= 1
            last = self.users[name] == 0
        if last:
            path = os.path.join(OUT, IMAGE_DIR[name])
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
            if name in IMAGE_BASE:
                self.release(IMAGE_BASE[name])

    def get(self, name):
        with self.guard:
            lock = self.locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self.built:
                try:
                    self.built[name] = (True, self.builders[name](self))
                except Exception as e:  # kept, and raised again for every scenario that needs it
                    self.built[name] = (False, RuntimeError(f"building the {name} image: {type(e).__name__}: {e}"))
            ok, value = self.built[name]
            if not ok:
                raise value
            return value


TARBALL_LOCK = threading.Lock()


def tarball(packages, what):
    """debian_tarball, one mmdebstrap at a time (two builders may want the same root)."""
    with TARBALL_LOCK:
        tar, how = debian_tarball(packages)
    log(f"distro: Debian root {what}{how}")
    return tar


def builders(deb, rpm):
    """How each image is made, by name (see IMAGE_OF)."""
    def plain(_):
        kernel, initrds, img, prep, _ = build_images(os.path.join(OUT, "plain"), tarball(PACKAGES, ""), deb)
        sizes = ", ".join(f"{n} {os.path.getsize(p) / 1e6:.1f} MB" for n, p in initrds.items())
        log(f"distro: .deb installed and initrds built in {prep:.0f}s; initrds: {sizes}")
        return kernel, initrds, img, {}

    def cleaned(images):
        # the same image without SSH host keys, as `azprov clean` leaves it
        kernel, initrds, img, _ = images.get("plain")
        out = os.path.join(OUT, "plain", "cleaned.img")
        sh("cp", "--sparse=always", img, out)
        for k in ("rsa", "ecdsa", "ed25519"):
            for suffix in ("", ".pub"):
                sh("debugfs", "-w", "-R", f"rm /etc/ssh/ssh_host_{k}_key{suffix}", out,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return kernel, initrds, out, {}

    def gpa(images):
        # the same image with the Guest Proxy Agent's stand-in (testbed/gpa) and its unit
        # enabled, as an MSP image carries the real agent's package
        kernel, initrds, img, _ = images.get("plain")
        out = os.path.join(OUT, "plain", "gpa.img")
        sh("cp", "--sparse=always", img, out)
        with_gpa(out)
        return kernel, initrds, out, {}

    def bootable(images):
        t = time.time()
        _, initrds, img, _ = images.get("plain")
        raw = azprov_bootable(os.path.join(OUT, "bootable"), img, initrds)
        vhd = fixed_vhd(raw)
        log(f"distro: the image with GRUB for BIOS and UEFI (GPT), raw and fixed VHD, in {time.time() - t:.0f}s")
        kernel, initrds, _, _ = images.get("plain")
        return {"raw": raw, "vhd": vhd, "kernel": kernel, "initrds": initrds}

    def agent(name, packages):
        def build(_):
            t = time.time()
            out = build_agent_image(os.path.join(OUT, name), tarball(packages, f"with {name} "), name)
            log(f"distro: {name}'s GRUB image in {time.time() - t:.0f}s")
            return out
        return build

    def rpm_image(_):
        if rpm is None:
            raise RuntimeError("no RPM given (scripts/package makes it)")
        kernel, initrds, img = build_rpm_image(os.path.join(OUT, "rpm"), tarball(PACKAGES, ""), rpm)
        return kernel, initrds, img, {}

    def mkinitcpio(_):
        tar = tarball(MKINITCPIO_PACKAGES, "with bsdtar and busybox ")
        kernel, initrds, img = build_mkinitcpio_image(os.path.join(OUT, "mkinitcpio-root"), tar, deb)
        return kernel, initrds, img, {}

    def hardened(_):
        tar = tarball(HARDENED_PACKAGES, "hardened ")
        kernel, initrds, img, prep, disks = build_images(os.path.join(OUT, "hardened"), tar, deb, hardened=True)
        log(f"distro: hardened: .deb installed, initrds built, labelled in {prep:.0f}s")
        return kernel, initrds, img, disks

    def mkosi(variant):
        return lambda _: build_mkosi_image(os.path.join(OUT, f"mkosi-{variant}-image"), variant, deb)

    return {"plain": plain, "cleaned": cleaned, "gpa": gpa, "bootable": bootable, "cloud-init": agent("cloud-init", CLOUD_INIT_PACKAGES),
            "waagent": agent("waagent", WAAGENT_PACKAGES), "rpm": rpm_image, "mkinitcpio": mkinitcpio,
            "hardened": hardened, "mkosi-initramfs-tools": mkosi("initramfs-tools"), "mkosi-dracut": mkosi("dracut")}


