#!/usr/bin/env python3
"""Memory of 1000 idle connections, TCP loopback against smclo.

A server and a client process (both under `smclo run` for the smclo column)
open N connections, exchange 100 bytes on each (so every connection is
decided and has touched its rings), then hold them.  The cost is the drop of
the kernel's MemAvailable while both hold the connections.  Part of
`make bench`; run alone as `python3 bench/idle_memory.py [N]`.
"""
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMCLO = str(Path(os.environ.get("SMCLO_BUILD", ROOT / "build")) / "smclo")

PEER = r"""
import socket, sys
role, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conns = []
if role == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(1024)
    print("ready", flush=True)
    for _ in range(n):
        c, _ = s.accept()
        c.sendall(c.recv(100))
        conns.append(c)
else:
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"x" * 100)
        got = b""
        while len(got) < 100:
            got += c.recv(100 - len(got))
        conns.append(c)
print("holding", flush=True)
sys.stdin.readline()
"""


def mem_available_kb():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


def measure(mode, n, registry):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, SMCLO_DIR=registry)
    wrap = [SMCLO, "run", "--"] if mode == "smclo" else []
    before = mem_available_kb()
    procs = []
    try:
        for role in ("server", "client"):
            p = subprocess.Popen(wrap + [sys.executable, "-c", PEER, role, str(port), str(n)],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, preexec_fn=raise_nofile)
            procs.append(p)
            if role == "server":
                assert p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdout.readline().strip() == "holding", mode
        time.sleep(0.5)
        used = before - mem_available_kb()
        if mode == "smclo":
            out = subprocess.run([SMCLO, "stat", "--json"], env=env, capture_output=True,
                                 text=True, check=True).stdout
            shm = out.count('"mode": "shm"')
            assert shm == 2 * n, "only %d of %d ends accelerated" % (shm, 2 * n)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return used / 1024.0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rows = []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        for run in range(2):
            for mode in ("tcp", "smclo"):
                mb = measure(mode, n, os.path.join(d, "reg%d" % run))
                rows.append((mode, mb))
                print("run %d %-5s %d idle connections: %.1f MB" % (run + 1, mode, n, mb),
                      flush=True)
    for mode in ("tcp", "smclo"):
        vals = [mb for m, mb in rows if m == mode]
        print("%s: %s MB -> %.1f KB per connection (both ends)" % (
            mode, " / ".join("%.1f" % v for v in vals), max(vals) * 1024 / n))


if __name__ == "__main__":
    main()
