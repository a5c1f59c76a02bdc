"""Ring regions are reused between the same two processes (region.h), and a
reused region never mixes one connection's bytes into the next."""
import os

from conftest import PY, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def test_regions_reused_and_streams_intact(reg, procs):
    port = free_port()
    srv = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, PEER, "churn", "127.0.0.1", str(port), "120"], timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 120 and st["fallback"] == 0, st
    # one client process, one server process: a handful of regions serve all
    assert st["regions_created"] + st["regions_reused"] == 120, st
    assert st["regions_reused"] >= 100, st
    assert st["tx_bytes"] > 10_000_000, st     # the sizes above really went through


def test_server_closing_first_keeps_the_clients_region(reg, procs):
    """Connection per request, the server closing first (smclo bench's
    connection-setup row): the server keeps the client's region mapped and
    recognises it when the client offers it again, instead of mapping and
    unmapping it (and faulting its pages in) for every connection."""
    from conftest import SMCLO
    port = free_port()
    srv = procs.start([SMCLO, "__bench-worker", "server", str(port), "connect", "100", "0"],
                      env=reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = reg.run([SMCLO, "__bench-worker", "client", str(port), "connect", "100", "0.5"],
                timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("value"), r.stdout + r.stderr
    srv.wait(timeout=10)
    st = reg.stats()
    conns = st["accelerated_server"]
    assert conns >= 100 and st["fallback"] == 0, st
    assert st["peer_regions_mapped"] + st["peer_regions_kept"] == conns, st
    # the client keeps 8 idle regions of its own (KEEP_MINE); one still in
    # use when it connects again (the server's close not seen yet: a busy
    # machine) makes it a new one, and the server maps that once - a few
    # more, never one per connection (about 8000 in this half second).
    # 8 exactly failed here in 3 of 16 runs of the build before 2026-11-29
    assert st["peer_regions_mapped"] <= 16, st


# Sequential connections to an echo server, then a count of this process's
# TCP sockets (the hidden ones of closed connections, deferred.c), here and
# in a forked child.
DEFERRED_CLOSES = r"""
import os, socket, sys

def tcp_inodes():
    inodes = set()
    for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(name) as f:
            next(f)
            inodes.update(line.split()[9] for line in f)
    return inodes

def my_tcp_sockets():
    tcp, n = tcp_inodes(), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in tcp:
            n += 1
    return n

for _ in range(int(sys.argv[2])):
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    c.sendall(b"x" * 100)
    got = b""
    while len(got) < 100:
        got += c.recv(100)
    c.close()
print("parent", my_tcp_sockets(), flush=True)
pid = os.fork()
if pid == 0:
    print("child", my_tcp_sockets(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_hidden_tcp_closes_are_deferred_bounded_and_not_inherited(reg, procs):
    """Every connection here is closed; what TCP sockets the client still
    has are hidden ones whose close waits for its next spin (deferred.c):
    at least the last one, at most the 16 the queue holds.  A forked child
    closes its copies at once.  (Connections set up over TCP: the server
    takes none without, SMCLO_DIRECT=0, whose hidden sockets are not
    connected and so not in /proc/net/tcp.)"""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)],
                      env=dict(reg.env, SMCLO_DIRECT="0"))
    wait_port(port, proc=srv)
    # a busy machine (CI's sanitizer runs) may close at once what an idle
    # one defers: some run of eight must show a close put off (three were
    # not always enough beside the ASan build: [0, 0, 0] once in six runs)
    deferred = []
    for run in range(1, 9):
        r = reg.run([PY, "-c", DEFERRED_CLOSES, str(port), "40"], timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        counts = dict(line.split() for line in r.stdout.splitlines())
        # a connection a loaded machine left on TCP closes its socket at once
        st = reg.stats()
        assert st["accelerated_client"] == 40 * run, st
        assert int(counts["parent"]) <= 16, counts
        assert counts["child"] == "0", counts
        deferred.append(int(counts["parent"]))
        if deferred[-1] >= 1:
            break
    assert max(deferred) >= 1, deferred
