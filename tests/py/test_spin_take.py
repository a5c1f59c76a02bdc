"""A writer skips the doorbell only when a spinning reader's read takes every
unread byte (rx.c, rx_spin), so readiness stays exact after the read: readable
when bytes are left over, not readable when none are."""
from conftest import PY, free_port

WRITER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
for _ in range(200):
    c.recv(1)                    # the reader is about to block (and spin) in recv
    c.sendall(b"w" * 100)
c.recv(1)
"""

READER = r"""
import select, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
bad = 0
for i in range(200):
    size = 10 if i % 2 else 1000         # partial read, or one that takes it all
    c.sendall(b"g")
    got = c.recv(size)
    left = 100 - len(got)
    while left and size == 10:
        readable = select.select([c], [], [], 2)[0]
        if not readable:
            bad += 1                     # bytes left, descriptor not readable
            break
        left -= len(c.recv(left))
    if select.select([c], [], [], 0)[0]:
        bad += 1                         # nothing left, descriptor readable
print("bad", bad, flush=True)
c.sendall(b"e")
"""


def test_readiness_exact_around_skipped_doorbells(reg, procs):
    port = free_port()
    srv = procs.start([PY, "-c", WRITER, str(port)], env=reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = reg.run([PY, "-c", READER, str(port)], timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    assert reg.stats()["accelerated_client"] == 1
