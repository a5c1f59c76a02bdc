"""Peers that are late on purpose, for the handshake-decision tests.

    slowpeer.py server PORT GATE     listen; accept one connection once the file
                                     GATE exists; echo it
    slowpeer.py client PORT NBYTES   connect, send NBYTES, read the echo, print both sha256
"""
import hashlib
import os
import socket
import sys
import time


def main():
    role, port = sys.argv[1], int(sys.argv[2])
    if role == "server":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(4)
        print("ready", flush=True)
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.01)
        c, _ = s.accept()
        print("accepted", flush=True)
        while True:
            d = c.recv(1 << 16)
            if not d:
                break
            c.sendall(d)
        c.close()
    else:
        n = int(sys.argv[3])
        data = os.urandom(n)
        print("connecting", flush=True)
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        got = bytearray()
        while True:
            d = c.recv(1 << 16)
            if not d:
                break
            got += d
        print(hashlib.sha256(got).hexdigest(), hashlib.sha256(data).hexdigest(), flush=True)


main()
