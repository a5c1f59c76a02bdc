"""Urgent data (MSG_OOB), with the kernel's TCP as the oracle: the same
exchange runs once on plain TCP and once with both ends under smclo, and
the server's trace - readiness masks, SIOCATMARK, what each receive
returns, errors - must be the same.  Under smclo urgent data is TCP's own:
sending it moves the connection to its TCP socket after every byte the
ring holds (docs/design.md §5b), counted `urgent-data`.

The client writes in-band bytes, one urgent byte, more in-band bytes, and
shuts down; only then (a barrier through the harness) does the server look.
"""
import subprocess

import pytest

from conftest import PY, SMCLO, free_port, wait_port

SERVER = r"""
import fcntl, select, socket, struct, sys
SIOCATMARK = 0x8905
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(4)
print("ready", flush=True)
c, _ = l.accept()
sys.stdin.readline()                    # the client has sent everything
out = []
def mark():
    return struct.unpack("i", fcntl.ioctl(c.fileno(), SIOCATMARK, b"\0" * 4))[0]
p = select.poll(); p.register(c.fileno(), select.POLLIN | select.POLLPRI)
out.append(("poll", sorted(m for m in ("POLLIN", "POLLPRI") for fd, ev in p.poll(5000)
                           if ev & getattr(select, m))))
out.append(("atmark", mark()))
out.append(("inband", c.recv(100)))
out.append(("atmark", mark()))
out.append(("oob", c.recv(1, socket.MSG_OOB)))
try:
    c.recv(1, socket.MSG_OOB)
    out.append(("oob-again", "ok"))
except OSError as e:
    out.append(("oob-again", e.errno))
rest = b""
while True:
    d = c.recv(100)
    if not d:
        break
    rest += d
out.append(("rest", rest))
print(repr(out), flush=True)
"""

CLIENT = r"""
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"abc")
c.send(b"!", socket.MSG_OOB)
c.sendall(b"def")
c.shutdown(socket.SHUT_WR)
print("sent", flush=True)
c.recv(1)
"""


def exchange(env, smclo):
    pre = [SMCLO, "run", "--"] if smclo else []
    port = free_port()
    srv = subprocess.Popen(pre + [PY, "-c", SERVER, str(port)], env=env, text=True,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert srv.stdout.readline().strip() == "ready"
        wait_port(port, proc=srv)
        cli = subprocess.Popen(pre + [PY, "-c", CLIENT, str(port)], env=env, text=True,
                               stdout=subprocess.PIPE)
        assert cli.stdout.readline().strip() == "sent"
        srv.stdin.write("go\n")
        srv.stdin.flush()
        trace = srv.stdout.readline().strip()
        assert srv.wait(timeout=30) == 0
        cli.wait(timeout=30)
        return trace
    finally:
        for p in (srv,):
            if p.poll() is None:
                p.kill()


def test_urgent_data_as_tcp(reg):
    tcp = exchange(reg.env, smclo=False)
    assert "b'!'" in tcp, tcp                   # the oracle itself is sound
    under = exchange(reg.env, smclo=True)
    assert under == tcp
    st = reg.wait_stats(lambda s: s["moved_by_reason"]["peer-moved"] >= 1)
    assert st["accelerated_client"] == 1 and st["accelerated_server"] == 1, st
    assert st["moved_by_reason"]["urgent-data"] == 1, st["moved_by_reason"]
    assert st["moved_by_reason"]["peer-moved"] == 1, st["moved_by_reason"]
