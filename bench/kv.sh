#!/usr/bin/env bash
# corewise-kv against memcached -t 1: builds both binaries (release), then
# runs `corewise-bench kv` with the neighbour experiment, writing kv.json
# and kv.png into bench/results (or $KV_OUT).
#   bench/kv.sh            full sweep (about 3-4 minutes)
#   bench/kv.sh --quick    under three minutes
# Extra arguments go to `corewise-bench kv` (e.g. --workload memtier,
# --kv-mode dispatch, --server-cpu 2 --client-cpu 3); KV_OUT=DIR changes
# where kv.json and kv.png go.
# Needs memcached (scripts/install-test-deps.sh) and two CPUs; the servers
# are confined to the first allowed CPU, the load generator to the second.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build -q --release -p corewise-kv -p corewise-bench
out="${KV_OUT:-bench/results}"
mkdir -p "$out"
command -v memcached >/dev/null || { echo "memcached missing: run scripts/install-test-deps.sh" >&2; exit 1; }
exec "$target/release/corewise-bench" kv --neighbour \
    --json "$out/kv.json" --png "$out/kv.png" \
    --kv-bin "$target/release/corewise-kv" "$@"
