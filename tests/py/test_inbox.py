"""Which handshake a connection gets (inbox.h): the one-message offer when a
single process accepts on the address, the rendezvous when several may (a
prefork server, SO_REUSEPORT siblings).  Either way every connection is
accelerated, none waits out a timeout, and every byte comes back."""
import os
import time

import pytest

from conftest import PY, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def churn(reg, procs, port, clients, each):
    """@clients processes at once, @each connections apiece."""
    ps = [procs.start([PY, PEER, "churn", "127.0.0.1", str(port), str(each)], env=reg.env,
                      text=True) for _ in range(clients)]
    for p in ps:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0 and out.split() == ["bad", "0"], out
    return reg.stats()


SERVERS = {
    # role and argument, server processes, clients at once, connections each
    "one thread": (["echo-many"], 1, 4, 25),
    "four threads accepting": (["echo-threads", "4"], 1, 4, 25),
    "prefork, two children": (["echo-prefork", "2"], 1, 2, 20),
    "two SO_REUSEPORT siblings": (["echo-reuseport"], 2, 2, 20),
}


@pytest.mark.parametrize("shape", SERVERS)
def test_handshake_follows_the_acceptors(reg, procs, shape):
    """One process accepting (one thread or several, where a thread may read
    another's offer and keeps it for that thread): every connection is an
    inbox handshake.  Several processes (a prefork server, whose children add
    entries of their own; SO_REUSEPORT siblings): every connection uses the
    rendezvous.  Never a fallback, never a timeout."""
    role, nserv, clients, each = SERVERS[shape]
    entries = 3 if role[0] == "echo-prefork" else nserv
    port = free_port()
    for _ in range(nserv):
        srv = procs.start([PY, PEER, role[0], "127.0.0.1", str(port)] + role[1:], env=reg.env)
        wait_port(port, proc=srv)
    # the port listens once the first server does: wait for every entry
    deadline = time.monotonic() + 10
    while len(reg.entries("l")) < entries and time.monotonic() < deadline:
        time.sleep(0.02)
    st = churn(reg, procs, port, clients, each)
    n = clients * each
    assert st["accelerated_client"] == n and st["accelerated_server"] == n, st
    assert st["fallback"] == 0, st
    assert st["inbox_handshakes"] == (n if nserv == 1 and role[0] != "echo-prefork" else 0), st
    assert len(reg.entries("l")) == entries         # prefork: the parent's and each child's


TWO_PORTS = r"""
import os, sys, time
sys.path.insert(0, sys.argv[4])
from peer import echo, listen
a, b = listen("127.0.0.1", int(sys.argv[1])), listen("127.0.0.1", int(sys.argv[2]))
while not os.path.exists(sys.argv[3]):
    time.sleep(0.01)
second, first = b.accept()[0], a.accept()[0]     # the later offer's connection first
echo(second)
echo(first)
"""


def test_offer_read_early_waits_for_its_connection(reg, procs, tmp_path):
    """One process listening on two ports has one inbox.  Accepting the
    second client's connection first reads the first client's offer too; it
    is kept, and taken when that connection is accepted."""
    p1, p2, gate = free_port(), free_port(), tmp_path / "gate"
    srv = procs.start([PY, "-c", TWO_PORTS, str(p1), str(p2), str(gate),
                       os.path.dirname(PEER)], env=reg.env)
    wait_port(p1, proc=srv)
    wait_port(p2, proc=srv)
    env = dict(reg.env, SMCLO_HANDSHAKE_MS="10000")
    c1 = procs.start([PY, PEER, "send", "127.0.0.1", str(p1), "100000"], env=env, text=True)
    time.sleep(0.3)                                  # its offer is in the inbox first
    c2 = procs.start([PY, PEER, "send", "127.0.0.1", str(p2), "100000"], env=env, text=True)
    time.sleep(0.3)
    gate.touch()
    for c in (c1, c2):
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0 and out.strip() == "match", out
    st = reg.stats()
    assert st["inbox_handshakes"] == 2 and st["fallback"] == 0, st
