"""Real servers from Debian's packages, in their default configurations,
against smclo clients: every byte checked, every connection accounted for in
`smclo stats` (accelerated, or on TCP with the reason the design gives), and
every wait bounded (sockets, subprocesses, polls).

* nginx started as root with no `user` directive, so its workers run as
  nobody (a root master and unprivileged workers is also Debian's default,
  with www-data):
  - in root's own registry (0700, like the default /dev/shm/smclo-0) the
    workers cannot reach the registry: every connection on TCP with a named
    reason, none hangs, and none waits out its handshake bound first;
  - in a registry open to both users (mode 1777) with SMCLO_ALLOW_UIDS naming
    root and nobody (README, docs/design.md section 4): every connection
    accelerated.
  48 GETs from Python (every fourth a random Range) and 2 from curl (one a
  Range), each on its own connection, bodies compared with the file.
* PostgreSQL (the `postgresql` package, initdb's configuration), run as the
  postgres user: `pgbench -i`, then `pgbench -c 4 -j 2 -T 5`: no failed
  transaction, every connection accelerated.  The postmaster forks a backend
  for each connection and closes its own copy.
* socat TCP-LISTEN,fork (the parent accepts, forks, closes its copy): PIPE
  (the forked child echoes), EXEC:cat (the child relays to cat), and the
  inetd form EXEC:cat,nofork (the connection is cat's stdin and stdout
  across exec).  20 connections of 100 KiB each way, byte exact.
* socketserver.ForkingTCPServer and ThreadingTCPServer echo servers: the same.
"""
import glob
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import PY, SMCLO, Registry, free_port, need, wait_port

SIZE = 100 * 1024
CONNS = 20
NGINX_REQUESTS = 48         # from Python; curl makes 2 more
AS_POSTGRES = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]

# 20 connections, 5 at a time: each sends SIZE random bytes while reading the
# echo, compares it, then half-closes and expects EOF.  Prints one verdict per
# connection ("ok" or what went wrong, with how far it got).
ECHO_CLIENT = r"""
import json, os, socket, sys, threading
from concurrent.futures import ThreadPoolExecutor

port, n, size, par = (int(a) for a in sys.argv[1:5])


def first_difference(a, b):
    for i in range(0, min(len(a), len(b)), 4096):
        if a[i:i + 4096] != b[i:i + 4096]:
            return i + next(k for k in range(4096) if a[i + k] != b[i + k])
    return None


def one(i):
    data, got = os.urandom(size), bytearray()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError as e:
        return "connect: %r" % e
    with s:
        err = []

        def send():
            try:
                s.sendall(data)
            except OSError as e:
                err.append(e)
        t = threading.Thread(target=send, daemon=True)
        t.start()
        try:
            while len(got) < size:
                d = s.recv(min(65536, size - len(got)))
                if not d:
                    break
                got += d
            t.join(5)
            diff = first_difference(got, data)
            if diff is not None:
                return "wrong bytes from offset %d (of %d received)" % (diff, len(got))
            if len(got) < size:
                return "EOF after %d of %d bytes (send: %s)" % (
                    len(got), size, repr(err[0]) if err else "done" if not t.is_alive()
                    else "blocked")
            if t.is_alive() or err:
                return "send: %s" % (repr(err[0]) if err else "blocked 5 s after the echo")
            s.shutdown(socket.SHUT_WR)
            extra = 0
            while True:
                d = s.recv(65536)
                if not d:
                    break
                extra += len(d)
            return "%d bytes after the echo" % extra if extra else "ok"
        except socket.timeout:
            return "timeout (5 s) after %d of %d bytes echoed" % (len(got), size)
        except OSError as e:
            return "%r after %d of %d bytes echoed" % (e, len(got), size)


with ThreadPoolExecutor(par) as ex:
    print(json.dumps(list(ex.map(one, range(n)))))
"""

SOCKETSERVER = r"""
import socketserver, sys


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            d = self.request.recv(65536)
            if not d:
                return
            self.request.sendall(d)


Server = {"forking": socketserver.ForkingTCPServer,
          "threading": socketserver.ThreadingTCPServer}[sys.argv[1]]
Server.allow_reuse_address = True
with Server(("127.0.0.1", int(sys.argv[2])), Echo) as srv:
    srv.serve_forever()
"""

# N GETs of one file, each on a new connection; every fourth asks a random
# Range.  One verdict per request.
HTTP_CLIENT = r"""
import http.client, json, random, sys

port, n, url, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
blob = open(path, "rb").read()
rnd = random.Random(n)
out = []
for i in range(n):
    headers, want, status, crange = {"Connection": "close"}, blob, 200, None
    if i % 4 == 1:
        a = rnd.randrange(len(blob))
        b = rnd.randrange(a, len(blob))
        headers["Range"] = "bytes=%d-%d" % (a, b)
        want, status, crange = blob[a:b + 1], 206, "bytes %d-%d/%d" % (a, b, len(blob))
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request("GET", url, headers=headers)
        r = c.getresponse()
        body = r.read()
        if r.status != status:
            out.append("status %d, expected %d" % (r.status, status))
        elif crange and r.getheader("Content-Range") != crange:
            out.append("Content-Range %s, expected %s" % (r.getheader("Content-Range"), crange))
        elif body != want:
            out.append("%d bytes, expected %d%s" % (len(body), len(want), ", other bytes"
                                                  if len(body) == len(want) else ""))
        else:
            out.append("ok")
    except Exception as e:
        out.append("%s: %s" % (type(e).__name__, e))
    finally:
        c.close()
print(json.dumps(out))
"""

# Debian's /etc/nginx/nginx.conf without `user` (so the workers run as
# nobody), without its includes of sites, and with its paths in the test's
# directory (temp paths too: nginx would chown Debian's /var/lib/nginx)
NGINX_CONF = """
worker_processes auto;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 768; }}
http {{
    sendfile on;
    tcp_nopush on;
    types_hash_max_size 2048;
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log {dir}/access.log;
    gzip on;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
    }}
}}
"""


# The same, with the site as a reverse proxy (upstream keepalive, as nginx's
# documentation recommends) to a second server of the same nginx.
NGINX_PROXY_CONF = NGINX_CONF.replace("""    server {{
        listen 127.0.0.1:{port};
        root {dir}/www;
    }}""", """    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
    server {{
        listen 127.0.0.1:{backend};
        access_log {dir}/backend.log;
        root {dir}/www;
    }}""")


@pytest.fixture
def scratch(procs):
    """make(prefix, mode, owner=None): a directory under /tmp (pytest's own
    tmp is root's 0700, out of other users' reach); removed after the
    test's processes are stopped."""
    made = []

    def make(prefix, mode, owner=None):
        d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        os.chmod(d, mode)
        if owner is not None:
            os.chown(d, owner.pw_uid, owner.pw_gid)
        made.append(d)
        return Path(d)
    yield make
    procs.stop_all()
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def named(st):
    return {k: v for k, v in st["fallback_by_reason"].items() if v}


def assert_accelerated(reg, n, exact=True):
    """n connections, both ends accelerated, nothing on TCP."""
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= n and s["accelerated_server"] >= n)
    assert st["fallback"] == 0, "on TCP: %s; accelerated client %d, server %d" % (
        named(st), st["accelerated_client"], st["accelerated_server"])
    if exact:
        assert st["accelerated_client"] == n and st["accelerated_server"] == n, st
    else:
        assert st["accelerated_client"] >= n, st
        assert st["accelerated_server"] == st["accelerated_client"], st
    return st


def echo_round(reg, port, n=CONNS):
    r = reg.run([PY, "-c", ECHO_CLIENT, str(port), str(n), str(SIZE), "5"], timeout=45)
    assert r.returncode == 0, r.stdout + r.stderr
    verdicts = json.loads(r.stdout)
    bad = {i: v for i, v in enumerate(verdicts) if v != "ok"}
    assert not bad, "%d of %d connections failed: %s" % (len(bad), n, bad)


def alive(p, what):
    assert p.poll() is None, "%s exited with %s" % (what, p.returncode)


# ---- socat, socketserver: fork after accept, exec ---------------------------

SOCAT_FORMS = {
    "pipe": ["PIPE"],                       # the forked child echoes through a pipe
    "exec": ["EXEC:{cat}"],                 # the child relays to cat through a socketpair
    "exec-nofork": ["EXEC:{cat},nofork"],   # inetd: the connection is cat's stdin/stdout
}


@pytest.mark.parametrize("form", list(SOCAT_FORMS))
def test_socat_fork(reg, procs, form):
    need("socat")
    port = free_port()
    right = [a.format(cat=shutil.which("cat")) for a in SOCAT_FORMS[form]]
    srv = procs.start(["socat", "TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork" % port] + right,
                      reg.env)
    wait_port(port, proc=srv)
    echo_round(reg, port)
    alive(srv, "socat")
    assert_accelerated(reg, CONNS)


@pytest.mark.parametrize("kind", ["forking", "threading"])
def test_socketserver(reg, procs, kind):
    port = free_port()
    srv = procs.start([PY, "-c", SOCKETSERVER, kind, str(port)], reg.env)
    wait_port(port, proc=srv)
    echo_round(reg, port)
    alive(srv, "the %s server" % kind)
    assert_accelerated(reg, CONNS)


# ---- nginx as root, workers as nobody ----------------------------------------

def nginx_workers(master):
    """pid -> effective uid of each child of @master."""
    workers = {}
    for t in glob.glob("/proc/[0-9]*/status"):
        try:
            f = dict(l.split(":", 1) for l in open(t).read().splitlines() if ":" in l)
        except OSError:
            continue
        if int(f["PPid"]) == master:
            workers[int(t.split("/")[2])] = int(f["Uid"].split()[1])
    return workers


def nginx_healthy(srv, d, workers):
    """The master and the same workers still there, none died on a signal."""
    alive(srv, "nginx")
    errors = (d / "error.log").read_text()
    assert "exited on signal" not in errors, errors[-3000:]
    assert nginx_workers(srv.pid) == workers, errors[-3000:]


def start_nginx_as_root(env, procs, scratch, conf=NGINX_CONF):
    """nginx from its package, started by root; returns (port, dir, blob,
    master, workers)."""
    need("nginx")
    assert os.geteuid() == 0, "nginx's workers change user only when started by root"
    port = free_port()
    d = scratch("smclo-nginx-", 0o755)         # nobody must read www
    (d / "www").mkdir(mode=0o755)
    (d / "tmp").mkdir(mode=0o755)
    blob = os.urandom(300 * 1024 + 17)
    (d / "www" / "blob.bin").write_bytes(blob)
    os.chmod(d / "www" / "blob.bin", 0o644)
    (d / "nginx.conf").write_text(conf.format(dir=d, port=port, backend=free_port()))
    srv = procs.start(["nginx", "-e", str(d / "error.log"), "-p", str(d), "-c",
                       str(d / "nginx.conf")], env)
    wait_port(port, proc=srv)
    # the workers: children of the master, as nobody (no `user` directive)
    nobody = pwd.getpwnam("nobody").pw_uid
    deadline = time.time() + 10
    while not ((workers := nginx_workers(srv.pid)) and
               all(u == nobody for u in workers.values())) and time.time() < deadline:
        time.sleep(0.05)
    assert workers and all(u == nobody for u in workers.values()), \
        "nginx workers (pid: euid) %s, expected euid %d" % (workers, nobody)
    return port, d, blob, srv, workers


def fetch_all(reg, port, d, blob):
    """48 GETs from Python, 2 from curl (one a Range): all byte exact."""
    need("curl")
    r = reg.run([PY, "-c", HTTP_CLIENT, str(port), str(NGINX_REQUESTS), "/blob.bin",
                 str(d / "www" / "blob.bin")], timeout=40)
    assert r.returncode == 0, r.stdout + r.stderr
    verdicts = json.loads(r.stdout)
    bad = {i: v for i, v in enumerate(verdicts) if v != "ok"}
    assert not bad, "%d of %d requests failed: %s" % (len(bad), len(verdicts), bad)
    url = "http://127.0.0.1:%d/blob.bin" % port
    for args, want in (([], blob), (["-r", "1000-65535"], blob[1000:65536])):
        out = d / "got"
        r = reg.run(["curl", "-sS", "--max-time", "5", "-o", str(out)] + args + [url],
                    timeout=10)
        assert r.returncode == 0, r.stderr
        got = out.read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest(), \
            "curl %s: %d bytes, expected %d" % (" ".join(args), len(got), len(want))
    # every request reached the access log (written as the request ends)
    n = NGINX_REQUESTS + 2
    deadline = time.time() + 5
    while len(log := (d / "access.log").read_text().splitlines()) < n and time.time() < deadline:
        time.sleep(0.05)
    codes = [m.group(1) if (m := re.search(r'" (\d{3}) ', l)) else l for l in log]
    assert len(log) == n and set(codes) <= {"200", "206"}, log[-5:]
    return n


def test_nginx_root_private_registry(reg, procs, scratch):
    """Root's own registry (0700, as /dev/shm/smclo-0): the workers, as
    nobody, cannot reach it.  Every request served, byte exact, no hang;
    nothing accelerated, every connection on TCP under a named reason; and
    no client waits out its handshake bound (`timeout`: each such connection
    starts SMCLO_HANDSHAKE_MS late)."""
    port, d, blob, srv, workers = start_nginx_as_root(reg.env, procs, scratch)
    n = fetch_all(reg, port, d, blob)
    nginx_healthy(srv, d, workers)
    st = reg.wait_stats(lambda s: s["fallback"] >= n)
    assert st["accelerated"] == 0, st
    # each client end counts its connection once, under a reason
    assert st["fallback"] >= n, st
    assert sum(st["fallback_by_reason"].values()) == st["fallback"], st
    assert st["fallback_by_reason"]["timeout"] == 0, (
        "%d connections waited the whole handshake bound before going on TCP (reasons: %s): "
        "the workers cannot answer in root's registry, and clients are not told" % (
            st["fallback_by_reason"]["timeout"], named(st)))


def test_nginx_root_shared_registry_accelerated(reg, procs, scratch):
    """A registry nobody can use too (mode 1777) and SMCLO_ALLOW_UIDS naming
    both users: root's clients and nobody's workers attach."""
    shared = Registry(scratch("smclo-reg-", 0o1777))
    nobody = pwd.getpwnam("nobody").pw_uid
    shared.env["SMCLO_ALLOW_UIDS"] = "0,%d" % nobody
    port, d, blob, srv, workers = start_nginx_as_root(shared.env, procs, scratch)
    n = fetch_all(shared, port, d, blob)
    nginx_healthy(srv, d, workers)
    assert_accelerated(shared, n)


def test_nginx_reverse_proxy_upstream_keepalive(reg, procs, scratch):
    """nginx as a reverse proxy (proxy_pass, upstream keepalive) to a server
    of its own, the workers able to use the registry.  nginx puts each
    upstream socket into epoll before connect(): accelerated, that
    registration once named the hidden TCP socket and every proxied request
    hung (curl: 0 bytes, timeout); then such connections stayed on TCP
    (epoll-before-connect).  Now the registration follows the switch
    (src/shim/epoll_early.c): every request byte exact, both hops
    accelerated, nothing on TCP."""
    shared = Registry(scratch("smclo-reg-", 0o1777))
    nobody = pwd.getpwnam("nobody").pw_uid
    shared.env["SMCLO_ALLOW_UIDS"] = "0,%d" % nobody
    port, d, blob, srv, workers = start_nginx_as_root(shared.env, procs, scratch,
                                                      NGINX_PROXY_CONF)
    n = fetch_all(shared, port, d, blob)
    nginx_healthy(srv, d, workers)
    # client -> proxy: n; proxy -> backend: at least one (kept alive)
    st = assert_accelerated(shared, n + 1, exact=False)
    assert st["fallback"] == 0, named(st)


# ---- PostgreSQL ----------------------------------------------------------------

def pg_bindir():
    """The newest server of Debian's postgresql package (15 on bookworm)."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                  key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not dirs:
        pytest.fail("postgresql is not installed: run `make test`, which installs it")
    return Path(dirs[-1]).parent


class PostgresRegistry(Registry):
    """A registry of the postgres user, read as that user."""

    def stats(self):
        out = subprocess.run(AS_POSTGRES + [SMCLO, "stats", "--json"], env=self.env,
                             check=True, capture_output=True, text=True, timeout=60).stdout
        return json.loads(out)


def test_postgresql_pgbench(procs, scratch):
    assert os.geteuid() == 0, "this test runs PostgreSQL as the postgres user"
    need("setpriv")
    bindir = pg_bindir()
    pg = pwd.getpwnam("postgres")
    base = scratch("smclo-pg-", 0o700, owner=pg)
    reg = PostgresRegistry(base / "registry")      # made 0700 by postgres's first process
    env = dict(reg.env, HOME=str(base), PGCONNECT_TIMEOUT="10")

    def as_pg(args, timeout, smclo=True):
        cmd = AS_POSTGRES + ([SMCLO, "run", "--"] if smclo else []) + [str(a) for a in args]
        return subprocess.run(cmd, env=env, cwd=base, capture_output=True, text=True,
                              timeout=timeout)

    r = as_pg([bindir / "initdb", "-D", base / "data"], 60, smclo=False)
    assert r.returncode == 0, r.stdout + r.stderr
    port = free_port()
    log = base / "postgres.log"
    with open(log, "w") as logf:
        os.chown(log, pg.pw_uid, pg.pw_gid)
        srv = procs.start(AS_POSTGRES + [SMCLO, "run", "--", str(bindir / "postgres"),
                                         "-D", str(base / "data"), "-p", str(port),
                                         "-c", "listen_addresses=127.0.0.1",
                                         "-k", str(base)],
                          env, smclo=False, cwd=base, stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while "ready to accept connections" not in log.read_text():
        assert srv.poll() is None, "postgres exited: " + log.read_text()[-3000:]
        assert time.time() < deadline, "postgres not ready in 30 s: " + log.read_text()[-3000:]
        time.sleep(0.05)
    try:
        conn = ["-h", "127.0.0.1", "-p", port]
        r = as_pg([bindir / "pgbench", "-i"] + conn + ["postgres"], 40)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "done in" in r.stderr, r.stderr
        r = as_pg([bindir / "pgbench", "-c", "4", "-j", "2", "-T", "5"] + conn + ["postgres"], 40)
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"number of transactions actually processed: (\d+)", r.stdout)
        assert m and int(m.group(1)) > 0, r.stdout + r.stderr
        m = re.search(r"number of failed transactions: (\d+)", r.stdout)
        assert m and int(m.group(1)) == 0, r.stdout + r.stderr
        alive(srv, "postgres")
        # no backend died (the postmaster would restart the others and go on)
        assert not re.search(r"terminated by signal|exited with exit code|PANIC",
                             log.read_text()), log.read_text()[-3000:]
    except BaseException as e:
        e.add_note("postgres log:\n" + log.read_text()[-3000:])
        raise
    finally:
        procs.stop(srv, signal.SIGINT)         # fast shutdown
    # pgbench -i: 1 connection; the run: 1 to look at the tables, 1 per client
    assert_accelerated(reg, 6, exact=False)
