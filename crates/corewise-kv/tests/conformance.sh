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

tool=/usr/share/memcached/scripts/memcached-tool
[ -r "$tool" ] || { echo "memcached-tool missing: run scripts/install-test-deps.sh" >&2; exit 1; }

# memcached-tool (Debian's memcached package) reads corewise-kv's slab
# classes and stats: after a flush, items of 1, 1 000 and 600 000 bytes
# land in classes 1 (96 B), 12 (1.2K) and 39 (512.0K), one each.
check_memcached_tool() {
    "$py" - "$1" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
req = b"flush_all\r\n"
for key, n in (("t1", 1), ("t2", 1000), ("t3", 600000)):
    req += b"set %s 0 0 %d\r\n" % (key.encode(), n) + b"a" * n + b"\r\n"
s.sendall(req)
want = b"OK\r\n" + b"STORED\r\n" * 3
got = b""
while len(got) < len(want):
    got += s.recv(4096)
assert got == want, got
PY
    display="$(perl "$tool" "127.0.0.1:$1" display)"
    echo "$display"
    for row in '^  1      96B .* 1      no' '^ 12     1.2K .* 1      no' '^ 39   512.0K .* 1     yes'; do
        grep -Eq "$row" <<<"$display" || { echo "memcached-tool display: no row like '$row'" >&2; exit 1; }
    done
    [ "$(echo "$display" | wc -l)" -eq 4 ] || { echo "memcached-tool display: extra rows" >&2; exit 1; }
    stats="$(perl "$tool" "127.0.0.1:$1" stats)"
    grep -Eq '^ +curr_items +3[[:space:]]*$' <<<"$stats" || { echo "$stats"; echo "memcached-tool stats: curr_items is not 3" >&2; exit 1; }
}

# The checks grep here-strings, not `echo | grep -q`: with pipefail, a grep
# that quits at its first match can leave echo writing to a closed pipe,
# and the pipeline then fails although the line was there (seen in CI with
# the stats listing).

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
        if ! grep -q "All tests passed" <<<"$out"; then
            echo "$out"
            echo "memccapable $proto failed in $mode mode" >&2
            exit 1
        fi
    done
    echo "== $mode mode: pymemcache"
    "$py" crates/corewise-kv/tests/pymemcache_test.py "$port"
    echo "== $mode mode: memcached-tool display and stats"
    check_memcached_tool "$port"
    cleanup
    pid=""
done
echo "conformance: all passed"
