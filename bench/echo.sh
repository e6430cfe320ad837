#!/usr/bin/env bash
# The echo benchmark: corewise (io_uring and epoll back ends) against tokio
# and a plain epoll loop, 1..1000 connections, 64-byte messages. Writes
# results/echo.{json,md,png}. Pass --quick for a run under two minutes.
# System calls are counted with `perf stat` (root); without perf that
# column is n/a. The plot needs python3 with matplotlib (installed from PyPI
# when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results
mkdir -p "$out"
cargo build --release -p corewise-bench
target="${CARGO_TARGET_DIR:-target}"
"$target/release/corewise-bench" echo --json "$out/echo.json" --md "$out/echo.md" "$@"
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  python3 -m pip install --quiet matplotlib
fi
python3 bench/echo_plot.py "$out/echo.json" "$out/echo.png"
echo "wrote $out/echo.json $out/echo.md $out/echo.png"
