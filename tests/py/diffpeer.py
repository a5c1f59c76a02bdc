"""One end of a differential case (test_differential.py runs the cases).

    diffpeer.py server|client CASE PORT CTLFD

Each case runs twice or more: both ends plain (the kernel's TCP, the
oracle) and both ends under smclo on a forced handshake path.  What a
program can observe - return values, errno, bytes, readiness masks,
signals, coarse durations - goes into a trace, one entry per stdout line,
and the traces must be equal.

The server listens on PORT and accepts a first connection, which it closes,
then the case's own: after one accept() a blocking listener goes direct
under smclo (docs/design.md §2d), so the case's connection takes the path
the test forces.  The client connects twice likewise.  The two ends meet at
barriers over CTLFD, an AF_UNIX socket smclo does not touch; a case makes
results that depend on timing deterministic with them.
"""
import errno
import hashlib
import os
import select
import signal
import socket
import sys
import threading
import time

import diffcases

ERRNO = errno.errorcode
ADDR = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}


def shown(v):
    """A result as it goes into the trace: bytes beyond 64 as length and
    digest, so traces stay short and still prove every byte."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        v = bytes(v)
        return v if len(v) <= 64 else ("%d bytes" % len(v), hashlib.sha1(v).hexdigest()[:16])
    if isinstance(v, (list, tuple)):
        return type(v)(shown(x) for x in v)
    return v


def bucket(seconds):
    """Durations in buckets wide enough for a loaded machine: a case times
    a wait it chose (0.4 s, 1 s) or one that must be immediate."""
    for limit, name in ((0.15, "now"), (0.75, "~0.5s"), (1.6, "~1s")):
        if seconds < limit:
            return name
    return "long"


POLL_BITS = [(getattr(select, n), n) for n in ("POLLIN", "POLLPRI", "POLLOUT", "POLLERR",
                                               "POLLHUP", "POLLRDHUP", "POLLNVAL")]
EPOLL_BITS = [(getattr(select, n), n) for n in ("EPOLLIN", "EPOLLPRI", "EPOLLOUT", "EPOLLERR",
                                                "EPOLLHUP", "EPOLLRDHUP")]


def names(mask, bits):
    return "|".join(n for b, n in bits if mask & b) or "0"


class End:
    """One end of a case: its socket, its trace and its barriers."""

    def __init__(self, role, port, ctl):
        self.role, self.port, self.ctl = role, port, ctl
        self.lock = threading.Lock()
        self.ctl_buf = b""
        self.peer_pid = None
        self.signals = []
        for sig in (signal.SIGPIPE, signal.SIGIO, signal.SIGURG):
            signal.signal(sig, self.on_signal)

    def log(self, *entry):
        with self.lock:
            sys.stdout.write(repr(shown(entry)) + "\n")
            sys.stdout.flush()

    def on_signal(self, sig, frame):
        # kept until the case asks (log_signals): when a handler runs is
        # up to the interpreter, which call a signal follows is not
        self.signals.append(signal.Signals(sig).name)

    def log_signals(self, label="signals"):
        got, self.signals = self.signals, []
        self.log(label, got)

    def call(self, fn, *args):
        """(what fn(*args) returned or "E<errno>" it failed with, the
        result or the OSError, seconds taken)."""
        t = time.monotonic()
        try:
            r = fn(*args)
            out = r
        except OSError as e:
            r = e
            out = "E" + ERRNO.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
        return out, r, time.monotonic() - t

    def do(self, label, fn, *args, timed=False):
        """Call fn(*args) and log what it returned or the errno it failed
        with (and how long it took, if timed); returns the result, or the
        OSError."""
        out, r, took = self.call(fn, *args)
        self.log(*((label, out) + ((bucket(took),) if timed else ())))
        return r

    # -- barriers -----------------------------------------------------------

    def sync(self, label="sync"):
        """Wait until the other end reaches the same barrier."""
        self.ctl.sendall(label.encode() + b"\n")
        got = self.ctl_line()
        if got != label.encode():
            raise SystemExit("%s: barrier %r met %r" % (self.role, label, got))

    def finish(self):
        """The last barrier: neither end exits (and closes what it holds)
        while the other still looks; a peer that died is no wait."""
        try:
            self.sync("finished")
        except (SystemExit, OSError):
            pass

    def meet(self):
        """Trade process ids with the other end."""
        self.ctl.sendall(b"%d\n" % os.getpid())
        self.peer_pid = int(self.ctl_line())

    def ctl_line(self):
        while b"\n" not in self.ctl_buf:
            d = self.ctl.recv(256)
            if not d:
                raise SystemExit("%s: the peer ended before a barrier" % self.role)
            self.ctl_buf += d
        line, self.ctl_buf = self.ctl_buf.split(b"\n", 1)
        return line

    def peer_exited(self, timeout=10.0):
        """Wait until the other end's process has exited (a zombie: every
        descriptor it had is closed, so the kernel has done all it does at
        an exit)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open("/proc/%d/status" % self.peer_pid) as f:
                    st = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
                # a zombie leader whose other threads still exit holds its files
                if st["State"].split()[0] in "ZX" and int(st["Threads"]) <= 1:
                    return
            except FileNotFoundError:
                return
            time.sleep(0.01)
        raise SystemExit("%s: the peer did not exit" % self.role)

    def die(self):
        """End this process as SIGKILL would, at once."""
        os.kill(os.getpid(), signal.SIGKILL)

    # -- readiness ----------------------------------------------------------

    def poll(self, label, events, timeout_ms, sock=None, timed=False):
        p = select.poll()
        p.register(sock or self.sock, events)
        t = time.monotonic()
        got = p.poll(timeout_ms)
        entry = (label, [names(ev, POLL_BITS) for _, ev in got])
        if timed:
            entry += (bucket(time.monotonic() - t),)
        self.log(*entry)
        return got[0][1] if got else 0

    def select(self, label, r, w, x, timeout):
        s = self.sock
        got = select.select([s] if r else [], [s] if w else [], [s] if x else [], timeout)
        self.log(label, ["rwx"[i] for i in range(3) if got[i]])

    def epoll_wait(self, label, ep, timeout, timed=False):
        t = time.monotonic()
        got = ep.poll(timeout)
        entry = (label, [names(ev, EPOLL_BITS) for _, ev in got])
        if timed:
            entry += (bucket(time.monotonic() - t),)
        self.log(*entry)
        return got

    def thread(self, fn, *args):
        th = threading.Thread(target=fn, args=args, daemon=True)
        th.start()
        return th

    def recv_all(self, label="rest", sock=None):
        """Read to the end and log every byte read, then how it ended."""
        s = sock or self.sock
        got = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                got += d
            end = "eof"
        except OSError as e:
            end = "E" + ERRNO.get(e.errno, str(e.errno))
        self.log(label, got, end)
        return got


def serve(end, case, family):
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((getattr(case, "listen_on", ADDR[family]), end.port))
    listener.listen(getattr(case, "backlog", 8))
    end.listener = listener
    print("ready", flush=True)
    end.meet()
    first, _ = listener.accept()
    first.close()
    # the client connects again once this thread sleeps in accept(): by
    # then the listener has gone direct (under smclo, on that path)
    waiting = end.thread(asleep_then_sync, end, threading.get_native_id())
    if getattr(case, "accepts", True):
        end.sock, end.peer_addr = listener.accept()
    else:
        time.sleep(0.05)
    waiting.join()
    case.server(end)


def asleep_then_sync(end, tid):
    path = "/proc/self/task/%d/stat" % tid
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(path) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "S":
                break
        time.sleep(0.002)
    end.sync("accepting")


def connect(end, case, family):
    end.meet()
    to = (getattr(case, "connect_to", ADDR[family]), end.port)
    first = socket.create_connection(to)
    first.close()
    end.sync("accepting")
    if getattr(case, "connects", True):
        end.sock = socket.create_connection(to)
    case.client(end)


def main():
    role, name, port, ctlfd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    case = diffcases.CASES[name]
    signal.alarm(20)        # a case that hangs ends here (SIGALRM), not in the harness's timeout
    ctl = socket.socket(fileno=ctlfd)
    end = End(role, port, ctl)
    family = getattr(case, "family", socket.AF_INET)
    (serve if role == "server" else connect)(end, case, family)
    end.log_signals()
    end.log("end")
    end.finish()


if __name__ == "__main__":
    main()
