"""Socket semantics under smclo, both ends accelerated.

    sockcheck.py server PORT      scripted server (IPv4 and IPv6), waiting in select()
    sockcheck.py server-blocking PORT   the same, a thread per listener blocking in
                                  accept() (so smclo takes connections without TCP)
    sockcheck.py client PORT      runs every check, prints "ok NAME" for each

The client sends a command line on each new connection; the server obeys:
ECHO (echo until EOF), SEND n, SLOW n (wait 0.3 s then send), CLOSE, SHA
(read to EOF, answer the sha256), DOMAIN (answer the accepted socket's
SO_DOMAIN), ADDR (answer the address accept() gave, getpeername() and
getsockname() of the accepted socket).
"""
import errno
import hashlib
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

AF_SMC = 43


def serve_one(c, addr=None):
    f = b""
    while not f.endswith(b"\n"):
        d = c.recv(1)
        if not d:
            return c.close()
        f += d
    cmd = f.split()
    if cmd[0] == b"ADDR":
        c.sendall(repr((addr[:2], c.getpeername()[:2], c.getsockname()[:2])).encode())
        c.close()
        return
    if cmd[0] == b"ECHO":
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        c.shutdown(socket.SHUT_WR)
    elif cmd[0] in (b"SEND", b"SLOW"):
        if cmd[0] == b"SLOW":
            time.sleep(0.3)
        c.sendall(b"a" * int(cmd[1]))
        while c.recv(65536):
            pass
    elif cmd[0] == b"DOMAIN":
        c.sendall(b"%d\n" % c.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN))
    elif cmd[0] == b"HALF":
        # wait in recv while the client half-closes, then answer at length
        while c.recv(65536):
            pass
        time.sleep(0.2)
        c.sendall(b"h" * int(cmd[1]))
    elif cmd[0] == b"SHA":
        h = hashlib.sha256()
        while True:
            d = c.recv(65536)
            if not d:
                break
            h.update(d)
        c.sendall(h.hexdigest().encode())
    c.close()


def accept_forever(s):
    while True:
        c, addr = s.accept()
        threading.Thread(target=serve_one, args=(c, addr), daemon=True).start()


def server(port, blocking):
    socks = []
    for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(16)
        socks.append(s)
    print("ready", flush=True)
    if blocking:
        threading.Thread(target=accept_forever, args=(socks[1],), daemon=True).start()
        accept_forever(socks[0])
    while True:
        r, _, _ = select.select(socks, [], [])
        for s in r:
            c, addr = s.accept()
            threading.Thread(target=serve_one, args=(c, addr), daemon=True).start()


PORT = 0
TMPDIR = "/tmp"


def dial(cmd, fam=socket.AF_INET, host="127.0.0.1", proto=0, before=None):
    s = socket.socket(fam, socket.SOCK_STREAM, proto)
    if before:
        before(s)
    s.connect((host, PORT))
    s.sendall(cmd.encode() + b"\n")
    return s


def recv_exact(s, n, flags=0):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b), flags)
        assert d, "early EOF"
        b += d
    return b


def recv_all(s):
    """Everything until EOF."""
    b = b""
    while True:
        d = s.recv(65536)
        if not d:
            return b
        b += d


def check_identity():
    s = dial("ECHO", before=lambda s: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1))
    assert s.getpeername() == ("127.0.0.1", PORT)
    assert s.getsockname()[0] == "127.0.0.1" and s.getsockname()[1] > 0
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_TCP
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == socket.AF_INET
    assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1   # set before connect
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= 1 << 20
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    assert stat.S_ISSOCK(os.fstat(s.fileno()).st_mode)
    s.sendall(b"ping")
    assert recv_exact(s, 4) == b"ping"
    s.close()


def check_kernel_tls():
    """Kernel TLS is refused as a kernel without it refuses it (OpenSSL then
    encrypts in user space): the TCP socket under the ring carries none of
    the bytes, so it must not be the one to encrypt them."""
    s = dial("ECHO")
    for level, opt, val, err in ((socket.IPPROTO_TCP, 31, b"tls", errno.ENOENT),      # TCP_ULP
                                 (282, 1, b"\0" * 40, errno.ENOPROTOOPT)):           # SOL_TLS, TLS_TX
        try:
            s.setsockopt(level, opt, val)
            raise AssertionError("setsockopt(%d, %d) succeeded" % (level, opt))
        except OSError as e:
            assert e.errno == err, (level, opt, e)
    assert s.getsockopt(socket.IPPROTO_TCP, 31, 16) == b""      # no upper layer protocol
    s.sendall(b"still plain")
    assert recv_exact(s, 11) == b"still plain"
    s.close()


def check_addresses_mirror():
    """What each end says of itself is what the other says of it, for IPv4
    and IPv6 (a connection without TCP answers from its handshake)."""
    for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        for _ in range(3):      # the first may be set up over TCP, the next ones not
            s = dial("ADDR", fam, host)
            accepted, their_peer, their_own = eval(recv_all(s).decode())
            mine, peer = s.getsockname()[:2], s.getpeername()[:2]
            assert accepted == mine and their_peer == mine, (accepted, their_peer, mine)
            assert their_own == peer == (host, PORT), (their_own, peer)
            s.close()


def check_recv_flags():
    import fcntl
    import termios
    s = dial("SEND 1000")
    select.select([s], [], [], 5)
    deadline = time.time() + 2
    n = 0
    while time.time() < deadline:
        n = struct.unpack("i", fcntl.ioctl(s, termios.FIONREAD, b"\0" * 4))[0]
        if n == 1000:
            break
        time.sleep(0.01)
    assert n == 1000, n
    assert s.recv(10, socket.MSG_PEEK) == b"a" * 10
    assert s.recv(10) == b"a" * 10
    assert s.recv(990, socket.MSG_WAITALL) == b"a" * 990
    try:
        s.recv(10, socket.MSG_DONTWAIT)
        raise AssertionError("MSG_DONTWAIT on an empty socket returned data")
    except BlockingIOError:
        pass
    s.close()


def recv_times_out(s, at_most):
    """A recv with a 100 ms SO_RCVTIMEO, before the server's bytes (0.3 s)."""
    t = time.time()
    try:
        s.recv(10)
        raise AssertionError("recv returned before the data was sent")
    except (BlockingIOError, socket.timeout):
        pass
    assert 0.05 < time.time() - t < at_most


def check_rcvtimeo():
    timeout = struct.pack("ll", 0, 100000)
    s = dial("SLOW 5")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
    recv_times_out(s, 1.0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 2, 0))
    assert recv_exact(s, 5) == b"aaaaa"
    s.close()
    # set before connect(): the accelerated descriptor keeps it
    s = dial("SLOW 5", before=lambda s: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                                      timeout))
    recv_times_out(s, 0.25)
    s.close()


def check_readiness():
    s = dial("SLOW 5")
    s.setblocking(False)
    p = select.poll()
    p.register(s, select.POLLIN)
    assert p.poll(0) == []                       # nothing yet
    assert p.poll(2000), "never readable"
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET | select.EPOLLRDHUP)
    assert ep.poll(1)                            # data present: an edge on registration
    assert s.recv(100) == b"aaaaa"
    assert ep.poll(0.2) == []                    # drained: no new edge
    r, w, _ = select.select([s], [s], [], 0)
    assert r == [] and w == [s]                  # writable, not readable
    s.shutdown(socket.SHUT_WR)                   # server sees EOF and closes
    ev = ep.poll(2)
    assert ev and ev[0][1] & (select.EPOLLRDHUP | select.EPOLLIN), ev
    assert s.recv(10) == b""
    s.close()


def check_half_close_and_sendfile(tmpdir):
    data = os.urandom(3 << 20)
    s = dial("SHA")
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(100).decode() == hashlib.sha256(data).hexdigest()
    s.close()
    path = os.path.join(tmpdir, "sendfile.bin")
    with open(path, "wb") as f:
        f.write(data)
    s = dial("SHA")
    with open(path, "rb") as f:
        assert s.sendfile(f) == len(data)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(100).decode() == hashlib.sha256(data).hexdigest()
    s.close()


def check_half_close_then_answer():
    """A half-close ends only the client's direction: the server, which was
    blocked reading when it came, can still send everything back."""
    s = dial("HALF 3000000")
    time.sleep(0.3)
    s.shutdown(socket.SHUT_WR)
    got = 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += len(d)
    assert got == 3000000, got
    s.close()


def check_signal_interrupts_recv():
    """A blocked recv on a quiet accelerated socket is interrupted by a signal."""
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()
    old = signal.signal(signal.SIGALRM, handler)
    s = dial("SEND 0")
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    t = time.time()
    try:
        s.recv(10)
        raise AssertionError("recv returned without data")
    except Interrupted:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.time() - t < 2
    s.close()


def check_splice():
    data = os.urandom(1 << 20)
    path = os.path.join(TMPDIR, "splice.bin")
    with open(path, "wb") as f:
        f.write(data)
    s = dial("SHA")
    with open(path, "rb") as f:
        sent = 0
        while sent < len(data):
            n = os.splice(f.fileno(), s.fileno(), len(data) - sent)
            assert n > 0
            sent += n
    s.shutdown(socket.SHUT_WR)
    assert s.recv(100).decode() == hashlib.sha256(data).hexdigest()
    s.close()
    s = dial("SEND 200000")
    r, w = os.pipe()
    got = b""
    while len(got) < 200000:
        n = os.splice(s.fileno(), w, 65536)      # the pipe holds 64 KiB: partial takes
        assert n > 0
        got += os.read(r, n)
    assert got == b"a" * 200000
    os.close(r)
    os.close(w)
    s.close()


def check_epipe():
    s = dial("CLOSE")
    assert s.recv(10) == b""
    try:
        for _ in range(100):
            s.send(b"x" * 1000)
        raise AssertionError("writes to a closed peer kept succeeding")
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.close()


def check_ipv6_and_smc():
    s = dial("ECHO", socket.AF_INET6, "::1")
    assert s.getpeername()[:2] == ("::1", PORT)
    s.sendall(b"six")
    assert recv_exact(s, 3) == b"six"
    s.close()
    # both ends say what their sockets were created as
    for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = dial("DOMAIN", fam, host)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == fam
        assert int(recv_exact(s, 2 if fam < 10 else 3)) == fam
        s.close()
    # what smc_run-style programs do: socket(AF_SMC, SOCK_STREAM, SMCPROTO_SMC) + sockaddr_in
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(AF_SMC, socket.SOCK_STREAM, 0)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    sin = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(PORT), socket.inet_aton("127.0.0.1"))
    assert libc.connect(fd, sin, len(sin)) == 0, os.strerror(ctypes.get_errno())
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == AF_SMC
    s.sendall(b"ECHO\nsmc")
    assert recv_exact(s, 3) == b"smc"
    s.close()


def check_nonblocking_connect():
    s = socket.socket()
    s.setblocking(False)
    rc = s.connect_ex(("127.0.0.1", PORT))
    assert rc in (0, errno.EINPROGRESS), rc
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLOUT | select.EPOLLIN)
    assert ep.poll(2)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    s.setblocking(True)
    s.sendall(b"ECHO\nnb")
    assert recv_exact(s, 2) == b"nb"
    s.close()


def check_fork_then_use():
    s = dial("ECHO")
    pid = os.fork()
    if pid == 0:
        s.sendall(b"A" * 100000)
        os._exit(0)
    os.waitpid(pid, 0)
    s.sendall(b"B" * 100000)
    s.shutdown(socket.SHUT_WR)
    assert recv_all(s) == b"A" * 100000 + b"B" * 100000
    s.close()


def check_concurrent_writers():
    """Two threads and a forked process write at once: no byte lost or doubled."""
    s = dial("ECHO")
    n, size = 200, 1000
    got = []

    def reader():
        got.append(recv_all(s))
    rd = threading.Thread(target=reader)
    rd.start()
    pid = os.fork()
    if pid == 0:
        for _ in range(n):
            s.sendall(b"C" * size)
        os._exit(0)
    writers = [threading.Thread(target=lambda ch=ch: [s.sendall(ch * size) for _ in range(n)])
               for ch in (b"A", b"B")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    os.waitpid(pid, 0)
    s.shutdown(socket.SHUT_WR)
    rd.join()
    data = got[0]
    assert len(data) == 3 * n * size, len(data)
    for ch in b"ABC":
        assert data.count(ch) == n * size, (chr(ch), data.count(ch))
    s.close()


def check_exec_hands_over():
    s = dial("ECHO")
    s.sendall(b"before")
    assert recv_exact(s, 6) == b"before"
    # the program started with the connection (smclo loaded: LD_PRELOAD is
    # inherited) takes it over and talks through it; then the parent goes on
    child = subprocess.run(
        [sys.executable, "-c",
         "import os,sys; fd=int(sys.argv[1]); os.write(fd, b'child')\n"
         "d=b''\n"
         "while len(d) < 5: d+=os.read(fd, 5-len(d))\n"
         "print(repr(d))", str(s.fileno())],
        pass_fds=[s.fileno()], capture_output=True, text=True, timeout=10)
    assert child.stdout.strip() == "b'child'", child.stdout + child.stderr
    s.sendall(b"after")                          # the parent's connection goes on
    assert recv_exact(s, 5) == b"after"
    s.close()


def client(port, tmpdir):
    global PORT, TMPDIR
    PORT = port
    TMPDIR = tmpdir
    checks = [check_identity, check_addresses_mirror, check_recv_flags, check_rcvtimeo, check_readiness,
              lambda: check_half_close_and_sendfile(tmpdir), check_half_close_then_answer,
              check_signal_interrupts_recv, check_splice, check_epipe,
              check_ipv6_and_smc, check_nonblocking_connect, check_fork_then_use,
              check_concurrent_writers, check_exec_hands_over, check_kernel_tls]
    names = ["identity", "addresses_mirror", "recv_flags", "rcvtimeo", "readiness", "half_close_sendfile",
             "half_close_then_answer", "signal_interrupts_recv", "splice",
             "epipe", "ipv6_smc", "nonblocking_connect", "fork_then_use", "concurrent_writers",
             "exec_hands_over", "kernel_tls"]
    for name, fn in zip(names, checks):
        fn()
        print("ok", name, flush=True)


if __name__ == "__main__":
    if sys.argv[1].startswith("server"):
        server(int(sys.argv[2]), sys.argv[1] == "server-blocking")
    else:
        client(int(sys.argv[2]), sys.argv[3])
