"""The native API (include/smclo.h) on every kind of connection.

tests/progs/api_peer.c holds the scenarios (each end checks every byte at
its offset); this file runs both ends of each over:
  ring      two programs linked with -lsmclo, no `smclo run`: accelerated
  run       the same under `smclo run`
  copy      smclo disabled at both ends: the TCP path
  plain     a server without smclo against a client with it (peer-no-smclo)
  netns     the two ends in two network namespaces over a veth ("another
            host"), each with its own registry
and asserts how the bytes travelled (via=ring or via=copy) and, for the
accelerated ones, that `smclo stats` counted the connection accelerated.
"""
import os
import signal
import subprocess
import time

import pytest

from conftest import SMCLO, TESTBIN, VETH_NET, Registry, free_port

PEER = str(TESTBIN / "api_peer")
SCENARIOS = ["bulk", "mixed", "abort", "errors", "eof", "fork", "full", "close", "thread-exit", "big-peek",
             "keep"]


def start_server(procs, env, host, port, scenario, wrap=()):
    srv = procs.start(list(wrap) + [PEER, "serve", host, str(port), scenario], env,
                      smclo=False, text=True)
    assert srv.stdout.readline().strip() == "ready", srv.stderr.read()
    return srv


def run_pair(procs, scenario, srv_env, cli_env, srv_wrap=(), cli_wrap=(), host="127.0.0.1",
             listen="127.0.0.1"):
    port = free_port()
    srv = start_server(procs, srv_env, listen, port, scenario, srv_wrap)
    cli = subprocess.run(list(cli_wrap) + [PEER, "connect", host, str(port), scenario],
                         env=cli_env, capture_output=True, text=True, timeout=120)
    out, err = srv.communicate(timeout=120)
    assert cli.returncode == 0, "client: " + cli.stdout + cli.stderr + "\nserver: " + out + err
    assert srv.returncode == 0, "server: " + out + err + "\nclient: " + cli.stdout
    return cli.stdout.strip(), out.strip()


def fields(line):
    return dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)


def plain_env(reg):
    env = dict(reg.env, SMCLO_DISABLE="1")
    return env


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ring(reg, procs, scenario):
    """Linked with -lsmclo, without `smclo run`: in place in the rings."""
    cli, srv = run_pair(procs, scenario, reg.env, reg.env)
    if scenario != "close":
        assert fields(cli)["via"] == "ring" and fields(srv)["via"] == "ring", (cli, srv)
    st = reg.wait_stats(lambda s: s["accelerated"] >= 2)
    assert st["accelerated_server"] == 1 and st["accelerated_client"] == 1, st
    assert st["fallback"] == 0, st["fallback_by_reason"]
    if scenario == "bulk":
        # 8 MiB through rings of the default size: claims and peeks wrapped
        assert int(fields(cli)["wraps"]) > 0 and int(fields(srv)["wraps"]) > 0, (cli, srv)


@pytest.mark.parametrize("scenario", ["bulk", "mixed", "full"])
def test_under_smclo_run(reg, procs, scenario):
    cli, srv = run_pair(procs, scenario, reg.env, reg.env, srv_wrap=[SMCLO, "run", "--"],
                        cli_wrap=[SMCLO, "run", "--"])
    assert fields(cli)["via"] == "ring" and fields(srv)["via"] == "ring", (cli, srv)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_copy(reg, procs, scenario):
    """smclo disabled at both ends: the same calls, through the socket."""
    env = plain_env(reg)
    cli, srv = run_pair(procs, scenario, env, env)
    if scenario != "close":
        assert fields(cli)["via"] == "copy" and fields(srv)["via"] == "copy", (cli, srv)


@pytest.mark.parametrize("scenario", ["bulk", "mixed", "errors", "eof", "full"])
def test_plain_peer(reg, procs, scenario):
    """A server without smclo: the client's connection falls back, and says why."""
    cli, srv = run_pair(procs, scenario, plain_env(reg), reg.env)
    assert fields(cli)["via"] == "copy", cli
    st = reg.wait_stats(lambda s: s["fallback"] >= 1)
    assert st["fallback_by_reason"].get("peer-no-smclo") == 1, st["fallback_by_reason"]


@pytest.mark.parametrize("scenario", ["bulk", "mixed", "eof"])
def test_other_host(two_namespaces, procs, tmp_path, scenario):
    """Two network namespaces over a veth, each with its own registry."""
    a, b = two_namespaces
    ra, rb = Registry(tmp_path / "a"), Registry(tmp_path / "b")
    cli, srv = run_pair(procs, scenario, ra.env, rb.env,
                        srv_wrap=["ip", "netns", "exec", a], cli_wrap=["ip", "netns", "exec", b],
                        host=VETH_NET + "1", listen="0.0.0.0")
    assert fields(cli)["via"] == "copy" and fields(srv)["via"] == "copy", (cli, srv)
    assert ra.stats()["accelerated"] == 0 and rb.stats()["accelerated"] == 0


@pytest.mark.parametrize("kind", ["ring", "copy"])
@pytest.mark.parametrize("victim", ["reader", "writer"])
def test_peer_killed_holding(reg, procs, kind, victim):
    """A peer SIGKILLed while it holds a peek (the other end waits in a claim
    of a full stream) or a claim (the other end waits in a peek for more):
    the survivor gets an error or the bytes committed and the end, at once."""
    env = reg.env if kind == "ring" else plain_env(reg)
    port = free_port()
    scenario = "killed-" + victim
    srv = start_server(procs, env, "127.0.0.1", port, scenario)
    t0 = time.monotonic()
    cli = subprocess.run([PEER, "connect", "127.0.0.1", str(port), scenario], env=env,
                         capture_output=True, text=True, timeout=60)
    out, err = srv.communicate(timeout=60)
    took = time.monotonic() - t0
    survivor, dead = (cli, srv) if victim == "reader" else (srv, cli)
    assert dead.returncode == -signal.SIGKILL, (cli.stdout, out)
    text = cli.stdout if victim == "reader" else out
    assert text.startswith("ok"), (cli.stdout + cli.stderr, out + err)
    assert took < 10, took


HAZARDS = ["fionread", "dontwait", "close-slot", "stale", "rcvtimeo", "signal", "shutwr",
           "destructor", "claim-restart"]


@pytest.mark.parametrize("kind", ["ring", "copy"])
@pytest.mark.parametrize("check", HAZARDS)
def test_hazard(reg, kind, check):
    """tests/progs/api_hazards.c: each check failed once (a self-deadlock, a
    wait where none may be, a leaked slot, bytes of a closed connection's
    claim sent on the connection that got its number, a timeout or signal
    ignored, a use after free at thread exit)."""
    env = reg.env if kind == "ring" else plain_env(reg)
    r = subprocess.run([str(TESTBIN / "api_hazards"), check], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok via=" + kind, r.stdout + r.stderr
