"""Stream integrity: many connections, random sizes and split points,
blocking and non-blocking, epoll LT/ET/oneshot, half-close, several threads,
fork-then-use.  Zero mismatches, and every connection accelerated."""
import pytest

from conftest import TESTBIN, free_port, wait_port

THREADS, CONNS = 4, 12


@pytest.mark.parametrize("mode", ["lt", "et", "oneshot"])
def test_stream_integrity(reg, procs, mode):
    port = free_port()
    srv = procs.start([str(TESTBIN / "stress"), "server", str(port), mode], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([str(TESTBIN / "stress"), "client", str(port), str(THREADS), str(CONNS), "42"],
                timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "conns=%d mismatches=0" % (THREADS * CONNS) in r.stdout, r.stdout
    st = reg.stats()
    assert st["fallback"] == 0, st["fallback_by_reason"]
    assert st["accelerated_client"] == THREADS * CONNS
    assert st["accelerated_server"] == THREADS * CONNS
