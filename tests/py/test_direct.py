"""Connections without TCP (src/handshake/direct.c, the direct handshake), an
opt-in (SMCLO_DIRECT=1 at both ends).  A server
whose process blocks in accept() takes an smclo client's connections
without a TCP connection once it has seen one smclo client: the client makes
no connect() system call at all, every byte arrives, and both ends name each
other by the addresses a TCP connection would have (test_semantics.py runs
every socket check against such a server).  A server that stops waiting in
accept() - it polls its listener - goes back to TCP without a client waiting
out a timeout, and a client whose offer is not taken in time connects over
TCP then and replays what it wrote."""
import os
import time

import pytest

from conftest import PY, free_port, need, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")

# Accepts @first connections blocking in accept(), then either sleeps
# argv[4] seconds and accepts argv[5] more after select() on the listener
# ("select"), or forks and from then on parent and child both accept,
# blocking ("fork").  Echoes each connection (one recv, one send).
SERVER = r"""
import os, select, socket, sys, time
port, first, then = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
print("ready", flush=True)

def serve(c):
    c.sendall(c.recv(100))
    c.close()

for _ in range(first):
    serve(s.accept()[0])
if then == "fork":
    os.fork()
    while True:
        serve(s.accept()[0])
time.sleep(float(sys.argv[4]))
for _ in range(int(sys.argv[5])):
    select.select([s], [], [])
    serve(s.accept()[0])
"""


@pytest.fixture(autouse=True)
def direct_on(request, reg):
    """The direct handshake is an opt-in: SMCLO_DIRECT=1 at both ends (the
    test of the default leaves it out)."""
    if request.node.name != "test_off_by_default":
        reg.env["SMCLO_DIRECT"] = "1"


def test_off_by_default(reg, procs):
    """Without the setting a server blocking in accept() takes every
    connection through its inbox, over TCP: every one can move to TCP and
    answers TCP's options as TCP does (docs/semantics.md §1)."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    short_clients(reg, port, 10)
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= 10)
    assert st["accelerated_client"] == 10 and st["fallback"] == 0, st
    assert st["direct_handshakes"] == 0 and st["inbox_handshakes"] == 10, st
    assert entry_direct_ids(reg, port) == [0], reg.entries("l")


def entry_direct_ids(reg, port):
    """The direct inbox each listener entry for @port names (0: none)."""
    return [int(name.split(".")[6], 16) for name in reg.entries("l")
            if int(name.split(".")[0]) == port]


def start_server(reg, procs, first, *then):
    port = free_port()
    srv = procs.start([PY, "-c", SERVER, str(port), str(first), *map(str, then)],
                      env=reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    return srv, port


def short_clients(reg, port, n, prefix=()):
    r = reg.run([*prefix, PY, PEER, "short", "127.0.0.1", str(port), str(n)], timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr


def test_no_tcp_connection_after_the_first(reg, procs, tmp_path):
    need("strace")
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    trace = tmp_path / "client.strace"
    short_clients(reg, port, 30, ("strace", "-f", "-qq", "-o", str(trace), "-e",
                                  "trace=connect,bind"))
    lines = open(trace).read().splitlines()
    to_port = [l for l in lines if "connect(" in l and "htons(%d)" % port in l]
    binds = [l for l in lines if "bind(" in l and "AF_INET" in l]
    # the first is an inbox handshake over TCP; the server then goes direct
    assert len(to_port) == 1, "\n".join(lines)
    assert len(binds) == 29, "\n".join(lines)  # each direct one has an address of its own
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= 30)
    assert st["accelerated_client"] == 30 and st["fallback"] == 0, st
    assert st["direct_handshakes"] == 29 and st["inbox_handshakes"] == 30, st
    assert entry_direct_ids(reg, port)[0] != 0


def test_offer_not_taken_in_time_goes_over_tcp(reg, procs):
    """The server takes one connection, then sleeps past the client's
    handshake timeout (300 ms) before it accepts again: the waiting client
    withdraws its offer, connects over TCP and replays its request."""
    srv, port = start_server(reg, procs, 1, "select", 1.5, 1)
    short_clients(reg, port, 2)
    st = reg.wait_stats(lambda s: s["fallback"] >= 2)
    assert st["accelerated_client"] == 1 and st["fallback_by_reason"]["timeout"] == 1, st
    # the server read the withdrawn offer, then accepted the TCP connection
    assert st["direct_handshakes"] == 0 and st["accelerated_server"] == 1, st
    assert srv.wait(timeout=10) == 0


def test_listener_polled_goes_back_to_tcp(reg, procs):
    """After five connections in accept() the server waits in select(): its
    entry names no direct inbox any more, and no client waits out a timeout
    - an offer already queued is declined (direct-ended) and its client
    connects over TCP at once."""
    srv, port = start_server(reg, procs, 5, "select", 0, 15)
    short_clients(reg, port, 20)
    assert srv.wait(timeout=30) == 0
    st = reg.wait_stats(lambda s: s["accelerated_client"] + s["fallback"] >= 20)
    assert st["fallback_by_reason"].get("timeout", 0) == 0, st
    assert 3 <= st["direct_handshakes"] <= 5, st
    assert st["accelerated_client"] + st["fallback_by_reason"].get("direct-ended", 0) == 20, st
    assert entry_direct_ids(reg, port) == [], reg.entries("l")   # the server is gone


def test_listener_polled_names_no_direct_inbox(reg, procs):
    srv, port = start_server(reg, procs, 3, "select", 0, 100)
    short_clients(reg, port, 3)
    short_clients(reg, port, 1)         # the server now waits in select()
    assert entry_direct_ids(reg, port) == [0], reg.entries("l")
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 4)
    assert st["accelerated_client"] == 4 and st["direct_handshakes"] == 2, st


def test_forked_listener_shares_the_port(reg, procs):
    """A direct listener's process forks and both accept: the child's own
    entry makes the listener shared, so clients use the rendezvous; none
    waits out a timeout, and offers still going to the parent are taken."""
    srv, port = start_server(reg, procs, 3, "fork")
    short_clients(reg, port, 3)                 # the third is direct; then the fork
    deadline = time.monotonic() + 10
    while len(entry_direct_ids(reg, port)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    short_clients(reg, port, 30)
    st = reg.wait_stats(lambda s: s["accelerated_client"] + s["fallback"] >= 33)
    assert st["accelerated_client"] == 33 and st["fallback"] == 0, st
    assert sorted(entry_direct_ids(reg, port))[0] == 0, reg.entries("l")  # the child's
