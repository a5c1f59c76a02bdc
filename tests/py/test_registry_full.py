"""Failure injection on the registry's filesystem: never a crash, never a
hang, never a lost byte.

Registry files are mapped shared.  A file grown with ftruncate is sparse,
and the first store into a page a full tmpfs cannot back raises SIGBUS in
the application (design brief, hazard 12), so every mapped registry file is
allocated before it is mapped (registry_map_backed).

 - a registry on a small tmpfs that is full before anything starts:
   /bin/true exits 0 (it died of SIGBUS before), the cause is named on
   stderr, and an echo server and client move their bytes intact;
 - a tmpfs that fills up while a server runs: 20 more connections, intact;
 - a registry directory its user may no longer write: intact, the cause
   named on stderr.
 - /dev/shm itself full (a mount namespace of its own), the default
   registry: /bin/true exits 0, the cause named, an echo server and client
   move their bytes intact.
"""
import os
import subprocess

import pytest

from conftest import PY, SMCLO, Registry, free_port, tmpfs, wait_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


@pytest.fixture
def small_tmpfs():
    with tmpfs("2m") as d:
        yield d


def fill(d):
    """Fill the filesystem of @d to the last block."""
    subprocess.run(["dd", "if=/dev/zero", "of=" + os.path.join(d, "fill"), "bs=64k"],
                   capture_output=True, timeout=30)
    st = os.statvfs(d)
    assert st.f_bavail == 0


def churn(reg, port, n):
    r = reg.run([PY, PEER, "churn", "127.0.0.1", str(port), str(n)], timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr


def test_full_before_start(small_tmpfs, procs):
    fill(small_tmpfs)
    reg = Registry(os.path.join(small_tmpfs, "registry"))
    r = reg.run(["/bin/true"], timeout=30)
    assert r.returncode == 0, "exit %d: %s" % (r.returncode, r.stderr)
    assert "No space left on device" in r.stderr, r.stderr
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    churn(reg, port, 20)
    assert srv.poll() is None, "the server died: exit %s" % srv.returncode
    r = subprocess.run([SMCLO, "stats"], env=reg.env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr


def test_fills_while_serving(small_tmpfs, procs):
    reg = Registry(os.path.join(small_tmpfs, "registry"))
    port = free_port()
    srv = procs.start([PY, PEER, "echo-many", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    churn(reg, port, 5)
    fill(small_tmpfs)
    churn(reg, port, 20)
    assert srv.poll() is None, "the server died: exit %s" % srv.returncode
    st = reg.stats()
    assert st["accelerated"] >= 25, st


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_registry_not_writable(shared_dir, procs):
    """Root ignores permissions, so both ends run as nobody, in a registry
    nobody made and then may no longer write."""
    reg = Registry(os.path.join(shared_dir, "registry"))
    assert reg.run(NOBODY + ["/bin/true"], timeout=30).returncode == 0
    subdirs = [reg.path] + [p for p in reg.path.iterdir() if p.is_dir()]
    for sub in subdirs:
        os.chmod(sub, 0o500)
    port = free_port()
    srv = procs.start(NOBODY + [PY, PEER, "echo-many", "127.0.0.1", str(port)], reg.env)
    wait_port(port, proc=srv)
    r = reg.run(NOBODY + [PY, PEER, "churn", "127.0.0.1", str(port), "20"], timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    assert srv.poll() is None, "the server died: exit %s" % srv.returncode
    for sub in subdirs:
        os.chmod(sub, 0o700)
    # what could not be used is named, and nothing was accelerated through it
    assert "Permission denied" in r.stderr, r.stderr
    st = reg.stats()
    assert st["accelerated"] == 0, st


# Inside a mount namespace of its own, /dev/shm is replaced by a 2 MiB tmpfs
# filled to the last block; the registry is the default one (no SMCLO_DIR),
# under /dev/shm, as every user who sets nothing has it.
DEV_SHM_FULL = r"""
set -e
mount -t tmpfs -o size=2m tmpfs /dev/shm
dd if=/dev/zero of=/dev/shm/fill bs=64k 2>/dev/null || true
[ "$(stat -f -c %a /dev/shm)" = 0 ]
"$SMCLO" run -- /bin/true
"$SMCLO" run -- "$PY" "$PEER" echo-many 127.0.0.1 "$PORT" &
srv=$!
for i in $(seq 100); do
    "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT)).close()" \
        2>/dev/null && break
    sleep 0.05
done
"$SMCLO" run -- "$PY" "$PEER" churn 127.0.0.1 "$PORT" 20
kill -0 $srv
kill $srv
"""


def test_dev_shm_full():
    """/dev/shm itself full, default registry: every program runs (/bin/true
    exits 0, the cause named), and an echo server and its clients move
    their bytes intact, on TCP."""
    env = dict(os.environ, SMCLO=SMCLO, PY=PY, PEER=PEER, PORT=str(free_port()))
    env.pop("SMCLO_DIR", None)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", DEV_SHM_FULL],
                       env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, "exit %d:\n%s\n%s" % (r.returncode, r.stdout, r.stderr)
    assert r.stdout.split()[-2:] == ["bad", "0"], r.stdout      # after the server's "ready"
    assert "/dev/shm" in r.stderr and "No space left on device" in r.stderr, r.stderr
