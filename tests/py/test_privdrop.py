"""A server started as root that drops its privileges after listen(), as
nginx's workers, many daemons and `su`-style launchers do.

The registry is root's (0700), so after setuid(nobody) the server can no
longer make its connection table there.  That failure once returned with
the table's lock held, and the next connection hung the server for ever
(nginx measured 0 requests/s).  Now every connection is served, byte for
byte, and never waits: before the uid changes, the server's listener
entries say that nobody here can use the registry, and clients take TCP at
once (no-registry) instead of waiting out the handshake timeout.
"""
import os

from conftest import PY, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")

DROPPING_SERVER = r"""
import os, socket, sys, threading
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(64)
os.setgroups([]); os.setgid(65534); os.setuid(65534)
print("ready", flush=True)
def serve(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def test_setuid_after_listen_serves_every_connection(reg, procs):
    port = free_port()
    srv = procs.start([PY, "-c", DROPPING_SERVER, str(port)], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, PEER, "churn", "127.0.0.1", str(port), "20"], timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    assert srv.poll() is None, "the server died: exit %s" % srv.returncode
    # not attached, said why, and nobody waited for a handshake
    st = reg.stats()
    assert st["accelerated"] == 0, st
    assert st["fallback_by_reason"]["no-registry"] == 20, st
    assert st["fallback_by_reason"]["timeout"] == 0, st
