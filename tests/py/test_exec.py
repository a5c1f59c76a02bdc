"""A connection handed to a program the server starts with it on stdin and
stdout (inetd, systemd Accept=yes, sshd's re-exec), through every libc
entry that starts a program.

glibc's execl, execle, execlp, execv, execvp, fexecve, posix_spawn and
system reach the kernel through an internal execve that a preload library
cannot see; each is interposed (exec.c, spawn.c).  When the new program
loads smclo too (LD_PRELOAD is inherited) the connection is handed over
(handover.c) and goes on accelerated, byte for byte: it used to end in a
clean EOF after 0 bytes, or ECONNRESET.  When it cannot, the connection
goes on over TCP, what the ring held sent again by the peer; failing that
(a peer that does nothing smclo sees meanwhile), the client sees a reset,
never a silent end of file, and the reason is counted.
"""
import os
import random
import socket
import subprocess

import pytest

from conftest import PY, SMCLO, TESTBIN, free_port, go_build, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
SERVER = str(TESTBIN / "exec_server")

WAYS = ["execl", "execle", "execlp", "execv", "execvp", "execve", "fexecve", "execveat",
        "posix_spawn", "posix_spawnp", "posix_spawn_closefrom", "system", "popen", "vfork"]


@pytest.mark.parametrize("how", WAYS)
def test_handed_over_and_accelerated(reg, procs, how):
    port = free_port()
    srv = procs.start([SERVER, str(port), how], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, PEER, "churn", "127.0.0.1", str(port), "20"], timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 20, st
    assert sum(st["fallback_by_reason"].values()) == 0, st


# Connects, sends, and reports what the server's side did: echoed it all,
# reset, or ended the stream early (a silent loss).  Optional: a pause
# after sending in which it does nothing smclo sees (a process busy
# elsewhere), and a greeting it reads before sending.
CLIENT = r"""
import errno, os, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0
greeting = sys.argv[4].encode() if len(sys.argv) > 4 else b""
for _ in range(n):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(10)
    data = os.urandom(100000)
    try:
        got = b""
        while len(got) < len(greeting):
            d = c.recv(len(greeting) - len(got))
            if not d:
                break
            got += d
        assert got == greeting, got
        c.sendall(data)
        time.sleep(pause)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            d = c.recv(65536)
            if not d:
                break
            got += d
        print("match" if got == data else "short %d" % len(got))
    except (ConnectionResetError, BrokenPipeError):
        print("reset")
    except OSError as e:       # shutdown() of a connection reset meanwhile
        print("reset" if e.errno == errno.ENOTCONN else repr(e))
    c.close()
"""


def test_program_without_smclo_gets_the_bytes_again(reg, procs):
    """execle with an environment that drops LD_PRELOAD, the client's 100 KB
    and its shutdown in the ring: cat cannot take the connection over, nor
    read the ring, so the connection moves to TCP and the client, woken by
    the move, sends them again over TCP (core/move.c, "sent again") before
    cat starts: byte exact (it was a reset)."""
    assert_goes_on_over_tcp(reg, procs, ["execle-bare"])


def assert_goes_on_over_tcp(reg, procs, how):
    """5 connections to exec_server started the @how way, once the client's
    bytes are in the ring: each echoed byte exact over TCP, counted as
    moved (handed-on at the server, peer-moved at the client), none reset."""
    port = free_port()
    srv = procs.start([SERVER, str(port)] + how, dict(reg.env, EXEC_SERVER_WAIT_DATA="1"))
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), "5"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["match"] * 5, r.stdout
    st = reg.stats()
    assert st["accelerated_client"] == 5 and sum(st["fallback_by_reason"].values()) == 0, st
    assert st["moved_by_reason"]["handed-on"] == 5, st
    assert st["moved_by_reason"]["peer-moved"] == 5, st


def test_idle_peer_gets_a_reset(reg, procs):
    """The same, but the client sits in sleep() when the handler starts:
    nothing of smclo runs there to send its bytes again, so after the
    handshake timeout the handler gets a reset socket and the client hears
    a reset - never a silent end - counted exec-no-smclo."""
    port = free_port()
    # the server's wait for the bytes well inside the client's sleep
    srv = procs.start([SERVER, str(port), "execle-bare"],
                      dict(reg.env, EXEC_SERVER_WAIT_DATA="1", SMCLO_HANDSHAKE_MS="300"))
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), "3", "2"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["reset"] * 3, r.stdout
    st = reg.stats()
    assert st["fallback_by_reason"]["exec-no-smclo"] == 3, st


STDIO_CLIENT = r"""
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); c.settimeout(10)
lines = b"".join(b"line %d of the request\n" % i for i in range(2000))
got = b""
try:
    c.sendall(lines); c.shutdown(socket.SHUT_WR)
    while True:
        d = c.recv(65536)
        if not d:
            break
        got += d
except (ConnectionResetError, BrokenPipeError):
    print("reset")
    sys.exit(0)
print("match" if got == lines.upper() else "got %d of %d" % (len(got), len(lines)))
"""


@pytest.mark.parametrize("how", ["execl", "posix_spawn"])
def test_stdio_service(reg, procs, how):
    """A handler that reads its stdin with fgets() and writes with fputs():
    stdio bypasses every interposed call, so a stdin and stdout taken over
    are made streams that go through smclo (before, fgets() read the
    doorbells as end of file)."""
    port = free_port()
    srv = procs.start([SERVER, str(port), how, str(TESTBIN / "stdio_upper")], reg.env)
    wait_port(port, proc=srv)
    for _ in range(5):
        r = reg.run([PY, "-c", STDIO_CLIENT, str(port)], timeout=60)
        assert r.stdout.split() == ["match"], r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 5 and sum(st["fallback_by_reason"].values()) == 0, st


@pytest.mark.parametrize("handler,outcome", [("stdio_upper_linked", "handed over"),
                                             ("stdio_upper", "moved")])
def test_linked_handler_needs_no_preload(reg, procs, handler, outcome):
    """The handler starts without LD_PRELOAD: one linked with -lsmclo
    (DT_NEEDED) loads smclo anyway and takes the connection over - it got a
    reset before, as if it had no smclo - and one that is not gets the TCP
    socket, the request sent again there."""
    port = free_port()
    # the request in the ring when the handler starts: one without smclo
    # cannot have it (without, it could find the ring empty and go on over
    # TCP: test_program_without_smclo_goes_on_over_tcp)
    srv = procs.start([SERVER, str(port), "execle-bare", str(TESTBIN / handler)],
                      dict(reg.env, EXEC_SERVER_WAIT_DATA="1"))
    wait_port(port, proc=srv)
    for _ in range(3):
        r = reg.run([PY, "-c", STDIO_CLIENT, str(port)], timeout=60)
        assert r.stdout.split() == ["match"], r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 3 and sum(st["fallback_by_reason"].values()) == 0, st
    assert st["moved_by_reason"]["handed-on"] == (3 if outcome == "moved" else 0), st


GO_ECHO = """package main

import (
	"io"
	_ "net" // cgo's resolver: the program is dynamically linked
	"os"
)

func main() {
	io.Copy(os.Stdout, os.Stdin)
}
"""


def test_go_handler_goes_on_over_tcp(reg, procs, tmp_path):
    """A Go handler (dynamically linked through cgo, so the loader runs and
    smclo loads) reads and writes stdin/stdout with raw system calls that
    no preload library sees: taken over, the connection would be read as
    the doorbell socket underneath - wrong bytes, or a hang.  It is treated
    as a program without smclo: the connection goes on over TCP, the
    client's bytes sent again (it got a reset before)."""
    prog = go_build(str(tmp_path), "goecho", GO_ECHO)
    assert_goes_on_over_tcp(reg, procs, ["execl", prog])


# The server speaks first (a banner, as SMTP, FTP and SSH do), then echoes:
# at the exec nothing of the client's is in the ring yet.
def test_program_without_smclo_goes_on_over_tcp(reg, procs, tmp_path):
    """A handler that cannot load smclo (execle without LD_PRELOAD: a shell
    script that greets, then cat) gets the connection while the ring holds
    nothing unread: it goes on over its TCP socket, byte exact, instead of
    a reset - counted as moved (handed-on), not as a fallback.  The
    client, accelerated until then, follows the move."""
    greeter = tmp_path / "greeter"
    greeter.write_text("#!/bin/sh\nprintf 'hello\\n'\nexec cat\n")
    greeter.chmod(0o755)
    port = free_port()
    srv = procs.start([SERVER, str(port), "execle-bare", str(greeter)], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), "5", "0", "hello\n"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["match"] * 5, r.stdout
    st = reg.stats()
    assert st["accelerated_client"] == 5, st
    assert st["fallback_by_reason"]["exec-no-smclo"] == 0, st
    assert st["moved_by_reason"]["handed-on"] == 5, st
    assert st["moved_by_reason"]["peer-moved"] == 5, st


# Streams 8 MB (eight rings' worth) while another thread reads the echo:
# when the handler starts, the writer is blocked on a full ring or in the
# middle of a write, and the reader asleep.
STREAM_CLIENT = r"""
import os, socket, sys, threading
port = int(sys.argv[1])
for _ in range(int(sys.argv[2])):
    c = socket.create_connection(("127.0.0.1", port)); c.settimeout(20)
    data = os.urandom(8 << 20)
    got = []
    def read():
        n = 0
        while n < len(data):
            d = c.recv(1 << 20)
            if not d:
                break
            got.append(d)
            n += len(d)
    t = threading.Thread(target=read); t.start()
    for i in range(0, len(data), 300000):
        c.sendall(data[i:i + 300000])
    t.join()
    print("match" if b"".join(got) == data else "short %d" % sum(map(len, got)))
    c.close()
"""


def test_handed_on_under_load(reg, procs):
    """The client writes without pause and reads the echo in another thread
    while the connection goes to a program without smclo: its blocked
    writer and its reader follow the move, its unread bytes are sent again
    first and the rest of its stream after them, in order."""
    port = free_port()
    srv = procs.start([SERVER, str(port), "execle-bare"],
                      dict(reg.env, EXEC_SERVER_WAIT_DATA="1"))
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", STREAM_CLIENT, str(port), "4"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["match"] * 4, r.stdout
    st = reg.stats()
    assert sum(st["fallback_by_reason"].values()) == 0, st
    assert st["moved_by_reason"]["handed-on"] == 4, st


# openbsd-inetd's service line: a nowait stream service on a loopback port,
# run as root by the handler named last (its path, then its argv)
INETD_LINE = "127.0.0.1:%d stream tcp nowait root %s\n"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
SYSTEM_PY = "/usr/bin/python3"     # Debian's: nobody may run it (the suite's may be root's own)


# Debian's openbsd-inetd gives its handlers an environment without
# LD_PRELOAD (seen with `env` as the handler, with or without smclo, and
# with any library preloaded): no handler of it loads smclo, static or not
@pytest.mark.parametrize("handler", ["/usr/bin/busybox busybox cat", "/bin/cat cat"],
                         ids=["static", "dynamic"])
def test_inetd_as_debian_ships_it(default_reg, procs, tmp_path, handler):
    """Debian's openbsd-inetd, started as root under smclo with smclo's
    defaults (-d: in the foreground, so the test can stop it), an echo
    service run by a handler per connection (busybox-static's cat, or
    /bin/cat), the clients as nobody: every connection's 100 KB comes back
    byte exact.  The handler cannot load smclo, so each connection is
    handed on to TCP, what the ring held sent again by the client
    (handed-on at inetd's end, peer-moved at the client's); it was a reset
    before the hand-on."""
    port = free_port()
    conf = tmp_path / "inetd.conf"
    conf.write_text(INETD_LINE % (port, handler))
    srv = procs.start(["/usr/sbin/inetd", "-d", str(conf)], default_reg.env)
    wait_port(port, proc=srv)
    r = subprocess.run(AS_NOBODY + [SMCLO, "run", "--", SYSTEM_PY, "-c", CLIENT, str(port), "5"],
                       env=default_reg.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["match"] * 5, r.stdout
    st = default_reg.wait_stats(lambda s: s["moved_by_reason"]["peer-moved"] == 5)
    assert st["accelerated_client"] == 5 and st["accelerated_server"] >= 5, st
    assert sum(st["fallback_by_reason"].values()) == 0, st
    assert st["moved_by_reason"]["handed-on"] == 5, st
    assert st["moved_by_reason"]["peer-moved"] == 5, st


# systemd's Accept=yes as its own tool gives it: a handler per connection,
# the connection on stdin and stdout; the children get only the environment
# -E names (LD_PRELOAD among it, or not)
@pytest.mark.parametrize("env_opts,moved", [([], 5), (["-E", "LD_PRELOAD"], 0)],
                         ids=["environment-cleared", "preload-passed"])
def test_systemd_socket_activate_accept(default_reg, procs, env_opts, moved):
    """systemd-socket-activate --accept --inetd under smclo with smclo's
    defaults, /bin/cat as the handler, clients of user nobody: 5 x 100 KB
    byte exact.  A handler given LD_PRELOAD takes the connection over and
    it stays accelerated; one whose environment was cleared cannot load
    smclo, and each connection is handed on to TCP (handed-on /
    peer-moved)."""
    port = free_port()
    srv = procs.start(["systemd-socket-activate", "-l", "127.0.0.1:%d" % port, "--accept",
                       "--inetd", *env_opts, "/bin/cat"], default_reg.env)
    wait_port(port, proc=srv)
    r = subprocess.run(AS_NOBODY + [SMCLO, "run", "--", SYSTEM_PY, "-c", CLIENT, str(port), "5"],
                       env=default_reg.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["match"] * 5, r.stdout
    st = default_reg.wait_stats(lambda s: s["moved_by_reason"]["peer-moved"] == moved and
                                s["accelerated_client"] == 5)
    assert st["accelerated_client"] == 5 and st["accelerated_server"] >= 5, st
    assert sum(st["fallback_by_reason"].values()) == 0, st
    assert st["moved_by_reason"]["handed-on"] == moved, st
    assert st["moved_by_reason"]["peer-moved"] == moved, st
