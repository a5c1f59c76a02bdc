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
