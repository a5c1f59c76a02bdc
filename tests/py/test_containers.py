"""Containers without a container engine: processes in PID namespaces of
their own (every Docker or Kubernetes container has one), and whole
"containers" made with unshare - mount, PID, UTS and network namespaces, a
veth pair between the two, a private /dev/shm and /tmp each - with the
registry bind-mounted into both (docs/containers.md).

A peer in another PID namespace reads as pid 0 in SO_PEERCRED, and a pid it
writes into the registry is a number of its own namespace (both servers
below are pid 1): peers are told apart by keys that hold across namespaces
(src/core/peerid.h).  These tests fail when a peer in another PID namespace is
refused (it used to be counted `different-user`), and when a region reaches
a second process that happens to have the same pid."""
import os
import signal
import subprocess
import time

import pytest

from conftest import PY, SMCLO, VETH_NET, Registry, free_port, need

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
INSIDE = "/dev/shm/smclo"       # where each container sees the registry

# Run inside the new namespaces, before the program: a private /dev/shm and
# /tmp (tmpfs; the mount namespace keeps them from the host), the registry
# bind-mounted from the host ($1; before /tmp is covered, as it may live
# there), a host name of its own ($2).  Directories under /tmp the program
# comes from (a build tree there: $KEEP) are bound again at their paths.
SETUP = r"""
set -e
mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm
mkdir /dev/shm/smclo /dev/shm/.keep
mount --bind "$1" /dev/shm/smclo
i=0; for d in $KEEP; do mkdir /dev/shm/.keep/$i; mount --bind "$d" /dev/shm/.keep/$i; i=$((i+1)); done
mount -t tmpfs -o size=64m,mode=1777 tmpfs /tmp
i=0; for d in $KEEP; do mkdir -p "$d"; mount --bind /dev/shm/.keep/$i "$d"; i=$((i+1)); done
hostname "$2"
shift 2
exec "$@"
"""


def in_container(netns, host_registry, name, argv):
    """The command that runs @argv as pid 1 of a container in @netns."""
    return ["ip", "netns", "exec", netns, "unshare", "--mount", "--pid", "--uts", "--fork",
            "--mount-proc", "--kill-child", "sh", "-c", SETUP, "sh", str(host_registry),
            name] + list(argv)


def container_env(reg):
    """The registry as the container sees it; what it runs from under /tmp kept."""
    needed = {os.path.dirname(SMCLO), os.path.dirname(PEER), os.path.dirname(PY)}
    keep = sorted(d for d in needed if d.startswith("/tmp/") and " " not in d)
    return dict(reg.env, SMCLO_DIR=INSIDE, KEEP=" ".join(keep))


def wait_listening(proc, port, timeout=10.0):
    """Until @port listens in the network namespace of @proc (a connection
    would count as a plain client), bounded."""
    hexport = ":%04X" % port
    deadline = time.time() + timeout
    while time.time() < deadline:
        for table in ("tcp", "tcp6"):
            try:
                with open("/proc/%d/net/%s" % (proc.pid, table)) as f:
                    if any(l.split()[1].endswith(hexport) and l.split()[3] == "0A"
                           for l in f.readlines()[1:]):
                        return
            except OSError:
                pass
        if proc.poll() is not None:
            raise RuntimeError("server exited early: %s" % proc.stderr.read())
        time.sleep(0.05)
    raise TimeoutError("nothing listens on port %d in the namespace of pid %d" % (port, proc.pid))


def pidfs():
    """Does this kernel name processes on pidfs (6.9), so that a peer in
    another PID namespace can be recognised and its regions reused?"""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 9)


class Containers:
    """Processes started in containers, each killed with its process group
    (SIGKILL: a pid 1 without a handler ignores SIGTERM)."""

    def __init__(self):
        self.procs = []

    def start(self, netns, host_registry, reg, name, argv):
        # stdout (redis logs there) is not read: it must not fill a pipe
        p = subprocess.Popen(in_container(netns, host_registry, name, argv),
                             env=container_env(reg), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def run(self, netns, host_registry, reg, name, argv, timeout=60):
        return subprocess.run(in_container(netns, host_registry, name, argv),
                              env=container_env(reg), capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=30)


@pytest.fixture
def containers(two_namespaces):
    need("unshare")
    c = Containers()
    try:
        yield c
    finally:
        c.stop_all()        # before two_namespaces removes the namespaces


def start_redis(containers, netns, host_registry, reg, port):
    srv = containers.start(netns, host_registry, reg, "server",
                           [SMCLO, "run", "--", "redis-server", "--port", str(port),
                            "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "",
                            "--appendonly", "no", "--dir", "/tmp"])
    wait_listening(srv, port)
    return srv


def test_redis_across_containers_sharing_the_registry(two_namespaces, containers, tmp_path):
    """redis-server in one container, redis-benchmark and a client of
    sequential connections in the other: every connection accelerated
    (the rendezvous handshake, across network namespaces), and regions
    reused with the server although its pid reads 0 here."""
    need("redis-server")
    need("redis-benchmark")
    a, b = two_namespaces
    host = tmp_path / "registry"
    host.mkdir(mode=0o700)
    reg = Registry(host)
    port, echo_port = free_port(), free_port()
    start_redis(containers, a, host, reg, port)
    echo = containers.start(a, host, reg, "echo",
                            [SMCLO, "run", "--", PY, PEER, "echo", "0.0.0.0", str(echo_port)])
    wait_listening(echo, echo_port)
    r = containers.run(b, host, reg, "client",
                       [SMCLO, "run", "--", "redis-benchmark", "-h", VETH_NET + "1", "-p",
                        str(port), "-t", "set,get", "-n", "2000", "-c", "4", "-q"])
    assert r.returncode == 0 and "SET" in r.stdout and "GET" in r.stdout, r.stdout + r.stderr
    r = containers.run(b, host, reg, "client",
                       [SMCLO, "run", "--", PY, PEER, "churn", VETH_NET + "1", str(echo_port),
                        "30"])
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= 38)
    assert st["fallback"] == 0, st["fallback_by_reason"]
    assert st["accelerated_client"] >= 30 + 8, st        # 2x4 benchmark clients, 30 churn
    assert st["accelerated_server"] == st["accelerated_client"], st
    if pidfs():
        # one client process, one server process, one at a time: a region
        # serves the next connection (SO_PEERCRED's pid is 0 across PID namespaces)
        assert st["regions_reused"] >= 20, st


def test_separate_registries_stay_on_tcp(two_namespaces, containers, tmp_path):
    """Each container with a registry of its own: neither finds the other,
    both ends stay on TCP and say why (peer-no-smclo)."""
    need("redis-server")
    need("redis-benchmark")
    a, b = two_namespaces
    ha, hb = tmp_path / "a", tmp_path / "b"
    ha.mkdir(mode=0o700)
    hb.mkdir(mode=0o700)
    ra, rb = Registry(ha), Registry(hb)
    port = free_port()
    start_redis(containers, a, ha, ra, port)
    r = containers.run(b, hb, rb, "client",
                       [SMCLO, "run", "--", "redis-benchmark", "-h", VETH_NET + "1", "-p",
                        str(port), "-t", "set", "-n", "200", "-c", "2", "-q"])
    assert r.returncode == 0 and "SET" in r.stdout, r.stdout + r.stderr
    sa = ra.wait_stats(lambda s: s["fallback"] >= 2)
    sb = rb.stats()
    assert sa["accelerated"] == 0 and sb["accelerated"] == 0, (sa, sb)
    assert sb["fallback"] >= 2 and sb["fallback_by_reason"]["peer-no-smclo"] == sb["fallback"], sb
    assert sa["fallback"] >= 2 and sa["fallback_by_reason"]["peer-no-smclo"] == sa["fallback"], sa


# ---- one network namespace, a PID namespace each -----------------------------

def pid_namespace(argv):
    """@argv as pid 1 of a PID namespace of its own (and a mount namespace
    for its /proc), printing its pid there first."""
    return ["unshare", "-p", "-f", "--mount-proc", "--kill-child", "sh", "-c",
            'echo $$; exec "$@"', "sh"] + list(argv)


@pytest.fixture
def pid1_procs():
    need("unshare")
    started = []

    def start(argv, env):
        p = subprocess.Popen(pid_namespace(argv), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        started.append(p)
        assert p.stdout.readline().strip() == "1", "not pid 1 in a namespace of its own"
        return p

    yield start
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_three_pid_namespaces_accelerate(reg, pid1_procs):
    """A server and two clients, each pid 1 of its own PID namespace, one
    registry: 100 connections, all accelerated (the inbox handshake), none
    counted as another user's."""
    port = free_port()
    srv = pid1_procs([SMCLO, "run", "--", PY, PEER, "echo-many", "127.0.0.1", str(port)],
                     reg.env)
    assert srv.stdout.readline().strip() == "ready"
    clients = [subprocess.Popen(pid_namespace([SMCLO, "run", "--", PY, PEER, "churn",
                                               "127.0.0.1", str(port), "50"]),
                                env=reg.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True) for _ in range(2)]
    for c in clients:
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0 and out.split() == ["1", "bad", "0"], out + err
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= 100)
    assert st["accelerated_client"] == 100 and st["accelerated_server"] == 100, st
    assert st["fallback"] == 0, st["fallback_by_reason"]


ALTERNATE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from peer import connect, exchange
ports, bad = [int(p) for p in sys.argv[3:]], 0
for i in range(int(sys.argv[2])):
    c = connect("127.0.0.1", ports[i % len(ports)])
    data = bytes([i % 256]) * (1000 + 997 * i)
    bad += exchange(c, data) != data
    c.close()
print("bad", bad)
"""


def test_regions_never_reach_another_process_with_the_same_pid(reg, pid1_procs):
    """Two servers, both pid 1 (each in its own PID namespace), and a client
    that connects to one, then the other, in turn.  A region keyed by the
    pid the registry names (1 for both) went on to the second server with
    the first one's bytes in it, while the first still had it mapped: one
    region made, 39 reused.  Each server must get regions of its own."""
    ports = [free_port(), free_port()]
    for port in ports:
        srv = pid1_procs([SMCLO, "run", "--", PY, PEER, "echo", "127.0.0.1", str(port)],
                         reg.env)
        assert srv.stdout.readline().strip() == "ready"
    r = reg.run([PY, "-c", ALTERNATE, os.path.dirname(PEER), "40"] + [str(p) for p in ports],
                timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["bad", "0"], r.stdout + r.stderr
    st = reg.wait_stats(lambda s: s["accelerated_server"] >= 40)
    assert st["accelerated_client"] == 40 and st["fallback"] == 0, st
    # at least one region per server process; the rest reused with the same one
    assert st["regions_created"] >= 2, st
    assert st["regions_created"] + st["regions_reused"] == 40, st
