"""Fallback: whatever cannot be accelerated works over TCP, loses nothing,
and names its reason."""
import os
import subprocess

import pytest

from conftest import PY, SMCLO, TESTBIN, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def send_and_check(reg, port, nbytes=3 << 20, smclo=True, host="127.0.0.1", env=None):
    cmd = [PY, PEER, "send", host, str(port), str(nbytes)]
    if smclo:
        r = reg.run(cmd, env=env or reg.env)
    else:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "match", r.stdout + r.stderr


def test_smclo_client_plain_server(reg, procs):
    port = free_port()
    srv = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], reg.env, smclo=False)
    wait_port(port, proc=srv)
    send_and_check(reg, port)
    st = reg.stats()
    assert st["accelerated"] == 0
    assert st["fallback_by_reason"]["peer-no-smclo"] == 1, st


def test_plain_client_smclo_server(reg, procs):
    port = free_port()
    srv = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    send_and_check(reg, port, smclo=False)
    st = reg.stats()
    assert st["accelerated"] == 0
    assert st["fallback_by_reason"]["peer-no-smclo"] == 1, st


# An smclo server hands each connection to a program it executes (inetd
# style); the child echoes one message through the inherited descriptor.
EXEC_SERVER = r"""
import socket, subprocess, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen()
c, _ = l.accept()
child = "import socket; s = socket.socket(fileno=%d); s.sendall(s.recv(100))" % c.fileno()
subprocess.run([sys.executable, "-c", child], pass_fds=(c.fileno(),), check=True)
"""


def test_tcp_connection_survives_exec(reg, procs):
    """A connection left on TCP is the real socket: a program the server
    executes gets it intact (test_exec.py: accelerated ones are handed over)."""
    port = free_port()
    srv = procs.start([PY, "-c", EXEC_SERVER, str(port)], reg.env)
    wait_port(port, proc=srv)
    send_and_check(reg, port, nbytes=100, smclo=False)
    assert srv.wait(timeout=30) == 0, srv.stderr.read()
    assert reg.stats()["fallback_by_reason"]["peer-no-smclo"] == 1


def test_live_connection_listed_with_reason(reg, procs):
    """`smclo stat` shows a fallback connection while it is open, with its reason."""
    port = free_port()
    srv = procs.start([PY, PEER, "sink", "127.0.0.1", str(port)], reg.env, smclo=False)
    wait_port(port, proc=srv)
    cli = procs.start([PY, "-c", "import socket,time; s=socket.create_connection(('127.0.0.1',%d));"
                       "s.sendall(b'x'*1000); print('sent', flush=True); time.sleep(30)" % port],
                      reg.env, text=True)
    assert cli.stdout.readline().strip() == "sent"
    conns = reg.stat()
    mine = [c for c in conns if c["peer"] == "127.0.0.1:%d" % port]
    assert len(mine) == 1, conns
    assert mine[0]["mode"] == "tcp" and mine[0]["reason"] == "peer-no-smclo"
    assert mine[0]["role"] == "client"


def test_different_user_allowed_unless_restricted(shared_dir, procs):
    """A shared registry, a server as root and a client as nobody: accelerated
    by default, declined (and named by both ends) when either side says
    SMCLO_ALLOW_UIDS=self."""
    assert os.geteuid() == 0, "this test runs a second user and needs root (CI is root)"
    from conftest import Registry
    reg = Registry(shared_dir)
    stress = str(TESTBIN / "stress")
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

    def round_trip(server_env, client_env, port):
        srv = procs.start([stress, "server", str(port), "lt"], server_env)
        wait_port(port, proc=srv)
        r = subprocess.run(as_nobody + [SMCLO, "run", "--", stress, "client", str(port), "1", "3",
                                        "5"], env=client_env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
        procs.stop(srv)

    round_trip(reg.env, reg.env, free_port())
    st = reg.stats()
    assert st["accelerated_server"] == 3 and st["accelerated_client"] == 3, st

    # either side may keep to its own user: both ends name the reason
    self_only = dict(reg.env, SMCLO_ALLOW_UIDS="self")
    round_trip(self_only, reg.env, free_port())
    round_trip(reg.env, self_only, free_port())
    st = reg.stats()
    assert st["accelerated"] == 6, st
    assert st["fallback_by_reason"]["different-user"] == 12, st

    # or name the users it accepts
    round_trip(dict(reg.env, SMCLO_ALLOW_UIDS="65534"), dict(reg.env, SMCLO_ALLOW_UIDS="0"),
               free_port())
    st = reg.stats()
    assert st["accelerated_server"] == 6 and st["accelerated_client"] == 6, st


def test_disable(reg, procs):
    port = free_port()
    env = dict(reg.env, SMCLO_DISABLE="1")
    srv = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], env)
    wait_port(port, proc=srv)
    send_and_check(reg, port, env=env)
    assert not (reg.path / "t").exists() or reg.stats()["accelerated"] == 0
    assert reg.entries("l") == []


def test_bad_configuration_is_reported(reg):
    env = dict(reg.env, SMCLO_WMEM="3k")
    r = subprocess.run([SMCLO, "run", "--", "true"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "SMCLO_WMEM=3k" in r.stderr, r.stderr
    r = subprocess.run([SMCLO, "run", "-t", "100k", "--", "true"], env=reg.env,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "power of two" in r.stderr, r.stderr
    r = subprocess.run([SMCLO, "frobnicate"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown command" in r.stderr
    # set behind smclo run's back, the library says so and stays out of the way
    env = dict(reg.env, LD_PRELOAD=str(TESTBIN.parent / "libsmclo.so"), SMCLO_HANDSHAKE_MS="x")
    r = subprocess.run(["true"], env=env, capture_output=True, text=True)
    assert "SMCLO_HANDSHAKE_MS=x" in r.stderr and "disabled" in r.stderr


def test_declined_clients_are_named_at_both_ends(shared_dir, procs):
    """A server that waits in accept() (direct-capable) declines a client of
    another user (the client allows the server's uid, the server keeps to its
    own, SMCLO_ALLOW_UIDS=self): every connection is TCP with different-user at both
    ends.  A listener that went direct after its first decline counted the
    following connections peer-no-smclo at its end (their declined direct
    offers leave no connection behind to count)."""
    assert os.geteuid() == 0, "this test runs a second user and needs root (CI is root)"
    from conftest import Registry
    reg = Registry(shared_dir)
    port = free_port()
    srv = procs.start([SMCLO, "__bench-worker", "server", str(port), "connect", "100", "0"],
                      dict(reg.env, SMCLO_ALLOW_UIDS="self"), text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        SMCLO, "run", "--", SMCLO, "__bench-worker", "client", str(port),
                        "connect", "100", "0.2"], env=dict(reg.env, SMCLO_ALLOW_UIDS="0"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("value"), r.stdout + r.stderr
    srv.wait(timeout=10)
    st = reg.stats()
    assert st["accelerated"] == 0 and st["fallback"] >= 20, st
    assert st["fallback_by_reason"]["different-user"] == st["fallback"], st["fallback_by_reason"]
