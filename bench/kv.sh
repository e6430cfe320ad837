#!/usr/bin/env bash
# corewise-kv against memcached -t 1: builds both binaries (release), then
# runs `corewise-bench kv` with the neighbour experiment, writing
# bench/results/kv.json and bench/results/kv.png.
#   bench/kv.sh            full sweep (about 3-4 minutes)
#   bench/kv.sh --quick    under three minutes
# Extra arguments go to `corewise-bench kv` (e.g. --workload memtier,
# --kv-mode dispatch, --server-cpu 2 --client-cpu 3).
# Needs memcached (scripts/install-test-deps.sh) and two CPUs; the servers
# are confined to the first allowed CPU, the load generator to the second.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build -q --release -p corewise-kv -p corewise-bench
mkdir -p bench/results
command -v memcached >/dev/null || { echo "memcached missing: run scripts/install-test-deps.sh" >&2; exit 1; }
exec "$target/release/corewise-bench" kv --neighbour \
    --json bench/results/kv.json --png bench/results/kv.png \
    --kv-bin "$target/release/corewise-kv" "$@"
