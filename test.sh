#!/usr/bin/env bash
# The project's test command: installs what the tests need (Debian packages),
# then runs every crate's tests, the arbiter's and the runtime's cgroup tests
# again in an 8-CPU, 2-socket, hyperthreaded, cgroup-v2-only guest
# (scripts/guest-tests.sh, at most 5 minutes), corewise-kv's conformance with
# real memcached clients (memccapable -a and -b, pymemcache), and the loom
# models of the cross-core protocols (bounded preemptions, optimised build).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/install-test-deps.sh
cargo test --workspace
bash scripts/guest-tests.sh
bash crates/corewise-kv/tests/conformance.sh
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test -p corewise --lib --release
