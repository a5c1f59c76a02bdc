"""Urgent data: MSG_OOB, SO_OOBINLINE, SIOCATMARK, POLLPRI and select's
exception set.  Under smclo sending urgent data moves the connection to
TCP (docs/design.md §5b); what follows is TCP's own."""
import fcntl
import select
import socket
import struct
import time

from diffcases import case

SIOCATMARK = 0x8905


def atmark(e):
    return struct.unpack("i", fcntl.ioctl(e.sock.fileno(), SIOCATMARK, b"\0" * 4))[0]


def sends_urgent(e):
    e.sock.sendall(b"abc")
    e.do("send-oob", e.sock.send, b"!", socket.MSG_OOB)
    e.sock.sendall(b"def")
    e.sync("sent")
    e.sync("read")
    e.do("recv", e.sock.recv, 10)


@case
class urgent_byte:
    def server(e):
        e.sync("sent")
        e.poll("poll", select.POLLIN | select.POLLPRI, 1000)
        e.log("atmark", atmark(e))
        e.do("inband", e.sock.recv, 100)
        e.log("atmark", atmark(e))
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.do("oob-again", e.sock.recv, 1, socket.MSG_OOB)
        e.do("rest", e.sock.recv, 100)
        e.sync("read")
        e.sock.sendall(b"after")

    client = sends_urgent


@case
class urgent_inline:
    def server(e):
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
        e.sync("sent")
        e.do("recv", e.sock.recv, 100)
        e.log("atmark", atmark(e))
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.do("recv", e.sock.recv, 100)
        e.sync("read")
        e.sock.sendall(b"after")

    client = sends_urgent


@case
class urgent_select_exception_set:
    def server(e):
        e.sync("sent")
        e.select("select", True, False, True, 1)
        e.do("inband", e.sock.recv, 100)
        e.select("select", True, False, True, 0)
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.select("select", True, False, True, 0)
        e.do("rest", e.sock.recv, 100)
        e.sync("read")
        e.sock.sendall(b"after")

    client = sends_urgent


@case
class urgent_epoll_pri:
    def server(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), select.EPOLLIN | select.EPOLLPRI)
        e.sync("sent")
        e.epoll_wait("epoll", ep, 1)
        e.do("inband", e.sock.recv, 100)
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.epoll_wait("epoll", ep, 0)
        e.do("rest", e.sock.recv, 100)
        e.sync("read")
        e.sock.sendall(b"after")

    client = sends_urgent


@case
class urgent_peek_and_second_byte:
    """Two urgent bytes: the mark moves to the second; the first becomes
    ordinary data."""
    def server(e):
        e.sync("sent")
        e.do("oob-peek", e.sock.recv, 1, socket.MSG_OOB | socket.MSG_PEEK)
        e.do("recv", e.sock.recv, 100)
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.do("recv", e.sock.recv, 100)
        e.sync("read")

    def client(e):
        e.sock.send(b"1", socket.MSG_OOB)
        e.sock.sendall(b"mid")
        e.sock.send(b"2", socket.MSG_OOB)
        e.sock.sendall(b"end")
        e.sync("sent")
        e.sync("read")


@case
class urgent_both_directions_then_bulk:
    """Urgent data each way, then 4 MB each way over what is now TCP."""
    def server(e):
        e.sync("sent")
        e.do("inband", e.sock.recv, 100)
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.do("send-oob", e.sock.send, b"?", socket.MSG_OOB)
        e.sync("answered")
        th = e.thread(e.sock.sendall, bytes(range(256)) * 16384)
        got = b""
        while len(got) < 4 << 20:
            got += e.sock.recv(1 << 16)
        th.join()
        e.log("bulk", got)

    def client(e):
        e.sock.sendall(b"x")
        e.sock.send(b"!", socket.MSG_OOB)
        e.sync("sent")
        e.sync("answered")
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        th = e.thread(e.sock.sendall, bytes(range(256)) * 16384)
        got = b""
        while len(got) < 4 << 20:
            got += e.sock.recv(1 << 16)
        th.join()
        e.log("bulk", got)


@case
class shut_rd_then_urgent_move:
    """The reader shut down reading, then the peer's urgent byte moves the
    connection to TCP: the bytes before the mark are read, then - the
    urgent byte out of the stream - the read ends at once, as after
    SHUT_RD on TCP, instead of waiting on the TCP socket."""
    def server(e):
        e.sync("shut")
        e.sock.sendall(b"ab")
        e.do("send oob", e.sock.send, b"!", socket.MSG_OOB)
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.do("shutdown", e.sock.shutdown, socket.SHUT_RD)
        e.sync("shut")
        e.sync("sent")
        time.sleep(0.1)
        e.do("recv", e.sock.recv, 10)
        e.do("recv-again", e.sock.recv, 10, timed=True)
        e.sync("read")
