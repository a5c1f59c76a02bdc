"""Containers: two network namespaces joined by a veth pair.  Sharing the
registry directory they are accelerated; with separate directories they fall
back to TCP."""
import os
import subprocess
import uuid

import pytest

from conftest import PY, Registry, free_port

PEER = os.path.join(os.path.dirname(__file__), "peer.py")


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def two_namespaces():
    assert os.geteuid() == 0, "network namespaces need root (CI is root)"
    tag = uuid.uuid4().hex[:6]
    a, b = "smclo-a-" + tag, "smclo-b-" + tag
    va, vb = "sma" + tag, "smb" + tag
    sh("ip", "netns", "add", a)
    sh("ip", "netns", "add", b)
    try:
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "netns", a)
        sh("ip", "link", "set", vb, "netns", b)
        sh("ip", "-n", a, "addr", "add", "10.199.0.1/24", "dev", va)
        sh("ip", "-n", b, "addr", "add", "10.199.0.2/24", "dev", vb)
        for ns, dev in ((a, va), (b, vb)):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)


def exchange(procs, ns_server, ns_client, server_reg, client_reg):
    from conftest import SMCLO
    port = free_port()
    srv = procs.start(["ip", "netns", "exec", ns_server, SMCLO, "run", "--", PY, PEER, "echo",
                       "0.0.0.0", str(port)], server_reg.env, smclo=False, text=True)
    assert srv.stdout.readline().strip() == "ready"
    r = subprocess.run(["ip", "netns", "exec", ns_client, SMCLO, "run", "--", PY, PEER, "send",
                        "10.199.0.1", str(port), str(2 << 20)], env=client_reg.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "match", r.stdout + r.stderr
    procs.stop(srv)


def test_shared_registry_accelerates(two_namespaces, procs, tmp_path):
    a, b = two_namespaces
    reg = Registry(tmp_path / "shared")
    exchange(procs, a, b, reg, reg)
    st = reg.stats()
    assert st["accelerated_server"] == 1 and st["accelerated_client"] == 1, st
    assert st["fallback"] == 0, st["fallback_by_reason"]


def test_separate_registries_fall_back(two_namespaces, procs, tmp_path):
    a, b = two_namespaces
    ra, rb = Registry(tmp_path / "a"), Registry(tmp_path / "b")
    exchange(procs, a, b, ra, rb)
    assert ra.stats()["fallback_by_reason"]["peer-no-smclo"] == 1
    assert rb.stats()["fallback_by_reason"]["peer-no-smclo"] == 1
    assert ra.stats()["accelerated"] == 0 and rb.stats()["accelerated"] == 0


def test_cross_namespace_can_be_switched_off(two_namespaces, procs, tmp_path):
    a, b = two_namespaces
    reg = Registry(tmp_path / "shared")
    off = Registry(tmp_path / "shared")
    off.env["SMCLO_CROSS_NETNS"] = "0"
    exchange(procs, a, b, reg, off)
    st = reg.stats()
    assert st["accelerated"] == 0
    assert st["fallback_by_reason"]["cross-netns-off"] == 1, st
