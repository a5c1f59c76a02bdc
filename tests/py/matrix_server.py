"""Echo servers written the ways real servers are, for test_matrix.py.

    matrix_server.py PATTERN PORT WORKDIR

Every pattern listens on 127.0.0.1:PORT, prints "ready" once it listens
(daemons write their pid to WORKDIR/pid instead: they close stdout), and
echoes every connection until the client half-closes, then closes it.  The
"fork-early" and "fork-late" patterns first send the greeting byte b"G"
(the client waits for it), so the parent's close can be ordered before or
after the client's first byte.  WORKDIR is a scratch directory (chroot
target, pid file).  The test stops the server by killing its process group
(or, for the daemons, the pid in WORKDIR/pid).

With MATRIX_RESULTS=FILE in the environment (test_matrix_kill.py), every
connection served in Python also reports the moment it saw its end:
"ended OUTCOME MONOTONIC BYTES" (OUTCOME: eof or the errno name; BYTES:
how many it had read), appended to
FILE, or to stderr where FILE cannot be opened (after setuid or chroot).

Patterns (see PATTERNS at the end):
  accept           blocking accept(), each connection served inline
  epoll-lt/-et     non-blocking listener and connections in one epoll loop
  poll, select     the same loop with poll() / select()
  fork-early       fork per connection; the parent closes its copy before the
                   child greets (so before the client's first byte)
  fork-late        the same, the parent closes its copy after the child read
                   the client's first bytes
  fork-epoll       PostgreSQL: the postmaster waits for the listener in select(),
                   forks, closes its copy at once; the child reads through an
                   epoll set of its own (non-blocking, like WaitEventSet)
  prefork          3 children inherit the listener and block in accept()
  prefork-epoll    3 children poll the shared non-blocking listener with epoll
  prefork-dup0     3 children move the listener to descriptor 0 (dup2, close the
                   original: php-fpm's workers) and block in accept() there
  prefork-spawn    3 children each posix_spawn a program that accepts on the
                   listener it inherits (a supervisor's child starting a worker)
  thread           a thread per connection, the main thread in accept()
  handoff          accept() in the main thread, served by one worker thread
  scm-keep         the accepted descriptor goes to a worker process over
                   SCM_RIGHTS; the acceptor keeps its copy until the worker is done
  scm-close        the same, the acceptor closes its copy once it is sent
  scm-exec         scm-close with a worker that is a program of its own (exec'd
                   before the listener: it shares no memory with the acceptor)
  scm-midstream    scm-close after the acceptor read (up to 1000 B of) the
                   request; those bytes go to the worker with the descriptor
  exec-python      inetd: fork, dup2 onto 0/1, exec python3 -c <echo loop>
  exec-cat         inetd: fork, dup2 onto 0/1, exec /bin/cat
  exec-midstream   exec-cat after the server read (up to 1000 B of) the request
                   and answered that part itself
  exec-closeall    exec-cat after the child closed every descriptor above 2
                   with close(), one by one
  exec-closerange  the same with os.closerange() (close_range(2))
  spawn-cat        os.posix_spawn of cat with the connection dup2'd onto 0/1
  subprocess-cat   subprocess.Popen(cat, stdin=conn, stdout=conn, close_fds=True)
  system-cat       os.system("exec cat <&N >&N")
  defer-after-listen  pgbouncer, apache2's AcceptFilter: TCP_DEFER_ACCEPT set
                   after listen(), then blocking accept()
  prefork-defer    apache2's prefork: defer-after-listen in the parent, then 3
                   fork children in blocking accept()
  prefork-defer-epoll  apache2's event MPM: the same, the children in epoll loops
  setuid           after listen(): setgroups([]), setgid(nogroup), setuid(nobody)
  setgid           after listen(): setgid(nogroup) only (still uid 0)
  chroot           after listen(): chroot(WORKDIR/root)
  daemon-close     double fork, setsid, os.close() of every descriptor, then listen
  daemon-closerange  the same with os.closerange() (close_range(2))
  rlimit-64/-256   RLIMIT_NOFILE lowered before listen(); thread per connection
  spawn-helper     per connection, os.posix_spawn(sleep 0.3) inheriting the
                   listener and the connection, the server echoing meanwhile
                   (glibc spawns with a vfork-like clone; smclo's posix_spawn
                   forks and execs instead while connections are held)
  subprocess-helper  the same through subprocess (vfork, then execv)
"""
import errno
import os
import queue
import resource
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

PYECHO = ("import errno, os, time\n"
          "how, got = 'eof', 0\n"
          "try:\n"
          "    while True:\n"
          "        d = os.read(0, 65536)\n"
          "        if not d:\n"
          "            break\n"
          "        got += len(d)\n"
          "        while d:\n"
          "            d = d[os.write(1, d):]\n"
          "except OSError as e:\n"
          "    how = errno.errorcode.get(e.errno, str(e.errno))\n"
          "if os.environ.get('MATRIX_RESULTS'):\n"
          "    with open(os.environ['MATRIX_RESULTS'], 'a') as f:\n"
          "        f.write('ended %s %.6f %d\\n' % (how, time.monotonic(), got))\n")


def listen(port, backlog=128):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(backlog)
    return s


def ready():
    print("ready", flush=True)


def ended(how, got):
    """Report the end of a connection's stream (see MATRIX_RESULTS above)."""
    path = os.environ.get("MATRIX_RESULTS")
    if not path:
        return
    line = "ended %s %.6f %d\n" % (how, time.monotonic(), got)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        fd = 2
    os.write(fd, line.encode())
    if fd != 2:
        os.close(fd)


def outcome_of(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__


def echo(c, greet=False, shut=False, each=None):
    got = 0
    try:
        if greet:
            c.sendall(b"G")
        while True:
            d = c.recv(1 << 16)
            if not d:
                break
            got += len(d)
            if each:
                each()
            c.sendall(d)
        ended("eof", got)
        if shut:
            c.shutdown(socket.SHUT_WR)
    except OSError as e:
        ended(outcome_of(e), got)
        print("server: %r" % e, file=sys.stderr, flush=True)
    c.close()


def echo_api(c, greet=False, pool=False):
    """echo() through the native API: peeks read in place, claims written
    in place (smclo_api.py) - or, with @pool, the echo sent from a buffer
    pool of the connection."""
    import smclo_api
    got = 0
    sender = smclo_api.Pool(c.fileno()) if pool else None
    send = sender.sendall if sender else (lambda d: smclo_api.sendall(c.fileno(), d))
    try:
        if greet:
            send(b"G")
        while True:
            d = smclo_api.recv(c.fileno())
            if not d:
                break
            got += len(d)
            send(d)
        ended("eof", got)
    except OSError as e:
        ended(outcome_of(e), got)
        print("server: %r" % e, file=sys.stderr, flush=True)
    if sender:
        sender.close()
    c.close()


def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


# ---- event loops ----------------------------------------------------------

OUT_LIMIT = 1 << 20


class Loop:
    """Echo every connection of a non-blocking listener from one thread,
    waiting with @kind: epoll-lt, epoll-et, epoll-oneshot (level-triggered,
    armed again after every event, as thread-pool servers do), poll or
    select."""

    def __init__(self, kind, listener, accepting=True):
        self.kind, self.l = kind, listener
        if accepting:
            self.l.setblocking(False)
        self.conns = {}                 # fd -> [socket, pending output, read done, bytes read]
        self.et = kind == "epoll-et"
        if kind.startswith("epoll"):
            self.ep = select.epoll()
            if accepting:
                self.ep.register(self.l.fileno(), select.EPOLLIN | (select.EPOLLET if self.et else 0))
        self.accepting = accepting

    def add(self, c):
        c.setblocking(False)
        self.conns[c.fileno()] = [c, bytearray(), False, 0]
        if self.kind.startswith("epoll"):
            ev = select.EPOLLIN | select.EPOLLRDHUP
            if self.et:
                ev |= select.EPOLLOUT | select.EPOLLET
            if self.kind == "epoll-oneshot":
                ev |= select.EPOLLONESHOT
            self.ep.register(c.fileno(), ev)

    def drop(self, fd):
        c = self.conns.pop(fd)[0]
        if self.kind.startswith("epoll"):
            self.ep.unregister(fd)
        c.close()

    def want_out(self, fd):
        return bool(self.conns[fd][1])

    def want_in(self, fd):
        """Read no more while OUT_LIMIT bytes wait to go out, as real servers
        do: a client that stops reading must stall the server's writes, not
        fill its memory."""
        st = self.conns[fd]
        return not st[2] and len(st[1]) < OUT_LIMIT

    def relist(self, fd):
        """Level-triggered epoll: ask for EPOLLOUT only while output waits;
        one-shot: arm the registration again (after every event, whatever
        it was)."""
        if self.kind in ("epoll-lt", "epoll-oneshot") and fd in self.conns:
            ev = (select.EPOLLIN if self.want_in(fd) else 0) | select.EPOLLRDHUP | \
                (select.EPOLLOUT if self.want_out(fd) else 0)
            if self.kind == "epoll-oneshot":
                ev |= select.EPOLLONESHOT
            self.ep.modify(fd, ev)

    def accept_all(self):
        while True:
            try:
                c, _ = self.l.accept()
            except BlockingIOError:
                return
            self.add(c)
            if not self.et:
                return

    def handle(self, fd, readable, writable):
        st = self.conns.get(fd)
        if st is None:
            return
        try:
            # edge-triggered: go on until reading or writing would block (the
            # edge after a full buffer is EPOLLOUT's, so read again then)
            while self.pump(st, readable or self.et) and self.et:
                pass
        except OSError as e:
            if not st[2]:
                ended(outcome_of(e), st[3])
            print("server: %r" % e, file=sys.stderr, flush=True)
            self.drop(fd)
            return
        if st[2] and not st[1]:
            self.drop(fd)
        else:
            self.relist(fd)

    def pump(self, st, readable):
        """Read (below OUT_LIMIT) and write what can be; True if both could go
        on without blocking (the read stopped at the limit, the writes did not)."""
        c, out = st[0], st[1]
        more = False
        if readable and self.want_in(c.fileno()):
            more = True
            while len(out) < OUT_LIMIT:
                try:
                    d = c.recv(1 << 16)
                except BlockingIOError:
                    more = False
                    break
                if not d:
                    st[2], more = True, False
                    ended("eof", st[3])
                    break
                st[3] += len(d)
                out.extend(d)
                if not self.et:
                    break
        while out:
            try:
                n = c.send(out)
            except BlockingIOError:
                return False
            del out[:n]
        return more

    def run(self, once=False):
        lfd = self.l.fileno() if self.accepting else -1
        while self.conns or not once:
            if self.kind.startswith("epoll"):
                for fd, ev in self.ep.poll():
                    if fd == lfd:
                        self.accept_all()
                    else:
                        self.handle(fd, ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLRDHUP |
                                              select.EPOLLERR), ev & select.EPOLLOUT)
            elif self.kind == "poll":
                p = select.poll()
                if self.accepting:
                    p.register(lfd, select.POLLIN)
                for fd in self.conns:
                    p.register(fd, (select.POLLIN if self.want_in(fd) else 0) |
                               (select.POLLOUT if self.want_out(fd) else 0))
                for fd, ev in p.poll():
                    if fd == lfd:
                        self.accept_all()
                    else:
                        self.handle(fd, ev & (select.POLLIN | select.POLLHUP | select.POLLERR),
                                    ev & select.POLLOUT)
            else:
                rl = [fd for fd in self.conns if self.want_in(fd)] + ([lfd] if self.accepting else [])
                wl = [fd for fd in self.conns if self.want_out(fd)]
                r, w, _ = select.select(rl, wl, [])
                for fd in set(r) | set(w):
                    if fd == lfd:
                        self.accept_all()
                    else:
                        self.handle(fd, fd in r, fd in w)


def p_loop(kind):
    def run(port, work):
        l = listen(port)
        ready()
        Loop(kind, l).run()
    return run


# ---- one process --------------------------------------------------------

def p_accept(port, work):
    l = listen(port)
    ready()
    while True:
        echo(l.accept()[0])


def p_iouring(on_socket):
    """An io_uring made through liburing.  files: each message is answered
    after a file read through it, the socket through libc (MariaDB's way).
    socket: every read and write of the connection through it (the
    connection moves to TCP first, the ring's bytes answered from it)."""
    def run(port, work):
        import uring_ctypes
        ring = uring_ctypes.Ring()
        page = os.open("/proc/self/exe", os.O_RDONLY)
        l = listen(port)
        ready()
        while True:
            c = l.accept()[0]
            if not on_socket:
                echo(c, each=lambda: ring.read(page, 4096))
                continue
            got = 0
            try:
                while True:
                    d = ring.recv(c.fileno(), 1 << 16)
                    if not d:
                        break
                    got += len(d)
                    while d:
                        d = d[ring.send(c.fileno(), d):]
                ended("eof", got)
            except OSError as e:
                ended(outcome_of(e), got)
                print("server: %r" % e, file=sys.stderr, flush=True)
            c.close()
    return run


def p_defer_after_listen(port, work):
    l = listen(port)
    l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 5)
    ready()
    while True:
        echo(l.accept()[0])


def p_api_accept(port, work):
    l = listen(port)
    ready()
    while True:
        echo_api(l.accept()[0])


def p_pool_accept(port, work):
    l = listen(port)
    ready()
    while True:
        echo_api(l.accept()[0], pool=True)


def fork_echo_api(port, pool):
    """fork per connection, the parent closing its copy at once, the child
    echoing through the native API (from a buffer pool it makes, @pool)."""
    l = listen(port)
    ready()
    while True:
        c, _ = l.accept()
        if os.fork() == 0:
            l.close()
            echo_api(c, greet=True, pool=pool)
            os._exit(0)
        c.close()
        reap()


def p_pool_fork(port, work):
    fork_echo_api(port, True)


def p_api_fork(port, work):
    fork_echo_api(port, False)


def seccomp_allow_all():
    """prctl(PR_SET_SECCOMP) with a filter that allows everything: smclo
    moves every connection to TCP before it applies (core/move.c)."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    insn = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0x7fff0000))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(1, ctypes.addressof(insn))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(prog), 0, 0):
        raise OSError(ctypes.get_errno(), "seccomp")


def p_seccomp_fork(port, work):
    """Fork per connection; the child locks itself down, once the parent
    has let go of the connection, then echoes."""
    l = listen(port)
    ready()
    while True:
        c = l.accept()[0]
        r, w = os.pipe()
        if os.fork() == 0:
            l.close()
            os.close(w)
            os.read(r, 1)
            seccomp_allow_all()
            echo(c)
            os._exit(0)
        c.close()
        os.write(w, b"x")
        os.close(r)
        os.close(w)
        reap()


def p_thread(port, work):
    l = listen(port)
    ready()
    while True:
        c, _ = l.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def p_handoff(port, work):
    q = queue.Queue()

    def worker():
        while True:
            echo(q.get())
    threading.Thread(target=worker, daemon=True).start()
    l = listen(port)
    ready()
    while True:
        q.put(l.accept()[0])


def p_rlimit(n):
    def run(port, work):
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
        p_thread(port, work)
    return run


# ---- fork, prefork ------------------------------------------------------

def p_fork(late):
    def run(port, work):
        l = listen(port)
        ready()
        while True:
            c, _ = l.accept()
            r, w = os.pipe()
            if os.fork() == 0:
                l.close()
                if late:
                    os.close(r)
                    c.sendall(b"G")
                    first = c.recv(1 << 16)     # the client's first bytes came
                    os.write(w, b"x")           # now the parent closes its copy
                    os.close(w)
                    if first:
                        c.sendall(first)
                        echo(c)
                else:
                    os.close(w)
                    os.read(r, 1)               # the parent closed its copy
                    echo(c, greet=True)
                os._exit(0)
            if late:
                os.close(w)
                os.read(r, 1)
                c.close()
                os.close(r)
            else:
                os.close(r)
                c.close()
                os.write(w, b"x")
                os.close(w)
            reap()
    return run


def p_fork_epoll(port, work):
    """PostgreSQL: the postmaster selects on its listener, forks a backend
    per connection and closes its copy at once; the backend reads through
    an epoll set of its own."""
    l = listen(port)
    l.setblocking(False)
    ready()
    while True:
        select.select([l], [], [])
        try:
            c, _ = l.accept()
        except BlockingIOError:
            continue
        if os.fork() == 0:
            l.close()
            lp = Loop("epoll-lt", l, accepting=False)
            lp.add(c)
            lp.run(once=True)
            os._exit(0)
        c.close()
        reap()


def wait_children():
    """Until every child has exited."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def p_prefork(kind, defer=False):
    def run(port, work):
        l = listen(port)
        if defer:
            l.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 5)
        for _ in range(3):
            if os.fork() == 0:
                if kind == "dup0":
                    os.dup2(l.fileno(), 0)
                    l.close()
                    l = socket.socket(fileno=0)
                if kind in ("accept", "dup0"):
                    while True:
                        echo(l.accept()[0])
                Loop(kind, l).run()
                os._exit(0)
        ready()
        wait_children()
    return run


def p_prefork_spawn(port, work):
    l = listen(port)
    os.set_inheritable(l.fileno(), True)
    spawned_r, spawned_w = os.pipe()
    os.set_inheritable(spawned_w, True)
    for _ in range(3):
        if os.fork() == 0:
            pid = os.posix_spawn(sys.executable, [sys.executable, os.path.abspath(__file__),
                                                  "spawned-acceptor", str(l.fileno()),
                                                  str(spawned_w)], os.environ)
            os.waitpid(pid, 0)
            os._exit(0)
    # ready once every program is about to accept: until its child spawned
    # it, a child's entry names the shared inbox (made at the fork), and a
    # client that looked it up then would offer there; and a program still
    # starting answers no rendezvous within its client's timeout
    got = b""
    while len(got) < 3:
        got += os.read(spawned_r, 3 - len(got))
    ready()
    wait_children()


# ---- another process serves the connection -----------------------------

def scm_worker(b):
    """Serve every connection that comes over @b (SCM_RIGHTS), one at a time;
    the message carries what the sender already read from it."""
    while True:
        first, fds, _, _ = socket.recv_fds(b, 1 << 16, 1)
        if not fds:
            return
        c = socket.socket(fileno=fds[0])
        try:
            c.sendall(first[1:])
        except OSError as e:
            print("server: %r" % e, file=sys.stderr, flush=True)
        echo(c, shut=True)
        b.send(b"done")


def p_scm(keep, fresh=False, midstream=False):
    def run(port, work):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if fresh:                       # a program of its own, made before the listener
            subprocess.Popen([sys.executable, __file__, "scm-worker", str(b.fileno())],
                             pass_fds=(b.fileno(),))
        elif os.fork() == 0:            # a fork, made before the listener
            a.close()
            scm_worker(b)
            os._exit(0)
        b.close()
        l = listen(port)
        ready()
        while True:
            c, _ = l.accept()
            # midstream: the request begins here, the worker serves the rest
            first = c.recv(1000) if midstream else b""
            socket.send_fds(a, [b"c" + first], [c.fileno()])
            if keep:
                a.recv(16)              # the worker is done with it
            c.close()
            if not keep:
                a.recv(16)
    return run


CAT = shutil.which("cat")


def p_exec(prog, midstream=False, closer=None):
    def run(port, work):
        argv = [sys.executable, "-c", PYECHO] if prog == "python" else [CAT]
        l = listen(port)
        ready()
        while True:
            c, _ = l.accept()
            if midstream:           # the server answers the first bytes itself
                c.sendall(c.recv(1000))
            if os.fork() == 0:
                os.dup2(c.fileno(), 0)
                os.dup2(c.fileno(), 1)
                c.close()
                l.close()
                close_all_above_stdio(closer)
                os.execv(argv[0], argv)
            c.close()
            reap()
    return run


def close_all_above_stdio(closer):
    """What inetd-style servers do before exec: close every descriptor above
    2, one by one (close) or at once (closerange: close_range(2))."""
    top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if closer == "close":
        for fd in range(3, top):
            try:
                os.close(fd)
            except OSError:
                pass
    elif closer == "closerange":
        os.closerange(3, top)


def p_spawn_cat(port, work):
    l = listen(port)
    ready()
    while True:
        c, _ = l.accept()
        os.posix_spawn(CAT, [CAT], os.environ,
                       file_actions=[(os.POSIX_SPAWN_DUP2, c.fileno(), 0),
                                     (os.POSIX_SPAWN_DUP2, c.fileno(), 1)])
        c.close()
        reap()


def p_subprocess_cat(port, work):
    l = listen(port)
    ready()
    kids = []
    while True:
        c, _ = l.accept()
        kids.append(subprocess.Popen([CAT], stdin=c, stdout=c, close_fds=True))
        c.close()
        kids = [k for k in kids if k.poll() is None]


def p_system_cat(port, work):
    l = listen(port)
    ready()
    while True:
        c, _ = l.accept()
        os.set_inheritable(c.fileno(), True)
        os.system("exec %s <&%d >&%d" % (CAT, c.fileno(), c.fileno()))
        c.close()


def p_helper(how):
    """Per connection a short-lived helper inherits the listener and the
    connection; the server itself echoes (and shuts down before it closes,
    as the helper may still hold the connection)."""
    def run(port, work):
        sleep = shutil.which("sleep")
        l = listen(port)
        os.set_inheritable(l.fileno(), True)
        ready()
        kids = []
        while True:
            c, _ = l.accept()
            if how == "posix_spawn":
                os.set_inheritable(c.fileno(), True)
                os.posix_spawn(sleep, [sleep, "0.3"], os.environ)
            else:
                kids.append(subprocess.Popen([sleep, "0.3"], pass_fds=(l.fileno(), c.fileno())))
            echo(c, shut=True)
            reap()
    return run


# ---- privileges, chroot, daemons ----------------------------------------

def p_drop(what):
    def run(port, work):
        l = listen(port)
        if what == "setuid":
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        elif what == "setgid":
            os.setgid(65534)
        else:
            root = os.path.join(work, "root")
            os.makedirs(root, exist_ok=True)
            os.chroot(root)
            os.chdir("/")
        ready()
        while True:
            echo(l.accept()[0])
    return run


def p_daemon(closer):
    def run(port, work):
        pidfile = os.path.join(work, "pid")
        socket.socket().close()     # smclo is in use before the program daemonizes
        if os.fork():
            deadline = time.monotonic() + 10
            while not os.path.exists(pidfile) and time.monotonic() < deadline:
                time.sleep(0.02)
            ready()
            os._exit(0)
        os.setsid()
        if os.fork():
            os._exit(0)
        os.chdir("/")
        top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if closer == "close":
            for fd in range(top):
                try:
                    os.close(fd)
                except OSError:
                    pass
        else:
            os.closerange(0, top)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        l = listen(port)
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        while True:
            echo(l.accept()[0])
    return run


PATTERNS = {
    "accept": p_accept,
    "defer-after-listen": p_defer_after_listen,
    "iouring-files": p_iouring(on_socket=False),
    "iouring-socket": p_iouring(on_socket=True),
    "api-accept": p_api_accept,
    "api-fork": p_api_fork,
    "pool-accept": p_pool_accept,
    "pool-fork": p_pool_fork,
    "epoll-lt": p_loop("epoll-lt"),
    "epoll-et": p_loop("epoll-et"),
    "epoll-oneshot": p_loop("epoll-oneshot"),
    "poll": p_loop("poll"),
    "select": p_loop("select"),
    "fork-early": p_fork(late=False),
    "fork-late": p_fork(late=True),
    "fork-epoll": p_fork_epoll,
    "prefork": p_prefork("accept"),
    "prefork-epoll": p_prefork("epoll-lt"),
    "prefork-dup0": p_prefork("dup0"),
    "prefork-spawn": p_prefork_spawn,
    "prefork-defer": p_prefork("accept", defer=True),
    "prefork-defer-epoll": p_prefork("epoll-lt", defer=True),
    "thread": p_thread,
    "seccomp-fork": p_seccomp_fork,
    "handoff": p_handoff,
    "scm-keep": p_scm(keep=True),
    "scm-close": p_scm(keep=False),
    "scm-exec": p_scm(keep=False, fresh=True),
    "scm-midstream": p_scm(keep=False, midstream=True),
    "exec-python": p_exec("python"),
    "exec-cat": p_exec("cat"),
    "exec-midstream": p_exec("cat", midstream=True),
    "exec-closeall": p_exec("cat", closer="close"),
    "exec-closerange": p_exec("cat", closer="closerange"),
    "spawn-cat": p_spawn_cat,
    "subprocess-cat": p_subprocess_cat,
    "system-cat": p_system_cat,
    "setuid": p_drop("setuid"),
    "setgid": p_drop("setgid"),
    "chroot": p_drop("chroot"),
    "daemon-close": p_daemon("close"),
    "daemon-closerange": p_daemon("closerange"),
    "rlimit-64": p_rlimit(64),
    "rlimit-256": p_rlimit(256),
    "spawn-helper": p_helper("posix_spawn"),
    "subprocess-helper": p_helper("subprocess"),
}


if __name__ == "__main__":
    if sys.argv[1] == "scm-worker":
        scm_worker(socket.socket(fileno=int(sys.argv[2])))
        sys.exit(0)
    if sys.argv[1] == "spawned-acceptor":        # prefork-spawn's program
        spawned = socket.socket(fileno=int(sys.argv[2]))
        os.write(int(sys.argv[3]), b"s")
        os.close(int(sys.argv[3]))
        while True:
            echo(spawned.accept()[0])
    PATTERNS[sys.argv[1]](int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "/tmp")
