"""`smclo stat` and `smclo stats`: what a user sees about live and past
connections."""
import subprocess

from conftest import PY, SMCLO, free_port, wait_port

HOLD = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(b"x" * 100000)
got = 0
while got < 100000:
    got += len(c.recv(65536))
print("done", c.getsockname()[1], flush=True)
sys.stdin.readline()
"""

ECHO = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
while True:
    d = c.recv(65536)
    if not d:
        break
    c.sendall(d)
"""


def test_stat_lists_live_accelerated_connection(reg, procs):
    port = free_port()
    srv = procs.start([PY, "-c", ECHO, str(port)], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    cli = procs.start([PY, "-c", HOLD, str(port)], dict(reg.env, SMCLO_WMEM="64k"), text=True,
                      stdin=subprocess.PIPE)
    word, cport = cli.stdout.readline().split()
    assert word == "done"
    conns = reg.stat()
    client = [c for c in conns if c["role"] == "client"]
    server = [c for c in conns if c["role"] == "server"]
    assert len(client) == 1 and len(server) == 1, conns
    c, s = client[0], server[0]
    assert c["mode"] == s["mode"] == "shm" and c["reason"] == ""
    assert c["local"] == "127.0.0.1:%s" % cport and c["peer"] == "127.0.0.1:%d" % port
    assert s["local"] == c["peer"] and s["peer"] == c["local"]
    assert c["tx_bytes"] == 100000 and c["rx_bytes"] == 100000
    assert s["rx_bytes"] == 100000 and s["tx_bytes"] == 100000
    assert c["tx_ring"] == 64 << 10 and s["rx_ring"] == 64 << 10    # -t / SMCLO_WMEM
    assert c["pid"] == cli.pid or c["pid"] > 0
    human = subprocess.run([SMCLO, "stat"], env=reg.env, capture_output=True, text=True).stdout
    assert "shm" in human and "127.0.0.1:%d" % port in human
    cli.stdin.write("bye\n")
    cli.stdin.flush()
    cli.wait(timeout=10)


def test_stats_totals_survive_exit_and_reset(reg, procs):
    port = free_port()
    srv = procs.start([PY, "-c", ECHO, str(port)], reg.env, text=True)
    assert srv.stdout.readline().strip() == "ready"
    cli = procs.start([PY, "-c", HOLD, str(port)], reg.env, text=True, stdin=subprocess.PIPE)
    assert cli.stdout.readline().startswith("done")
    cli.kill()                               # exits without closing anything
    cli.wait()
    srv.wait(timeout=10)
    st = reg.stats()
    assert st["accelerated"] == 2
    # both processes are gone: their tables were folded into the totals
    assert st["tx_bytes"] == 200000 and st["rx_bytes"] == 200000, st
    r = subprocess.run([SMCLO, "stats", "--reset"], env=reg.env, capture_output=True, text=True)
    assert r.returncode == 0 and "reset" in r.stdout
    st = reg.stats()
    assert st["accelerated"] == 0 and st["tx_bytes"] == 0 and st["fallback"] == 0
    bad = subprocess.run([SMCLO, "stats", "--bogus"], env=reg.env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--bogus" in bad.stderr
