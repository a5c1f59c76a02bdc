"""TCP_DEFER_ACCEPT: the kernel wakes an acceptor only once a client's first
bytes arrive (apache2's default AcceptFilter, pgbouncer's tcp_defer_accept,
nginx's `deferred`).  A client that waited for the handshake before sending
would wait for a server that waits for it: every connection would stall for
the handshake timeout.  So a client sends its first bytes over TCP with its
offer, and the server, woken by them, moves them to the ring's head when it
takes the offer (client.c hs_send_prefix, server.c server_tcp_prefix): set
before listen() or after it (pgbouncer), on a listener one process accepts
on, every connection is accelerated, byte exact, none waiting.  Where
fork children of the listening process accept (apache2's children) they
share its inbox, and connections are accelerated too, also where the
option was set by one of them after they forked (every entry names the
shared inbox; one saying the listener defers is enough).
"""
import time

import pytest

from conftest import PY, free_port, wait_port

# an echo per connection, in a thread of its own
SERVE = r"""
def serve(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
"""

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
""" + SERVE + r"""
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
    # child-after-fork: every entry names the inbox the children share with
    # their parent, one says the listener defers: first bytes over TCP
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= N)
    assert st["accelerated_client"] == N and st["accelerated_server"] == N, st
    assert st["inbox_handshakes"] == N and st["direct_handshakes"] == 0, st
    by = st["fallback_by_reason"]
    assert by["timeout"] == 0 and by.get("peer-withdrew", 0) == 0, by
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


# Clients as event loops and tools write them, against the one-process
# listener that set the option after listen(): each connection's bytes
# echoed exactly, every connection accelerated, none waiting out a timeout.
#   epoll      non-blocking connect, the socket in an epoll set (IN|OUT) before
#              its first write, every wait there (nginx's upstream, libevent)
#   poll       non-blocking connect, poll for POLLOUT, write, poll for POLLIN (curl, ab)
#   reader     a thread reading before the first write is made (full duplex)
#   poller     a thread asleep in poll(POLLIN), epoller one in epoll_wait, before it
#   closer     every other connection closed without a byte (a health check)
CLIENTS = r"""
import os, select, socket, sys, threading, time
port, n, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
bad = 0


def echo_nonblocking(c, data, wait):
    got, sent = b"", 0
    while len(got) < len(data):
        wait(c, sent < len(data))
        if sent < len(data):
            try:
                sent += c.send(data[sent:sent + 65536])
            except BlockingIOError:
                pass
            if sent == len(data):
                c.shutdown(socket.SHUT_WR)
        try:
            d = c.recv(65536)
            if not d:
                break
            got += d
        except BlockingIOError:
            pass
    return got


def by_epoll():
    ep = select.epoll()
    def wait(c, writing):
        if not ep.poll(5):
            raise TimeoutError("no event")
    def run(c, data):
        ep.register(c.fileno(), select.EPOLLIN | select.EPOLLOUT)
        try:
            return echo_nonblocking(c, data, wait)
        finally:
            ep.unregister(c.fileno())
    return run


def by_poll(c, data):
    def wait(c, writing):
        p = select.poll()
        p.register(c, select.POLLIN | (select.POLLOUT if writing else 0))
        if not p.poll(5000):
            raise TimeoutError("no event")
    return echo_nonblocking(c, data, wait)


# how the reading thread waits: in recv() itself, or asleep in poll or
# epoll_wait before each recv (the first sleep begins before any write)
def sleeper(c):
    if kind == "epoller":
        ep = select.epoll()
        ep.register(c.fileno(), select.EPOLLIN)
        return lambda: ep.poll(10)
    if kind == "poller":
        p = select.poll()
        p.register(c, select.POLLIN)
        return lambda: p.poll(10000)
    return None


def with_reader(c, data):
    c.setblocking(True)
    sleep = sleeper(c)
    got = []
    def read():
        while sleep is None or sleep():
            d = c.recv(65536)
            if not d:
                return
            got.append(d)
    t = threading.Thread(target=read)
    t.start()
    if sleep:
        time.sleep(0.05)
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    t.join(10)
    return b"".join(got)


run = {"epoll": by_epoll(), "poll": by_poll}.get(kind, with_reader)
for i in range(n):
    data = os.urandom(1 + i * 4999)
    if kind == "closer":
        socket.create_connection(("127.0.0.1", port)).close()
    c = socket.socket()
    c.setblocking(False)
    if kind == "epoll":
        c.connect_ex(("127.0.0.1", port))       # registered in run(), before any write
    else:
        c.connect_ex(("127.0.0.1", port))
    with c:
        bad += run(c, data) != data
print("bad", bad)
"""


@pytest.mark.parametrize("kind", ["epoll", "poll", "reader", "closer", "poller", "epoller"])
def test_deferred_accept_clients(reg, procs, kind):
    port = free_port()
    srv = procs.start([PY, "-c", SERVER, str(port), "after-listen"], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    r = reg.run([PY, "-c", CLIENTS, str(port), str(N), kind], timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= N)
    assert st["accelerated_client"] == N and st["accelerated_server"] == N, st
    by = st["fallback_by_reason"]
    assert by["timeout"] == 0 and by.get("peer-withdrew", 0) == 0, by
    if kind == "closer":        # the closed ones: TCP at once, named
        assert by["defer-accept"] == N, by
    assert took < N * 0.3, "%.1f s for %d connections" % (took, N)


# apache2's shape: the parent sets the option after listen() and forks
# children that accept (blocking, or each in an epoll loop); they share the
# parent's inbox (handshake/inbox.c, "a shared inbox").
PREFORK = r"""
import os, select, socket, sys, threading
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(128)
l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 5)
""" + SERVE + r"""
for i in range(3):
    if os.fork() == 0:
        while True:
            c, _ = l.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()
print("ready", flush=True)
os.wait()
"""

# A burst, as ab -c N makes one: every connection made before the first
# byte is written to any (blocking), or all of them in one epoll loop,
# registered before their first writes (ab itself).
BURST = r"""
import os, select, socket, sys
port, n, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
datas = [os.urandom(1 + i * 499) for i in range(n)]
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
got = [bytearray() for _ in range(n)]
if kind == "blocking":
    for s, d in zip(socks, datas):
        s.sendall(d)
        s.shutdown(socket.SHUT_WR)
    for s, g in zip(socks, got):
        while True:
            d = s.recv(65536)
            if not d:
                break
            g += d
else:
    ep = select.epoll()
    for i, s in enumerate(socks):
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLOUT)
    left = n
    by_fd = {s.fileno(): i for i, s in enumerate(socks)}
    while left:
        for fd, ev in ep.poll(10):
            i = by_fd[fd]
            s = socks[i]
            if ev & select.EPOLLOUT:
                s.sendall(datas[i])     # fits: one write
                s.shutdown(socket.SHUT_WR)
                ep.modify(fd, select.EPOLLIN)
                continue
            try:
                d = s.recv(65536)
            except BlockingIOError:
                continue
            if d:
                got[i] += d
            else:
                ep.unregister(fd)
                left -= 1
print("bad", sum(bytes(g) != d for g, d in zip(got, datas)))
"""


@pytest.mark.parametrize("kind", ["blocking", "epoll"])
def test_deferred_accept_shared_inbox(reg, procs, kind):
    """Several fork children accept on a deferring listener: a burst of 30
    connections, every one echoed exactly, accelerated through the parent's
    inbox, none waiting out a handshake timeout.  Before: all on TCP
    (defer-accept); and with the offer sent at connect(), the burst filled
    the inbox's queue (10 datagrams)."""
    n = 30
    port = free_port()
    srv = procs.start([PY, "-c", PREFORK, str(port)], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    time.sleep(0.2)             # every child has its entry
    t0 = time.monotonic()
    r = reg.run([PY, "-c", BURST, str(port), str(n), kind], timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["accelerated_server"] + s["fallback_by_reason"]
                        ["offer-missed"] >= n)
    by = {k: v for k, v in st["fallback_by_reason"].items() if v}
    # a child may read its offer late on a loaded machine: that one is named
    assert st["accelerated_client"] + by.get("offer-missed", 0) == n, (st, by)
    assert st["accelerated_client"] >= n - 2, by
    assert set(by) <= {"offer-missed", "peer-no-smclo"}, by
    assert took < 10, "%.1f s for %d connections" % (took, n)
