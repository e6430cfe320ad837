#!/usr/bin/env bash
# Conformance of corewise-kv with real memcached clients: pymemcache (every
# command it supports) and `memccapable -a` and `-b` (libmemcached's ASCII
# and binary protocol suites), in both server modes. Needs
# scripts/install-test-deps.sh first.
# Usage: crates/corewise-kv/tests/conformance.sh   (from anywhere)
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build -q -p corewise-kv --release
bin="$target/release/corewise-kv"
py=/usr/bin/python3
if ! "$py" -c 'import pymemcache' 2>/dev/null; then
    py=python3
fi
command -v memccapable >/dev/null || { echo "memccapable missing: run scripts/install-test-deps.sh" >&2; exit 1; }
"$py" -c 'import pymemcache' || { echo "pymemcache missing: run scripts/install-test-deps.sh" >&2; exit 1; }

free_port() {
    "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

pid=""
cleanup() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

for mode in conn dispatch; do
    port="$(free_port)"
    "$bin" -p "$port" -l 127.0.0.1 --mode "$mode" &
    pid=$!
    for _ in $(seq 100); do
        "$py" -c "import socket; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null && break
        sleep 0.05
    done
    for proto in -a -b; do
        echo "== $mode mode: memccapable $proto"
        out="$(memccapable "$proto" -h 127.0.0.1 -p "$port" 2>&1)" || true
        echo "$out" | tail -n 3
        if ! echo "$out" | grep -q "All tests passed"; then
            echo "$out"
            echo "memccapable $proto failed in $mode mode" >&2
            exit 1
        fi
    done
    echo "== $mode mode: pymemcache"
    "$py" crates/corewise-kv/tests/pymemcache_test.py "$port"
    cleanup
    pid=""
done
echo "conformance: all passed"
