#!/usr/bin/env python3
"""Plot `corewise-bench echo --json` output: throughput, p99 latency and
system calls per request against the number of connections, one line per
server. Usage: echo_plot.py RESULTS.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = json.load(open(sys.argv[1]))
    servers = []
    for r in rows:
        if r["server"] not in servers:
            servers.append(r["server"])
    panels = [
        ("throughput_per_s", "round trips / s", False),
        ("p99_us", "p99 latency (µs)", True),
        ("syscalls_per_request", "server syscalls / request", True),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, label, logy) in zip(axes, panels):
        for s in servers:
            pts = sorted(
                (r["connections"], r[key])
                for r in rows
                if r["server"] == s and r.get(key) is not None
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
        ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("connections")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("echo, 64-byte messages: corewise vs tokio vs epoll loop")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
