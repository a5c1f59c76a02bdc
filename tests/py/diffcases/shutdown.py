"""shutdown() in every direction, from this thread and from another while
one is blocked, and what each end observes."""
import select
import socket
import time

from diffcases import case

MASK = select.POLLIN | select.POLLOUT | select.POLLRDHUP | select.POLLPRI


@case
class shut_wr_then_reply:
    def server(e):
        e.recv_all("request")
        e.poll("poll", MASK, 0)
        e.sync("polled")
        e.do("send", e.sock.send, b"reply")
        e.sock.close()

    def client(e):
        e.sock.sendall(b"request")
        e.do("shutdown", e.sock.shutdown, socket.SHUT_WR)
        e.poll("poll", MASK, 0)
        e.sync("polled")
        e.recv_all("reply")


@case
class shut_rd_local_reads:
    def server(e):
        e.sync("shut")
        e.do("send", e.sock.send, b"after")
        e.sync("sent")

    def client(e):
        e.do("shutdown", e.sock.shutdown, socket.SHUT_RD)
        e.poll("poll", MASK, 0)
        e.do("recv", e.sock.recv, 10, timed=True)
        e.sync("shut")
        e.sync("sent")
        e.poll("poll", MASK, 0)
        e.do("recv", e.sock.recv, 10)
        e.do("send", e.sock.send, b"still")


@case
class shut_rd_with_unread_data:
    def server(e):
        e.sock.sendall(b"unread")
        e.sync("sent")
        e.sync("shut")
        e.do("send", e.sock.send, b"more")
        e.sync("more")

    def client(e):
        e.sync("sent")
        e.do("shutdown", e.sock.shutdown, socket.SHUT_RD)
        e.sync("shut")
        e.sync("more")
        e.do("recv", e.sock.recv, 100)
        e.do("recv", e.sock.recv, 100)


@case
class shut_rdwr_both_ends_see:
    def server(e):
        e.sync()
        e.poll("poll", MASK, 0)
        e.do("recv", e.sock.recv, 10)
        e.do("send", e.sock.send, b"x")
        e.sync("sent")

    def client(e):
        e.do("shutdown", e.sock.shutdown, socket.SHUT_RDWR)
        e.sync()
        e.sync("sent")
        e.poll("poll", MASK, 0)
        e.do("recv", e.sock.recv, 10)
        e.do("send", e.sock.send, b"y")
        e.log_signals()


@case
class shutdown_twice_and_bad_how:
    def server(e):
        e.sync()

    def client(e):
        e.do("shut-wr", e.sock.shutdown, socket.SHUT_WR)
        e.do("shut-wr-again", e.sock.shutdown, socket.SHUT_WR)
        e.do("shut-rd", e.sock.shutdown, socket.SHUT_RD)
        e.do("shut-rdwr", e.sock.shutdown, socket.SHUT_RDWR)
        e.do("shut-bad", e.sock.shutdown, 7)
        e.sync()


@case
class send_after_own_shut_wr:
    def server(e):
        e.sync()

    def client(e):
        e.sock.shutdown(socket.SHUT_WR)
        e.do("send", e.sock.send, b"x")
        e.log_signals()
        e.do("send-nosignal", e.sock.send, b"x", socket.MSG_NOSIGNAL)
        e.log_signals()
        e.sync()


def blocked_recv_woken_by(how):
    def server(e):
        e.sync()

    def client(e):
        th = e.thread(lambda: setattr(e, "got", e.call(e.sock.recv, 10)))
        time.sleep(0.3)
        out, _, _ = e.call(e.sock.shutdown, how)
        th.join(5)
        e.log("shutdown", out)
        got, _, took = e.got
        e.log("blocked-recv", got, took < 1.5)
        e.sync()
    return server, client


@case
class shut_rd_wakes_blocked_recv:
    server, client = blocked_recv_woken_by(socket.SHUT_RD)


@case
class shut_rdwr_wakes_blocked_recv:
    server, client = blocked_recv_woken_by(socket.SHUT_RDWR)


@case
class shut_wr_leaves_blocked_recv:
    """SHUT_WR from another thread: the blocked recv goes on waiting, and
    is answered by the peer, which saw the end of the stream."""
    def server(e):
        e.recv_all("request")
        e.sock.sendall(b"answer")

    def client(e):
        th = e.thread(lambda: setattr(e, "got", e.call(e.sock.recv, 10)))
        time.sleep(0.2)
        e.sock.sendall(b"question")
        e.do("shutdown", e.sock.shutdown, socket.SHUT_WR)
        th.join(5)
        e.log("blocked-recv", e.got[0])


@case
class shut_wr_wakes_blocked_send:
    """A writer blocked on a full buffer, another thread shuts the write
    side: the send ends with EPIPE (or the count it wrote)."""
    def server(e):
        e.sync("blocked")
        total = 0
        while True:
            d = e.sock.recv(1 << 20)
            if not d:
                break
            total += len(d)
        e.log("read-to-end", total > 0)

    def client(e):
        def writer():
            e.wrote = e.call(e.sock.sendall, b"w" * (32 << 20))
        th = e.thread(writer)
        time.sleep(0.3)
        e.sync("blocked")
        e.do("shutdown", e.sock.shutdown, socket.SHUT_WR)
        th.join(5)
        e.log("blocked-send", e.wrote[0])
        e.log_signals()


@case
class peer_shut_wr_while_blocked_in_recv:
    def server(e):
        time.sleep(0.3)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync()

    def client(e):
        e.do("recv", e.sock.recv, 10, timed=True)
        e.poll("poll", MASK, 0)
        e.sync()


@case
class shutdown_through_a_dup:
    def server(e):
        e.recv_all("got")

    def client(e):
        dup = e.sock.dup()
        e.sock.sendall(b"via original")
        e.do("shutdown-dup", dup.shutdown, socket.SHUT_WR)
        e.do("send-original", e.sock.send, b"x")
        e.log_signals()
