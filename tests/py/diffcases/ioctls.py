"""ioctl() on a connected socket: FIONREAD/SIOCINQ, SIOCOUTQ, SIOCOUTQNSD,
FIONBIO, SIOCATMARK, and requests a TCP socket does not know."""
import fcntl
import os
import socket
import struct
import time

from diffcases import case

FIONREAD = SIOCINQ = 0x541B
SIOCOUTQ = 0x5411
SIOCOUTQNSD = 0x894B
FIONBIO = 0x5421
SIOCATMARK = 0x8905
TIOCGWINSZ = 0x5413


def ioctl_int(e, req, value=0):
    """The int an ioctl fills in (or raises)."""
    buf = fcntl.ioctl(e.sock.fileno(), req, struct.pack("i", value))
    return struct.unpack("i", buf)[0]


def ioctl_rc(e, req, value):
    """What the ioctl system call returns, for requests that only read
    their int argument (FIONBIO)."""
    return fcntl.ioctl(e.sock.fileno(), req, bytearray(struct.pack("i", value)), True)


def nonblocking(e):
    return bool(fcntl.fcntl(e.sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK)


@case
class ioctl_fionread_states:
    """FIONREAD with nothing, with bytes waiting, after a partial read, at
    the end of the bytes."""
    def server(e):
        e.sync("empty")
        e.sock.sendall(b"0123456789")
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.do("nothing", ioctl_int, e, FIONREAD)
        e.sync("empty")
        e.sync("sent")
        e.do("waiting", ioctl_int, e, FIONREAD)
        e.do("siocinq", ioctl_int, e, SIOCINQ)
        e.do("peek", e.sock.recv, 3, socket.MSG_PEEK)
        e.do("after peek", ioctl_int, e, FIONREAD)
        e.do("recv", e.sock.recv, 4)
        e.do("partial", ioctl_int, e, FIONREAD)
        e.do("recv", e.sock.recv, 100)
        e.do("drained", ioctl_int, e, FIONREAD)
        e.sync("read")


@case
class ioctl_fionread_after_fin:
    """The FIN takes no place in FIONREAD: bytes before it, then 0."""
    def server(e):
        e.sock.sendall(b"abc")
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")
        e.sync("read")

    def client(e):
        e.sync("shut")
        e.do("before read", ioctl_int, e, FIONREAD)
        e.do("recv", e.sock.recv, 100)
        e.do("at eof", ioctl_int, e, FIONREAD)
        e.do("eof", e.sock.recv, 100)
        e.do("after eof", ioctl_int, e, FIONREAD)
        e.sync("read")


@case
class ioctl_fionread_after_close:
    """FIONREAD after the peer closed, bytes still waiting."""
    def server(e):
        e.sock.sendall(b"x" * 100)
        e.sock.close()
        e.sync("closed")

    def client(e):
        e.sync("closed")
        e.do("waiting", ioctl_int, e, FIONREAD)
        e.do("recv", e.sock.recv, 60)
        e.do("partial", ioctl_int, e, FIONREAD)
        e.recv_all()
        e.do("at eof", ioctl_int, e, FIONREAD)


@case
class ioctl_outq_unread:
    """SIOCOUTQ/SIOCOUTQNSD after sending bytes the peer has not read (on
    loopback they are acked at once: both 0)."""
    def server(e):
        e.do("outq before", ioctl_int, e, SIOCOUTQ)
        e.do("nsd before", ioctl_int, e, SIOCOUTQNSD)
        e.sock.sendall(b"0123456789")
        e.sync("sent")
        time.sleep(0.1)
        e.do("outq", ioctl_int, e, SIOCOUTQ)
        e.do("nsd", ioctl_int, e, SIOCOUTQNSD)
        e.sync("looked")
        e.sync("read")
        e.do("outq read", ioctl_int, e, SIOCOUTQ)
        e.do("nsd read", ioctl_int, e, SIOCOUTQNSD)

    def client(e):
        e.sync("sent")
        e.do("inq", ioctl_int, e, FIONREAD)
        e.sync("looked")
        e.do("recv", e.sock.recv, 100)
        e.sync("read")


@case
class ioctl_outq_peer_window_full:
    """The peer reads nothing until the sender's writes block; when all is
    read, SIOCOUTQ and SIOCOUTQNSD are 0.  While it is full, how many bytes
    wait unacknowledged depends on both ends' buffer sizes (which differ
    between hosts and between smclo's ring and TCP's queues), so only their
    order is compared."""
    def server(e):
        e.sock.setblocking(False)
        sent = 0
        try:
            while sent < 64 << 20:
                sent += e.sock.send(b"z" * 65536)
        except BlockingIOError:
            pass
        e.log("filled", 0 < sent < 64 << 20)
        e.sync("full")
        e.do("outq >= nsd", lambda: ioctl_int(e, SIOCOUTQ) >= ioctl_int(e, SIOCOUTQNSD))
        e.sync("looked")
        e.sock.setblocking(True)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("read")
        time.sleep(0.1)
        e.do("outq read", ioctl_int, e, SIOCOUTQ)
        e.do("nsd read", ioctl_int, e, SIOCOUTQNSD)

    def client(e):
        e.sync("full")
        e.do("inq > 0", lambda: ioctl_int(e, FIONREAD) > 0)
        e.sync("looked")
        n = 0
        while True:
            d = e.sock.recv(1 << 20)
            if not d:
                break
            n += len(d)
        e.log("read all", n > 0)
        e.sync("read")


@case
class ioctl_fionbio_on_off:
    """FIONBIO 1: recv fails with EAGAIN (and F_GETFL shows O_NONBLOCK);
    FIONBIO 0: a recv blocks until the peer sends."""
    def server(e):
        e.sync("nonblocking")
        e.sync("blocking")
        time.sleep(0.3)
        e.sock.sendall(b"late")
        e.sync("done")

    def client(e):
        e.do("fionbio 1", ioctl_rc, e, FIONBIO, 1)
        e.do("O_NONBLOCK", nonblocking, e)
        e.do("recv", e.sock.recv, 10, timed=True)
        e.do("send", e.sock.send, b"ok")
        e.sync("nonblocking")
        e.do("fionbio 0", ioctl_rc, e, FIONBIO, 0)
        e.do("O_NONBLOCK", nonblocking, e)
        e.sync("blocking")
        e.do("recv", e.sock.recv, 10, timed=True)
        e.sync("done")
        e.do("fionbio 7", ioctl_rc, e, FIONBIO, 7)
        e.do("O_NONBLOCK", nonblocking, e)
        e.do("recv", e.sock.recv, 10, timed=True)


@case
class ioctl_fionbio_and_fcntl:
    """FIONBIO and fcntl(O_NONBLOCK) set the same flag."""
    def server(e):
        e.sync("done")

    def client(e):
        fd = e.sock.fileno()
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        e.do("recv after fcntl", e.sock.recv, 10)
        e.do("fionbio 0", ioctl_rc, e, FIONBIO, 0)
        e.do("O_NONBLOCK", nonblocking, e)
        e.do("fionbio 1", ioctl_rc, e, FIONBIO, 1)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl)
        e.do("O_NONBLOCK after fcntl", nonblocking, e)
        e.do("recv dontwait", e.sock.recv, 10, socket.MSG_DONTWAIT)
        e.sync("done")


@case
class ioctl_siocatmark_no_urgent:
    """SIOCATMARK is 0 with no urgent data, with or without bytes waiting."""
    def server(e):
        e.do("atmark", ioctl_int, e, SIOCATMARK)
        e.sync("empty")
        e.sock.sendall(b"plain")
        e.sync("sent")

    def client(e):
        e.do("atmark empty", ioctl_int, e, SIOCATMARK)
        e.sync("empty")
        e.sync("sent")
        e.do("atmark data", ioctl_int, e, SIOCATMARK)
        e.do("recv", e.sock.recv, 10)
        e.do("atmark drained", ioctl_int, e, SIOCATMARK)


@case
class ioctl_unknown_requests:
    """Requests a TCP socket does not serve: their errno."""
    def server(e):
        e.sync("done")

    def client(e):
        for label, req in (("0x1234", 0x1234), ("siocXff", 0x89FF), ("tiocgwinsz", TIOCGWINSZ),
                           ("siocgstamp", 0x8906), ("siocgifindex-bogus", 0x8933)):
            e.do(label, ioctl_int, e, req)
        e.do("fionread still", ioctl_int, e, FIONREAD)
        e.sync("done")


@case
class ioctl_fionread_large:
    """FIONREAD with much waiting is > 0 and never more than was sent; the
    sum of reads is what was sent."""
    def server(e):
        e.sock.sendall(bytes(range(256)) * 256)
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        n = ioctl_int(e, FIONREAD)
        e.log("waiting", n)
        got = b""
        while len(got) < 65536:
            got += e.sock.recv(65536)
        e.log("got", got)
        e.do("after", ioctl_int, e, FIONREAD)
        e.sync("read")
