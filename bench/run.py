#!/usr/bin/env python3
"""`make bench`: the speed issue's benchmark table, measured.

Every row runs TCP loopback, AF_UNIX where the program supports it, and
smclo (both ends under `smclo run`), interleaved run by run (the order
turning every round), and reports the
median of the runs with the CPU time (user+sys of server and client) beside
it.  Writes BENCHMARKS.md and bench/benchmarks.png.

    python3 bench/run.py [--runs N] [--quick] [--seconds S] [--only TEXT] [--only-load]
                         [--against BUILD]

--against runs another build of smclo (e.g. one of an older commit) as a
fourth column, interleaved with the others, and prints each row's smclo
against it: "no speed lost" is judged in one run on one machine.

Every step (one program pair, one mode) prints what it runs and an estimate
of the time left first.
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SMCLO_BUILD", ROOT / "build"))
SMCLO = str(BUILD / "smclo")
# the launcher of each smclo column: this build's, and --against's
LAUNCHERS = {"smclo": SMCLO}
# the registry lives where smclo's default does: in memory, not on disk
WORK = Path(tempfile.mkdtemp(prefix="smclo-bench-",
                             dir="/dev/shm" if os.path.isdir("/dev/shm") else None))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listen(port=None, path=None, proc=None, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path is not None and os.path.exists(path):
            return
        if port is not None:
            hexport = ":%04X" % port
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                for line in open(table).read().splitlines()[1:]:
                    f = line.split()
                    if f[1].endswith(hexport) and f[3] == "0A":
                        return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited: %s" % proc.args)
        time.sleep(0.02)
    raise TimeoutError("server did not start")


STEP_OVERHEAD = 1.5     # seconds a step spends starting and stopping its programs


def eta(seconds):
    seconds = int(seconds + 0.5)
    return "%d s" % seconds if seconds < 60 else "%d min %02d s" % divmod(seconds, 60)


class Progress:
    """What runs now and an estimate of the time left, one line per step.

    The estimate starts from the planned seconds of every step and scales
    them by how long the steps done so far really took.  On a terminal a
    step's line is rewritten in place and a result line replaces it; in a
    log or a pipe every step gets a line of its own, without escapes."""

    def __init__(self, planned):
        self.planned, self.i, self.t0 = list(planned), 0, time.time()
        self.tty = sys.stdout.isatty()

    def step(self, what):
        done, left = sum(self.planned[:self.i]), sum(self.planned[self.i:])
        if done:
            left *= (time.time() - self.t0) / done
        self.i += 1
        line = "[%d/%d] %s; about %s left" % (self.i, len(self.planned), what, eta(left))
        if self.tty:
            sys.stdout.write("\r\033[K" + line)
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def say(self, text):
        """A result line (on a terminal, in place of the step's)."""
        print(("\r\033[K" if self.tty else "") + text, flush=True)


def tcp_only(fn):
    """A row whose programs have no AF_UNIX mode: it runs for tcp and smclo."""
    fn.unix = False
    return fn


# (server CPU, client CPU) while a pinned row runs: each end `taskset -c` to
# its CPU, as the seed's own benchmark and Kubernetes' static CPU manager
# place latency-critical processes (spin.h: waits spin only for a peer on
# another CPU)
PIN = [None]


def pinned(fn, server_cpu, client_cpu):
    """@fn's row with its server and client each confined to one CPU."""
    def row(mode, secs):
        PIN[0] = (server_cpu, client_cpu)
        try:
            return fn(mode, secs)
        finally:
            PIN[0] = None
    row.unix = getattr(fn, "unix", True)
    return row


def row_wanted(name, only):
    """--only: rows whose name contains TEXT, or any of TEXT|TEXT...; a TEXT
    of the form =NAME wants that row alone."""
    return not only or any(name == alt[1:] if alt.startswith("=") else alt in name
                           for alt in only.split("|"))


def row_steps(runs, only, modes):
    """(run, row, mode) in the order they run: every round turns the order of
    modes(run) and rows filtered by --only; AF_UNIX only where a row has it."""
    return [(r, row, mode) for r in range(runs) for row in ROWS
            if row_wanted(row[0], only)
            for mode in modes(r) if mode != "unix" or getattr(row[6], "unix", True)]


class Run:
    """Start a server, run a client, stop the server; CPU of both.  With
    @defaults, smclo as it comes (the host's shared registry, no setting):
    its counters are every user's, read before and after as the others'."""

    def __init__(self, mode, defaults=False, settings=None, env=None, spoilers_allowed=0):
        self.mode = mode
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SMCLO_")}
        self.env.pop("LD_PRELOAD", None)
        self.env.update(env or {})
        # ends on TCP that do not spoil the figure: a client's connections
        # it closes unused (ab's last ones), an offer a server read late
        self.spoilers_allowed = spoilers_allowed
        self.launcher = LAUNCHERS.get(mode)
        if self.launcher:
            self.env.update(settings or {})
        self.registry = Path("/dev/shm/smclo") if defaults else WORK / "registry"
        if self.launcher and not defaults:
            self.env["SMCLO_DIR"] = str(self.registry)

    def cmd(self, args, side):
        pin = ["taskset", "-c", str(PIN[0][side == "client"])] if PIN[0] else []
        return ([self.launcher, "run", "--"] if self.launcher else []) + pin + list(args)

    def accelerated(self):
        """(client ends accelerated, ends on TCP for a reason that spoils the
        figure, connections kept on TCP as short-lived on busy CPUs)."""
        if not self.launcher or not self.registry.exists():
            return (0, 0, 0)
        st = json.loads(subprocess.run([self.launcher, "stats", "--json"], env=self.env, check=True,
                                       capture_output=True, text=True).stdout)
        return (st["accelerated_client"], st["fallback_not_short_lived"],
                st["fallback_by_reason"].get("short-lived", 0))

    def __call__(self, server, client, ready_port=None, ready_path=None):
        before = self.accelerated()
        srv = subprocess.Popen(self.cmd(server, "server"), env=self.env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_listen(ready_port, ready_path, srv)
            t = os.times()
            out = subprocess.run(self.cmd(client, "client"), env=self.env, capture_output=True, text=True,
                                 timeout=600)
            t2 = os.times()
            client_cpu = (t2.children_user - t.children_user) + (t2.children_system - t.children_system)
        finally:
            os.killpg(srv.pid, signal.SIGTERM)
            _, status, ru = os.wait4(srv.pid, 0)
        if out.returncode != 0:
            raise RuntimeError("client failed: %s\n%s" % (out.args, out.stdout + out.stderr))
        after = self.accelerated()
        # a smclo figure counts only if its connections really went through shared
        # memory - or stayed on TCP because smclo judged them short-lived on busy
        # CPUs (payoff.h), which the report states
        if self.launcher and (after[0] == before[0] or
                                     after[1] - before[1] > self.spoilers_allowed):
            raise RuntimeError("smclo run not accelerated (accelerated %s -> %s, fallbacks %s -> %s)"
                               % (before[0], after[0], before[1], after[1]))
        SHORT_LIVED[CURRENT_ROW[0]] += after[2] - before[2]
        return out.stdout, client_cpu + ru.ru_utime + ru.ru_stime


def sockperf(kind):
    @tcp_only
    def row(mode, secs):
        port = free_port()
        server = ["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", str(port)]
        if kind == "pp":
            # sockperf 3.7 sizes its table of sequence numbers for about 660k round
            # trips a second (6.6M for 10 s) and aborts beyond; unpaced smclo does
            # 1.5M.  500k/s paces neither TCP (~100k/s) nor smclo below its latency.
            client = ["sockperf", "pp", "--tcp", "-i", "127.0.0.1", "-p", str(port), "-t",
                      str(secs), "-m", "14", "--mps", "500000"]
        else:
            client = ["sockperf", "tp", "--tcp", "-i", "127.0.0.1", "-p", str(port), "-t",
                      str(secs), "-m", "64000"]
        out, cpu = Run(mode)(server, client, ready_port=port)
        pat = r"Summary: Latency is ([\d.]+) usec" if kind == "pp" else r"Summary: BandWidth is ([\d.]+) MBps"
        return float(re.search(pat, out).group(1)), cpu
    return row


@tcp_only
def iperf3(mode, secs):
    port = free_port()
    out, cpu = Run(mode)(["iperf3", "-s", "-1", "-p", str(port)],
                         ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(secs), "-J"],
                         ready_port=port)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9, cpu


def worker(test, size, settings=None):
    """The bench worker's @test; @settings: SMCLO_* for the smclo column."""
    def row(mode, secs):
        port = free_port()
        # the workers meet at a port on 127.0.0.1, or at an AF_UNIX socket path
        where = str(WORK / ("worker-%d.sock" % port)) if mode == "unix" else str(port)
        run = Run(mode, settings=settings)
        out, cpu = run([SMCLO, "__bench-worker", "server", where, test, str(size), "0"],
                       [SMCLO, "__bench-worker", "client", where, test, str(size), str(secs)],
                       ready_port=None if mode == "unix" else port,
                       ready_path=where if mode == "unix" else None)
        v = float(re.search(r"value ([\d.]+)", out).group(1))
        return (1e6 / v if test == "pingpong" else v), cpu
    return row


def redis(op):
    def row(mode, secs):
        port = free_port()
        sock = str(WORK / ("redis-%d.sock" % port))
        server = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                  "--bind", "127.0.0.1"]
        target = ["-h", "127.0.0.1", "-p", str(port)]
        if mode == "unix":
            server += ["--unixsocket", sock]
            target = ["-s", sock]
        n = "200000" if secs >= 5 else "50000"
        out, cpu = Run(mode)(server, ["redis-benchmark"] + target + ["-t", op, "-n", n, "-c",
                                                                     "50", "-d", "1024", "--csv"],
                             ready_port=port, ready_path=sock if mode == "unix" else None)
        rps = float(re.search(r'"%s","([\d.]+)"' % op.upper(), out).group(1))
        return rps, cpu
    return row


NGINX_CONF = """worker_processes 2; daemon off; master_process on; user root;
pid {d}/nginx-{p}.pid; error_log {d}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{ access_log off; sendfile on;
  client_body_temp_path {d}/t; proxy_temp_path {d}/t; fastcgi_temp_path {d}/t;
  uwsgi_temp_path {d}/t; scgi_temp_path {d}/t;
  server {{ listen 127.0.0.1:{p}; root {d}/www; }} }}
"""


@tcp_only                   # wrk speaks TCP only
def nginx(mode, secs):
    (WORK / "www").mkdir(exist_ok=True)
    (WORK / "t").mkdir(exist_ok=True)
    (WORK / "www" / "index.html").write_text("<html><body>" + "smclo " * 100 + "</body></html>\n")
    port = free_port()
    conf = WORK / ("nginx-%d.conf" % port)
    conf.write_text(NGINX_CONF.format(d=WORK, p=port))
    out, cpu = Run(mode)(["nginx", "-c", str(conf), "-p", str(WORK)],
                         ["wrk", "-t", "2", "-c", "100", "-d", "%ds" % max(1, int(secs)),
                          "http://127.0.0.1:%d/index.html" % port], ready_port=port)
    if "Socket errors" in out or "Non-2xx" in out:
        raise RuntimeError("wrk reported errors:\n" + out)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), cpu


# nginx as Debian runs it: started by root without a `user` directive, so its
# workers run as another user (nobody; Debian's own configuration says
# www-data), and smclo with its defaults: across users, the host's registry
NGINX_DEBIAN_CONF = NGINX_CONF.replace("user root;", "")


@tcp_only
def nginx_debian(mode, secs):
    (WORK / "www").mkdir(exist_ok=True)
    (WORK / "t").mkdir(exist_ok=True)
    for d in (WORK, WORK / "www", WORK / "t"):
        os.chmod(d, 0o755)              # the workers read, and write temp files
    os.chmod(WORK / "t", 0o777)
    (WORK / "www" / "index.html").write_text("<html><body>" + "smclo " * 100 + "</body></html>\n")
    os.chmod(WORK / "www" / "index.html", 0o644)
    port = free_port()
    conf = WORK / ("nginx-debian-%d.conf" % port)
    conf.write_text(NGINX_DEBIAN_CONF.format(d=WORK, p=port))
    wrk = ["wrk", "-t", "2", "-c", "100", "-d", "%ds" % max(1, int(secs)),
           "http://127.0.0.1:%d/index.html" % port]
    out, cpu = Run(mode, defaults=True)(["nginx", "-c", str(conf), "-p", str(WORK)], wrk,
                                        ready_port=port)
    if "Socket errors" in out or "Non-2xx" in out:
        raise RuntimeError("wrk reported errors:\n" + out)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), cpu


# apache2 as Debian configures it (mpm_event, AcceptFilter http data: the
# listener defers accept; only the port and paths changed), started by root,
# children as www-data, smclo's defaults; ab -c 20 for a 50 KB file.
APACHE_SITE = Path(__file__).resolve().parent.parent / "tools" / "apache2-site.sh"


def apache2(keepalive):
    @tcp_only               # ab speaks TCP only
    def row(mode, secs):
        port = free_port()
        conf = WORK / ("apache-%d" % port)
        os.chmod(WORK, 0o755)           # www-data reads the file
        shutil.rmtree(conf, ignore_errors=True)
        conf.mkdir(mode=0o755)
        subprocess.run(["sh", str(APACHE_SITE), str(conf), str(port)], check=True)
        (conf / "www" / "blob.bin").write_bytes(os.urandom(50000))
        os.chmod(conf / "www" / "blob.bin", 0o644)
        n = str(max(2000, int(secs * (4000 if keepalive else 1500))))
        ab = ["ab", "-q", "-n", n, "-c", "20"] + (["-k"] if keepalive else []) + \
             ["http://127.0.0.1:%d/blob.bin" % port]
        server = ["sh", "-c", '. "$APACHE_CONFDIR/envvars" && exec apache2 -d "$APACHE_CONFDIR" '
                  '-DFOREGROUND']
        out, cpu = Run(mode, defaults=True, env={"APACHE_CONFDIR": str(conf)},
                       spoilers_allowed=int(n) // 20)(server, ab, ready_port=port)
        if not re.search(r"Failed requests:\s+0\n", out) or "Non-2xx" in out:
            raise RuntimeError("ab reported errors:\n" + out)
        return float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1)), cpu
    return row


# name, unit, higher is better, bar, goal, kernel SMC-lo ratio, function, how to reproduce
ROWS = [
    ("sockperf ping-pong 14 B latency", "us", False, "<= 0.25x", "<= 0.1x", "0.57x",
     sockperf("pp"), "sockperf sr --tcp -i 127.0.0.1 -p P ; sockperf pp --tcp -i 127.0.0.1 -p P -t T -m 14 --mps 500000"),
    ("sockperf throughput 64000 B", "MB/s", True, ">= 2.0x", ">= 2.5x", "1.59x",
     sockperf("tp"), "sockperf sr --tcp ... ; sockperf tp --tcp -i 127.0.0.1 -p P -t T -m 64000"),
    ("iperf3 bitrate", "Gbit/s", True, ">= 2.0x", ">= 2.5x", "1.8x",
     iperf3, "iperf3 -s -1 -p P ; iperf3 -c 127.0.0.1 -p P -t T -J"),
    ("100 B request/response rate, 1 conn", "msg/s", True, ">= 3x", ">= 5x", "1.78x",
     worker("pingpong", 100), "smclo __bench-worker server P pingpong 100 0 ; ... client P pingpong 100 T (AF_UNIX: a socket path for P)"),
    ("redis-benchmark SET -c 50 -d 1024", "req/s", True, ">= 1.6x", ">= 2x", "1.41x",
     redis("set"), "redis-server --port P ; redis-benchmark -t set -n 200000 -c 50 -d 1024"),
    ("redis-benchmark GET -c 50 -d 1024", "req/s", True, ">= 1.6x", ">= 2x", "1.37x",
     redis("get"), "redis-server --port P ; redis-benchmark -t get -n 200000 -c 50 -d 1024"),
    ("nginx (2 workers) + wrk -t2 -c100", "req/s", True, ">= 1.6x", ">= 2x", "1.42x",
     nginx, "nginx (worker_processes 2) ; wrk -t 2 -c 100 -d T http://127.0.0.1:P/index.html"),
    ("nginx as Debian runs it (workers nobody) + wrk -t2 -c100", "req/s", True, ">= 1.6x",
     ">= 2x", "1.42x", nginx_debian,
     "nginx started by root, no `user` directive, smclo's defaults ; wrk -t 2 -c 100 -d T ..."),
    ("apache2 default (AcceptFilter, www-data) + ab -c 20 -k, 50 KB", "req/s", True,
     ">= 1.2x", ">= 1.5x", "n/a", apache2(True),
     "apache2 as Debian configures it, started by root, smclo's defaults ; ab -q -n N -c 20 -k http://127.0.0.1:P/blob.bin"),
    ("apache2 default + ab -c 20, a connection per request", "req/s", True, ">= 1x",
     ">= 1.5x", "n/a", apache2(False),
     "as above ; ab -q -n N -c 20 http://127.0.0.1:P/blob.bin"),
    ("sockperf ping-pong 14 B latency, pinned apart (taskset 0 / 1)", "us", False, "<= 0.25x",
     "<= 0.1x", "0.57x", pinned(sockperf("pp"), 0, 1),
     "taskset -c 0 sockperf sr ... ; taskset -c 1 sockperf pp ... (the seed's protocol)"),
    ("sockperf ping-pong 14 B latency, pinned together (taskset 0 / 0)", "us", False, "<= 1x",
     "<= 1x", "n/a", pinned(sockperf("pp"), 0, 0),
     "taskset -c 0 sockperf sr ... ; taskset -c 0 sockperf pp ..."),
    ("sockperf throughput 64000 B, pinned apart (taskset 0 / 1)", "MB/s", True, ">= 2.0x",
     ">= 2.5x", "1.59x", pinned(sockperf("tp"), 0, 1),
     "taskset -c 0 sockperf sr ... ; taskset -c 1 sockperf tp ... -m 64000"),
    ("sockperf throughput 64000 B, pinned together (taskset 0 / 0)", "MB/s", True, ">= 1x",
     ">= 1x", "n/a", pinned(sockperf("tp"), 0, 0),
     "taskset -c 0 sockperf sr ... ; taskset -c 0 sockperf tp ... -m 64000"),
    ("100 B request/response rate, pinned apart (taskset 0 / 1)", "msg/s", True,
     ">= 3x", ">= 5x", "1.78x", pinned(worker("pingpong", 100), 0, 1),
     "taskset -c 0 smclo __bench-worker server P pingpong 100 0 ; taskset -c 1 ... client P pingpong 100 T"),
    ("100 B request/response rate, pinned together (taskset 0 / 0)", "msg/s", True,
     ">= 1x", ">= 1x", "n/a", pinned(worker("pingpong", 100), 0, 0),
     "taskset -c 0 smclo __bench-worker server P pingpong 100 0 ; taskset -c 0 ... client P pingpong 100 T"),
    ("connection setup (connect, 100 B RTT, close)", "conn/s", True, ">= 0.85x", ">= 1x", "n/a",
     worker("connect", 100), "smclo __bench-worker server P connect 100 0 ; ... client P connect 100 T (AF_UNIX: a socket path for P)"),
    ("connection setup, without TCP (SMCLO_DIRECT=1, an opt-in)", "conn/s", True, ">= 0.85x",
     ">= 1x", "n/a", worker("connect", 100, {"SMCLO_DIRECT": "1"}),
     "SMCLO_DIRECT=1 at both ends; otherwise as the row above"),
]

MODES = ["tcp", "unix", "smclo"]
LOADED_SECS = 3
CURRENT_ROW = [""]
SHORT_LIVED = collections.Counter()     # per row: connections smclo kept on TCP (payoff.h)


BUSY_LOOPS = 4
LOADED = " (beside busy loops)"         # the SHORT_LIVED key of a row's loaded runs


class BusyLoops:
    """BUSY_LOOPS processes spinning in Python for as long as the block runs."""

    def __enter__(self):
        self.hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                     for _ in range(BUSY_LOOPS)]
        time.sleep(1)

    def __exit__(self, *exc):
        for h in self.hogs:
            h.kill()
            h.wait()


def loaded_steps(runs, only=None):
    return row_steps(runs, only, lambda r: ("tcp", "smclo") if r % 2 == 0 else ("smclo", "tcp"))


def oversubscribed_rows(runs, secs, progress, only=None):
    """Every row, TCP against smclo, beside the busy loops: no benchmark may be
    slower than TCP (spinning must back off).  Returns {row: {mode: [(value, cpu)]}}."""
    results = {}
    with BusyLoops():
        for r, (name, unit, hib, bar, goal, kern, fn, how), mode in loaded_steps(runs, only):
            CURRENT_ROW[0] = name + LOADED
            res = results.setdefault(name, {"tcp": [], "smclo": []})
            progress.step("beside busy loops, run %d of %d: %s, %s (%g s)"
                          % (r + 1, runs, name, mode, secs))
            res[mode].append(fn(mode, secs))
            progress.say("loaded run %d %-45s %-5s %12.2f %s  cpu %.2f s"
                         % (r + 1, name, mode, res[mode][-1][0], unit, res[mode][-1][1]))
    return results


def bench_seconds(runs):
    """What `smclo bench --runs N --seconds 1` takes: 3 benchmarks, 2 sides."""
    return runs * 3 * 2 * (1 + 0.2)


IDLE_SECONDS = 20       # bench/idle_memory.py 1000, about


def oversubscribed_bench(runs, progress):
    """`smclo bench` (ping-pong, stream, connection setup) beside the busy loops."""
    progress.step("smclo bench --runs %d --seconds 1 beside busy loops" % runs)
    with BusyLoops():
        out = subprocess.run([SMCLO, "bench", "--runs", str(runs), "--seconds", "1"],
                             capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("smclo bench under load failed:\n" + out.stdout + out.stderr)
    return [l for l in out.stdout.splitlines()
            if l.startswith(("benchmark", "ping-pong", "stream", "connection"))]


def loaded_table(loaded):
    """The loaded runs as Markdown rows, and whether smclo was slower anywhere."""
    lines = ["| benchmark | TCP | smclo | smclo/TCP | not slower than TCP | CPU s TCP / smclo | kept on TCP as short-lived |",
             "|---|---|---|---|---|---|---|"]
    slower = []
    for name, unit, hib, bar, goal, kern, fn, how in ROWS:
        if name not in loaded:
            continue
        t, s = (med(loaded[name][m], 0) for m in ("tcp", "smclo"))
        ct, cs = (med(loaded[name][m], 1) for m in ("tcp", "smclo"))
        ok = s <= t if not hib else s >= t
        if not ok:
            slower.append(name)
        lines.append("| %s (%s) | %.2f | %.2f | %.2fx | %s | %.2f / %.2f | %d |" % (
            name, unit, t, s, s / t, "yes" if ok else "**no**", ct, cs,
            SHORT_LIVED[name + LOADED]))
    return lines, slower


def idle_memory(progress):
    """bench/idle_memory.py: 1000 idle connections, TCP against smclo."""
    progress.step("memory of 1000 idle connections (bench/idle_memory.py)")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "idle_memory.py"), "1000"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError("idle memory measurement failed:\n" + out.stdout + out.stderr)
    return out.stdout.splitlines()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="short runs, for trying the harness")
    ap.add_argument("--only-load", action="store_true",
                    help="just the rows beside busy loops (with --only: just those rows)")
    ap.add_argument("--only", help="just the rows whose name contains this, or any of A|B, "
                    "=NAME for one row exactly (no report written)")
    ap.add_argument("--against", metavar="BUILD",
                    help="another build directory of smclo, run as a fourth column (\"against\")")
    ap.add_argument("--seconds", type=float,
                    help="length of every run (default 10, 2 with --quick; rows beside busy "
                         "loops %d)" % LOADED_SECS)
    a = ap.parse_args()
    if a.against:
        launcher = os.path.join(a.against, "smclo")
        if not os.access(launcher, os.X_OK):
            ap.error("--against %s: no smclo launcher there (a build directory is wanted)"
                     % a.against)
        LAUNCHERS["against"] = os.path.abspath(launcher)
        MODES.append("against")
    if a.only_load:
        secs = a.seconds or (2 if a.quick else LOADED_SECS)
        progress = Progress([secs + STEP_OVERHEAD] * len(loaded_steps(a.runs, a.only)))
        lines, slower = loaded_table(oversubscribed_rows(a.runs, secs, progress, a.only))
        print("\n".join(lines + ["slower than TCP: %s" % (", ".join(slower) or "none")]))
        return
    secs = a.seconds or (2 if a.quick else 10)
    loaded_secs = a.seconds or LOADED_SECS
    # the order of modes turns every round, so no mode always runs right after another
    steps = row_steps(a.runs, a.only, lambda r: MODES[r % len(MODES):] + MODES[:r % len(MODES)])
    if a.against and a.only is None:
        ap.error("--against compares rows only: give --only too (\"\" for every row)")
    planned = [secs + STEP_OVERHEAD] * len(steps)
    if a.only is None:
        planned += [loaded_secs + STEP_OVERHEAD] * len(loaded_steps(a.runs))
        planned += [bench_seconds(a.runs), IDLE_SECONDS]
    progress = Progress(planned)
    results = {}
    for name, *_rest in ROWS:
        results[name] = {m: [] for m in MODES}
    for r, (name, unit, hib, bar, goal, kern, fn, how), mode in steps:
        CURRENT_ROW[0] = name
        progress.step("run %d of %d: %s, %s (%g s)" % (r + 1, a.runs, name, mode, secs))
        res = fn(mode, secs)
        results[name][mode].append(res)
        progress.say("run %d %-45s %-5s %12.2f %s  cpu %.2f s" % (r + 1, name, mode, res[0],
                                                                 unit, res[1]))
    if a.only is not None:
        for name, unit, hib, *_rest in ROWS:
            t, s, o = (med(results[name].get(m), 0) for m in ("tcp", "smclo", "against"))
            if t and s:
                print("%-45s smclo/TCP %.2fx (median of %d)" % (name, s / t, a.runs))
            if s and o:
                # above 1: this build is faster than the other
                print("%-45s smclo %.2f against %.2f %s: %.3fx; CPU s %.2f against %.2f" % (
                    name, s, o, unit, (s / o) if hib else (o / s),
                    med(results[name]["smclo"], 1), med(results[name]["against"], 1)))
        return
    loaded = oversubscribed_rows(a.runs, loaded_secs, progress)
    loaded_bench = oversubscribed_bench(a.runs, progress)
    idle = idle_memory(progress)
    progress.say("writing BENCHMARKS.md and bench/benchmarks.png")
    write_report(results, a.runs, secs, loaded_secs, loaded, loaded_bench, idle)


def med(vals, i):
    return statistics.median(v[i] for v in vals) if vals else None


def write_chart(chart):
    """bench/benchmarks.png: per row (name, smclo's speed-up, AF_UNIX's or 0)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart (make bench installs python3-matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(11, 5))
    xs = range(len(chart))
    for offset, col, label in ((-0.2, 2, "AF_UNIX"), (0.2, 1, "smclo")):
        bars = ax.bar([x + offset for x in xs], [c[col] or float("nan") for c in chart], 0.4,
                      label=label)
        ax.bar_label(bars, labels=["%.2fx" % c[col] if c[col] else "" for c in chart],
                     fontsize=7)
    # from 0.5x to 50x: on a log scale 1.8x and 47x are both readable
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([c[0] for c in chart], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("speed-up over TCP loopback (x, log scale)")
    ax.set_title("smclo vs TCP loopback (median of interleaved runs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "bench" / "benchmarks.png", dpi=110)


def write_report(results, runs, secs, loaded_secs, loaded, loaded_bench, idle):
    lines = ["# smclo benchmarks", "",
             "Generated by `make bench` (bench/run.py): %d interleaved runs per row of %g s, "
             "median; CPU is user+sys of server and client per run.  Machine: %s, %d CPUs.  "
             "Ratios are smclo against TCP loopback measured in the same run; for latency a "
             "ratio below 1 is better, elsewhere above 1.  AF_UNIX where the programs have "
             "it: redis (`--unixsocket`, `redis-benchmark -s`) and the two rows of smclo's own "
             "workers; Debian 12's sockperf 3.7 predates sockperf's AF_UNIX support (2022), "
             "and iperf3 and wrk connect over IP only." % (runs, secs, os.uname().release,
                                                              os.cpu_count()), "",
             "| benchmark | TCP | AF_UNIX | smclo | smclo/TCP | bar | goal | kernel SMC-lo | CPU s TCP / UNIX / smclo |",
             "|---|---|---|---|---|---|---|---|---|"]
    chart = []
    for name, unit, hib, bar, goal, kern, fn, how in ROWS:
        t, u, s = (med(results[name][m], 0) for m in MODES)
        ct, cu, cs = (med(results[name][m], 1) for m in MODES)
        ratio = s / t if t and s else None
        fmt = lambda v: "-" if v is None else ("%.2f" % v if v < 100 else "%.0f" % v)
        lines.append("| %s (%s) | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |" % (
            name, unit, fmt(t), fmt(u), fmt(s), "-" if ratio is None else "%.2fx" % ratio,
            bar, goal, kern, fmt(ct), fmt(cu), fmt(cs)))
        chart.append((name, (t / s if not hib else s / t) if t and s else 0,
                      ((t / u if not hib else u / t) if t and u else 0)))
    shorts = ["%s: %d" % (n, k) for n, k in SHORT_LIVED.items() if k and not n.endswith(LOADED)]
    lines += ["", "Connections of the smclo runs kept on TCP as short-lived on busy CPUs "
              "(design.md 2c): %s." % (", ".join(shorts) if shorts else "none")]
    table, slower = loaded_table(loaded)
    lines += ["", "## With %d busy processes on the %d CPUs" % (BUSY_LOOPS, os.cpu_count()), "",
              "No benchmark may be slower than TCP while %d busy loops share the CPUs (the spin "
              "must back off).  Every row again, TCP and smclo only, %d runs of %g s each, the "
              "order turning every round, median; same commands as above.  Slower than TCP: "
              "%s." % (BUSY_LOOPS, runs, loaded_secs, ", ".join(slower) or "none"), ""] + table
    lines += ["", "`smclo bench --runs %d --seconds 1` beside the same busy loops:" % runs, "",
              "```"] + loaded_bench + ["```"]
    lines += ["", "## Memory of 1000 idle connections", "",
              "`python3 bench/idle_memory.py 1000`: a client and a server process open 1000 "
              "connections, exchange 100 bytes on each and hold them; the cost is what the "
              "two processes' own accounting grows by (PSS without shared memory, plus every "
              "shared-memory object they map or hold, counted once at its allocated size; "
              "MemAvailable's drop beside it as a cross-check; goal: 32 MB at the default "
              "ring size):",
              "", "```"] + idle + ["```"]
    lines += ["", "Reproduce a row (P a free port, T seconds; prefix both commands with "
              "`build/smclo run --` for the smclo column):", ""]
    for name, unit, hib, bar, goal, kern, fn, how in ROWS:
        lines.append("- %s: `%s`" % (name, how))
    lines += ["", "![speed-up over TCP loopback](bench/benchmarks.png)", ""]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(lines))
    write_chart(chart)
    print((ROOT / "BENCHMARKS.md").read_text())


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
