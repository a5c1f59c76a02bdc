"""Which handshake a connection gets (inbox.h): the one-message offer when a
single process accepts on the address, the rendezvous when several may (a
prefork server, SO_REUSEPORT siblings).  Either way every connection is
accelerated, none waits out a timeout, and every byte comes back."""
import os
import time

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


def test_single_process_server_takes_offers(reg, procs):
    """Four clients at once: offers reach the inbox in one order and their
    connections the accept queue in another; each finds its own."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    st = churn(reg, procs, port, 4, 25)
    assert st["accelerated_client"] == 100 and st["accelerated_server"] == 100, st
    assert st["fallback"] == 0, st
    assert st["inbox_handshakes"] == 100, st


def test_threads_accepting_together_find_their_offers(reg, procs):
    """Four threads in accept() on one listener: a thread may read another's
    offer from the inbox; it keeps it for the thread whose connection it is."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-threads", "127.0.0.1", str(port), "4"], env=reg.env)
    wait_port(port, proc=srv)
    st = churn(reg, procs, port, 4, 25)
    assert st["accelerated_client"] == 100 and st["fallback"] == 0, st
    assert st["inbox_handshakes"] == 100, st


def test_prefork_listener_uses_rendezvous(reg, procs):
    """The listener's children added entries of their own: no client offers
    to the parent, which never accepts."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-prefork", "127.0.0.1", str(port), "2"], env=reg.env)
    wait_port(port, proc=srv)
    st = churn(reg, procs, port, 2, 20)
    assert st["accelerated_client"] == 40 and st["fallback"] == 0, st
    assert st["inbox_handshakes"] == 0, st
    assert len(reg.entries("l")) == 3               # the parent's and each child's


def test_reuseport_siblings_use_rendezvous(reg, procs):
    port = free_port()
    for _ in range(2):
        srv = procs.start([PY, PEER, "echo-reuseport", "127.0.0.1", str(port)], env=reg.env)
        wait_port(port, proc=srv)
    st = churn(reg, procs, port, 2, 20)
    assert st["accelerated_client"] == 40 and st["fallback"] == 0, st
    assert st["inbox_handshakes"] == 0, st


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
