"""Everything a socket does, checked on accelerated connections (the checks
live in sockcheck.py, which runs under smclo on both ends)."""
import os

import pytest

from conftest import PY, free_port, wait_port

CHECK = os.path.join(os.path.dirname(__file__), "sockcheck.py")


@pytest.mark.parametrize("server", ["server", "server-blocking"])
def test_socket_semantics(reg, procs, tmp_path, server):
    """A server waiting in select() takes connections over TCP; one whose
    threads block in accept() takes them without (src/handshake/direct.c)."""
    port = free_port()
    srv = procs.start([PY, CHECK, server, str(port)], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = reg.run([PY, CHECK, "client", str(port), str(tmp_path)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    oks = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("ok ")]
    assert len(oks) == 15, r.stdout
    st = reg.stats()
    assert st["fallback"] == 0, st["fallback_by_reason"]
    assert st["accelerated_client"] >= 12 and st["accelerated_server"] >= 12, st
    if server == "server":
        assert st["direct_handshakes"] == 0, st
    else:
        assert st["direct_handshakes"] >= 10, st
