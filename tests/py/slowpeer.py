"""Peers that are late on purpose, for the handshake-decision tests.

    slowpeer.py server PORT GATE [forked]
                                     listen; accept one connection once the file
                                     GATE exists; echo it.  "forked": a child holds
                                     the listener too, so clients cannot use the
                                     inbox handshake (inbox.h) and use the rendezvous
    slowpeer.py client PORT NBYTES   say "connecting", connect, exchange NBYTES with
                                     the echo; print "match" or "MISMATCH".  Up to
                                     64 KiB are written before anything is read
"""
import os
import socket
import sys
import time

from peer import connect, echo, exchange, listen


def main():
    role, port = sys.argv[1], int(sys.argv[2])
    if role == "server":
        s = listen("127.0.0.1", port)
        if sys.argv[4:] == ["forked"] and os.fork() == 0:
            parent = os.getppid()
            while os.getppid() == parent:
                time.sleep(0.05)
            os._exit(0)
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.01)
        c, _ = s.accept()
        print("accepted", flush=True)
        echo(c)
    else:
        data = os.urandom(int(sys.argv[3]))
        print("connecting", flush=True)
        c = connect("127.0.0.1", port)
        if len(data) <= 65536:          # write first: the bytes may wait in the ring
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            got = b""
            while (d := c.recv(65536)):
                got += d
            ok = got == data
        else:
            ok = exchange(c, data) == data
        print("match" if ok else "MISMATCH", flush=True)


main()
