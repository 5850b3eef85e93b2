"""The QEMU end-to-end tier: a Debian cloud kernel, an initramfs from scripts/mkinitramfs with
azprov as /init, a provisioning CD, a small root whose init (qemu-tests/test-init) reports
what it finds, and the simulated Azure (testbed/azure.py) reached over tap0.

  qemu-tests/run [SCENARIO...]      (all scenarios when none is named; needs root)

Two scenarios run at a time. Each prints pass/fail and the time from QEMU start to the fabric
receiving Ready.
"""
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

from testbed.azure import GUEST_MAC, Azure
from testbed.check import Check, run_scenarios
from testbed.host import FIXTURES, OUT, TOP, build, log, mkinitramfs, sh
from testbed.images import (KEY, ROOT_UUID, debugfs_cat, ext4_clean, fetch_deb, gpt_primary, imds_doc, kernel,
                            make_cd, make_root, partitioned, sfdisk_dump)
from testbed.vm import (AZURE_ASSET_TAG, DMI_UUID, FINGERPRINTS_BEGIN, FINGERPRINTS_END, boot, boot_cut,
                        console_text, kvm_usable)


@contextlib.contextmanager
def happy(ctx, shape, hostname, with_cd=True, playbook=(), option245=True, extra="", fs="ext4", cd_fs="udf"):
    """The plain provisioning boot: the Azure, the root, when QEMU started, how long it ran, the
    console and QEMU's exit code."""
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc(hostname, has_custom_data=with_cd), playbook, option245) as azure:
        root = make_root(work, fs=fs)
        cd = make_cd(work, hostname + "-ovf", cd_fs) if with_cd else None
        start, took, out, rc = boot(azure, work, shape, ctx["kernel"], ctx["initrd"], root, cd, extra, ctx["accel"])
        yield azure, root, start, took, out, rc


def common_checks(c, azure, root, out, rc, hostname):
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
    posts = [r for r in azure.requests() if r.get("endpoint") == "health"]
    c(any(p.get("state") == "Ready" and p.get("status") == 200 for p in posts), f"no Ready reached the fabric: {posts}")


def run_gen1(ctx):
    c = Check()
    with happy(ctx, "gen1", "e2e-gen1") as (azure, root, start, took, out, rc):
        common_checks(c, azure, root, out, rc, "e2e-gen1")
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
        return c, azure.ready_after(start), took, out


def run_gen2(ctx):
    c = Check()
    # a module parameter on the command line reaches the module, as modprobe would pass it
    with happy(ctx, "gen2", "e2e-gen2", extra="virtio_net.csum=0") as (azure, root, start, took, out, rc):
        common_checks(c, azure, root, out, rc, "e2e-gen2")
        c(" csum=N" in out, "virtio_net.csum=0 on the command line did not reach virtio_net")
        c(f"UUID={ROOT_UUID} is /dev/sda" in out, "root=UUID= did not resolve to the SCSI disk")
        c("ovf-env.xml read from /dev/sr0 (udf)" in out, "the SCSI CD was not read")
        # q35 has no PIIX IDE (its SATA is AHCI) and no virtio-blk: their drivers stay out
        c("ata_piix (no device)" in out and "libata (only skipped modules need it)" in out
          and "virtio_blk (no device)" in out, "ata_piix, libata or virtio_blk was not left out")
        return c, azure.ready_after(start), took, out


def run_xfs_root(ctx):
    """A RHEL-family layout: the root on xfs, found by UUID on the Gen2 SCSI disk. xfs is one
    of the modules the initramfs keeps LZ4-compressed (.ko.lz4): azprov decompresses it and
    loads it once the superblock says xfs. The root is read back through the real init's
    console lines (debugfs reads only ext4)."""
    c = Check()
    with happy(ctx, "gen2", "e2e-xfs", fs="xfs") as (azure, _root, start, took, out, rc):
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
        posts = [r for r in azure.requests() if r.get("endpoint") == "health"]
        c(any(p.get("state") == "Ready" and p.get("status") == 200 for p in posts), f"no Ready: {posts}")
        return c, azure.ready_after(start), took, out


def run_second_boot(ctx):
    """Boots a provisioned disk again: no DHCP, no fabric request, straight to the real init."""
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc("e2e-second")) as azure:
        root = make_root(work)
        cd = make_cd(work, "e2e-second")
        _, _, out1, rc1 = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "", ctx["accel"])
        c(rc1 == 0 and "REALROOT-DONE" in out1, "the first boot failed")
        before, dhcp_before = len(azure.requests()), azure.dhcp_discovers()
        _start, took, out, rc = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "", ctx["accel"])
        time.sleep(0.3)
        c(rc == 0 and "REALROOT-DONE" in out, "the second boot did not reach the real init")
        c("already provisioned" in out, "azprov did not say it was already provisioned")
        c(len(azure.requests()) == before, f"the fabric got {len(azure.requests()) - before} request(s) on the second boot")
        c(azure.dhcp_discovers() == dhcp_before, "DHCP ran on the second boot")
        return c, None, took, out


def run_growroot(ctx):
    """The OS disk is larger than the image: the root's GPT partition (Gen2's SCSI disk, found
    by UUID, with 4096-byte logical sectors: 4Kn) and its ext4 grow to the disk's end on the
    first boot, online; the second boot finds nothing to do."""
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc("e2e-grow")) as azure:
        disk = partitioned(work, make_root(work, block=4096), "gpt", 256, sector=4096)
        cd = make_cd(work, "e2e-grow")
        _start, took, out, rc = boot(azure, work, "gen2-4kn", ctx["kernel"], ctx["initrd"], disk, cd, "",
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
        _s, _t, out2, rc2 = boot(azure, work, "gen2-4kn", ctx["kernel"], ctx["initrd"], disk, cd, "", ctx["accel"])
        c(rc2 == 0 and "growroot: skipped: sda1 fills its disk already" in out2,
          "the second boot did not find the root grown already")
        return c, azure.ready_after(_start), took, out + out2


def run_growroot_fs(ctx, fs):
    """growroot of an xfs or btrfs root (Gen2's SCSI disk, GPT, 256 MiB behind the image): the
    partition and the filesystem grow online by the filesystem's own ioctl; the second boot
    finds nothing to do."""
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc(f"e2e-grow-{fs}")) as azure:
        img = make_root(work, fs=fs)
        img_mib = os.path.getsize(img) >> 20
        disk = partitioned(work, img, "gpt", img_mib + 256)
        cd = make_cd(work, f"e2e-grow-{fs}")
        _start, took, out, rc = boot(azure, work, "gen2", ctx["kernel"], ctx["initrd"], disk, cd, "", ctx["accel"])
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
        _s, _t, out2, rc2 = boot(azure, work, "gen2", ctx["kernel"], ctx["initrd"], disk, cd, "", ctx["accel"])
        c(rc2 == 0 and "growroot: skipped: sda1 fills its disk already" in out2,
          "the second boot did not find the root grown already")
        return c, azure.ready_after(_start), took, out + out2


def run_growroot_powercut(ctx):
    """A power cut at each step of growroot's table rewrite (QEMU killed as the guest's write
    reaches the disk, so that write and all after it are lost), ones that tear the backup
    array and the staged array in their middle, and one after its last write, while the
    filesystem grows: after every cut the primary table the kernel reads is the old one or the
    new one, with nothing to put back (so a hook-mode framework finds the root too); the next
    boot grows what is left, and the filesystem is clean."""
    c = Check()
    work = ctx["work"]
    out_all, took = "", 0
    with Azure(work, ctx["tag"], imds_doc("e2e-cut")) as azure:
        cd = make_cd(work, "e2e-cut")
        sectors = 256 << 11
        # a cut at the first write touching each sector of the table, in growroot's order
        # (disk::grow): the protective MBR, the backup array (whole, and torn after 16 of its
        # 32 sectors) and header at the new end, the new array staged after the primary's
        # (whole, and torn), the primary header swapped onto it, the array in its place, and
        # last a cut after the table, while the filesystem grows. What the kernel then reads:
        # the old primary or the new one, never one to put back
        steps = [("the protective MBR", 0, False, "old"), ("the backup array", sectors - 33, False, "old"),
                 ("the backup array, torn in its middle", sectors - 33 + 16, True, "old"),
                 ("the backup header", sectors - 1, False, "old"), ("the staged array", 34, False, "old"),
                 ("the staged array, torn in its middle", 34 + 16, True, "old"),
                 ("the primary header, onto the staged array", 1, False, "old"),
                 ("the primary array, in its place", 2, False, "new"), ("after the table", None, False, "new")]
        for i, (what, sector, torn, want) in enumerate(steps):
            disk = partitioned(work, make_root(work), "gpt", 256)
            old = gpt_primary(disk)
            how, out = boot_cut(azure, work, ctx["kernel"], ctx["initrd"], disk, cd, sector=sector, torn=torn,
                                console_mark=None if sector is not None else "growroot: partition")
            out_all += f"\n==== cut {i} at {what}: {how}\n{out}"
            c(how == ("write" if sector is not None else "console"), f"cut {i} ({what}): the boot ended by {how}")
            after = gpt_primary(disk)
            seen = "unsound" if after is None else "old" if after == old else "new" if after[0] == 524254 else after
            c(seen == want, f"cut {i} ({what}): the primary GPT is {seen} ({after}), not {want} (was {old})")
            _start, took, out2, rc = boot(azure, work, "gen2", ctx["kernel"], ctx["initrd"], disk, cd, "",
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


def run_growroot_mbr(ctx):
    """growroot on an MBR disk (Gen1's virtio disk): the root partition grows; with a partition
    behind it, it is left alone and the boot says why."""
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc("e2e-growmbr")) as azure:
        disk = partitioned(work, make_root(work), "dos", 128)
        cd = make_cd(work, "e2e-growmbr")
        _start, took, out, rc = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], disk, cd, "root=/dev/vda1",
                                     ctx["accel"])
        c(rc == 0 and "REALROOT-DONE" in out, "the boot did not reach the real init")
        c(re.search(r"growroot: partition vda1 \+\d+ MiB \(MBR\) in \d+ ms; ext4 4\d MiB -> 12\d MiB", out)
          is not None, "growroot did not grow the MBR partition and ext4")
        blocked = partitioned(work, make_root(work, name="root2.img"), "dos", 128, after=8)
        _s, _t, out2, rc2 = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], blocked, cd,
                                 "root=/dev/vda1", ctx["accel"])
        c(rc2 == 0 and "growroot: skipped: vda1: partition 2 lies after it; not grown" in out2,
          "a partition that is not last was not left alone with its reason")
        return c, azure.ready_after(_start), took, out + out2


def run_no_cd(ctx):
    c = Check()
    with happy(ctx, "gen1", "e2e-nocd", with_cd=False) as (azure, root, start, took, out, rc):
        common_checks(c, azure, root, out, rc, "e2e-nocd")
        c("no provisioning media" in out, "azprov did not note the missing media")
        # every controller was probed inside its module's load: nothing to wait out
        c("no CD-ROM drive after" not in out, "azprov waited out the CD settle time without a CD")
        c(" csum=Y" in out, "virtio_net's csum default changed without a parameter")
        return c, azure.ready_after(start), took, out


def run_nvme_mana(ctx):
    """Azure's current hardware: the OS disk on NVMe and, as the only NIC, one that is neither
    virtio nor hv_netvsc (vmxnet3 standing in for MANA, added with mkinitramfs --modules +NAME)."""
    c = Check()
    work = ctx["work"]
    initrd = os.path.join(work, "initrd.img")
    mkinitramfs(initrd, ctx["moddir"], "--azprov", ctx["azprov"], "--modules", "+vmxnet3")
    with Azure(work, ctx["tag"], imds_doc("e2e-nvme")) as azure:
        root = make_root(work)
        cd = make_cd(work, "e2e-nvme-ovf")
        start, took, out, rc = boot(azure, work, "nvme", ctx["kernel"], initrd, root, cd, "", ctx["accel"],
                                    nic="vmxnet3")
        common_checks(c, azure, root, out, rc, "e2e-nvme")
        c("/dev/nvme0n1 is /dev/nvme0n1 (ext4), mounted at /sysroot" in out, "the root was not mounted from NVMe")
        # vmxnet3 loaded (a skipped module is named with why), virtio's NIC driver left out
        c("vmxnet3 (" not in out and "virtio_net (no device)" in out, "vmxnet3 was not loaded, or virtio_net was")
        c(re.search(r"azprov: dhcp: \d+ ms: eth0 10\.44\.0\.\d+/24", out) is not None, "no lease on the vmxnet3 NIC")
        return c, azure.ready_after(start), took, out


def run_missing_init(ctx):
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc("e2e-noinit")) as azure:
        root = make_root(work)
        before = debugfs_cat(root, "/etc/hostname")
        cd = make_cd(work, "e2e-noinit")
        _start, took, out, rc = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "init=/sbin/nosuchinit", ctx["accel"])
        c("init=/sbin/nosuchinit is not an executable file" in out, "no clear error on the console")
        c("REALROOT-INIT" not in out, "something ran in the real root")
        c(debugfs_cat(root, "/etc/hostname") == before, "the real root was modified")
        c(debugfs_cat(root, "/var/lib/azprov/provisioned") is None, "a marker was written")
        c(azure.requests() == [], "the fabric was contacted")
        c(rc == 0, f"azprov.onfail=poweroff did not power off (rc {rc})")
        return c, None, took, out


def run_imds_down(ctx):
    c = Check()
    pb = [{"endpoint": "imds", "requests": "*", "status": 503}]
    with happy(ctx, "gen1", "e2e-imdsdown", playbook=pb, extra="azprov.timeout=20") as (azure, _root, start, took, out, rc):
        # hostname comes from the CD this time
        c(rc == 0 and "REALROOT-DONE" in out, "did not boot through")
        c("hostname=e2e-imdsdown-ovf" in out, "hostname was not taken from ovf-env.xml")
        posts = [r for r in azure.requests() if r.get("endpoint") == "health"]
        c(any(p.get("state") == "Ready" for p in posts), "no Ready")
        c(sum(1 for r in azure.requests() if r.get("server") == "imds") > 1, "IMDS was not retried")
        return c, azure.ready_after(start), took, out


def run_no_option_245(ctx):
    """No DHCP option 245, and a provisioning CD in iso9660 (Rock Ridge) without UDF, as Azure
    Stack's may be: isofs, which the initramfs holds back, is loaded for it on demand."""
    c = Check()
    with happy(ctx, "gen1", "e2e-no245", option245=False, cd_fs="iso9660") as (azure, root, start, took, out, rc):
        common_checks(c, azure, root, out, rc, "e2e-no245")
        c("wireserver (none, using 168.63.129.16)" in out, "the fallback to 168.63.129.16 was not logged")
        c("ovf-env.xml read from /dev/sr0 (iso9660)" in out, "the iso9660 CD was not read as iso9660")
        c(re.search(r"modules: \d+ ms: isofs for iso9660", out) is not None, "isofs was not loaded for the iso9660 CD")
        c("UDF-fs" not in out, "the CD without UDF was tried as udf")
        return c, azure.ready_after(start), took, out


def run_no_root(ctx):
    """root= names nothing: the wait is bounded, the reason repeats, azprov.onfail is followed."""
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc("e2e-noroot")) as azure:
        root = make_root(work)
        _start, took, out, rc = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], root, None,
                                    "root=UUID=00000000-1111-2222-3333-444444444444 rootdelay=3", ctx["accel"])
        want = "cannot boot: root device UUID=00000000-1111-2222-3333-444444444444 did not appear within 3s"
        c(out.count(want) >= 3, "the reason was not repeated on the console")
        c(rc == 0, f"azprov.onfail=poweroff did not power off (rc {rc})")
        c(azure.requests() == [], "the fabric was contacted")
        return c, None, took, out


def run_not_azure(ctx):
    """No Azure chassis asset tag: straight to the real init, no packet, the root untouched."""
    c = Check()
    work = ctx["work"]
    with Azure(work, ctx["tag"], imds_doc("e2e-notazure")) as azure:
        root = make_root(work)
        before = debugfs_cat(root, "/etc/hostname")
        cd = make_cd(work, "e2e-notazure")
        _start, took, out, rc = boot(azure, work, "gen1", ctx["kernel"], ctx["initrd"], root, cd, "", ctx["accel"],
                                    on_azure=False)
        time.sleep(0.3)
        c(rc == 0 and "REALROOT-DONE" in out, "did not reach the real init")
        c("not an Azure VM" in out, "azprov did not say why it did nothing")
        c(azure.requests() == [], "the fabric was contacted")
        c(azure.dhcp_discovers() == 0, "DHCP ran")
        c(debugfs_cat(root, "/etc/hostname") == before, "the root was modified")
        c(debugfs_cat(root, "/var/lib/azprov/provisioned") is None, "a marker was written")
        return c, None, took, out


def run_arm64(ctx):
    """Azure's Arm VMs (Cobalt, Ampere): Gen2 only, UEFI, SCSI. The aarch64 build of azprov in
    an initramfs of Debian's cloud-arm64 kernel, booted by QEMU's virt machine with UEFI
    firmware (which hands SMBIOS, so DMI, to the kernel) under TCG; virtio-scsi disk and CD."""
    c = Check()
    work = ctx["work"]
    kernel_img, moddir = kernel("arm64")
    azprov = build("--target", "aarch64")
    initrd = os.path.join(work, "initrd-arm64.img")
    # the test root is ext4: --root-fs leaves xfs and btrfs out of the image; zstd, so that the
    # other compression boots too (the x86_64 scenarios have the default, lz4)
    mkinitramfs(initrd, moddir, "--arch", "arm64", "--azprov", azprov, "--root-fs", "ext4", "--compress", "zstd")
    listed = subprocess.run(f"zstd -dc {initrd} | cpio -i --quiet --to-stdout etc/azprov/modules", shell=True,
                            check=True, stdout=subprocess.PIPE, text=True).stdout
    c("/xfs.ko" not in listed and "/btrfs.ko" not in listed and "/udf.ko" in listed,
      "--root-fs ext4 did not leave exactly xfs and btrfs out")
    busybox = os.path.join(fetch_deb("busybox-static", "arm64"), "bin", "busybox")
    with Azure(work, ctx["tag"], imds_doc("e2e-arm64")) as azure:
        root = make_root(work, busybox=busybox)
        cd = make_cd(work, "e2e-arm64-ovf")
        append = (f"console=ttyAMA0 loglevel=6 panic=-1 root=UUID={ROOT_UUID} rw rootwait "
                  f"azprov.timeout=90 azprov.onfail=poweroff {os.environ.get('QEMU_TESTS_APPEND', '')}").strip()
        console = os.path.join(work, "console.log")
        cmd = azure.inside(
            "timeout", "400", "qemu-system-aarch64", "-M", "virt", "-cpu", "max", "-accel", "tcg", "-m", "512",
            "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot", "-uuid", DMI_UUID,
            "-bios", "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd",
            "-smbios", f"type=3,asset={AZURE_ASSET_TAG}",
            "-kernel", kernel_img, "-initrd", initrd, "-append", append,
            "-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=n0,mac={GUEST_MAC}",
            "-device", "virtio-scsi-pci,id=scsi0",
            "-drive", f"file={root},format=raw,if=none,id=hd0", "-device", "scsi-hd,drive=hd0,bus=scsi0.0",
            "-drive", f"file={cd},format=raw,if=none,media=cdrom,id=cd0,readonly=on",
            "-device", "scsi-cd,drive=cd0,bus=scsi0.0",
            "-serial", f"file:{console}")
        start = time.time()
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        took = time.time() - start
        out = console_text(console)
        if r.returncode:
            out += f"\n[qemu rc={r.returncode}] {r.stderr}"
        common_checks(c, azure, root, out, r.returncode, "e2e-arm64")
        c("azprov " in out and "as PID 1" in out, "azprov did not run as PID 1")
        # UEFI: Gen2 rules, the DMI UUID as it is (no Gen1 byte swap)
        c((debugfs_cat(root, "/var/lib/azprov/provisioned") or "").strip() == DMI_UUID,
          "the marker is not the unswapped DMI UUID")
        c("ovf-env.xml read from /dev/sr0" in out, "the SCSI CD was not read")
        return c, azure.ready_after(start), took, out


LINUXKIT_FRONT = os.path.join(TOP, "examples", "linuxkit", "azprov-in-front")
INPLACE_KEY2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBsecondkeyoftheinplacetestvm00000000 second@inplace"


def linuxkit_os(work):
    """A small system whose initramfs is the OS, as linuxkit makes one: busybox, /etc's
    account files, and qemu-tests/inplace-init as its /init (what examples/linuxkit moves
    aside for azprov). A gzip'd newc cpio."""
    tree = os.path.join(work, "os")
    shutil.rmtree(tree, ignore_errors=True)
    for d in ("bin", "etc", "proc", "sys", "run", "tmp", "root"):
        os.makedirs(os.path.join(tree, d))
    shutil.copy(shutil.which("busybox") or "/bin/busybox", os.path.join(tree, "bin", "busybox"))
    os.symlink("busybox", os.path.join(tree, "bin", "sh"))
    for f in ("passwd", "group", "shadow", "gshadow"):
        shutil.copy(os.path.join(FIXTURES, "root", "etc", f), os.path.join(tree, "etc", f))
    shutil.copy(os.path.join(TOP, "qemu-tests", "inplace-init"), os.path.join(tree, "init"))
    os.chmod(os.path.join(tree, "init"), 0o755)
    out = os.path.join(work, "os.cpio.gz")
    sh("sh", "-c", f"cd {tree} && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -9n > {out}")
    return out


def run_inplace(ctx):
    """azprov.inplace: azprov's initramfs put in front of a linuxkit-style OS by
    examples/linuxkit/azprov-in-front, booted with no root=: azprov provisions the RAM root and
    writes /run/config, reports Ready, and execs the OS's init in place, as PID 1, with nothing
    mounted. One boot with JSON user data (expanded with its modes; a name with `..` refused),
    one with a #! script as user data: the exact bytes."""
    c = Check()
    work = ctx["work"]
    initrd = os.path.join(work, "initrd-inplace.img")
    sh(LINUXKIT_FRONT, linuxkit_os(work), ctx["initrd"], initrd, "azprov.timeout=60", stderr=subprocess.DEVNULL)
    json_ud = json.dumps({"motd": {"content": "hello\n"}, "secret": {"perm": "0600", "content": "s3"},
                          "conf.d": {"entries": {"a.conf": {"perm": "0640", "content": "a=1\n"}}},
                          "../escape": {"content": "x"}}).encode()
    script_ud = b"#!/bin/sh\necho from user data\n"
    outs, took, ready = "", 0, None
    for n, (userdata, expect) in enumerate([(json_ud, {"/run/config/motd": "644", "/run/config/secret": "600",
                                                        "/run/config/conf.d": "755", "/run/config/conf.d/a.conf": "640"}),
                                            (script_ud, {})]):
        doc = imds_doc("e2e-inplace")
        doc["compute"]["publicKeys"].append({"keyData": INPLACE_KEY2, "path": "/home/azureuser/.ssh/authorized_keys"})
        doc["compute"]["userData"] = base64.b64encode(userdata).decode()
        with Azure(work, f"{ctx['tag']}{n}", doc) as azure:
            cd = make_cd(work, "e2e-inplace-ovf")
            start, took, out, rc = boot(azure, work, "gen1", ctx["kernel"], initrd, None, cd, accel=ctx["accel"],
                                        append="console=ttyS0 loglevel=6 panic=-1 azprov.onfail=poweroff")
            outs += f"\n==== boot {n}\n{out}"
            ready = azure.ready_after(start) if n == 0 else ready
            what = f"boot {n}"
            c(rc == 0 and "INPLACE-DONE" in out, f"{what}: the OS's init did not run to its end (rc {rc})")
            c("INPLACE-INIT pid=1 hostname=e2e-inplace" in out, f"{what}: the init is not PID 1 with IMDS's hostname")
            for f, want in (("provider", "azure"), ("hostname", "e2e-inplace"), ("local_hostname", "e2e-inplace")):
                c(f"INPLACE file {f}={want}" in out, f"{what}: /run/config/{f} is not {want}")
            keys = [l for l in out.splitlines() if l.startswith("INPLACE key ")]
            c(any(KEY.strip() in l for l in keys) and any(INPLACE_KEY2 in l for l in keys),
              f"{what}: both IMDS keys are not in authorized_keys: {keys}")
            c(f"INPLACE userdata-sha256={hashlib.sha256(userdata).hexdigest()}" in out,
              f"{what}: /run/config/userdata is not the user data's bytes")
            paths = dict(l.split()[3:1:-1] for l in out.splitlines() if l.startswith("INPLACE path "))
            c(paths.get("/run/config/ssh/authorized_keys") == "600", f"{what}: authorized_keys is {paths.get('/run/config/ssh/authorized_keys')}")
            for p, mode in expect.items():
                c(paths.get(p) == mode, f"{what}: {p} is {paths.get(p)}, not {mode}")
            outside = [p for p in paths if not p.startswith(("/run/config", "/run/azprov"))]
            c(outside == [], f"{what}: written outside /run/config: {outside}")
            mounts = next((l for l in out.splitlines() if l.startswith("INPLACE mounts=")), "")
            c(" /dev " not in mounts + " " and " /run " not in mounts + " ", f"{what}: azprov left mounts: {mounts}")
            c("INPLACE passwd=1" in out, f"{what}: the admin user is not in the RAM root's /etc/passwd")
            posts = [r for r in azure.requests() if r.get("endpoint") == "health"]
            c([p.get("state") for p in posts] == ["Ready"], f"{what}: health reports {[p.get('state') for p in posts]}")
    return c, ready, took, outs


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
    "inplace": run_inplace,
    "growroot-xfs": lambda ctx: run_growroot_fs(ctx, "xfs"),
    "growroot-btrfs": lambda ctx: run_growroot_fs(ctx, "btrfs"),
}


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
    azprov = build()
    initrd = os.path.join(OUT, "initrd.img")
    log(mkinitramfs(initrd, moddir, "--azprov", azprov).strip())
    accel = "kvm" if kvm_usable() else "tcg"
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
            return name, [f"{type(e).__name__}: {e}"], "broken"
        with open(os.path.join(work, "console.txt"), "w") as f:
            f.write(out)
        ready_s = f"{ready:.2f}s" if ready is not None else "-"
        return name, c.failures, f"QEMU start to Ready {ready_s} ({accel}), qemu {took:.1f}s"

    sys.exit(1 if run_scenarios("qemu-tests", names, one, OUT) else 0)
