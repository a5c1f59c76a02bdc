"""Socket pairs made ahead (pairs.h): a client that makes inbox offers makes
the pair for its next offer while it spins waiting for the current answer,
so the offer goes out without a socketpair() on its way to the SYN (nor a
getsockopt(SO_DOMAIN): the descriptor table knows what socket() made); and
a parent and its fork child never offer the same pair made ahead; and with
no room above its descriptors a client keeps none waiting.  They need the
spin (an idle machine with two CPUs, as the rest of the suite runs on)."""
import os
import subprocess

from conftest import PY, SMCLO, TESTBIN, free_port, need, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def offers_by_pair(lines):
    """(offers whose pair was made on the way, offers that found one made
    ahead): per connection, socket(AF_INET) ... sendmsg (the offer); a
    socketpair in between was made on the way, one elsewhere ahead."""
    inline = ready = 0
    made = False
    for l in lines:
        if "socket(AF_INET," in l:
            made = False
        elif "socketpair(" in l:
            made = True
        elif "sendmsg(" in l:
            inline += made
            ready += not made
            made = True             # a pair made after the offer is not this one's
    return inline, ready


def traced_connections(reg, procs, tmp_path, prefix=()):
    """The connection bench against an smclo server for 1 s, its client
    under strace; the trace's lines."""
    need("strace")
    port = free_port()
    worker = [str(TESTBIN.parent / "smclo"), "__bench-worker"]
    srv = procs.start(worker + ["server", str(port), "connect", "100", "0"], env=reg.env)
    wait_port(port, proc=srv)
    trace = tmp_path / "client.strace"
    r = subprocess.run(list(prefix) + ["strace", "-f", "-qq", "--seccomp-bpf", "-o", str(trace),
                        "-e", "trace=socket,socketpair,sendmsg,getsockopt", SMCLO, "run", "--"] +
                       worker + ["client", str(port), "connect", "100", "1"], env=reg.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] >= 100 and st["fallback_not_short_lived"] == 0, st
    return open(trace).read().splitlines()


def test_offers_use_pairs_made_ahead(reg, procs, tmp_path):
    lines = traced_connections(reg, procs, tmp_path)
    assert not [l for l in lines if "SO_DOMAIN" in l], "the client asked SO_DOMAIN"
    inline, ready = offers_by_pair(lines)
    assert ready + inline >= 100, (ready, inline)
    assert ready >= (ready + inline) // 2, (ready, inline)


def test_no_pairs_kept_without_room_above_the_descriptors(reg, procs, tmp_path):
    """With 64 descriptors the hidden range is out of reach: no pair may
    wait among the application's numbers, and no spin keeps trying."""
    need("prlimit")
    lines = traced_connections(reg, procs, tmp_path, prefix=["prlimit", "--nofile=64:64"])
    inline, ready = offers_by_pair(lines)
    pairs = sum("socketpair(" in l for l in lines)
    # each offer makes its own pair on the way, plus at most one refused try
    assert ready == 0 and inline >= 100, (ready, inline)
    assert pairs <= 2 * inline, (inline, pairs)


FORKER = r"""
import os, socket, sys
port = int(sys.argv[1])
def conn_inode():
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"x" * 100)
    got = b""
    while len(got) < 100:
        got += c.recv(100)
    assert got == b"x" * 100
    return c, os.fstat(c.fileno()).st_ino
keep = [conn_inode()[0] for _ in range(3)]   # offers made: pairs are made ahead
r, w = os.pipe()
pid = os.fork()
c, ino = conn_inode()
if pid == 0:
    os.write(w, b"%d\n" % ino)
    os._exit(0)
os.waitpid(pid, 0)
print(int(os.read(r, 64)), ino, flush=True)
"""


def test_parent_and_child_never_offer_one_pair(reg, procs):
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    for _ in range(5):
        out = subprocess.run([SMCLO, "run", "--", PY, "-c", FORKER, str(port)], env=reg.env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        child, parent = out.stdout.split()
        # the descriptor after the switch is our end of the offered pair
        assert child != parent, out.stdout
    st = reg.stats()
    assert st["accelerated_client"] == 5 * 5 and st["fallback_not_short_lived"] == 0, st
