"""io_uring and accelerated connections (docs/design.md §5b, "io_uring").

A process whose io_uring instances are made through liburing is served: its
submissions are looked at before the kernel reads them.  One that uses
io_uring for files only (MariaDB's InnoDB) stays accelerated; one that uses
it on a connection moves that connection to TCP first (reason io-uring),
and the bytes the peer had put in the ring come first, answered from it.
An io_uring made without liburing cannot be watched: that process declines
(io-uring), as both ends say.  tests/progs/iouring_peer.c is the server.
"""
import hashlib
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import PY, TESTBIN, free_port, wait_port

PEER = TESTBIN / "iouring_peer"

CLIENT = r"""
import hashlib, os, socket, sys, threading
port, greeting = int(sys.argv[1]), sys.argv[2] == "1"
data = os.urandom(3 << 20)
s = socket.create_connection(("127.0.0.1", port))
if greeting:
    assert s.recv(3) == b"hi\n"
def send():
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
got = bytearray()
while True:
    d = s.recv(1 << 16)
    if not d:
        break
    got += d
t.join()
print("match" if bytes(got) == data else "differ %d of %d" % (len(got), len(data)))
"""


def echo_round(reg, procs, mode):
    assert PEER.exists(), "iouring_peer not built: liburing-dev missing"
    port = free_port()
    srv = procs.start([str(PEER), str(port), mode], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), "1" if mode == "fixed" else "0"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "match", r.stdout + r.stderr
    assert srv.wait(timeout=10) == 0, "the server saw a call fail"
    return reg.stats()


def test_files_only_is_accelerated(reg, procs):
    st = echo_round(reg, procs, "files")
    assert st["accelerated"] == 2 and st["fallback"] == 0, st
    assert sum(st["moved_by_reason"].values()) == 0, st["moved_by_reason"]


@pytest.mark.parametrize("mode", ["socket", "poll", "fixed"])
def test_socket_through_io_uring_moves_first(reg, procs, mode):
    """The server reads the socket through io_uring: the connection goes to
    TCP before the kernel sees the submission, with the ring's bytes first
    (socket, poll: 3 MiB sent before the server's first submission)."""
    st = echo_round(reg, procs, mode)
    assert st["accelerated"] == 2, st
    assert st["moved_by_reason"]["io-uring"] == 1, st["moved_by_reason"]
    assert st["moved_by_reason"]["peer-moved"] == 1, st["moved_by_reason"]


SEND_SHUT = r"""
import hashlib, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
data = bytes((i * 7 + 3) & 255 for i in range(n))
s = socket.create_connection(("127.0.0.1", port))
s.sendall(data)
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    got += d
print(len(got), hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest())
"""


def completions(reg, procs, mode, nbytes, smclo):
    port = free_port()
    srv = procs.start([str(PEER), str(port), mode], reg.env, smclo=smclo, text=True)
    wait_port(port, proc=srv)
    cmd = [PY, "-c", SEND_SHUT, str(port), str(nbytes)]
    r = reg.run(cmd, timeout=60) if smclo else subprocess.run(cmd, capture_output=True,
                                                               text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out, _ = srv.communicate(timeout=20)
    return out.splitlines()[1:], r.stdout.split()     # after "ready"


@pytest.mark.parametrize("mode,nbytes", [("chain", 1500), ("sendclose", 100000)])
def test_completions_as_the_kernels(reg, procs, mode, nbytes):
    """What each completion says, as on plain TCP: a read answered from the
    ring that comes up short fails its link (the write behind it cancelled);
    a send and a close of the connection in one batch run in order."""
    kernel = completions(reg, procs, mode, nbytes, smclo=False)
    ours = completions(reg, procs, mode, nbytes, smclo=True)
    assert ours == kernel
    st = reg.stats()
    assert st["accelerated"] == 2 and st["moved_by_reason"]["io-uring"] == 1, st


RAW_RING_SERVER = r"""
import ctypes, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
if len(sys.argv) > 2:               # a ring through liburing first, and gone
    import uring_ctypes
    uring_ctypes.Ring().close()
params = ctypes.create_string_buffer(120)
ring = libc.syscall(425, 4, params)        # io_uring_setup, not liburing
assert ring >= 0, ctypes.get_errno()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(8)
print("ready", flush=True)
c, _ = l.accept()
while True:
    d = c.recv(65536)
    if not d:
        break
    c.sendall(d)
"""


@pytest.mark.parametrize("after_liburing", [False, True])
def test_ring_not_made_by_liburing_declines(reg, procs, after_liburing):
    """A raw ring - also one that takes the number a liburing ring had."""
    port = free_port()
    srv = procs.start([PY, "-c", RAW_RING_SERVER, str(port)] + ["x"] * after_liburing, reg.env,
                      cwd=str(Path(__file__).parent))
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), "0"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "match", r.stdout + r.stderr
    srv.wait(timeout=10)
    st = reg.stats()
    assert st["accelerated"] == 0
    # both ends say why: the server declined, the client heard the reason
    assert st["fallback_by_reason"]["io-uring"] == 2, st
