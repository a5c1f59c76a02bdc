"""A peer that speaks the handshake but not in good faith (hostile.py) can
only break its own connection: the smclo end neither crashes, nor hangs, nor
reads out of bounds, and stays on TCP when the peer's offer is unsound."""
import os
import socket
import subprocess

import pytest

from conftest import PY, free_port, wait_port

HOSTILE = os.path.join(os.path.dirname(__file__), "hostile.py")
PEER = os.path.join(os.path.dirname(__file__), "peer.py")

VICTIM_CLIENT = r"""
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.settimeout(10)
try:
    if sys.argv[2] == "send":
        for _ in range(64):
            c.sendall(b"v" * (1 << 16))
        print("sent", flush=True)
    else:
        c.sendall(b"hello")
        print("read", len(c.recv(1 << 16)), flush=True)
except (ConnectionResetError, BrokenPipeError) as e:
    print("error", type(e).__name__, flush=True)
except socket.timeout:
    print("hung", flush=True)
"""


# A one-shot epoll reader (redis' and many proxies' way is level-triggered;
# one-shot is the thread-pool servers' way): each event, read all, arm again.
ONESHOT_CLIENT = r"""
import select, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"x")
c.setblocking(False)
ep = select.epoll()
ep.register(c.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
got = b""
while len(got) < 2:
    if not ep.poll(3):
        print("hung", got.decode(), flush=True)
        sys.exit(0)
    try:
        while True:
            d = c.recv(100)
            if not d:
                break
            got += d
    except BlockingIOError:
        pass
    ep.modify(c.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
print("read", got.decode(), flush=True)
"""


def run_victim(reg, port, mode):
    return reg.run([PY, "-c", VICTIM_CLIENT, str(port), mode], timeout=60)


def start_hostile_server(reg, procs, attack):
    port = free_port()
    srv = procs.start([PY, HOSTILE, "server", str(reg.path), str(port), attack], env=reg.env,
                      smclo=False, text=True)
    assert srv.stdout.readline().strip() == "ready"
    return srv, port


@pytest.mark.parametrize("attack,said", [("prod", "confirmed"), ("inbox-prod", "taken")])
def test_server_publishes_impossible_producer_cursor(reg, procs, attack, said):
    """After either handshake (inbox-prod: the server took the offer) the
    server lies about its producer cursor: the victim resets the connection."""
    srv, port = start_hostile_server(reg, procs, attack)
    r = run_victim(reg, port, "read")
    assert r.returncode == 0 and r.stdout.strip() == "error ConnectionResetError", \
        r.stdout + r.stderr
    assert srv.stdout.readline().strip() == said
    assert reg.stats()["accelerated_client"] == 1


def test_late_doorbell_keeps_oneshot_armed(reg, procs):
    """An honest writer's doorbell can arrive after its bytes were read; the
    epoll wait that sees it finds the ring empty and drops the event.  A
    one-shot registration disarmed itself to deliver it: the reader must
    still hear of the next bytes (before the fix it never did; the stress
    test's one-shot server hung with 679 KB unread)."""
    srv, port = start_hostile_server(reg, procs, "stale-bell")
    r = reg.run([PY, "-c", ONESHOT_CLIENT, str(port)], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "read ab", r.stdout + r.stderr
    assert srv.stdout.readline().strip() == "confirmed"
    assert srv.stdout.readline().strip() == "stale"
    assert reg.stats()["accelerated_client"] == 1


@pytest.mark.parametrize("attack,ack,outcome", [
    ("pool-valid", "1", "read 5"),
    ("pool-forged", "1", "error ConnectionResetError"),
    ("pool-unsealed", "0", "error ConnectionResetError"),
    ("pool-writable", "0", "error ConnectionResetError"),
    ("pool-hugetlb", "0", "error ConnectionResetError"),
    ("pool-eventfd", "0", "error ConnectionResetError"),
    ("pool-full-wake", "1", "read 5"),
])
def test_server_sends_pool_references(reg, procs, attack, ack, outcome):
    """A peer's pool (the native API's zero-copy sends) is taken only when
    it is a tmpfs memfd sealed against shrinking and new writable mappings
    (no holes punched under our mapping) with a socket to wake the sender;
    a reference is followed only into the pool mapped and only inside it: a
    forged one, or one to a pool refused, resets the connection - nothing
    is read outside the pool.  A wake-up socket the peer left no room in
    does not make the reader wait (pool-full-wake).  The honest reference
    (pool-valid) shows the attacks speak the layout right."""
    srv, port = start_hostile_server(reg, procs, attack)
    r = run_victim(reg, port, "read")
    assert r.returncode == 0 and r.stdout.strip() == outcome, r.stdout + r.stderr
    assert srv.stdout.readline().strip() == "confirmed"
    assert srv.stdout.readline().strip() == "ack " + ack


def test_server_publishes_impossible_consumer_cursor(reg, procs):
    srv, port = start_hostile_server(reg, procs, "cons")
    r = run_victim(reg, port, "send")
    assert r.returncode == 0 and r.stdout.strip().startswith("error "), r.stdout + r.stderr


def test_server_proves_with_another_connection(reg, procs):
    srv, port = start_hostile_server(reg, procs, "proof")
    r = run_victim(reg, port, "read")
    # the victim declines and goes on over TCP, where the server answers
    assert r.returncode == 0 and r.stdout.strip() == "read 5", r.stdout + r.stderr
    assert srv.stdout.readline().split() == ["declined", "9"]      # R_PROOF_FAILED
    assert reg.stats()["fallback_by_reason"]["proof-failed"] == 1


@pytest.mark.parametrize("attack", ["inbox-silent", "inbox-junk", "direct-silent"])
def test_inbox_server_never_decides(reg, procs, attack):
    """A server that reads the offer but never decides it (or writes a word
    that decides nothing) costs its client the handshake timeout, then the
    client withdraws and goes on over TCP, byte-exact - also when the offer
    was one without TCP (direct-silent): the client connects only then, and
    replays what it wrote."""
    if attack.startswith("direct"):
        reg.env["SMCLO_DIRECT"] = "1"      # the victim takes part in the opt-in
    srv, port = start_hostile_server(reg, procs, attack)
    r = run_victim(reg, port, "read")
    assert r.returncode == 0 and r.stdout.strip() == "read 5", r.stdout + r.stderr
    st = reg.stats()
    assert st["accelerated_client"] == 0 and st["fallback_by_reason"]["timeout"] == 1, st


def smclo_echo_server(reg, procs):
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], env=reg.env)
    wait_port(port, proc=srv)
    return srv, port


def still_serves(reg, port):
    r = reg.run([PY, PEER, "send", "127.0.0.1", str(port), "300000"])
    return r.returncode == 0 and r.stdout.strip() == "match"


def hostile_client(reg, port, attack):
    return subprocess.run([PY, HOSTILE, "client", str(reg.path), str(port), attack],
                          capture_output=True, text=True, timeout=60, env=reg.env)


@pytest.mark.parametrize("attack", ["unsealed", "size"])
def test_client_offers_unsound_region(reg, procs, attack):
    """A region the client could still shrink, or one whose size is not what
    its two rings make: refused before it is mapped."""
    srv, port = smclo_echo_server(reg, procs)
    r = hostile_client(reg, port, attack)
    assert r.returncode == 0 and r.stdout.strip() == "pair closed", r.stdout + r.stderr
    assert reg.stats()["fallback_by_reason"]["handshake-error"] == 1
    assert still_serves(reg, port) and srv.poll() is None


def test_client_publishes_impossible_producer_cursor(reg, procs):
    srv, port = smclo_echo_server(reg, procs)
    r = hostile_client(reg, port, "prod")
    # accepted, then the server finds the cursor impossible and resets the connection
    assert r.returncode == 0 and r.stdout.strip() == "pair closed", r.stdout + r.stderr
    assert reg.stats()["accelerated_server"] == 1
    assert still_serves(reg, port) and srv.poll() is None


@pytest.mark.parametrize("attack,word,reason", [
    ("inbox-pipe", "word 5 %d", "handshake-error"),      # declined, reason named
    ("inbox-unsealed", "word 1 0", "handshake-error"),   # never mapped: left open
    ("inbox-junk", "word 1 0", "peer-no-smclo"),         # never read as an offer
])
def test_client_sends_unsound_offer(reg, procs, attack, word, reason):
    """Offers whose socket pair is a pipe, whose region could be shrunk, or
    that are malformed: the server stays on TCP (and says why), and goes on
    serving."""
    srv, port = smclo_echo_server(reg, procs)
    r = hostile_client(reg, port, attack)
    out = r.stdout.split("\n")
    expect = word % 11 if "%d" in word else word         # R_HANDSHAKE_ERROR
    assert r.returncode == 0 and out[0] == expect and out[1] == "echo hello", r.stdout + r.stderr
    assert reg.stats()["fallback_by_reason"][reason] == 1
    assert still_serves(reg, port) and srv.poll() is None


@pytest.mark.parametrize("attack,word", [
    ("direct-proof", "word 5 9"),       # declined: R_PROOF_FAILED
    ("direct-junk", "word 1 0"),        # never read as an offer
])
def test_client_sends_unsound_direct_offer(reg, procs, attack, word):
    """An offer without TCP whose proof is a UDP socket, or a malformed one,
    to a server taking connections without TCP: not taken, and the server
    goes on serving (the hostile client then connects over TCP)."""
    reg.env["SMCLO_DIRECT"] = "1"          # the server takes part in the opt-in
    srv, port = smclo_echo_server(reg, procs)
    assert still_serves(reg, port)      # an smclo client: the next ones need no TCP
    r = hostile_client(reg, port, attack)
    out = r.stdout.split("\n")
    assert r.returncode == 0 and out[0] == word and out[1] == "echo hello", r.stdout + r.stderr
    assert still_serves(reg, port) and srv.poll() is None
    assert reg.stats()["direct_handshakes"] == 1


SQUATTER = r"""
import os, sys, time
reg, secs = sys.argv[1], float(sys.argv[2])
# take first the names smclo would map: files of ours that anyone may write
os.makedirs(os.path.join(reg, "t"), exist_ok=True)
os.chmod(os.path.join(reg, "t"), 0o777)     # as smclo makes it in a registry open to all
for name in ("state3", "t/0"):
    fd = os.open(os.path.join(reg, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666)
    os.ftruncate(fd, 1 << 16)
    os.close(fd)
print("ready", flush=True)
cut, end = set(), time.time() + secs
while time.time() < end:
    for top, _, files in os.walk(reg):
        for f in files:
            path = os.path.join(top, f)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue        # not ours to write, or a socket
            try:
                os.ftruncate(fd, 0)
                cut.add(os.path.relpath(path, reg))
            finally:
                os.close(fd)
print("cut", *sorted(cut), flush=True)
"""


def test_other_user_cannot_truncate_what_we_map(shared_dir, procs):
    """Whoever may write a file can truncate it, and touching a mapping of a
    truncated file is a SIGBUS.  A third user who may write the shared
    registry takes first the names smclo maps and truncates every file it
    can, all the time, while root's server and nobody's clients talk: no one
    crashes, every connection is accelerated, the only files it could cut
    are its own, and root's smclo says why it does not count."""
    assert os.geteuid() == 0, "this test runs other users and needs root (CI is root)"
    from conftest import Registry, SMCLO, TESTBIN
    import json
    reg = Registry(shared_dir)
    env = dict(reg.env, SMCLO_ALLOW_UIDS="*")
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    as_daemon = ["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups"]
    stress = str(TESTBIN / "stress")

    squat = procs.start(as_daemon + [PY, "-c", SQUATTER, shared_dir, "6"], env, smclo=False,
                        text=True)
    assert squat.stdout.readline().strip() == "ready"
    port = free_port()
    srv = procs.start([stress, "server", str(port), "lt"], env, text=True)
    wait_port(port, proc=srv)
    for seed in range(5):
        r = subprocess.run(as_nobody + [SMCLO, "run", "--", stress, "client", str(port), "2",
                                        "3", str(seed)], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
    assert srv.poll() is None, srv.stderr.read()
    assert squat.communicate(timeout=30)[0].split() == ["cut", "state3", "t/0"]

    r = subprocess.run([SMCLO, "stats"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "/t/0 for this user's totals" in r.stderr, r.stderr
    procs.stop(srv)
    assert "t/0 must be a file of this user's" in srv.stderr.read()
    r = subprocess.run(as_nobody + [SMCLO, "stats", "--json"], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["accelerated_client"] == 30, r.stdout
