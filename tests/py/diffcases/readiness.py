"""Readiness as a program sees it: poll, select and epoll (level-triggered,
EPOLLET, EPOLLONESHOT, EPOLLEXCLUSIVE, EPOLLRDHUP) in each state of a
connection, the edges epoll raises, and SO_RCVLOWAT.

The grid: STATES x LOOKS, one case each (readiness-STATE-LOOK).  The client
is "this end"; the server is the peer that brings the connection into the
state."""
import select
import socket
import struct
import time

from diffcases import add, case

IN, PRI, OUT, RDHUP = select.POLLIN, select.POLLPRI, select.POLLOUT, select.POLLRDHUP
E_IN, E_PRI, E_OUT, E_RDHUP = select.EPOLLIN, select.EPOLLPRI, select.EPOLLOUT, select.EPOLLRDHUP
ET, ONESHOT, EXCLUSIVE = select.EPOLLET, select.EPOLLONESHOT, select.EPOLLEXCLUSIVE


# -- how the client looks at its socket ---------------------------------------
#
# A look is made once the state is reached; look(label, timeout_ms, again)
# logs what each interface reports, the first call waiting up to timeout_ms
# (the others 0).  `again` also asks for what edge-triggered and one-shot
# entries report a second time, and re-arms the one-shot entry.

class PollLook:
    def __init__(self, e):
        self.e = e

    def look(self, label, timeout, again=True):
        self.e.poll(label + " poll-rdhup", IN | PRI | OUT | RDHUP, timeout)
        self.e.poll(label + " poll", IN | PRI | OUT, 0)


class SelectLook:
    def __init__(self, e):
        self.e = e

    def look(self, label, timeout, again=True):
        self.e.select(label + " select-rwx", 1, 1, 1, timeout / 1000)


class EpollLook:
    """Level-triggered with and without EPOLLRDHUP, EPOLLET, EPOLLONESHOT
    and EPOLLEXCLUSIVE (one waiter), each in its own epoll instance."""
    MODES = (("lt", E_IN | E_PRI | E_OUT),
             ("lt-rdhup", E_IN | E_PRI | E_OUT | E_RDHUP),
             ("et", E_IN | E_PRI | E_OUT | E_RDHUP | ET),
             ("oneshot", E_IN | E_PRI | E_OUT | E_RDHUP | ONESHOT),
             ("exclusive", E_IN | E_OUT | EXCLUSIVE))

    def __init__(self, e):
        self.e = e
        self.eps = {}
        for mode, events in self.MODES:
            ep = select.epoll()
            e.do("add " + mode, ep.register, e.sock.fileno(), events)
            self.eps[mode] = ep

    def look(self, label, timeout, again=True):
        e = self.e
        for i, (mode, _) in enumerate(self.MODES):
            e.epoll_wait("%s %s" % (label, mode), self.eps[mode], timeout / 1000 if i == 0 else 0)
        if again:
            e.epoll_wait(label + " et-again", self.eps["et"], 0)
            e.epoll_wait(label + " oneshot-again", self.eps["oneshot"], 0)
            e.do(label + " rearm", self.eps["oneshot"].modify, e.sock.fileno(),
                 dict(self.MODES)["oneshot"])
            e.epoll_wait(label + " oneshot-rearmed", self.eps["oneshot"], 0)


LOOKS = {"poll": PollLook, "select": SelectLook, "epoll": EpollLook}


# -- the states: (server, client(e, Look)) --------------------------------------

def fresh_server(e):
    e.sync("state")


def fresh_client(e, Look):
    e.sync("state")
    Look(e).look("fresh", 0)


def data_server(e):
    e.sock.sendall(b"hello")
    e.sync("state")


def data_client(e, Look):
    e.sync("state")
    Look(e).look("data", 0)
    e.do("recv", e.sock.recv, 100)


def partial_server(e):
    e.sock.sendall(b"hello world")
    e.sync("state")


def partial_client(e, Look):
    e.sync("state")
    e.do("recv", e.sock.recv, 5)
    Look(e).look("partial", 0)
    e.do("recv", e.sock.recv, 100)


def peer_shut_wr_server(e):
    e.sock.shutdown(socket.SHUT_WR)
    e.sync("state")


def peer_shut_wr_client(e, Look):
    e.sync("state")
    Look(e).look("peer-shut-wr", 0)
    e.do("recv", e.sock.recv, 100)


def peer_closed_server(e):
    e.sock.close()
    e.sync("state")


def peer_closed_client(e, Look):
    e.sync("state")
    Look(e).look("peer-closed", 0)
    e.do("recv", e.sock.recv, 100)


def peer_reset_server(e):
    e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    e.sock.close()
    e.sync("state")


def peer_reset_client(e, Look):
    e.sync("state")
    Look(e).look("peer-reset", 0)
    e.do("recv", e.sock.recv, 100)


def self_shut_wr_server(e):
    e.sync("state")
    e.do("recv", e.sock.recv, 100)


def fin_acked(sock, bound=0.5):
    """Waits (untraced) until TCP's FIN is acknowledged: loopback delays that
    ACK (up to 200 ms), and its arrival is a new EPOLLOUT edge, so a look made
    while it is in flight would report one edge or two as it happens to fall.
    Under smclo the state stays FIN_WAIT1 (docs/semantics.md): the bound."""
    end = time.monotonic() + bound
    while sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 4 \
            and time.monotonic() < end:        # TCP_FIN_WAIT1
        time.sleep(0.005)


def self_shut_wr_client(e, Look):
    e.sock.shutdown(socket.SHUT_WR)
    fin_acked(e.sock)
    e.sync("state")
    Look(e).look("self-shut-wr", 0)


def both_shut_server(e):
    e.sync("client-shut")
    e.sock.shutdown(socket.SHUT_WR)
    e.sync("state")


def both_shut_client(e, Look):
    e.sock.shutdown(socket.SHUT_WR)
    e.sync("client-shut")
    e.sync("state")
    Look(e).look("both-shut", 0)
    e.do("recv", e.sock.recv, 100)


def full_server(e):
    """Reads nothing until the client has filled the connection, then
    reads until the client's marker."""
    e.sync("full")
    got = b""
    while not got.endswith(b"!"):
        d = e.sock.recv(1 << 16)
        if not d:
            break
        got += d
    e.log("drained", got.endswith(b"!") and got[:-1] == b"x" * (len(got) - 1))
    e.sync("settled")


def fill(e):
    """Non-blocking sends until EAGAIN; logs only how it ended."""
    chunk, sent = b"x" * 65536, 0
    while True:
        out, r, _ = e.call(e.sock.send, chunk, socket.MSG_DONTWAIT)
        if isinstance(r, OSError):
            e.log("fill", sent > 0, out)
            return
        sent += r


def full_client(e, Look):
    fill(e)
    look = Look(e)
    look.look("full", 100)
    e.sync("full")
    look.look("draining", 2000, again=False)
    e.sock.sendall(b"!")
    e.sync("settled")
    look.look("drained", 0)


STATES = {
    "fresh": (fresh_server, fresh_client),
    "data": (data_server, data_client),
    "partial": (partial_server, partial_client),
    "peer-shut-wr": (peer_shut_wr_server, peer_shut_wr_client),
    "peer-closed": (peer_closed_server, peer_closed_client),
    "peer-reset": (peer_reset_server, peer_reset_client),
    "self-shut-wr": (self_shut_wr_server, self_shut_wr_client),
    "both-shut": (both_shut_server, both_shut_client),
    "full": (full_server, full_client),
}

for state, (server, client) in STATES.items():
    for look_name, Look in LOOKS.items():
        add("readiness-%s-%s" % (state, look_name), server,
            lambda e, client=client, Look=Look: client(e, Look))


# -- edges, one-shot, exclusive -----------------------------------------------

@case
class epollet_partial_read_then_new_data:
    """After a partial read, bytes arriving while the reader waits in
    epoll_wait raise a new edge at once."""
    def server(e):
        e.sock.sendall(b"hello world")
        e.sync("sent")
        e.sync("waiting")
        time.sleep(0.3)
        e.sock.sendall(b"more")
        e.sync("done")

    def client(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN | E_RDHUP | ET)
        e.sync("sent")
        e.epoll_wait("first", ep, 1, timed=True)
        e.do("recv", e.sock.recv, 5)
        e.sync("waiting")
        e.epoll_wait("new-data", ep, 2, timed=True)
        e.sync("done")
        e.do("recv", e.sock.recv, 100)
        e.epoll_wait("after-read", ep, 0)


@case
class epollet_partial_read_no_new_edge:
    """A partial read leaves bytes waiting but raises no new edge."""
    def server(e):
        e.sock.sendall(b"hello world")
        e.sync("sent")
        e.sync("done")

    def client(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN | E_RDHUP | ET)
        e.sync("sent")
        e.epoll_wait("first", ep, 1, timed=True)
        e.do("recv", e.sock.recv, 5)
        e.epoll_wait("no-edge", ep, 0.2, timed=True)
        e.do("recv", e.sock.recv, 100)
        e.epoll_wait("after-read", ep, 0)
        e.sync("done")


@case
class epollet_edge_per_send:
    """Each arrival is an edge even when the earlier bytes were not read."""
    def server(e):
        e.sock.sendall(b"one")
        e.sync("first")
        e.sync("looked")
        e.sock.sendall(b"two")
        e.sync("second")

    def client(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN | ET)
        e.sync("first")
        e.epoll_wait("first", ep, 0)
        e.epoll_wait("first-again", ep, 0)
        e.sync("looked")
        e.sync("second")
        e.epoll_wait("second", ep, 0)
        e.epoll_wait("second-again", ep, 0)
        e.do("recv", e.sock.recv, 100)


@case
class epolloneshot_fires_once_until_rearmed:
    def server(e):
        e.sock.sendall(b"one")
        e.sync("first")
        e.sync("disarmed")
        e.sock.sendall(b"two")
        e.sync("second")
        e.sync("rearmed")

    def client(e):
        ep = select.epoll()
        fd = e.sock.fileno()
        ep.register(fd, E_IN | ONESHOT)
        e.sync("first")
        e.epoll_wait("first", ep, 0)
        e.epoll_wait("disarmed", ep, 0.2, timed=True)
        e.sync("disarmed")
        e.sync("second")
        e.epoll_wait("new-data-disarmed", ep, 0)
        e.do("recv", e.sock.recv, 100)
        e.do("rearm-empty", ep.modify, fd, E_IN | ONESHOT)
        e.epoll_wait("rearmed-empty", ep, 0)
        e.sync("rearmed")
        e.do("rearm-out", ep.modify, fd, E_IN | E_OUT | ONESHOT)
        e.epoll_wait("rearmed-out", ep, 0)
        e.epoll_wait("rearmed-out-again", ep, 0)


@case
class epolloneshot_wakes_waiter_once:
    """A one-shot entry wakes a waiter blocked in epoll_wait; the second
    arrival does not."""
    def server(e):
        e.sync("waiting")
        time.sleep(0.3)
        e.sock.sendall(b"one")
        e.sync("woken")
        e.sock.sendall(b"two")
        e.sync("sent")

    def client(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN | ONESHOT)
        e.sync("waiting")
        e.epoll_wait("wait", ep, 2, timed=True)
        e.sync("woken")
        e.sync("sent")
        e.epoll_wait("after-second", ep, 0)
        e.do("recv", e.sock.recv, 100)


@case
class epollexclusive_one_waiter:
    """EPOLLEXCLUSIVE: only EPOLLIN/EPOLLOUT/EPOLLET/EPOLLERR/EPOLLHUP may go
    with it, it cannot be modified; one waiter is woken by arriving data."""
    def server(e):
        e.sync("waiting")
        time.sleep(0.3)
        e.sock.sendall(b"data")
        e.sync("done")

    def client(e):
        fd = e.sock.fileno()
        for label, events in (("add-rdhup", E_IN | E_RDHUP | EXCLUSIVE),
                              ("add-oneshot", E_IN | ONESHOT | EXCLUSIVE),
                              ("add-pri", E_IN | E_PRI | EXCLUSIVE)):
            e.do(label, select.epoll().register, fd, events)
        ep = select.epoll()
        e.do("add", ep.register, fd, E_IN | EXCLUSIVE)
        e.do("mod", ep.modify, fd, E_IN)
        e.do("mod-exclusive", ep.modify, fd, E_IN | EXCLUSIVE)
        e.sync("waiting")
        e.epoll_wait("wait", ep, 2, timed=True)
        e.sync("done")
        e.epoll_wait("again", ep, 0)
        e.do("recv", e.sock.recv, 100)
        e.epoll_wait("after-read", ep, 0)
        e.do("del", ep.unregister, fd)
        e.do("add-again", ep.register, fd, E_OUT | EXCLUSIVE)
        e.epoll_wait("out", ep, 0)


# -- poll and select details --------------------------------------------------

@case
class poll_timeout_zero:
    def server(e):
        e.sync("empty")
        e.sock.sendall(b"abc")
        e.sync("data")

    def client(e):
        e.poll("in-empty", IN, 0, timed=True)
        e.poll("out", OUT, 0, timed=True)
        e.poll("nothing-asked", 0, 0, timed=True)
        e.sync("empty")
        e.sync("data")
        e.poll("in-data", IN, 0, timed=True)
        e.poll("in-out-data", IN | OUT, 0, timed=True)
        e.do("recv", e.sock.recv, 100)
        e.poll("in-read", IN, 0, timed=True)


@case
class poll_woken_by_peer_shutdown:
    def server(e):
        e.sync("waiting")
        time.sleep(0.3)
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("done")

    def client(e):
        e.sync("waiting")
        e.poll("wait", IN | RDHUP, 2000, timed=True)
        e.sync("done")
        e.do("recv", e.sock.recv, 100)


@case
class epoll_woken_by_peer_reset:
    def server(e):
        e.sync("waiting")
        time.sleep(0.3)
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        e.sock.close()
        e.sync("done")

    def client(e):
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN | E_RDHUP)
        e.sync("waiting")
        e.epoll_wait("wait", ep, 2, timed=True)
        e.sync("done")
        e.do("recv", e.sock.recv, 100)
        e.do("recv-again", e.sock.recv, 100)
        e.epoll_wait("after", ep, 0)


@case
class select_except_set_without_urgent_data:
    """Normal bytes waiting do not put the socket in select's except set."""
    def server(e):
        e.sync("empty")
        e.sock.sendall(b"abc")
        e.sync("data")

    def client(e):
        e.select("empty-x", 0, 0, 1, 0.1)
        e.sync("empty")
        e.sync("data")
        e.select("data-x", 0, 0, 1, 0.1)
        e.select("data-rx", 1, 0, 1, 0.1)
        e.poll("data-pri", PRI, 0)
        e.do("recv", e.sock.recv, 100)


# -- SO_RCVLOWAT ----------------------------------------------------------------

@case
class rcvlowat_holds_readiness:
    """SO_RCVLOWAT=10 with 5 bytes waiting: poll, select and epoll do not
    report it readable (a non-blocking peek still gets the 5); with the
    10th byte they do."""
    def server(e):
        e.sock.sendall(b"12345")
        e.sync("sent")
        e.sync("looked")
        e.sock.sendall(b"67890")
        e.sync("more")

    def client(e):
        e.do("rcvlowat", e.sock.setsockopt, socket.SOL_SOCKET, socket.SO_RCVLOWAT, 10)
        e.do("readback", e.sock.getsockopt, socket.SOL_SOCKET, socket.SO_RCVLOWAT)
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN)
        e.sync("sent")
        e.poll("poll", IN, 200, timed=True)
        e.select("select-r", 1, 0, 0, 0.2)
        e.epoll_wait("epoll", ep, 0.2, timed=True)
        e.do("peek-dontwait", e.sock.recv, 100, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        e.sync("looked")
        e.sync("more")
        e.poll("poll-10", IN, 0)
        e.select("select-r-10", 1, 0, 0, 0)
        e.epoll_wait("epoll-10", ep, 0)
        e.do("recv", e.sock.recv, 100)


@case
class rcvlowat_blocking_recv:
    """SO_RCVLOWAT=10, 5 bytes waiting, a blocking recv(100): the peer sends
    5 more after 0.4 s and 10 more after 0.8 s.  Linux's TCP wakes the
    reader only when 10 bytes it has not yet taken are queued (the 5 it
    holds do not count), so it returns all 20 at 0.8 s, not 10 at 0.4 s."""
    def server(e):
        e.sock.sendall(b"12345")
        e.sync("sent")
        time.sleep(0.4)
        e.sock.sendall(b"67890")
        time.sleep(0.4)
        e.sock.sendall(b"abcdefghij")
        e.sync("done")

    def client(e):
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 10)
        e.sync("sent")
        e.do("recv", e.sock.recv, 100, timed=True)
        e.sync("done")
        e.do("rest", e.sock.recv, 100, socket.MSG_DONTWAIT)


@case
class rcvlowat_timeout_returns_what_is_there:
    """SO_RCVLOWAT=50 and SO_RCVTIMEO 0.5 s, a blocking recv(100) on an empty
    socket, then 30 bytes and no more: the wait ends with the timeout, and
    the read returns the 30 (not an end of file, not EAGAIN)."""
    def server(e):
        e.sync("set")
        time.sleep(0.2)
        e.sock.sendall(b"d" * 30)
        e.sync("done")

    def client(e):
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 50)
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 500000))
        e.sync("set")
        e.do("recv", e.sock.recv, 100, timed=True)
        e.sync("done")


@case
class rcvlowat_then_fin:
    """SO_RCVLOWAT above what is waiting: the peer's FIN makes it readable."""
    def server(e):
        e.sock.sendall(b"12345")
        e.sync("sent")
        e.sync("looked")
        e.sock.shutdown(socket.SHUT_WR)
        e.sync("fin")

    def client(e):
        e.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 10)
        e.sync("sent")
        e.poll("before-fin", IN, 100)
        e.sync("looked")
        e.sync("fin")
        e.poll("after-fin", IN | RDHUP, 0)
        e.select("after-fin-select", 1, 0, 0, 0)
        ep = select.epoll()
        ep.register(e.sock.fileno(), E_IN)
        e.epoll_wait("after-fin-epoll", ep, 0)
        e.do("recv", e.sock.recv, 100, timed=True)
        e.do("eof", e.sock.recv, 100, timed=True)
