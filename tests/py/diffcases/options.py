"""Socket options on a connected socket, at both ends: SOL_SOCKET,
IPPROTO_TCP, IPPROTO_IP and IPPROTO_IPV6 - each option's value before any
set, set and read back, invalid values, short buffers, unknown options, and
the options whose effect a program sees (TCP_CORK, SO_RCVLOWAT, TCP_INFO's
byte counters)."""
import os
import select
import socket
import struct
import time

from diffcases import add, case

SOL, TCP, IP, IP6 = socket.SOL_SOCKET, socket.IPPROTO_TCP, socket.IPPROTO_IP, socket.IPPROTO_IPV6

SO_INCOMING_CPU = 49
TCP_NOTSENT_LOWAT = 25
IP_MTU = 14
IP_MTU_DISCOVER = 10
IPV6_MTU = 24
SOL_RAW = 255


def getint(e, label, level, opt):
    return e.do(label, e.sock.getsockopt, level, opt)


def setint(e, label, level, opt, value):
    return e.do(label, e.sock.setsockopt, level, opt, value)


# -- integer options: value before any set, then each (value to set) and
#    the value read back; a set that fails logs its errno --------------------

INT_OPTIONS = [
    # name, level, option, values to set in turn
    ("so-type", SOL, socket.SO_TYPE, [1]),
    ("so-domain", SOL, socket.SO_DOMAIN, [2]),
    ("so-protocol", SOL, socket.SO_PROTOCOL, [6]),
    ("so-acceptconn", SOL, socket.SO_ACCEPTCONN, [1]),
    ("so-error", SOL, socket.SO_ERROR, [0]),
    ("so-keepalive", SOL, socket.SO_KEEPALIVE, [1, 0, 7]),
    ("so-reuseaddr", SOL, socket.SO_REUSEADDR, [1, 0]),
    ("so-reuseport", SOL, socket.SO_REUSEPORT, [1, 0]),
    ("so-rcvbuf", SOL, socket.SO_RCVBUF, [65536, 0, -1]),
    ("so-sndbuf", SOL, socket.SO_SNDBUF, [65536, 0, -1]),
    ("so-rcvlowat", SOL, socket.SO_RCVLOWAT, [10, 0, -5]),
    ("so-sndlowat", SOL, socket.SO_SNDLOWAT, [10]),
    ("so-oobinline", SOL, socket.SO_OOBINLINE, [1, 0]),
    ("so-priority", SOL, socket.SO_PRIORITY, [6, 0, 7, -1]),
    ("so-broadcast", SOL, socket.SO_BROADCAST, [1, 0]),
    ("so-dontroute", SOL, socket.SO_DONTROUTE, [1, 0]),
    ("tcp-nodelay", TCP, socket.TCP_NODELAY, [1, 0]),
    ("tcp-cork", TCP, socket.TCP_CORK, [1, 0]),
    ("tcp-maxseg", TCP, socket.TCP_MAXSEG, [1000, 10, 100000]),
    ("tcp-keepidle", TCP, socket.TCP_KEEPIDLE, [30, 0, 40000]),
    ("tcp-keepintvl", TCP, socket.TCP_KEEPINTVL, [5, 0, 40000]),
    ("tcp-keepcnt", TCP, socket.TCP_KEEPCNT, [3, 0, 128]),
    ("tcp-user-timeout", TCP, socket.TCP_USER_TIMEOUT, [1000, 0, -1]),
    ("tcp-quickack", TCP, socket.TCP_QUICKACK, [0, 1]),
    ("tcp-defer-accept", TCP, socket.TCP_DEFER_ACCEPT, [5, 0]),
    ("tcp-notsent-lowat", TCP, TCP_NOTSENT_LOWAT, [16384, 0]),
    ("tcp-window-clamp", TCP, socket.TCP_WINDOW_CLAMP, [1000, 100000, 0]),
    ("tcp-syncnt", TCP, socket.TCP_SYNCNT, [3, 0, 256]),
    ("tcp-linger2", TCP, socket.TCP_LINGER2, [10, -1, 0, 100000]),
    ("ip-tos", IP, socket.IP_TOS, [0x10, 0x1ff, 0]),
    ("ip-ttl", IP, socket.IP_TTL, [10, 0, 256, -1]),
    ("ip-mtu-discover", IP, IP_MTU_DISCOVER, [2, 0, 99]),
    ("ip-mtu", IP, IP_MTU, [1000]),
]


def int_option(level, opt, values):
    def run(e):
        getint(e, "default", level, opt)
        for v in values:
            setint(e, "set %d" % v, level, opt, v)
            getint(e, "get", level, opt)
    return run


for _name, _level, _opt, _values in INT_OPTIONS:
    _run = int_option(_level, _opt, _values)
    add("opt-" + _name, _run, _run)


IPV6_OPTIONS = [
    ("ipv6-v6only", socket.IPV6_V6ONLY, [1, 0]),
    ("ipv6-tclass", socket.IPV6_TCLASS, [0x20, 256, -1]),
    ("ipv6-unicast-hops", socket.IPV6_UNICAST_HOPS, [10, 256, -1]),
]

for _name, _opt, _values in IPV6_OPTIONS:
    _run = int_option(IP6, _opt, _values)
    add("opt-" + _name, _run, _run, family=socket.AF_INET6)


def ip_options_on_inet6(e):
    """IPPROTO_IP options on an AF_INET6 connection to ::1."""
    getint(e, "ip-tos", IP, socket.IP_TOS)
    getint(e, "ip-ttl", IP, socket.IP_TTL)
    getint(e, "ip-mtu", IP, IP_MTU)
    getint(e, "ipv6-mtu", IP6, IPV6_MTU)
    getint(e, "so-domain", SOL, socket.SO_DOMAIN)


add("opt-ip-on-inet6", ip_options_on_inet6, ip_options_on_inet6, family=socket.AF_INET6)


# -- structured options ------------------------------------------------------

def so_linger(e):
    e.do("default", e.sock.getsockopt, SOL, socket.SO_LINGER, 8)
    for on, secs in ((1, 5), (0, 7), (1, 0)):
        e.do("set %d,%d" % (on, secs), e.sock.setsockopt, SOL, socket.SO_LINGER,
             struct.pack("ii", on, secs))
        e.do("get", e.sock.getsockopt, SOL, socket.SO_LINGER, 8)
    e.do("set short", e.sock.setsockopt, SOL, socket.SO_LINGER, b"\1\0")
    e.do("get short", e.sock.getsockopt, SOL, socket.SO_LINGER, 4)
    e.do("set int", e.sock.setsockopt, SOL, socket.SO_LINGER, 1)
    e.do("get", e.sock.getsockopt, SOL, socket.SO_LINGER, 8)
    # the end leaves linger (1, 0) or off: close at the harness's end;
    # switch it off so the end's close is an ordinary one
    e.sock.setsockopt(SOL, socket.SO_LINGER, struct.pack("ii", 0, 0))


add("opt-so-linger", so_linger, so_linger)


def so_peercred(e):
    """SO_PEERCRED on TCP: only whether pid/uid/gid are set, and the peer's."""
    r = e.do("peercred-len", lambda: len(e.sock.getsockopt(SOL, socket.SO_PEERCRED, 12)))
    if isinstance(r, int):
        pid, uid, gid = struct.unpack("iII", e.sock.getsockopt(SOL, socket.SO_PEERCRED, 12))
        e.log("pid nonzero", pid != 0, "pid is peer's", pid == e.peer_pid)
        e.log("uid nonzero", uid != 0, "uid is ours", uid == os.getuid(),
              "uid is -1", uid == 0xffffffff)
        e.log("gid is -1", gid == 0xffffffff)
    e.do("set", e.sock.setsockopt, SOL, socket.SO_PEERCRED, b"\0" * 12)


add("opt-so-peercred", so_peercred, so_peercred)


def so_incoming_cpu(e):
    """The CPU varies: only the type of the answer."""
    r = e.do("type", lambda: type(e.sock.getsockopt(SOL, SO_INCOMING_CPU)).__name__)
    if r == "int":
        e.log("in range", -1 <= e.sock.getsockopt(SOL, SO_INCOMING_CPU) < os.cpu_count())


add("opt-so-incoming-cpu", so_incoming_cpu, so_incoming_cpu)


def tcp_congestion(e):
    def get():
        return e.sock.getsockopt(TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0]
    def names_match():
        return get() == open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip().encode()
    e.do("default is the system's", names_match)
    for name in (b"reno", b"nosuch", b"", b"cubic"):
        e.do("set %r" % name, e.sock.setsockopt, TCP, socket.TCP_CONGESTION, name)
        e.do("get", get)
    e.do("get short", e.sock.getsockopt, TCP, socket.TCP_CONGESTION, 2)


add("opt-tcp-congestion", tcp_congestion, tcp_congestion)


# struct tcp_info (linux/tcp.h) up to tcpi_bytes_received
TCP_INFO = struct.Struct("8B 24I 4Q")


def tcp_info(e):
    raw = e.sock.getsockopt(TCP, socket.TCP_INFO, 256)
    e.log("big enough", len(raw) >= TCP_INFO.size)
    return TCP_INFO.unpack_from(raw)


def log_tcp_info(e, label, t):
    state, ca_state, retransmits, probes, backoff, options = t[:6]
    e.log(label, "state", state, "ca_state", ca_state, "retransmits", retransmits,
          "probes", probes, "backoff", backoff, "options", options)


def opt_tcp_info_side(e):
    before = tcp_info(e)
    log_tcp_info(e, "before", before)
    e.sync("looked")
    e.sock.sendall(bytes(range(250)) * 4)
    got = b""
    while len(got) < 1000:
        got += e.sock.recv(2000)
    e.log("exchanged", len(got))
    e.sync("exchanged")
    after = tcp_info(e)
    log_tcp_info(e, "after", after)
    e.log("bytes_acked grew", after[-2] > before[-2],
          "bytes_received grew", after[-1] > before[-1])
    e.do("short", lambda: len(e.sock.getsockopt(TCP, socket.TCP_INFO, 4)))
    e.do("set", e.sock.setsockopt, TCP, socket.TCP_INFO, b"\0" * 8)


add("opt-tcp-info", opt_tcp_info_side, opt_tcp_info_side)


def tcp_info_after_shutdown(server_side):
    """tcpi_state after this end's shutdown(SHUT_WR) and the peer's."""
    def run(e):
        if server_side:
            e.sock.shutdown(socket.SHUT_WR)
        e.sync("shut")
        log_tcp_info(e, "state", tcp_info(e))
        e.sync("looked")
    return run


add("opt-tcp-info-after-shutdown", tcp_info_after_shutdown(True), tcp_info_after_shutdown(False))


# -- effects ----------------------------------------------------------------

@case
class opt_tcp_cork_holds_bytes:
    """With TCP_CORK on, 3 bytes sent are not at the peer for 100 ms;
    uncorking sends them."""
    def server(e):
        e.do("cork", e.sock.setsockopt, TCP, socket.TCP_CORK, 1)
        e.do("send", e.sock.send, b"abc")
        e.sync("sent")
        e.sync("looked")
        e.do("uncork", e.sock.setsockopt, TCP, socket.TCP_CORK, 0)
        e.sync("uncorked")

    def client(e):
        e.sync("sent")
        e.poll("poll-corked", select.POLLIN, 100)
        e.do("recv-corked", e.sock.recv, 10, socket.MSG_DONTWAIT)
        e.sync("looked")
        e.sync("uncorked")
        e.poll("poll-uncorked", select.POLLIN, 100)
        e.do("recv", e.sock.recv, 10, socket.MSG_DONTWAIT)


@case
class opt_tcp_cork_full_segment:
    """A corked send of more than a segment goes out at once (up to the
    last partial segment, which waits for the uncork)."""
    def server(e):
        e.sock.setsockopt(TCP, socket.TCP_CORK, 1)
        data = bytes(range(256)) * 1024
        e.sock.sendall(data)
        e.sync("sent")
        e.sync("looked")
        e.sock.setsockopt(TCP, socket.TCP_CORK, 0)
        e.sock.shutdown(socket.SHUT_WR)

    def client(e):
        e.sync("sent")
        e.poll("poll-corked", select.POLLIN, 100)
        e.sync("looked")
        got = e.recv_all()
        e.log("all", len(got))


@case
class opt_tcp_cork_then_msg_more:
    """MSG_MORE holds bytes like a cork; a send without it pushes them."""
    def server(e):
        e.do("send-more", e.sock.send, b"abc", socket.MSG_MORE)
        e.sync("sent")
        e.sync("looked")
        e.do("send", e.sock.send, b"def")
        e.sync("pushed")

    def client(e):
        e.sync("sent")
        e.poll("poll-held", select.POLLIN, 100)
        e.sync("looked")
        e.sync("pushed")
        e.do("recv", e.sock.recv, 10, socket.MSG_DONTWAIT)


@case
class opt_so_rcvlowat_readiness:
    """SO_RCVLOWAT 10: 3 bytes waiting do not make the socket readable for
    poll, and a blocking recv waits for 10 (or returns what there is)."""
    def server(e):
        e.sync("set")
        e.sock.sendall(b"abc")
        e.sync("sent")
        e.sync("looked")
        time.sleep(0.3)
        e.sock.sendall(b"defghijklm")
        e.sync("done")

    def client(e):
        e.do("set", e.sock.setsockopt, SOL, socket.SO_RCVLOWAT, 10)
        e.sync("set")
        e.sync("sent")
        e.poll("poll", select.POLLIN, 100)
        e.select("select", True, False, False, 0.1)
        e.sync("looked")
        e.do("recv", e.sock.recv, 100, timed=True)
        e.sync("done")
        e.do("rest", e.sock.recv, 100, socket.MSG_DONTWAIT)


@case
class opt_so_keepalive_inherited_state:
    """Options set by the client before connect() are on the connection."""
    connects = False

    def server(e):
        e.sync("connected")

    def client(e):
        s = socket.socket()
        s.setsockopt(SOL, socket.SO_KEEPALIVE, 1)
        s.setsockopt(TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(TCP, socket.TCP_KEEPIDLE, 33)
        s.setsockopt(IP, socket.IP_TOS, 0x10)
        s.connect(("127.0.0.1", e.port))
        e.sock = s
        for label, level, opt in (("keepalive", SOL, socket.SO_KEEPALIVE),
                                  ("nodelay", TCP, socket.TCP_NODELAY),
                                  ("keepidle", TCP, socket.TCP_KEEPIDLE),
                                  ("tos", IP, socket.IP_TOS)):
            getint(e, label, level, opt)
        e.sync("connected")


@case
class opt_accepted_inherits_listener:
    """An accepted socket starts with the listener's options."""
    accepts = False
    connects = False

    def server(e):
        e.listener.setsockopt(SOL, socket.SO_KEEPALIVE, 1)
        e.listener.setsockopt(TCP, socket.TCP_NODELAY, 1)
        e.listener.setsockopt(TCP, socket.TCP_KEEPIDLE, 44)
        e.listener.setsockopt(SOL, socket.SO_RCVLOWAT, 5)
        e.sync("set")
        e.sock, _ = e.listener.accept()
        for label, level, opt in (("keepalive", SOL, socket.SO_KEEPALIVE),
                                  ("nodelay", TCP, socket.TCP_NODELAY),
                                  ("keepidle", TCP, socket.TCP_KEEPIDLE),
                                  ("rcvlowat", SOL, socket.SO_RCVLOWAT),
                                  ("reuseaddr", SOL, socket.SO_REUSEADDR),
                                  ("acceptconn", SOL, socket.SO_ACCEPTCONN)):
            getint(e, label, level, opt)
        e.do("listener-acceptconn", e.listener.getsockopt, SOL, socket.SO_ACCEPTCONN)
        e.sync("looked")

    def client(e):
        e.sync("set")
        e.sock = socket.create_connection(("127.0.0.1", e.port))
        e.sync("looked")


# -- buffers, unknown options -----------------------------------------------

def short_buffers(e):
    """getsockopt with a buffer too short for an int: bytes or an errno."""
    for label, level, opt in (("so-rcvbuf", SOL, socket.SO_RCVBUF),
                              ("so-error", SOL, socket.SO_ERROR),
                              ("so-domain", SOL, socket.SO_DOMAIN),
                              ("so-type", SOL, socket.SO_TYPE),
                              ("so-keepalive", SOL, socket.SO_KEEPALIVE),
                              ("tcp-nodelay", TCP, socket.TCP_NODELAY),
                              ("ip-ttl", IP, socket.IP_TTL),
                              ("ip-tos", IP, socket.IP_TOS)):
        e.do(label + " 1", e.sock.getsockopt, level, opt, 1)
        e.do(label + " 2", e.sock.getsockopt, level, opt, 2)
        e.do(label + " 8", e.sock.getsockopt, level, opt, 8)
    e.do("set nodelay short", e.sock.setsockopt, TCP, socket.TCP_NODELAY, b"\1")
    e.do("nodelay", e.sock.getsockopt, TCP, socket.TCP_NODELAY)
    e.do("set rcvbuf short", e.sock.setsockopt, SOL, socket.SO_RCVBUF, b"\1\0")


add("opt-short-buffer", short_buffers, short_buffers)


def unknown_options(e):
    for label, level in (("sol", SOL), ("tcp", TCP), ("ip", IP), ("ipv6", IP6), ("level", 9999)):
        e.do("get " + label, e.sock.getsockopt, level, 9999)
        e.do("set " + label, e.sock.setsockopt, level, 9999, 1)
    e.do("get sol 0", e.sock.getsockopt, SOL, 0)
    e.do("get ipv6 on inet", e.sock.getsockopt, IP6, socket.IPV6_V6ONLY)
    e.do("get raw level", e.sock.getsockopt, SOL_RAW, 1)


add("opt-unknown", unknown_options, unknown_options)


TCP_ULP = 31
SOL_TLS, TLS_TX = 282, 1


@case
class opt_tcp_ulp:
    """An upper layer protocol asked for (OpenSSL's first step into kernel
    TLS, a protocol a program may not set, one that does not exist), then
    TLS keys: each refused or taken as the kernel does; the bytes still
    plain both ways."""
    def server(e):
        e.sync("tried")
        e.do("recv", e.sock.recv, 5, socket.MSG_WAITALL)
        e.sock.sendall(b"plain")
        e.sync("done")

    def client(e):
        for name in (b"tls", b"mptcp", b"no-such-ulp"):
            e.do("ulp " + name.decode(), e.sock.setsockopt, TCP, TCP_ULP, name)
        e.do("ulp read", e.sock.getsockopt, TCP, TCP_ULP, 16)
        e.do("tls tx", e.sock.setsockopt, SOL_TLS, TLS_TX, b"\0" * 40)
        e.sync("tried")
        e.sock.sendall(b"plain")
        e.do("recv", e.sock.recv, 5, socket.MSG_WAITALL)
        e.sync("done")
