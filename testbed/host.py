"""What every part of the testbed shares: where the checkout, the cache and the work
directories are, and the two helpers that run a command and say a line."""
import os
import subprocess

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Downloaded kernels, Debian roots, mkosi's caches and the tools live outside the clone, keyed
# by what they contain, so a fresh clone reuses them.
CACHE = os.environ.get("AZPROV_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "azprov")
# The tiers' work directories (qemu-tests/out/NAME, qemu-tests/out/distro/NAME).
OUT = os.path.join(TOP, "qemu-tests", "out")
FIXTURES = os.path.join(TOP, "tests", "fixtures")


def sh(*args, **kw):
    """Runs `args`; a failure raises."""
    return subprocess.run(args, check=True, **kw)


def log(msg):
    print(msg, flush=True)


def build(*args):
    """scripts/build's binary (with `args`, e.g. "--target", "aarch64"): its path."""
    return subprocess.run([os.path.join(TOP, "scripts", "build"), *args], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.split()[-1]


def mkinitramfs(out, moddir, *args):
    """scripts/mkinitramfs into `out` with the kernel's modules at `moddir` (and `args`, e.g.
    "--azprov", BIN): what it printed (the image's size and contents)."""
    return subprocess.run([os.path.join(TOP, "scripts", "mkinitramfs"), "--kernel-modules", moddir, *args, "-o", out],
                          check=True, stdout=subprocess.PIPE, text=True).stdout
