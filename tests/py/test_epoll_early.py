"""A socket put into epoll before connect() (nginx's upstream connections):
the switch puts the doorbell socket in the descriptor's place, and every
registration made before follows it (src/shim/epoll_early.c).  Each case:
the connection accelerated, every wait through the sets woken, bytes exact.
The test_matrix row client-epoll-early runs nginx's own pattern on every
handshake path; these are the corners of it."""
import json

import pytest

from conftest import PY, free_port, wait_port

PEER = __import__("os").path.join(__import__("os").path.dirname(__file__), "peer.py")

# Registers one socket in several epoll sets before connect(), as told:
#   lt, et       a set with EPOLLIN|EPOLLOUT (level) / |EPOLLET
#   closed       a set closed again before connect()
#   forked       a set a fork child waits in (the registration is the set's)
# then sends "ping" and waits in every live set for the echo.
CLIENT = r"""
import json, os, select, socket, sys, time
port, kinds = int(sys.argv[1]), sys.argv[2].split(",")


def wait_for(ep, bit, fd):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(f == fd and e & bit for f, e in ep.poll(0.05)):
            return True
    return False


c = socket.socket()
c.setblocking(False)
sets, out = {}, {}
for k in kinds:
    ep = select.epoll()
    flags = select.EPOLLIN | select.EPOLLOUT | (select.EPOLLET if k == "et" else 0)
    ep.register(c.fileno(), flags)
    sets[k] = ep
if "closed" in sets:
    sets.pop("closed").close()
child = None
if "forked" in sets:
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        woken = wait_for(sets["forked"], select.EPOLLIN, c.fileno())
        os.write(w, b"woken" if woken else b"asleep")
        os._exit(0)
rc = c.connect_ex(("127.0.0.1", port))
assert rc in (0, 115), rc
for k, ep in sets.items():
    if k != "forked":
        out[k + "-out"] = wait_for(ep, select.EPOLLOUT, c.fileno())
c.send(b"ping")
if child:
    out["forked"] = os.read(r, 16).decode()     # before we read the echo away
    os.waitpid(child, 0)
for k, ep in sets.items():
    if k != "forked":
        out[k + "-in"] = wait_for(ep, select.EPOLLIN, c.fileno())
got = b""
while len(got) < 4:
    select.select([c], [], [], 5)
    got += c.recv(4)
out["echo"] = got.decode()
print(json.dumps(out))
"""


def run_case(reg, procs, kinds):
    port = free_port()
    srv = procs.start([PY, PEER, "echo", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", CLIENT, str(port), ",".join(kinds)], timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 1)
    assert st["accelerated_client"] == 1 and st["fallback"] == 0, st
    return json.loads(r.stdout)


def test_two_sets_level_and_edge(reg, procs):
    out = run_case(reg, procs, ["lt", "et"])
    assert out == {"lt-out": True, "et-out": True, "lt-in": True, "et-in": True,
                   "echo": "ping"}, out


def test_a_set_closed_before_connect(reg, procs):
    out = run_case(reg, procs, ["closed", "lt"])
    assert out == {"lt-out": True, "lt-in": True, "echo": "ping"}, out


def test_a_set_a_fork_child_waits_in(reg, procs):
    """The child shares the epoll instance: the registration moved in it
    wakes the child too."""
    out = run_case(reg, procs, ["forked", "lt"])
    assert out["forked"] == "woken" and out["echo"] == "ping", out


# The start of the scripts below: wait_for() also notes every descriptor a
# set reported (seen), to tell a set woken for a socket it does not hold.
WAITER = r"""
import json, os, select, socket, sys, time
port = int(sys.argv[1])
seen = {}


def wait_for(ep, bit, fd):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        evs = ep.poll(0.05)
        seen.setdefault(ep, set()).update(f for f, e in evs)
        if any(f == fd and e & bit for f, e in evs):
            return True
    return False


# connect each (socket, set) pair's socket, then through its set: writable,
# a ping, readable, the echo
def ping_each(pairs):
    out = {}
    for s, _ in pairs:
        assert s.connect_ex(("127.0.0.1", port)) in (0, 115)
    for i, (s, ep) in enumerate(pairs):
        out["out%d" % i] = wait_for(ep, select.EPOLLOUT, s.fileno())
        s.send(b"ping%d" % i)
        out["in%d" % i] = wait_for(ep, select.EPOLLIN, s.fileno())
        out["echo%d" % i] = s.recv(16).decode()
    return out

"""

# Three sockets registered before connect(): two in set A (one copy of A
# serves both registrations), A's number then closed while the program still
# reaches A by a dup, and a new set B made - at A's old number - for the
# third.  Each set must be woken for its own sockets, and A never for the
# third: a copy of A found by the number would move its registration there.
SHARED = WAITER + r"""
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.setblocking(False)
a = select.epoll()
for s in socks[:2]:
    a.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT)
old = a.fileno()
a2 = select.epoll.fromfd(os.dup(old))
if sys.argv[2] == "unseen":     # closed by a raw system call: smclo never sees it
    import ctypes
    assert ctypes.CDLL(None).syscall(3, old) == 0   # SYS_close; a's object left alone
else:
    a.close()
b = select.epoll()
out = {"reused": b.fileno() == old}
b.register(socks[2].fileno(), select.EPOLLIN | select.EPOLLOUT)
out.update(ping_each([(socks[0], a2), (socks[1], a2), (socks[2], b)]))
out["a-saw-b"] = socks[2].fileno() in seen.get(a2, set())
print(json.dumps(out))
"""


def run_script(reg, procs, script, conns, *args):
    """@script's output, against an echo server; its @conns connections
    all accelerated."""
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    r = reg.run([PY, "-c", script, str(port), *args], timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= conns)
    assert st["accelerated_client"] == conns and st["fallback"] == 0, st
    return json.loads(r.stdout)


@pytest.mark.parametrize("close", ["close", "unseen"])
def test_one_copy_per_set_and_a_number_reused(reg, procs, close):
    """The set's number closed as programs do, or behind smclo's back (a
    raw system call): the new set that gets the number is seen made."""
    out = run_script(reg, procs, SHARED, 3, close)
    want = {"reused": True, "a-saw-b": False}
    for i in range(3):
        want.update({"out%d" % i: True, "in%d" % i: True, "echo%d" % i: "ping%d" % i})
    assert out == want, out


# The set's number a dup, closed and given by another dup to a second set
# (no epoll_create between, and a dup carries no mark of a set): the copy
# kept for the first must not serve the second.
DUPSET = WAITER + r"""
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.setblocking(False)
a, b = select.epoll(), select.epoll()
ad = select.epoll.fromfd(os.dup(a.fileno()))
ad.register(socks[0].fileno(), select.EPOLLIN | select.EPOLLOUT)
num = ad.fileno()
ad.close()
bd = select.epoll.fromfd(os.dup(b.fileno()))
out = {"reused": bd.fileno() == num}
bd.register(socks[1].fileno(), select.EPOLLIN | select.EPOLLOUT)
out.update(ping_each([(socks[0], a), (socks[1], b)]))
out["a-saw-b"] = socks[1].fileno() in seen.get(a, set())
print(json.dumps(out))
"""


def test_a_set_number_given_by_dup_to_another_set(reg, procs):
    out = run_script(reg, procs, DUPSET, 2)
    assert out == {"reused": True, "a-saw-b": False, "out0": True, "in0": True,
                   "echo0": "ping0", "out1": True, "in1": True, "echo1": "ping1"}, out
