"""docs/containers.md on a real container engine: Podman from Debian, two
containers made from a root file system that mmdebstrap builds from Debian's
packages (`--rootfs`, no image from a registry), the library mounted from
the host read-only, the registry on a named volume owned by the uid both
containers run as (`--user 999:999`).

Two topologies, each the way the document gives it:

* a pod: both containers in one network namespace (each with a PID
  namespace of its own), the client dials 127.0.0.1 - the inbox handshake;
* Podman's default bridge: a network namespace each, the client dials the
  server container's address - the rendezvous across network namespaces.

Root looks at the registry from the host (`smclo stats` and `smclo stat`,
SMCLO_DIR the volume's host path) before the containers start and while
their connections are open, half their bytes through: looking must not
lock the containers' user out (root's `smclo stats` used to leave
subdirectories of root's at 0700 in the volume, and every connection of the
containers then stayed on TCP).  Every connection is accelerated at both
ends, none falls back for any reason, every byte comes back (hashed).

Podman here: runc (`[engine] runtime`), and `default_ulimits` in a
containers.conf of the test's own (CONTAINERS_CONF; nothing under /etc is
changed): rootful Podman 4.3 gives containers RLIMIT_NOFILE and RLIMIT_NPROC
1048576 by default, which runc cannot set where root lacks CAP_SYS_RESOURCE
("error setting rlimit type 7: operation not permitted"; this machine's
hard RLIMIT_NOFILE is 20000), and Podman lowers its own RLIMIT_NPROC to
32768 before it starts runc (type 6 then, for anything above).

The root file system is cached under /var/tmp, keyed by a hash of what it
is built from (suite, variant, packages): a fresh machine builds it (15-25 s
here), later runs reuse it (each test then takes 2-4 s).  Containers run on
an overlay above it (`:O`), so the cached tree is never written."""
import hashlib
import json
import os
import resource
import select
import shutil
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import BUILD, Registry, need

TESTS = os.path.dirname(os.path.abspath(__file__))
LIB = str(BUILD / "libsmclo.so")
IN_LIB = "/usr/local/lib/libsmclo.so"       # where the containers see the library
IN_REG = "/run/smclo"                       # and the registry
IN_TESTS = "/smclo-tests"                   # and peer.py
UID = 999
PORT = 7000
ROOTFS_VARIANT = "minbase"
ROOTFS_PACKAGES = ("python3",)
ROOTFS_CACHE = Path(os.environ.get("SMCLO_ROOTFS_CACHE", "/var/tmp"))
ROOTFS_PREFIX = "smclo-podman-rootfs-"

BIG = 6             # connections open at once, each a few MiB
BIG_SIZE = 2 << 20
SMALL = 20          # then connections one after another

# The client, in its container: BIG connections at once, each sending its
# own random bytes to the echo server and reading the echo meanwhile; half
# of every connection's bytes through, it says "half" and waits for a line
# on stdin (the host looks at the registry then); then the rest, a
# half-close and the echo to its end.  Then SMALL connections one after
# another.  It prints "uid U bad K bytes B conns C" (K connections whose
# echo's sha256 differs from what they sent, B bytes sent in all).
CLIENT = r"""
import hashlib, os, random, socket, sys, threading
host, port, big, size, small = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])

class Conn:
    def __init__(self, n):
        self.data = os.urandom(n)
        self.half = n // 2
        self.got = bytearray()
        self.eof = False
        self.cv = threading.Condition()
        self.s = socket.create_connection((host, port))
        self.reader = threading.Thread(target=self.read)
        self.reader.start()

    def read(self):
        while True:
            d = self.s.recv(1 << 16)
            with self.cv:
                self.got += d
                self.eof = not d
                self.cv.notify_all()
            if not d:
                return

    def first(self):
        self.s.sendall(self.data[:self.half])
        with self.cv:
            self.cv.wait_for(lambda: len(self.got) >= self.half or self.eof)

    def rest(self):
        self.s.sendall(self.data[self.half:])
        self.s.shutdown(socket.SHUT_WR)
        self.reader.join()
        self.s.close()

    def bad(self):
        return hashlib.sha256(self.got).digest() != hashlib.sha256(self.data).digest()

def each(f, conns):
    ts = [threading.Thread(target=f, args=(c,)) for c in conns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

conns = [Conn(size + 4099 * i) for i in range(big)]
each(Conn.first, conns)
print("half", flush=True)
sys.stdin.readline()
each(Conn.rest, conns)
for i in range(small):
    c = Conn(random.randrange(1, 256 << 10))
    c.first()
    c.rest()
    conns.append(c)
print("uid", os.getuid(), "bad", sum(c.bad() for c in conns),
      "bytes", sum(len(c.data) for c in conns), "conns", len(conns), flush=True)
"""


def host_env():
    """For podman and mmdebstrap: none of smclo's settings, nothing preloaded
    (a sanitizer run's helpers are for the programs under test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMCLO_")}
    env.pop("LD_PRELOAD", None)
    return env


# ---- the root file system -----------------------------------------------------

def host_suite():
    """The host's Debian release: the library needs the glibc it was built
    against, or a later one."""
    try:
        for line in open("/etc/os-release"):
            if line.startswith("VERSION_CODENAME=") and line.strip().split("=", 1)[1]:
                return line.strip().split("=", 1)[1].strip('"')
    except OSError:
        pass
    return "bookworm"


@pytest.fixture(scope="session")
def rootfs():
    """A Debian root file system with python3, built by mmdebstrap once per
    recipe and kept under ROOTFS_CACHE (renamed into place when complete, so a
    build cut short is never taken for a cached one)."""
    need("mmdebstrap")
    suite = host_suite()
    recipe = json.dumps({"suite": suite, "variant": ROOTFS_VARIANT,
                         "packages": sorted(ROOTFS_PACKAGES), "format": 1}, sort_keys=True)
    key = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    path = ROOTFS_CACHE / (ROOTFS_PREFIX + key)
    if not (path / "usr/bin/python3").exists():
        tmp = ROOTFS_CACHE / ("%s%s.tmp-%d" % (ROOTFS_PREFIX, key, os.getpid()))
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.time()
        r = subprocess.run(["mmdebstrap", "--mode=root", "--format=directory",
                            "--variant=" + ROOTFS_VARIANT,
                            "--include=" + ",".join(ROOTFS_PACKAGES), suite, str(tmp)],
                           env=host_env(), capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail("mmdebstrap failed (%d):\n%s" % (r.returncode, r.stderr[-3000:]))
        print("mmdebstrap built %s in %.1f s" % (path, time.time() - t0))
        try:
            os.rename(tmp, path)
        except OSError:         # another session put one there meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        # earlier recipes' trees (not one being built: those end in .tmp-PID)
        for old in ROOTFS_CACHE.glob(ROOTFS_PREFIX + "*"):
            if old != path and ".tmp-" not in old.name:
                shutil.rmtree(old, ignore_errors=True)
    assert (path / "usr/bin/python3").exists(), path
    return str(path)


# ---- podman ---------------------------------------------------------------------

@pytest.fixture(scope="session")
def podman_env(tmp_path_factory):
    """The environment podman runs in: a containers.conf of our own."""
    need("podman")
    need("runc")
    need("conmon")
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20)
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 32768 if nproc_hard == resource.RLIM_INFINITY else min(nproc_hard, 32768)
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=%d:%d", "nproc=%d:%d"]\n'
                    '[engine]\nruntime = "runc"\n' % (nofile, nofile, nproc, nproc))
    return dict(host_env(), CONTAINERS_CONF=str(conf))


def sanitizer_setup():
    """Under tools/sanitize.sh (SMCLO_PRELOAD_FIRST set, the library built
    with ASan): the runtimes go ahead of the library in the containers too,
    the helpers the suite inherits (LD_PRELOAD) behind it, each mounted at
    its host path, and the reports reach the host's log directory.  Returns
    (LD_PRELOAD, mount options, environment options)."""
    first = [p for p in os.environ.get("SMCLO_PRELOAD_FIRST", "").split(":") if p]
    if not first:
        return IN_LIB, [], []
    behind = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p]
    mounts, envs = [], []
    for p in first + behind:
        mounts += ["-v", "%s:%s:ro" % (os.path.realpath(p), p)]
    logdirs = set()
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "SANITIZE_UBSAN_LOG_PATH"):
        v = os.environ.get(var)
        if v is None:
            continue
        envs += ["-e", "%s=%s" % (var, v)]
        for opt in v.split(":"):
            if opt.startswith("log_path="):
                logdirs.add(os.path.dirname(opt[len("log_path="):]))
        if var == "SANITIZE_UBSAN_LOG_PATH":
            logdirs.add(os.path.dirname(v))
    for d in sorted(logdirs):
        mounts += ["-v", "%s:%s" % (d, d)]
    return ":".join(first + [IN_LIB] + behind), mounts, envs


class Podman:
    """Runs podman and removes, at the end, every container, pod and volume it
    made (and the pause image, if the pod's infra container made it)."""

    def __init__(self, env, rootfs, tmp_path):
        self.env, self.rootfs, self.tmp = env, rootfs, tmp_path
        self.tag = "smclo-test-" + uuid.uuid4().hex[:8]
        self.containers, self.pods, self.volumes, self.clients = [], [], [], []
        self.pause_images = self.images("localhost/podman-pause")

    def __call__(self, *args, check=True, timeout=120):
        r = subprocess.run(["podman"] + list(args), env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        assert r.returncode == 0 or not check, "podman %s: %d\n%s%s" % (
            " ".join(args)[:300], r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        return r.stdout.strip()

    def images(self, ref):
        return set(self("images", "-q", "--filter", "reference=" + ref, check=False).split())

    def name(self, what):
        return "%s-%s" % (self.tag, what)

    def volume(self):
        """A named volume for the registry, owned by UID and private to it
        (docs/containers.md: chown in a container); its host path."""
        name = self.name("registry")
        self.volumes.append(name)
        self("volume", "create", name)
        self("run", "--rm", "--name", self.name("chown"), "-v", name + ":/r",
             "--rootfs", self.rootfs + ":O", "sh", "-c",
             "chown %d:%d /r && chmod 700 /r" % (UID, UID))
        return name, self("volume", "inspect", "--format", "{{.Mountpoint}}", name)

    def pod(self):
        name = self.name("pod")
        self.pods.append(name)
        self("pod", "create", "--name", name)
        return name

    def smclo_options(self, volume):
        preload, mounts, envs = sanitizer_setup()
        passed = [k for k in os.environ if k.startswith("SMCLO_") and k not in (
            "SMCLO_DIR", "SMCLO_BUILD", "SMCLO_PRELOAD_FIRST", "SMCLO_DISABLE",
            "SMCLO_SHORT_LIVED", "SMCLO_ROOTFS_CACHE")]
        return (["-v", "%s:%s" % (volume, IN_REG), "-v", "%s:%s:ro" % (LIB, IN_LIB),
                 "-v", "%s:%s:ro" % (TESTS, IN_TESTS),
                 "-e", "LD_PRELOAD=" + preload, "-e", "SMCLO_DIR=" + IN_REG,
                 # as conftest.Registry: a busy machine must not change the outcome
                 "-e", "SMCLO_SHORT_LIVED=0", "--user", "%d:%d" % (UID, UID)]
                + mounts + envs + sum((["-e", "%s=%s" % (k, os.environ[k])]
                                       for k in sorted(passed)), []))

    def start_server(self, volume, pod=None):
        name = self.name("server")
        self.containers.append(name)
        self("run", "-d", "--name", name, *(["--pod", pod] if pod else []),
             *self.smclo_options(volume), "--rootfs", self.rootfs + ":O",
             "python3", IN_TESTS + "/peer.py", "echo-many", "0.0.0.0", str(PORT))
        pid = int(self("inspect", "--format", "{{.State.Pid}}", name))
        wait_listening(self, name, pid, PORT)
        return name, pid

    def start_client(self, volume, host, pod=None):
        name = self.name("client")
        self.containers.append(name)
        err = open(self.tmp / "client.stderr", "w+")
        p = subprocess.Popen(["podman", "run", "-i", "--rm", "--name", name,
                              *(["--pod", pod] if pod else []), *self.smclo_options(volume),
                              "--rootfs", self.rootfs + ":O", "python3", "-c", CLIENT, host,
                              str(PORT), str(BIG), str(BIG_SIZE), str(SMALL)],
                             env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err, bufsize=0)
        p.errfile = err
        self.clients.append(p)
        return name, p

    def address(self, name):
        return self("inspect", "--format", "{{.NetworkSettings.IPAddress}}", name)

    def pid(self, name):
        return int(self("inspect", "--format", "{{.State.Pid}}", name))

    def logs(self, name):
        r = subprocess.run(["podman", "logs", name], env=self.env, capture_output=True,
                           text=True, timeout=60)
        return (r.stdout + r.stderr)[-2000:]

    def cleanup(self):
        for p in self.clients:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
            p.errfile.close()
        if self.containers:
            self("rm", "-f", "-i", "-t", "0", *self.containers, check=False)
        for pod in self.pods:
            self("pod", "rm", "-f", "-t", "0", pod, check=False)
        for v in self.volumes:
            self("volume", "rm", "-f", v, check=False)
        made = self.images("localhost/podman-pause") - self.pause_images
        if made:
            self("rmi", *sorted(made), check=False)
        left = self("ps", "-a", "--format", "{{.Names}}", "--filter", "name=" + self.tag,
                    check=False)
        assert not left, "containers left behind: %s" % left


@pytest.fixture
def podman(podman_env, rootfs, tmp_path):
    p = Podman(podman_env, rootfs, tmp_path)
    try:
        yield p
    finally:
        p.cleanup()


def wait_listening(podman, name, pid, port, timeout=30.0):
    """Until @port listens in the network namespace of @pid (a connection
    would be a plain client the counters see), bounded."""
    hexport = ":%04X" % port
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open("/proc/%d/net/tcp" % pid) as f:
                if any(l.split()[1].endswith(hexport) and l.split()[3] == "0A"
                       for l in f.readlines()[1:]):
                    return
        except OSError:
            pass
        if podman("inspect", "--format", "{{.State.Running}}", name, check=False) != "true":
            raise RuntimeError("server container %s ended: %s" % (name, podman.logs(name)))
        time.sleep(0.1)
    raise TimeoutError("nothing listens on port %d in container %s: %s" % (
        port, name, podman.logs(name)))


def read_line(p, timeout=120.0):
    """One line from @p's stdout (unbuffered), bounded."""
    line, deadline = b"", time.time() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.time()))
        if not ready:
            raise TimeoutError("no line from the client container in %d s (so far %r)" % (
                timeout, line))
        b = os.read(p.stdout.fileno(), 1)
        if not b:
            p.errfile.seek(0)
            raise RuntimeError("the client container ended (%r): %s" % (
                line, p.errfile.read()[-3000:]))
        line += b
    return line.decode().strip()


# ---- the checks -------------------------------------------------------------------

def registry_owned_by_uid(host_path):
    """Everything in the registry is UID's (nothing root's, which would shut
    the containers out), and no subdirectory is wider than the registry - but
    root's own totals, t/0 (each user's totals are a file of its own, which
    nobody else writes: `smclo stats` as root makes root's)."""
    bad = []
    root_totals = os.path.join(host_path, "t", "0")
    for dirpath, dirnames, filenames in os.walk(host_path):
        for n in [""] + dirnames + filenames:
            p = os.path.join(dirpath, n)
            try:
                st = os.lstat(p)
            except FileNotFoundError:       # an entry removed meanwhile
                continue
            if p == root_totals and stat.S_ISREG(st.st_mode) and st.st_uid == 0 and \
                    stat.S_IMODE(st.st_mode) == 0o600:
                continue
            if st.st_uid != UID or (stat.S_ISDIR(st.st_mode) and
                                    stat.S_IMODE(st.st_mode) != 0o700):
                bad.append("%s uid %d mode %o" % (p, st.st_uid, stat.S_IMODE(st.st_mode)))
    assert not bad, "in the registry, not the containers' user's own:\n" + "\n".join(bad)


def all_zero(st):
    return all(v == 0 for k, v in st.items() if isinstance(v, int) and k != "since") and \
        not any(st["fallback_by_reason"].values())


def netns(pid):
    return os.stat("/proc/%d/ns/net" % pid).st_ino


def pidns(pid):
    return os.stat("/proc/%d/ns/pid" % pid).st_ino


def check_open_connections(conns, server_addr):
    """`smclo stat` while the BIG connections are open: each on shm at both
    ends, each client's end the peer of a server's end."""
    assert len(conns) == 2 * BIG, conns
    assert all(c["mode"] == "shm" and c["reason"] == "" for c in conns), conns
    clients = {(c["local"], c["peer"]) for c in conns if c["role"] == "client"}
    servers = {(c["peer"], c["local"]) for c in conns if c["role"] == "server"}
    assert len(clients) == BIG and clients == servers, conns
    assert all(peer == server_addr for _, peer in clients), conns


def run_two_containers(podman, pod):
    """The recipe: volume, root's look from the host, server, client, root's
    look while the client's connections are open, the end.  Returns the
    final totals."""
    volume, host_path = podman.volume()
    reg = Registry(host_path)

    # root on the host, before any container of the registry's user started
    st = reg.stats()
    assert st["registry"] == host_path, st
    assert all_zero(st), st
    assert reg.stat() == [], "a connection in a new registry"
    registry_owned_by_uid(host_path)

    server, server_pid = podman.start_server(volume, pod)
    if pod:
        host = "127.0.0.1"
    else:
        host = podman.address(server)
        assert host and not host.startswith("127."), host
    client, p = podman.start_client(volume, host, pod)
    assert read_line(p) == "half"

    # the topology is the one meant: in a pod one network namespace and a
    # PID namespace each; on the bridge a network namespace each
    client_pid = podman.pid(client)
    assert pidns(client_pid) != pidns(server_pid)
    assert pidns(server_pid) != pidns(os.getpid())
    if pod:
        assert netns(client_pid) == netns(server_pid)
    else:
        assert netns(client_pid) != netns(server_pid) != netns(os.getpid())

    # root on the host again, the BIG connections open, half their bytes through
    during = reg.stats()
    assert during["accelerated_client"] == BIG and during["accelerated_server"] == BIG, during
    assert during["fallback"] == 0, during["fallback_by_reason"]
    check_open_connections(reg.stat(), "%s:%d" % (host, PORT))
    registry_owned_by_uid(host_path)

    out, _ = p.communicate(b"go\n", timeout=180)
    p.errfile.seek(0)
    err = p.errfile.read()[-3000:]
    assert p.returncode == 0, "client container: %d\n%s\n%s" % (p.returncode, out, err)
    words = out.decode().split()
    assert words[:4] == ["uid", str(UID), "bad", "0"] and words[6:] == [
        "conns", str(BIG + SMALL)], out.decode() + err
    sent = int(words[5])
    assert sent >= BIG * BIG_SIZE, words
    n = BIG + SMALL
    # every end has closed and added its bytes (a moment after the client's exit)
    st = reg.wait_stats(lambda s: s["tx_bytes"] >= 2 * sent and s["closed"] >= 2 * n)
    assert st["fallback"] == 0 and not any(st["fallback_by_reason"].values()), \
        st["fallback_by_reason"]
    assert st["accelerated_client"] == n and st["accelerated_server"] == n, st
    assert st["accelerated"] == 2 * n and st["handshake_errors"] == 0, st
    # every byte went through the rings: the client's out, the server's back
    assert st["tx_bytes"] == 2 * sent and st["rx_bytes"] == 2 * sent, (st, sent)
    registry_owned_by_uid(host_path)
    assert podman("inspect", "--format", "{{.State.Running}}", server) == "true", \
        podman.logs(server)
    return st


def test_pod_loopback(podman):
    """Two containers in a pod (one network namespace, a PID namespace
    each), the client dialing 127.0.0.1: every connection accelerated, each
    by the inbox handshake (one server process accepting)."""
    st = run_two_containers(podman, podman.pod())
    assert st["inbox_handshakes"] == BIG + SMALL, st


def test_default_bridge(podman):
    """Two containers on Podman's default bridge network, the client dialing
    the server container's address: every connection accelerated, by the
    rendezvous (across network namespaces no inbox is looked for)."""
    st = run_two_containers(podman, None)
    assert st["inbox_handshakes"] == 0 and st["direct_handshakes"] == 0, st
