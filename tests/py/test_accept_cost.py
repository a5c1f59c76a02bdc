"""What accepting a plain (non-smclo) client costs an smclo server: no
system call beyond its own.  The registry counts the offers clients send,
so a server whose inbox was empty reads it again only when that count has
moved (inbox.c), the peer's address comes with the accept itself
(shim/socket.c) and its own is not asked (server.c, hs_accept) - yet an smclo client arriving later is still accelerated
through the inbox."""
import os
import subprocess

from conftest import PY, free_port, need, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def calls(trace, name):
    return sum(1 for line in open(trace) if name + "(" in line)


def test_plain_clients_cost_the_server_no_inbox_read(reg, procs, tmp_path):
    need("strace")
    port = free_port()
    trace = tmp_path / "server.strace"
    srv = procs.start(["strace", "-f", "-qq", "-o", str(trace), "-e",
                       "trace=recvmsg,getpeername,getsockname,accept4", PY, PEER, "echo", "127.0.0.1",
                       str(port)], env=reg.env)
    wait_port(port, proc=srv)
    plain = subprocess.run([PY, PEER, "short", "127.0.0.1", str(port), "50"],
                           capture_output=True, text=True, timeout=120)
    assert plain.stdout.split() == ["bad", "0"], plain.stdout + plain.stderr
    accepted = calls(trace, "accept4")
    assert accepted >= 50, open(trace).read()
    # the first accept finds the inbox empty once; the other 49 do not look
    assert calls(trace, "recvmsg") <= 1, open(trace).read()
    assert calls(trace, "getpeername") == 0, open(trace).read()
    # nor its own address: Python asks it once per accepted socket, the
    # listener's announcement twice, smclo's first accept (inbox unread) once
    assert calls(trace, "getsockname") <= accepted + 3, open(trace).read()

    # an offer moves the count: the server reads its inbox and takes it
    r = reg.run([PY, PEER, "short", "127.0.0.1", str(port), "3"])
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["inbox_handshakes"] >= 3)
    assert st["accelerated_client"] == 3 and st["inbox_handshakes"] == 3, st
    assert st["fallback_by_reason"].get("peer-no-smclo", 0) == 50, st
