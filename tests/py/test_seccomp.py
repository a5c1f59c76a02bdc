"""A program that locks itself down with seccomp never dies because of
smclo, and loses no byte: before the filter applies, its connections move
to their TCP sockets (core/move.c, handshake/moved.c), with bytes still
in the rings in both directions.

seccomp_echo (tests/progs) reads a head, writes bytes its client has not
read, then installs a filter that kills on anything but read, write,
close and exit (and poll with --poll, as sshd waits), and echoes until end
of file.  The client writes before and after the filter and reads all.
With --libseccomp the filter is made and loaded by libseccomp, whose
seccomp_load() smclo interposes (it reaches the kernel through syscall());
with --nofile a descriptor limit of 1 comes first, as in OpenSSH's sandbox:
no dup3() onto the connection's number is possible after it, so the
connection moves at the setrlimit().
"""
import os
import subprocess

import pytest

from conftest import PY, SMCLO, TESTBIN, free_port, wait_port

CLIENT = r"""
import os, socket, sys, time
port, head, own, body = map(int, sys.argv[1:5])
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"h" * head)
time.sleep(0.3)          # the server writes its bytes and locks down meanwhile
data = os.urandom(body)
c.sendall(data)
c.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    got += d
want = bytes((i * 7) % 251 for i in range(own)) + data
assert bytes(got) == want, "got %d bytes, want %d" % (len(got), len(want))
print("ok")
"""


@pytest.mark.parametrize("how", ["read", "poll", "libseccomp", "nofile"])
def test_filter_kills_on_anything_else(reg, procs, how):
    port = free_port()
    args = [str(TESTBIN / "seccomp_echo"), str(port), "100", "50000"]
    srv = procs.start(args + (["--" + how] if how != "read" else []), reg.env)
    wait_port(port, proc=srv)
    cli = subprocess.run([SMCLO, "run", "--", PY, "-c", CLIENT, str(port), "100", "50000",
                          "3000000"], env=reg.env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert srv.wait(timeout=30) == 0, "server ended by %s" % srv.returncode
    st = reg.wait_stats(lambda s: s["moved_by_reason"]["peer-moved"] >= 1)
    assert st["accelerated_client"] == 1 and st["accelerated_server"] == 1, st
    assert st["moved_by_reason"]["sandbox"] == 1, st["moved_by_reason"]
    assert st["moved_by_reason"]["peer-moved"] == 1, st["moved_by_reason"]
    assert st["fallback"] == 0, st["fallback_by_reason"]


SANDBOXED_CLIENT = r"""
import socket, sys
sys.path.insert(0, sys.argv[2])
import matrix_server
matrix_server.seccomp_allow_all()
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"after the filter")
c.shutdown(socket.SHUT_WR)
got = b""
while True:
    d = c.recv(100)
    if not d:
        break
    got += d
assert got == b"after the filter", got
print("ok")
"""


def test_nothing_new_accelerated_after_a_filter(reg, procs):
    """A process that confined itself connects on TCP, and says why."""
    port = free_port()
    srv = procs.start([PY, os.path.join(os.path.dirname(__file__), "matrix_server.py"),
                       "accept", str(port), "/tmp"], reg.env)
    wait_port(port, proc=srv)
    cli = subprocess.run([SMCLO, "run", "--", PY, "-c", SANDBOXED_CLIENT, str(port),
                          os.path.dirname(__file__)], env=reg.env, capture_output=True,
                         text=True, timeout=60)
    assert cli.returncode == 0 and "ok" in cli.stdout, cli.stderr
    st = reg.wait_stats(lambda s: s["fallback_by_reason"]["sandbox"] >= 1)
    assert st["fallback_by_reason"]["sandbox"] == 1, st["fallback_by_reason"]
    assert st["accelerated"] == 0, st
