"""A client's connection is pending from connect() until the server decides
its inbox offer (handshake.c): small writes wait in the ring, and the first
call that needs the decision takes it.  Whatever that call is, the bytes
arrive in order and the connection is accelerated."""
import os

import pytest

from conftest import PY, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")

CLIENT = r"""
import os, select, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"a" * 10)                     # undecided yet: into the ring
how = sys.argv[2]
if how == "fork":
    pid = os.fork()
    if pid == 0:
        c.sendall(b"b" * 10)
        os._exit(0)
    os.waitpid(pid, 0)
elif how == "dup":
    d = socket.socket(fileno=os.dup(c.fileno()))
    d.sendall(b"b" * 10)
    d.detach()
elif how == "epoll":
    ep = select.epoll()
    ep.register(c.fileno(), select.EPOLLIN)
    c.sendall(b"b" * 10)
    assert ep.poll(10)                    # the echo of what came before
elif how == "poll":
    p = select.poll()
    p.register(c.fileno(), select.POLLIN)
    c.sendall(b"b" * 10)
    assert p.poll(10000)
else:
    c.sendall(b"b" * 10)
c.shutdown(socket.SHUT_WR)
got = b""
while (d := c.recv(100)):
    got += d
print(got.decode(), flush=True)
"""


@pytest.mark.parametrize("how", ["write", "fork", "dup", "epoll", "poll"])
def test_bytes_written_while_undecided(reg, procs, how):
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), how], capture_output=True, text=True,
                timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "a" * 10 + "b" * 10, r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 1 and st["inbox_handshakes"] == 1, st
    assert st["fallback"] == 0, st
