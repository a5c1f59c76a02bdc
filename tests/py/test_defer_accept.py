"""TCP_DEFER_ACCEPT: the kernel wakes an acceptor only once a client's first
bytes arrive (apache2's default AcceptFilter, pgbouncer's tcp_defer_accept,
nginx's `deferred`).  A client that waited for the handshake before sending
would wait for a server that waits for it: every connection would stall for
the handshake timeout.  However the option is set - before listen(), after
it (apache2, pgbouncer), or by one of the processes sharing the listener
after they forked - clients take TCP at once, named defer-accept, and no
connection waits out a timeout.
"""
import time

import pytest

from conftest import PY, free_port, wait_port

SERVER = r"""
import os, socket, sys, threading
when = sys.argv[2]
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
def defer():
    l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 5)
if when == "before-listen":
    defer()
l.listen(64)
if when == "after-listen":
    defer()
def serve(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
def accept_forever():
    while True:
        c, _ = l.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
if when == "child-after-fork":
    # prefork: two children accept; the second sets the option itself
    for i in range(2):
        if os.fork() == 0:
            if i == 1:
                defer()
            accept_forever()
    print("ready", flush=True)
    os.wait()
else:
    print("ready", flush=True)
    accept_forever()
"""

N = 20


@pytest.mark.parametrize("when", ["before-listen", "after-listen", "child-after-fork"])
def test_deferred_accept_never_stalls(reg, procs, when):
    port = free_port()
    srv = procs.start([PY, "-c", SERVER, str(port), when], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    if when == "child-after-fork":
        time.sleep(0.5)         # the second child has set the option
    t0 = time.monotonic()
    r = reg.run([PY, "-c", CHURN, str(port), str(N)], timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["fallback_by_reason"]["defer-accept"] >= N)
    by = st["fallback_by_reason"]
    assert by["defer-accept"] == N, by
    assert by["timeout"] == 0 and by.get("peer-withdrew", 0) == 0, by
    assert st["accelerated_client"] == 0, st
    # stalled, the connections took the handshake timeout each (300 ms)
    assert took < N * 0.3, "%.1f s for %d connections" % (took, N)


CHURN = r"""
import os, socket, sys
port, n, bad = int(sys.argv[1]), int(sys.argv[2]), 0
for i in range(n):
    data = os.urandom(1 + i * 997)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while len(got) < len(data):
            d = s.recv(65536)
            if not d:
                break
            got += d
        bad += got != data
print("bad", bad)
"""
