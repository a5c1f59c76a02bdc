"""A small TCP peer for the tests, run under `smclo run` as a separate process.

    peer.py echo HOST PORT            echo server: one connection at a time, forever
    peer.py echo-many HOST PORT       echo server: a thread per connection, forever
    peer.py echo-prefork HOST PORT N  listen, then N forked children accept and echo
    peer.py echo-threads HOST PORT N  N threads accept on one listener and echo
    peer.py echo-reuseport HOST PORT  echo-many on an SO_REUSEPORT socket (start two)
    peer.py sink HOST PORT            read and discard, print the byte count at EOF
    peer.py send HOST PORT NBYTES     connect, send NBYTES, half-close, print whether
                                      the echo matched
    peer.py churn HOST PORT N         N connections one after another, each sending a
                                      random amount to the echo server; print "bad K"

The helpers are imported by the other peers of the suite (slowpeer.py).
"""
import errno
import os
import random
import select
import socket
import sys
import threading


def listen(host, port, reuseport=False):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    s.listen(64)
    print("ready", flush=True)
    return s


def connect(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    c = socket.socket(fam, socket.SOCK_STREAM)
    c.connect((host, port))
    return c


def connect_nonblocking(host, port):
    """connect() as an event loop makes it: None if the second call fails."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    c = socket.socket(fam, socket.SOCK_STREAM)
    c.setblocking(False)
    first = c.connect_ex((host, port))
    if first == errno.EINPROGRESS:
        select.select([], [c], [], 5)
        if c.connect_ex((host, port)) not in (0, errno.EISCONN):
            c.close()
            return None
    elif first != 0:
        c.close()
        return None
    c.setblocking(True)
    return c


def echo(c):
    """Send back everything until EOF, then close."""
    while True:
        d = c.recv(1 << 16)
        if not d:
            break
        c.sendall(d)
    c.close()


def exchange(c, data):
    """Send @data, half-close, return all that comes back (read meanwhile,
    so an echo larger than the buffers cannot deadlock)."""
    got = bytearray()

    def reader():
        while True:
            d = c.recv(1 << 16)
            if not d:
                break
            got.extend(d)

    t = threading.Thread(target=reader)
    t.start()
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    t.join()
    return bytes(got)


def main():
    role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "echo":
        s = listen(host, port)
        while True:
            echo(s.accept()[0])
    elif role in ("echo-many", "echo-reuseport"):
        s = listen(host, port, reuseport=role == "echo-reuseport")
        while True:
            threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()
    elif role == "echo-threads":
        s = listen(host, port)

        def acceptor():
            while True:
                echo(s.accept()[0])
        for _ in range(int(sys.argv[4])):
            threading.Thread(target=acceptor, daemon=True).start()
        threading.Event().wait()
    elif role == "echo-prefork":
        s = listen(host, port)
        for _ in range(int(sys.argv[4])):
            if os.fork() == 0:
                while True:
                    echo(s.accept()[0])
        os.wait()
    elif role == "sink":
        s = listen(host, port)
        c, _ = s.accept()
        n = 0
        try:
            while True:
                d = c.recv(1 << 16)
                if not d:
                    break
                n += len(d)
            print("eof", n, flush=True)
        except ConnectionResetError:
            print("reset", n, flush=True)
    elif role == "send":
        data = os.urandom(int(sys.argv[4]))
        ok = exchange(connect(host, port), data) == data
        print("match" if ok else "MISMATCH", flush=True)
        sys.exit(0 if ok else 1)
    elif role == "churn":
        rng = random.Random(7)
        bad = 0
        for _ in range(int(sys.argv[4])):
            data = os.urandom(rng.choice([1, 100, 4096, 70000, 300000, 1500000]))
            c = connect(host, port)
            bad += exchange(c, data) != data
            c.close()
        print("bad", bad, flush=True)
    elif role in ("short", "short-nb", "chatty", "bulk", "bulk-long"):
        # a connection per request: one 100-byte round trip ("short"), or
        # ten; one round trip of 6000 bytes read in pieces of 1000 ("bulk")
        # or of 300 KB ("bulk-long");
        # "short-nb" connects as event loops do (ab): non-blocking, then
        # connect() again once the socket is writable, which must say 0 or
        # EISCONN - any other answer is a failed connection
        bad = 0
        trips = 10 if role == "chatty" else 1
        size = {"bulk": 6000, "bulk-long": 300000}.get(role, 100)
        piece = 1000 if role == "bulk" else 1 << 20
        for _ in range(int(sys.argv[4])):
            c = connect(host, port) if role != "short-nb" else connect_nonblocking(host, port)
            if c is None:
                bad += 1
                continue
            for _ in range(trips):
                data = os.urandom(size)
                c.sendall(data)
                got = b""
                while len(got) < len(data):
                    d = c.recv(min(piece, len(data) - len(got)))
                    if not d:
                        break
                    got += d
                bad += got != data
            c.close()
        print("bad", bad, flush=True)


if __name__ == "__main__":
    main()
