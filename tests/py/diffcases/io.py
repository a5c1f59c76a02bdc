"""Reads and writes: recv and send with each flag, read/write, recvfrom,
sendto, recvmsg, the ends of a stream."""
import os
import socket
import time

from diffcases import case

MSG_ERRQUEUE = 0x2000
MSG_CONFIRM = 0x800


@case
class recv_byte_by_byte:
    def server(e):
        e.sock.sendall(b"hello")
        e.sync()
        e.sock.close()
        e.sync("closed")

    def client(e):
        e.sync()
        for i in range(5):
            e.do("recv1", e.sock.recv, 1)
        e.sync("closed")
        e.do("recv", e.sock.recv, 10)
        e.do("again", e.sock.recv, 10)


@case
class recv_zero_length:
    def server(e):
        e.sync("empty")
        e.sock.sendall(b"abc")
        e.sync("data")

    def client(e):
        e.do("recv0-empty", e.sock.recv, 0, socket.MSG_DONTWAIT)
        e.sync("empty")
        e.sync("data")
        e.do("recv0", e.sock.recv, 0)
        e.do("recv", e.sock.recv, 10)


@case
class send_zero_length:
    def server(e):
        e.do("send0", e.sock.send, b"")
        e.sync()

    def client(e):
        e.sync()
        e.poll("poll", 1, 100)
        e.do("recv", e.sock.recv, 10, socket.MSG_DONTWAIT)


@case
class peek_then_read:
    def server(e):
        e.sock.sendall(b"abcdef")
        e.sync()

    def client(e):
        e.sync()
        e.do("peek", e.sock.recv, 3, socket.MSG_PEEK)
        e.do("peek", e.sock.recv, 10, socket.MSG_PEEK)
        e.do("recv", e.sock.recv, 2)
        e.do("peek", e.sock.recv, 10, socket.MSG_PEEK)
        e.do("recv", e.sock.recv, 10)


@case
class peek_waitall_waits:
    """MSG_PEEK|MSG_WAITALL waits for the whole length, as a read would."""
    def server(e):
        e.sock.sendall(b"abc")
        e.sync()
        time.sleep(0.4)
        e.sock.sendall(b"def")
        e.sync("done")

    def client(e):
        e.sync()
        e.do("peek-waitall", e.sock.recv, 6, socket.MSG_PEEK | socket.MSG_WAITALL, timed=True)
        e.sync("done")
        e.do("recv", e.sock.recv, 10)


@case
class dontwait_without_data:
    def server(e):
        e.sync()

    def client(e):
        e.do("recv", e.sock.recv, 10, socket.MSG_DONTWAIT, timed=True)
        e.sync()


@case
class dontwait_with_data:
    def server(e):
        e.sock.sendall(b"xyz")
        e.sync()

    def client(e):
        e.sync()
        e.do("recv", e.sock.recv, 10, socket.MSG_DONTWAIT)
        e.do("recv", e.sock.recv, 10, socket.MSG_DONTWAIT)


@case
class waitall_across_sends:
    def server(e):
        e.sock.sendall(b"abc")
        time.sleep(0.4)
        e.sock.sendall(b"defgh")

    def client(e):
        e.do("waitall", e.sock.recv, 6, socket.MSG_WAITALL, timed=True)
        e.do("recv", e.sock.recv, 10)


@case
class waitall_ended_by_shutdown:
    def server(e):
        e.sock.sendall(b"abc")
        time.sleep(0.4)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync()

    def client(e):
        e.do("waitall", e.sock.recv, 6, socket.MSG_WAITALL, timed=True)
        e.do("recv", e.sock.recv, 10)
        e.sync()


@case
class waitall_dontwait:
    def server(e):
        e.sock.sendall(b"abc")
        e.sync()

    def client(e):
        e.sync()
        e.do("recv", e.sock.recv, 6, socket.MSG_WAITALL | socket.MSG_DONTWAIT, timed=True)


@case
class recv_trunc_discards:
    """MSG_TRUNC on TCP drops the bytes without copying them."""
    def server(e):
        e.sock.sendall(b"abcdef")
        e.sync()

    def client(e):
        e.sync()
        buf = bytearray(3)
        e.do("trunc", e.sock.recv_into, buf, 3, socket.MSG_TRUNC)
        e.log("buffer", bytes(buf))
        e.do("recv", e.sock.recv, 10)


@case
class recv_errqueue_empty:
    def server(e):
        e.sync()

    def client(e):
        e.do("errqueue", e.sock.recv, 10, MSG_ERRQUEUE)
        e.sync()


@case
class send_flags_accepted:
    """MSG_EOR, MSG_DONTROUTE, MSG_CONFIRM, MSG_MORE on a TCP send."""
    def server(e):
        for flag in (socket.MSG_EOR, socket.MSG_DONTROUTE, MSG_CONFIRM, socket.MSG_MORE):
            e.do("send", e.sock.send, b"ab", flag)
        e.do("send", e.sock.send, b"end")
        e.sync()

    def client(e):
        e.sync()
        got = b""
        while len(got) < 11:
            got += e.sock.recv(100)
        e.log("got", got)


@case
class read_and_write_calls:
    def server(e):
        e.do("write", os.write, e.sock.fileno(), b"via write")
        e.sync()
        e.do("read", os.read, e.sock.fileno(), 100)

    def client(e):
        e.sync()
        e.do("read", os.read, e.sock.fileno(), 100)
        e.do("write", os.write, e.sock.fileno(), b"back")


@case
class recvfrom_gives_no_address:
    def server(e):
        e.sock.sendall(b"abc")
        e.sync()

    def client(e):
        e.sync()
        e.do("recvfrom", e.sock.recvfrom, 10)


@case
class sendto_on_connected:
    def server(e):
        e.sync()
        e.do("recv", e.sock.recv, 10)

    def client(e):
        e.do("sendto-peer", e.sock.sendto, b"ab", e.sock.getpeername())
        e.do("sendto-other", e.sock.sendto, b"cd", ("127.0.0.1", 9))
        e.sync()


@case
class recvmsg_flags_and_address:
    def server(e):
        e.sock.sendall(b"abcdef")
        e.sync()

    def client(e):
        e.sync()
        e.do("recvmsg", e.sock.recvmsg, 4, 1024)
        e.do("recvmsg", e.sock.recvmsg, 4, 1024, socket.MSG_PEEK)
        e.do("recvmsg", e.sock.recvmsg, 4, 1024)


@case
class eof_read_twice:
    def server(e):
        e.sock.sendall(b"last")
        e.sock.close()
        e.sync()

    def client(e):
        e.sync()
        for label in ("recv", "eof", "eof-again"):
            e.do(label, e.sock.recv, 10)
        e.do("eof-dontwait", e.sock.recv, 10, socket.MSG_DONTWAIT)
        e.do("eof-peek", e.sock.recv, 10, socket.MSG_PEEK)


@case
class small_read_big_buffer:
    def server(e):
        e.sock.sendall(b"x" * 10)
        e.sync()

    def client(e):
        e.sync()
        e.do("recv", e.sock.recv, 1 << 20)


@case
class send_then_close_then_peer_reads:
    """Bytes written just before close() all arrive, then the end."""
    def server(e):
        e.sock.sendall(bytes(range(256)) * 400)
        e.sock.close()

    def client(e):
        time.sleep(0.2)
        e.recv_all()


@case
class sigpipe_on_second_send:
    """The peer closed: the first send is accepted (TCP answers it with a
    reset), the next fails with EPIPE and raises SIGPIPE."""
    def server(e):
        e.sock.close()
        e.sync()

    def client(e):
        e.sync()
        e.do("recv", e.sock.recv, 10)
        e.do("send", e.sock.send, b"one")
        e.log_signals("after-first")
        e.do("send", e.sock.send, b"two")
        e.log_signals("after-second")
        e.do("send", e.sock.send, b"three")
        e.log_signals("after-third")
        e.do("recv", e.sock.recv, 10)


@case
class nosignal_on_second_send:
    def server(e):
        e.sock.close()
        e.sync()

    def client(e):
        e.sync()
        e.do("send", e.sock.send, b"one", socket.MSG_NOSIGNAL)
        e.do("send", e.sock.send, b"two", socket.MSG_NOSIGNAL)
        e.log_signals()


@case
class oob_recv_without_urgent_data:
    def server(e):
        e.sock.sendall(b"abc")
        e.sync()

    def client(e):
        e.sync()
        e.do("oob", e.sock.recv, 1, socket.MSG_OOB)
        e.do("recv", e.sock.recv, 10)
