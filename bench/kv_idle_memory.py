#!/usr/bin/env python3
"""Resident memory per quiet connection: corewise-kv (both modes) against
memcached.

For each server: start it on a free port, open N connections, wait
(--pause, 2.5 s: longer than corewise-kv's one-second quiet bound), then
send one small `set` and `get` on each, read every reply, wait one second
and read the server's VmRSS. Prints the growth per connection after the
connections opened and after their one request (items included).

    cargo build --release -p corewise-kv
    bench/kv_idle_memory.py                 # 3 000 connections
    bench/kv_idle_memory.py -n 10000 --kv target/release/corewise-kv

Needs memcached (scripts/install-test-deps.sh); run as root it starts
memcached with `-u nobody`. Raise `ulimit -n` above N first.
"""

import argparse
import os
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def wait_listening(port, proc):
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def measure(name, argv, n, pause, value):
    port = free_port()
    proc = subprocess.Popen(argv + ["-p", str(port)], stdout=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        time.sleep(0.5)
        before = rss_kib(proc.pid)
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        time.sleep(pause)
        opened = rss_kib(proc.pid)
        v = b"x" * value
        for i, c in enumerate(conns):
            c.sendall(b"set k%d 0 0 %d\r\n%s\r\nget k%d\r\n" % (i, value, v, i))
        for c in conns:
            buf = b""
            while not buf.endswith(b"END\r\n"):
                chunk = c.recv(65536)
                if not chunk:
                    raise RuntimeError("connection closed")
                buf += chunk
        time.sleep(1)
        after = rss_kib(proc.pid)
        print(
            f"| {name} | {(opened - before) * 1024 / n:.0f} | "
            f"{(after - before) * 1024 / n:.0f} |"
        )
        for c in conns:
            c.close()
    finally:
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3000, help="connections")
    ap.add_argument("--pause", type=float, default=2.5, help="seconds idle before the request")
    ap.add_argument("--value", type=int, default=100, help="value bytes")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--kv", default=os.path.join(root, "target/release/corewise-kv"))
    ap.add_argument("--memcached", default="memcached")
    a = ap.parse_args()
    limit = ["-c", str(a.n + 100)]
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    print(f"{a.n} connections, {a.pause} s idle, one set and get of {a.value} bytes each")
    print("| server | bytes/conn opened | bytes/conn after one request |")
    print("|---|---:|---:|")
    measure("corewise-kv (conn)", [a.kv, "-l", "127.0.0.1"] + limit, a.n, a.pause, a.value)
    measure(
        "corewise-kv (dispatch)",
        [a.kv, "-l", "127.0.0.1", "--mode", "dispatch"] + limit,
        a.n,
        a.pause,
        a.value,
    )
    measure("memcached", [a.memcached, "-l", "127.0.0.1"] + user + limit, a.n, a.pause, a.value)


if __name__ == "__main__":
    main()
