"""The distro tier: real distribution images (testbed/debian.py) with azprov installed as a
user installs it, booted in QEMU against the simulated Azure, and logged into over SSH with the
key the fabric handed out; whole disk images tried through scripts/try-image.

  qemu-tests/distro DEB [RPM] [SCENARIO...]   (all scenarios when none is named; needs root;
                                             rpm-dracut needs the x86_64 RPM)

Every boot passes `root=UUID=... ro` as Debian's GRUB does. Two scenarios run at a time, in an
order where the first few need different images, so images build while others boot.
"""
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

from testbed.azure import Azure
from testbed.check import Check, run_scenarios
from testbed.debian import MKINITCPIO_VENDOR, OUT, SELINUX_APPEND, Images, builders
from testbed.host import TOP, sh
from testbed.images import ROOT_UUID, gpt_primary, imds_doc, ntfs_resource_disk, ovf_env, root_files, write_cd
from testbed.vm import BOOT_TIMEOUT, FINGERPRINTS_BEGIN, USER, VM, boot_cut, console_text

TRY_IMAGE = os.path.join(TOP, "scripts", "try-image")
# custom data that is a script: azprov-scripts.service runs it once per VM. It first waits for
# the boot to finish, as scripts that wait for the boot do (systemctl is-system-running --wait):
# a unit whose start lasted as long as the script would hold up the boot the script waits for,
# and the line would never be written.
CUSTOM_SCRIPT = ("#!/bin/sh\nlog=/var/tmp/azprov-customdata.log\n"
                 "state=$(systemctl is-system-running --wait)\n"
                 "echo \"customdata ran as $(id -un) once the boot was $state\" >>$log\n")
SCRIPT_CHECK = ("systemctl is-system-running --wait >/dev/null; cat /var/tmp/azprov-customdata.log; "
                "sudo -n azprov status | grep '^script:'")


@contextlib.contextmanager
def provisioning(ctx, host, msp=False, fabric_args=()):
    """The Azure a Debian image meets (`ctx["key_pub"]` the admin's key in IMDS) and the
    provisioning CD (CUSTOM_SCRIPT as custom data); with `msp`, a VM created with the Metadata
    Security Protocol (the CD's flag, and the fabric's secure channel with `fabric_args`)."""
    doc = imds_doc(host)
    doc["compute"]["publicKeys"] = [{"keyData": ctx["key_pub"], "path": f"/home/{USER}/.ssh/authorized_keys"}]
    args = ["--msp", *fabric_args] if msp else list(fabric_args)
    with Azure(ctx["work"], ctx["tag"], doc, fabric_args=args) as azure:
        custom = CUSTOM_SCRIPT.encode()
        yield azure, write_cd(ctx["work"], ovf_env(host, USER, custom_data=custom, msp=msp), custom)


LOGIN_CHECK = ("id; hostname; sudo -n true && echo SUDO-OK; ssh-keygen -l -f /etc/ssh/ssh_host_ed25519_key.pub; "
               "sudo -n journalctl -t azprov -b --no-pager -o cat")


def login_checks(c, r, host, what):
    c(r is not None, f"{what}: no SSH login with the provisioned key")
    if r is None:
        return
    c(f"uid=1000({USER})" in r.stdout, f"{what}: id says {r.stdout.splitlines()[:1]}")
    c(f"\n{host}\n" in r.stdout, f"{what}: hostname is not {host}")
    c("SUDO-OK" in r.stdout, f"{what}: sudo -n true failed")


# What the hardened image is checked for after the first login, each answer behind a marker.
AZPROV_PATHS = ("/etc/passwd /etc/group /etc/shadow /etc/gshadow /etc/subuid /etc/subgid /etc/.pwd.lock "
                "/etc/hostname /etc/hosts /etc/sudoers /etc/sudoers.d /etc/ssh /home/azureuser /var/lib/azprov "
                "/var/log/azprov.log")
HARDENED_CHECK = (
    "; echo ENFORCE=$(cat /sys/fs/selinux/enforce)"
    "; echo SSHD-$(sudo -n /usr/sbin/sshd -T | grep -i '^passwordauthentication ')"
    "; echo HOME-SRC=$(findmnt -n -o SOURCE --target $HOME); echo STATE-SRC=$(findmnt -n -o SOURCE --target /var/lib/azprov)"
    "; echo SUBUID=$(grep -c '^azureuser:' /etc/subuid); echo SHELL=$(getent passwd azureuser | cut -d: -f7)"
    f"; echo RESTORECON-BEGIN; sudo -n restorecon -n -v -R -F {AZPROV_PATHS} 2>&1; echo RESTORECON-END"
    "; echo AVC=$(sudo -n journalctl -k -b --no-pager -o cat | grep -c 'avc: *denied')"
    "; echo AVC-UNLABELED=$(sudo -n journalctl -k -b --no-pager -o cat | grep 'avc: *denied' | grep -c unlabeled_t)"
    "; echo STATUS-BEGIN; sudo -n azprov status; echo STATUS-END")


def marked(out, key):
    """The value after `KEY=` on its own line of `out`, or None."""
    return next((l[len(key) + 1:] for l in out.splitlines() if l.startswith(key + "=")), None)


def hardened_checks(c, r, what):
    if r is None:
        return {}
    out = r.stdout
    c(marked(out, "ENFORCE") == "1", f"{what}: SELinux is not enforcing ({marked(out, 'ENFORCE')})")
    c("SSHD-passwordauthentication no" in out,
      f"{what}: sshd -T does not say passwordauthentication no: {[l for l in out.splitlines() if l.startswith('SSHD-')]}")
    c(marked(out, "HOME-SRC") == "/dev/vdb", f"{what}: the home is on {marked(out, 'HOME-SRC')}, not the /home filesystem")
    c(marked(out, "STATE-SRC") == "/dev/vdc", f"{what}: /var/lib/azprov is on {marked(out, 'STATE-SRC')}, not /var's")
    c(marked(out, "SUBUID") == "1", f"{what}: azureuser has {marked(out, 'SUBUID')} subordinate uid range(s)")
    c(marked(out, "SHELL") == "/bin/bash", f"{what}: the login shell is {marked(out, 'SHELL')}")
    relabel = out.split("RESTORECON-BEGIN", 1)[-1].split("RESTORECON-END", 1)[0].strip()
    c(relabel == "", f"{what}: restorecon would change: {relabel[:600]}")
    c(marked(out, "AVC-UNLABELED") == "0", f"{what}: {marked(out, 'AVC-UNLABELED')} AVC denial(s) on unlabeled files")
    status = out.split("STATUS-BEGIN", 1)[-1].split("STATUS-END", 1)[0]
    c(re.search(r"^provisioned: +yes$", status, re.M) and re.search(r"^report: +ready$", status, re.M),
      f"{what}: azprov status says {status.strip()[:200]!r}")
    avc = marked(out, "AVC")
    return {"avc_denials": int(avc)} if avc and avc.isdigit() else {}


def sshd_reload_check(c, b, key):
    """The RSA helper, after the handover, found the sshd that started before its key and
    signalled it (through the /proc and /run handles it was given), and sshd reloaded."""
    said = b.wait_console("reloaded to offer the rsa key", timeout=BOOT_TIMEOUT)
    c(said is not None, "the helper did not say it reloaded sshd after the rsa key")
    r = b.ssh(key, "sudo -n journalctl -u ssh -b -o cat --no-pager | grep -c 'Received SIGHUP'; true")
    hups = (r.stdout.strip().splitlines() or ["0"])[0] if r else "0"
    c(hups.isdigit() and int(hups) >= 1, f"sshd logged no reload after the rsa key ({hups} SIGHUP lines)")


def rsa_fingerprint(b, azure):
    """The SHA256 fingerprint of the RSA host key the guest's sshd offers, or None."""
    keys = azure.keyscan(b.guest_addr(), "rsa", timeout=5)
    if "ssh-rsa" not in keys:
        return None
    f = subprocess.run(["ssh-keygen", "-l", "-f", "-"], input=keys, capture_output=True, text=True, check=False)
    return next((w for w in f.stdout.split() if w.startswith("SHA256:")), None)


def rsa_kept_check(c, b, azure):
    """The image's sshd-keygen unit made the RSA key before sshd started; azprov's helper,
    done after it, kept that key and printed its fingerprint: a client that recorded the key at
    the first login never sees it change."""
    first = rsa_fingerprint(b, azure)
    c(first is not None, "sshd offers no RSA key at the first login (the image's sshd-keygen unit made none)")
    kept = b.wait_console("an rsa key appeared in /etc/ssh while ours was made")
    c(kept is not None, "the helper did not say it kept the RSA key the system made")
    later = rsa_fingerprint(b, azure)
    c(first is not None and later == first, f"the RSA key sshd offers changed: {first} at the first login, {later} after")
    block = b.out().replace("\r", "").split(FINGERPRINTS_BEGIN + "\n")[-1]
    c(first is not None and any(first in l and l.endswith("(RSA)") for l in block.splitlines()),
      "the console's last fingerprint block does not give the RSA key sshd offers")


def provisioned_boot(ctx, flavour, second_boot, hardened=False, ran=None, resource=None):
    """The image provisioned on its first boot (and, with `second_boot`, left alone on the
    next); `ran`: the console line that shows the initramfs ran azprov the way it should;
    `resource`: a ResourceDisk attached, checked on each boot."""
    c = Check()
    host = f"deb-{flavour}" + ("-h" if hardened else "")
    figures = {}
    extra = " ".join(filter(None, [SELINUX_APPEND if hardened else "", resource.append if resource else ""]))
    check = LOGIN_CHECK + (HARDENED_CHECK if hardened else "")
    disks = list(ctx.get("disks", ())) + (resource.disks if resource else [])
    with provisioning(ctx, host) as (azure, cd):
        boot = lambda name: VM(azure, ctx["work"], name, ctx["kernel"], ctx["initrds"][flavour], ctx["img"], cd, extra,
                               disks=disks)
        with boot("first") as b:
            r, t_ssh = b.wait_ssh(ctx["key"], check)
            figures["ready"], figures["ssh"] = azure.ready_after(b.start), t_ssh
            login_checks(c, r, host, "first boot")
            if resource:
                resource.check(c, b, ctx["key"], "first boot")
            if hardened:
                figures.update(hardened_checks(c, r, "first boot"))
                rsa_kept_check(c, b, azure)
            c(figures["ready"] is not None, "no Ready reached the fabric")
            if r is not None:
                # the journal's lines come last in LOGIN_CHECK, before the hardened checks
                journal = r.stdout.split("\nENFORCE=", 1)[0]
                c("report:" in journal and "Ready to" in journal, "journalctl -t azprov -b lacks azprov's report line")
                c(journal.count("report: ") == 1, "azprov's report line is in the journal more than once")
            out = b.out()
            c(out.count("report: ") == 1 and "Ready to" in out, "azprov's report line is not on the console once")
            c(ran is None or ran in out, f"the console lacks {ran!r}")
            # the host key sshd offers is the one whose fingerprint azprov printed on the console
            ed25519 = next((l for l in (r.stdout.splitlines() if r else []) if l.endswith("(ED25519)")), None)
            c(ed25519 is not None and f"\n{ed25519}\n" in out.replace("\r", ""),
              f"the guest's ed25519 host key ({ed25519}) is not the one in the console's fingerprint block")
            if not hardened:
                # the first login saw ed25519 and ECDSA; RSA follows, made after the handover, and
                # sshd offers it once reloaded, fingerprinted on the console with the others
                offered, t_rsa = "", None
                while time.time() - b.start < BOOT_TIMEOUT and b.guest_addr():
                    offered = azure.keyscan(b.guest_addr())
                    if "ssh-rsa" in offered:
                        t_rsa = time.time() - b.start
                        break
                    # seldom enough that the guest's CPUs are seen idle (the RSA search waits for it)
                    time.sleep(3)
                figures["rsa"] = t_rsa
                for kind in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
                    c(kind in offered, f"sshd does not offer a {kind} host key: {offered!r}")
                last_block = b.out().replace("\r", "").split(FINGERPRINTS_BEGIN + "\n")[-1]
                c(all(f"({t})" in last_block for t in ("RSA", "ECDSA", "ED25519")),
                  "the console's last fingerprint block does not list the rsa, ecdsa and ed25519 keys")
                sshd_reload_check(c, b, ctx["key"])
                s1 = b.ssh(ctx["key"], SCRIPT_CHECK, timeout=150)
                c(s1 is not None and s1.stdout.count("customdata ran as root") == 1,
                  f"the custom data script did not run once as root: {s1.stdout if s1 else None!r}")
                c(s1 is not None and "customdata: started" in s1.stdout and "exit 0" in s1.stdout,
                  "azprov status does not show the script's exit 0")
            b.stop(ctx["key"])
        if second_boot:
            # the booted system's own DHCP client asks dnsmasq too, so only the fabric's requests
            # tell whether azprov sent anything
            before = len(azure.requests())
            with boot("second") as b2:
                r2, t2 = b2.wait_ssh(ctx["key"], check)
                figures["second_ssh"] = t2
                login_checks(c, r2, host, "second boot")
                if hardened:
                    hardened_checks(c, r2, "second boot")
                if resource:
                    resource.check(c, b2, ctx["key"], "second boot")
                c(len(azure.requests()) == before, f"the fabric got {len(azure.requests()) - before} request(s) on the second boot")
                c(r2 is not None and "already provisioned" in r2.stdout, "the second boot's journal lacks 'already provisioned'")
                c(r2 is not None and ed25519 is not None and ed25519 in r2.stdout, "the host key changed on the second boot")
                if not hardened:
                    s2 = b2.ssh(ctx["key"], SCRIPT_CHECK, timeout=150)
                    c(s2 is not None and s2.stdout.count("customdata ran as root") == 1,
                      f"the custom data script ran again on the reboot: {s2.stdout if s2 else None!r}")
                b2.stop(ctx["key"])
            out += b2.out()
        if resource:
            out += resource.handed_over_again(c, ctx["key"], boot)
        return c, figures, out


class ResourceDisk:
    """A resource disk beside the image and what each boot must find of it: "pristine" (NTFS
    as Azure hands it over: formatted and mounted on /mnt, kept across a reboot, formatted again
    once Azure hands it over blank again), "user-file" (NTFS with a user's file: never
    touched), "raw-nvme" (a raw local NVMe disk: formatted and mounted) or "off"
    (azprov.resourcedisk=off: never touched). Virtio and QEMU's NVMe are not Azure's disks, so
    the disk is named on the command line as for a VM azprov does not recognise."""

    def __init__(self, work, kind):
        self.kind = kind
        self.path = os.path.join(work, "resource.img")
        if kind == "raw-nvme":
            with open(self.path, "wb") as f:
                f.truncate(64 << 20)
            self.disks, self.dev, self.append = [("nvme", self.path)], "/dev/nvme0n1", "azprov.resourcedisk=nvme0n1"
        else:
            ntfs_resource_disk(self.path, extra_files=("results.csv",) if kind == "user-file" else ())
            self.disks, self.dev = [self.path], "/dev/vdb1"
            self.append = "azprov.resourcedisk=off" if kind == "off" else "azprov.resourcedisk=vdb"
        self.sha = sha256_of(self.path)

    CHECK = ("echo MNT=$(findmnt -n -o SOURCE,FSTYPE,LABEL --mountpoint /mnt); echo KEPT=$(ls /mnt/kept 2>/dev/null); "
             "sudo -n journalctl -t azprov -b -o cat --no-pager | grep 'resource disk'; "
             "sudo -n touch /mnt/kept")

    def check(self, c, b, key, phase):
        r = b.ssh(key, self.CHECK, timeout=30)
        out = r.stdout if r else ""
        mnt, kept = marked(out, "MNT"), marked(out, "KEPT")
        if self.kind in ("pristine", "raw-nvme"):
            c(mnt == f"{self.dev} ext4 AzureEphmDsk", f"{phase}: /mnt is {mnt!r}, not {self.dev}'s ext4 AzureEphmDsk")
            again = phase == "second boot"
            c(not again or kept == "/mnt/kept", f"{phase}: /mnt lost the file written on the boot before")
            c(again or kept == "", f"{phase}: /mnt holds a file from before it was formatted")
            said = "(formatted on an earlier boot)" if again else "formatted and mounted on /mnt"
            c(said in out, f"{phase}: the journal lacks {said!r}: {out[-400:]!r}")
            c(not again or "formatted (ext4" not in out, f"{phase}: the resource disk was formatted again")
        else:
            c(mnt == "", f"{phase}: /mnt has {mnt!r} mounted on it")
            said = "left alone: its NTFS holds 1 file(s)" if self.kind == "user-file" else None
            c(said is None or said in out, f"{phase}: the journal lacks {said!r}: {out[-400:]!r}")

    def handed_over_again(self, c, key, boot):
        """After the boots: an untouched disk is byte for byte what it was; a pristine one,
        handed over blank again (Azure's redeploy), is formatted again on the next boot."""
        if self.kind in ("user-file", "off"):
            c(sha256_of(self.path) == self.sha, f"the {self.kind} resource disk was written to")
            return ""
        if self.kind != "pristine":
            return ""
        ntfs_resource_disk(self.path)
        with boot("third") as b3:
            r, _ = b3.wait_ssh(key, "true")
            c(r is not None, "blank again: no SSH login")
            self.check(c, b3, key, "blank again")
            b3.stop(key)
            return b3.out()


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hook_growroot_powercut(ctx):
    """growroot in hook mode (initramfs-tools' init-bottom, the root mounted by the framework)
    on the GPT image grown by 256 MiB, cut by a power cut at the first write of the primary
    header (onto the staged array) and at the array in its place: initramfs-tools looks for the
    root before azprov could mend a table, so after either cut the next boot must find it as it
    is (the old table, the new one), reach SSH, and grow what is left."""
    c, figures, out_all = Check(), {}, ""
    image = ctx["image"]
    for i, (what, sector, want) in enumerate([("the primary header, onto the staged array", 1, "old"),
                                              ("the primary array, in its place", 2, "new")]):
        disk = os.path.join(ctx["work"], f"cut{i}.img")
        sh("cp", "--sparse=always", image["raw"], disk)
        size = os.path.getsize(disk)
        with open(disk, "r+b") as f:
            f.truncate(size + (256 << 20))
        old = gpt_primary(disk)
        with provisioning(ctx, f"deb-cut{i}") as (azure, cd):
            how, out = boot_cut(azure, ctx["work"], image["kernel"], image["initrds"]["initramfs-tools"], disk, cd,
                                sector=sector, append=f"root=UUID={ROOT_UUID} ro console=ttyS0 panic=-1")
            out_all += f"\n==== cut {i} at {what}: {how}\n{out}"
            c(how == "write", f"cut {i} ({what}): the boot ended by {how}")
            after = gpt_primary(disk)
            seen = "unsound" if after is None else "old" if after == old else "new"
            c(seen == want, f"cut {i} ({what}): the primary GPT is {seen} ({after}), not {want}")
            with VM(azure, ctx["work"], f"after{i}", image["kernel"], image["initrds"]["initramfs-tools"], disk, cd) as b:
                r, figures[f"ssh_after_cut{i}"] = b.wait_ssh(
                    ctx["key"], "findmnt -n -b -o SIZE /; sudo -n journalctl -t azprov -b -o cat --no-pager | grep growroot")
                out_all += f"\n==== boot after cut {i}\n{b.out()}"
                c(r is not None, f"after cut {i} ({what}): no SSH login: the framework found no root")
                lines = r.stdout.splitlines() if r else []
                fs = int(lines[0]) if lines and lines[0].strip().isdigit() else 0
                c(fs > size, f"after cut {i}: the root filesystem is {fs} bytes, not grown past {size}")
                c(any("growroot:" in l for l in lines), f"after cut {i}: growroot said nothing: {lines}")
                b.stop(ctx["key"])
        dump = subprocess.run(["sfdisk", "--verify", disk], capture_output=True, text=True, check=False).stdout
        c("No errors detected" in dump, f"after cut {i}: sfdisk --verify: {dump.strip()[-300:]}")
        os.remove(disk)
    return c, figures, out_all


def agent_requests(azure):
    """The fabric's requests other than the Guest Proxy Agent's own (/secure-channel/...)."""
    return [q for q in azure.requests() if not q["path"].startswith("/secure-channel/")]


def health_posts(azure):
    return [q for q in azure.requests() if q.get("endpoint") == "health"]


def msp_boot(ctx):
    """A VM created with MSP, the Guest Proxy Agent (the stand-in) in the image: the initramfs
    sends nothing; azprov-msp.service asks IMDS and reports once the agent holds its key, before
    sshd; one Ready; the login with IMDS's key, the hostname set in the running system; the
    custom data script runs after it."""
    c = Check()
    host, figures = "deb-msp", {}
    with provisioning(ctx, host, msp=True) as (azure, cd):
        with VM(azure, ctx["work"], "first", ctx["kernel"], ctx["initrds"]["initramfs-tools"], ctx["img"], cd) as b:
            r, figures["ssh"] = b.wait_ssh(ctx["key"], LOGIN_CHECK + "; echo STATUS-BEGIN; sudo -n azprov status")
            figures["ready"] = azure.ready_after(b.start)
            login_checks(c, r, host, "MSP boot")
            asked = agent_requests(azure)
            c(any(q.get("server") == "imds" for q in asked), "azprov asked IMDS nothing")
            early = [q["path"] for q in asked if not q.get("msp_key")]
            c(early == [], f"asked before the agent held its key: {early}")
            posts = health_posts(azure)
            c([q.get("state") for q in posts] == ["Ready"], f"health reports: {[q.get('state') for q in posts]}")
            out = b.out()
            c("(ProvisionGuestProxyAgent)" in out and "nothing is sent from here" in out,
              "the initramfs did not say it left the provisioning to azprov-msp.service")
            journal = r.stdout if r else ""
            c("msp: azure-proxy-agent holds its key" in journal, "the journal lacks the agent's key line")
            status = journal.split("STATUS-BEGIN", 1)[-1]
            c(re.search(r"^report: +ready$", status, re.M) and "msp:            yes" in status,
              f"azprov status says {status.strip()[:300]!r}")
            s1 = b.ssh(ctx["key"], SCRIPT_CHECK, timeout=150)
            c(s1 is not None and s1.stdout.count("customdata ran as root") == 1,
              f"the custom data script did not run once: {s1.stdout if s1 else None!r}")
            b.stop(ctx["key"])
        return c, figures, out


def msp_failed_boot(ctx, reason, gpa):
    """A VM created with MSP that cannot be provisioned: NotReady with `reason` reaches the
    fabric (before any IMDS request), the console and, with no agent at all (`gpa` False: from
    the initramfs), the KVP pool in the root; no user is made."""
    c = Check()
    fabric_args = ("--msp-refuse-key",) if gpa else ()
    with provisioning(ctx, "deb-msp-fail", msp=True, fabric_args=fabric_args) as (azure, cd):
        with VM(azure, ctx["work"], "boot", ctx["kernel"], ctx["initrds"]["initramfs-tools"], ctx["img"], cd) as b:
            t = None
            while time.time() - b.start < BOOT_TIMEOUT and b.proc.poll() is None:
                if health_posts(azure):
                    t = time.time() - b.start
                    break
                time.sleep(1)
            t_login = b.wait_console(" login: ")
            out = b.out()
            b.stop()
        posts = health_posts(azure)
        c(t is not None and len(posts) == 1, f"{len(posts)} health report(s)")
        desc = posts[0].get("description") or "" if posts else ""
        c(posts != [] and posts[0].get("state") == "NotReady" and f"reason={reason}" in desc,
          f"the report is not NotReady {reason!r}: {desc[:200]!r}")
        c(gpa is False or "exit=2" in desc, f"the description lacks the agent's exit code: {desc[:300]!r}")
        c(all(q.get("server") != "imds" for q in azure.requests()), "IMDS was asked")
        c(reason in out, f"the console lacks {reason!r}")
        c(t_login is not None, "no login prompt: the boot did not go on")
        marker, pool = root_files(ctx["img"], "/var/lib/azprov/provisioned", "/var/lib/hyperv/.kvp_pool_1")
        c(marker is None, "a marker was written")
        c(gpa or (pool is not None and "PROVISIONING_REPORT" in pool and reason in pool),
          "the KVP pool lacks the report naming the reason")
        return c, {"notready": t, "login": t_login}, out


def gpa_without_msp_boot(ctx):
    """The Guest Proxy Agent in the image, the VM created without MSP: provisioned from the
    initramfs as always (Ready before the real init starts), azprov-msp.service never started."""
    c, figures, out = provisioned_boot(ctx, "initramfs-tools", second_boot=False)
    ready, welcome = out.find("Ready to "), out.find("Welcome to ")
    c(ready != -1 and (welcome == -1 or ready < welcome), "Ready came after the real init started")
    c("msp:" not in out, "azprov's MSP lines on a VM created without MSP")
    return c, figures, out


def unprovisioned_boot(ctx, initrd, extra, on_azure, expect_line):
    """Boots to the login prompt: nothing reached the fabric, the root was not provisioned."""
    c = Check()
    with provisioning(ctx, "deb-unprov") as (azure, cd):
        with VM(azure, ctx["work"], "boot", ctx["kernel"], ctx["initrds"][initrd], ctx["img"], cd, extra,
                on_azure) as b:
            t_login = b.wait_console(" login: ")
            time.sleep(0.5)
            out = b.out()
            b.stop()
        c(t_login is not None, "no login prompt on the console")
        if expect_line:
            c(expect_line in out, f"the console lacks {expect_line!r}")
        c(azure.requests() == [], f"the fabric was contacted: {azure.requests()[:2]}")
        marker, hostname = root_files(ctx["img"], "/var/lib/azprov/provisioned", "/etc/hostname")
        c(marker is None, "a marker was written")
        c(hostname == "debian-image\n", "/etc/hostname changed")
        return c, {"login": t_login}, out


def keyless_boot(ctx):
    """A cleaned image (no SSH host keys) booted off Azure: azprov makes the keys with no packet
    sent, so sshd starts and answers with them."""
    c = Check()
    with provisioning(ctx, "deb-keyless") as (azure, cd):
        with VM(azure, ctx["work"], "boot", ctx["kernel"], ctx["initrds"]["initramfs-tools"], ctx["img"], cd, "",
                on_azure=False) as b:
            t_login = b.wait_console(" login: ")
            keys, t_ssh = "", None
            while t_login and time.time() - b.start < BOOT_TIMEOUT and b.guest_addr():
                keys = azure.keyscan(b.guest_addr())
                if keys.strip() and t_ssh is None:
                    t_ssh = time.time() - b.start
                # ed25519 and ECDSA come first; RSA once its process made it and reloaded sshd
                if "ssh-rsa" in keys:
                    break
                # seldom enough that the guest's CPUs are seen idle (the RSA search waits for it)
                time.sleep(3)
            out = b.out()
            b.stop()
        c(t_login is not None, "no login prompt on the console")
        c("not an Azure VM" in out, "the console lacks 'not an Azure VM'")
        c(FINGERPRINTS_BEGIN in out, "no host key fingerprints on the console")
        for kind in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
            c(kind in keys, f"sshd does not offer a {kind} host key: {keys!r}")
        c(azure.requests() == [], f"the fabric was contacted: {azure.requests()[:2]}")
        return c, {"login": t_login, "ssh": t_ssh}, out


def try_image(ctx, image, gen, host, agent_requests, azprov=False, custom=False):
    """scripts/try-image on an image as it will be uploaded, booted through its own bootloader:
    it must say Ready and a login as the admin with the fabric's key, the hostname Azure gave,
    sudo and host keys none of which is the image's; with `azprov`, the VM id azprov recorded is
    IMDS's (the generation's DMI byte order) and a fixed VHD is one Azure takes; with `custom`,
    the VM gets CUSTOM_SCRIPT as custom data and azprov's status says it ran with exit 0."""
    c = Check()
    args = [TRY_IMAGE, image, "--gen", gen, "--json", "--quiet", "--vm-size", "Standard_B1s", "--vm-name", host,
            "--ssh-key", ctx["key"] + ".pub", "--timeout", str(BOOT_TIMEOUT + 60), "--work", os.path.join(ctx["work"], "try")]
    if custom:
        script = os.path.join(ctx["work"], "customdata.sh")
        with open(script, "w") as f:
            f.write(CUSTOM_SCRIPT)
        args += ["--custom-data", script]
    r = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        c(False, f"try-image printed no JSON report (exit {r.returncode}): {r.stderr.strip()[-400:]}")
        return c, {}, r.stdout + r.stderr
    c(r.returncode == 0, f"try-image exited {r.returncode}: {r.stderr.strip()[-300:]}")
    c(rep["ready"] is True and rep["reason"] is None, f"not Ready: {rep['reason']}")
    c(rep["ssh"] and rep["key_login"], "no SSH login with the key")
    c(rep["hostname"] == host, f"hostname {rep['hostname']!r}")
    c(rep["sudo"], "sudo -n refused")
    c(rep["host_keys"] and rep["host_keys_from_image"] == [],
      f"host keys {rep['host_keys']}, the image's among them: {rep['host_keys_from_image']}")
    paths = [q["path"] for q in rep["requests"]]
    for want in agent_requests:
        c(any(want in p for p in paths), f"the fabric saw no request for {want}: {paths}")
    if azprov:
        seen = (rep.get("azprov") or {}).get("vm_id")
        c(seen == rep["vm_id"], f"azprov recorded the VM id {seen}, IMDS said {rep['vm_id']}")
        c(rep["format"] != "vpc" or rep["upload"] == [], f"Azure would refuse the VHD: {rep['upload']}")
    if custom:
        ran = ((rep.get("azprov") or {}).get("scripts") or {}).get("customdata") or {}
        c(ran.get("exit") == 0, f"azprov status does not show the custom data script's exit 0: {ran}")
    out = console_text(rep["console_log"])
    return c, {"ready": rep["t_ready_s"], "ssh": rep["t_ssh_s"]}, out


# In the order they run (two at a time): each of the first few needs an image none before it
# needs, so images build while others boot.
SCENARIOS = {
    # ... with Azure's resource disk: formatted, kept across the reboot, formatted again when blank again
    "initramfs-tools": lambda ctx: provisioned_boot(ctx, "initramfs-tools", second_boot=True,
                                                    resource=ResourceDisk(ctx["work"], "pristine")),
    # SELinux enforcing, /home and /var on filesystems of their own, sshd and sudo reading no drop-ins
    "hardened-initramfs-tools": lambda ctx: provisioned_boot(ctx, "initramfs-tools", second_boot=True, hardened=True),
    # azprov from the RHEL-family RPM (rpm -i --root into the Debian root): its %post built the
    # dracut initramfs and enabled the custom data unit
    "rpm-dracut": lambda ctx: provisioned_boot(ctx, "rpm", second_boot=False),
    # mkinitcpio built from upstream: busybox init running azprov's late hook, and systemd
    # running azprov-initrd.service (the sd-azprov install hook); azprov names the root it
    # provisioned: mkinitcpio's /new_root, systemd's /sysroot
    "mkinitcpio": lambda ctx: provisioned_boot(ctx, "mkinitcpio", second_boot=True,
                                               ran="(hook), root /new_root",
                                               resource=ResourceDisk(ctx["work"], "raw-nvme")),
    # examples/mkosi built by mkosi 14 as its README says, uploaded as a fixed VHD, tried as a
    # Gen2 VM (mkosi makes UEFI images) with a #! custom data script
    "mkosi-initramfs-tools": lambda ctx: try_image(ctx, ctx["image"], "2", "deb-mkosi-it",
                                                   ["api-version=2023-11-15", "comp=health"], azprov=True, custom=True),
    # a resource disk with a user's file on it is never formatted
    "dracut": lambda ctx: provisioned_boot(ctx, "dracut", second_boot=False,
                                           resource=ResourceDisk(ctx["work"], "user-file")),
    "hardened-dracut": lambda ctx: provisioned_boot(ctx, "dracut", second_boot=False, hardened=True),
    "mkinitcpio-systemd": lambda ctx: provisioned_boot(ctx, "mkinitcpio-systemd", second_boot=True,
                                                       ran="(hook), root /sysroot",
                                                       resource=ResourceDisk(ctx["work"], "off")),
    "mkosi-dracut": lambda ctx: try_image(ctx, ctx["image"], "2", "deb-mkosi-dr",
                                          ["api-version=2023-11-15", "comp=health"], azprov=True, custom=True),
    # scripts/try-image on whole disk images booted through their own GRUB: this image as a
    # fixed VHD on Gen1 (SeaBIOS, the CD on IDE) and raw on Gen2 (OVMF, the CD on SCSI) ...
    "try-image-gen1": lambda ctx: try_image(ctx, ctx["image"]["vhd"], "1", "deb-try1",
                                            ["api-version=2023-11-15", "comp=health"], azprov=True),
    "try-image-gen2": lambda ctx: try_image(ctx, ctx["image"]["raw"], "2", "deb-try2",
                                            ["api-version=2023-11-15", "comp=health"], azprov=True),
    # ... and Debian 12 with cloud-init as Debian's Azure images have it (no azprov) ...
    "try-image-cloud-init": lambda ctx: try_image(ctx, ctx["image"], "1", "deb-ci",
                                                  ["api-version=2021-08-01", "comp=goalstate", "comp=health"]),
    # ... and with Debian's waagent provisioning (it reads the goal state's configuration)
    "try-image-waagent": lambda ctx: try_image(ctx, ctx["image"], "2", "deb-wa",
                                               ["type=hostingEnvironmentConfig", "type=sharedConfig", "comp=health"]),
    "disabled": lambda ctx: unprovisioned_boot(ctx, "initramfs-tools", "azprov=0", True,
                                               "disabled on the kernel command line"),
    "not-azure": lambda ctx: unprovisioned_boot(ctx, "initramfs-tools", "", False, "not an Azure VM"),
    "without-azprov": lambda ctx: unprovisioned_boot(ctx, "stock", "", False, None),
    # a cleaned image (azprov clean removed the host keys) booted elsewhere still gets SSH
    "keyless-off-azure": keyless_boot,
    # VMs created with the Metadata Security Protocol: the Guest Proxy Agent (the stand-in of
    # testbed/gpa) in the image, its key handed out, or refused; no agent in the image; and the
    # agent in an image booted as a VM without MSP
    "msp": msp_boot,
    "msp-key-refused": lambda ctx: msp_failed_boot(ctx, "azure-proxy-agent status failure", gpa=True),
    "msp-without-agent": lambda ctx: msp_failed_boot(ctx, "azure-proxy-agent not found", gpa=False),
    "agent-without-msp": gpa_without_msp_boot,
    # growroot in hook mode cut by power cuts: the framework finds the root after each
    "growroot-powercut-hook": hook_growroot_powercut,
}


def fmt(v):
    return f"{v:.1f}s" if isinstance(v, float) else str(v) if isinstance(v, int) else "-"


# The image each scenario boots (a scenario not named here boots "plain").
IMAGE_OF = {"hardened-initramfs-tools": "hardened", "hardened-dracut": "hardened", "rpm-dracut": "rpm",
            "mkinitcpio": "mkinitcpio", "mkinitcpio-systemd": "mkinitcpio", "keyless-off-azure": "cleaned",
            "try-image-gen1": "bootable", "try-image-gen2": "bootable", "try-image-cloud-init": "cloud-init",
            "try-image-waagent": "waagent", "mkosi-initramfs-tools": "mkosi-initramfs-tools",
            "mkosi-dracut": "mkosi-dracut", "growroot-powercut-hook": "bootable", "msp": "gpa", "msp-key-refused": "gpa", "agent-without-msp": "gpa"}



def main():
    if len(sys.argv) < 2 or not sys.argv[1].endswith(".deb"):
        sys.exit("usage: qemu-tests/distro DEB [RPM] [SCENARIO...]")
    deb = os.path.abspath(sys.argv[1])
    rest = sys.argv[2:]
    rpm = os.path.abspath(rest.pop(0)) if rest and rest[0].endswith(".rpm") else None
    names = rest or list(SCENARIOS)
    if "rpm-dracut" in names and rpm is None:
        sys.exit("qemu-tests/distro: the rpm-dracut scenario needs the x86_64 RPM (scripts/package makes it)")
    if any(n.startswith("mkinitcpio") for n in names) and not os.path.isdir(MKINITCPIO_VENDOR):
        sys.exit(f"distro: no mkinitcpio source at {MKINITCPIO_VENDOR} (the checkout is incomplete)")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario(s): {' '.join(unknown)}; known: {' '.join(SCENARIOS)}")
    if os.geteuid() != 0:
        sys.exit("qemu-tests/distro needs root (chroot, network namespaces, tap devices)")
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    images = Images(builders(deb, rpm), [IMAGE_OF.get(n, "plain") for n in names])
    key = os.path.join(OUT, "id_ed25519")
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "distro@test", "-f", key)
    key_pub = open(key + ".pub").read().strip()

    def one(i, name):
        work = os.path.join(OUT, name)
        os.makedirs(work)
        ctx = {"work": work, "tag": f"d{i}", "key": key, "key_pub": key_pub}
        try:
            return scenario(name, ctx)
        finally:
            images.release(IMAGE_OF.get(name, "plain"))

    def scenario(name, ctx):
        work = ctx["work"]
        try:
            image = images.get(IMAGE_OF.get(name, "plain"))
            if isinstance(image, tuple):
                kernel, initrds, img, disks = image

                def overlay(base, out):
                    # an overlay, not a copy: five 2 GB images (0.4 GB each, sparse) filled the disk of a CI machine
                    sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "raw", out)
                    return out
                ctx.update(kernel=kernel, initrds=initrds, img=overlay(img, os.path.join(work, "disk.qcow2")),
                           disks=[overlay(p, os.path.join(work, f"{n}.qcow2")) for n, p in sorted(disks.items())])
            else:
                ctx["image"] = image
            c, figures, out = SCENARIOS[name](ctx)
        except Exception as e:  # a broken scenario (or its image) is a failed scenario
            return name, [f"{type(e).__name__}: {e}"], "broken"
        with open(os.path.join(work, "console.txt"), "w") as f:
            f.write(out)
        times = ", ".join(f"{k} {fmt(v)}" for k, v in figures.items())
        return name, c.failures, f"from QEMU start: {times} (tcg)"

    sys.exit(1 if run_scenarios("distro-tests", names, one, OUT) else 0)
