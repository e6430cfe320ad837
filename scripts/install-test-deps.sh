#!/usr/bin/env bash
# Installs what the tests need (Debian packages): for corewise-kv's
# conformance tests real memcached (the benchmark's peer), memccapable
# (libmemcached-tools) and pymemcache; for the tests in a guest
# (scripts/guest.sh) QEMU, a static busybox for the guest's init, and cpio
# to pack it; ss (iproute2), which shows a listening socket's backlog.
# Idempotent: nothing is installed when everything is there.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v memccapable >/dev/null || missing+=(libmemcached-tools)
/usr/bin/python3 -c 'import pymemcache' 2>/dev/null || missing+=(python3-pymemcache)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
# ss, which shows a listening socket's backlog (corewise-kv's -b test).
command -v ss >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
