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


STALLING_SERVER = r"""
import socket, sys, threading, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(64)
print("ready", flush=True)
held = []
def serve(c):
    c.recv(1000)
    time.sleep(3600)            # the rings fill up: writers wait for POLLOUT
while True:
    c, _ = l.accept(); held.append(c)
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

TIMEOUT_WRITERS = r"""
import socket, sys, threading, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = []
for _ in range(n):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(10)
    socks.append(c)
out = [None] * n
def write(i):
    try:
        socks[i].sendall(b"x" * 50_000_000)
        out[i] = "sent"
    except Exception as e:
        out[i] = (type(e).__name__, time.monotonic())
ts = [threading.Thread(target=write, args=(i,)) for i in range(n)]
for t in ts: t.start()
time.sleep(0.5)
print("writing", flush=True)
sys.stdin.readline()
killed = time.monotonic()
for t in ts: t.join()
for o in out:
    print(o[0], "%.3f" % (o[1] - killed) if o != "sent" else "")
"""


def test_writers_polling_pollout_see_a_killed_reader(reg, procs):
    """Socket timeouts make Python's sockets non-blocking underneath, so a
    writer facing a full ring polls for POLLOUT: the dead reader's hang-up
    must turn its next write into EPIPE, not EAGAIN until its timeout."""
    port = free_port()
    srv = procs.start([PY, "-c", STALLING_SERVER, str(port)], reg.env)
    wait_port(port, proc=srv)
    import subprocess
    cli = procs.start([PY, "-c", TIMEOUT_WRITERS, str(port), "20"], reg.env,
                      stdin=subprocess.PIPE, text=True)
    assert cli.stdout.readline().strip() == "writing"
    os.killpg(srv.pid, signal.SIGKILL)
    cli.stdin.write("go\n")
    cli.stdin.flush()
    out, err = cli.communicate(timeout=30)
    lines = out.split("\n")
    results = [ln.split() for ln in lines if ln.strip()]
    assert len(results) == 20, out + err
    for name, after in results:
        assert name in ("BrokenPipeError", "ConnectionResetError"), out
        assert float(after) < 1.0, out
    assert reg.stats()["accelerated_client"] == 20
