"""Daemons from Debian's packages started as their packages start them - as
root, dropping to their own users - with smclo's defaults (no SMCLO_DIR,
no SMCLO_ALLOW_UIDS): the host's shared registry (DefaultRegistry).  For
each: bytes exact, every connection accelerated at both ends, no
handshake timeout counted, nothing left running (the watchdog).

* nginx started as root, no `user` directive: workers as nobody; static
  files with sendfile, Range requests (test_servers.fetch_all);
* memcached -u memcache: it drops to its user before it listens;
* redis-server as the redis user, as its systemd unit runs it;
* mosquitto started as root with its packaged configuration: it drops to
  the mosquitto user.
"""
import os
import pwd
import subprocess
import time

from conftest import SMCLO, default_env, free_port, need, wait_port
from test_servers import assert_accelerated, fetch_all, nginx_healthy, scratch  # noqa: F401
from test_servers import start_nginx_as_root

PY3 = "/usr/bin/python3"
CLIENT = 61003          # a user of its own for clients, as on a shared host

MEMCACHED_CLIENT = r"""
import os, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port))
    v = os.urandom(40000).hex().encode()
    c.sendall(b"set k%d 0 0 %d\r\n%s\r\n" % (i, len(v), v))
    got = b""
    while not got.endswith(b"\r\n"):
        got += c.recv(100)
    assert got == b"STORED\r\n", got
    c.sendall(b"get k%d\r\n" % i)
    want = b"VALUE k%d 0 %d\r\n%s\r\nEND\r\n" % (i, len(v), v)
    got = b""
    while len(got) < len(want):
        d = c.recv(1 << 16)
        assert d, "closed after %d bytes" % len(got)
        got += d
    assert got == want, "value %d differs" % i
    c.close()
print("ok", n)
"""


def as_client():
    return ["setpriv", "--reuid=%d" % CLIENT, "--regid=%d" % CLIENT, "--clear-groups", "--"]


def no_timeouts(st):
    assert st["fallback_by_reason"]["timeout"] == 0, st["fallback_by_reason"]


def test_nginx_as_debian_runs_it(default_reg, procs, scratch):  # noqa: F811
    """nginx started by root, its workers as nobody; clients as root."""
    port, d, blob, srv, workers = start_nginx_as_root(default_reg.env, procs, scratch)
    n = fetch_all(default_reg, port, d, blob)
    nginx_healthy(srv, d, workers)
    no_timeouts(assert_accelerated(default_reg, n))


def memcached_round(default_reg, port, n):
    for prefix in ([], as_client()):
        r = subprocess.run(prefix + [SMCLO, "run", "--", PY3, "-c", MEMCACHED_CLIENT, str(port),
                                     str(n)], env=default_reg.env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split() == ["ok", str(n)], r.stdout + r.stderr


def test_memcached_own_user(default_reg, procs):
    """memcached -u memcache, started by root: 80 KB values set and read
    back, clients as root and as another user."""
    need("memcached")
    pwd.getpwnam("memcache")
    port = free_port()
    srv = procs.start(["memcached", "-u", "memcache", "-l", "127.0.0.1", "-p", str(port),
                       "-U", "0", "-m", "64"], default_reg.env)
    wait_port(port, proc=srv)
    memcached_round(default_reg, port, 10)
    no_timeouts(assert_accelerated(default_reg, 20))
    assert srv.poll() is None


def test_redis_own_user(default_reg, procs, scratch):  # noqa: F811
    """redis-server as the redis user (its unit's User=redis), its packaged
    configuration with the port, pid file and directory changed;
    redis-benchmark as root and as another user."""
    need("redis-server")
    conf = open("/etc/redis/redis.conf").read()
    port = free_port()
    work = scratch("smclo-redis-", 0o755, owner=pwd.getpwnam("redis"))
    (work / "redis.conf").write_text(conf + "\nport %d\ndaemonize no\nsupervised no\n"
                                     "pidfile %s/redis.pid\ndir %s\nlogfile \"\"\n"
                                     "save \"\"\n" % (port, work, work))
    srv = procs.start(["setpriv", "--reuid=redis", "--regid=redis", "--init-groups", "--",
                       SMCLO, "run", "--", "redis-server", str(work / "redis.conf")],
                      default_reg.env, smclo=False)
    wait_port(port, proc=srv)
    for prefix in ([], as_client()):
        r = subprocess.run(prefix + [SMCLO, "run", "--", "redis-benchmark", "-p", str(port),
                                     "-c", "4", "-n", "2000", "-t", "set,get", "-d", "1000",
                                     "-q"], env=default_reg.env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "GET" in r.stdout, r.stdout + r.stderr
        r = subprocess.run(prefix + [SMCLO, "run", "--", "redis-cli", "-p", str(port), "set",
                                     "k", "v" * 100000], env=default_reg.env,
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == "OK", r.stdout + r.stderr
        r = subprocess.run(prefix + [SMCLO, "run", "--", "redis-cli", "-p", str(port), "get",
                                     "k"], env=default_reg.env, capture_output=True,
                           text=True, timeout=60)
        assert r.stdout.strip() == "v" * 100000, r.stderr
    st = assert_accelerated(default_reg, 20, exact=False)
    no_timeouts(st)


def test_mosquitto_own_user(default_reg, procs, scratch):  # noqa: F811
    """mosquitto started by root with its packaged configuration (a
    listener port, pid file, persistence and log paths changed): it drops to
    the mosquitto user.  A subscriber as another user receives a 200 KB
    message root publishes, byte exact."""
    need("mosquitto")
    need("mosquitto_sub")
    mosq = pwd.getpwnam("mosquitto")
    work = scratch("smclo-mosquitto-", 0o755, owner=mosq)
    port = free_port()
    conf = open("/etc/mosquitto/mosquitto.conf").read()
    conf = conf.replace("/run/mosquitto/mosquitto.pid", str(work / "pid"))
    conf = conf.replace("/var/lib/mosquitto/", str(work) + "/")
    conf = conf.replace("log_dest file /var/log/mosquitto/mosquitto.log", "log_dest stderr")
    conf = conf.replace("include_dir /etc/mosquitto/conf.d", "")
    (work / "mosquitto.conf").write_text(conf + "\nlistener %d 127.0.0.1\nallow_anonymous true\n"
                                         % port)
    srv = procs.start(["mosquitto", "-c", str(work / "mosquitto.conf")], default_reg.env)
    wait_port(port, proc=srv)
    payload = (work / "payload")
    payload.write_bytes(bytes(range(256)) * 800)
    os.chmod(payload, 0o644)
    sub = procs.start(as_client() + [SMCLO, "run", "--", "mosquitto_sub", "-p", str(port), "-t",
                                     "t/blob", "-C", "1", "-N"], default_reg.env, smclo=False)
    deadline = time.time() + 10
    while default_reg.stats()["accelerated_server"] < 1 and time.time() < deadline:
        time.sleep(0.05)                # subscribed (its connection accelerated)
    time.sleep(0.2)
    r = subprocess.run([SMCLO, "run", "--", "mosquitto_pub", "-p", str(port), "-t", "t/blob",
                        "-f", str(payload)], env=default_reg.env, capture_output=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    out, err = sub.communicate(timeout=30)
    assert out == payload.read_bytes(), (len(out), err)
    no_timeouts(assert_accelerated(default_reg, 2))
    assert srv.poll() is None
