#!/usr/bin/env bash
# Installs what the corewise-kv conformance tests need: real memcached (the
# benchmark's peer), memccapable (libmemcached-tools) and pymemcache.
# Idempotent: apt-get skips what is already installed.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
if command -v memcached >/dev/null && command -v memccapable >/dev/null \
    && /usr/bin/python3 -c 'import pymemcache' 2>/dev/null; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y memcached libmemcached-tools python3-pymemcache
