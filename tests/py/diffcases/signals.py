"""Signals a connection raises: SIGIO with O_ASYNC and F_SETOWN (bytes, the
peer's shutdown and close, F_SETSIG), the owner read back, SIGPIPE on a
write that fails with EPIPE (each way of writing, MSG_NOSIGNAL), SIGURG
when urgent data arrives."""
import fcntl
import os
import select
import signal
import socket
import struct
import threading
import time

from diffcases import case

F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
F_GETSIG = getattr(fcntl, "F_GETSIG", 11)
F_SETOWN_EX, F_GETOWN_EX = 15, 16
F_OWNER_TID, F_OWNER_PID, F_OWNER_PGRP = 0, 1, 2
FIOSETOWN = 0x8901
SIOCSPGRP = 0x8902
FIOGETOWN = 0x8903
SIOCGPGRP = 0x8904


def own(e, pid=None):
    fcntl.fcntl(e.sock.fileno(), fcntl.F_SETOWN, os.getpid() if pid is None else pid)


def set_async(e, on=True):
    fd = e.sock.fileno()
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, (fl | os.O_ASYNC) if on else (fl & ~os.O_ASYNC))


def getown_ex(fd):
    return struct.unpack("ii", fcntl.fcntl(fd, F_GETOWN_EX, b"\0" * 8))


def disarm(e):
    """No more SIGIO for this socket: at the end the interpreter restores
    SIGIO's default action (which kills) while the connection still
    closes."""
    set_async(e, False)
    own(e, 0)


def log_signal_set(e, label):
    """The signals received, each once and sorted: how many times a signal
    that stays pending is delivered, and in which order two arrive, is up
    to timing."""
    got, e.signals = e.signals, []
    e.log(label, sorted(set(got)))


# -- SIGIO ---------------------------------------------------------------------

@case
class sigio_on_data:
    def server(e):
        e.sync("armed")
        e.sock.sendall(b"abc")
        e.sync("sent")
        e.sync("read")
        e.sock.sendall(b"def")
        e.sync("sent again")

    def client(e):
        own(e)
        set_async(e)
        e.log_signals("armed")
        e.sync("armed")
        e.sync("sent")
        e.log_signals("after data")
        e.do("recv", e.sock.recv, 10)
        e.log_signals("after recv")
        e.sync("read")
        e.sync("sent again")
        e.log_signals("after more data")
        e.do("recv", e.sock.recv, 10)
        disarm(e)


@case
class sigio_on_peer_shutdown:
    def server(e):
        e.sync("armed")
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")

    def client(e):
        own(e)
        set_async(e)
        e.sync("armed")
        e.sync("shut")
        e.log_signals("after shutdown")
        e.do("recv", e.sock.recv, 10)
        e.log_signals("after eof")
        disarm(e)


@case
class sigio_on_peer_close:
    def server(e):
        e.sync("armed")
        e.sock.close()
        e.sync("closed")

    def client(e):
        own(e)
        set_async(e)
        e.sync("armed")
        e.sync("closed")
        e.log_signals("after close")
        e.do("recv", e.sock.recv, 10)
        e.log_signals("after eof")
        disarm(e)


@case
class sigio_needs_owner_and_async:
    """O_ASYNC without an owner, or an owner without O_ASYNC: no SIGIO."""
    def server(e):
        e.sync("async only")
        e.sock.sendall(b"one")
        e.sync("sent one")
        e.sync("owner only")
        e.sock.sendall(b"two")
        e.sync("sent two")

    def client(e):
        set_async(e)
        e.sync("async only")
        e.sync("sent one")
        e.log_signals("async, no owner")
        e.do("recv", e.sock.recv, 10)
        set_async(e, False)
        own(e)
        e.sync("owner only")
        e.sync("sent two")
        e.log_signals("owner, no async")
        e.do("recv", e.sock.recv, 10)
        disarm(e)


@case
class sigio_async_off_again:
    """Clearing O_ASYNC stops SIGIO."""
    def server(e):
        e.sync("armed")
        e.sock.sendall(b"one")
        e.sync("sent one")
        e.sync("disarmed")
        e.sock.sendall(b"two")
        e.sync("sent two")

    def client(e):
        own(e)
        set_async(e)
        e.sync("armed")
        e.sync("sent one")
        e.log_signals("armed")
        e.do("O_ASYNC", lambda: bool(fcntl.fcntl(e.sock.fileno(), fcntl.F_GETFL) & os.O_ASYNC))
        set_async(e, False)
        e.do("O_ASYNC", lambda: bool(fcntl.fcntl(e.sock.fileno(), fcntl.F_GETFL) & os.O_ASYNC))
        e.sync("disarmed")
        e.sync("sent two")
        e.log_signals("disarmed")
        e.do("recv", e.sock.recv, 10)


@case
class sigio_none_after_disarm:
    """O_ASYNC cleared and the owner reset: bytes, the peer's shutdown and
    close raise no signal."""
    def server(e):
        e.sync("armed")
        e.sock.sendall(b"one")
        e.sync("sent")
        e.sync("disarmed")
        e.sock.sendall(b"two")
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")
        e.sock.close()
        e.sync("closed")

    def client(e):
        own(e)
        set_async(e)
        e.sync("armed")
        e.sync("sent")
        e.log_signals("armed")
        disarm(e)
        e.do("getown", fcntl.fcntl, e.sock.fileno(), fcntl.F_GETOWN)
        e.sync("disarmed")
        e.sync("shut")
        e.log_signals("after shutdown")
        e.sync("closed")
        e.do("recv", e.sock.recv, 10)
        e.do("recv", e.sock.recv, 10)
        time.sleep(0.2)
        e.log_signals("after close")


@case
class sigio_on_write_space:
    """A writer whose send failed with EAGAIN gets SIGIO when the peer
    reads and room comes back."""
    def server(e):
        e.sock.setblocking(False)
        try:
            while True:
                e.sock.send(b"w" * 65536)
        except BlockingIOError:
            e.log("full")
        own(e)
        set_async(e)
        # the kernel notes a writer waiting for room (for SIGIO) only on a
        # send that fails while O_ASYNC is on
        e.do("send armed", e.sock.send, b"w")
        e.log_signals("armed")
        e.sync("full")
        e.sync("drained")
        log_signal_set(e, "after peer read")
        disarm(e)
        e.sock.setblocking(True)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")

    def client(e):
        e.sync("full")
        p = select.poll()
        p.register(e.sock, select.POLLIN)
        while p.poll(200):      # everything the writer queued
            e.sock.recv(1 << 20)
        e.sync("drained")
        e.sync("shut")
        while e.sock.recv(1 << 20):
            pass


@case
class sigio_f_setsig:
    """F_SETSIG chooses the signal O_ASYNC raises."""
    def server(e):
        e.sync("armed")
        e.sock.sendall(b"abc")
        e.sync("sent")

    def client(e):
        signal.signal(signal.SIGUSR1, e.on_signal)
        own(e)
        e.do("setsig", fcntl.fcntl, e.sock.fileno(), F_SETSIG, signal.SIGUSR1)
        e.do("getsig is SIGUSR1", lambda: fcntl.fcntl(e.sock.fileno(), F_GETSIG) == signal.SIGUSR1)
        set_async(e)
        e.sync("armed")
        e.sync("sent")
        e.log_signals("after data")
        e.do("recv", e.sock.recv, 10)
        disarm(e)


@case
class fcntl_owner_readback:
    """F_GETOWN: none, our pid, our process group (negative); the ioctls
    that set and read the same owner."""
    def server(e):
        e.sync("done")

    def client(e):
        fd = e.sock.fileno()
        e.do("getown", fcntl.fcntl, fd, fcntl.F_GETOWN)
        e.do("setown pid", fcntl.fcntl, fd, fcntl.F_SETOWN, os.getpid())
        e.do("getown is pid", lambda: fcntl.fcntl(fd, fcntl.F_GETOWN) == os.getpid())
        e.do("getown_ex is pid", lambda: getown_ex(fd) == (F_OWNER_PID, os.getpid()))
        # F_GETOWN of a process group is negative, which glibc takes for an error
        e.do("setown -pgrp", fcntl.fcntl, fd, fcntl.F_SETOWN, -os.getpgrp())
        e.do("getown_ex is pgrp", lambda: getown_ex(fd) == (F_OWNER_PGRP, os.getpgrp()))
        e.do("setown no such pid", fcntl.fcntl, fd, fcntl.F_SETOWN, 4194303)
        e.do("getown_ex after", lambda: getown_ex(fd) == (F_OWNER_PGRP, os.getpgrp()))
        e.do("setown_ex tid", lambda: fcntl.fcntl(fd, F_SETOWN_EX, struct.pack(
            "ii", F_OWNER_TID, threading.get_native_id())) and None)
        e.do("getown_ex is tid", lambda: getown_ex(fd) == (F_OWNER_TID, threading.get_native_id()))
        e.do("getown is tid", lambda: fcntl.fcntl(fd, fcntl.F_GETOWN) == threading.get_native_id())

        def ioctl_get(req):
            return struct.unpack("i", fcntl.ioctl(fd, req, b"\0" * 4))[0]

        def ioctl_set(req, v):
            fcntl.ioctl(fd, req, struct.pack("i", v))

        e.do("siocspgrp pid", ioctl_set, SIOCSPGRP, os.getpid())
        e.do("getown is pid", lambda: fcntl.fcntl(fd, fcntl.F_GETOWN) == os.getpid())
        e.do("siocgpgrp is pid", lambda: ioctl_get(SIOCGPGRP) == os.getpid())
        e.do("fiosetown 0", ioctl_set, FIOSETOWN, 0)
        e.do("fiogetown", ioctl_get, FIOGETOWN)
        e.do("getown", fcntl.fcntl, fd, fcntl.F_GETOWN)
        e.sync("done")


# -- SIGPIPE -------------------------------------------------------------------

def write_every_way(e, tag=""):
    """Each way of writing to a socket that fails with EPIPE, the signals
    after each."""
    fd = e.sock.fileno()
    ways = [
        ("send", lambda: e.sock.send(b"x")),
        ("send nosignal", lambda: e.sock.send(b"x", socket.MSG_NOSIGNAL)),
        ("os.write", lambda: os.write(fd, b"x")),
        ("sendmsg", lambda: e.sock.sendmsg([b"x"])),
        ("sendmsg nosignal", lambda: e.sock.sendmsg([b"x"], [], socket.MSG_NOSIGNAL)),
        ("sendto", lambda: e.sock.sendto(b"x", ("127.0.0.1", 9))),
        ("os.writev", lambda: os.writev(fd, [b"x", b"y"])),
        ("send empty", lambda: e.sock.send(b"")),
    ]
    for label, fn in ways:
        e.do(tag + label, fn)
        e.log_signals(tag + label + " signals")


@case
class sigpipe_after_own_shut_wr:
    """After shutdown(SHUT_WR) by this end, every write fails with EPIPE
    and raises SIGPIPE unless MSG_NOSIGNAL."""
    def server(e):
        e.sync("shut")
        e.recv_all()
        e.sync("read")

    def client(e):
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")
        write_every_way(e)
        e.sync("read")


@case
class sigpipe_after_peer_reset:
    """The peer reset the connection: the first send reports ECONNRESET
    (no signal), the next ones EPIPE with SIGPIPE."""
    def server(e):
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        e.sock.close()
        e.sync("reset")

    def client(e):
        e.sync("reset")
        write_every_way(e)
        e.do("recv", e.sock.recv, 10)


@case
class sigpipe_after_peer_reset_read_first:
    """The reset read first (ECONNRESET from recv): then each write EPIPE."""
    def server(e):
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        e.sock.close()
        e.sync("reset")

    def client(e):
        e.sync("reset")
        e.do("recv", e.sock.recv, 10)
        e.do("recv", e.sock.recv, 10)
        write_every_way(e)


@case
class sigpipe_after_peer_close_os_write:
    """The peer closed: a first write is accepted (and reset), the next
    ones fail - os.write and sendmsg, which have no flag, and with it."""
    def server(e):
        e.sock.close()
        e.sync("closed")

    def client(e):
        e.sync("closed")
        e.do("os.write", os.write, e.sock.fileno(), b"first")
        e.log_signals("after first")
        write_every_way(e)


@case
class sigpipe_not_on_shut_rd:
    """shutdown(SHUT_RD) of this end does not stop writes."""
    def server(e):
        e.sync("shut")
        e.do("recv", e.sock.recv, 10)

    def client(e):
        e.sock.shutdown(socket.SHUT_RD)
        e.do("send", e.sock.send, b"still")
        e.log_signals("after send")
        e.sync("shut")


# -- SIGURG --------------------------------------------------------------------

@case
class sigurg_with_owner:
    def server(e):
        e.sync("owned")
        e.do("send oob", e.sock.send, b"!", socket.MSG_OOB)
        e.sync("sent")

    def client(e):
        own(e)
        e.sync("owned")
        e.sync("sent")
        e.log_signals("after urgent")
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.log_signals("after oob read")


@case
class sigurg_without_owner:
    def server(e):
        e.do("send oob", e.sock.send, b"!", socket.MSG_OOB)
        e.sync("sent")

    def client(e):
        e.sync("sent")
        e.log_signals("after urgent")
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)


@case
class sigurg_and_sigio:
    """Urgent data with O_ASYNC on: SIGURG, and SIGIO for the bytes."""
    def server(e):
        e.sync("armed")
        e.do("send", e.sock.send, b"ab")
        e.sync("plain")
        e.sync("looked")
        e.do("send oob", e.sock.send, b"c!", socket.MSG_OOB)
        e.sync("sent")

    def client(e):
        own(e)
        set_async(e)
        e.sync("armed")
        e.sync("plain")
        log_signal_set(e, "after plain bytes")
        e.sync("looked")
        e.sync("sent")
        log_signal_set(e, "after urgent")
        e.do("recv", e.sock.recv, 10)
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.do("rest", e.sock.recv, 10, socket.MSG_DONTWAIT)
        disarm(e)
