"""Programs of different users, with smclo's defaults (no SMCLO_DIR, no
SMCLO_ALLOW_UIDS): the host's shared registry, root's and sticky, is
found by every user, and their connections are accelerated as the kernel's
SMC-lo accelerates them.  And what another local user can do there
(docs/security.md): each "cannot" of that page is tried here by a hostile
user, MALLORY, who runs arbitrary code without smclo.

Every program runs as a user of its own from the start (setpriv), as a
service run by its package does; the counters are the default registry's,
all users' together, as they grew during the test (DefaultRegistry).
"""
import json
import os
import subprocess

from conftest import SMCLO, TESTBIN, DefaultRegistry, default_env, free_port, wait_port

HOSTILE = os.path.join(os.path.dirname(__file__), "hostile.py")
PY3 = "/usr/bin/python3"        # pytest's own python may sit in a directory only root reads
SHARED = "/dev/shm/smclo"
SERVICE, MALLORY, CLIENT = 61001, 61002, 61003

ECHO = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(65536))
    c.close()
"""

# connect, send, read the echo: the seconds each connection took, one per line
TIMED_CLIENT = r"""
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
src = int(sys.argv[3]) if len(sys.argv) > 3 else 0
for i in range(n):
    t = time.monotonic()
    c = socket.socket()
    if src:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        c.bind(("127.0.0.1", src))
    c.connect(("127.0.0.1", port))
    msg = b"request %d" % i
    c.sendall(msg)
    assert c.recv(100) == msg
    c.close()
    print("%.4f" % (time.monotonic() - t), flush=True)
"""


def as_user(uid):
    return [] if uid == 0 else ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid,
                                "--clear-groups", "--"]


def named(st):
    return {k: v for k, v in st["fallback_by_reason"].items() if v}


def script(tmp_path, name, text):
    os.chmod(tmp_path, 0o755)
    for p in list(tmp_path.parents)[:-1]:
        if str(p).startswith("/tmp/"):
            os.chmod(p, os.stat(p).st_mode | 0o005)
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def stress_round(procs, server_uid, client_uid, env):
    stress = str(TESTBIN / "stress")
    port = free_port()
    srv = procs.start(as_user(server_uid) + [SMCLO, "run", "--", stress, "server", str(port),
                                             "lt"], env, smclo=False)
    wait_port(port, proc=srv)
    r = subprocess.run(as_user(client_uid) + [SMCLO, "run", "--", stress, "client", str(port),
                                              "2", "3", "7"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
    procs.stop(srv)


def test_other_users_accelerated_by_default(default_reg, procs):
    """A service user's server with root's client, root's server with a user's
    client, and two users that are neither: every connection accelerated,
    byte exact, in the default registry."""
    assert os.geteuid() == 0, "this test runs other users and needs root (CI is root)"
    for server_uid, client_uid in ((SERVICE, 0), (0, CLIENT), (SERVICE, CLIENT)):
        stress_round(procs, server_uid, client_uid, default_env())
    d = default_reg.wait_stats(lambda d: d["accelerated_server"] >= 18)
    assert d["accelerated_client"] == 18 and d["accelerated_server"] == 18, d
    assert d["fallback"] == 0, named(d)
    st = os.stat(SHARED)
    assert st.st_uid == 0 and st.st_mode & 0o7777 == 0o1777
    for sub in ("c", "h", "i", "l", "p", "t"):
        st = os.stat(os.path.join(SHARED, sub))
        assert st.st_uid == 0 and st.st_mode & 0o7777 == 0o1777, sub


def test_allow_uids_self_keeps_to_own_user(default_reg, procs):
    """SMCLO_ALLOW_UIDS=self on the client: another user's server is not
    used, and the client says why."""
    port = free_port()
    stress = str(TESTBIN / "stress")
    srv = procs.start(as_user(SERVICE) + [SMCLO, "run", "--", stress, "server", str(port), "lt"],
                      default_env(), smclo=False)
    wait_port(port, proc=srv)
    r = subprocess.run([SMCLO, "run", "--", stress, "client", str(port), "2", "3", "7"],
                       env=dict(default_env(), SMCLO_ALLOW_UIDS="self"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
    d = default_reg.wait_stats(lambda d: d["fallback_by_reason"]["different-user"] >= 6)
    assert d["accelerated_client"] == 0, d
    assert d["fallback_by_reason"]["different-user"] == 6, named(d)


def start_mallory(procs, port, attack):
    m = procs.start(as_user(MALLORY) + [PY3, HOSTILE, "server", SHARED, str(port), attack],
                    default_env(), smclo=False, text=True)
    assert m.stdout.readline().strip() == "ready", m.stderr.read()
    return m


def mallory_received(m):
    out, err = m.communicate(timeout=30)
    return out.split()[-4:], err


def test_forged_listener_entry_gets_nothing(procs, tmp_path):
    """MALLORY writes a live entry for a port root's plain TCP server
    listens on, naming inboxes of hers (the direct one too).  Before, a
    client under smclo offered there: its socket, region and first bytes
    went to her, and the real server saw no connection until the handshake
    timed out.  Now the client believes no entry whose writer the kernel
    does not name as the listening socket's owner: TCP at once, named
    unverified-user, and nothing reaches her inboxes."""
    port = free_port()
    srv = procs.start([PY3, "-c", ECHO, str(port)], default_env(), smclo=False)
    wait_port(port, proc=srv)
    m = start_mallory(procs, port, "forge:4")
    reg = DefaultRegistry()
    client = script(tmp_path, "client.py", TIMED_CLIENT)
    r = subprocess.run(as_user(CLIENT) + [SMCLO, "run", "--", PY3, client, str(port), "20"],
                       env=default_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    took = sorted(float(x) for x in r.stdout.split())
    assert len(took) == 20 and took[10] < 0.1, took       # no handshake timeout (300 ms)
    d = reg.wait_stats(lambda d: d["fallback_by_reason"]["unverified-user"] >= 20)
    assert d["fallback_by_reason"]["unverified-user"] == 20, named(d)
    assert d["accelerated_client"] == 0, d
    got, err = mallory_received(m)
    assert got == ["0", "messages", "0", "descriptors"], (got, err)


REMOTE_CLIENT = r"""
import socket, sys
c = socket.socket()
c.settimeout(0.5)
try:
    c.connect((sys.argv[1], int(sys.argv[2])))
except OSError as e:
    print("connect", type(e).__name__)
"""


def test_wildcard_entry_gets_no_remote_connection(procs, tmp_path):
    """MALLORY listens on 0.0.0.0:P herself (a port free here) and writes an
    entry for 0.0.0.0: the kernel names her as the listener's owner, but a
    client connecting to P on another host (192.0.2.1, TEST-NET) must not
    offer her anything - before, her inbox got the client's socket (about
    to be connected to the remote host) and its first bytes, and a
    man-in-the-middle was one CAS away.  Now an entry stands for this host's
    addresses only: nothing reaches her, the client is named not-this-host."""
    port = free_port()
    m = start_mallory(procs, port, "forge-any:3")
    reg = DefaultRegistry()
    client = script(tmp_path, "remote.py", REMOTE_CLIENT)
    r = subprocess.run(as_user(CLIENT) + [SMCLO, "run", "--", PY3, client, "192.0.2.1",
                                          str(port)], env=default_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got, err = mallory_received(m)
    assert got == ["0", "messages", "0", "descriptors"], (got, err)
    d = reg.stats()
    assert d["fallback_by_reason"]["not-this-host"] == 1, named(d)


FIFOS = r"""
import os, socket, struct, sys
port = int(sys.argv[1])
ns = struct.unpack("Q", socket.socket().getsockopt(socket.SOL_SOCKET, 71, 8))[0]
name = "%u.%016x.%s.0.1.%016x.%016x.65536.65536.%08x" % (
    port, ns, "00000000000000000000ffff7f000001", 1, 0, 7)
for path in ("/dev/shm/smclo/l/" + name, "/dev/shm/smclo/c/1.00000000", "/dev/shm/smclo/t/0x"):
    os.mkfifo(path)
print(" ".join(sorted(os.listdir("/dev/shm/smclo/l"))))
"""


def test_fifos_in_the_registry_hang_nobody(procs, tmp_path):
    """MALLORY leaves FIFOs where smclo opens files to read them (a listener
    entry for the service's port, a connection table, a totals name).
    Opening a FIFO to read waits for a writer: before, every client of that
    port, and every process at its first connection, hung.  Now they are
    opened without waiting and, not being regular files, ignored."""
    port = free_port()
    stress = str(TESTBIN / "stress")
    srv = procs.start(as_user(SERVICE) + [SMCLO, "run", "--", stress, "server", str(port), "lt"],
                      default_env(), smclo=False)
    wait_port(port, proc=srv)
    plant = script(tmp_path, "fifos.py", FIFOS)
    r = subprocess.run(as_user(MALLORY) + [PY3, plant, str(port)], capture_output=True,
                       text=True, timeout=30)
    made = [os.path.join("/dev/shm/smclo/l", n) for n in r.stdout.split() if ".0.1." in n]
    try:
        assert r.returncode == 0, r.stderr
        reg = DefaultRegistry()
        r = subprocess.run([SMCLO, "run", "--", stress, "client", str(port), "2", "3", "7"],
                           env=default_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
        d = reg.wait_stats(lambda d: d["accelerated_server"] >= 6)
        assert d["accelerated_client"] == 6 and d["accelerated_server"] == 6, d
    finally:
        for p in made + ["/dev/shm/smclo/c/1.00000000", "/dev/shm/smclo/t/0x"]:
            if os.path.exists(p):
                os.unlink(p)


def test_forged_entry_beside_a_real_server(procs):
    """The same forged entry beside a service user's real smclo server: its
    clients are still accelerated (the entries no longer agree on one
    inbox, so the rendezvous, where the server proves itself first), and
    nothing reaches MALLORY."""
    port = free_port()
    stress = str(TESTBIN / "stress")
    srv = procs.start(as_user(SERVICE) + [SMCLO, "run", "--", stress, "server", str(port), "lt"],
                      default_env(), smclo=False)
    wait_port(port, proc=srv)
    m = start_mallory(procs, port, "forge:4")
    reg = DefaultRegistry()
    r = subprocess.run(as_user(CLIENT) + [SMCLO, "run", "--", stress, "client", str(port), "2",
                                          "3", "7"], env=default_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
    d = reg.wait_stats(lambda d: d["accelerated_server"] >= 6)
    assert d["accelerated_client"] == 6 and d["accelerated_server"] == 6, d
    got, err = mallory_received(m)
    assert got == ["0", "messages", "0", "descriptors"], (got, err)


def test_squatted_rendezvous_gets_nothing(procs, tmp_path):
    """MALLORY binds the rendezvous name of a connection she is no end of (a
    plain client's, from a source port she knows).  Before, the service's
    server, finding it after accept(), sent her its TCP socket: the client's
    bytes and the right to answer them.  Now it sends only to a user the
    kernel names as the owner of the client's end: the connection stays on
    TCP, byte exact, named unverified-user, and she receives no descriptor
    (at most the decline that tells a waiting client to go on over TCP)."""
    port, sport = free_port(), free_port()
    stress = str(TESTBIN / "stress")
    srv = procs.start(as_user(SERVICE) + [SMCLO, "run", "--", stress, "server", str(port), "lt"],
                      default_env(), smclo=False)
    wait_port(port, proc=srv)
    m = start_mallory(procs, port, "squat:%d:3" % sport)
    reg = DefaultRegistry()
    client = script(tmp_path, "client.py", TIMED_CLIENT)
    r = subprocess.run(as_user(CLIENT) + [PY3, client, str(port), "1", str(sport)],
                       env=default_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = reg.wait_stats(lambda d: d["fallback_by_reason"]["unverified-user"] >= 1)
    assert d["fallback_by_reason"]["unverified-user"] == 1, named(d)
    got, err = mallory_received(m)
    assert got[0] in ("0", "1") and got[1:] == ["messages", "0", "descriptors"], (got, err)


def test_silent_client_of_another_user_holds_accept_briefly(procs):
    """MALLORY binds a rendezvous, connects, takes the server's ACCEPT and
    never confirms: the server, inside accept(), waits for her CONFIRM
    30 ms (an honest client confirms at once), not the handshake timeout
    (300 ms, kept for one's own user) - an event loop's every connection
    would wait behind her."""
    port = free_port()
    stress = str(TESTBIN / "stress")
    srv = procs.start([SMCLO, "run", "--", stress, "server", str(port), "lt"], default_env(),
                      smclo=False)
    wait_port(port, proc=srv)
    try:
        held = []
        for _ in range(3):
            r = subprocess.run(as_user(MALLORY) + [PY3, HOSTILE, "client", SHARED, str(port),
                                                   "silent"], env=default_env(),
                               capture_output=True, text=True, timeout=60)
            assert r.stdout.startswith("held"), r.stdout + r.stderr
            held.append(int(r.stdout.split()[1]))
        assert sorted(held)[1] < 150, held
        assert srv.poll() is None
    finally:
        state = os.path.join(SHARED, "state3")      # her page, of no use to anyone
        if os.path.exists(state) and os.stat(state).st_uid == MALLORY:
            os.unlink(state)


PRIVATE_FALLBACK = r"""
set -e
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
setpriv --reuid=$MALLORY --regid=$MALLORY --clear-groups -- sh -c 'mkdir /dev/shm/smclo && chmod 1777 /dev/shm/smclo'
"$SMCLO" stats --json > /dev/null 2> "$OUT/stats.err"
setpriv --reuid=$SERVICE --regid=$SERVICE --clear-groups -- "$SMCLO" run -- "$STRESS" server $PORT lt &
srv=$!
for i in $(seq 100); do grep -q ":$(printf %04X $PORT) .* 0A " /proc/net/tcp && break; sleep 0.05; done
"$SMCLO" run -- "$STRESS" client $PORT 1 3 7 > "$OUT/client.out"
kill $srv; wait $srv || true
"$SMCLO" stats --json > "$OUT/stats.json"
ls -ld /dev/shm/smclo-0 /dev/shm/smclo-$SERVICE > "$OUT/dirs"
ls -A /dev/shm/smclo > "$OUT/hers"
"""


def test_registry_taken_by_another_user_named(tmp_path):
    """MALLORY made /dev/shm/smclo before root did (no tmpfiles.d entry, in
    a mount namespace of its own here): nobody uses a directory she could
    empty or rearrange.  Each user falls back to a registry of its own, a
    connection between two users stays on TCP, byte exact, and says why
    (private-registry, never peer-no-smclo); `smclo stats` names the cause."""
    out = tmp_path / "out"
    out.mkdir()
    env = dict(default_env(), MALLORY=str(MALLORY), SERVICE=str(SERVICE), SMCLO=SMCLO,
               STRESS=str(TESTBIN / "stress"), PORT=str(free_port()), OUT=str(out))
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        PRIVATE_FALLBACK], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mismatches=0" in (out / "client.out").read_text()
    err = (out / "stats.err").read_text()
    assert "/dev/shm/smclo-0, this user's own" in err and "must be root's" in err, err
    st = json.loads((out / "stats.json").read_text())
    assert st["registry"] == "/dev/shm/smclo-0", st
    assert st["accelerated"] == 0 and st["fallback_by_reason"]["private-registry"] == 3, st
    assert "drwx------" in (out / "dirs").read_text()
    # root touched nothing in the directory she made (before: it made its
    # subdirectories there, chmod by name - a name she could swap for a link)
    assert (out / "hers").read_text().split() == [], (out / "hers").read_text()


def test_hostile_peer_of_another_user(procs):
    """MALLORY speaks the handshake in bad faith to root's server (offers
    whose pair end is a pipe, whose region could shrink, a direct offer
    proving with a UDP socket, impossible cursors after a rendezvous): the
    server declines or resets her connection, never crashes or hangs, and
    goes on accelerating an honest client of a third user."""
    port = free_port()
    stress = str(TESTBIN / "stress")
    srv = procs.start([SMCLO, "run", "--", stress, "server", str(port), "lt"], default_env(),
                      smclo=False)
    wait_port(port, proc=srv)
    stress_client = as_user(CLIENT) + [SMCLO, "run", "--", stress, "client", str(port), "1",
                                       "2", "3"]
    # the honest client first: its offer makes the server take connections
    # without TCP (the direct inbox the attacks below aim at too)
    r = subprocess.run(stress_client, env=default_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
    for attack in ("inbox-pipe", "inbox-unsealed", "direct-proof", "prod"):
        subprocess.run(as_user(MALLORY) + [PY3, HOSTILE, "client", SHARED, str(port), attack],
                       env=default_env(), capture_output=True, text=True, timeout=60)
        assert srv.poll() is None, (attack, srv.stderr.read())
    reg = DefaultRegistry()
    r = subprocess.run(stress_client, env=default_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "mismatches=0" in r.stdout, r.stdout + r.stderr
    d = reg.wait_stats(lambda d: d["accelerated_server"] >= 2)
    assert d["accelerated_client"] == 2 and d["accelerated_server"] == 2, d
