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
    assert st["peer_regions_mapped"] <= 8, st
