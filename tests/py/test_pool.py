"""Buffer pools of the native API (include/smclo.h, src/api/pool.c) on every
kind of connection.

tests/progs/pool_peer.c holds the scenarios (the server checks every byte at
its offset, the client every completion); this file runs both ends over:
  ring      two programs linked with -lsmclo, no `smclo run`: sends go by
            reference and the server peeks them in the pool (via=pool)
  run       the same under `smclo run`
  copy      smclo disabled at both ends: every send copied, and notified at
            once with SMCLO_CQE_F_COPIED
  plain     a server without smclo against a client with it
  netns     the two ends in two network namespaces over a veth: large sends
            go with the kernel's zero copy - io_uring SEND_ZC, notified in
            its completion queue, or (SMCLO_IO_URING=0) MSG_ZEROCOPY,
            notified on the socket's error queue
"""
import signal
import subprocess

import pytest

from pathlib import Path

from conftest import PY, SMCLO, TESTBIN, VETH_NET, Registry, free_port

PEER = str(TESTBIN / "pool_peer")
SCENARIOS = ["bulk", "hold", "fork", "errors", "shut", "sndtimeo"]


def start_server(procs, env, host, port, scenario, wrap=()):
    srv = procs.start(list(wrap) + [PEER, "serve", host, str(port), scenario], env,
                      smclo=False, text=True)
    assert srv.stdout.readline().strip() == "ready", srv.stderr.read()
    return srv


def run_pair(procs, scenario, srv_env, cli_env, srv_wrap=(), cli_wrap=(), host="127.0.0.1",
             listen="127.0.0.1", server_dies=False):
    port = free_port()
    srv = start_server(procs, srv_env, listen, port, scenario, srv_wrap)
    cli = subprocess.run(list(cli_wrap) + [PEER, "connect", host, str(port), scenario],
                         env=cli_env, capture_output=True, text=True, timeout=120)
    out, err = srv.communicate(timeout=120)
    assert cli.returncode == 0, "client: " + cli.stdout + cli.stderr + "\nserver: " + out + err
    if server_dies:
        assert srv.returncode == -signal.SIGKILL, out + err
    else:
        assert srv.returncode == 0, "server: " + out + err + "\nclient: " + cli.stdout
    return fields(cli.stdout.strip().splitlines()[-1]), fields(out.strip().splitlines()[-1])


def fields(line):
    assert line.startswith(("ok", "holding")), line
    return {k: (int(v) if v.isdigit() else v)
            for k, v in (f.split("=", 1) for f in line.split()[1:] if "=" in f)}


def plain_env(reg):
    return dict(reg.env, SMCLO_DISABLE="1")


def assert_by_reference(cli, srv):
    assert cli["via"] == "ring" and srv["via"] == "ring", (cli, srv)
    assert cli["copied"] == 0 and cli["refs"] == cli["sent"] > 0, cli
    assert cli["reclaimed"] == 0, cli


def assert_copied(cli, srv):
    assert cli["via"] == "copy", cli
    assert cli["copied"] == cli["sent"] > 0 and cli["refs"] == 0, cli
    assert cli["kernel"] == 0, cli      # loopback: the kernel's zero copy would copy
    assert srv.get("pool_peeks", 0) == 0, srv


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ring(reg, procs, scenario):
    """Linked with -lsmclo: sends by reference, read in place."""
    cli, srv = run_pair(procs, scenario, reg.env, reg.env)
    assert_by_reference(cli, srv)
    if scenario == "bulk":
        # 258 sends, notifications merged where they came together
        assert srv["pool_peeks"] > 0 and cli["notif_cqes"] < cli["sent"], (cli, srv)
    st = reg.wait_stats(lambda s: s["accelerated"] >= 2)
    assert st["fallback"] == 0, st["fallback_by_reason"]


@pytest.mark.parametrize("scenario", ["bulk", "hold"])
def test_under_smclo_run(reg, procs, scenario):
    cli, srv = run_pair(procs, scenario, reg.env, reg.env, srv_wrap=[SMCLO, "run", "--"],
                        cli_wrap=[SMCLO, "run", "--"])
    assert_by_reference(cli, srv)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_copy(reg, procs, scenario):
    """smclo disabled at both ends: the same calls, every send copied."""
    env = plain_env(reg)
    cli, srv = run_pair(procs, scenario, env, env)
    assert_copied(cli, srv)


@pytest.mark.parametrize("scenario", ["bulk", "hold"])
def test_plain_peer(reg, procs, scenario):
    """A server without smclo: copied, and the fallback says why."""
    cli, srv = run_pair(procs, scenario, plain_env(reg), reg.env)
    assert_copied(cli, srv)
    st = reg.wait_stats(lambda s: s["fallback"] >= 1)
    assert st["fallback_by_reason"].get("peer-no-smclo") == 1, st["fallback_by_reason"]


def across_veth(two_namespaces, procs, tmp_path, scenario, way):
    """@scenario with the server in one namespace and the client in the other
    (two hosts, each its own registry), the client's large sends by @way:
    (client's figures, server's, (server's registry, client's))."""
    a, b = two_namespaces
    ra, rb = Registry(tmp_path / "a"), Registry(tmp_path / "b")
    cli_env = dict(rb.env, SMCLO_IO_URING="1" if way == "io_uring" else "0")
    cli, srv = run_pair(procs, scenario, ra.env, cli_env,
                        srv_wrap=["ip", "netns", "exec", a], cli_wrap=["ip", "netns", "exec", b],
                        host=VETH_NET + "1", listen="0.0.0.0")
    return cli, srv, (ra, rb)


@pytest.mark.parametrize("way", ["io_uring", "msg_zerocopy"])
def test_other_host_send_timeout(two_namespaces, procs, tmp_path, way):
    """SO_SNDTIMEO bounds a pool send with the kernel's zero copy as it bounds
    send(): the reader stops for 2 s, no send waits much beyond 100 ms (the
    MSG_ZEROCOPY socket's notifications made its wait for room return at
    once, for ever, while the reader did not read)."""
    cli, _, _ = across_veth(two_namespaces, procs, tmp_path, "sndtimeo", way)
    assert cli["kernel"] > 0 and cli["eagain"] + cli["partial"] > 0, cli


@pytest.mark.parametrize("way", ["io_uring", "msg_zerocopy"])
def test_other_host(two_namespaces, procs, tmp_path, way):
    """Two network namespaces over a veth, each with its own registry: large
    sends go with io_uring's SEND_ZC by default, with MSG_ZEROCOPY when
    SMCLO_IO_URING=0."""
    cli, srv, (ra, rb) = across_veth(two_namespaces, procs, tmp_path, "bulk", way)
    # sends of 10 KiB or more went with the kernel's zero copy, and the
    # kernel's own notifications freed their buffers (pool_peer waited for
    # every one); across a veth into another namespace the kernel copies
    # them after all and says so (SMCLO_CQE_F_COPIED), as over loopback
    assert cli["via"] == "copy" and cli["refs"] == 0, cli
    assert 0 < cli["kernel"] < cli["sent"], cli
    assert srv.get("pool_peeks", 0) == 0, srv
    if way == "io_uring":
        # each kernel send: its request's completion and its notification
        assert cli["uring_cqes"] >= 2 * cli["kernel"], cli
    else:
        assert cli["uring_cqes"] == 0, cli
    assert ra.stats()["accelerated"] == 0 and rb.stats()["accelerated"] == 0


@pytest.mark.parametrize("kind", ["ring", "copy"])
def test_reader_killed_holding(reg, procs, kind):
    """The reader dies holding a peek of a referenced buffer: the pool's
    descriptor wakes and every buffer out comes back, reclaimed."""
    env = reg.env if kind == "ring" else plain_env(reg)
    cli, _ = run_pair(procs, "killed", env, env, server_dies=True)
    if kind == "ring":
        # the sends before the reader died (a later one fails with EPIPE)
        assert cli["reclaimed"] == cli["sent"] >= 1 and cli["copied"] == 0, cli
    else:
        assert cli["copied"] == cli["sent"], cli


def test_reader_killed_after_both_shut(reg, procs):
    """Both ends shut down writing, then the reader dies without reading 8
    buffers sent by reference: the connection's hang-up says nothing then
    (both directions are shut either way), the pool's release socket does -
    every buffer comes back, reclaimed (before: only at destroy)."""
    cli, srv = run_pair(procs, "shutkilled", reg.env, reg.env, server_dies=True)
    assert cli["via"] == "ring" and srv["via"] == "ring", (cli, srv)
    assert cli["reclaimed"] == cli["sent"] == 8 and cli["refs"] == 0, cli


def test_reader_killed_after_our_close(reg, procs):
    """We close the connection with 8 buffers unread, then the reader dies
    without reading them: the pool outlives our descriptor, and every
    buffer comes back to it, reclaimed (before: only at destroy)."""
    cli, srv = run_pair(procs, "closekilled", reg.env, reg.env, server_dies=True)
    assert cli["via"] == "ring" and srv["via"] == "ring", (cli, srv)
    assert cli["reclaimed"] == cli["sent"] == 8 and cli["refs"] == 0, cli


def run_scripts(reg, procs, server, client, *args):
    """Python scripts using smclo_api at both ends under smclo run: the
    server's (its port the last argument) and the client's (@args, then
    the port); both must succeed.  (client's result, server's output)."""
    port = free_port()
    env = dict(reg.env, PYTHONPATH=str(Path(__file__).parent))
    srv = procs.start([PY, "-c", server, str(port)], env, text=True)
    assert srv.stdout.readline().strip() == "ready", srv.stderr.read()
    cli = reg.run([PY, "-c", client] + list(args) + [str(port)], env=env, timeout=60)
    out, err = srv.communicate(timeout=30)
    assert cli.returncode == 0, cli.stdout + cli.stderr + "\nserver: " + out + err
    assert srv.returncode == 0, out + err
    return cli, out


# both servers: take a connection, its first byte, make a pool for it
SERVER_START = r"""
import ctypes, socket, sys
import smclo_api as A
ls = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
c, _ = ls.accept()
assert c.recv(1) == b"!"
pool = A.lib.smclo_pool_create(c.fileno(), 4096, 4, 0)
assert pool
"""

FORKED_READER_SERVER = SERVER_START + r"""c.sendall(b"x")                 # the child's read takes it, and the pool's doorbell
assert c.recv(1) == b"c"        # the child is gone
b = A.lib.smclo_pool_get(pool)
ctypes.memmove(b, b"hello", 5)
assert A.lib.smclo_pool_send(pool, b, 5, 7, 0) == 5
assert c.recv(3) == b"bye"
cq = (A.Cqe * 8)()
n = A.lib.smclo_reap(pool, cq, 8)
print("flags", sorted(cq[i].flags for i in range(n)), flush=True)
"""

FORKED_READER_CLIENT = r"""
import os, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"!")
pid = os.fork()
if pid == 0:
    os._exit(0 if c.recv(1) == b"x" else 1)
_, status = os.waitpid(pid, 0)
assert status == 0, status
c.sendall(b"c")
got = b""
while len(got) < 5:
    d = c.recv(5 - len(got))
    assert d, got
    got += d
c.sendall(b"bye")
print("read", got.decode(), flush=True)
"""


def test_reader_forked_before_the_pool(reg, procs):
    """The receiving process forked before the pool came, and its child took
    the doorbell that carried it: the pool is refused (a fork sibling that
    holds the connection too could not read references into a mapping only
    one of them has), and the sends are copies - no reset, every byte there."""
    cli, out = run_scripts(reg, procs, FORKED_READER_SERVER, FORKED_READER_CLIENT)
    assert cli.stdout.strip() == "read hello", cli.stdout + cli.stderr
    # the request (MORE), then the notification: NOTIF | COPIED
    assert out.strip() == "flags [1, 6]", out + err
    assert reg.stats()["accelerated"] == 2


HANDED_OVER_SERVER = SERVER_START + r"""c.sendall(b"x")                 # its read takes the pool too
assert c.recv(1) == b"a"
cq, flags = (A.Cqe * 8)(), []


def send(data):
    b = A.lib.smclo_pool_get(pool)
    ctypes.memmove(b, data, len(data))
    assert A.lib.smclo_pool_send(pool, b, len(data), 0, 0) == len(data)


send(b"hello")                  # unread when the reader hands the connection on
assert c.recv(1) == b"b"        # from the program it went to
send(b"world")
assert c.recv(3) == b"bye"
n = A.lib.smclo_reap(pool, cq, 8)
print(" ".join("%d:%d" % (cq[i].flags, cq[i].count) for i in range(n)), flush=True)
"""

# the reader: takes the pool, then hands the connection to another program
# (exec) or process (SCM_RIGHTS) with a referenced buffer unread
HANDED_OVER_CLIENT = r"""
import os, socket, sys, time
how, port = sys.argv[1], int(sys.argv[2])
NEXT = '''
import socket, sys
c = socket.socket(fileno=int(sys.argv[1]))
def exact(n):
    got = b""
    while len(got) < n:
        d = c.recv(n - len(got))
        assert d, got
        got += d
    return got
first = exact(5)
c.sendall(b"b")
second = exact(5)
c.sendall(b"bye")
print("read", (first + second).decode(), flush=True)
'''
if how == "passfd":
    us, them = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:                # a process of its own, not a holder yet
        _, fds, _, _ = socket.recv_fds(them, 1, 1)
        os.execv(sys.executable, [sys.executable, "-c", NEXT, str(fds[0])])
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"!")
assert c.recv(1) == b"x"
c.sendall(b"a")
time.sleep(0.3)                 # the reference is in the ring now, unread
if how == "exec":
    os.set_inheritable(c.fileno(), True)
    os.execv(sys.executable, [sys.executable, "-c", NEXT, str(c.fileno())])
socket.send_fds(us, [b"c"], [c.fileno()])
c.close()
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("how", ["exec", "passfd"])
def test_pool_follows_the_connection(reg, procs, how):
    """The reader hands the connection to a program it execs, or to another
    process with SCM_RIGHTS, while a buffer sent by reference is unread:
    the peer's pool goes along (mapped again there), the unread reference
    and the ones after it are read there, and every send was by reference."""
    cli, out = run_scripts(reg, procs, HANDED_OVER_SERVER, HANDED_OVER_CLIENT, how)
    assert "read helloworld" in cli.stdout, cli.stdout + cli.stderr
    # two requests (MORE), then notifications of both, by reference: no
    # COPIED, nothing RECLAIMED
    cqes = [tuple(map(int, f.split(":"))) for f in out.split()]
    assert sorted(f for f, _ in cqes if f & 1) == [1, 1], out
    assert [f for f, _ in cqes if f & 2] and all(f == 2 for f, _ in cqes if f & 2), out
    assert sum(n for f, n in cqes if f & 2) == 2, out


@pytest.mark.parametrize("way", ["io_uring", "msg_zerocopy"])
def test_other_host_without_memlock(two_namespaces, procs, tmp_path, way):
    """The sender is a user without CAP_IPC_LOCK whose RLIMIT_MEMLOCK (64
    KiB) covers neither the pool's registration nor a send's pinning: the
    kernel refuses to pin (ENOMEM, ENOBUFS) and every send is copied
    instead - none fails - and notified with SMCLO_CQE_F_COPIED."""
    a, b = two_namespaces
    ra = Registry(tmp_path / "a")
    cli_env = dict(ra.env, SMCLO_DISABLE="1", SMCLO_IO_URING="1" if way == "io_uring" else "0")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
              "prlimit", "--memlock=65536:65536"]
    cli, srv = run_pair(procs, "bulk", ra.env, cli_env,
                        srv_wrap=["ip", "netns", "exec", a],
                        cli_wrap=["ip", "netns", "exec", b] + nobody,
                        host=VETH_NET + "1", listen="0.0.0.0")
    assert cli["via"] == "copy" and cli["copied"] == cli["sent"] > 0, cli
    assert srv.get("pool_peeks", 0) == 0, srv
    # the few small enough to pin within the limit went with the kernel
    assert cli["kernel"] < cli["sent"] // 4, cli
