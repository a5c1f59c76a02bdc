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
  the mosquitto user;
* PostgreSQL behind pgbouncer (its packaged configuration, transaction
  pooling), both as the postgres user: pgbouncer's default
  tcp_defer_accept;
* apache2 (mpm_event and mpm_prefork) with Debian's configuration and its
  default AcceptFilter (several children accept on a deferring listener:
  they share their parent's inbox), clients as root and as another user, a
  graceful restart under load;
* nginx passing PHP to php-fpm over FastCGI (its pool as Debian configures
  it, listening on a TCP port), varnish in front of nginx.
"""
import os
import pwd
import re
import signal
import subprocess
import time

import pytest

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


def test_postgresql_behind_pgbouncer(default_reg, procs, scratch):  # noqa: F811
    """PostgreSQL and pgbouncer as the postgres user (Debian's units run both
    so), pgbouncer with its packaged configuration - only paths, ports, the
    database and transaction pooling set - and so with its default
    tcp_defer_accept: the kernel wakes it only at a client's first bytes,
    which go over TCP with the client's offer (docs/design.md §2a).
    pgbench -c 8 through pgbouncer: no failed transaction, both hops
    accelerated, no handshake timeout."""
    from test_servers import pg_bindir, AS_POSTGRES
    need("pgbouncer")
    bindir = pg_bindir()
    pg = pwd.getpwnam("postgres")
    base = scratch("smclo-pgb-", 0o700, owner=pg)
    env = dict(default_reg.env, HOME=str(base), PGCONNECT_TIMEOUT="10", PGPASSWORD="pw")

    def as_pg(args, timeout=60, smclo=True):
        cmd = AS_POSTGRES + ([SMCLO, "run", "--"] if smclo else []) + [str(a) for a in args]
        return subprocess.run(cmd, env=env, cwd=base, capture_output=True, text=True,
                              timeout=timeout)

    r = as_pg([bindir / "initdb", "-D", base / "data", "--auth-host=md5", "--auth-local=trust"],
              smclo=False)
    assert r.returncode == 0, r.stdout + r.stderr
    pg_port, bouncer_port = free_port(), free_port()
    log = base / "postgres.log"
    with open(log, "w") as logf:
        os.chown(log, pg.pw_uid, pg.pw_gid)
        db = procs.start(AS_POSTGRES + [SMCLO, "run", "--", str(bindir / "postgres"), "-D",
                                        str(base / "data"), "-p", str(pg_port), "-c",
                                        "listen_addresses=127.0.0.1", "-k", str(base)],
                         env, smclo=False, cwd=base, stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while "ready to accept connections" not in log.read_text():
        assert db.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    r = as_pg(["psql", "-h", base, "-p", pg_port, "-c", "ALTER USER postgres PASSWORD 'pw'",
               "postgres"])
    assert r.returncode == 0, r.stdout + r.stderr
    ini = open("/etc/pgbouncer/pgbouncer.ini").read()
    for old, new in (("logfile = /var/log/postgresql/pgbouncer.log", "logfile = %s/pgb.log" % base),
                     ("pidfile = /var/run/postgresql/pgbouncer.pid", "pidfile = %s/pgb.pid" % base),
                     ("listen_port = 6432", "listen_port = %d" % bouncer_port),
                     ("unix_socket_dir = /var/run/postgresql", "unix_socket_dir = %s" % base),
                     ("auth_file = /etc/pgbouncer/userlist.txt",
                      "auth_file = %s/userlist.txt\npool_mode = transaction" % base),
                     ("[databases]", "[databases]\npostgres = host=127.0.0.1 port=%d" % pg_port)):
        assert old in ini, old
        ini = ini.replace(old, new)
    (base / "pgbouncer.ini").write_text(ini)
    (base / "userlist.txt").write_text('"postgres" "pw"\n')
    for f in ("pgbouncer.ini", "userlist.txt"):
        os.chown(base / f, pg.pw_uid, pg.pw_gid)
    bouncer = procs.start(AS_POSTGRES + [SMCLO, "run", "--", "pgbouncer",
                                         str(base / "pgbouncer.ini")],
                          env, smclo=False, cwd=base)
    wait_port(bouncer_port, proc=bouncer)
    r = as_pg([bindir / "pgbench", "-i", "-h", "127.0.0.1", "-p", pg_port, "postgres"])
    assert r.returncode == 0, r.stdout + r.stderr
    reg = type(default_reg)()           # from here: the run through pgbouncer
    try:
        r = as_pg([bindir / "pgbench", "-c", "8", "-j", "2", "-T", "5", "-h", "127.0.0.1", "-p",
                   bouncer_port, "postgres"])
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"number of failed transactions: (\d+)", r.stdout)
        assert m and int(m.group(1)) == 0, r.stdout + r.stderr
        assert int(re.search(r"actually processed: (\d+)", r.stdout).group(1)) > 0, r.stdout
    finally:
        procs.stop(bouncer)
        procs.stop(db, signal.SIGINT)
    # 1 + 8 pgbench connections to pgbouncer; pgbouncer's own to postgres
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 10)
    assert st["fallback"] == 0, {k: v for k, v in st["fallback_by_reason"].items() if v}
    assert st["accelerated_client"] >= 10 and st["accelerated_server"] == st["accelerated_client"], st


APACHE_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                           "apache2-site.sh")


@pytest.mark.parametrize("mpm", ["event", "prefork"])
def test_apache2_default_accept_filter(default_reg, procs, scratch, mpm):  # noqa: F811
    """apache2 as Debian configures it (only the port and paths changed):
    started by root, children as www-data, its Linux default AcceptFilter
    (http: TCP_DEFER_ACCEPT) on a listener several children accept on.
    Accelerated: the children read their parent's inbox, which their
    entries name too, and a client sends its offer with its first bytes
    (handshake/inbox.c, "a shared inbox").  ab -c 20 with and without
    keep-alive as root, ab as another user, ab -c 60 (more connections at
    once than children), and a graceful restart under load: every request answered byte exact, no connection waiting out a
    handshake timeout (before deferred accept was handled, 40 requests took
    12 s), and all but a few connections accelerated - the few named
    offer-missed (a child that held the offer out of the queue while
    another accepted its connection, on this 2-CPU machine under load)."""
    need("apache2")
    need("ab")
    conf = scratch("smclo-apache-", 0o755)
    port = free_port()
    r = subprocess.run(["sh", APACHE_SITE, str(conf), str(port), mpm],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    blob = os.urandom(50000)
    (conf / "www" / "blob.bin").write_bytes(blob)
    env = dict(default_reg.env, APACHE_CONFDIR=str(conf))
    srv = procs.start(["sh", "-c", '. "$APACHE_CONFDIR/envvars" && exec %s run -- apache2 '
                       '-d "$APACHE_CONFDIR" -DFOREGROUND' % SMCLO], env, smclo=False)
    wait_port(port, proc=srv)
    url = "http://127.0.0.1:%d/blob.bin" % port
    t0 = time.monotonic()
    # the last: more connections at once than children (prefork starts 5),
    # their offers waiting in the shared inbox while the kernel queues them
    # (with one park for all, every accept read every waiting offer: 8x
    # slower than TCP, and timeouts)
    for who, args in (([], ["-n", "200", "-c", "20"]), ([], ["-n", "200", "-c", "20", "-k"]),
                      (as_client(), ["-n", "200", "-c", "20"]), ([], ["-n", "600", "-c", "60"])):
        r = subprocess.run(who + [SMCLO, "run", "--", "ab", "-q"] + args + [url], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"Failed requests:\s+0\n", r.stdout), r.stdout
        assert re.search(r"Complete requests:\s+%s\n" % args[1], r.stdout), r.stdout
        assert "Non-2xx" not in r.stdout and "Document Length:        50000" in r.stdout, r.stdout
    # 200 + 200 + 600 connections, and the keep-alive run's 20
    conns = 1020
    st = default_reg.wait_stats(lambda s: s["accelerated_client"] >= 0.95 * conns)
    no_timeouts(st)
    reasons = {k: v for k, v in st["fallback_by_reason"].items() if v}
    # defer-accept: a connection ab closed unused once its requests were done
    # (nothing to wake a server with: never offered); peer-no-smclo: the
    # server's end of it, or of a missed offer
    assert set(reasons) <= {"offer-missed", "defer-accept", "peer-no-smclo"}, reasons
    assert st["accelerated_client"] >= 0.95 * conns, (st["accelerated_client"], reasons)
    assert st["accelerated_server"] == st["accelerated_client"], st
    # a graceful restart while requests come: a client whose server accepts
    # later than the handshake timeout (children ending, new ones starting)
    # goes on over TCP, counted as a timeout; not one request fails
    ab = subprocess.Popen([SMCLO, "run", "--", "ab", "-q", "-n", "400", "-c", "10", url],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    subprocess.run(["sh", "-c", '. "$APACHE_CONFDIR/envvars" && apache2 -d "$APACHE_CONFDIR" '
                    '-k graceful'], env=env, check=True, timeout=30)
    out, err = ab.communicate(timeout=120)
    assert ab.returncode == 0 and re.search(r"Failed requests:\s+0\n", out), out + err
    took = time.monotonic() - t0
    got = subprocess.run(["curl", "-sS", "--max-time", "5", url], capture_output=True,
                         timeout=10).stdout
    assert got == blob
    conns += 400
    st = default_reg.wait_stats(lambda s: s["accelerated_client"] >= 0.9 * conns)
    assert st["accelerated_client"] >= 0.9 * conns, st
    assert took < 60, "%.1f s for 1600 requests" % took
    assert srv.poll() is None


def nginx_fcgi_conf():
    from test_servers import NGINX_CONF
    return NGINX_CONF.replace("""        root {dir}/www;
    }}""", """        root {dir}/www;
        location ~ \\\\.php$ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME {dir}/www$fastcgi_script_name;
            fastcgi_pass 127.0.0.1:{backend};
        }}
    }}""")


PHP = "<?php echo str_repeat(md5($_GET['n'] ?? 'x'), 4096);\n"


def test_nginx_fastcgi_php_fpm(default_reg, procs, scratch):  # noqa: F811
    """nginx started by root (workers nobody) passing PHP to php-fpm over
    FastCGI, php-fpm as Debian configures its pool (master root, workers
    www-data; only `listen` moved from its unix socket to a TCP port, the
    setting users change for this): pages exact, both hops accelerated.
    php-fpm's workers move the listener to descriptor 0 (dup2, close):
    their entries closed with the original, and the first connection went
    to the master's inbox, which never accepts, and waited the handshake
    timeout (hs_listener_closed now hands the entry to the copy)."""
    import hashlib
    need("php-fpm8.2")
    port, d, blob, srv, workers = start_nginx_as_root(default_reg.env, procs, scratch,
                                                      nginx_fcgi_conf())
    fpm_port = int(re.search(r"fastcgi_pass 127.0.0.1:(\d+)", (d / "nginx.conf").read_text())
                   .group(1))
    (d / "www" / "page.php").write_text(PHP)
    os.chmod(d / "www" / "page.php", 0o644)
    pool = open("/etc/php/8.2/fpm/pool.d/www.conf").read()
    pool = pool.replace("listen = /run/php/php8.2-fpm.sock", "listen = 127.0.0.1:%d" % fpm_port)
    (d / "fpm.conf").write_text("[global]\npid = %s/fpm.pid\nerror_log = %s/fpm.log\n%s"
                                % (d, d, pool))
    fpm = procs.start(["php-fpm8.2", "-F", "-y", str(d / "fpm.conf")], default_reg.env)
    wait_port(fpm_port, proc=fpm)
    # its workers forked (pm.start_servers), as when requests come
    deadline = time.time() + 10
    while len(subprocess.run(["pgrep", "-P", str(fpm.pid)], capture_output=True,
                             text=True).stdout.split()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    reg = type(default_reg)()
    n = 30
    for i in range(n):
        r = subprocess.run([SMCLO, "run", "--", "curl", "-sS", "--max-time", "5",
                            "http://127.0.0.1:%d/page.php?n=%d" % (port, i)], env=reg.env,
                           capture_output=True, timeout=30)
        want = hashlib.md5(str(i).encode()).hexdigest().encode() * 4096
        assert r.returncode == 0 and r.stdout == want, (r.stdout[:200], r.stderr)
    # client -> nginx: n; nginx -> php-fpm: one per request
    st = reg.wait_stats(lambda s: s["accelerated_client"] >= 2 * n)
    assert st["fallback"] == 0, {k: v for k, v in st["fallback_by_reason"].items() if v}
    assert st["accelerated_client"] == 2 * n and st["accelerated_server"] == 2 * n, st
    assert fpm.poll() is None and srv.poll() is None


def test_varnish_in_front_of_nginx(default_reg, procs, scratch):  # noqa: F811
    """varnishd as its unit starts it (-j unix,user=vcache, its packaged VCL
    with the backend's port changed) in front of nginx started by root:
    30 uncached requests of a 300 KB file and their cached repeats, byte
    exact.  varnish -> nginx is accelerated.  client -> varnish is not:
    varnish's jail makes the listening socket as root and announces it as
    vcache (its effective user between), and no client believes an entry
    whose writer does not own the socket (docs/security.md, "What is
    left"); those connections take TCP at once, named unverified-user."""
    need("varnishd")
    port, d, blob, srv, workers = start_nginx_as_root(default_reg.env, procs, scratch)
    vport, admin = free_port(), free_port()
    vcl = open("/etc/varnish/default.vcl").read().replace('.port = "8080";',
                                                          '.port = "%d";' % port)
    (d / "default.vcl").write_text(vcl)
    (d / "secret").write_bytes(os.urandom(32))
    os.chmod(d / "secret", 0o600)
    varnish = procs.start(["varnishd", "-j", "unix,user=vcache", "-F", "-a",
                           "127.0.0.1:%d" % vport, "-T", "127.0.0.1:%d" % admin, "-f",
                           str(d / "default.vcl"), "-S", str(d / "secret"), "-s", "malloc,64m",
                           "-n", str(d / "varnish")], default_reg.env)
    wait_port(vport, proc=varnish, timeout=30)
    reg = type(default_reg)()
    for i in range(30):
        for _ in range(2):              # a miss, then a hit
            r = subprocess.run([SMCLO, "run", "--", "curl", "-sS", "--max-time", "5",
                                "http://127.0.0.1:%d/blob.bin?i=%d" % (vport, i)],
                               env=reg.env, capture_output=True, timeout=30)
            assert r.returncode == 0 and r.stdout == blob, (len(r.stdout), r.stderr)
    st = reg.wait_stats(lambda s: s["fallback_by_reason"]["unverified-user"] >= 60)
    why = {k: v for k, v in st["fallback_by_reason"].items() if v}
    # 60 client -> varnish on TCP, named at both ends
    assert why == {"unverified-user": 60, "peer-no-smclo": 60}, why
    # varnish -> nginx: at least one connection (kept alive), accelerated
    assert st["accelerated_client"] >= 1, st
    assert st["accelerated_server"] == st["accelerated_client"], st
    assert varnish.poll() is None
