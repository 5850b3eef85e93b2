"""azprov's testbed: one package that every test tool past `cargo test` is made of. The
executables are a few lines each that call into it: qemu-tests/run (qemu_tier), qemu-tests/distro
(distro_tier), scripts/try-image (try_image), scripts/demo (demo) and scripts/bench (bench);
tests/kvp_readers.py and the Rust namespace tests use parts of it too.

  host      the checkout, the cache (AZPROV_CACHE), the work directories; sh, log, build
  fabric    the simulated WireServer, HostGAPlugin and IMDS (standard library only, also a
            program: the Rust tests and Azure run it as `python3 testbed/fabric.py`)
  azure     Azure: a network namespace with Azure's addresses, the guest's link (tap0, or a
            veth for a process), Azure's DHCP (dnsmasq) and the fabric; a context manager
  images    what a VM boots from and what is read back: the Debian kernel, test roots, the
            provisioning CD and ovf-env.xml, the IMDS document, partitioned disks, GRUB
            images, fixed VHDs; debugfs, GPT and e2fsck readers
  vm        QEMU: the machine shapes, boot (to power-off), boot_cut (a power cut at a write),
            VM (a Debian image in the background, logged into over SSH)
  debian    the distribution images: Debian roots (mmdebstrap), azprov from the .deb, the RPM
            or mkinitcpio, the hardened image, cloud-init and waagent images, mkosi's; Images
  check     Check: a scenario's failed checks, all of them
  qemu_tier, distro_tier, try_image, demo, bench: the tools themselves

Scenarios hold what they start in `with` blocks (Azure, VM), so a failed check or a broken
scenario stops QEMU, dnsmasq and the fabric and removes the namespace. Unit tests of the
parts that need no root: `python3 -m unittest discover -s testbed -t .` from the top.
"""
