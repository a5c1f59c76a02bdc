"""A peer killed (SIGKILL) at every moment: idle, with bytes it never
read, with bytes it sent, blocked in recv or send, before its connection
was accepted.  The survivor looks once the killed process has exited."""
import select
import socket
import time

from diffcases import case

MASK = select.POLLIN | select.POLLOUT | select.POLLRDHUP | select.POLLPRI


def survivor_looks(e):
    e.peer_exited()
    e.poll("poll", MASK, 0)
    e.recv_all()
    e.do("send", e.sock.send, b"x")
    e.log_signals()
    e.do("send", e.sock.send, b"x")
    e.log_signals()


@case
class killed_idle:
    dies = True
    def server(e):
        survivor_looks(e)

    def client(e):
        e.die()


@case
class killed_with_unread_data:
    """Bytes the killed end never read: its kernel resets the connection."""
    dies = True
    def server(e):
        e.sock.sendall(b"never read")
        e.sync("sent")
        survivor_looks(e)

    def client(e):
        e.sync("sent")
        e.die()


@case
class killed_after_sending:
    dies = True
    def server(e):
        survivor_looks(e)

    def client(e):
        e.sock.sendall(b"last words")
        e.die()


@case
class killed_with_data_both_ways:
    dies = True
    def server(e):
        e.sock.sendall(b"to the client")
        e.sync("sent")
        survivor_looks(e)

    def client(e):
        e.sock.sendall(b"to the server")
        e.sync("sent")
        e.die()


@case
class killed_after_shutdown_wr:
    dies = True
    def server(e):
        e.sync("shut")
        e.do("recv", e.sock.recv, 10)
        survivor_looks(e)

    def client(e):
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")
        e.die()


@case
class killed_while_survivor_blocked_in_recv:
    dies = True
    def server(e):
        e.do("recv", e.sock.recv, 10, timed=True)
        survivor_looks(e)

    def client(e):
        time.sleep(0.4)
        e.die()


@case
class killed_while_survivor_blocked_in_send:
    """The killed end never read: the blocked writer gets ECONNRESET or
    EPIPE, as the kernel decides."""
    dies = True
    def server(e):
        th = e.thread(lambda: setattr(e, "wrote", e.call(e.sock.sendall, b"s" * (32 << 20))))
        time.sleep(0.2)
        e.sync("blocked")
        e.peer_exited()
        th.join(5)
        e.log("blocked-send", e.wrote[0] if not th.is_alive() else "still blocked")
        e.log_signals()

    def client(e):
        e.sync("blocked")
        e.die()


@case
class killed_while_blocked_in_recv:
    dies = True
    def server(e):
        e.sync("blocked")
        survivor_looks(e)

    def client(e):
        e.thread(e.sock.recv, 10)
        time.sleep(0.2)
        e.sync("blocked")
        e.die()


@case
class killed_before_accept:
    dies = True
    accepts = False
    expect = {"rendezvous": "after-timeout"}

    def server(e):
        e.peer_exited()
        e.sock, _ = e.listener.accept()
        e.poll("poll", MASK, 0)
        e.recv_all()

    def client(e):
        e.sock.sendall(b"before accept")
        e.die()


@case
class server_killed_client_reads_end:
    dies = True
    def server(e):
        e.sock.sendall(b"reply")
        e.die()

    def client(e):
        e.peer_exited()
        e.poll("poll", MASK, 0)
        e.recv_all()
        e.do("send", e.sock.send, b"x")
        e.do("send", e.sock.send, b"x")
        e.log_signals()
