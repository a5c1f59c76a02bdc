"""Failure injection in the handshake: a system call smclo needs fails, in
the client or in the server, and the connection falls back to TCP with a
named reason, byte for byte, without waiting for a timeout; every lock taken
on the way is given back (the next connections go through too).

tests/progs/failsys runs a program under a seccomp filter that makes the
named system calls fail (ENOMEM for memory, EMFILE for descriptors), so the
failures happen where they would in the field, in the real library.
"""
import errno
import os

import pytest

from conftest import PY, TESTBIN, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
FAILSYS = str(TESTBIN / "failsys")

# Where the failure leaves the other end waiting for a message that never
# comes, it waits at most the handshake timeout and says so ("timeout"):
# bounded, and lossless.  Everywhere else nobody waits.
CASES = [
    ("client", errno.ENOMEM, "memfd_create"),
    ("server", errno.ENOMEM, "memfd_create"),
    ("client", errno.EMFILE, "socketpair"),
    ("server", errno.EMFILE, "socketpair"),
    ("client", errno.EMFILE, "socket_unix"),
    ("server", errno.EMFILE, "socket_unix"),
    ("client", errno.EMFILE, "sendmsg"),
    ("server", errno.EMFILE, "sendmsg"),
    ("client", errno.EMFILE, "recvmsg"),
    ("server", errno.EMFILE, "recvmsg"),       # offers unread: their clients time out
    ("server", errno.EMFILE, "dup3"),
]
MAY_TIME_OUT = {("server", "recvmsg")}


def failing(side, which, err, calls, cmd):
    return [FAILSYS, str(err), calls, "--"] + cmd if side == which else cmd


@pytest.mark.parametrize("side,err,calls", CASES,
                         ids=["%s-%s-%s" % (s, errno.errorcode[e], c) for s, e, c in CASES])
def test_handshake_failure_falls_back(reg, procs, side, err, calls):
    port = free_port()
    srv = procs.start(failing(side, "server", err, calls,
                              [PY, PEER, "echo-many", "127.0.0.1", str(port)]), reg.env)
    wait_port(port, proc=srv)
    r = reg.run(failing(side, "client", err, calls,
                        [PY, PEER, "churn", "127.0.0.1", str(port), "10"]), timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    assert srv.poll() is None, "the server died"
    st = reg.stats()
    fallbacks = {k: v for k, v in st["fallback_by_reason"].items() if v}
    # every client end is accounted for: accelerated, or on TCP with a reason
    assert st["accelerated_client"] + sum(fallbacks.values()) >= 10, st
    if (side, calls) not in MAY_TIME_OUT:
        assert "timeout" not in fallbacks, fallbacks


def test_max_conns_reached(reg, procs):
    """SMCLO_MAX_CONNS=2 in the client: two connections held open are
    accelerated, the next ones go over TCP as max-buffers, and once the
    first two close, acceleration comes back."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    script = r"""
import socket, sys
from peer import connect, exchange
port = int(sys.argv[1])
held = [connect("127.0.0.1", port) for _ in range(2)]
for c in held:
    c.sendall(b"held"); assert c.recv(4) == b"held"
bad = sum(exchange(connect("127.0.0.1", port), b"x" * 5000) != b"x" * 5000 for _ in range(5))
for c in held:
    c.close()
bad += sum(exchange(connect("127.0.0.1", port), b"y" * 5000) != b"y" * 5000 for _ in range(3))
print("bad", bad)
"""
    env = dict(reg.env, SMCLO_MAX_CONNS="2", PYTHONPATH=os.path.dirname(PEER))
    r = reg.run([PY, "-c", script, str(port)], env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.stats()
    assert st["fallback_by_reason"]["max-buffers"] == 5, st
    assert st["accelerated_client"] == 5, st
