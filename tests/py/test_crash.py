"""A peer killed with SIGKILL mid-transfer: the survivor sees EOF or
ECONNRESET within a second, and nothing of the dead process is left in the
registry or in the survivor's memory map."""
import os
import signal
import time

from conftest import PY, free_port, wait_port

SURVIVOR_READS = r"""
import socket, sys, time, os
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
n = 0
while n < 1 << 20:
    n += len(c.recv(1 << 16))
print("streaming", flush=True)
sys.stdin.readline()            # the test kills the sender, then tells us to look
t = time.monotonic()
try:
    while True:
        d = c.recv(1 << 16)
        if not d:
            print("eof %.3f" % (time.monotonic() - t), flush=True)
            break
except ConnectionResetError:
    print("reset %.3f" % (time.monotonic() - t), flush=True)
c.close()
maps = open("/proc/self/maps").read()
print("rings-mapped %d" % maps.count("smclo-region"), flush=True)
sys.stdin.readline()
"""

SENDER = r"""
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
buf = b"x" * (1 << 16)
while True:
    c.sendall(buf)
"""

SURVIVOR_WRITES = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
sys.stdin.readline()
t = time.monotonic()
try:
    while True:
        c.sendall(b"y" * (1 << 16))      # ring fills: blocks until the reader is gone
except (BrokenPipeError, ConnectionResetError) as e:
    print("%s %.3f" % (type(e).__name__, time.monotonic() - t), flush=True)
"""

SLEEPY_READER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
time.sleep(60)
"""


def test_sender_killed(reg, procs, tmp_path):
    port = free_port()
    surv = procs.start([PY, "-c", SURVIVOR_READS, str(port)], reg.env, text=True,
                       stdin=__import__("subprocess").PIPE)
    assert surv.stdout.readline().strip() == "ready"
    snd = procs.start([PY, "-c", SENDER, str(port)], reg.env)
    assert surv.stdout.readline().strip() == "streaming"
    os.killpg(snd.pid, signal.SIGKILL)
    snd.wait()
    surv.stdin.write("go\n")
    surv.stdin.flush()
    kind, secs = surv.stdout.readline().split()
    assert kind in ("eof", "reset") and float(secs) < 1.0, (kind, secs)
    assert surv.stdout.readline().strip() == "rings-mapped 0"
    assert reg.stats()["accelerated"] == 2
    surv.stdin.write("done\n")
    surv.stdin.flush()
    surv.wait(timeout=10)
    reg.stat()                                    # tidies the registry
    for sub in ("l", "p", "s", "c"):
        assert reg.entries(sub) == [], (sub, reg.entries(sub))


def test_reader_killed_while_writer_blocked(reg, procs):
    import subprocess
    port = free_port()
    rd = procs.start([PY, "-c", SLEEPY_READER, str(port)], reg.env, text=True)
    assert rd.stdout.readline().strip() == "ready"
    wr = procs.start([PY, "-c", SURVIVOR_WRITES, str(port)], reg.env, text=True,
                     stdin=subprocess.PIPE)
    assert wr.stdout.readline().strip() == "connected"
    wr.stdin.write("go\n")
    wr.stdin.flush()
    time.sleep(0.5)                               # the writer is now blocked on a full ring
    os.killpg(rd.pid, signal.SIGKILL)
    rd.wait()
    kind, secs = wr.stdout.readline().split()
    assert kind in ("BrokenPipeError", "ConnectionResetError") and float(secs) < 1.5, (kind, secs)
    wr.wait(timeout=10)
    reg.stat()
    for sub in ("l", "p", "s", "c"):
        assert reg.entries(sub) == [], (sub, reg.entries(sub))


TICKER = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
while True:
    c.sendall(b"t")
    time.sleep(0.005)
"""

TICK_READER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
for _ in range(50):
    c.recv(1)                    # short sleeps: the futex part of a blocking read
print("ticking", flush=True)
last = time.monotonic()
try:
    while c.recv(1):
        last = time.monotonic()
    print("eof %.3f" % (time.monotonic() - last), flush=True)
except ConnectionResetError:
    print("reset %.3f" % (time.monotonic() - last), flush=True)
"""


def test_peer_killed_while_reader_sleeps_on_futex(reg, procs):
    """A blocking reader's first sleep is on a futex that a crashed writer
    never wakes; it must still see the end within a second."""
    port = free_port()
    rd = procs.start([PY, "-c", TICK_READER, str(port)], reg.env, text=True)
    assert rd.stdout.readline().strip() == "ready"
    tk = procs.start([PY, "-c", TICKER, str(port)], reg.env)
    assert rd.stdout.readline().strip() == "ticking"
    os.killpg(tk.pid, signal.SIGKILL)
    tk.wait()
    kind, secs = rd.stdout.readline().split()
    assert kind in ("eof", "reset") and float(secs) < 1.0, (kind, secs)
    assert reg.stats()["accelerated"] == 2
