"""Timeouts: SO_RCVTIMEO and SO_SNDTIMEO on recv, read, MSG_WAITALL and
send (and their readback), and the timeouts of poll, select and epoll_wait.
SO_RCVTIMEO on accept() is out of scope here."""
import os
import select
import socket
import struct
import time

from diffcases import case
from diffpeer import bucket


def timeval(seconds, micros):
    return struct.pack("ll", seconds, micros)


def set_rcvtimeo(e, seconds, micros, label="rcvtimeo"):
    e.do(label, e.sock.setsockopt, socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval(seconds, micros))


def set_sndtimeo(e, seconds, micros, label="sndtimeo"):
    e.do(label, e.sock.setsockopt, socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(seconds, micros))


# -- SO_RCVTIMEO ----------------------------------------------------------------

@case
class rcvtimeo_no_data:
    def server(e):
        e.sync("done")

    def client(e):
        set_rcvtimeo(e, 0, 400000)
        e.do("recv", e.sock.recv, 10, timed=True)
        e.do("recv-again", e.sock.recv, 10, timed=True)
        e.sync("done")


@case
class rcvtimeo_applies_to_read:
    def server(e):
        e.sync("done")

    def client(e):
        set_rcvtimeo(e, 0, 400000)
        e.do("read", os.read, e.sock.fileno(), 10, timed=True)
        e.do("recvmsg", e.sock.recvmsg, 10, timed=True)
        e.sync("done")


@case
class rcvtimeo_data_before_timeout:
    """Data 0.2 s into a 0.4 s SO_RCVTIMEO: recv returns it then."""
    def server(e):
        e.sync("waiting")
        time.sleep(0.2)
        e.sock.sendall(b"late")
        e.sync("done")

    def client(e):
        set_rcvtimeo(e, 0, 400000)
        e.sync("waiting")
        e.do("recv", e.sock.recv, 10, timed=True)
        e.sync("done")
        e.do("recv-empty", e.sock.recv, 10, timed=True)


@case
class rcvtimeo_ended_by_peer_shutdown:
    def server(e):
        e.sync("waiting")
        time.sleep(0.3)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("done")

    def client(e):
        set_rcvtimeo(e, 1, 0)
        e.sync("waiting")
        e.do("recv", e.sock.recv, 10, timed=True)
        e.sync("done")


@case
class rcvtimeo_waitall_trickle:
    """SO_RCVTIMEO 0.6 s, recv(900, MSG_WAITALL), the peer sends 300 bytes
    at 0, 0.4 and 0.8 s: the timeout runs from the call's start (it is not
    restarted by each arrival), so recv returns the 600 bytes it had at
    0.6 s."""
    def server(e):
        e.sock.sendall(bytes(range(100)) * 3)
        e.sync("first")
        time.sleep(0.4)
        e.sock.sendall(bytes(range(100, 200)) * 3)
        time.sleep(0.4)
        e.sock.sendall(bytes(range(200, 256)) * 5 + bytes(20))
        e.sync("done")

    def client(e):
        set_rcvtimeo(e, 0, 600000)
        e.sync("first")
        e.do("waitall", e.sock.recv, 900, socket.MSG_WAITALL, timed=True)
        e.do("next", e.sock.recv, 900, timed=True)
        e.sync("done")


@case
class rcvtimeo_zero_is_forever:
    """Setting SO_RCVTIMEO back to {0, 0} makes recv block again."""
    def server(e):
        e.sync("waiting")
        time.sleep(0.8)
        e.sock.sendall(b"late")
        e.sync("done")

    def client(e):
        set_rcvtimeo(e, 0, 200000)
        set_rcvtimeo(e, 0, 0, "rcvtimeo-zero")
        e.sync("waiting")
        e.do("recv", e.sock.recv, 10, timed=True)
        e.sync("done")


# -- SO_SNDTIMEO ----------------------------------------------------------------

@case
class sndtimeo_peer_not_reading:
    """SO_SNDTIMEO 0.4 s, the peer reads nothing: a 16 MiB blocking send
    returns a partial count (or EAGAIN) after the timeout, the next send
    EAGAIN; once the peer drains, sending works again."""
    def server(e):
        e.sync("full")
        got = b""
        while not got.endswith(b"!"):
            d = e.sock.recv(1 << 16)
            if not d:
                break
            got += d
        e.log("drained", got.endswith(b"!") and got[:-1] == b"x" * (len(got) - 1))
        e.sync("done")

    def client(e):
        set_sndtimeo(e, 0, 400000)
        big = b"x" * (16 << 20)

        def send(label):
            out, r, took = e.call(e.sock.send, big)
            e.log(label, "partial" if isinstance(r, int) and 0 < r < len(big) else out,
                  bucket(took))
            return r

        send("send")
        # a few more may take what the first left free (how many depends
        # on buffer sizes): only that it ends in EAGAIN, after the timeout
        out, r, took = None, None, 0
        for _ in range(8):
            out, r, took = e.call(e.sock.send, big)
            if isinstance(r, OSError) or r == len(big):
                break
        e.log("sends-until", out, bucket(took))
        e.sync("full")
        e.do("marker", e.sock.sendall, b"!", timed=True)
        e.sync("done")


@case
class timeo_readback:
    """SO_RCVTIMEO/SO_SNDTIMEO as struct timeval: the default, what was set,
    a tv_usec out of range (EDOM), a short option (EINVAL), a negative
    time (taken as no timeout)."""
    def server(e):
        e.sync("done")

    def client(e):
        def get(label, opt):
            out, r, _ = e.call(e.sock.getsockopt, socket.SOL_SOCKET, opt, 16)
            e.log(label, struct.unpack("ll", r) if isinstance(r, bytes) else out)

        for name, opt in (("rcv", socket.SO_RCVTIMEO), ("snd", socket.SO_SNDTIMEO)):
            get(name + "-default", opt)
            e.do(name + "-set", e.sock.setsockopt, socket.SOL_SOCKET, opt, timeval(1, 500000))
            get(name + "-get", opt)
            e.do(name + "-edom", e.sock.setsockopt, socket.SOL_SOCKET, opt, timeval(0, 1000000))
            get(name + "-after-edom", opt)
            e.do(name + "-short", e.sock.setsockopt, socket.SOL_SOCKET, opt, b"\0" * 4)
            e.do(name + "-negative", e.sock.setsockopt, socket.SOL_SOCKET, opt, timeval(-1, 0))
            get(name + "-after-negative", opt)
            e.do(name + "-set-small", e.sock.setsockopt, socket.SOL_SOCKET, opt, timeval(0, 400000))
            get(name + "-small", opt)
        e.sync("done")


# -- poll, select, epoll_wait ---------------------------------------------------

@case
class poll_timeout_with_nothing:
    def server(e):
        e.sync("done")

    def client(e):
        e.poll("poll-in", select.POLLIN, 400, timed=True)
        e.poll("poll-pri-rdhup", select.POLLPRI | select.POLLRDHUP, 400, timed=True)
        e.sync("done")


@case
class select_timeout_with_nothing:
    def server(e):
        e.sync("done")

    def client(e):
        for label, r, x in (("select-r", 1, 0), ("select-rx", 1, 1)):
            t = time.monotonic()
            e.select(label, r, 0, x, 0.4)
            e.log(label + " took", bucket(time.monotonic() - t))
        e.sync("done")


@case
class epoll_wait_timeout_with_nothing:
    def server(e):
        e.sync("done")

    def client(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        e.epoll_wait("epoll", ep, 0.4, timed=True)
        ep.modify(e.sock.fileno(), select.EPOLLIN | select.EPOLLET)
        e.epoll_wait("epoll-et", ep, 0.4, timed=True)
        e.sync("done")


@case
class poll_woken_by_data:
    """A 2 s poll woken by data arriving 0.4 s in."""
    def server(e):
        e.sync("waiting")
        time.sleep(0.4)
        e.sock.sendall(b"wake")
        e.sync("done")

    def client(e):
        e.sync("waiting")
        e.poll("poll", select.POLLIN, 2000, timed=True)
        e.sync("done")
        e.do("recv", e.sock.recv, 10)
