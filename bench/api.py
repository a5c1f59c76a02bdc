#!/usr/bin/env python3
"""The native API's benchmark rows (part of `make bench`; bench/apibench.c).

Every row runs each way it can, interleaved run by run (the order turning
every round), and reports the median with the CPU time (user+sys of both
processes) beside it:

  tcp     TCP loopback, send()/recv() (smclo disabled)
  unix    an AF_UNIX stream socket, send()/recv()
  smclo   smclo's rings through send()/recv()
  api     smclo's rings through the native API: claims written in place,
          peeks read in place

The receiver reads every byte of every message (sums it): a benchmark that
never touches the payload measures pointer passing, not transfer.

    python3 bench/api.py [--runs N] [--seconds S] [--quick] [--only TEXT]

Writes bench/api-results.md (the table docs/api.md quotes) and prints it.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import BUILD, ROOT, Progress, STEP_OVERHEAD, free_port, wait_listen  # noqa: E402

APIBENCH = str(BUILD / "bench" / "apibench")
WORK = Path(tempfile.mkdtemp(prefix="smclo-apibench-",
                             dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

# name, test, size, unit, higher is better, ways
ROWS = [
    ("stream 64 KiB messages", "bulk", 64 << 10, "MB/s", True, ("tcp", "unix", "smclo", "api")),
    ("stream 1 MiB messages", "bulk", 1 << 20, "MB/s", True, ("tcp", "unix", "smclo", "api")),
    ("stream 16 MiB messages", "bulk", 16 << 20, "MB/s", True, ("tcp", "unix", "smclo", "api")),
    ("100 B messages", "rate", 100, "k msg/s", True, ("tcp", "unix", "smclo", "api")),
    ("64 B ping-pong (median)", "pingpong", 64, "us", False, ("tcp", "unix", "smclo", "api")),
]
WAYS = ["tcp", "unix", "smclo", "api"]


def env_for(way):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if way in ("tcp", "unix"):
        env["SMCLO_DISABLE"] = "1"      # apibench is linked with -lsmclo
    else:
        env["SMCLO_DIR"] = str(WORK / "registry")
        env["SMCLO_SHORT_LIVED"] = "0"
    return env


def run_once(test, size, way, secs):
    """(value in the row's unit, CPU seconds of both ends)."""
    port = free_port()
    addr = str(WORK / ("s-%d.sock" % port)) if way == "unix" else str(port)
    how = "api" if way == "api" else "copy"
    env = env_for(way)
    srv = subprocess.Popen([APIBENCH, "serve", addr, how, test, str(size)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError("apibench server: " + srv.stderr.read())
        t = os.times()
        out = subprocess.run([APIBENCH, "client", addr, how, test, str(size), str(secs)],
                             env=env, capture_output=True, text=True, timeout=secs * 10 + 60)
        t2 = os.times()
    finally:
        _, _, ru = os.wait4(srv.pid, 0)
    if out.returncode != 0:
        raise RuntimeError("apibench client (%s %s %d): %s" % (way, test, size, out.stderr))
    r = json.loads(out.stdout)
    if not r["ok"]:
        raise RuntimeError("bytes lost or changed: %s %s %d: %s" % (way, test, size, out.stdout))
    cpu = (t2.children_user - t.children_user) + (t2.children_system - t.children_system) \
        + ru.ru_utime + ru.ru_stime
    if test == "pingpong":
        return r["p50_us"], cpu
    if test == "rate":
        return r["msgs"] / r["seconds"] / 1e3, cpu
    return r["bytes"] / r["seconds"] / 1e6, cpu


def med(vals, i):
    return statistics.median(v[i] for v in vals) if vals else None


def table(results, runs, secs):
    lines = ["Native API rows (bench/api.py, bench/apibench.c): %d interleaved runs of %g s "
             "each, median; CPU is user+sys of both ends per run.  Machine: %s, %d CPUs." % (
                 runs, secs, os.uname().release, os.cpu_count()), "",
             "| row | TCP | AF_UNIX | smclo send/recv | smclo API | API/send-recv | API/TCP "
             "| CPU s TCP / UNIX / smclo / API |",
             "|---|---|---|---|---|---|---|---|"]
    for name, test, size, unit, hib, ways in ROWS:
        if name not in results:
            continue
        v = {w: med(results[name][w], 0) for w in WAYS}
        c = {w: med(results[name][w], 1) for w in WAYS}
        fmt = lambda x: "-" if x is None else ("%.2f" % x if x < 100 else "%.0f" % x)
        ratio = lambda a, b: "-" if not (a and b) else "%.2fx" % ((a / b) if hib else (b / a))
        lines.append("| %s (%s) | %s | %s | %s | %s | %s | %s | %s |" % (
            name, unit, fmt(v["tcp"]), fmt(v["unix"]), fmt(v["smclo"]), fmt(v["api"]),
            ratio(v["api"], v["smclo"]), ratio(v["api"], v["tcp"]),
            " / ".join(fmt(c[w]) for w in WAYS)))
    lines += ["", "Ratios are taken so that above 1 is better (for latency: the other's "
              "time over the API's)."]
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--quick", action="store_true", help="short runs, for trying the harness")
    ap.add_argument("--only", help="just the rows whose name contains this")
    a = ap.parse_args()
    secs = a.seconds or (1 if a.quick else 5)
    rows = [r for r in ROWS if not a.only or a.only in r[0]]
    steps = [(r, row, WAYS[(r + k) % len(WAYS)]) for r in range(a.runs) for row in rows
             for k in range(len(WAYS)) if WAYS[(r + k) % len(WAYS)] in row[5]]
    progress = Progress([secs + STEP_OVERHEAD] * len(steps))
    results = {row[0]: {w: [] for w in WAYS} for row in rows}
    for r, (name, test, size, unit, hib, ways), way in steps:
        progress.step("run %d of %d: %s, %s (%g s)" % (r + 1, a.runs, name, way, secs))
        res = run_once(test, size, way, secs)
        results[name][way].append(res)
        progress.say("run %d %-28s %-5s %10.2f %s  cpu %.2f s" % (r + 1, name, way, res[0],
                                                                unit, res[1]))
    text = "\n".join(table(results, a.runs, secs)) + "\n"
    if not a.only:
        (ROOT / "bench" / "api-results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
