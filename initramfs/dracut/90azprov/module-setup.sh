#!/bin/bash
# dracut module azprov: provisions the mounted root (/sysroot) before switch-root. Enabled by
# dracut.conf.d/90-azprov.conf; it brings its own DHCP client, so it needs no network module.
# dracut sets these for every module:
# shellcheck disable=SC2154 # moddir, initdir, systemdsystemunitdir, SYSTEMCTL

check() {
    require_binaries /usr/sbin/azprov || return 1
    # only when added (90-azprov.conf or --add azprov)
    return 255
}

depends() {
    return 0
}

installkernel() {
    # hostonly='': a build host that is no Hyper-V guest must still carry Hyper-V's drivers
    local m mods=()
    while read -r m; do
        case "$m" in '' | '#'*) continue ;; esac
        mods+=("$m")
    done < /usr/share/azprov/modules
    hostonly='' instmods "${mods[@]}"
}

install() {
    inst /usr/sbin/azprov
    if dracut_module_included "systemd"; then
        inst_simple "$systemdsystemunitdir/azprov-initrd.service"
        $SYSTEMCTL -q --root "$initdir" enable azprov-initrd.service
    else
        inst_hook pre-pivot 50 "$moddir/azprov-pre-pivot.sh"
    fi
}
