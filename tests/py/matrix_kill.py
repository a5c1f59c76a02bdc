"""Both ends of test_matrix.py's crash cells: one end (the survivor) waits on
each of its connections in a different way while the test kills the other
end (the victim) with SIGKILL.

    matrix_kill.py server PATTERN PORT survivor|victim
    matrix_kill.py client PORT survivor|victim KIND...
    matrix_kill.py client PORT echo-survivor [--greet] KIND...
    matrix_kill.py client PORT echo-victim [--greet] idle|flood...

The echo-* roles face the echo servers of matrix_server.py (every pattern of
the matrix; test_matrix.py's test_kill_pattern): each connection first
trades 4 x 4 KiB with the server (after its greeting, --greet), then an
echo-survivor waits the KIND's way while the server is killed; an
echo-victim then leaves the server waiting to read (idle) or sends until the
server, which echoes, can write no more (flood: 8 MiB or until nothing moves
for 0.3 s) and prints "armed" before the test kills it.

The victim sends 64 KiB on every connection (byte 0: the index of the
connection's KIND, for a surviving server) and then neither sends nor
reads again.  The survivor reads those 64 KiB - the transfer is under way,
more could come - then waits on the connection the KIND's way:

  recv          blocking recv()
  poll-in       poll(POLLIN) on a non-blocking socket, then recv()
  poll-in-blk   the same on a blocking socket
  select-in     select() for reading, non-blocking socket
  epoll-in      level-triggered epoll for EPOLLIN, non-blocking socket
  epoll-et-in   edge-triggered epoll for EPOLLIN|EPOLLRDHUP, non-blocking socket
  send          blocking sendall() of 64 MiB: blocks once the ring is full
  poll-out      send() until EAGAIN, then poll(POLLOUT), non-blocking socket
  poll-out-blk  send(MSG_DONTWAIT) until EAGAIN, then poll(POLLOUT), blocking socket
  select-out    select() for writing after EAGAIN, non-blocking socket
  epoll-out     level-triggered epoll for EPOLLOUT after EAGAIN, non-blocking socket
  epoll-et-out  edge-triggered epoll for EPOLLOUT after EAGAIN, non-blocking socket
  poll-io-out   an event loop's wait: poll(POLLIN|POLLOUT) after EAGAIN, reading
                whatever comes, non-blocking socket
  epoll-io-out  the same with level-triggered epoll (EPOLLIN|EPOLLOUT|EPOLLRDHUP)

Every wait is without a timeout, as an event loop's is: a wait that never
ends is found by the test, which stops reading after a few seconds.  A
surviving client prints "armed" once every connection is about to wait (a
surviving server "armed-one" for each), then for each connection
"result KIND OUTCOME WHEN": OUTCOME is eof, ECONNRESET, EPIPE or another
errno name; WHEN is time.monotonic() (the clock is the system's, so the
test compares it with the moment it killed the victim).

Server PATTERNs (each connection gets a thread, or a process, of its own
in the survivor):
  accept    blocking accept() in the main thread: direct after the first
  epoll     non-blocking listener in epoll: never direct (inbox handshake)
  prefork   two children accept on the listener they inherited: rendezvous
            (the test's client takes it with SMCLO_INBOX=0; else the inbox
            the children share with their parent)
  fork      fork per connection, the parent closes its copy at once
The client first makes one connection and closes it (so that a server
blocking in accept() takes all the others without TCP); a victim client
sends one byte 0xff on it.
"""
import errno
import os
import select
import socket
import sys
import threading
import time

PRE = 64 << 10
KINDS = ["recv", "poll-in", "poll-in-blk", "select-in", "epoll-in", "epoll-et-in",
         "send", "poll-out", "poll-out-blk", "select-out", "epoll-out", "epoll-et-out",
         "poll-io-out", "epoll-io-out"]
out_lock = threading.Lock()


def say(*words):
    line = (" ".join(map(str, words)) + "\n").encode()
    with out_lock:
        os.write(1, line)           # one write: lines from several processes stay whole


def read_exactly(c, n):
    got = bytearray()
    while len(got) < n:
        d = c.recv(n - len(got))
        if not d:
            raise ConnectionError("EOF after %d bytes of the first %d" % (len(got), n))
        got.extend(d)
    return bytes(got)


def outcome_of(e):
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__


def fill(c, flags=0):
    """Write until the kernel (or the ring) takes no more."""
    buf = b"w" * (1 << 16)
    while True:
        try:
            c.send(buf, flags)
        except BlockingIOError:
            return


def wait_in(c, kind, armed):
    """Wait for the end of the stream the @kind way; return the outcome."""
    if kind == "recv":
        armed()
        while True:
            if not c.recv(1 << 16):
                return "eof"
    blocking = kind == "poll-in-blk"
    c.setblocking(blocking)
    fd = c.fileno()
    if kind.startswith("epoll"):
        ep = select.epoll()
        ep.register(fd, select.EPOLLIN | (select.EPOLLET | select.EPOLLRDHUP
                                          if kind == "epoll-et-in" else 0))
    elif kind.startswith("poll"):
        p = select.poll()
        p.register(fd, select.POLLIN)
    armed()
    while True:
        if kind.startswith("epoll"):
            ep.poll()
        elif kind.startswith("poll"):
            p.poll()
        else:
            select.select([fd], [], [])
        while True:         # edge-triggered: read until EAGAIN
            try:
                d = c.recv(1 << 16, socket.MSG_DONTWAIT if blocking else 0)
            except BlockingIOError:
                break
            if not d:
                return "eof"


def wait_out(c, kind, armed):
    if kind == "send":
        armed()
        c.sendall(b"s" * (64 << 20))
        return "sent-all"
    blocking = kind == "poll-out-blk"
    c.setblocking(blocking)
    flags = socket.MSG_DONTWAIT if blocking else 0
    fd = c.fileno()
    fill(c, flags)
    io = "-io-" in kind
    if kind.startswith("epoll"):
        ep = select.epoll()
        ep.register(fd, select.EPOLLOUT | (select.EPOLLET if kind == "epoll-et-out" else 0) |
                    (select.EPOLLIN | select.EPOLLRDHUP if io else 0))
    elif kind.startswith("poll"):
        p = select.poll()
        p.register(fd, select.POLLOUT | (select.POLLIN if io else 0))
    armed()
    while True:
        if kind.startswith("epoll"):
            ep.poll()
        elif kind.startswith("poll"):
            p.poll()
        else:
            select.select([], [fd], [])
        if io:
            try:
                if not c.recv(1 << 16, flags):
                    return "eof"
            except BlockingIOError:
                pass
        fill(c, flags)          # raises once the peer is gone


def survive(c, kind, armed, start=lambda c: read_exactly(c, PRE)):
    try:
        start(c)
        how = wait_out if kind.endswith("out") or kind == "send" or "-out-" in kind else wait_in
        result = how(c, kind, armed)
    except Exception as e:
        armed()
        result = outcome_of(e)
    say("result", kind, result, "%.6f" % time.monotonic())


class Armed:
    def __init__(self, n):
        self.n, self.lock, self.done = n, threading.Lock(), set()

    def one(self, key):
        def f():
            with self.lock:
                if key in self.done:
                    return
                self.done.add(key)
                if len(self.done) == self.n:
                    say("armed")
        return f


def victim_conn(c, byte0=0):
    data = bytearray(os.urandom(PRE))
    data[0] = byte0
    c.sendall(data)


# ---- servers ----------------------------------------------------------

def server(pattern, port, role):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(64)
    held = []

    def take(c):
        """A connection the server accepted (in this process)."""
        if role == "victim":
            victim_conn(c)
            held.append(c)
            return
        # the first byte the client sends names the way this one waits
        k = c.recv(1, socket.MSG_PEEK)
        if not k or k[0] >= len(KINDS):     # the victim's warm-up connection
            c.recv(1)
            c.close()
            return
        survive(c, KINDS[k[0]], lambda: say("armed-one"))

    if pattern == "prefork":
        for _ in range(2):
            if os.fork() == 0:
                while True:
                    c, _ = l.accept()
                    threading.Thread(target=take, args=(c,), daemon=True).start()
        say("ready")
        while True:
            os.wait()
    say("ready")
    if pattern == "epoll":
        l.setblocking(False)
        ep = select.epoll()
        ep.register(l.fileno(), select.EPOLLIN)
    while True:
        if pattern == "epoll":
            ep.poll()
            try:
                c, _ = l.accept()
            except BlockingIOError:
                continue
            c.setblocking(True)
        else:
            c, _ = l.accept()
        if pattern == "fork":
            if os.fork() == 0:
                l.close()
                take(c)
                if role == "victim":
                    time.sleep(3600)
                os._exit(0)
            c.close()
            continue
        threading.Thread(target=take, args=(c,), daemon=True).start()


# ---- clients ----------------------------------------------------------

def client(port, role, kinds):
    w = socket.create_connection(("127.0.0.1", port))      # warm-up
    if role == "survivor":
        read_exactly(w, PRE)
    else:
        w.sendall(b"\xff")
        w.recv(1)                   # the server closes it
    w.close()
    armed = Armed(len(kinds))
    conns = []
    for i, kind in enumerate(kinds):
        c = socket.create_connection(("127.0.0.1", port))
        if role == "victim":
            victim_conn(c, KINDS.index(kind))
        conns.append(c)
    if role == "victim":
        say("connected")
        time.sleep(3600)
    threads = [threading.Thread(target=survive, args=(c, k, armed.one(i)), daemon=True)
               for i, (c, k) in enumerate(zip(conns, kinds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- clients of matrix_server.py's echo servers ---------------------------

CHUNK, ROUNDS = 4 << 10, 4
FLOOD = 8 << 20


def echo_start(c, greet):
    """Get a transfer under way both ways: the greeting if the pattern sends
    one, then ROUNDS chunks sent and their echo checked."""
    if greet and read_exactly(c, 1) != b"G":
        raise RuntimeError("no greeting")
    for _ in range(ROUNDS):
        data = os.urandom(CHUNK)
        c.sendall(data)
        if read_exactly(c, CHUNK) != data:
            raise RuntimeError("the echo differs")


def flood(c):
    """Send until the echoing server can write no more (so it waits to write)."""
    c.setblocking(False)
    buf, sent = b"f" * (1 << 16), 0
    while sent < FLOOD:
        try:
            sent += c.send(buf)
        except BlockingIOError:
            if not select.select([], [c], [], 0.3)[1]:
                return


def echo_client(port, role, args):
    greet = args[:1] == ["--greet"]
    names = args[1:] if greet else args
    w = socket.create_connection(("127.0.0.1", port))      # warm-up (direct after it)
    echo_start(w, greet)
    w.close()
    # each connection's transfer begins before the next connect(): a server
    # that takes the next connection only once the last one's first bytes
    # came (fork-late) would otherwise make every later handshake wait
    conns = []
    for how in names:
        c = socket.create_connection(("127.0.0.1", port))
        try:
            echo_start(c, greet)
        except Exception as e:
            say("error", how, outcome_of(e))
        conns.append(c)
    armed = Armed(len(names))
    if role == "echo-survivor":
        run = [(survive, (c, k, armed.one(i), lambda c: None))
               for i, (c, k) in enumerate(zip(conns, names))]
    else:
        def victim(c, how, arm):
            try:
                if how == "flood":
                    flood(c)
            except Exception as e:
                say("error", how, outcome_of(e))
            arm()
        run = [(victim, (c, how, armed.one(i))) for i, (c, how) in enumerate(zip(conns, names))]
    threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in run]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if role == "echo-victim":
        time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[3].startswith("echo-"):
        echo_client(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        client(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
