"""A small TCP peer for the tests, run under `smclo run` as a separate process.

    peer.py echo HOST PORT            echo server: one connection at a time, forever
    peer.py sink HOST PORT            read and discard, print the byte count at EOF
    peer.py send HOST PORT NBYTES     connect, send NBYTES, half-close, print the echo's sha256
"""
import hashlib
import os
import socket
import sys


def listen(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(64)
    print("ready", flush=True)
    return s


def main():
    role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "echo":
        s = listen(host, port)
        while True:
            c, _ = s.accept()
            while True:
                d = c.recv(1 << 16)
                if not d:
                    break
                c.sendall(d)
            c.close()
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
        nbytes = int(sys.argv[4])
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        c = socket.socket(fam, socket.SOCK_STREAM)
        c.connect((host, port))
        data = os.urandom(nbytes)
        h = hashlib.sha256()
        import threading

        def reader():
            while True:
                d = c.recv(1 << 16)
                if not d:
                    break
                h.update(d)
        t = threading.Thread(target=reader)
        t.start()
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        t.join()
        ok = h.hexdigest() == hashlib.sha256(data).hexdigest()
        print("match" if ok else "MISMATCH", flush=True)
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
