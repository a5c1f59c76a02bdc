"""Everything a socket does, checked on accelerated connections (the checks
live in sockcheck.py, which runs under smclo on both ends)."""
import os
import subprocess

import pytest

from conftest import PY, SMCLO, free_port, wait_port

CHECK = os.path.join(os.path.dirname(__file__), "sockcheck.py")


@pytest.mark.parametrize("server", ["server", "server-blocking"])
def test_socket_semantics(reg, procs, tmp_path, server):
    """A server waiting in select() takes connections over TCP; one whose
    threads block in accept() takes them without (src/handshake/direct.c)
    where both ends opt in (SMCLO_DIRECT=1)."""
    if server == "server-blocking":
        reg.env["SMCLO_DIRECT"] = "1"
    port = free_port()
    srv = procs.start([PY, CHECK, server, str(port)], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = reg.run([PY, CHECK, "client", str(port), str(tmp_path)], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    oks = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("ok ")]
    assert len(oks) == 16, r.stdout
    st = reg.stats()
    assert st["fallback"] == 0, st["fallback_by_reason"]
    assert st["accelerated_client"] >= 12 and st["accelerated_server"] >= 12, st
    if server == "server":
        assert st["direct_handshakes"] == 0, st
    else:
        assert st["direct_handshakes"] >= 10, st


KTLS_CLIENT = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"ECHO\n")
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # goes to the TCP socket: seen
for level, opt, val in ((socket.IPPROTO_TCP, 31, b"tls"), (282, 1, b"\0" * 40)):
    try:
        s.setsockopt(level, opt, val)
        sys.exit("setsockopt(%d, %d) succeeded" % (level, opt))
    except OSError:
        pass
s.sendall(b"x")
assert s.recv(1) == b"x"
s.close()
"""


def test_kernel_tls_never_reaches_the_tcp_socket(reg, procs, tmp_path):
    """TCP_ULP "tls" and SOL_TLS on an accelerated connection, on a kernel
    without TLS, never reach the TCP socket underneath, which carries none
    of the connection's bytes (strace): whether the kernel would take the
    protocol is asked of a scratch socket made for the question and closed
    after it (sockopt_ulp_probe), and SOL_TLS is refused above the ring."""
    port = free_port()
    srv = procs.start([PY, CHECK, "server", str(port)], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    trace = tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=socket,setsockopt,close", "-o",
                        str(trace), SMCLO, "run", "--", PY, "-c", KTLS_CLIENT, str(port)],
                       env=reg.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [l.split(None, 1)[1] for l in trace.read_text().splitlines() if " " in l]
    assert any("TCP_NODELAY" in c for c in calls), \
        "strace did not see the client's own option: %s" % calls[-20:]
    for i, call in enumerate(calls):
        if "TCP_ULP" in call or ", 31," in call:
            # socket(...) = N just before, setsockopt(N, ...), close(N) just after
            made = calls[i - 1] if i else ""
            fd = made.rsplit("= ", 1)[-1]
            assert made.startswith("socket(") and call.startswith("setsockopt(%s," % fd) \
                and i + 1 < len(calls) and calls[i + 1].startswith("close(%s)" % fd), calls[i - 1:i + 2]
        assert "SOL_TLS" not in call and ", 282," not in call, call
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 1)
    assert st["accelerated_client"] >= 1 and st["fallback"] == 0, st
