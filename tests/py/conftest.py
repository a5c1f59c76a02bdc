"""Shared fixtures for the real-program tests.

Every test gets its own registry directory (SMCLO_DIR), so the counters it
reads from `smclo stats --json` are its own.  Background processes are
started through `Procs`, which stops exactly the processes it started.

Watchdog (the hooks at the end of this file): no test leaves a process
behind, and none ends stuck without saying where.  The pytest process is
made a child subreaper, so everything a test starts stays its descendant even
after double forks and dead parents; every process also inherits
TESTS_WATCHDOG_ID (<pytest pid>.<test number>), found again in
/proc/PID/environ.  After a test's fixtures are torn down, any such process
still alive (after a 2 s grace for ones already dying) FAILS the test, is
named with its state, wait channel, system call and kernel stack, and is
then killed.  A process Procs had to SIGKILL (no exit 10 s after its signal)
fails the test the same way.  When a test ends with a timeout
(subprocess.TimeoutExpired, socket.timeout, TimeoutError), its report gets
the same description of every process of the test at that moment, and of
the whole tree taken when each subprocess wait timed out (before
subprocess.run kills its child).
"""
import functools
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SMCLO_BUILD", ROOT / "build"))
SMCLO = str(BUILD / "smclo")
TESTBIN = BUILD / "tests"
PY = sys.executable


_ports_given = set()


def free_port():
    """A port nothing listens on, and not one this test session handed out
    before: the kernel may offer the same free port to two callers in a row
    (test_kill_pattern starts up to 14 servers side by side)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise RuntimeError("no fresh free port in 1000 tries")


def wait_port(port, host="127.0.0.1", timeout=10.0, proc=None):
    """Wait until something listens on host:port (probing with a plain
    connection would itself be a plain-TCP client, so look at /proc)."""
    deadline = time.time() + timeout
    hexport = ":%04X" % port
    while time.time() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                for line in open(table).read().splitlines()[1:]:
                    f = line.split()
                    if f[1].endswith(hexport) and f[3] == "0A":
                        return
            except FileNotFoundError:
                pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited early: %s" % proc.args)
        time.sleep(0.05)
    raise TimeoutError("nothing listens on port %d" % port)


class Registry:
    """One private registry directory and the environment that selects it."""

    def __init__(self, path):
        self.path = Path(path)
        # Tests expect every connection between smclo processes accelerated;
        # whether the machine is busy must not change that.  The short-lived
        # policy has its own test (test_payoff.py), which turns it back on.
        self.env = dict(os.environ, SMCLO_DIR=str(self.path), SMCLO_SHORT_LIVED="0")
        self.env.pop("SMCLO_DISABLE", None)

    def stats(self):
        out = subprocess.run([SMCLO, "stats", "--json"], env=self.env, check=True,
                             capture_output=True, text=True, timeout=60).stdout
        return json.loads(out)

    def wait_stats(self, ready, timeout=10.0):
        """The totals once ready(totals) holds (counters of connections that
        are still closing arrive a moment later), or the last ones seen."""
        deadline = time.time() + timeout
        st = self.stats()
        while not ready(st) and time.time() < deadline:
            time.sleep(0.05)
            st = self.stats()
        return st

    def stat(self):
        out = subprocess.run([SMCLO, "stat", "--json"], env=self.env, check=True,
                             capture_output=True, text=True, timeout=60).stdout
        return json.loads(out)["connections"]

    def run(self, args, **kw):
        """Run a command under smclo to completion."""
        kw.setdefault("env", self.env)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run([SMCLO, "run", "--"] + list(args), **kw)

    def entries(self, sub):
        d = self.path / sub
        return sorted(p.name for p in d.iterdir()) if d.exists() else []


def default_env():
    """The environment with none of smclo's settings: its defaults.  The
    sanitizer run's SMCLO_PRELOAD_FIRST stays (the runtimes `smclo run` puts
    ahead of an instrumented library: tools/sanitize.sh), as does the
    suite's own SMCLO_BUILD."""
    keep = ("SMCLO_PRELOAD_FIRST", "SMCLO_BUILD")
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("SMCLO_") and k not in keep]:
        del env[k]
    return env


class DefaultRegistry(Registry):
    """The host's shared registry, /dev/shm/smclo, as programs find it with
    smclo's defaults (no SMCLO_DIR, no SMCLO_ALLOW_UIDS).  Its totals are
    every user's together; stats() gives what they grew by since this
    object was made (tests run one at a time).  Made by root (`smclo stats`),
    as tmpfiles.d or any root program under smclo makes it on a host."""

    def __init__(self):
        self.path = Path("/dev/shm/smclo")
        self.env = default_env()
        self.base = self.raw()
        assert self.base["registry"] == str(self.path), self.base

    def raw(self):
        out = subprocess.run([SMCLO, "stats", "--json"], env=self.env, check=True,
                             capture_output=True, text=True, timeout=60).stdout
        return json.loads(out)

    def stats(self):
        now = self.raw()
        for k, v in now.items():
            if isinstance(v, int) and k != "since":
                now[k] = v - self.base[k]
        for key in ("fallback_by_reason", "moved_by_reason"):
            now[key] = {k: v - self.base.get(key, {}).get(k, 0) for k, v in now[key].items()}
        return now


class Procs:
    def __init__(self):
        self.procs = []

    def start(self, args, env, smclo=True, **kw):
        cmd = ([SMCLO, "run", "--"] if smclo else []) + list(args)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = subprocess.Popen(cmd, env=env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM):
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _WATCH.stuck(p, "did not exit within 10 s of %s" % signal.Signals(sig).name)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)

    def stop_all(self):
        for p in reversed(self.procs):
            self.stop(p)


@pytest.fixture
def reg(tmp_path):
    d = tmp_path / "registry"
    return Registry(d)


@pytest.fixture
def default_reg():
    return DefaultRegistry()


@pytest.fixture
def shared_dir():
    """A registry directory every user can reach (pytest's own tmp is 0700)."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="smclo-shared-", dir="/tmp")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.stop_all()


VETH_NET = "10.199.0."      # two_namespaces: a has VETH_NET + "1", b VETH_NET + "2"


def _sh(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_namespaces():
    """Two network namespaces joined by a veth pair, (a, b), addressed
    VETH_NET.1 and .2 /24; removed afterwards, also when setting up failed
    half-way (a veth still in our namespace goes by name; once moved, it
    goes with its namespace).  Needs root, as CI has."""
    import uuid
    assert os.geteuid() == 0, "network namespaces need root (CI is root)"
    tag = uuid.uuid4().hex[:6]
    a, b = "smclo-a-" + tag, "smclo-b-" + tag
    va, vb = "sma" + tag, "smb" + tag
    made = []
    try:
        for ns in (a, b):
            _sh("ip", "netns", "add", ns)
            made.append(ns)
        _sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        _sh("ip", "link", "set", va, "netns", a)
        _sh("ip", "link", "set", vb, "netns", b)
        _sh("ip", "-n", a, "addr", "add", VETH_NET + "1/24", "dev", va)
        _sh("ip", "-n", b, "addr", "add", VETH_NET + "2/24", "dev", vb)
        for ns, dev in ((a, va), (b, vb)):
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", va], capture_output=True, timeout=30)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@contextlib.contextmanager
def tmpfs(size):
    """A private tmpfs of @size ("2m"), mounted for the block: a filesystem
    a test may fill or measure alone (mounting needs root, as CI has)."""
    import tempfile
    d = tempfile.mkdtemp(prefix="smclo-tmpfs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", d],
                       capture_output=True, text=True)
    assert r.returncode == 0, "mounting a tmpfs needs root: " + r.stderr
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=True)
        os.rmdir(d)


def cgroup_top(v1_controller, v2_controller, v1_probe):
    """Where cgroups of a CPU controller are made: (its v1 hierarchy, True)
    if mounted (a file @v1_probe there says so), else the v2 root with
    @v2_controller enabled for its children, False."""
    v1_top = os.path.join("/sys/fs/cgroup", v1_controller)
    if os.path.exists(os.path.join(v1_top, v1_probe)):
        return v1_top, True
    with open("/sys/fs/cgroup/cgroup.subtree_control", "w") as f:
        f.write("+" + v2_controller)
    return "/sys/fs/cgroup", False


def cpu_quota_files(v1):
    """The files and values of a quota of one CPU (v1's cpu controller, or v2's cpu.max)."""
    if v1:
        return {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
    return {"cpu.max": "100000 100000"}


def make_cgroup(path, files):
    """The cgroup @path with @files written in order; the prefix of a command
    that starts in it (a shell joins, then execs the command)."""
    os.mkdir(path)
    for name, value in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(value)
    return ("sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(path, "cgroup.procs"))


def need(binary):
    from shutil import which
    if which(binary) is None:
        pytest.fail("%s is not installed: run `make test`, which installs it" % binary)


def go_build(directory, name, source):
    """Build the Go program @source as @directory/@name with cgo on (the net
    package then links libc dynamically: a program the dynamic loader starts,
    LD_PRELOAD and all, whose own reads and writes still bypass libc).
    GOTOOLCHAIN=local: never download a toolchain; the build cache is the
    user's usual one."""
    need("go")
    src = os.path.join(directory, name + ".go")
    with open(src, "w") as f:
        f.write(source)
    env = dict(os.environ, CGO_ENABLED="1", GOTOOLCHAIN="local", GOFLAGS="")
    subprocess.run(["go", "build", "-o", os.path.join(directory, name), src], cwd=directory,
                   env=env, check=True, timeout=300, capture_output=True)
    return os.path.join(directory, name)


def read_pty(args, env, timeout=120):
    """Everything @args writes to a terminal (stdout and stderr, a pty), and
    its exit status: for output that differs on a terminal."""
    import pty
    import select
    master, slave = pty.openpty()
    p = subprocess.Popen(args, env=env, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            assert ready, "no output for %d s: %s" % (timeout, args)
            try:
                chunk = os.read(master, 4096)
            except OSError:         # EIO: the other side has closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        rc = p.wait(timeout=timeout)
    return out.decode(errors="replace"), rc


# ---- watchdog (see the top of this file) ------------------------------------

WATCH_VAR = "TESTS_WATCHDOG_ID"
PR_SET_CHILD_SUBREAPER = 36
# system calls worth naming in a stuck process's /proc/PID/syscall (x86-64)
_SYSCALLS = {0: "read", 1: "write", 7: "poll", 19: "readv", 20: "writev", 23: "select",
             35: "nanosleep", 40: "sendfile", 42: "connect", 43: "accept", 44: "sendto",
             45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 202: "futex",
             230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6", 271: "ppoll",
             281: "epoll_pwait", 288: "accept4", 441: "epoll_pwait2"}


class WatchdogFailure(pytest.fail.Exception):
    """A test left processes behind or one of them was stuck."""


def _read(path, binary=False):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data if binary else data.decode(errors="replace")


def _proc_table():
    """pid -> (ppid, starttime, state letter) of every process."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        s = _read("/proc/%s/stat" % d)
        if not s:
            continue
        f = s[s.rindex(")") + 2:].split()
        table[int(d)] = (int(f[1]), int(f[19]), f[0])
    return table


def _describe(pid):
    """One process: ids, state, wait channel, system call, kernel stack, threads."""
    base = "/proc/%d/" % pid
    status = _read(base + "status") or ""
    fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
    cmd = (_read(base + "cmdline", True) or b"").replace(b"\0", b" ").decode(errors="replace")
    cmd = cmd.strip().replace("\n", "\\n")[:400] or "[%s]" % fields.get("Name", "?").strip()
    wchan = _read(base + "wchan") or "?"
    out = ["pid %d (ppid %s, uid %s) state %s, wchan %s: %s" % (
        pid, fields.get("PPid", "?").strip(), fields.get("Uid", "?").split()[0] if
        fields.get("Uid") else "?", fields.get("State", "?").strip(), wchan.strip() or "0", cmd)]
    sc = (_read(base + "syscall") or "").split()
    if sc:
        name = _SYSCALLS.get(int(sc[0])) if sc[0].isdigit() and platform.machine() == "x86_64" \
            else None
        out.append("    syscall: %s%s" % (" ".join(sc[:4]), " (%s)" % name if name else ""))
    stack = _read(base + "stack")
    if stack and stack.strip():
        out.append("    stack:")
        out += ["      " + l for l in stack.strip().splitlines()]
    try:
        tids = [t for t in os.listdir(base + "task") if t != str(pid)]
    except OSError:
        tids = []
    if tids:
        chans = {}
        for t in tids:
            w = (_read(base + "task/%s/wchan" % t) or "?").strip() or "0"
            chans[w] = chans.get(w, 0) + 1
        out.append("    other threads: " + ", ".join("%d in %s" % (n, w)
                                                  for w, n in sorted(chans.items())))
    return "\n".join(out)


def _args(p):
    """A Popen's command line on one line, cut short."""
    args = p.args if isinstance(p.args, (str, bytes)) else " ".join(map(str, p.args))
    return str(args).replace("\n", "\\n")[:200]


class _Watchdog:
    def __init__(self):
        self.me = os.getpid()
        self.session = "%d." % self.me
        self.test = 0
        self.baseline = set()
        self.timeouts = []      # descriptions taken when a wait timed out
        self.dropped = 0
        self.stuck_msgs = []
        self.lock = threading.Lock()

    def start_session(self):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass        # descendants of dead parents are then found by WATCH_VAR only
        os.environ[WATCH_VAR] = self.session + "0"

    def processes(self):
        """(pid, starttime) -> state of the processes tests started: descendants
        of pytest, and anything carrying this session's WATCH_VAR."""
        table = _proc_table()
        children = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        found, todo = set(), list(children.get(self.me, []))
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo += children.get(pid, [])
        mark = ("%s=%s" % (WATCH_VAR, self.session)).encode()
        for pid in table:
            if pid in found or pid == self.me:
                continue
            env = _read("/proc/%d/environ" % pid, True)
            if env and any(e.startswith(mark) for e in env.split(b"\0")):
                found.add(pid)
        return {(pid, table[pid][1]): table[pid][2] for pid in found if pid in table}

    def ours(self):
        """Processes of the current test: not there when it began."""
        return {k: v for k, v in self.processes().items() if k not in self.baseline}

    def describe(self, keys):
        return "\n".join(_describe(pid) for pid, _ in sorted(keys)) or "(no process)"

    def begin(self):
        self.test += 1
        os.environ[WATCH_VAR] = self.session + str(self.test)
        self.timeouts, self.dropped, self.stuck_msgs = [], 0, []
        self.baseline = set(self.processes())

    def timed_out(self, p, e):
        with self.lock:
            if len(self.timeouts) >= 4:
                self.dropped += 1
                return
        text = "waiting %ss for pid %d (%s) timed out; the test's processes then:\n%s" % (
            e.timeout, p.pid, _args(p), self.describe(self.ours()))
        with self.lock:
            self.timeouts.append(text)

    def stuck(self, p, why):
        """@p did not end when told to (it is still there: describe it now)."""
        self.stuck_msgs.append("pid %d (%s) %s; the test's processes then:\n%s" % (
            p.pid, _args(p), why, self.describe(self.ours())))

    def call_failed(self, excinfo):
        """Text for the report of a failed test, or None."""
        parts = list(self.timeouts)
        if self.dropped:
            parts.append("(%d more timed-out waits)" % self.dropped)
        e, timeout = excinfo.value if excinfo else None, False
        while e is not None:
            if isinstance(e, (subprocess.TimeoutExpired, TimeoutError)):
                timeout = True
            e = e.__cause__ or e.__context__
        if timeout:
            parts.append("the test's processes when it ended by a timeout:\n" +
                         self.describe(self.ours()))
        return "\n\n".join(parts) or None

    def reap(self):
        """Collect our zombie children (orphans come to us: subreaper)."""
        for pid, (ppid, _, state) in _proc_table().items():
            if ppid == self.me and state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def end(self):
        """After the fixtures: a description of what was wrong, or None."""
        problems = ["stuck: " + m for m in self.stuck_msgs]
        deadline = time.time() + 2.0         # killed groups may take a moment to go
        while True:
            self.reap()
            left = {k: s for k, s in self.ours().items() if s != "Z"}
            if not left or time.time() > deadline:
                break
            time.sleep(0.05)
        if left:
            problems.append("%d process(es) left running after the test (killed now):\n%s" % (
                len(left), self.describe(left)))
            for pid, start in left:
                if _proc_table().get(pid, (0, None))[1] == start:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.time() + 5.0
            while time.time() < deadline:
                self.reap()
                if not {k for k, s in self.ours().items() if s != "Z"}:
                    break
                time.sleep(0.05)
        self.reap()
        return "\n".join(problems) or None


_WATCH = _Watchdog()


def _watch_waits(orig):
    """Describe the test's processes when a wait for a child times out (the
    outermost one only: communicate() waits inside)."""
    depth = threading.local()

    @functools.wraps(orig)
    def wrapper(self, *a, **kw):
        d = getattr(depth, "n", 0)
        depth.n = d + 1
        try:
            return orig(self, *a, **kw)
        except subprocess.TimeoutExpired as e:
            if d == 0:
                _WATCH.timed_out(self, e)
            raise
        finally:
            depth.n = d
    return wrapper


def pytest_configure(config):
    _WATCH.start_session()
    subprocess.Popen.wait = _watch_waits(subprocess.Popen.wait)
    subprocess.Popen.communicate = _watch_waits(subprocess.Popen.communicate)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _WATCH.begin()          # before any fixture: Registry.env carries the marker
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if call.when == "call" and rep.failed:
        text = _WATCH.call_failed(call.excinfo)
        if text:
            if hasattr(rep.longrepr, "addsection"):
                rep.longrepr.addsection("watchdog", text)
            else:
                rep.sections.append(("watchdog", text))
    if call.when == "teardown" and call.excinfo is not None and \
            call.excinfo.errisinstance(WatchdogFailure):
        rep.watchdog = True
    return rep


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        res = yield         # every fixture of the test is finalized here
    except BaseException as e:
        problems = _WATCH.end()
        if problems:
            raise WatchdogFailure("watchdog: " + problems, pytrace=False) from e
        raise
    problems = _WATCH.end()
    if problems:
        raise WatchdogFailure("watchdog: " + problems, pytrace=False)
    return res


def pytest_report_teststatus(report, config):
    if report.when == "teardown" and getattr(report, "watchdog", False):
        return "failed", "F", "FAILED"
