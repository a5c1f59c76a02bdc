"""Monitoring: `smclo stats --prometheus` read by a real Prometheus parser,
the filters of `smclo stat` (--pid, --port, --listening, --tcp, --shm),
what it shows of a TCP peer without smclo, and `smclo stat --watch`."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import PY, SMCLO, free_port, read_pty

# An echo server taking any number of connections, one thread each.
SERVER = r"""
import os, socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
print("ready", os.getpid(), flush=True)
def echo(c):
    while True:
        d = c.recv(65536)
        if not d:
            return c.close()
        c.sendall(d)
while True:
    threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()
"""

# One connection, one round trip of N bytes (so both ends are decided), then
# held until a line comes on stdin.
CLIENT = r"""
import os, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
n = int(sys.argv[2]); c.sendall(b"x" * n); got = 0
while got < n:
    got += len(c.recv(65536))
print("done", os.getpid(), c.getsockname()[1], flush=True)
sys.stdin.readline()
"""


def prometheus_parser():
    """python3-prometheus-client's text parser (make deps installs it).  A
    python3 that is not Debian's (a pyenv build running pytest) finds the
    package where dpkg put it."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
        return text_string_to_metric_families
    except ImportError:
        pass
    files = subprocess.run(["dpkg", "-L", "python3-prometheus-client"], capture_output=True,
                           text=True).stdout.split()
    inits = [f for f in files if f.endswith("/prometheus_client/__init__.py")]
    if not inits:
        pytest.fail("python3-prometheus-client is not installed: run `make deps`")
    where = os.path.dirname(os.path.dirname(inits[0]))
    sys.path.append(where)
    try:
        from prometheus_client.parser import text_string_to_metric_families
    finally:
        sys.path.remove(where)
    return text_string_to_metric_families


class Peers:
    """An smclo server, and clients held open: with smclo or without."""

    def __init__(self, reg, procs):
        self.reg, self.procs, self.clients = reg, procs, []
        self.port = free_port()
        self.server = procs.start([PY, "-c", SERVER, str(self.port)], reg.env, text=True)
        word, pid = self.server.stdout.readline().split()
        assert word == "ready"
        self.server_pid = int(pid)

    def client(self, smclo=True, nbytes=1000, port=None):
        """A held client: (pid, its local port)."""
        p = self.procs.start([PY, "-c", CLIENT, str(port or self.port), str(nbytes)],
                             self.reg.env, smclo=smclo, text=True, stdin=subprocess.PIPE)
        word, pid, lport = p.stdout.readline().split()
        assert word == "done"
        self.clients.append(p)
        return int(pid), int(lport)

    def release(self):
        for p in self.clients:
            p.stdin.write("bye\n")
            p.stdin.flush()
            p.wait(timeout=10)
        self.clients = []


def smclo(reg, *args, ok=True):
    r = subprocess.run([SMCLO] + list(args), env=reg.env, capture_output=True, text=True,
                       timeout=30)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def stat(reg, *args):
    return json.loads(smclo(reg, "stat", "--json", *args).stdout)


def test_prometheus_totals_match_json(reg, procs):
    parse = prometheus_parser()
    peers = Peers(reg, procs)
    # connections that closed (accelerated: bytes counted; plain: peer-no-smclo)
    peers.client(nbytes=5000)
    peers.client(smclo=False)
    peers.release()
    # and connections still open, for the gauges
    peers.client()
    peers.client(smclo=False)
    # closed: both ends of the accelerated one, the server's of the plain one
    js = reg.wait_stats(lambda st: st["closed"] == 3)
    live = stat(reg)
    listeners = stat(reg, "--listening")["listeners"]
    text = smclo(reg, "stats", "--prometheus").stdout
    fams = {f.name: f for f in parse(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in fams.values() for s in f.samples}

    def value(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    # every family documented and typed; counters end in _total
    for f in fams.values():
        assert f.documentation and f.type in ("counter", "gauge"), f
        for s in f.samples:
            assert s.name.startswith("smclo_")
            assert s.name.endswith("_total") == (f.type == "counter"), s
    assert "# TYPE smclo_fallback_total counter" in text
    assert value("smclo_accelerated_total", role="client") == js["accelerated_client"] == 2
    assert value("smclo_accelerated_total", role="server") == js["accelerated_server"] == 2
    # every known reason is a series, at 0 too
    reasons = {s.labels["reason"]: s.value for s in fams["smclo_fallback"].samples}
    assert reasons == {k: float(v) for k, v in js["fallback_by_reason"].items()}
    assert reasons["peer-no-smclo"] == 2 and sum(reasons.values()) == js["fallback"]
    for key, name in [("handshake_errors", "handshake_errors"), ("tx_bytes", "shm_sent_bytes"),
                      ("rx_bytes", "shm_received_bytes"), ("closed", "connections_closed"),
                      ("regions_created", "regions_created"),
                      ("regions_reused", "regions_reused"), ("doorbells_sent", "doorbells_sent"),
                      ("doorbells_skipped", "doorbells_skipped"),
                      ("inbox_handshakes", "inbox_handshakes"),
                      ("peer_regions_mapped", "peer_regions_mapped"),
                      ("peer_regions_kept", "peer_regions_kept"),
                      ("direct_handshakes", "direct_handshakes")]:
        assert value("smclo_%s_total" % name) == js[key], key
    # both ends of the accelerated one, each way; the plain one passed over TCP
    assert value("smclo_shm_sent_bytes_total") == value("smclo_shm_received_bytes_total") == 2 * 5000
    assert value("smclo_reset_timestamp_seconds") == js["since"]
    modes = [c["mode"] for c in live["connections"]]
    for mode in ("shm", "tcp", "pending"):
        assert value("smclo_connections", mode=mode) == modes.count(mode)
    assert modes.count("shm") == 2 and modes.count("tcp") == 1, live
    assert value("smclo_listeners") == len(listeners) == 1
    bad = smclo(reg, "stats", "--prometheus", "--bogus", ok=False)
    assert bad.returncode == 2 and "--bogus" in bad.stderr
    peers.release()


def ends(conns):
    return sorted((c["pid"], c["role"], c["mode"]) for c in conns)


def test_stat_filters(reg, procs):
    peers = Peers(reg, procs)
    other = Peers(reg, procs)             # a second server, nobody connected
    spid, sport = peers.server_pid, peers.port
    cpid, cport = peers.client()
    ppid, pport = peers.client(smclo=False)
    srv_shm, srv_tcp = (spid, "server", "shm"), (spid, "server", "tcp")
    cli_shm = (cpid, "client", "shm")

    everything = stat(reg)
    assert "listeners" not in everything         # ss shows no listener unless asked
    assert ends(everything["connections"]) == sorted([srv_shm, srv_tcp, cli_shm])
    assert ends(stat(reg, "--pid", str(spid))["connections"]) == sorted([srv_shm, srv_tcp])
    assert ends(stat(reg, "--pid", str(cpid))["connections"]) == [cli_shm]
    assert stat(reg, "--pid", str(other.server_pid))["connections"] == []
    # --port matches either end
    assert ends(stat(reg, "--port", str(sport))["connections"]) == \
        sorted([srv_shm, srv_tcp, cli_shm])
    assert ends(stat(reg, "--port", str(cport))["connections"]) == sorted([srv_shm, cli_shm])
    assert ends(stat(reg, "--port", str(pport))["connections"]) == [srv_tcp]
    assert ends(stat(reg, "--shm")["connections"]) == sorted([srv_shm, cli_shm])
    assert ends(stat(reg, "--tcp", "--shm")["connections"]) == \
        sorted([srv_shm, srv_tcp, cli_shm])
    assert ends(stat(reg, "--tcp", "--pid", str(cpid))["connections"]) == []

    # a connection left on TCP: why, and who is at the other end
    tcp = stat(reg, "--tcp")["connections"]
    assert ends(tcp) == [srv_tcp]
    assert tcp[0]["reason"] == "peer-no-smclo"
    assert tcp[0]["peer"] == "127.0.0.1:%d" % pport
    assert tcp[0]["peer_pid"] == ppid
    assert tcp[0]["peer_exe"] == os.readlink("/proc/%d/exe" % ppid)
    assert tcp[0]["peer_user"] == "root"
    # an accelerated one: the process and user at the other end of its socket pair
    shm = {c["role"]: c for c in stat(reg, "--shm")["connections"]}
    assert shm["server"]["peer_pid"] == cpid and shm["client"]["peer_pid"] == spid, shm
    assert shm["server"]["peer_user"] == shm["client"]["peer_user"] == "root", shm

    lst = stat(reg, "--listening")
    assert lst["connections"] == []
    assert sorted((l["pid"], l["local"]) for l in lst["listeners"]) == sorted(
        [(spid, "127.0.0.1:%d" % sport), (other.server_pid, "127.0.0.1:%d" % other.port)])
    lst = stat(reg, "--listening", "--port", str(other.port))
    assert [l["pid"] for l in lst["listeners"]] == [other.server_pid]
    both = stat(reg, "--listening", "--shm", "--pid", str(spid))
    assert [l["pid"] for l in both["listeners"]] == [spid]
    assert ends(both["connections"]) == [srv_shm]

    # the table for people: the same filters, the peer named
    human = smclo(reg, "stat", "--tcp").stdout.splitlines()
    assert len(human) == 2 and "peer has no smclo; peer root pid %d " % ppid in human[1], human
    human = smclo(reg, "stat", "--listening", "--port", str(sport)).stdout.splitlines()
    assert len(human) == 2 and " listen " in human[1] and "inbox" in human[1], human
    peers.release()


def test_stat_names_the_plain_server_of_a_client(reg, procs):
    """The client's end of a connection to a server without smclo: its local
    address (not asked of the kernel when the connection was made) and the
    server's process come from sock_diag and /proc."""
    port = free_port()
    srv = procs.start([PY, "-c", SERVER, str(port)], reg.env, smclo=False, text=True)
    spid = int(srv.stdout.readline().split()[1])
    peers = Peers(reg, procs)
    cpid, cport = peers.client(port=port)
    conns = stat(reg, "--tcp")["connections"]
    assert len(conns) == 1, conns
    c = conns[0]
    assert (c["pid"], c["role"], c["reason"]) == (cpid, "client", "peer-no-smclo")
    assert c["local"] == "127.0.0.1:%d" % cport and c["peer"] == "127.0.0.1:%d" % port
    assert c["peer_pid"] == spid and c["peer_exe"] == os.readlink("/proc/%d/exe" % spid)
    peers.release()


@pytest.mark.parametrize("args, word", [
    (["--pid", "abc"], "--pid"), (["--pid", "0"], "--pid"), (["--pid"], "--pid"),
    (["--port", "70000"], "--port"), (["--port", "x"], "--port"),
    (["--watch", "fast"], "--watch"), (["--watch", "0"], "--watch"),
    (["--count", "3"], "--count"), (["--watch", "1", "--count", "-1"], "--count"),
    (["--bogus"], "--bogus"),
])
def test_stat_bad_arguments(reg, args, word):
    r = smclo(reg, "stat", *args, ok=False)
    assert r.returncode == 2 and word in r.stderr and r.stdout == "", (args, r.stderr)


def test_watch_bounded_by_count(reg, procs):
    peers = Peers(reg, procs)
    t = time.time()
    r = smclo(reg, "stat", "--watch", "0.2", "--count", "3", "--listening")
    assert time.time() - t >= 0.4
    heads = [l for l in r.stdout.splitlines() if l.startswith("--- smclo stat ")]
    assert len(heads) == 3 and "\033" not in r.stdout
    assert r.stdout.count(" listen ") == 3
    # JSON: one document per refresh, back to back
    out = smclo(reg, "stat", "--json", "--watch", "0.1", "--count", "2", "--listening").stdout
    docs, dec, i = [], json.JSONDecoder(), 0
    while out[i:].strip():
        doc, end = dec.raw_decode(out, i)
        docs.append(doc)
        i = end + (len(out[end:]) - len(out[end:].lstrip()))
    assert [len(d["listeners"]) for d in docs] == [1, 1]


def test_watch_on_a_terminal_refreshes_in_place(reg):
    out, rc = read_pty([SMCLO, "stat", "--watch", "0.1", "--count", "2"], reg.env, timeout=10)
    assert rc == 0 and out.count("\033[H\033[2J") == 2 and "PID" in out, out


def test_watch_stops_on_sigint(reg):
    """Unbounded, it runs until interrupted, and that is a normal end (0)."""
    p = subprocess.Popen([SMCLO, "stat", "--watch", "0.1"], env=reg.env,
                         stdout=subprocess.PIPE, text=True)
    try:
        seen = 0
        while seen < 3:
            line = p.stdout.readline()
            assert line, "smclo stat --watch ended by itself"
            seen += line.startswith("--- smclo stat ")
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
