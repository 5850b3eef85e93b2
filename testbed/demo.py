"""The whole thing, without an Azure subscription: builds azprov and an initramfs, boots a
Gen1-shaped VM in QEMU (IDE CD-ROM with ovf-env.xml, virtio root disk) against the simulated
fabric in a network namespace, streams azprov's lines from the serial console, and ends with
what the fabric received and what was written into the root. Needs root (scripts/setup first).
"""
import os
import subprocess
import sys
import time

from testbed.azure import Azure
from testbed.host import OUT, build, mkinitramfs
from testbed.images import debugfs_cat, imds_doc, kernel, make_cd, make_root
from testbed.vm import FINGERPRINTS_BEGIN, FINGERPRINTS_END, VM_TIMEOUT, kernel_append, qemu_args


def main():
    if os.geteuid() != 0:
        sys.exit("scripts/demo needs root (a network namespace and a tap device)")
    print("== building azprov and the initramfs", flush=True)
    kernel_img, moddir = kernel()
    azprov = build()
    work = os.path.join(OUT, "demo")
    subprocess.run(["rm", "-rf", work], check=True)
    os.makedirs(work)
    initrd = os.path.join(work, "initrd.img")
    out = mkinitramfs(initrd, moddir, "--azprov", azprov)
    print(f"azprov: {azprov} ({os.path.getsize(azprov)} bytes, static)\n{out.strip()}")
    hostname = "azprov-demo"
    with Azure(work, "demo", imds_doc(hostname)) as azure:
        root = make_root(work)
        cd = make_cd(work, hostname)
        append = kernel_append("gen1")
        cmd = azure.inside("timeout", str(VM_TIMEOUT), *qemu_args("gen1", kernel_img, initrd, root, cd, append, "tcg"),
                           "-serial", "stdio")
        print("\n== booting (QEMU TCG, -M pc, IDE CD, virtio disk; the fabric is at 168.63.129.16 and 169.254.169.254)", flush=True)
        start = time.time()
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace") as p:
            in_block = False  # the host key fingerprint block, raw lines as on Azure's serial console
            for line in p.stdout:
                in_block = in_block or FINGERPRINTS_BEGIN in line
                if in_block or "azprov" in line or "REALROOT" in line or "Power down" in line:
                    print("  " + line.rstrip(), flush=True)
                in_block = in_block and FINGERPRINTS_END not in line
        took = time.time() - start
        print(f"\n== what the fabric received ({len(azure.requests())} requests)")
        for r in azure.requests():
            extra = ""
            if r.get("endpoint") == "health":
                extra = f" state={r.get('state')} incarnation={r.get('incarnation')}"
            print(f"  +{r['t'] - start:6.2f}s {r['server']:10} {r['method']:4} {r['path']} -> {r.get('status')}{extra}")
        ready = azure.ready_after(start)
        print("\n== what azprov wrote into the root (read back with debugfs)")
        for path in ("/etc/hostname", "/home/azureuser/.ssh/authorized_keys", "/etc/sudoers.d/90-azprov",
                     "/etc/ssh/sshd_config.d/50-azprov.conf", "/etc/ssh/ssh_host_ed25519_key.pub",
                     "/var/lib/azprov/provisioned"):
            text = debugfs_cat(root, path)
            print(f"  {path}:")
            for l in (text or "(missing)\n").splitlines():
                print(f"    {l}")
        passwd = (debugfs_cat(root, "/etc/passwd") or "").splitlines()
        print(f"  /etc/passwd: {passwd[-1] if passwd else '(missing)'}")
        custom = debugfs_cat(root, "/var/lib/azprov/customdata")
        print(f"  /var/lib/azprov/customdata: {len(custom or '')} bytes (not shown: it may hold secrets)")
        print(f"\nQEMU ran {took:.1f}s; Ready reached the fabric {ready:.2f}s after QEMU started (TCG, not real hardware)"
              if ready is not None else "\nno Ready reached the fabric; see the console above")
        sys.exit(0 if ready is not None else 1)
