#!/usr/bin/env python3
"""Memory of 1000 idle connections, TCP loopback against smclo.

A server and a client process (both under `smclo run` for the smclo column)
open N connections, exchange 100 bytes on each (so every connection is
decided and has touched its rings), then hold them.  The cost is what the
two processes' own accounting grows by between before the first connection
and while both hold them all: their proportional set size (PSS, from
/proc/PID/smaps_rollup) without its shared-memory part, plus every
shared-memory object either maps or holds (ring regions, connection state,
registry files), counted once by inode at the size the kernel allocated
for it (st_blocks: pages written but unmapped count too).  The kernel's
socket objects (TCP's two sockets a connection; smclo's hidden TCP sockets
and doorbell pairs) are in neither column.  The drop of MemAvailable, which
swings by tens of MB between runs on a small VM, is printed beside it only
as a cross-check.  Part of `make bench`; run alone as
`python3 bench/idle_memory.py [N]`.
"""
import os
import resource
import stat
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
    print("start", flush=True)
    sys.stdin.readline()            # once the footprint before is taken
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


def smaps_kb(pid, field):
    for line in open("/proc/%d/smaps_rollup" % pid):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def shm_objects(pid, seen):
    """Shared-memory files @pid maps or holds open, into @seen: (dev, inode) ->
    bytes the kernel allocated for it."""
    shm_dev = os.stat("/dev/shm").st_dev if os.path.isdir("/dev/shm") else None
    for d in ("map_files", "fd"):
        base = "/proc/%d/%s" % (pid, d)
        try:
            names = os.listdir(base)
        except PermissionError:
            sys.exit("bench/idle_memory.py: reading %s needs root (CAP_SYS_ADMIN for "
                     "map_files): the shared memory would go uncounted" % base)
        for name in names:
            try:
                link = os.readlink(os.path.join(base, name))
                st = os.stat(os.path.join(base, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (link.startswith("/memfd:") or st.st_dev == shm_dev):
                seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512


def footprint_kb(pids):
    """PSS without shared memory, of every process, plus each shared-memory
    object once (see the top of this file)."""
    seen = {}
    private = 0
    for pid in pids:
        private += smaps_kb(pid, "Pss") - smaps_kb(pid, "Pss_Shmem")
        shm_objects(pid, seen)
    return private + sum(seen.values()) // 1024


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


def measure(mode, n, registry):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, SMCLO_DIR=registry)
    wrap = [SMCLO, "run", "--"] if mode == "smclo" else []
    procs = []
    try:
        for role in ("server", "client"):
            p = subprocess.Popen(wrap + [sys.executable, "-c", PEER, role, str(port), str(n)],
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, preexec_fn=raise_nofile)
            procs.append(p)
            want = "ready" if role == "server" else "start"
            assert p.stdout.readline().strip() == want, (mode, role)
        pids = [p.pid for p in procs]
        before, avail = footprint_kb(pids), mem_available_kb()
        procs[1].stdin.write("go\n")
        procs[1].stdin.flush()
        for p in procs:
            assert p.stdout.readline().strip() == "holding", mode
        time.sleep(0.5)
        used = footprint_kb(pids) - before
        dropped = avail - mem_available_kb()
        if mode == "smclo":
            out = subprocess.run([SMCLO, "stat", "--json"], env=env, capture_output=True,
                                 text=True, check=True).stdout
            shm = out.count('"mode": "shm"')
            assert shm == 2 * n, "only %d of %d ends accelerated" % (shm, 2 * n)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return used / 1024.0, dropped / 1024.0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rows = []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        for run in range(2):
            for mode in ("tcp", "smclo"):
                mb, dropped = measure(mode, n, os.path.join(d, "reg%d" % run))
                rows.append((mode, mb))
                print("run %d %-5s %d idle connections: %.1f MB (MemAvailable fell %.1f MB)"
                      % (run + 1, mode, n, mb, dropped), flush=True)
    for mode in ("tcp", "smclo"):
        vals = [mb for m, mb in rows if m == mode]
        print("%s: %s MB -> %.1f KB per connection (both ends)" % (
            mode, " / ".join("%.1f" % v for v in vals), max(vals) * 1024 / n))


if __name__ == "__main__":
    main()
