#!/usr/bin/env bash
# The project's test command: every crate's tests, then the loom models of
# the cross-core protocols (bounded preemptions, optimised build).
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
  cargo test -p corewise --lib --release
