"""MariaDB 10.11 from Debian's packages as Debian starts it - by root
(`mariadbd --user=mysql`, as mysqld_safe and the init script do: it drops to
the mysql user), with smclo's defaults (no SMCLO_DIR, no SMCLO_ALLOW_UIDS:
the host's shared registry, DefaultRegistry) and its packaged configuration
files (/etc/mysql/my.cnf and its includes), of which only ports and paths are
changed, on the command line: a scratch datadir (mariadb-install-db
--user=mysql), its own socket and pid file, a free port, bind 127.0.0.1.

So InnoDB does its file I/O through io_uring (innodb_use_native_aio=ON,
Debian's build links liburing; "InnoDB: Using io_uring"): mariadbd holds an
io_uring instance while it serves its clients, and the test asserts it does.

Clients under smclo over TCP 127.0.0.1, as root and as another user:
mariadb-slap (4 concurrent clients, 3 iterations, no failed query) and a
16 MiB LONGBLOB of random bytes written and read back byte exact.  Every
connection the server accepted (its Connections counter) accelerated at both
ends, nothing on TCP, no handshake timeout counted; mariadbd stopped by
SIGTERM to its pid, shut down cleanly, nothing left running (the watchdog).
"""
import hashlib
import os
import pwd
import re
import signal
import subprocess
import time

from conftest import SMCLO, free_port, need, wait_port
from test_daemons import as_client, no_timeouts
from test_servers import named, scratch  # noqa: F401

MARIADBD = "/usr/sbin/mariadbd"
BLOB = 16 << 20                 # 16 MiB, exactly the packaged max_allowed_packet
CHUNK = 4 << 20                 # bytes per statement (8 MiB of hex in the query)
SLAP_CLIENTS, SLAP_ITERATIONS, SLAP_QUERIES = 4, 3, 200


def blob_sql(row, blob):
    """SQL that stores @blob as row @row, in statements the server accepts.

    The packaged configuration leaves max_allowed_packet at the server's
    default, 16M (16777216 bytes; only [mysqldump] sets it in
    conf.d/mysqldump.cnf): no query may be longer.  A 16 MiB value cannot be
    sent in one statement, however encoded (hex doubles it, escaping adds to
    it, and the statement around it adds more): the server drops such a
    connection ("Got a packet bigger than 'max_allowed_packet' bytes").  So
    the value goes in 4 MiB pieces, an INSERT and UPDATEs with CONCAT, which
    may build a value up to max_allowed_packet: 16 MiB is exactly allowed.
    The server's defaults stay as packaged."""
    sql = [b"INSERT INTO t.blobs VALUES (%d, x'%s');" % (row, blob[:CHUNK].hex().encode())]
    for i in range(CHUNK, len(blob), CHUNK):
        sql.append(b"UPDATE t.blobs SET b = CONCAT(b, x'%s') WHERE id = %d;"
                   % (blob[i:i + CHUNK].hex().encode(), row))
    sql.append(b"SELECT LENGTH(b), SHA2(b, 256) FROM t.blobs WHERE id = %d;" % row)
    return b"\n".join(sql) + b"\n"


def io_uring_fds(pid):
    fds = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == "anon_inode:[io_uring]":
                fds.append(int(fd))
        except OSError:
            pass
    return fds


def test_mariadb_as_debian_runs_it(default_reg, procs, scratch):  # noqa: F811
    """mariadbd started by root under smclo with Debian's configuration,
    InnoDB on io_uring; mariadb-slap and a 16 MiB blob round trip over TCP,
    as root and as another user: bytes exact, every connection accelerated
    at both ends, clean shutdown."""
    for b in ("mariadb", "mariadb-slap", "mariadb-install-db", MARIADBD):
        need(b)
    mysql = pwd.getpwnam("mysql")
    work = scratch("smclo-mariadb-", 0o755, owner=mysql)
    data, sock, pidfile = work / "data", work / "mysqld.sock", work / "mysqld.pid"
    r = subprocess.run(["mariadb-install-db", "--user=mysql", "--datadir=%s" % data],
                       env=default_reg.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr

    port = free_port()
    log = work / "mariadbd.log"
    with open(log, "w") as logf:
        # no --defaults-file: mariadbd reads /etc/mysql/my.cnf and its
        # includes; the command line overrides the ports and paths only
        srv = procs.start([MARIADBD, "--user=mysql", "--datadir=%s" % data,
                           "--socket=%s" % sock, "--pid-file=%s" % pidfile,
                           "--port=%d" % port, "--bind-address=127.0.0.1"],
                          default_reg.env, stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while "ready for connections" not in log.read_text():
        assert srv.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    wait_port(port, proc=srv)
    # `smclo run` execs: the pid started is mariadbd's, now the mysql user's
    assert os.readlink("/proc/%d/exe" % srv.pid) == MARIADBD
    assert pidfile.read_text().strip() == str(srv.pid)
    assert os.stat("/proc/%d" % srv.pid).st_uid == mysql.pw_uid
    # InnoDB's default on this kernel: io_uring
    assert "InnoDB: Using io_uring" in log.read_text(), log.read_text()[-3000:]
    assert io_uring_fds(srv.pid), "mariadbd has no io_uring instance: %s" % sorted(
        os.readlink("/proc/%d/fd/%s" % (srv.pid, fd)) for fd in os.listdir("/proc/%d/fd" % srv.pid))

    def local(sql):
        """As root over the unix socket (unix_socket authentication, as
        Debian's root account): no TCP, outside what is counted."""
        r = subprocess.run(["mariadb", "--socket=%s" % sock, "-N", "-B", "-e", sql],
                           env=default_reg.env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def connections():
        out = local("SHOW GLOBAL STATUS LIKE 'Connections'")
        return int(out.split()[1])

    # root@localhost has no password (unix_socket only): a TCP account
    local("CREATE USER 'smclo'@'127.0.0.1' IDENTIFIED BY 'pw';"
          "GRANT ALL ON *.* TO 'smclo'@'127.0.0.1';"
          "CREATE DATABASE t;"
          "CREATE TABLE t.blobs (id INT PRIMARY KEY, b LONGBLOB) ENGINE=InnoDB;")
    assert local("SELECT @@max_allowed_packet, @@innodb_use_native_aio").split() == \
        [str(BLOB), "1"]
    tcp = ["--protocol=TCP", "--host=127.0.0.1", "--port=%d" % port, "--user=smclo",
           "--password=pw"]
    before = connections()

    for row, prefix in enumerate(([], as_client()), 1):
        r = subprocess.run(prefix + [SMCLO, "run", "--", "mariadb-slap"] + tcp +
                           ["--concurrency=%d" % SLAP_CLIENTS,
                            "--iterations=%d" % SLAP_ITERATIONS,
                            "--number-of-queries=%d" % SLAP_QUERIES, "--auto-generate-sql",
                            "--auto-generate-sql-load-type=mixed", "--engine=InnoDB"],
                           env=default_reg.env, capture_output=True, text=True, timeout=60)
        # mariadb-slap exits 1 at the first failed query
        assert r.returncode == 0 and "ERROR" not in r.stderr, r.stdout + r.stderr
        assert "Number of clients running queries: %d" % SLAP_CLIENTS in r.stdout, r.stdout
        assert "Average number of queries per client: %d" % (SLAP_QUERIES // SLAP_CLIENTS) \
            in r.stdout, r.stdout

        blob = os.urandom(BLOB)
        r = subprocess.run(prefix + [SMCLO, "run", "--", "mariadb"] + tcp + ["-N", "-B"],
                           input=blob_sql(row, blob), env=default_reg.env,
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
        assert r.stdout.decode() == "%d\t%s\n" % (BLOB, hashlib.sha256(blob).hexdigest()), \
            r.stdout[:200]
        # The row comes back in one result packet of 16 MiB and its length
        # prefix: more than the client's default max_allowed_packet (16M),
        # which drops the connection ("Lost connection to server during
        # query"); the client option it needs.  --raw: the bytes unescaped.
        r = subprocess.run(prefix + [SMCLO, "run", "--", "mariadb"] + tcp +
                           ["--max-allowed-packet=32M", "-N", "-B", "--raw", "-e",
                            "SELECT b FROM t.blobs WHERE id = %d" % row],
                           env=default_reg.env, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert len(r.stdout) == BLOB + 1, len(r.stdout)
        assert r.stdout == blob + b"\n", "the blob read back differs"

    # every connection the server accepted over TCP (the counter counts
    # the unix-socket one that reads it too)
    n = connections() - before - 1
    assert n >= 2 * (SLAP_CLIENTS * SLAP_ITERATIONS + 2), n
    assert io_uring_fds(srv.pid), "mariadbd closed its io_uring instance"

    os.kill(srv.pid, signal.SIGTERM)
    assert srv.wait(timeout=30) == 0, log.read_text()[-3000:]
    assert re.search(r"mariadbd: Shutdown complete", log.read_text()), log.read_text()[-3000:]

    # n connections, both ends counted (either way) before judging them
    st = default_reg.wait_stats(lambda s: s["accelerated"] + s["fallback"] >= 2 * n)
    assert st["fallback"] == 0, "on TCP: %s; accelerated client %d, server %d, of %d" % (
        named(st), st["accelerated_client"], st["accelerated_server"], n)
    assert st["accelerated_client"] == n and st["accelerated_server"] == n, (n, st)
    no_timeouts(st)
