#!/bin/sh
# dracut pre-pivot hook (shell init; systemd initrds run azprov-initrd.service instead). Sourced
# by dracut's init: never exit, never stop the boot.
/usr/sbin/azprov provision --root "${NEWROOT:-/sysroot}" || :
