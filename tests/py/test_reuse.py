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


# Rounds of 20 connections open at once, each closed by the client first,
# the server closing its side only at the client's end of stream - as
# apache2's lingering close does - then the next round straight away.
ROUNDS = r"""
import socket, sys
port, rounds = int(sys.argv[1]), int(sys.argv[2])
for _ in range(rounds):
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    for c in conns:
        c.sendall(b"x" * 100)
    for c in conns:
        got = b""
        while len(got) < 100:
            got += c.recv(100)
        assert got == b"x" * 100
        c.close()
print("ok")
"""


def test_regions_of_a_server_closing_last_are_kept_for_the_next_round(reg, procs):
    """A region is reusable only once the server has closed its side.  A
    client whose connections come in rounds of 20, faster than the server
    closes, must still find regions of the round before last and not make
    new ones (with 8 kept it made about one per connection: it dropped
    those the server was about to close), and the server keeps the few in
    circulation mapped instead of mapping and unmapping."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", ROUNDS, str(port), "15"], timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 300 and st["fallback"] == 0, st
    assert st["regions_created"] + st["regions_reused"] == 300, st
    # about 20 (the first round; 188 with 8 kept): never one per connection
    assert st["regions_created"] <= 60, st
    assert st["peer_regions_mapped"] <= 60, st
