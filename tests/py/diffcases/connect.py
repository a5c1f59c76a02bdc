"""Connect and accept: blocking and not, errors, misuse of listen and
connect, the addresses each end reports."""
import errno
import fcntl
import os
import select
import socket
import time

from diffcases import case


def unused_port():
    """A port bound by a socket that never listens: connecting is refused."""
    hold = socket.socket()
    hold.bind(("127.0.0.1", 0))
    return hold, hold.getsockname()[1]


def same_host_view(e):
    """Each end tells the other what it sees; the trace says whether they agree."""
    mine = repr((e.sock.getsockname()[:2], e.sock.getpeername()[:2])).encode()
    e.ctl.sendall(mine + b"\n")
    theirs = e.ctl_line()
    local, peer = eval(mine.decode())
    plocal, ppeer = eval(theirs.decode())
    e.log("agree", local == ppeer and peer == plocal, local[0], peer[0])


@case
class connect_refused:
    def server(e):
        e.sync()

    def client(e):
        hold, port = unused_port()
        s = socket.socket()
        e.do("connect", s.connect, ("127.0.0.1", port), timed=True)
        e.do("so_error", s.getsockopt, socket.SOL_SOCKET, socket.SO_ERROR)
        e.do("connect-again", s.connect, ("127.0.0.1", port))
        e.sync()


@case
class connect_refused_nonblocking:
    """Counted as a connection left on TCP: smclo decides before the kernel
    says the connection failed."""
    fallbacks = {"peer-no-smclo": 1}
    def server(e):
        e.sync()

    def client(e):
        hold, port = unused_port()
        s = socket.socket()
        s.setblocking(False)
        e.do("connect", s.connect, ("127.0.0.1", port))
        e.poll("poll", select.POLLOUT, 1000, sock=s)
        e.do("so_error", s.getsockopt, socket.SOL_SOCKET, socket.SO_ERROR)
        e.do("so_error", s.getsockopt, socket.SOL_SOCKET, socket.SO_ERROR)
        e.do("send", s.send, b"x")
        e.sync()


@case
class connect_nonblocking:
    connects = False

    def server(e):
        e.sync()
        e.do("recv", e.sock.recv, 10)
        e.sock.sendall(b"pong")
        e.sync("answered")

    def client(e):
        s = e.sock = socket.socket()
        s.setblocking(False)
        e.do("connect", s.connect, ("127.0.0.1", e.port))
        e.poll("poll", select.POLLOUT | select.POLLIN, 2000)
        e.do("so_error", s.getsockopt, socket.SOL_SOCKET, socket.SO_ERROR)
        e.do("connect-again", s.connect, ("127.0.0.1", e.port))
        e.do("send", s.send, b"ping")
        e.sync()
        e.sync("answered")
        e.do("recv", s.recv, 10)
        same_host_view_after(e)


def same_host_view_after(e):
    e.log("peer-port-is-listener", e.sock.getpeername()[1] == e.port)


@case
class connect_when_connected:
    def server(e):
        e.sync()

    def client(e):
        e.do("connect", e.sock.connect, ("127.0.0.1", e.port))
        e.do("connect-elsewhere", e.sock.connect, ("127.0.0.1", 9))
        e.sync()


@case
class accept_nonblocking_nothing_pending:
    accepts = False
    connects = False
    expect = {"direct": "inbox", "rendezvous": "after-timeout"}

    def server(e):
        e.listener.setblocking(False)
        e.do("accept", e.listener.accept)
        e.sync("try")
        e.sync("connected")
        e.poll("poll-listener", select.POLLIN, 2000, sock=e.listener)
        e.sock, _ = e.listener.accept()
        fl = fcntl.fcntl(e.sock.fileno(), fcntl.F_GETFL)
        e.log("accepted-nonblocking", bool(fl & os.O_NONBLOCK))
        e.do("recv", e.sock.recv, 10)

    def client(e):
        e.sync("try")
        e.sock = socket.create_connection(("127.0.0.1", e.port))
        e.sock.sendall(b"hi")
        e.sync("connected")


@case
class accepted_socket_flags:
    def server(e):
        fd = e.sock.fileno()
        e.log("nonblocking", bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK))
        e.log("cloexec", bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC))
        e.log("acceptconn", e.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        e.log("listener-acceptconn", e.listener.getsockopt(socket.SOL_SOCKET,
                                                           socket.SO_ACCEPTCONN))

    def client(e):
        fd = e.sock.fileno()
        e.log("nonblocking", bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK))
        e.log("acceptconn", e.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))


@case
class addresses_agree:
    def server(e):
        same_host_view(e)
        e.log("accept-address-is-peer", e.peer_addr == e.sock.getpeername())

    def client(e):
        same_host_view(e)


@case
class addresses_agree_v6:
    family = socket.AF_INET6

    def server(e):
        same_host_view(e)
        e.do("recv", e.sock.recv, 10)

    def client(e):
        same_host_view(e)
        e.sock.sendall(b"over v6")


@case
class connect_from_bound_port:
    connects = False

    def server(e):
        same_host_view(e)

    def client(e):
        s = e.sock = socket.socket()
        s.bind(("127.0.0.1", 0))
        before = s.getsockname()
        s.connect(("127.0.0.1", e.port))
        e.log("kept-bound-address", s.getsockname() == before)
        same_host_view(e)


@case
class connect_to_other_loopback_address:
    """A listener on 0.0.0.0 reached at 127.0.0.2: the address each end
    reports is the kernel's choice."""
    listen_on = "0.0.0.0"
    connect_to = "127.0.0.2"

    def server(e):
        same_host_view(e)

    def client(e):
        same_host_view(e)


@case
class data_before_accept:
    """The client writes before the server calls accept()."""
    accepts = False
    expect = {"rendezvous": "after-timeout"}

    def server(e):
        e.sync("sent")
        e.sock, _ = e.listener.accept()
        e.do("recv", e.sock.recv, 100)
        e.sock.sendall(b"reply")

    def client(e):
        e.do("send", e.sock.send, b"early bytes")
        e.sync("sent")
        e.do("recv", e.sock.recv, 100)


@case
class unconnected_socket_calls:
    def server(e):
        e.sync()

    def client(e):
        s = socket.socket()
        e.do("send", s.send, b"x")
        e.log_signals()
        e.do("recv", s.recv, 10)
        e.do("shutdown", s.shutdown, socket.SHUT_RDWR)
        e.do("getpeername", s.getpeername)
        e.do("so_error", s.getsockopt, socket.SOL_SOCKET, socket.SO_ERROR)
        e.sync()


@case
class listen_and_bind_on_connected:
    def server(e):
        e.do("listen", e.sock.listen, 4)
        e.do("bind", e.sock.bind, ("127.0.0.1", 0))
        e.do("accept", e.sock.accept)
        e.sync()
        e.do("recv", e.sock.recv, 10)

    def client(e):
        e.do("listen", e.sock.listen, 4)
        e.sync()
        e.sock.sendall(b"still ok")


@case
class accept_on_socket_not_listening:
    def server(e):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        e.do("accept", s.accept)
        e.sync()

    def client(e):
        e.sync()


@case
class listener_closed_connection_lives:
    def server(e):
        e.listener.close()
        e.sync()
        e.do("recv", e.sock.recv, 10)
        e.sock.sendall(b"alive")

    def client(e):
        e.sync()
        e.sock.sendall(b"hello")
        e.do("recv", e.sock.recv, 10)
        s = socket.socket()
        e.do("connect-closed-listener", s.connect, ("127.0.0.1", e.port))


@case
class getpeername_after_peer_closed:
    def server(e):
        e.sock.close()
        e.sync()

    def client(e):
        e.sync()
        e.do("recv", e.sock.recv, 10)
        e.log("peer-port-is-listener", e.sock.getpeername()[1] == e.port)


@case
class two_connections_in_order:
    """Two more connections, accepted in the order they were made."""
    conns = 4

    def server(e):
        e.do("recv", e.sock.recv, 10)
        for _ in range(2):
            c, _ = e.listener.accept()
            e.do("recv", c.recv, 10)
            c.close()

    def client(e):
        e.sock.sendall(b"first")
        for word in (b"second", b"third"):
            c = socket.create_connection(("127.0.0.1", e.port))
            c.sendall(word)
            c.close()
        time.sleep(0.1)
