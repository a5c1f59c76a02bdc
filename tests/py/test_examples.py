"""The examples of the native API (examples/), as built by `make`: the echo
server and the bulk sender, every byte checked by the sender, over a
connection smclo carries and over plain TCP."""
import subprocess

import pytest

from conftest import BUILD, free_port

EXAMPLES = BUILD / "examples"


def bulk_through_echo(reg, procs, kind, *mode):
    """examples/bulk_sender (in @mode) through examples/echo_server: its
    output's fields, after checking it matched and how the bytes went."""
    env = dict(reg.env)
    if kind == "copy":
        env["SMCLO_DISABLE"] = "1"
    port = free_port()
    srv = procs.start([str(EXAMPLES / "echo_server"), str(port)], env, smclo=False, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = subprocess.run([str(EXAMPLES / "bulk_sender"), str(port), "64"] + list(mode), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split()[-1] == "match", r.stdout + r.stderr
    f = dict(x.split("=", 1) for x in r.stdout.split() if "=" in x)
    assert f["via"] == kind and int(f["bytes"]) == 64 << 20, r.stdout
    if kind == "ring":
        st = reg.wait_stats(lambda s: s["accelerated"] >= 2)
        assert st["accelerated_client"] == 1 and st["accelerated_server"] == 1, st
    procs.stop(srv)
    return f


@pytest.mark.parametrize("kind", ["ring", "copy"])
def test_bulk_through_echo(reg, procs, kind):
    bulk_through_echo(reg, procs, kind)


@pytest.mark.parametrize("kind", ["ring", "copy"])
def test_pool_bulk_through_echo(reg, procs, kind):
    """bulk_sender's pool: by reference through the rings (the first
    buffers copied until the echo server took the pool), copied on TCP."""
    f = bulk_through_echo(reg, procs, kind, "pool")
    sent = int(f["by-reference"]) + int(f["copied"])
    assert sent == 256, f                               # 64 MiB / 256 KiB
    if kind == "ring":
        assert int(f["by-reference"]) > 200, f
    else:
        assert int(f["by-reference"]) == 0, f


def test_usage_errors():
    for prog, args in (("echo_server", []), ("echo_server", ["0"]),
                       ("bulk_sender", ["1"]), ("bulk_sender", ["x", "1"]),
                       ("bulk_sender", ["1", "1", "zerocopy"])):
        r = subprocess.run([str(EXAMPLES / prog)] + args, capture_output=True, text=True,
                           timeout=10)
        assert r.returncode == 2 and "usage:" in r.stderr, (prog, args, r.stderr)
