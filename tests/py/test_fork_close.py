"""A server that accepts, forks, and closes its copy in the parent at once
(socat fork, Python's ForkingTCPServer, PostgreSQL, inetd): the child goes
on with the connection, on every handshake path.

The child is a holder of the connection from the moment it exists: it is
counted in the parent before fork() (counted in the child, the parent's
close could come first, find itself the last holder, and close the
connection under the child: EPIPE/ECONNRESET, or wrong bytes of the right
length once the client reused the region).
"""
import os

import pytest

from conftest import PY, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")

FORKING_SERVER = r"""
import os, signal, socket, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(64)
print("ready", flush=True)
while True:
    c, _ = l.accept()
    if os.fork() == 0:
        l.close()
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        os._exit(0)
    c.close()
"""

PATHS = {
    "direct": {"SMCLO_DIRECT": "1"},       # an opt-in (docs/design.md §2d)
    "inbox": {},
    "rendezvous": {"SMCLO_INBOX": "0"},
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_parent_closes_after_fork(reg, procs, path):
    env = dict(reg.env, **PATHS[path])
    port = free_port()
    srv = procs.start([PY, "-c", FORKING_SERVER, str(port)], env)
    wait_port(port, proc=srv)
    r = reg.run([PY, PEER, "churn", "127.0.0.1", str(port), "20"], env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 20, st
    assert sum(st["fallback_by_reason"].values()) == 0, st
    if path == "direct":        # every one after the first
        assert st["direct_handshakes"] >= 19, st
    else:
        assert st["direct_handshakes"] == 0, st
