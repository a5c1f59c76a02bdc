"""Long commands show progress: `smclo bench` and `make bench` (bench/run.py)
print what runs now and an estimate of the time left, one line per step;
no escape sequence unless stdout is a terminal.  Run with the shortest
settings: these test the lines, not the figures."""
import re
import subprocess
import sys

from conftest import BUILD, ROOT, SMCLO, read_pty

STEP = re.compile(r"^\[(\d+)/(\d+)\] (.+); about (\d+ s|\d+ min \d\d s) left$")


def steps(out):
    return [STEP.match(l) for l in out.splitlines() if STEP.match(l)]


def test_smclo_bench_prints_steps_with_eta(reg):
    r = subprocess.run([SMCLO, "bench", "--runs", "1", "--seconds", "0.1"], env=reg.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    found = steps(r.stdout)
    # 3 benchmarks x (tcp, smclo) x 1 run, numbered in order
    assert [(int(m[1]), int(m[2])) for m in found] == [(i, 6) for i in range(1, 7)], r.stdout
    assert "ping-pong latency, tcp loopback, run 1 of 1" in found[0][3]
    assert "\033" not in r.stdout and "\r" not in r.stdout
    # the table still comes: one row per benchmark after its steps
    assert re.search(r"^connection setup .* accelerated$", r.stdout, re.M), r.stdout


def test_smclo_bench_on_a_terminal_rewrites_its_line(reg):
    out, rc = read_pty([SMCLO, "bench", "--runs", "1", "--seconds", "0.1"], reg.env)
    assert rc == 0, out
    # each step's line replaces the one before; a table row clears the last
    assert out.count("\r\033[K[") == 6, out
    assert "\r\033[Kping-pong latency " in out


def test_bench_run_py_prints_steps_with_eta(reg):
    env = dict(reg.env, SMCLO_BUILD=str(BUILD))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--runs", "1",
                        "--seconds", "0.3", "--only", "request/response rate, 1 conn"],
                       env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    found = steps(r.stdout)
    # one row, three modes (tcp, AF_UNIX, smclo), each before its result line
    assert [(int(m[1]), int(m[2])) for m in found] == [(1, 3), (2, 3), (3, 3)], r.stdout
    assert [m[3].split(", ")[-1] for m in found] == ["tcp (0.3 s)", "unix (0.3 s)",
                                                      "smclo (0.3 s)"]
    lines = r.stdout.splitlines()
    for m in found:
        after = lines[lines.index(m[0]) + 1]
        assert after.startswith("run 1 100 B request/response"), r.stdout
    assert "\033" not in r.stdout
