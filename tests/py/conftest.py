"""Shared fixtures for the real-program tests.

Every test gets its own registry directory (SMCLO_DIR), so the counters it
reads from `smclo stats --json` are its own.  Background processes are
started through `Procs`, which stops exactly the processes it started.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SMCLO_BUILD", ROOT / "build"))
SMCLO = str(BUILD / "smclo")
TESTBIN = BUILD / "tests"
PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                             capture_output=True, text=True).stdout
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
                             capture_output=True, text=True).stdout
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
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def stop_all(self):
        for p in reversed(self.procs):
            self.stop(p)


@pytest.fixture
def reg(tmp_path):
    d = tmp_path / "registry"
    return Registry(d)


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


def need(binary):
    from shutil import which
    if which(binary) is None:
        pytest.fail("%s is not installed: run `make test`, which installs it" % binary)
