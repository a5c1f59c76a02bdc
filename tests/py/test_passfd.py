"""An accepted connection passed to another process with SCM_RIGHTS (a
dispatcher handing connections to workers).

The connection's state travels in the same message, after the
application's descriptors, and its record in a parcel in the registry
(passfd.c); the receiver's smclo takes it over, hands the application only
its own descriptors, and goes on accelerated, byte for byte, whether the
sender closes its copy at once or keeps it (test_matrix's client-fdpass
row: a sender that exits right after sendmsg).  A receiver without
smclo gets the TCP socket, the connection moved there and what the ring
held sent again by the peer, instead of a doorbell socket it would
misread as end of file (it used to get EPIPE, ECONNRESET or a silent EOF).
"""
import os
import subprocess

import pytest

from conftest import PY, SMCLO, free_port, wait_port

# The dispatcher accepts and passes each connection over a unix socket to
# the worker (a forked child, or a program of its own started with or
# without smclo); the worker forks an echo per connection.  With "keep" the
# dispatcher holds its copy for the rest of its life, so the echo cannot
# end on EOF: each round is a fixed size, read back exactly.
DISPATCHER = r"""
import os, select, socket, sys, subprocess
port, keep, worker = int(sys.argv[1]), sys.argv[2] == "keep", sys.argv[3]
wait = os.environ.get("DISPATCH_AFTER_DATA")  # pass it once the client's bytes are there
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
if worker == "forked":
    if os.fork() == 0:
        a.close()
        os.dup2(b.fileno(), 0)
        os.execv(sys.executable, [sys.executable, "-c", sys.argv[4]])
else:
    env = dict(os.environ)
    if worker == "plain":
        env.pop("LD_PRELOAD", None)
    cmd = [sys.executable, "-c", sys.argv[4]]
    if worker == "nobody":
        cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
               "/usr/bin/python3", "-c", sys.argv[4]]
    subprocess.Popen(cmd, stdin=b, env=env)
b.close()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(64)
print("ready", flush=True)
held = []
while True:
    c, _ = l.accept()
    if os.environ.get("DISPATCH_GREETS"):
        c.sendall(b"hi\n")      # left in the ring for the client when it is passed
    if wait:
        select.select([c], [], [], 10)
    socket.send_fds(a, [b"c"], [c.fileno()])
    if keep:
        held.append(c)
    else:
        c.close()
"""

WORKER = r"""
import os, signal, socket, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
u = socket.socket(fileno=0)
while True:
    msg, fds, _, _ = socket.recv_fds(u, 10, 1)
    if not fds:
        os._exit(0)
    c = socket.socket(fileno=fds[0])
    if os.fork() == 0:
        try:
            if os.environ.get("WORKER_GREETS"):
                c.sendall(b"hello\n")
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
        except OSError:
            pass
        os._exit(0)
    c.close()
"""

CLIENT = r"""
import os, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(10)
    data = os.urandom([1, 100, 4096, 70000, 300000][i % 5])
    try:
        c.sendall(data)
        got = b""
        while len(got) < len(data):
            d = c.recv(len(data) - len(got))
            if not d:
                break
            got += d
        print("match" if got == data else "short")
    except OSError as e:
        print("reset" if isinstance(e, (ConnectionResetError, BrokenPipeError)) else repr(e))
    c.close()
"""


@pytest.mark.parametrize("worker", ["forked", "spawned"])
@pytest.mark.parametrize("copy", ["close", "keep"])
def test_passed_connection_goes_on_accelerated(reg, procs, worker, copy):
    port = free_port()
    srv = procs.start([PY, "-c", DISPATCHER, str(port), copy, worker, WORKER], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), "20"], timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["match"] * 20, r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 20, st
    assert sum(st["fallback_by_reason"].values()) == 0, st


# Each connection: 1 B to 300 KB, echoed.  "greeted": the worker's
# greeting read first; "greeting-late": the dispatcher's greeting, read
# with the echo.
HANDED_CLIENT = r"""
import os, socket, sys
port, n, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def read(c, n):
    got = b""
    while len(got) < n:
        d = c.recv(n - len(got))
        if not d:
            break
        got += d
    return got

for i in range(n):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(10)
    data = os.urandom([1, 100, 4096, 70000, 300000][i % 5])
    if how == "greeted" and read(c, 6) != b"hello\n":
        print("no greeting")
        continue
    want = b"hi\n" + data if how == "greeting-late" else data
    c.sendall(data)
    print("match" if read(c, len(want)) == want else "short")
    c.close()
"""


def assert_handed_on(reg, procs, worker, how, **env):
    """5 connections passed to @worker, the client as @how says: each echoed
    byte exact over TCP, counted as moved (handed-on at the dispatcher,
    peer-moved at the client), none fell back."""
    port = free_port()
    srv = procs.start([PY, "-c", DISPATCHER, str(port), "close", worker, WORKER],
                      dict(reg.env, **env))
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", HANDED_CLIENT, str(port), "5", how], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["match"] * 5, r.stdout
    st = reg.stats()
    assert st["accelerated_client"] == 5, st
    assert sum(st["fallback_by_reason"].values()) == 0, st
    assert st["moved_by_reason"]["handed-on"] == 5, st
    assert st["moved_by_reason"]["peer-moved"] == 5, st


@pytest.mark.parametrize("worker", ["plain", "nobody"])
def test_receiver_that_cannot_take_it_gets_the_bytes_again(reg, procs, worker):
    """A worker without smclo, or of another user (nobody; it runs smclo
    too, but a parcel's state chunk would give it the cursors and locks of
    up to 256 other connections of the dispatcher's: docs/security.md),
    passed the connection once the client's bytes are in the ring: it gets
    the TCP socket, and the client, woken by the move, sends them again
    there (core/move.c, "sent again"): byte exact (it was a reset)."""
    assert_handed_on(reg, procs, worker, "plain", DISPATCH_AFTER_DATA="1")


@pytest.mark.parametrize("worker", ["plain", "nobody"])
def test_receiver_that_cannot_take_it_gets_the_tcp_socket(reg, procs, worker):
    """The same workers, greeting first: when the connection is passed the
    ring holds nothing of the client's, and nothing needs sending again."""
    assert_handed_on(reg, procs, worker, "greeted", WORKER_GREETS="1")


def test_passed_with_bytes_both_ways_in_the_rings(reg, procs):
    """The dispatcher greets (its bytes wait in its ring for the client)
    and passes the connection once the client's bytes wait in the other: the
    worker without smclo gets the TCP socket, the client reads the greeting
    from the ring, then the echo of its bytes, sent again over TCP."""
    assert_handed_on(reg, procs, "plain", "greeting-late", DISPATCH_AFTER_DATA="1",
                     DISPATCH_GREETS="1")
