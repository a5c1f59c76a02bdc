"""Descriptors: dup, dup2/dup3, fcntl F_DUPFD(_CLOEXEC), flags shared by
duplicates, fork (child and parent both holding the connection), exec
with the connection inherited, SCM_RIGHTS, close-on-exec after accept."""
import fcntl
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time

from diffcases import case

IN_OR_HUP = select.POLLIN | select.POLLRDHUP


def fd_flags(fd):
    return fcntl.fcntl(fd, fcntl.F_GETFD)


def take_all(e, label="got", sock=None):
    """Read what is there without waiting; log it and how it ended."""
    s = sock or e.sock
    got = b""
    while True:
        try:
            d = s.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            end = "EAGAIN"
            break
        if not d:
            end = "eof"
            break
        got += d
    e.log(label, got, end)


# -- fork helpers ----------------------------------------------------------------

def fork_child(e, fn, *args):
    """Run fn(e, *args) in a forked child.  What the child logs comes back
    over a pipe and goes into the trace when the parent collects it, so
    the trace's order does not depend on scheduling."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(10)
        entries, code = [], 0
        e.log = lambda *entry: entries.append(entry)
        try:
            fn(e, *args)
        except BaseException as ex:      # noqa: B902 - the child never returns
            entries.append(("raised", repr(ex)))
            code = 1
        try:
            data = memoryview(pickle.dumps(entries))
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def collect(e, child):
    """Wait for the child; log what it logged and how it ended."""
    pid, r = child
    data = b""
    while True:
        d = os.read(r, 65536)
        if not d:
            break
        data += d
    os.close(r)
    _, status = os.waitpid(pid, 0)
    for entry in pickle.loads(data) if data else []:
        e.log("child", *entry)
    e.log("child-exit", os.waitstatus_to_exitcode(status))


# -- dup -----------------------------------------------------------------------

@case
class dup_then_close_original:
    """Closing the original after a dup ends nothing: no FIN, and the
    duplicate goes on with the connection."""
    def server(e):
        d = os.dup(e.sock.fileno())
        e.sock.close()
        e.sync("closed")
        e.sync("looked")
        e.do("write-dup", os.write, d, b"via dup")
        e.sync("sent")
        e.sync("replied")
        e.do("read-dup", os.read, d, 100)
        os.close(d)
        e.sync("closed-dup")

    def client(e):
        e.sync("closed")
        e.poll("poll", IN_OR_HUP, 100)
        e.sync("looked")
        e.sync("sent")
        e.do("recv", e.sock.recv, 100)
        e.sock.sendall(b"back")
        e.sync("replied")
        e.sync("closed-dup")
        e.poll("poll", IN_OR_HUP, 100)
        e.do("recv", e.sock.recv, 100)


@case
class close_dup_while_original_in_use:
    """A thread blocks in recv on the original while another closes a
    duplicate: the recv goes on and gets the peer's bytes."""
    def server(e):
        d = os.dup(e.sock.fileno())
        got = []
        th = e.thread(lambda: got.append(e.call(e.sock.recv, 100)[0]))
        e.sync("reading")
        os.close(d)
        e.sync("closed-dup")
        e.sync("sent")
        th.join(5)
        e.log("thread-recv", got)
        e.do("send", e.sock.send, b"reply")
        e.sync("replied")

    def client(e):
        e.sync("reading")
        e.sync("closed-dup")
        e.poll("poll", IN_OR_HUP, 100)
        e.sock.sendall(b"wake")
        e.sync("sent")
        e.sync("replied")
        e.do("recv", e.sock.recv, 100)


@case
class shutdown_rdwr_through_dup:
    """shutdown() acts on the connection, not the descriptor: after
    SHUT_RDWR through a duplicate the original reads the end and cannot
    send, before and after the duplicate is closed.  (Bytes the peer sends
    afterwards reset the connection: shutdown.py, shut-rdwr-both-ends-see.)"""
    def server(e):
        ds = socket.socket(fileno=os.dup(e.sock.fileno()))
        e.do("shutdown-dup", ds.shutdown, socket.SHUT_RDWR)
        e.poll("poll-original", select.POLLIN | select.POLLOUT | IN_OR_HUP, 0)
        e.do("recv-original", e.sock.recv, 100, timed=True)
        e.do("send-original", e.sock.send, b"x")
        e.log_signals()
        e.sync("shut")
        e.sync("looked")
        ds.close()
        e.poll("poll-original", select.POLLIN | select.POLLOUT | IN_OR_HUP, 0)
        e.do("recv-original", e.sock.recv, 100, timed=True)
        e.do("send-original", e.sock.send, b"x", socket.MSG_NOSIGNAL)
        e.do("shutdown-original", e.sock.shutdown, socket.SHUT_RDWR)
        e.sync("closed-dup")

    def client(e):
        e.sync("shut")
        e.poll("poll", IN_OR_HUP, 100)
        e.do("recv", e.sock.recv, 100)
        e.sync("looked")
        e.sync("closed-dup")
        e.poll("poll", IN_OR_HUP | select.POLLOUT, 0)


@case
class dup2_onto_another_number:
    def server(e):
        fd = e.sock.fileno()
        spare = os.open("/dev/null", os.O_RDONLY)
        other = os.open("/dev/null", os.O_RDONLY)
        e.log("dup2", os.dup2(fd, spare) == spare)
        e.log("cloexec", fd_flags(spare))
        e.log("dup3-cloexec", os.dup2(fd, other, inheritable=False) == other)
        e.log("cloexec", fd_flags(other))
        e.log("dup2-self", os.dup2(spare, spare) == spare)
        e.sock.close()
        os.close(other)
        e.do("write", os.write, spare, b"through dup2")
        e.sync("sent")
        e.sync("replied")
        e.do("read", os.read, spare, 100)
        e.sync("looked")
        os.close(spare)
        e.sync("closed")

    def client(e):
        e.sync("sent")
        e.do("recv", e.sock.recv, 100)
        e.sock.sendall(b"back")
        e.sync("replied")
        e.poll("poll", IN_OR_HUP, 100)
        e.sync("looked")
        e.sync("closed")
        e.do("recv", e.sock.recv, 100)


@case
class fcntl_dupfd_and_cloexec:
    def server(e):
        fd = e.sock.fileno()
        n = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
        m = fcntl.fcntl(fd, fcntl.F_DUPFD, 200)
        e.log("numbers", n >= 100, m >= 200)
        e.log("getfd", fd_flags(fd), fd_flags(n), fd_flags(m))
        e.log("getfl", fcntl.fcntl(n, fcntl.F_GETFL) == fcntl.fcntl(fd, fcntl.F_GETFL))
        e.do("write-n", os.write, n, b"n;")
        e.do("write-m", os.write, m, b"m;")
        e.sock.close()
        os.close(n)
        e.sync("closed-two")
        e.sync("looked")
        os.close(m)
        e.sync("closed-all")

    def client(e):
        e.sync("closed-two")
        take_all(e)
        e.poll("poll", IN_OR_HUP, 100)
        e.sync("looked")
        e.sync("closed-all")
        e.do("recv", e.sock.recv, 100)


@case
class nonblock_set_through_dup:
    """O_NONBLOCK belongs to the open file description, which a duplicate
    shares."""
    def server(e):
        fd = e.sock.fileno()
        d = os.dup(fd)
        fl = fcntl.fcntl(d, fcntl.F_GETFL)
        fcntl.fcntl(d, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        e.log("original-nonblock", bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK))
        e.do("read-original", os.read, fd, 100, timed=True)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl)
        e.log("dup-nonblock", bool(fcntl.fcntl(d, fcntl.F_GETFL) & os.O_NONBLOCK))
        os.close(d)
        e.sync("start")
        e.do("read-original", os.read, fd, 100, timed=True)

    def client(e):
        e.sync("start")
        time.sleep(0.4)
        e.sock.sendall(b"late")


# -- fork ----------------------------------------------------------------------

@case
class fork_child_writes_parent_reads:
    def server(e):
        def child(e):
            e.do("send", e.sock.send, b"from the child")
        collect(e, fork_child(e, child))
        e.sync("child-sent")
        e.do("recv", e.sock.recv, 100)
        e.do("send", e.sock.send, b"from the parent")
        e.sync("done")

    def client(e):
        e.sync("child-sent")
        e.do("recv", e.sock.recv, 100)
        e.sock.sendall(b"reply")
        e.sync("done")
        e.do("recv", e.sock.recv, 100)


@case
class fork_parent_closes_child_goes_on:
    """The parent closes its copy at once (a forking server); the child
    serves the connection, and the peer sees the end when the child exits."""
    def server(e):
        def child(e):
            e.do("recv", e.sock.recv, 100)
            e.do("send", e.sock.send, b"pong")
            e.sock.close()
        kid = fork_child(e, child)
        e.sock.close()
        e.sync("parent-closed")
        collect(e, kid)
        e.sync("done")

    def client(e):
        e.sync("parent-closed")
        e.poll("poll", IN_OR_HUP, 100)
        e.sock.sendall(b"ping")
        e.do("recv", e.sock.recv, 100)
        e.do("recv-end", e.sock.recv, 100, timed=True)
        e.sync("done")


def both_close(child_first):
    def server(e):
        go_r, go_w = os.pipe()

        def child(e):
            if not child_first:
                os.read(go_r, 1)
            e.sock.close()
            e.log("closed")
        kid = fork_child(e, child)
        os.close(go_r)
        if child_first:
            collect(e, kid)
        else:
            e.sock.close()
        e.sync("one-closed")
        e.sync("looked")
        if child_first:
            e.sock.close()
        else:
            os.write(go_w, b"!")
            collect(e, kid)
        os.close(go_w)
        e.sync("both-closed")

    def client(e):
        e.sync("one-closed")
        e.poll("poll", IN_OR_HUP, 100)
        e.do("recv", e.sock.recv, 100, socket.MSG_DONTWAIT)
        e.sync("looked")
        e.sync("both-closed")
        e.poll("poll", IN_OR_HUP, 100)
        e.do("recv", e.sock.recv, 100)
    return server, client


@case
class fork_both_close_child_first:
    """The peer sees the end only once both processes closed."""
    server, client = map(staticmethod, both_close(True))


@case
class fork_both_close_parent_first:
    server, client = map(staticmethod, both_close(False))


# -- exec ----------------------------------------------------------------------

EXEC_CHILD = r'''
import fcntl, os, socket, sys
fd = int(sys.argv[1])
print("cloexec", fcntl.fcntl(fd, fcntl.F_GETFD))
s = socket.socket(fileno=fd)
print("socket", s.family == socket.AF_INET, s.type == socket.SOCK_STREAM)
q = s.recv(100)
print("read", q)
s.sendall(b"answer to " + q)
print("sent")
'''


def log_exec(e, rc, out, err):
    e.log("exec", rc, out.decode().splitlines(), err.decode()[-400:])


@case
class exec_child_uses_inherited_connection:
    """A python run with the connection in pass_fds reads from it and
    answers; the parent keeps its copy and goes on."""
    def server(e):
        fd = e.sock.fileno()
        e.sync("asked")
        p = subprocess.run([sys.executable, "-c", EXEC_CHILD, str(fd)], pass_fds=[fd],
                           capture_output=True, timeout=10)
        log_exec(e, p.returncode, p.stdout, p.stderr)
        e.do("send", e.sock.send, b"; parent still here")
        e.sync("answered")
        e.sync("looked")
        e.do("recv", e.sock.recv, 100)

    def client(e):
        e.sock.sendall(b"question")
        e.sync("asked")
        e.sync("answered")
        take_all(e)
        e.poll("poll", IN_OR_HUP, 100)
        e.sock.sendall(b"last")
        e.sync("looked")


@case
class exec_handler_after_parent_closes:
    """inetd-style: the parent starts the handler and closes its copy; the
    handler's exit ends the connection."""
    def server(e):
        fd = e.sock.fileno()
        p = subprocess.Popen([sys.executable, "-c", EXEC_CHILD, str(fd)], pass_fds=[fd],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        e.sock.close()
        e.sync("closed")
        out, err = p.communicate(timeout=10)
        log_exec(e, p.returncode, out, err)
        e.sync("done")

    def client(e):
        e.sync("closed")
        e.sock.sendall(b"question")
        e.do("recv", e.sock.recv, 100)
        e.do("recv-end", e.sock.recv, 100, timed=True)
        e.sync("done")


# -- SCM_RIGHTS ----------------------------------------------------------------

@case
class scm_rights_to_another_process:
    """The connection is passed over an AF_UNIX socketpair made before the
    fork; the parent closes its copy once sent, the receiver serves it."""
    def server(e):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        def child(e):
            a.close()
            msg, fds, flags, _ = socket.recv_fds(b, 100, 4)
            e.log("received", msg, len(fds), flags)
            s = socket.socket(fileno=fds[0])
            e.log("socket", s.family == socket.AF_INET, s.type == socket.SOCK_STREAM)
            e.log("cloexec", fd_flags(s.fileno()))
            e.do("recv", s.recv, 100)
            e.do("send", s.send, b"from the receiver")
            s.close()
        kid = fork_child(e, child)
        b.close()
        e.do("send_fds", socket.send_fds, a, [b"conn"], [e.sock.fileno()])
        e.sock.close()
        e.sync("passed")
        collect(e, kid)
        a.close()
        e.sync("done")

    def client(e):
        e.sync("passed")
        e.sock.sendall(b"hi")
        e.do("recv", e.sock.recv, 100)
        e.do("recv-end", e.sock.recv, 100, timed=True)
        e.sync("done")


# -- close-on-exec ---------------------------------------------------------------

@case
class cloexec_after_accept:
    """Python accepts with accept4(SOCK_CLOEXEC) and makes sockets with
    SOCK_CLOEXEC; set_inheritable flips FD_CLOEXEC."""
    def server(e):
        fd = e.sock.fileno()
        e.log("accepted", fd_flags(fd), e.sock.get_inheritable(), fcntl.fcntl(fd, fcntl.F_GETFL))
        e.log("listener", fd_flags(e.listener.fileno()))
        os.set_inheritable(fd, True)
        e.log("inheritable", fd_flags(fd), os.get_inheritable(fd))
        os.set_inheritable(fd, False)
        e.log("not-inheritable", fd_flags(fd), os.get_inheritable(fd))
        fcntl.fcntl(fd, fcntl.F_SETFD, 0)
        e.log("setfd-0", fd_flags(fd), e.sock.get_inheritable())
        e.do("send", e.sock.send, b"ok")
        e.sync("done")

    def client(e):
        fd = e.sock.fileno()
        e.log("connected", fd_flags(fd), e.sock.get_inheritable(), fcntl.fcntl(fd, fcntl.F_GETFL))
        e.sync("done")
        e.do("recv", e.sock.recv, 100)
