#!/usr/bin/env bash
# guest.sh - runs one command inside a throw-away QEMU guest and exits with
# the command's exit status.
#
#   scripts/guest.sh [-c CPUS] [-t SOCKETS:CORES:THREADS] [-m MEM] [-T SECS]
#                    [-w DIR]... [-e VAR]... [-s] [-v] -- COMMAND [ARG...]
#
#   -c CPUS   virtual CPUs (default 8)
#   -t S:C:T  topology, sockets:cores per socket:threads per core
#             (default 2:CPUS/4:2 when CPUS is a multiple of 4, else 1:CPUS:1)
#   -m MEM    guest memory (default 2G)
#   -T SECS   give up after SECS seconds (default 600): exit 124
#   -w DIR    make DIR writable through to the host (repeatable); every other
#             write lands in guest memory and is thrown away
#   -e VAR    export the host's VAR into the guest (repeatable)
#   -s        boot systemd (the host's /lib/systemd/systemd) as the guest's
#             init and run the command as a unit of it, so that the command
#             can start services (systemctl works; installs systemd if absent)
#   -v        show the kernel's and the init's messages
#
# Why: the arbiter's tests need a machine with many CPUs, sockets and
# hyperthreads, and a cgroup v2 hierarchy with nothing else mounted, which
# the build machines do not have. The guest is such a machine: the Debian
# kernel, the host's root file system shared read-only over 9p under a
# memory overlay (so host binaries, test binaries included, run unchanged),
# fresh /proc, /sys, /dev and /run, and only cgroup v2
# (cgroup_no_v1=all) mounted on /sys/fs/cgroup with the cpuset and cpu
# controllers enabled for its children. The command runs as root in the
# caller's working directory, stdin from /dev/null, stdout and stderr on
# this script's stdout.
#
# Exit status: the command's; 124 on timeout; 125 when the guest failed.
# The first run installs qemu-system-x86, busybox-static and cpio (apt) and
# unpacks the kernel into the cache ($COREWISE_GUEST_CACHE, default
# ~/.cache/corewise-guest). Without hardware virtualisation the CPU is
# emulated (TCG, one host thread per vCPU) and many times slower than the
# host: use the guest for behaviour, never for timings.
set -euo pipefail

cpus=8 topo="" mem=2G limit=600 verbose=0 systemd=0
writable=() passenv=()
while getopts "c:t:m:T:w:e:svh" opt; do
    case $opt in
        c) cpus=$OPTARG ;;
        t) topo=$OPTARG ;;
        m) mem=$OPTARG ;;
        T) limit=$OPTARG ;;
        w) writable+=("$(realpath "$OPTARG")") ;;
        e) passenv+=("$OPTARG") ;;
        s) systemd=1 ;;
        v) verbose=1 ;;
        *) sed -n '2,19p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { sed -n '2,19p' "$0" >&2; exit 2; }

cache=${COREWISE_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corewise-guest}
modules="virtio_ring virtio virtio_mmio netfs fscache 9pnet 9pnet_virtio 9p overlay"
initrd_version=2

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_tools() {
    local pkgs=()
    command -v qemu-system-x86_64 >/dev/null || pkgs+=(qemu-system-x86)
    [ -x /bin/busybox ] || pkgs+=(busybox-static)
    command -v cpio >/dev/null || pkgs+=(cpio)
    [ "$systemd" = 0 ] || [ -x /lib/systemd/systemd ] || pkgs+=(systemd)
    [ ${#pkgs[@]} -gt 0 ] || return 0
    echo "guest.sh: installing ${pkgs[*]}" >&2
    as_root apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${pkgs[@]}" >&2
}

# The Debian kernel as an uncompressed ELF image (what QEMU's microvm
# machine boots directly) and the modules the init needs.
unpack_kernel() {
    [ -s "$cache/vmlinux" ] && [ -s "$cache/modules/overlay.ko" ] && return 0
    local pkg work
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -1)
    if [ -z "$pkg" ]; then
        as_root apt-get update -qq >&2
        pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -1)
    fi
    [ -n "$pkg" ] || { echo "guest.sh: no Debian kernel package found" >&2; exit 125; }
    work=$(mktemp -d "$cache/kernel.XXXXXX")
    (cd "$work" && apt-get download "$pkg" >&2 && dpkg-deb -x ./*.deb root)
    # bzImage: a boot stub followed by the xz-compressed ELF kernel.
    python3 - "$work"/root/boot/vmlinuz-* "$work/vmlinux" <<'PY'
import lzma, sys
image = open(sys.argv[1], "rb").read()
start = image.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit("guest.sh: no xz payload in " + sys.argv[1])
elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(image[start:])
if elf[:4] != b"\x7fELF":
    sys.exit("guest.sh: the payload is not an ELF kernel")
open(sys.argv[2], "wb").write(elf)
PY
    rm -rf "$cache/modules"
    mkdir -p "$cache/modules"
    for m in $modules; do
        find "$work/root/lib/modules" -name "$m.ko" -exec cp {} "$cache/modules/" \;
        [ -s "$cache/modules/$m.ko" ] || { echo "guest.sh: module $m missing from $pkg" >&2; exit 125; }
    done
    mv "$work/vmlinux" "$cache/vmlinux"
    rm -rf "$work"
}

# The initramfs: loads the 9p and overlay modules, builds the guest's root
# (host / read-only, writes in memory), and runs the command's wrapper.
build_initrd() {
    local out="$cache/initrd-$initrd_version.cpio.gz" dir
    [ -s "$out" ] && return 0
    dir=$(mktemp -d "$cache/initrd.XXXXXX")
    mkdir -p "$dir"/{bin,dev,proc,sys,host,mem,root,ctl,modules}
    cp /bin/busybox "$dir/bin/busybox"
    cp "$cache"/modules/*.ko "$dir/modules/"
    cat >"$dir/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
fail() { echo "guest init: \$*" >/dev/ttyS0; poweroff -f; }
for m in $modules; do insmod /modules/\$m.ko || fail "insmod \$m"; done
opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o \$opts,cache=none ctl /ctl || fail "mount ctl"
mount -t 9p -o \$opts,ro host /host || fail "mount host root"
mount -t tmpfs -o mode=755 mem /mem
mkdir /mem/upper /mem/work
mount -t overlay -o lowerdir=/host,upperdir=/mem/upper,workdir=/mem/work root /root \
    || fail "overlay"
mount -t tmpfs -o mode=755 run /root/run
while read -r tag path; do
    mount -t 9p -o \$opts,rw "\$tag" "/root\$path" || fail "mount \$path"
done </ctl/writable
mkdir -p /root/run/guest/ctl
mount --move /ctl /root/run/guest/ctl
cp /bin/busybox /root/run/guest/busybox
umount /proc /sys /dev
exec switch_root /root /run/guest/busybox sh /run/guest/ctl/stage2
EOF
    chmod +x "$dir/init"
    (cd "$dir" && find . | cpio -o -H newc --quiet | gzip -1) >"$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$dir"
}

mkdir -p "$cache"
exec 8>"$cache/.lock"
flock 8
install_tools
unpack_kernel
build_initrd
flock -u 8
exec 8>&-

if [ -z "$topo" ]; then
    if [ $((cpus % 4)) -eq 0 ]; then topo="2:$((cpus / 4)):2"; else topo="1:$cpus:1"; fi
fi
IFS=: read -r sockets cores threads <<<"$topo"
if [ $((sockets * cores * threads)) -ne "$cpus" ]; then
    echo "guest.sh: topology $topo does not make $cpus CPUs" >&2
    exit 2
fi

run=$(mktemp -d "${TMPDIR:-/tmp}/corewise-guest.XXXXXX")
trap 'rm -rf "$run"' EXIT
trap 'exit 130' INT TERM

# The command, as a script the guest runs.
{
    echo "export PATH=$(printf %q "$PATH") HOME=/root TERM=dumb LANG=C.UTF-8"
    for v in "${passenv[@]}"; do
        [ -n "${!v+set}" ] && echo "export $v=$(printf %q "${!v}")"
    done
    echo "cd $(printf %q "$PWD") || exit 125"
    printf 'exec'
    printf ' %q' "$@"
    echo
} >"$run/command"

# Second stage, on the final root: cgroup v2, the command, power off.
cat >"$run/stage2" <<'EOF'
bb=/run/guest/busybox
ctl=/run/guest/ctl
$bb mount -t proc proc /proc
$bb mount -t sysfs sys /sys
$bb mount -t devtmpfs dev /dev
$bb mkdir -p /dev/pts /dev/shm
$bb mount -t devpts -o ptmxmode=666 devpts /dev/pts
$bb mount -t tmpfs -o mode=1777 shm /dev/shm
$bb mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+cpuset +cpu" >/sys/fs/cgroup/cgroup.subtree_control
$bb hostname guest
$bb stty -F /dev/ttyS0 -onlcr 2>/dev/null
/bin/bash $ctl/command </dev/null >/dev/ttyS0 2>&1
echo $? >$ctl/status
# Whatever the command left running is stopped before power-off.
$bb kill -TERM -1 2>/dev/null; $bb sleep 0.2; $bb kill -KILL -1 2>/dev/null
: >/dev/ttyS0
$bb sync
$bb poweroff -f
EOF

# With -s, the second stage hands over to systemd instead: the command
# becomes a unit without default dependencies (it starts at once; what it
# starts gets the usual ones), and powers the guest off when done.
# systemd-tmpfiles-setup is masked: it would walk the host's whole file
# system over 9p (a minute and a half with an emulated CPU), and the
# guest's /run and /tmp start empty anyway.
# systemd-firstboot is masked too: on a first boot (a host without
# /etc/machine-id, as a fresh container is) it would ask for a time zone
# or a locale on the console, which nobody answers, and every unit after
# sysinit.target (any service the command starts) would wait for it.
if [ "$systemd" = 1 ]; then
    cat >"$run/stage2" <<'EOF'
bb=/run/guest/busybox
$bb mkdir -p /etc/systemd/system
$bb ln -sf /dev/null /etc/systemd/system/systemd-tmpfiles-setup.service
$bb ln -sf /dev/null /etc/systemd/system/systemd-firstboot.service
$bb cat >/etc/systemd/system/guest-command.service <<'UNIT'
[Unit]
Description=guest.sh command
DefaultDependencies=no
[Service]
Type=oneshot
StandardInput=null
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
ExecStart=/bin/bash -c 'bash /run/guest/ctl/command; echo $? >/run/guest/ctl/status; sync; systemctl poweroff --force --force'
UNIT
exec /lib/systemd/systemd --unit=guest-command.service
EOF
fi

: >"$run/writable"
shares=(-fsdev "local,id=host,path=/,security_model=none,readonly=on,multidevs=remap"
    -device virtio-9p-device,fsdev=host,mount_tag=host
    -fsdev "local,id=ctl,path=$run,security_model=none"
    -device virtio-9p-device,fsdev=ctl,mount_tag=ctl)
i=0
for d in "${writable[@]}"; do
    shares+=(-fsdev "local,id=w$i,path=$d,security_model=none,multidevs=remap"
        -device "virtio-9p-device,fsdev=w$i,mount_tag=w$i")
    echo "w$i $d" >>"$run/writable"
    i=$((i + 1))
done

# KVM only where it is real hardware virtualisation; otherwise TCG, with an
# Intel CPU model so that the guest kernel reads hyperthread siblings from
# CPUID leaf 0xB.
accel=(-accel "tcg,thread=multi,tb-size=256" -cpu max,vendor=GenuineIntel)
if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; } \
    && [ ! -d /sys/module/kvm_pvm ]; then
    accel=(-accel kvm -cpu host)
fi
khz=$(awk -F: '/^cpu MHz/ { printf "%d", $2 * 1000; exit }' /proc/cpuinfo)
cmdline="panic=-1 cgroup_no_v1=all mitigations=off tsc=reliable tsc_early_khz=$khz"
if [ "$verbose" = 1 ]; then
    cmdline+=" console=ttyS0 loglevel=7"
else
    cmdline+=" quiet loglevel=1 systemd.show_status=error"
fi

set +e
timeout -k 5 "$limit" qemu-system-x86_64 -M microvm -m "$mem" "${accel[@]}" \
    -smp "$cpus,sockets=$sockets,cores=$cores,threads=$threads" \
    -nodefaults -no-user-config -display none -no-reboot \
    -chardev stdio,id=console,signal=off -serial chardev:console \
    -kernel "$cache/vmlinux" -initrd "$cache/initrd-$initrd_version.cpio.gz" \
    -append "$cmdline" "${shares[@]}" </dev/null 2>"$run/qemu.log"
qemu_status=$?
set -e
if [ $qemu_status -eq 124 ] || [ $qemu_status -eq 137 ]; then
    echo "guest.sh: timed out after ${limit}s" >&2
    exit 124
fi
if [ ! -s "$run/status" ]; then
    echo "guest.sh: the guest failed (qemu exit status $qemu_status)" >&2
    grep -v "TCG doesn't support" "$run/qemu.log" >&2 || true
    exit 125
fi
exit "$(cat "$run/status")"
