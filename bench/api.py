#!/usr/bin/env python3
"""The native API's benchmark rows (part of `make bench`; bench/apibench.c).

Every row runs each way it can, interleaved run by run (the order turning
every round), and reports the median with the CPU time (user+sys of both
processes) beside it:

  tcp     TCP loopback, send()/recv() (smclo disabled)
  unix    an AF_UNIX stream socket, send()/recv()
  smclo   smclo's rings through send()/recv()
  api     smclo's rings through the native API: claims written in place,
          peeks read in place (one claim per message; in the row "claim
          kept" one claim carries many messages, each committed with
          SMCLO_KEEP as it is written)
  pool    smclo's buffer pools (stream rows): the sender fills buffers of a
          pool and sends references, the receiver peeks them in place; each
          buffer comes back when the receiver consumed it (smclo_reap).  4
          buffers (16 up to 64 KiB) of the message's size up to 1 MiB: a
          16 MiB message goes as sixteen 1 MiB buffers, as the API's claims
          carry it in ring-sized pieces.  The row "one pool buffer each"
          sends each 16 MiB message in one buffer of its own (4 of 16 MiB,
          more than this machine's L3 holds).
  iceoryx2  iceoryx2's publish-subscribe (bench/iceoryx2, the Rust crate
          pinned in its Cargo.toml): samples loaned from the publisher's
          shared memory, written and read in place, each side polling its
          subscriber (yielding the CPU between polls); the ping-pong also
          runs once more sleeping in iceoryx2's listener instead (a note
          under the table).  Stream and ping-pong rows only.  Built here
          with cargo into build/iceoryx2-target; without cargo, or if the
          build fails, its column shows "-" and the run says why.
  iceoryx2-spin  the ping-pong with iceoryx2 at its best, as its own
          benchmarks run it: a pure spin, the next sample loaned ahead
  iceoryx2-ref  iceoryx2's own publish-subscribe benchmark's method: one
          process, two threads pinned to CPUs 0 and 1, a pure spin, the
          payload written once and never read; its mean round trip
  The ping-pong rows' anchors get a table of their own: the API against
  iceoryx2 at its best (the better of the two), CPU beside each.

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
from run import WORK as RUN_WORK  # noqa: E402  (made by run.py's import, unused here)

APIBENCH = str(BUILD / "bench" / "apibench")
ICEBENCH_SRC = ROOT / "bench" / "iceoryx2"
ICEBENCH_TARGET = BUILD / "iceoryx2-target"
ICEBENCH = str(ICEBENCH_TARGET / "release" / "icebench")
WORK = Path(tempfile.mkdtemp(prefix="smclo-apibench-",
                             dir="/dev/shm" if os.path.isdir("/dev/shm") else None))

# name, test, size, unit, higher is better, ways
ALL = ("tcp", "unix", "smclo", "api", "pool", "iceoryx2")
NO_POOL = ("tcp", "unix", "smclo", "api", "iceoryx2")
ROWS = [
    ("stream 64 KiB messages", "bulk", 64 << 10, "MB/s", True, ALL),
    ("stream 1 MiB messages", "bulk", 1 << 20, "MB/s", True, ALL),
    ("stream 16 MiB messages", "bulk", 16 << 20, "MB/s", True, ALL),
    # the pool column: each message in one buffer of its size (apibench's "pool-whole")
    ("stream 16 MiB messages, one pool buffer each", "bulk-whole", 16 << 20, "MB/s", True,
     ("tcp", "smclo", "pool")),
    ("100 B messages", "rate", 100, "k msg/s", True, ("tcp", "unix", "smclo", "api")),
    # the API's column: one claim carries many messages (SMCLO_KEEP)
    ("100 B messages, claim kept", "rate-keep", 100, "k msg/s", True, ("smclo", "api")),
    ("64 B ping-pong (median)", "pingpong", 64, "us", False,
     NO_POOL + ("iceoryx2-wait", "iceoryx2-spin", "iceoryx2-ref")),
    ("64 B ping-pong, pinned apart (taskset 0 / 1)", "pingpong", 64, "us", False,
     ("tcp", "smclo", "api", "iceoryx2", "iceoryx2-spin", "iceoryx2-ref")),
    # a pure spin sharing its CPU with the peer holds it until the tick: no spin way here
    ("64 B ping-pong, pinned together (taskset 0 / 0)", "pingpong", 64, "us", False,
     ("tcp", "smclo", "api", "iceoryx2")),
]
# rows whose server and client are each `taskset -c` to one CPU: (server, client)
PINS = {"64 B ping-pong, pinned apart (taskset 0 / 1)": (0, 1),
        "64 B ping-pong, pinned together (taskset 0 / 0)": (0, 0)}
# iceoryx2-wait: icebench's ping-pong with each side asleep in a listener
WAYS = ["tcp", "unix", "smclo", "api", "pool", "iceoryx2", "iceoryx2-wait", "iceoryx2-spin",
        "iceoryx2-ref"]
# icebench's TEST for each of its ways ("iceoryx2" takes the row's own)
ICE_TESTS = {"iceoryx2-wait": "pingpong-wait", "iceoryx2-spin": "pingpong-spin",
             "iceoryx2-ref": "reference"}
ICE_WAYS = ("iceoryx2",) + tuple(ICE_TESTS)


def build_icebench():
    """Build bench/iceoryx2 (icebench) with cargo: None when done, else why not.

    Offline first (the crates already in cargo's cache), then letting cargo
    fetch them.  The first build compiles iceoryx2: minutes on a small machine."""
    cargo = shutil.which("cargo")
    if not cargo:
        return "cargo not found"
    print("icebench: cargo build in bench/iceoryx2 (minutes the first time)", flush=True)
    err = ""
    for offline in (["--offline"], []):
        try:
            r = subprocess.run([cargo, "build", "--release", "--quiet", "--target-dir",
                                str(ICEBENCH_TARGET)] + offline, cwd=ICEBENCH_SRC,
                               capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            return "cargo build took more than 30 min"
        if r.returncode == 0 and os.access(ICEBENCH, os.X_OK):
            return None
        err = r.stderr.strip().splitlines()
        err = err[-1] if err else "exit code %d" % r.returncode
    return "cargo build failed: " + err


def env_for(way):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if way in ("tcp", "unix"):
        env["SMCLO_DISABLE"] = "1"      # apibench is linked with -lsmclo
    else:
        env["SMCLO_DIR"] = str(WORK / "registry")
        env["SMCLO_SHORT_LIVED"] = "0"
    return env


def run_once(test, size, way, secs, pin=None):
    """(value in the row's unit, CPU seconds of both ends); @pin: the CPUs
    of server and client, or None."""
    port = free_port()
    server_pin, client_pin = ([["taskset", "-c", str(cpu)] for cpu in pin] if pin
                              else ([], []))
    if way in ICE_WAYS:
        # the same command shape without the WAY argument; ADDR is the prefix
        # of the run's iceoryx2 service names
        prog, how, env = ICEBENCH, [], dict(os.environ)
        env.pop("LD_PRELOAD", None)
        addr = "smclo-apibench.%d.%d" % (os.getpid(), port)
    else:
        how = way if way in ("api", "pool") else "copy"
        if test == "rate-keep" and way == "api":
            how = "keep"
        if test == "bulk-whole" and way == "pool":
            how = "pool-whole"
        prog, how, env = APIBENCH, [how], env_for(way)
        addr = str(WORK / ("s-%d.sock" % port)) if way == "unix" else str(port)
    name = os.path.basename(prog)
    what = ICE_TESTS.get(way, test.split("-")[0])
    srv = subprocess.Popen(server_pin + [prog, "serve", addr] + how + [what, str(size)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = None
    try:
        if srv.stdout.readline().strip() != "ready":
            srv.kill()
            raise RuntimeError("%s server: %s" % (name, srv.stderr.read()))
        t = os.times()
        out = subprocess.run(client_pin + [prog, "client", addr] + how +
                             [what, str(size), str(secs)],
                             env=env, capture_output=True, text=True, timeout=secs * 10 + 60)
        t2 = os.times()
    finally:
        if out is None or out.returncode != 0:
            srv.kill()      # its client is gone: it may wait for it forever
        _, _, ru = os.wait4(srv.pid, 0)
    if out.returncode != 0:
        raise RuntimeError("%s client (%s %s %d): %s" % (name, way, test, size, out.stderr))
    r = json.loads(out.stdout)
    if not r["ok"]:
        raise RuntimeError("bytes lost or changed: %s %s %d: %s" % (way, test, size, out.stdout))
    cpu = (t2.children_user - t.children_user) + (t2.children_system - t.children_system) \
        + ru.ru_utime + ru.ru_stime
    if test == "pingpong":
        return r["p50_us"], cpu
    if test.startswith("rate"):
        return r["msgs"] / r["seconds"] / 1e3, cpu
    return r["bytes"] / r["seconds"] / 1e6, cpu


def med(vals, i):
    return statistics.median(v[i] for v in vals) if vals else None


def table(results, runs, secs, ice_why):
    lines = ["Native API rows (bench/api.py, bench/apibench.c): %d interleaved runs of %g s "
             "each, median; CPU is user+sys of both ends per run.  Machine: %s, %d CPUs." % (
                 runs, secs, os.uname().release, os.cpu_count()), "",
             "| row | TCP | AF_UNIX | smclo send/recv | smclo API | smclo pool | iceoryx2 "
             "| API/send-recv | API/TCP | pool/send-recv | pool/TCP | best/iceoryx2 "
             "| CPU s TCP / UNIX / smclo / API / pool / iceoryx2 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "-" if x is None else ("%.2f" % x if x < 100 else "%.0f" % x)
    wait = None
    for name, test, size, unit, hib, ways in ROWS:
        if name not in results:
            continue
        v = {w: med(results[name][w], 0) for w in WAYS}
        c = {w: med(results[name][w], 1) for w in WAYS}
        ratio = lambda a, b: "-" if not (a and b) else "%.2fx" % ((a / b) if hib else (b / a))
        mine = [x for x in (v["api"], v["pool"]) if x]
        best = (max(mine) if hib else min(mine)) if mine else None
        lines.append("| %s (%s) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, unit, fmt(v["tcp"]), fmt(v["unix"]), fmt(v["smclo"]), fmt(v["api"]),
            fmt(v["pool"]), fmt(v["iceoryx2"]), ratio(v["api"], v["smclo"]),
            ratio(v["api"], v["tcp"]), ratio(v["pool"], v["smclo"]), ratio(v["pool"], v["tcp"]),
            ratio(best, v["iceoryx2"]), " / ".join(fmt(c[w]) for w in ALL)))
        if v["iceoryx2-wait"] is not None:
            wait = (v["iceoryx2-wait"], c["iceoryx2-wait"])
    lines += ["", "Ratios are taken so that above 1 is better (for latency: the other's "
              "time over ours); best/iceoryx2 compares the better of API and pool.  Every "
              "reader sums every byte with SSE2 (about 18 GB/s here), iceoryx2's too."]
    if not any("iceoryx2" in r[5] for r in ROWS if r[0] in results):
        pass
    elif ice_why:
        lines += ["", "iceoryx2 not measured: %s." % ice_why]
    else:
        lines += ["", "iceoryx2 (bench/iceoryx2, iceoryx2 %s): publish-subscribe, samples "
                  "loaned in the publisher's shared memory, written and summed in place; "
                  "the receiver polls its subscriber, yielding the CPU between polls; the "
                  "bulk publisher waits in iceoryx2's backpressure while the subscriber's "
                  "queue (4 messages) is full.  No 100 B messages row." % ice_version()]
        if wait:
            lines.append("iceoryx2's ping-pong with each side asleep in an iceoryx2 listener "
                         "instead of polling: %s us median, CPU %s s." % (fmt(wait[0]),
                                                                         fmt(wait[1])))
    return lines + anchors(results)


def anchors(results):
    """The ping-pong rows' anchors: the API against iceoryx2 at its best."""
    fmt = lambda x: "-" if x is None else "%.2f" % x
    rows = []
    for name, test, size, unit, hib, ways in ROWS:
        if name not in results or test != "pingpong":
            continue
        v = {w: med(results[name][w], 0) for w in WAYS}
        c = {w: med(results[name][w], 1) for w in WAYS}
        ice = [v[w] for w in ("iceoryx2-spin", "iceoryx2-ref") if v[w]]
        best = min(ice) if ice else None
        rows.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, fmt(v["api"]), fmt(v["iceoryx2"]), fmt(v["iceoryx2-spin"]),
            fmt(v["iceoryx2-ref"]), "-" if not (best and v["api"]) else "%.2fx" % (v["api"] / best),
            " / ".join(fmt(c[w]) for w in ("api", "iceoryx2", "iceoryx2-spin", "iceoryx2-ref"))))
    if not rows:
        return []
    return ["", "Anchors of the ping-pong (us, median; iceoryx2's own method: the mean round "
            "trip, half of it what that benchmark prints as its latency).  API/best: the API's "
            "round trip over iceoryx2's better one of spin and own method (below 1: the API "
            "is faster).", "",
            "| row | smclo API | iceoryx2 (yield) | iceoryx2 at its best (spin, loan ahead) "
            "| iceoryx2's own method | API/best | CPU s API / yield / spin / own |",
            "|---|---|---|---|---|---|---|"] + rows


def ice_version():
    """The iceoryx2 version pinned in bench/iceoryx2/Cargo.toml."""
    for line in (ICEBENCH_SRC / "Cargo.toml").read_text().splitlines():
        if line.startswith("iceoryx2"):
            return line.split("=")[-1].strip(' "')
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--quick", action="store_true", help="short runs, for trying the harness")
    ap.add_argument("--only", help="just the rows whose name contains this")
    a = ap.parse_args()
    secs = a.seconds or (1 if a.quick else 5)
    rows = [r for r in ROWS if not a.only or a.only in r[0]]
    # iceoryx2's column: built first; a machine without cargo still runs the rest
    ice_why = build_icebench() if any("iceoryx2" in r[5] for r in rows) else None
    if ice_why:
        print("iceoryx2 column left empty: %s" % ice_why, flush=True)
        rows = [r[:5] + (tuple(w for w in r[5] if w not in ICE_WAYS),) for r in rows]
    steps = [(r, row, WAYS[(r + k) % len(WAYS)]) for r in range(a.runs) for row in rows
             for k in range(len(WAYS)) if WAYS[(r + k) % len(WAYS)] in row[5]]
    progress = Progress([secs + STEP_OVERHEAD] * len(steps))
    results = {row[0]: {w: [] for w in WAYS} for row in rows}
    for r, (name, test, size, unit, hib, ways), way in steps:
        progress.step("run %d of %d: %s, %s (%g s)" % (r + 1, a.runs, name, way, secs))
        try:
            res = run_once(test, size, way, secs, PINS.get(name))
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            if way not in ICE_WAYS:
                raise
            # a failing third-party column must not cost the others
            progress.say("run %d %-28s %-5s failed: %s" % (r + 1, name, way,
                                                          " ".join(str(e).split())[:300]))
            continue
        results[name][way].append(res)
        progress.say("run %d %-28s %-5s %10.2f %s  cpu %.2f s" % (r + 1, name, way, res[0],
                                                                unit, res[1]))
    text = "\n".join(table(results, a.runs, secs, ice_why)) + "\n"
    if not a.only:
        (ROOT / "bench" / "api-results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
        shutil.rmtree(RUN_WORK, ignore_errors=True)
