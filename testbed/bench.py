"""Measures azprov against the approach of Microsoft's "no provisioning agent" guide, on the
same simulated fabric in the same network namespaces, interleaved run by run:

  * azprov: `azprov provision --root` (its own DHCP, the OVF, IMDS, the writes, Ready);
  * seed:   busybox udhcpc configuring the link, then a Python script doing what the guide's
            does: GET the goal state, POST Health Ready with the parsed incarnation.

Both are timed from process start to exit (each exits once Ready is acknowledged). Prints
medians with min/max and the ratio; the already-provisioned run (time, and the packets it
sent: DHCP DISCOVERs and fabric requests); azprov's peak RSS; the stripped binary's size; the
crate count; and the QEMU TCG timeline from the console's kernel timestamps (azprov starts,
modules, root, media, DHCP, IMDS, writes, Ready, real init; medians of 5 boots each: gen1 with
the CD and without, gen2 with it) next to a trivial init's boot and the floor's (a busybox init
that loads the same drivers and reads the CD) on the same kernel and flags, with the goals:
Ready minus the trivial init's start, and the no-CD boot's Ready minus the CD boot's; then the
same timeline with `-icount shift=1` (3 boots each, `azprov.hostkeys=keep`: the RSA key would
take a minute of guest time), where the guest's clock counts its own instructions (2 ns each)
and waits, so the host's speed of the moment drops out ("core").

"growroot": growroot's times on the first boot of a 4 GiB image on a 32 GiB disk (partition,
ext4). "debian": what users feel on Debian 12 images booted through their own GRUB by
scripts/try-image: QEMU start to Ready and to the first SSH command, and root mounted to the
real init, for azprov's first boot and its reboot, the same Debian with no agent, and with
Debian's cloud-init; interleaved rounds (N, at least 3, at most 5) with 1 and with 2 vCPUs,
medians, min/max and the ratios; a run that fails is listed with try-image's cause and its files
kept, the rounds go on, and the bench exits 1 once its output is recorded. Needs root.

  scripts/bench [N] [core | growroot | debian]...
                             (N runs of each, default 11; every section by default; each
                             section's output also goes into docs/performance.md, between
                             its own markers)

A benchmark measures; no test asserts these figures.
"""
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from testbed import debian
from testbed.azure import Azure
from testbed.host import FIXTURES, TOP, build, mkinitramfs, sh
from testbed.images import imds_doc, kernel, make_cd, make_root, partitioned
from testbed.vm import AZURE_ASSET_TAG, boot

SEED_REPORT = r'''
import sys, urllib.request, xml.etree.ElementTree as ET
H = {"x-ms-agent-name": "WALinuxAgent", "x-ms-version": "2012-11-30"}
WS = "http://168.63.129.16"
gs = ET.fromstring(urllib.request.urlopen(urllib.request.Request(WS + "/machine/?comp=goalstate", headers=H),
                                          timeout=10).read())
inc = gs.findtext("./Incarnation")
container = gs.findtext("./Container/ContainerId")
instance = gs.findtext("./Container/RoleInstanceList/RoleInstance/InstanceId")
body = f"""<?xml version="1.0" encoding="utf-8"?>
<Health xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
  <GoalStateIncarnation>{inc}</GoalStateIncarnation>
  <Container>
    <ContainerId>{container}</ContainerId>
    <RoleInstanceList>
      <Role>
        <InstanceId>{instance}</InstanceId>
        <Health><State>Ready</State></Health>
      </Role>
    </RoleInstanceList>
  </Container>
</Health>"""
req = urllib.request.Request(WS + "/machine?comp=health", data=body.encode(), method="POST",
                             headers=dict(H, **{"Content-Type": "text/xml;charset=utf-8"}))
sys.exit(0 if urllib.request.urlopen(req, timeout=10).status == 200 else 1)
'''
UDHCPC_SCRIPT = """#!/bin/sh
# udhcpc's event script, as a minimal image would have it: address and default route
case "$1" in
bound|renew)
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do ip route add default via "$r" dev "$interface"; break; done
    ;;
esac
"""


def stats(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs):
    med, lo, hi = stats(xs)
    return f"median {med:.1f} ms (min {lo:.1f}, max {hi:.1f})"


class Bench:
    """azprov and the guide's approach as processes on vm0, in the guest namespace of one
    simulated Azure (`Azure(guest="veth")`); a context manager."""

    def __init__(self, work):
        self.work = work
        doc = {"compute": {"vmId": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "location": "westeurope",
                           "vmSize": "Standard_B1s", "name": "bench-vm",
                           "osProfile": {"adminUsername": "azureuser", "computerName": "bench-vm",
                                         "disablePasswordAuthentication": "true"},
                           "publicKeys": [], "userData": ""}, "network": {"interface": []}}
        self.azure = Azure(work, "b", doc, guest="veth")
        self.v = self.azure.guest_ns
        os.makedirs(os.path.join(work, "dmi"))
        with open(os.path.join(work, "dmi", "chassis_asset_tag"), "w") as fh:
            fh.write(AZURE_ASSET_TAG + "\n")
        with open(os.path.join(work, "cmdline"), "w") as fh:
            fh.write("ro\n")
        self.udhcpc_script = os.path.join(work, "udhcpc.script")
        with open(self.udhcpc_script, "w") as fh:
            fh.write(UDHCPC_SCRIPT)
        os.chmod(self.udhcpc_script, 0o755)
        self.seed_py = os.path.join(work, "seed_report.py")
        with open(self.seed_py, "w") as fh:
            fh.write(SEED_REPORT)

    def reset_link(self):
        sh("ip", "-n", self.v, "addr", "flush", "dev", "vm0")
        subprocess.run(["ip", "-n", self.v, "route", "flush", "dev", "vm0"], stderr=subprocess.DEVNULL, check=False)
        sh("ip", "-n", self.v, "link", "set", "vm0", "down")

    def timed(self, args, rss=False):
        """Milliseconds from start to exit, the exit code, the peak RSS (KiB; with `rss`) and the
        stdout of `args`. The RSS comes from GNU time, not from wait4 here: a child's maxrss
        starts at the size of the process that forked it (this Python, about 14 MB), and time's
        own is about 1 MB. So it is an upper bound, high by at most that much."""
        rss_file = os.path.join(self.work, "rss")
        wrap = ["/usr/bin/time", "-f", "%M", "-o", rss_file] if rss else []
        t = time.perf_counter()
        p = subprocess.run(["ip", "netns", "exec", self.v] + wrap + args, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, check=False)
        ms = (time.perf_counter() - t) * 1000
        kb = int(open(rss_file).read().split()[-1]) if rss else None
        return ms, p.returncode, kb, p.stdout

    def azprov(self, binary, root, rss=False, host_keys=False):
        shutil.rmtree(root, ignore_errors=True)
        sh("cp", "-a", os.path.join(FIXTURES, "root"), root)
        self.reset_link()
        return self.timed([binary, "provision", "--root", root, "--iface", "vm0", "--json", "--timeout", "30",
                           "--ovf", os.path.join(FIXTURES, "ovf", "wala.xml"),
                           "--dmi", os.path.join(self.work, "dmi"), "--cmdline", os.path.join(self.work, "cmdline"),
                           ] + ([] if host_keys else ["--keep-host-keys"]), rss)

    def seed(self):
        self.reset_link()
        script = (f"ip link set vm0 up && busybox udhcpc -i vm0 -n -q -f -s {self.udhcpc_script} >/dev/null 2>&1 "
                  f"&& exec python3 {self.seed_py}")
        return self.timed(["sh", "-c", script])

    def packets(self):
        """The fabric requests and DHCP DISCOVERs so far."""
        return len(self.azure.requests()), self.azure.dhcp_discovers()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.azure.close()


# The drivers each QEMU shape needs before the OVF can be read and DHCP sent, as the floor
# init loads them: two shell chains at once (the storage chain with the CD's filesystem, the
# virtio chain with the NIC and, on gen1, the root disk), then what needs both.
FLOOR_CHAINS = {
    "gen1": (["scsi_common", "scsi_mod", "libata", "ata_piix", "cdrom", "sr_mod", "crc-itu-t", "udf"],
             ["virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
              "failover", "net_failover", "virtio_net", "virtio_blk"], []),
    "gen2": (["scsi_common", "scsi_mod", "cdrom", "sr_mod", "sd_mod", "crc-itu-t", "udf"],
             ["virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
              "failover", "net_failover", "virtio_net"], ["virtio_scsi"]),
}


def busybox_initrd(work, name, moddir, modules, script):
    """An lz4 initramfs of busybox, `modules` (names) under /m and `script` as /init, after
    devtmpfs is mounted; its path."""
    tree = os.path.join(work, name)
    for d in ("bin", "dev", "proc", "mnt", "m"):
        os.makedirs(os.path.join(tree, d))
    shutil.copy(shutil.which("busybox"), os.path.join(tree, "bin", "busybox"))
    for m in modules:
        found = subprocess.run(["find", moddir, "-name", m + ".ko"], capture_output=True, text=True,
                               check=True).stdout.split()
        if not found:
            sys.exit(f"bench: no {m}.ko under {moddir}")
        shutil.copy(found[0], os.path.join(tree, "m"))
    with open(os.path.join(tree, "init"), "w") as fh:
        fh.write("#!/bin/busybox sh\n/bin/busybox mount -t devtmpfs dev /dev\n" + script +
                 "/bin/busybox poweroff -f\n")
    os.chmod(os.path.join(tree, "init"), 0o755)
    img = os.path.join(work, name + ".img")
    sh("sh", "-c", f"cd {tree} && find . | cpio -o -H newc --quiet | lz4 -q -l -9 -c > {img}")
    return img


def qemu_timeline(boots=5, icount=None, append=""):
    """`boots` boots of each kind, interleaved, on the same kernel and flags, for both QEMU
    shapes (gen1: the CD on IDE, the root on virtio-blk; gen2: both on one virtio-scsi
    controller, Azure Gen2's layout): a trivial init (busybox writing a line to /dev/kmsg, then
    powering off); the floor, a busybox init that insmods the drivers the shape needs
    (FLOOR_CHAINS) and reads ovf-env.xml from the CD, what any agent in the initramfs waits for
    before its first DHCP packet; azprov's initramfs against the fabric with the CD and (gen1)
    without it. Prints the medians of the timestamps the kernel put on the console, the goals
    (azprov's Ready minus the trivial init's start; the no-CD boot's Ready minus the CD boot's)
    and the floor's share of the first. With `icount` (QEMU's `-icount` option, e.g. "shift=1":
    a guest instruction takes 2 ns of the guest's clock) the guest's time counts its own work
    and its waits, not the host's speed: figures that compare across runs and machines. `append`
    goes on every boot's command line."""
    import re
    kernel_img, moddir = kernel()
    work = tempfile.mkdtemp(prefix="azprov-bench-qemu-")
    try:
        initrd = os.path.join(work, "initrd.img")
        mkinitramfs(initrd, moddir)
        trivial = busybox_initrd(work, "trivial", moddir, [], "echo 'trivial: init started' > /dev/kmsg\n")
        floors = {}
        for shape, (storage, net, after) in FLOOR_CHAINS.items():
            def chain(ms):
                return "".join(f"/bin/busybox insmod /m/{m}.ko\n" for m in ms)
            floors[shape] = busybox_initrd(
                work, "floor-" + shape, moddir, storage + net + after,
                "echo 'floor: init started' > /dev/kmsg\n"
                f"(\n{chain(net)}) &\n{chain(storage)}wait\n{chain(after)}"
                "/bin/busybox mount -t udf -o ro /dev/sr0 /mnt && /bin/busybox cat /mnt/ovf-env.xml >/dev/null "
                "&& echo 'floor: ovf-env.xml read' > /dev/kmsg\n")

        def stamp(out, pat):
            return next((float(m.group(1)) for m in re.finditer(r"\[\s*(\d+\.\d+)\] " + pat, out)), None)

        marks = [("azprov starts (PID 1)", r"azprov: azprov \S+ as PID 1"), ("modules loaded", r"azprov: modules:"),
                 ("root mounted", r"azprov: root:"), ("media read", r"azprov: media:"),
                 ("DHCP bound", r"azprov: dhcp: \d+ ms"), ("IMDS", r"azprov: imds:"),
                 ("written", r"azprov: write:"), ("Ready acknowledged", r"azprov: report:"),
                 ("real init starts", r"azprov: handing over")]
        kinds = {"gen1": ("cd", "no-cd"), "gen2": ("cd",)}
        times = {(shape, k): {} for shape, ks in kinds.items() for k in ks + ("trivial", "floor")}
        # one fabric for the boots with the CD and without: IMDS announces no custom data, so
        # the no-CD boot is a Ready one too
        with Azure(work, "b", imds_doc("bench-qemu", has_custom_data=False)) as azure:
            cd = make_cd(work, "bench-qemu")
            for _ in range(boots):
                for shape, ks in kinds.items():
                    for k in ("trivial", "floor") + ks:
                        img = {"trivial": trivial, "floor": floors[shape]}.get(k, initrd)
                        disc = None if k == "no-cd" else cd
                        _, _, out, _ = boot(azure, work, shape, kernel_img, img, make_root(work), disc,
                                               append, "tcg", qemu_extra=("-icount", icount) if icount else ())
                        got = times[(shape, k)]
                        if k == "trivial":
                            got.setdefault("start", []).append(stamp(out, "trivial: init started"))
                        elif k == "floor":
                            got.setdefault("start", []).append(stamp(out, "floor: init started"))
                            got.setdefault("ovf", []).append(stamp(out, "floor: ovf-env.xml read"))
                        else:
                            for name, pat in marks:
                                got.setdefault(name, []).append(stamp(out, pat))

        def med(xs):
            xs = [x for x in xs if x is not None]
            return statistics.median(xs) if xs else None

        def spread(name, a, b, goal=""):
            d = [x - y for x, y in zip(a, b, strict=False) if x is not None and y is not None]
            if not d:
                print(f"    {name}: -")
                return
            print(f"    {name}: median {med(d):+.2f} s (min {min(d):+.2f}, max {max(d):+.2f}){goal}")

        how = f"with -icount {icount} (the guest's clock counts its instructions)" if icount else "wall clock"
        how += f", {append}" if append else ""
        print(f"QEMU TCG, {how}, {boots} boots of each kind, interleaved; medians of the kernel's timestamps (s "
              "after it started):")
        for shape, ks in kinds.items():
            triv, floor, cdb = times[(shape, "trivial")], times[(shape, "floor")], times[(shape, "cd")]
            print(f"  {shape}: trivial init starts {med(triv['start']):.2f}; floor init starts "
                  f"{med(floor['start']):.2f}, has read ovf-env.xml at {med(floor['ovf']):.2f}")
            for name, _ in marks:
                row = [med(times[(shape, k)][name]) for k in ks]
                print(f"    azprov {name}: " + ", ".join(
                    f"{k} {t:.2f}" if t is not None else f"{k} -" for k, t in zip(ks, row, strict=False)))
            spread("goal: Ready minus the trivial init's start", cdb["Ready acknowledged"], triv["start"],
                   "; goal <= 0.8 s")
            spread("Ready minus azprov's own start", cdb["Ready acknowledged"], cdb["azprov starts (PID 1)"])
            spread("the floor's ovf-env.xml read minus the trivial init's start (the same goal for an init that "
                   "only reads the CD)", floor["ovf"], triv["start"])
            spread("the floor's ovf-env.xml read minus its own start", floor["ovf"], floor["start"])
            spread("azprov's media read minus its own start", cdb["media read"], cdb["azprov starts (PID 1)"])
            spread("azprov's Ready minus its media read (DHCP, IMDS, writes, report)", cdb["Ready acknowledged"],
                   cdb["media read"])
            if "no-cd" in ks:
                spread("goal: no-CD Ready minus CD Ready", times[(shape, "no-cd")]["Ready acknowledged"],
                       cdb["Ready acknowledged"], "; goal <= 0.3 s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rsa_vs_openssl(n=20):
    """azprov's RSA-3072 host key (its prime search, crypto-primes' verdict; up to 4 racers on the
    machine's CPUs) against OpenSSL's through `ssh-keygen -t rsa -b 3072`, interleaved, n each."""
    subprocess.run(["cargo", "build", "--quiet", "--release", "--locked", "--example", "rsa_keygen"], cwd=TOP,
                   check=True)
    ours_bin = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(TOP, "target")), "release", "examples",
                            "rsa_keygen")
    ours, openssl = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(n):
            ours.append(float(subprocess.run([ours_bin, "1"], check=True, capture_output=True, text=True).stdout))
            key = os.path.join(d, f"k{i}")
            t = time.monotonic()
            subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", key], check=True)
            openssl.append((time.monotonic() - t) * 1000)
    print(f"RSA-3072 host key, {n} interleaved each, on {os.cpu_count()} CPUs:")
    print(f"  azprov: {fmt(ours)}")
    print(f"  ssh-keygen (OpenSSL): {fmt(openssl)}")
    print(f"  ratio azprov/ssh-keygen: {statistics.median(ours) / statistics.median(openssl):.2f}")


def debian_timeline(rounds=3, cpus=(1, 2)):
    """What users feel, on Debian 12 images booted through their own GRUB (Gen1, SeaBIOS,
    virtio-scsi disk, the CD on IDE) by scripts/try-image against the simulated fabric, QEMU
    TCG, 2 GiB of memory: seconds from QEMU start to Ready and to the first SSH command, and
    the kernel's timestamps from the root's mount to the real init's start, for azprov's image
    on its first boot and on its reboot (powered off from inside, QEMU started again), the same
    Debian with no agent at all (the admin and key baked in, the image's host keys), and the
    same Debian with Debian's cloud-init as Debian's Azure images have it. `rounds` interleaved
    rounds of each, with each vCPU count in `cpus`."""
    work = tempfile.mkdtemp(prefix="azprov-bench-debian-")
    try:
        key = os.path.join(work, "id_ed25519")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", key)
        images = debian_images(work, open(key + ".pub").read().strip())
        rows, failed = debian_rounds(work, images, key, rounds, cpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    debian_report(rows, failed, rounds, cpus)
    return not failed


def debian_images(work, key_pub):
    """The three images of the Debian section, built from azprov's .deb (scripts/package)."""
    deb = subprocess.run([os.path.join(TOP, "scripts", "package")], check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout.split()[-1]
    t = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # the builders' progress is not the bench's output
        tar, _ = debian.debian_tarball()
        _, initrds, img, _, _ = debian.build_images(os.path.join(work, "plain"), tar, deb)
        images = {"azprov": debian.azprov_bootable(os.path.join(work, "azprov"), img, initrds)}
        os.remove(img)
        images["none"] = debian.build_agent_image(os.path.join(work, "none"), tar, "none", key_pub)
        ci_tar, _ = debian.debian_tarball(debian.CLOUD_INIT_PACKAGES)
        images["cloud-init"] = debian.build_agent_image(os.path.join(work, "cloud-init"), ci_tar, "cloud-init")
    print(f"(images built in {time.time() - t:.0f} s)", file=sys.stderr)
    return images


def console_stamp(console, pat):
    """The kernel's timestamp of the first console line matching `pat`, or None."""
    import re
    if not os.path.exists(console):
        return None
    m = re.search(r"\[\s*(\d+\.\d+)\] " + pat, open(console, errors="replace").read())
    return float(m.group(1)) if m else None


def handover(console):
    """Seconds from the root's mount to the real init's start, from the console."""
    mounted = console_stamp(console, r"EXT4-fs \(\w+\): mounted filesystem")
    init = console_stamp(console, r"systemd\[1\]: systemd \d+")
    return init - mounted if mounted is not None and init is not None else None


DEBIAN_VARIANTS = {"azprov": ["--reboot"], "none": ["--ssh-only"], "cloud-init": []}


def debian_rounds(work, images, key, rounds, cpus):
    """`rounds` interleaved rounds of try-image on each image with each vCPU count: the figures
    by (vCPUs, variant), and one line per run that failed (its files kept, the rounds go on)."""
    rows, failed = {}, []
    for n in cpus:
        for i in range(rounds):
            for name, extra in DEBIAN_VARIANTS.items():
                d = os.path.join(work, f"run-{name}-{n}-{i}")
                r = subprocess.run([os.path.join(TOP, "scripts", "try-image"), images[name], "--gen", "1",
                                    "--json", "--quiet", "--cpus", str(n), "--memory", "2048", "--accel", "tcg",
                                    "--vm-size", "Standard_B2s", "--vm-name", "bench-deb", "--ssh-key",
                                    key + ".pub", "--timeout", "400", "--work", d, *extra],
                                   capture_output=True, text=True, check=False)
                try:
                    rep = json.loads(r.stdout)
                except ValueError:
                    raise RuntimeError(f"bench: try-image on the {name} image printed no report: "
                                       f"{r.stderr[-400:]}") from None
                if r.returncode != 0:
                    kept = tempfile.mkdtemp(prefix=f"azprov-bench-failed-{name}-{n}-{i}-")
                    shutil.copytree(d, kept, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("*.qcow2", "*.raw", "*.fd"))
                    cause = rep["cause"].replace(d, kept)
                    failed.append(f"{name}, {n} vCPU, round {i + 1}: {cause}")
                    print(f"bench: try-image on the {name} image ({n} vCPU, round {i + 1}) failed: {cause}",
                          file=sys.stderr, flush=True)
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                record_run(rows, n, name, rep)
                shutil.rmtree(d, ignore_errors=True)
    return rows, failed


def record_run(rows, n, name, rep):
    """One try-image report's figures into `rows`."""
    first = rows.setdefault((n, name), {})
    first.setdefault("Ready", []).append(rep["t_ready_s"])
    first.setdefault("SSH", []).append(rep["t_ssh_s"])
    first.setdefault("root mounted -> real init", []).append(handover(rep["console_log"]))
    if name == "azprov":
        # azprov's RSA key, made after the handover; the reboot waits for it
        first.setdefault("RSA key", []).append(rep.get("t_rsa_s"))
    if "reboot" in rep:
        again = rows.setdefault((n, name + " reboot"), {})
        again.setdefault("SSH", []).append(rep["reboot"]["t_ssh_s"])
        again.setdefault("root mounted -> real init", []).append(handover(rep["reboot"]["console_log"]))
        again.setdefault("fabric requests", []).append(len(rep["reboot"]["requests"]))


def debian_report(rows, failed, rounds, cpus):
    """The Debian section's lines: medians (min-max) per variant and vCPU count, the ratios
    and differences with their goals, and the runs that failed."""
    def med(xs):
        xs = [x for x in xs or [] if x is not None]
        return statistics.median(xs) if xs else None

    def show(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "-"
        return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"

    def line(what, a, b, form, goal=""):
        """`form` of a and b (medians; a line of "-" when either has none)."""
        value = form(a, b) if a is not None and b is not None else "-"
        print(f"    {what}: {value}{goal if value != '-' else ''}")

    print(f"Debian 12 through its own GRUB (Gen1), scripts/try-image, QEMU TCG, 2048 MiB, {rounds} interleaved "
          "rounds; seconds from QEMU start, median (min-max):")
    labels = {"azprov": "azprov, first boot", "azprov reboot": "azprov, its reboot",
              "none": "no agent (admin baked in)", "cloud-init": "Debian's cloud-init 22.4"}
    for n in cpus:
        print(f"  {n} vCPU:")
        for name in ("azprov", "azprov reboot", "none", "cloud-init"):
            got = rows.get((n, name), {})
            print(f"    {labels[name] + ':':28} " + "; ".join(f"{k} {show(v)}" for k, v in got.items()
                                                           if k != "fabric requests") +
                  (f"; fabric requests {max(got['fabric requests'])}" if "fabric requests" in got else ""))
        az, rb, ci, no = (rows.get((n, k), {}) for k in ("azprov", "azprov reboot", "cloud-init", "none"))
        line("first SSH, azprov's first boot / cloud-init's", med(az.get("SSH")), med(ci.get("SSH")),
             lambda a, b: f"{a / b:.2f}", "; goal <= 0.5")
        line("Ready, azprov / cloud-init", med(az.get("Ready")), med(ci.get("Ready")), lambda a, b: f"{a / b:.2f}")
        line("first SSH, azprov's first boot minus its reboot", med(az.get("SSH")), med(rb.get("SSH")),
             lambda a, b: f"{a - b:+.1f} s", "; goal <= 3 s with 2 vCPUs")
        line("root mounted -> real init, first boot minus reboot", med(az.get("root mounted -> real init")),
             med(rb.get("root mounted -> real init")), lambda a, b: f"{a - b:+.2f} s", "; goal <= 1.5 s")
        line("first SSH, azprov's first boot minus no agent's", med(az.get("SSH")), med(no.get("SSH")),
             lambda a, b: f"{a - b:+.1f} s")
    if failed:
        print(f"  failed runs ({len(failed)}; not in the figures above; their files kept):")
        for f in failed:
            print(f"    {f}")


def growroot_timing(boots=3, image_gib=4, disk_gib=32):
    """growroot's times on a first boot where a `image_gib` GiB image (GPT, ext4 root last)
    lies on a `disk_gib` GiB OS disk, as a 4 GB image on Azure's default 30-32 GB disk: the
    partition (the table's writes, BLKPG) and the online ext4 grow, from azprov's log line; QEMU
    TCG, Gen2 (virtio-scsi), `boots` boots on fresh disks."""
    import re
    kernel_img, moddir = kernel()
    work = tempfile.mkdtemp(prefix="azprov-bench-grow-")
    part, fs = [], []
    try:
        initrd = os.path.join(work, "initrd.img")
        mkinitramfs(initrd, moddir)
        with Azure(work, "g", imds_doc("bench-grow")) as azure:
            cd = make_cd(work, "bench-grow")
            for _ in range(boots):
                # the test root as a filesystem of the image's size (4 KiB blocks, as an image's)
                root = make_root(work, size=f"{(image_gib << 10) - 2}M")
                disk = partitioned(work, root, "gpt", disk_gib << 10)
                os.remove(root)
                _, _, out, rc = boot(azure, work, "gen2", kernel_img, initrd, disk, cd, "", "tcg")
                m = re.search(r"growroot: partition sda1 \+(\d+) MiB \(GPT\) in (\d+) ms; ext4 (\d+) MiB -> (\d+) MiB "
                              r"in (\d+) ms", out)
                if rc != 0 or not m:
                    sys.exit(f"bench: growroot did not grow the {image_gib} GiB image on {disk_gib} GiB: "
                             f"{next((l for l in out.splitlines() if 'growroot' in l), out[-300:])}")
                part.append(int(m.group(2)))
                fs.append(int(m.group(5)))
                sizes = f"ext4 {m.group(3)} MiB -> {m.group(4)} MiB, partition +{m.group(1)} MiB"
                os.remove(disk)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"growroot, a {image_gib} GiB image on a {disk_gib} GiB disk (GPT, ext4 with 4 KiB blocks, {sizes}), "
          f"QEMU TCG Gen2, {boots} boots:")
    print(f"  partition (table writes, BLKPG): {fmt(part)}")
    print(f"  ext4 online grow: {fmt(fs)}")


SECTIONS = ("core", "growroot", "debian")


def main():
    args = sys.argv[1:]
    runs = int(args.pop(0)) if args and args[0].isdigit() else 11
    sections = args or list(SECTIONS)
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown:
        sys.exit(f"usage: scripts/bench [N] [{' | '.join(SECTIONS)}]...; unknown: {' '.join(unknown)}")
    if os.geteuid() != 0:
        sys.exit("scripts/bench needs root (network namespaces)")
    failed = []
    for name in sections:
        sys.stdout = Tee(sys.__stdout__)
        whole = {"core": lambda: core(runs), "growroot": growroot_timing,
                 "debian": lambda: debian_timeline(max(3, min(runs, 5)))}[name]() is not False
        sys.stdout.flush()
        text = "".join(sys.stdout.kept)
        sys.stdout = sys.__stdout__
        record(text, "bench" if name == "core" else f"bench-{name}")
        if not whole:
            failed.append(name)
    if failed:
        sys.exit(f"bench: runs failed in {', '.join(failed)} (listed in its output, recorded with it)")


def core(runs):
    """The process-level comparison with the guide's approach, size, memory, RSA and the QEMU
    timelines."""
    binary = build()
    work = tempfile.mkdtemp(prefix="azprov-bench-")
    try:
        with Bench(work) as b:
            root = os.path.join(work, "root")
            az, seed, stages = [], [], []
            for _ in range(runs):  # interleaved: one of each per round
                ms, rc, _, out = b.azprov(binary, root)
                if rc != 0:
                    sys.exit(f"bench: azprov provision failed (exit {rc})")
                az.append(ms)
                stages.append(json.loads(out)["timings_ms"])
                ms, rc, _, _ = b.seed()
                if rc != 0:
                    sys.exit(f"bench: the seed approach failed (exit {rc})")
                seed.append(ms)
            print(f"provision to Ready, {runs} interleaved runs each:")
            print(f"  azprov (own DHCP, OVF, IMDS, writes, Ready): {fmt(az)}")
            print(f"  seed (busybox udhcpc + Python goal state and health): {fmt(seed)}")
            print(f"  ratio seed/azprov: {stats(seed)[0] / stats(az)[0]:.2f} (goal >= 6)")
            med = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
            print(f"  azprov's stages, medians (ms): {json.dumps(med)}")
            # the provisioned reboot: nothing on the network
            fab0, disc0 = b.packets()
            again = []
            for _ in range(runs):
                b.reset_link()
                ms, rc, _, _ = b.timed([binary, "provision", "--root", root, "--iface", "vm0", "--json",
                                        "--dmi", os.path.join(work, "dmi"), "--cmdline", os.path.join(work, "cmdline"),
                                        "--keep-host-keys"])
                again.append(ms)
            time.sleep(0.3)
            fab1, disc1 = b.packets()
            print(f"already provisioned: {fmt(again)}; packets sent: {disc1 - disc0} DHCP DISCOVER, "
                  f"{fab1 - fab0} fabric requests")
            # apart from the timed runs: GNU time adds a fork and an exec
            for keys in (False, True):
                rss = [b.azprov(binary, root, rss=True, host_keys=keys)[2] for _ in range(3)]
                what = "with new host keys (RSA racing)" if keys else "keeping the image's host keys"
                print(f"azprov peak RSS of a provision {what}, GNU time, 3 runs: median {statistics.median(rss):.0f} KiB "
                      f"(max {max(rss)}; goal <= 4096 KiB)")
            print(f"binary: {binary}: {os.path.getsize(binary)} bytes (stripped, static; goal <= 1600000)")
            tree = subprocess.run(["cargo", "tree", "-e", "normal", "--prefix", "none", "--locked"], cwd=TOP,
                                  capture_output=True, text=True, check=False).stdout
            crates = {l.replace(" (*)", "").strip() for l in tree.splitlines() if l.strip()}
            print(f"crates (normal dependencies, azprov included): {len(crates)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rsa_vs_openssl()
    qemu_timeline()
    # the RSA host key under -icount takes a minute of guest time: the handover is not measured here
    qemu_timeline(3, icount="shift=1", append="azprov.hostkeys=keep")


class Tee:
    """Everything printed goes to the terminal and is kept for docs/performance.md."""

    def __init__(self, out):
        self.out, self.kept = out, []

    def write(self, text):
        self.kept.append(text)
        return self.out.write(text)

    def flush(self):
        self.out.flush()


def record(text, marker):
    """Puts a section's output between its markers in docs/performance.md."""
    path = os.path.join(TOP, "docs", "performance.md")
    with open(path) as f:
        doc = f.read()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if begin not in doc or end not in doc:
        sys.exit(f"bench: {path} lacks the {begin} / {end} markers")
    commit = subprocess.run(["git", "-C", TOP, "describe", "--always", "--dirty"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown CPU")
    cmd = " ".join(["scripts/bench", *sys.argv[1:]])
    title = {"bench": "Last bench run", "bench-growroot": "growroot on a large disk",
             "bench-debian": "Debian images: Ready and first SSH"}.get(marker, marker)
    section = (f"{begin}\n## {title}\n\n`{cmd}`"
               f" at {commit}, {time.strftime('%Y-%m-%d', time.gmtime())}, on {os.cpu_count()} CPUs ({cpu}):\n\n"
               f"```\n{text.rstrip()}\n```\n{end}")
    head, rest = doc.split(begin, 1)
    with open(path, "w") as f:
        f.write(head + section + rest.split(end, 1)[1])
    print(f"bench: wrote {path}", file=sys.__stdout__)


def command():
    """scripts/bench: a SIGTERM (timeout, kill) unwinds like ^C: QEMU, the fabric and its
    namespace are stopped and the work files removed by the same finally blocks."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
