"""Which handshake a connection gets (inbox.h): the one-message offer when a
single process accepts on the address, the rendezvous when several may (a
prefork server, SO_REUSEPORT siblings).  Either way every connection is
accelerated, none waits out a timeout, and every byte comes back."""
import os

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
