"""Scatter and gather: sendmsg, recvmsg_into, writev and readv with 0 to
2048 buffers (IOV_MAX is 1024: sendmsg and recvmsg fail with EMSGSIZE
beyond it, writev and readv with EINVAL), zero-length buffers among them,
and vectors larger than the socket buffer (or ring)."""
import hashlib
import os
import socket

from diffcases import add

COUNTS = (0, 1, 2, 3, 64, 1024, 1025, 2048)
SEND_LENS = (5, 0, 3, 0, 7, 1, 0, 12)      # buffer i of a sent vector: SEND_LENS[i % 8] bytes


def pattern(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def send_vector(n, seed):
    """n buffers of patterned bytes, every other one or so empty."""
    out, k = [], 0
    for i in range(n):
        size = SEND_LENS[i % len(SEND_LENS)]
        out.append(pattern(size, seed + k))
        k += size
    return out


def recv_vector(n):
    """n buffers of 7 bytes, every fourth one empty."""
    return [bytearray(0 if i % 4 == 1 else 7) for i in range(n)]


def drain(e, label="drain"):
    """Read what is there without waiting and log it and how it ended."""
    got = b""
    while True:
        try:
            d = e.sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            end = "EAGAIN"
            break
        if not d:
            end = "eof"
            break
        got += d
    e.log(label, got, end)
    return got


def filled(bufs, n):
    """The first n bytes spread over bufs, as one string."""
    out = []
    for b in bufs:
        if n <= 0:
            break
        out.append(bytes(b[:n]))
        n -= len(b)
    return b"".join(out)


# -- sendmsg with n buffers: the peer reads what arrived ---------------------

def sendmsg_family(n):
    def server(e):
        bufs = send_vector(n, 1)
        e.log("total", sum(map(len, bufs)))
        e.do("sendmsg", e.sock.sendmsg, bufs)
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        drain(e)
        e.sync("read")
    return server, client


# -- recvmsg_into with n buffers after the peer sent 5000 bytes --------------

def recvmsg_into_family(n):
    def server(e):
        e.sock.sendall(pattern(5000, 3))
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        bufs = recv_vector(n)
        r = e.do("recvmsg_into", e.sock.recvmsg_into, bufs)
        if not isinstance(r, OSError):
            e.log("bytes", filled(bufs, r[0]))
        drain(e, "rest")
        e.sync("read")
    return server, client


# -- writev with n buffers, then readv with n buffers at the peer ------------

def writev_readv_family(n):
    def server(e):
        bufs = send_vector(n, 5)
        e.do("writev", os.writev, e.sock.fileno(), bufs)
        e.sock.sendall(b"|" + pattern(3000, 9))      # the reader has something to read
        e.sync("sent")
        e.sync("read")

    def client(e):
        e.sync("sent")
        bufs = recv_vector(n)
        r = e.do("readv", os.readv, e.sock.fileno(), bufs)
        if not isinstance(r, OSError):
            e.log("bytes", filled(bufs, r))
        drain(e, "rest")
        e.sync("read")
    return server, client


for n in COUNTS:
    add("sendmsg_%d_buffers" % n, *sendmsg_family(n))
    add("recvmsg_into_%d_buffers" % n, *recvmsg_into_family(n))
    add("writev_readv_%d_buffers" % n, *writev_readv_family(n))


# -- vectors larger than the socket buffer ------------------------------------

BIG_PARTS = 16
BIG_PART = 4 * 1024 * 1024 // BIG_PARTS


def big_vector():
    """16 buffers of 256 KB, each different."""
    unit = pattern(4096, 11)
    return [bytes([i]) + (unit * (BIG_PART // len(unit)))[:BIG_PART - 1]
            for i in range(BIG_PARTS)]


def big_sendmsg_server(e):
    """4 MB in 16 buffers in one blocking sendmsg: all of it is taken."""
    e.do("sendmsg", e.sock.sendmsg, big_vector())
    e.sock.shutdown(socket.SHUT_WR)
    e.sync("read")


def big_sendmsg_client(e):
    got = e.recv_all()
    e.log("equal", got == b"".join(big_vector()))
    e.sync("read")


def big_writev_server(e):
    e.do("writev", os.writev, e.sock.fileno(), big_vector())
    e.sock.shutdown(socket.SHUT_WR)
    e.sync("read")


def big_writev_client(e):
    """The peer reads with readv into 16 buffers of 256 KB until the end."""
    h, total, calls_ok = hashlib.sha1(), 0, True
    bufs = [bytearray(BIG_PART) for _ in range(BIG_PARTS)]
    while True:
        n = os.readv(e.sock.fileno(), bufs)
        if n == 0:
            break
        calls_ok = calls_ok and n > 0
        h.update(filled(bufs, n))
        total += n
    want = hashlib.sha1(b"".join(big_vector())).hexdigest()
    e.log("read", total, h.hexdigest()[:16], h.hexdigest() == want, calls_ok)
    e.sync("read")


add("sendmsg_4mb_in_16_buffers", big_sendmsg_server, big_sendmsg_client)
add("writev_4mb_readv_16_buffers", big_writev_server, big_writev_client)
