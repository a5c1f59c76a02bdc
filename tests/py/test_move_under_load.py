"""A connection that moves to TCP mid-stream (core/move.c) loses and repeats
no byte in either direction, whatever its peer is doing at that moment.

For each reason a move has - urgent data (send(MSG_OOB)), a seccomp filter,
the socket used through io_uring - the mover (the client) and its peer (the
server, which never moves anything itself) each stream 4 MiB of their own
random bytes at the other, at the same time, and the mover moves halfway
through its stream, with its peer, at that moment:

  reading   asleep in recv(): both first halves are across and read, the
            peer's writer pauses (it goes on after the move)
  writing   asleep in send(): the mover's reader stopped after the first
            half of the peer's stream, so the ring and the socket fill up
            behind it; it reads on after the move
  busy      neither waits: both streams flowing through the move

Each side checks the other's whole stream byte for byte (the urgent byte is
read in line, SO_OOBINLINE, where it was sent); `smclo stats` must count
the move by its reason at the mover and as peer-moved at the peer, with the
connection accelerated at both ends before it.  The server takes
connections through its inbox (SMCLO_DIRECT=0): a connection made without
TCP has nothing to move to (docs/semantics.md §1).
"""
import os
import subprocess
import sys

import pytest

from conftest import PY, SMCLO, free_port, wait_port

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON = r"""
import os, random, socket, sys, threading, time
sys.path.insert(0, %r)
N = 4 << 20
HALF = N // 2
CHUNK = 64 << 10
A = random.Random(1).randbytes(N)       # the mover's stream
B = random.Random(2).randbytes(N)       # the peer's


def send_all(s, data):
    for i in range(0, len(data), CHUNK):
        s.sendall(data[i:i + CHUNK])


def read_exactly(s, n, into):
    while n > 0:
        d = s.recv(min(n, CHUNK))
        if not d:
            raise EOFError("end of stream %%d bytes early" %% n)
        into += d
        n -= len(d)


def read_to_end(s, into):
    while True:
        d = s.recv(CHUNK)
        if not d:
            return
        into += d


def check(got, want, what):
    if bytes(got) != want:
        first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y),
                     min(len(got), len(want)))
        sys.exit("%%s: %%d bytes, want %%d; first difference at %%d" %% (what, len(got),
                                                                     len(want), first))
""" % HERE

PEER = COMMON + r"""
port, reason, state = int(sys.argv[1]), sys.argv[2], sys.argv[3]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen()
print("ready", flush=True)
c = l.accept()[0]
c.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)


def writer():
    send_all(c, B[:HALF])
    if state == "reading":
        time.sleep(0.8)         # the mover moves while we are asleep in recv()
    send_all(c, B[HALF:])
    c.shutdown(socket.SHUT_WR)


t = threading.Thread(target=writer)
t.start()
got = bytearray()
read_to_end(c, got)
t.join()
want = A[:HALF] + b"U" + A[HALF:] if reason == "urgent" else A
check(got, want, "peer read")
print("ok", flush=True)
"""

MOVER = COMMON + r"""
port, reason, state = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = socket.create_connection(("127.0.0.1", port))
got = bytearray()
half_read, paused, moved = threading.Event(), threading.Event(), threading.Event()
ring = None
if reason == "io-uring":
    import uring_ctypes
    ring = uring_ctypes.Ring()


def move():
    if reason == "urgent":
        c.send(b"U", socket.MSG_OOB)
    elif reason == "seccomp":
        import matrix_server
        matrix_server.seccomp_allow_all()
    else:                       # the next piece of the stream through io_uring
        piece = A[HALF:HALF + 4096]
        while piece:
            piece = piece[ring.send(c.fileno(), piece):]


def reader():
    read_exactly(c, HALF, got)
    half_read.set()
    if state == "writing":
        paused.set()
        moved.wait(10)          # the peer fills the ring meanwhile, then waits in send()
    read_to_end(c, got)


t = threading.Thread(target=reader)
t.start()
send_all(c, A[:HALF])
if state == "reading":
    half_read.wait(30)
    time.sleep(0.3)             # the peer has read our half and sleeps in recv()
elif state == "writing":
    paused.wait(30)
    time.sleep(0.3)
move()
moved.set()
send_all(c, A[HALF + 4096:] if reason == "io-uring" else A[HALF:])
c.shutdown(socket.SHUT_WR)
t.join()
check(got, B, "mover read")
print("ok", flush=True)
"""

REASONS = {"urgent": "urgent-data", "seccomp": "sandbox", "io-uring": "io-uring"}

@pytest.mark.parametrize("state", ["reading", "writing", "busy"])
@pytest.mark.parametrize("reason", list(REASONS))
def test_move_mid_stream(reg, procs, reason, state):
    port = free_port()
    srv = procs.start([PY, "-c", PEER, str(port), reason, state],
                      env=dict(reg.env, SMCLO_DIRECT="0"))
    wait_port(port, proc=srv)
    cli = subprocess.run([SMCLO, "run", "--", PY, "-c", MOVER, str(port), reason, state],
                         env=reg.env, capture_output=True, text=True, timeout=120)
    out, err = (b.decode() for b in srv.communicate(timeout=60))
    # the peer's own word first: a mover's EPIPE is usually the peer's check failing
    assert cli.returncode == 0 and cli.stdout.strip() == "ok", \
        "mover: %s%s\npeer: %s%s" % (cli.stdout, cli.stderr, out, err[-2000:])
    assert srv.returncode == 0 and out.split() == ["ready", "ok"], out + err[-2000:]
    st = reg.wait_stats(lambda s: s["moved_by_reason"]["peer-moved"] >= 1)
    assert st["accelerated_client"] == 1 and st["accelerated_server"] == 1, st
    moved = {k: v for k, v in st["moved_by_reason"].items() if v}
    assert moved == {REASONS[reason]: 1, "peer-moved": 1}, moved
    assert st["fallback"] == 0, st["fallback_by_reason"]
