"""The client side of test_matrix.py: N echo exchanges, checked byte for byte.

    matrix_client.py PORT N SEED [--greet] [--hold] [--rlimit N] [--fdpass]
                     [--epoll-early] [--api] [--pool]

Each connection sends a random amount (1 B to 300 KB, log-uniform, the
first and last of each case 1 B and 300 KB) of random bytes, half-closes,
and reads the echo until EOF, concurrently (a reader thread), so the echo
can never stall on full buffers.  --greet: wait for the server's greeting
byte b"G" before sending.  --hold: open every connection first and keep
them all open until the last exchange.  --rlimit: lower RLIMIT_NOFILE first.
--fdpass: each connection is made by a child process that passes it back
over SCM_RIGHTS and exits at once (ssh's ProxyUseFdpass).  --epoll-early:
each connection is nginx's upstream one: a non-blocking socket put into an
edge-triggered epoll set before connect(), every wait through that set.
--api: each exchange through the native API (smclo_api.py): the bytes are
written in place into claims and read in place from peeks.
--pool: each connection sends from a buffer pool of its own (smclo_api.Pool):
by reference once the server mapped the pool, by copy before and on TCP.
Every socket wait is bounded (SO_RCVTIMEO / SO_SNDTIMEO, 5 s), and so is
the whole run: connections not begun after 40 s are reported as not tried.
Prints one JSON line: {"ok": count, "bad": [descriptions]}.
"""
import errno
import json
import os
import random
import resource
import select
import socket
import struct
import sys
import threading
import time

TIMEOUT = 5.0
BUDGET = 40.0


def sizes(n, rng):
    out = [int(10 ** rng.uniform(0, 5.48)) for _ in range(n)]
    out[0], out[-1] = 1, 300_000
    return out


def connect_passed(port):
    """A child connects and hands the socket over, then exits."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            a.close()
            c = connect(port, False)
            socket.send_fds(b, [b"c"], [c.fileno()])
            code = 0
        finally:
            os._exit(code)
    b.close()
    a.settimeout(TIMEOUT)
    try:
        _, fds, _, _ = socket.recv_fds(a, 16, 1)
    finally:
        a.close()
        os.waitpid(pid, 0)
    if not fds:
        raise RuntimeError("the helper passed no descriptor")
    return socket.socket(fileno=fds[0])


def exchange_epoll_early(port, data, greet):
    """nginx's upstream connect: a non-blocking socket put into an
    edge-triggered epoll set (IN|OUT|RDHUP) before connect(), then every
    wait through that set.  Returns None, or what went wrong."""
    c = socket.socket()
    c.setblocking(False)
    ep = select.epoll()
    ep.register(c.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP | select.EPOLLET)
    try:
        rc = c.connect_ex(("127.0.0.1", port))
        if rc not in (0, errno.EINPROGRESS):
            return "connect: %s" % errno.errorcode.get(rc, rc)
        got, sent, shut, want = bytearray(), 0, False, (1 if greet else 0) + len(data)
        deadline = time.monotonic() + TIMEOUT
        while len(got) < want or not shut:
            if not ep.poll(max(0.0, deadline - time.monotonic())):
                return "no epoll event for %.0f s: sent %d, got %d" % (TIMEOUT, sent, len(got))
            while sent < len(data):
                try:
                    sent += c.send(data[sent:sent + (1 << 16)])
                except BlockingIOError:
                    break
            if sent == len(data) and not shut:
                c.shutdown(socket.SHUT_WR)
                shut = True
            while True:
                try:
                    d = c.recv(1 << 16)
                except BlockingIOError:
                    break
                if not d:
                    break
                got.extend(d)
        if greet:
            if got[:1] != b"G":
                return "greeting %r" % bytes(got[:1])
            got = got[1:]
        return None if bytes(got) == data else "sent %d, got %d back (or other bytes)" % (
            len(data), len(got))
    finally:
        ep.close()
        c.close()


def connect(port, greet, fdpass=False):
    if fdpass:
        c = connect_passed(port)
        if greet and c.recv(1) != b"G":
            raise RuntimeError("no greeting")
        return c
    c = socket.socket()
    tv = struct.pack("ll", int(TIMEOUT), 0)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    c.connect(("127.0.0.1", port))
    if greet:
        g = c.recv(1)
        if g != b"G":
            raise RuntimeError("greeting %r" % g)
    return c


def try_kernel_tls(c):
    """OpenSSL's first steps into kernel TLS.  Under smclo they are refused
    as a kernel without TLS refuses them (docs/design.md §8), whatever path
    the connection took; without smclo the kernel answers for itself.
    Returns what went wrong, or None."""
    under_smclo = "smclo" in os.environ.get("LD_PRELOAD", "")
    for level, opt, val, want in ((socket.IPPROTO_TCP, 31, b"tls", errno.ENOENT),      # TCP_ULP
                                  (282, 1, b"\0" * 40, errno.ENOPROTOOPT)):          # SOL_TLS, TLS_TX
        try:
            c.setsockopt(level, opt, val)
            got = 0
        except OSError as e:
            got = e.errno
        if under_smclo and got != want:
            return "setsockopt(%d, %d): errno %d, not %d" % (level, opt, got, want)
    return None


def exchange(c, data, api=None, pool=False, seccomp=False, urgent=False):
    got = bytearray()
    err = []
    sender = api.Pool(c.fileno()) if pool else None

    def reader():
        try:
            while True:
                d = api.recv(c.fileno()) if api else c.recv(1 << 16)
                if not d:
                    return
                got.extend(d)
        except OSError as e:
            err.append("recv after %d bytes: %r" % (len(got), e))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        if sender:
            # the first buffer goes by copy (the server has not mapped the
            # pool yet); once its echo is back the server has read the
            # ring empty and mapped the pool, so the rest goes by reference
            first = min(len(data), sender.size)
            sender.sendall(data[:first])
            deadline = time.monotonic() + TIMEOUT
            while len(got) < first and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)
            sender.sendall(data[first:])
        elif api:
            api.sendall(c.fileno(), data)
        elif urgent:
            # an urgent byte halfway: out of band, so the echo is the rest;
            # under smclo the connection moves to TCP for it (core/move.c)
            c.sendall(data[:len(data) // 2])
            c.send(b"U", socket.MSG_OOB)
            c.sendall(data[len(data) // 2:])
        elif seccomp:
            # half the bytes in the rings, then a filter (every system call
            # allowed): smclo moves the connection to TCP under way, the
            # reader blocked or reading, the echo coming back
            c.sendall(data[:len(data) // 2])
            import matrix_server
            matrix_server.seccomp_allow_all()
            c.sendall(data[len(data) // 2:])
        else:
            c.sendall(data)
        c.shutdown(socket.SHUT_WR)
    except OSError as e:
        err.append("send: %r" % e)
    t.join(TIMEOUT + 5)
    if t.is_alive():
        err.append("reader hung after %d bytes" % len(got))
    if sender:
        sender.close()
    if err:
        return "; ".join(err)
    if bytes(got) != data:
        at = next((i for i, (a, b) in enumerate(zip(got, data)) if a != b), min(len(got), len(data)))
        return "sent %d, got %d back, first difference at %d" % (len(data), len(got), at)
    return None


def in_child(fn):
    """fn() in a fork child (one that confines itself accelerates nothing
    new afterwards, as smclo's sandboxed processes do): what it returns."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            why = fn()
        except Exception as e:
            why = "child: %r" % e
        os.write(w, (why or "").encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return why or (None if status == 0 else "child ended with status %d" % status)


def main():
    port, n, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    opts = sys.argv[4:]
    if "--rlimit" in opts:
        lim = int(opts[opts.index("--rlimit") + 1])
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim, lim))
    greet, hold, fdpass = "--greet" in opts, "--hold" in opts, "--fdpass" in opts
    epoll_early = "--epoll-early" in opts
    ktls = "--ktls" in opts
    seccomp = "--seccomp" in opts
    urgent = "--urgent" in opts
    api = None
    pool = "--pool" in opts
    if "--api" in opts or pool:
        import smclo_api as api
    rng = random.Random(seed)
    ok, bad = 0, []
    held = []
    deadline = time.monotonic() + BUDGET
    if hold:
        for i in range(n):
            if time.monotonic() > deadline:
                bad.append("connection %d: not opened, out of time" % i)
                held.append(None)
                continue
            try:
                held.append(connect(port, greet, fdpass))
            except Exception as e:
                bad.append("connection %d: connect: %r" % (i, e))
                held.append(None)
    for i, size in enumerate(sizes(n, rng)):
        data = rng.randbytes(size)
        if time.monotonic() > deadline:
            bad.append("connections %d to %d: not tried, out of time" % (i, n - 1))
            break
        if epoll_early or seccomp:
            why = (exchange_epoll_early(port, data, greet) if epoll_early
                   else in_child(lambda: exchange(connect(port, greet), data, seccomp=True)))
            if why:
                bad.append("connection %d (%d B): %s" % (i, size, why))
            else:
                ok += 1
            continue
        try:
            c = held[i] if hold else connect(port, greet, fdpass)
        except Exception as e:
            bad.append("connection %d: connect: %r" % (i, e))
            continue
        if c is None:
            continue
        why = try_kernel_tls(c) if ktls else None
        why = why or exchange(c, data, api, pool, seccomp, urgent)
        if why:
            bad.append("connection %d (%d B): %s" % (i, size, why))
        else:
            ok += 1
        if not hold:
            c.close()
    for c in held:
        if c is not None:
            c.close()
    print(json.dumps({"ok": ok, "bad": bad}), flush=True)


if __name__ == "__main__":
    main()
