"""A client's connection is pending from connect() until the server decides
its inbox offer (src/handshake/client.c): small writes wait in the ring, and the first
call that needs the decision takes it.  Whatever that call is, the bytes
arrive in order and the connection is accelerated."""
import os
import time

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


# A client that writes, then blocks in recv while its offer is undecided: the
# read sleeps until the server's answer (client.c, inbox_offer_wait_reading).
READER = r"""
import signal, socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"q" * 100)
if sys.argv[2] == "signal":
    class Alarm(Exception):
        pass
    def on_alarm(sig, frame):
        raise Alarm()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t = time.monotonic()
    try:
        c.recv(100)
        print("returned", flush=True)
    except Alarm:
        print("interrupted %.2f" % (time.monotonic() - t), flush=True)
    sys.exit(0)
t = time.monotonic()
got = b""
while len(got) < 100 and (d := c.recv(100)):
    got += d
print("%s %.2f" % ("match" if got == b"q" * 100 else "MISMATCH", time.monotonic() - t),
      flush=True)
"""

# Accepts once GATE exists; "echo" echoes, "quiet" holds the connection open.
LATE_SERVER = r"""
import os, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
c, _ = s.accept()
if sys.argv[3] == "echo":
    c.sendall(c.recv(100))
time.sleep(5)
"""


def start_late(reg, procs, tmp_path, mode, server_env=None):
    port = free_port()
    gate = tmp_path / "gate"
    srv = procs.start([PY, "-c", LATE_SERVER, str(port), str(gate), mode],
                      env=dict(reg.env, **(server_env or {})), text=True)
    assert srv.stdout.readline().strip() == "ready"
    return port, gate


@pytest.mark.parametrize("decline", [False, True])
def test_read_while_undecided_wakes_on_the_answer(reg, procs, tmp_path, decline):
    """The server accepts 300 ms after the client started reading.  Taken: the
    answer wakes the read.  Declined: the decline does (not the 10 s
    handshake timeout), and the 100 bytes written meanwhile reach the server
    through TCP."""
    port, gate = start_late(reg, procs, tmp_path, "echo",
                            {"SMCLO_MAX_CONNS": "0"} if decline else None)
    env = dict(reg.env, SMCLO_HANDSHAKE_MS="10000")
    cli = procs.start([PY, "-c", READER, str(port), "read"], env=env, text=True)
    time.sleep(0.3)
    gate.touch()
    verdict, secs = cli.stdout.readline().split()
    assert verdict == "match" and float(secs) < 3, (verdict, secs)
    st = reg.stats()
    if decline:
        assert st["fallback_by_reason"]["max-buffers"] == 2, st
    else:
        assert st["accelerated_client"] == 1 and st["inbox_handshakes"] == 1, st


def test_signal_interrupts_read_while_undecided(reg, procs, tmp_path):
    """The server takes the offer while the client sleeps in its read, and
    never answers: a signal still ends the read with EINTR (Python raises
    from the handler) at once."""
    port, gate = start_late(reg, procs, tmp_path, "quiet")
    env = dict(reg.env, SMCLO_HANDSHAKE_MS="10000")
    cli = procs.start([PY, "-c", READER, str(port), "signal"], env=env, text=True)
    time.sleep(0.2)
    gate.touch()
    out = cli.stdout.readline().split()
    assert out[0] == "interrupted" and float(out[1]) < 2, out
    assert reg.stats()["accelerated_client"] == 1
