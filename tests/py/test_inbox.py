"""Which handshake a connection gets (inbox.h): the one-message offer when a
single process accepts on the address, the rendezvous when several may (a
prefork server, SO_REUSEPORT siblings).  Either way every connection is
accelerated, none waits out a timeout, and every byte comes back."""
import os
import time

import pytest

from conftest import PY, free_port, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def churn(reg, procs, port, clients, each):
    """@clients processes at once, @each connections apiece."""
    ps = [procs.start([PY, PEER, "churn", "127.0.0.1", str(port), str(each)], env=reg.env,
                      text=True) for _ in range(clients)]
    for p in ps:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0 and out.split() == ["bad", "0"], out
    return reg.stats()


SERVERS = {
    # role and argument, server processes, clients at once, connections each
    "one thread": (["echo-many"], 1, 4, 25),
    "four threads accepting": (["echo-threads", "4"], 1, 4, 25),
    "prefork, two children": (["echo-prefork", "2"], 1, 2, 20),
    "two SO_REUSEPORT siblings": (["echo-reuseport"], 2, 2, 20),
}


@pytest.mark.parametrize("shape", SERVERS)
def test_handshake_follows_the_acceptors(reg, procs, shape):
    """One process accepting (one thread or several, where a thread may read
    another's offer and keeps it for that thread): every connection is an
    inbox handshake.  A prefork server, whose children add entries naming
    the inbox they share with their parent: inbox handshakes too, each offer
    parked for the child that accepts its connection.  SO_REUSEPORT
    siblings (an inbox each): every connection uses the rendezvous.  Never
    a fallback, never a timeout."""
    role, nserv, clients, each = SERVERS[shape]
    entries = 3 if role[0] == "echo-prefork" else nserv
    port = free_port()
    for _ in range(nserv):
        srv = procs.start([PY, PEER, role[0], "127.0.0.1", str(port)] + role[1:], env=reg.env)
        wait_port(port, proc=srv)
    # the port listens once the first server does: wait for every entry
    deadline = time.monotonic() + 10
    while len(reg.entries("l")) < entries and time.monotonic() < deadline:
        time.sleep(0.02)
    st = churn(reg, procs, port, clients, each)
    n = clients * each
    assert st["accelerated_client"] == n and st["accelerated_server"] == n, st
    assert st["fallback"] == 0, st
    assert st["inbox_handshakes"] == (n if nserv == 1 else 0), st
    assert len(reg.entries("l")) == entries         # prefork: the parent's and each child's


TWO_PORTS = r"""
import os, sys, time
sys.path.insert(0, sys.argv[4])
from peer import echo, listen
a, b = listen("127.0.0.1", int(sys.argv[1])), listen("127.0.0.1", int(sys.argv[2]))
while not os.path.exists(sys.argv[3]):
    time.sleep(0.01)
second, first = b.accept()[0], a.accept()[0]     # the later offer's connection first
echo(second)
echo(first)
"""


def test_offer_read_early_waits_for_its_connection(reg, procs, tmp_path):
    """One process listening on two ports has one inbox.  Accepting the
    second client's connection first reads the first client's offer too; it
    is kept, and taken when that connection is accepted."""
    p1, p2, gate = free_port(), free_port(), tmp_path / "gate"
    srv = procs.start([PY, "-c", TWO_PORTS, str(p1), str(p2), str(gate),
                       os.path.dirname(PEER)], env=reg.env)
    wait_port(p1, proc=srv)
    wait_port(p2, proc=srv)
    env = dict(reg.env, SMCLO_HANDSHAKE_MS="10000")
    c1 = procs.start([PY, PEER, "send", "127.0.0.1", str(p1), "100000"], env=env, text=True)
    time.sleep(0.3)                                  # its offer is in the inbox first
    c2 = procs.start([PY, PEER, "send", "127.0.0.1", str(p2), "100000"], env=env, text=True)
    time.sleep(0.3)
    gate.touch()
    for c in (c1, c2):
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0 and out.strip() == "match", out
    st = reg.stats()
    assert st["inbox_handshakes"] == 2 and st["fallback"] == 0, st


# Listen, fork; the child starts a program that accepts on the listener it
# inherited (a supervisor starting its workers so), by exec or posix_spawn
# (glibc's clone execs it, where no code of smclo's runs in the child); the
# parent only waits.
CHILD_ACCEPTOR = r"""
import os, socket, sys
sys.path.insert(0, sys.argv[2])
from peer import echo
if len(sys.argv) > 5:               # the program the child started
    s = socket.socket(fileno=int(sys.argv[5]))
    open(sys.argv[4], "w").close()  # accepting from here on
    while True:
        echo(s.accept()[0])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
os.set_inheritable(s.fileno(), True)
argv = [sys.executable] + sys.argv[:5] + [str(s.fileno())]
if os.fork() == 0:
    if sys.argv[3] == "exec":
        os.execv(sys.executable, argv)
    os.waitpid(os.posix_spawn(sys.executable, argv, os.environ), 0)
    os._exit(0)
os.wait()
"""


def start_child_acceptor(reg, procs, tmp_path, how):
    """CHILD_ACCEPTOR started @how; its port once the program accepts (a
    program still starting would answer no rendezvous in its timeout)."""
    script, accepting = tmp_path / "child_acceptor.py", tmp_path / "accepting"
    script.write_text(CHILD_ACCEPTOR)
    port = free_port()
    srv = procs.start([PY, str(script), str(port), os.path.dirname(PEER), how,
                       str(accepting)], env=reg.env)
    wait_port(port, proc=srv)
    deadline = time.monotonic() + 30
    while not accepting.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return port


def test_an_execd_acceptor_is_not_sent_offers_it_cannot_read(reg, procs, tmp_path):
    """A fork child's entry names the inbox it shares with its parent; that
    inbox does not cross exec.  A child that execs a program which accepts
    on the inherited listener makes its entry again without it before the
    exec (listener.c, hs_listeners_before_exec): clients use the rendezvous,
    which the program answers.  Named there, every offer would wait for a
    reader that never comes: the handshake timeout per connection."""
    port = start_child_acceptor(reg, procs, tmp_path, "exec")
    t0 = time.monotonic()
    st = churn(reg, procs, port, 1, 20)
    took = time.monotonic() - t0
    assert st["accelerated_client"] == 20 and st["accelerated_server"] == 20, st
    assert st["fallback_by_reason"]["timeout"] == 0, st["fallback_by_reason"]
    assert st["inbox_handshakes"] == 0, st            # the rendezvous
    assert took < 20 * 0.3, "%.1f s for 20 connections" % took


# Threads of one client process, each making connections one after another
# as fast as it can: three round trips of 5000 random bytes each, checked.
# Prints "ok" or what went wrong; a connection that waits 10 s fails.
BURST = r"""
import os, socket, sys, threading, time
port, threads, each = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
bad, slow = [], [0.0]
def one():
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    t0 = time.monotonic()
    for _ in range(3):
        data = os.urandom(5000)
        c.sendall(data)
        got = b""
        while len(got) < len(data):
            d = c.recv(len(data) - len(got))
            if not d:
                raise EOFError("end of stream after %d bytes" % len(got))
            got += d
        if got != data:
            raise ValueError("echo differs")
    c.close()
    slow[0] = max(slow[0], time.monotonic() - t0)
def worker():
    for _ in range(each):
        try:
            one()
        except Exception as e:
            bad.append(repr(e))
ts = [threading.Thread(target=worker) for _ in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print("ok" if not bad else "bad %d %s" % (len(bad), bad[:3]), "%.3f" % slow[0])
"""


def test_a_burst_against_one_forked_acceptor_finds_every_offer(reg, procs, tmp_path):
    """A forked child accepting alone on its parent's listener, fifty client
    threads connecting at once: offers are read ahead of their connections
    (the accept queue runs hundreds behind the inbox), some while their
    client is in the middle of connect().  Such an offer's ends must be read
    peer first: read the other way round, a socket bound and connected
    between the two questions named port 0, the offer was parked where no
    accept looks, its client waited out the handshake, and the socket the
    offer held open kept that client's FIN from the child - which waited
    for it in recv() forever, and every client after it with it (3 bursts
    in 5 hung so).  Every connection is accelerated, none waits."""
    script = tmp_path / "burst.py"
    script.write_text(BURST)
    port = free_port()
    srv = procs.start([PY, PEER, "echo-prefork", "127.0.0.1", str(port), "1"], env=reg.env)
    wait_port(port, proc=srv)
    deadline = time.monotonic() + 10
    while len(reg.entries("l")) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)            # the child's entry, naming the inbox it shares
    for burst in range(3):
        c = procs.start([PY, str(script), str(port), "50", "20"], env=reg.env, text=True)
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0 and out.split()[0] == "ok", (burst, out)
    st = reg.stats()
    assert st["fallback_by_reason"]["timeout"] == 0, st["fallback_by_reason"]
    assert st["accelerated_client"] == 3000 and st["accelerated_server"] == 3000, st


def test_a_spawned_acceptor_is_not_sent_offers_it_cannot_read(reg, procs, tmp_path):
    """The same through posix_spawn (spawn.c asks before every spawn which
    listeners the program keeps - close-on-exec, then the file actions -
    and hs_listeners_before_spawn makes their entries again without the
    shared inbox).  Named there, the first offer waited for nobody, and the
    socket it held open kept that client's FIN from the acceptor, which
    echoed until end of stream: it served nothing more, ever."""
    port = start_child_acceptor(reg, procs, tmp_path, "spawn")
    t0 = time.monotonic()
    c = procs.start([PY, PEER, "churn", "127.0.0.1", str(port), "20"], env=reg.env, text=True)
    out, _ = c.communicate(timeout=30)
    took = time.monotonic() - t0
    assert c.returncode == 0 and out.split() == ["bad", "0"], out
    st = reg.stats()
    assert st["accelerated_client"] == 20 and st["accelerated_server"] == 20, st
    assert st["fallback_by_reason"]["timeout"] == 0, st["fallback_by_reason"]
    assert took < 20 * 0.3, "%.1f s for 20 connections" % took
